/* Tests of DDP's bucket assignment (against PyTorch's rule worked by hand)
 * and of in-order launch tracking. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "ddp/base.h"
#include "ddp/bucket.h"

/* The reference model in registration order: 0.weight, 0.bias, 2.weight, 2.bias. */
static const size_t mlp[] = {256 * 784, 256, 10 * 256, 10};
static const int reverse4[] = {3, 2, 1, 0};

static void test_reference_model_one_bucket(void **state)
{
    (void)state;
    ddp__bucket_layout l;
    assert_int_equal(ddp__bucket_layout_build(mlp, 4, reverse4, 1 << 20, 25 << 20, 4, &l), 0);
    /* 814,120 bytes < 1 MiB: everything in the first bucket, last layer first. */
    assert_int_equal(l.nbuckets, 1);
    assert_int_equal(l.offset[3], 0);
    assert_int_equal(l.offset[2], 10);
    assert_int_equal(l.offset[1], 2570);
    assert_int_equal(l.offset[0], 2826);
    assert_int_equal(l.total_numel, 203530);
    ddp__bucket_layout_free(&l);
}

static void test_caps_split(void **state)
{
    (void)state;
    /* 1 KiB caps: 2.bias (40 B) + 2.weight (10 KiB) close bucket 0 at
     * 10,280 B; 0.bias (1 KiB) reaches the cap alone; 0.weight alone. */
    ddp__bucket_layout l;
    assert_int_equal(ddp__bucket_layout_build(mlp, 4, reverse4, 1024, 1024, 4, &l), 0);
    assert_int_equal(l.nbuckets, 3);
    assert_int_equal(l.bucket_nparams[0], 2);
    assert_int_equal(l.bucket_nparams[1], 1);
    assert_int_equal(l.bucket_nparams[2], 1);
    assert_int_equal(l.bucket_of[0], 2);
    assert_int_equal(l.bucket_start[2], 2826);
    assert_int_equal(l.bucket_numel[2], 200704);
    for (int b = 1; b < l.nbuckets; b++)
        assert_int_equal(l.bucket_start[b], l.bucket_start[b - 1] + l.bucket_numel[b - 1]);
    ddp__bucket_layout_free(&l);
}

static void test_bad_order(void **state)
{
    (void)state;
    ddp__bucket_layout l;
    const int dup[] = {3, 2, 2, 0};
    assert_int_equal(ddp__bucket_layout_build(mlp, 4, dup, 1024, 1024, 4, &l),
                     DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "not a permutation of 4 parameters (entry 2 = 2)"));
}

static void test_tracker_launches_in_order(void **state)
{
    (void)state;
    ddp__bucket_layout l;
    assert_int_equal(ddp__bucket_layout_build(mlp, 4, reverse4, 1024, 1024, 4, &l), 0);
    ddp__bucket_tracker t;
    assert_int_equal(ddp__bucket_tracker_init(&t, &l), 0);
    int first = -1;
    /* Bucket 2 (0.weight) completes first but must wait for buckets 0, 1. */
    assert_int_equal(ddp__bucket_tracker_mark(&t, 0, &first), 0);
    assert_int_equal(ddp__bucket_tracker_mark(&t, 3, &first), 0);
    assert_int_equal(ddp__bucket_tracker_mark(&t, 1, &first), 0);
    assert_int_equal(ddp__bucket_tracker_mark(&t, 2, &first), 3);
    assert_int_equal(first, 0);
    assert_int_equal(ddp__bucket_tracker_mark(&t, 2, &first), DDP_ERR_STATE);
    assert_non_null(strstr(ddp_last_error(), "parameter 2 was marked ready twice"));
    ddp__bucket_tracker_reset(&t);
    assert_int_equal(ddp__bucket_tracker_mark(&t, 3, &first), 0);
    assert_int_equal(ddp__bucket_tracker_mark(&t, 2, &first), 1);
    assert_int_equal(first, 0);
    assert_int_equal(ddp__bucket_tracker_mark(&t, 1, &first), 1);
    assert_int_equal(first, 1);
    ddp__bucket_tracker_free(&t);
    ddp__bucket_layout_free(&l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_model_one_bucket),
        cmocka_unit_test(test_caps_split),
        cmocka_unit_test(test_bad_order),
        cmocka_unit_test(test_tracker_launches_in_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
