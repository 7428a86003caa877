/* The all-reduce auto choice over tcp (no shared window), checked by the
 * bits it produces: each algorithm folds in its own documented order
 * (coll_ref.h), so the output tells which one ran.  4 ranks (a power of
 * two): recursive doubling up to 16 KiB, Rabenseifner up to 2 MiB, then the
 * ring; 3 ranks: recursive doubling, then the ring (a fold-in makes
 * Rabenseifner lose there, and the tree is a chain as long as the ring);
 * 5 and 6 ranks: recursive doubling, the tree up to the size where the cost
 * model gives the ring the lead (116 KiB, 236 KiB), then the ring.  Real
 * processes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>

#include "coll_ref.h"
#include "ddp/pg.h"
#include "fork_children.h"
#include "pg_util.h"

static job J;

/* Element i of the auto all-reduce of count floats matches order? */
static int check(ddp_pg_t *pg, size_t count, int order, uint64_t id)
{
    const int n = ddp_pg_size(pg), r = ddp_pg_rank(pg);
    float *x = malloc(count * sizeof *x);
    if (!x)
        return 1;
    for (size_t i = 0; i < count; i++)
        ref_input(&x[i], DDP_FLOAT32, DDP_SUM, id, r, i);
    int bad = ddp_pg_all_reduce(pg, x, count, DDP_FLOAT32, DDP_SUM) != 0;
    for (size_t i = 0; i < count && !bad; i += count / 97 + 1) {
        float want;
        ref_reduce(&want, DDP_FLOAT32, DDP_SUM, id, n, i, order, ref_where(order, i, count, n));
        if (memcmp(&want, &x[i], sizeof want) != 0) {
            fprintf(stderr, "rank %d of %d, %zu floats: element %zu is %a, order %d gives %a\n",
                    r, n, count, i, (double)x[i], order, (double)want);
            bad = 1;
        }
    }
    free(x);
    return bad;
}

static int rank_main(int rank, void *arg)
{
    int n = *(int *)arg;
    setenv("DDP_TRANSPORT", "tcp", 1);
    unsetenv("DDP_ALLREDUCE_ALGO");
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, n, 30.0, &pg) == 0);
    int mid = n == 4 ? ORDER_RAB : n == 3 ? ORDER_RING : ORDER_TREE;
    CHILD_CHECK(check(pg, 1024, ORDER_RD, 1) == 0);   /* 4 KiB */
    CHILD_CHECK(check(pg, 16384, mid, 2) == 0);       /* 64 KiB */
    if (n == 6) /* the tree up to 236 KiB on 6 ranks, 116 KiB on 5 */
        CHILD_CHECK(check(pg, 32768, ORDER_TREE, 4) == 0); /* 128 KiB */
    if (n >= 5)
        CHILD_CHECK(check(pg, 65536, ORDER_RING, 5) == 0); /* 256 KiB */
    CHILD_CHECK(check(pg, 1 << 20, ORDER_RING, 3) == 0); /* 4 MiB */
    ddp_destroy_process_group(pg);
    return 0;
}

static void run(int n)
{
    job_init(&J);
    rank_group g;
    start_ranks(&g, 0, n, rank_main, &n);
    assert_int_equal(join_ranks(&g, 120.0), 0);
    job_cleanup(&J);
}

static void test_auto_four_ranks(void **state)
{
    (void)state;
    run(4);
}

static void test_auto_three_ranks(void **state)
{
    (void)state;
    run(3);
}

static void test_auto_five_and_six_ranks(void **state)
{
    (void)state;
    run(5);
    run(6);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auto_four_ranks),
        cmocka_unit_test(test_auto_three_ranks),
        cmocka_unit_test(test_auto_five_and_six_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
