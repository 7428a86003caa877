/* Tests of the HashStore (src/store/hash_store.c): every store operation
 * from store_cases.h with threads as ranks, plus attach and its errors. */
#define STORE_RANKS_AS_THREADS 1
#include "store_cases.h"

static ddp_store_t *root;

static int open_store(int rank, int world_size, ddp_store_t **out)
{
    (void)rank;
    (void)world_size;
    return ddp_store_hash_attach(root, out);
}

static void fresh_store(void)
{
    ddp_store_destroy(root);
    root = NULL;
    assert_int_equal(ddp_store_hash_create(&root), 0);
}

static void test_attach(void **state)
{
    (void)state;
    fresh_store();
    ddp_store_t *a = NULL, *b = NULL, *bad = (ddp_store_t *)&bad;
    assert_int_equal(ddp_store_hash_attach(root, &a), 0);
    assert_int_equal(ddp_store_set(a, "k", "v", 1), 0);
    ddp_store_destroy(root); /* the table lives on in a */
    root = NULL;
    assert_int_equal(ddp_store_hash_attach(a, &b), 0);
    assert_value(b, "k", "v", 1);
    /* Own timeouts per handle. */
    ddp_store_set_timeout(a, 0.05);
    assert_true(ddp_store_timeout(b) == DDP_STORE_DEFAULT_TIMEOUT_S);
    ddp_store_destroy(a);
    assert_value(b, "k", "v", 1);

    ddp_store_t *p = NULL;
    assert_int_equal(ddp_store_prefix_create("g", b, &p), 0);
    assert_int_equal(ddp_store_hash_attach(p, &bad), DDP_ERR_INVALID_ARG);
    assert_null(bad);
    assert_non_null(strstr(ddp_last_error(), "(prefix 'g') is not a hash store"));
    assert_int_equal(ddp_store_hash_attach(NULL, &bad), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "NULL is not a hash store"));
    ddp_store_destroy(p);
    ddp_store_destroy(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        STORE_CASES,
        cmocka_unit_test(test_attach),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    ddp_store_destroy(root);
    return rc;
}
