/* The reducer over raw gradient regions (include/ddp/reducer.h), all-reduce
 * mode, with 2 and 3 real processes: buckets completed out of order on each
 * rank, caller-owned and reducer-owned regions, the rebuild, no_sync
 * accumulation, an unused region named, a user comm hook, the agreement
 * check's message, join for uneven inputs, a peer that never reduces (the wait ends within the
 * group's timeout), misuse.  Every average is checked against a reference
 * computed in float64 on one process from the same formula. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ddp.h"
#include "base/error.h"
#include "fork_children.h"
#include "scratch_dir.h"

#define NREG 7
static const size_t counts[NREG] = {37, 100, 64, 250, 5, 128, 77};
static const char *const names[NREG] = {"emb", "l0.w", "l0.b", "l1.w", "l1.b", "head.w", "head.b"};
/* ~150 floats per bucket: 3 to 5 buckets. */
#define TINY_MB (600.0 / (1024.0 * 1024.0))

static int join_group(int rank, int n, const char *tag, double timeout, ddp_pg_t **pg)
{
    char url[256];
    snprintf(url, sizeof url, "file://%s/store-%s", dir, tag);
    return ddp_init_process_group("tcp", url, rank, n, timeout, pg);
}

/* Rank r's gradient of region i, element j, at iteration it: dyadic
 * fractions, so that every sum is exact in float whatever its order. */
static float value(int rank, int it, int i, size_t j)
{
    return (float)((rank + 1) * 0.5 + i * 0.25 + (double)(j % 13) * 0.125 - it * 0.0625);
}

/* The average over world ranks, in float64 (the reference). */
static double mean(int world, int it, int i, size_t j)
{
    double s = 0;
    for (int r = 0; r < world; r++)
        s += value(r, it, i, j);
    return s / world;
}

static int close_to(double got, double want) { return fabs(got - want) <= 1e-6 * (1 + fabs(want)); }

static ddp_reducer_options tiny_options(void)
{
    ddp_reducer_options o = ddp_reducer_defaults();
    o.bucket_cap_mb = TINY_MB;
    o.first_bucket_cap_mb = TINY_MB;
    return o;
}

/* A different ready order on every rank and iteration (a fixed shuffle). */
static void shuffled(int rank, int it, int *order)
{
    for (int i = 0; i < NREG; i++)
        order[i] = i;
    unsigned s = 2654435761u * (unsigned)(rank * 31 + it + 1);
    for (int i = NREG - 1; i > 0; i--) {
        s = s * 1103515245u + 12345u;
        int k = (int)((s >> 16) % (unsigned)(i + 1)), t = order[i];
        order[i] = order[k];
        order[k] = t;
    }
}

/* Joins group `tag` and makes a reducer over the NREG regions, all the
 * reducer's memory. */
static int open_reducer(int rank, int world, const char *tag, double timeout,
                        const ddp_reducer_options *o, ddp_pg_t **pg, ddp_reducer_t **r)
{
    ddp_grad_region regs[NREG];
    for (int i = 0; i < NREG; i++)
        regs[i] = (ddp_grad_region){names[i], NULL, counts[i]};
    DDP_TRY(join_group(rank, world, tag, timeout, pg));
    return ddp_reducer_create(*pg, regs, NREG, o, r);
}

/* Backward's part, last region first: adds this rank's gradient into each
 * region (but `skip`) and marks it ready. */
static int backward_regions(ddp_reducer_t *r, int rank, int it, int skip)
{
    for (int i = NREG - 1; i >= 0; i--) {
        float *g;
        DDP_TRY(ddp_reducer_grad_buffer(r, i, &g));
        if (i == skip)
            continue;
        for (size_t j = 0; j < counts[i]; j++)
            g[j] += value(rank, it, i, j);
        DDP_TRY(ddp_reducer_mark_ready(r, i));
    }
    return 0;
}

/* ==== buckets completed out of order, owned and caller-owned regions ====== */

static int out_of_order_rank(int rank, void *arg)
{
    int world = *(int *)arg;
    ddp_pg_t *pg;
    CHILD_CHECK(join_group(rank, world, world == 2 ? "ooo2" : "ooo3", 20, &pg) == 0);
    /* Odd regions are the caller's memory, even ones the reducer's. */
    float *mine[NREG] = {0};
    ddp_grad_region regs[NREG];
    for (int i = 0; i < NREG; i++) {
        if (i % 2)
            CHILD_CHECK((mine[i] = calloc(counts[i], sizeof(float))) != NULL);
        regs[i] = (ddp_grad_region){names[i], mine[i], counts[i]};
    }
    ddp_reducer_options o = tiny_options();
    ddp_reducer_t *r;
    CHILD_CHECK(ddp_reducer_create(pg, regs, NREG, &o, &r) == 0);
    CHILD_CHECK(ddp_reducer_num_buckets(r) >= 3);
    for (int it = 0; it < 3; it++) {
        int order[NREG];
        shuffled(rank, it, order);
        for (int k = 0; k < NREG; k++) {
            int i = order[k];
            float *g;
            CHILD_CHECK(ddp_reducer_grad_buffer(r, i, &g) == 0);
            CHILD_CHECK(i % 2 == 0 || g == mine[i]);
            for (size_t j = 0; j < counts[i]; j++)
                g[j] += value(rank, it, i, j); /* accumulate, as backward does */
            CHILD_CHECK(ddp_reducer_mark_ready(r, i) == 0);
        }
        CHILD_CHECK(ddp_reducer_wait(r) == 0);
        for (int i = 0; i < NREG; i++) {
            const float *g = ddp_reducer_grad(r, i);
            for (size_t j = 0; j < counts[i]; j++)
                CHILD_CHECK(close_to(g[j], mean(world, it, i, j)));
        }
        ddp_reducer_zero_grad(r);
    }
    CHILD_CHECK(ddp_reducer_buckets_rebuilt(r) == 1);
    ddp_reducer_destroy(r);
    for (int i = 0; i < NREG; i++)
        free(mine[i]);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_out_of_order(void **state)
{
    (void)state;
    int two = 2, three = 3;
    assert_int_equal(run_children(2, out_of_order_rank, &two, 60), 0);
    assert_int_equal(run_children(3, out_of_order_rank, &three, 60), 0);
}

/* ==== no_sync ============================================================== */

/* Two no_sync iterations accumulate locally, the third reduces the sum. */
static int no_sync_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg;
    ddp_reducer_t *r;
    ddp_reducer_options o = tiny_options();
    CHILD_CHECK(open_reducer(rank, 2, "nosync", 20, &o, &pg, &r) == 0);
    for (int it = 0; it < 3; it++) {
        CHILD_CHECK(ddp_reducer_set_no_sync(r, it < 2) == 0);
        CHILD_CHECK(backward_regions(r, rank, it, -1) == 0);
        CHILD_CHECK(ddp_reducer_wait(r) == 0);
        if (it < 2) { /* local only: this rank's own sum so far */
            const float *g = ddp_reducer_grad(r, 3);
            CHILD_CHECK(g[1] == value(rank, 0, 3, 1) + (it ? value(rank, 1, 3, 1) : 0));
        }
    }
    for (int i = 0; i < NREG; i++) {
        const float *g = ddp_reducer_grad(r, i);
        for (size_t j = 0; j < counts[i]; j++)
            CHILD_CHECK(close_to(g[j], mean(2, 0, i, j) + mean(2, 1, i, j) + mean(2, 2, i, j)));
    }
    ddp_reducer_destroy(r);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_no_sync(void **state)
{
    (void)state;
    assert_int_equal(run_children(2, no_sync_rank, NULL, 60), 0);
}

/* ==== unused regions ======================================================= */

/* Region 4 ("l1.b") is never marked: named in the error without
 * find_unused; averaged (zeros) with it. */
static int unused_rank(int rank, void *arg)
{
    int find_unused = *(int *)arg;
    ddp_pg_t *pg;
    ddp_reducer_t *r;
    ddp_reducer_options o = tiny_options();
    o.find_unused = find_unused;
    CHILD_CHECK(open_reducer(rank, 2, find_unused ? "unused1" : "unused0", 20, &o, &pg, &r) == 0);
    for (int it = 0; it < 2; it++) {
        ddp_reducer_zero_grad(r);
        CHILD_CHECK(backward_regions(r, rank, it, 4) == 0);
        int rc = ddp_reducer_wait(r);
        if (find_unused) {
            CHILD_CHECK(rc == 0);
            CHILD_CHECK(ddp_reducer_grad(r, 4)[0] == 0.0f);
        } else {
            CHILD_CHECK(rc == DDP_ERR_STATE);
            CHILD_CHECK(strstr(ddp_last_error(), "reducer: regions l1.b received no gradient in "
                                                 "this iteration; pass find_unused=1"));
        }
        /* Either way the others were reduced on every rank. */
        CHILD_CHECK(close_to(ddp_reducer_grad(r, 3)[5], mean(2, it, 3, 5)));
    }
    ddp_reducer_destroy(r);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_unused_region(void **state)
{
    (void)state;
    int without = 0, with = 1;
    assert_int_equal(run_children(2, unused_rank, &without, 60), 0);
    assert_int_equal(run_children(2, unused_rank, &with, 60), 0);
}

/* ==== a user comm hook ===================================================== */

/* Sums (not averages) then scales by 1/4 in finish: the result must be
 * half the average on 2 ranks; every bucket passes through both. */
typedef struct {
    int launches, finishes;
} hook_count;

static int sum_launch(void *state, ddp_pg_t *pg, int bucket, float *data, size_t n,
                      ddp_work_t **work)
{
    (void)bucket;
    ((hook_count *)state)->launches++;
    return ddp_pg_all_reduce_async(pg, data, n, DDP_FLOAT32, DDP_SUM, work);
}

static int quarter_finish(void *state, ddp_pg_t *pg, int bucket, float *data, size_t n)
{
    (void)pg;
    (void)bucket;
    ((hook_count *)state)->finishes++;
    for (size_t i = 0; i < n; i++)
        data[i] *= 0.25f;
    return 0;
}

static int hook_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg;
    ddp_reducer_t *r;
    ddp_reducer_options o = tiny_options();
    o.rebuild_buckets = 0;
    CHILD_CHECK(open_reducer(rank, 2, "hook", 20, &o, &pg, &r) == 0);
    hook_count hc = {0, 0};
    ddp_comm_hook h = {sum_launch, quarter_finish, &hc};
    CHILD_CHECK(ddp_reducer_register_comm_hook(r, &h) == 0);
    CHILD_CHECK(backward_regions(r, rank, 0, -1) == 0);
    CHILD_CHECK(ddp_reducer_wait(r) == 0);
    int nb = ddp_reducer_num_buckets(r);
    CHILD_CHECK(hc.launches == nb && hc.finishes == nb);
    /* Each bucket's regions tile it, and a region's slice of the bucket
     * memory is what ddp_reducer_grad points at. */
    const float *base = ddp_reducer_grad(r, NREG - 1); /* first in fill order */
    int seen = 0;
    for (int b = 0; b < nb; b++) {
        int nr, i;
        size_t count, at = 0, off;
        CHILD_CHECK(ddp_reducer_bucket_info(r, b, &nr, &count) == 0);
        const float *start = NULL;
        for (int k = 0; k < nr; k++, seen++) {
            CHILD_CHECK(ddp_reducer_bucket_region(r, b, k, &i, &off) == 0);
            CHILD_CHECK(off == at);
            start = k == 0 ? ddp_reducer_grad(r, i) : start;
            CHILD_CHECK(ddp_reducer_grad(r, i) == start + off);
            at += counts[i];
        }
        CHILD_CHECK(at == count);
    }
    CHILD_CHECK(seen == NREG && base == ddp_reducer_grad(r, NREG - 1));
    CHILD_CHECK(ddp_reducer_bucket_region(r, 0, 99, NULL, NULL) == DDP_ERR_INVALID_ARG);
    for (int i = 0; i < NREG; i++)
        for (size_t j = 0; j < counts[i]; j++)
            CHILD_CHECK(close_to(ddp_reducer_grad(r, i)[j], 0.5 * mean(2, 0, i, j)));
    ddp_reducer_destroy(r);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_comm_hook(void **state)
{
    (void)state;
    assert_int_equal(run_children(2, hook_rank, NULL, 60), 0);
}

/* ==== agreement ============================================================ */

/* Rank 2 has a longer l0.b; rank 1 agrees with rank 0.  Every rank fails,
 * naming the first difference. */
static int mismatch_rank(int rank, void *arg)
{
    int extra = *(int *)arg;
    ddp_pg_t *pg;
    CHILD_CHECK(join_group(rank, 3, extra ? "mism1" : "mism0", 20, &pg) == 0);
    ddp_grad_region regs[NREG + 1];
    for (int i = 0; i < NREG; i++)
        regs[i] = (ddp_grad_region){names[i], NULL, counts[i] + (!extra && rank == 2 && i == 2)};
    regs[NREG] = (ddp_grad_region){"extra", NULL, 3};
    int n = NREG + (extra && rank == 2);
    ddp_reducer_t *r = NULL;
    CHILD_CHECK(ddp_reducer_create(pg, regs, n, NULL, &r) == DDP_ERR_MISMATCH);
    CHILD_CHECK(r == NULL);
    if (!extra)
        CHILD_CHECK(strstr(ddp_last_error(), "reducer: rank 2 differs from rank 0: region 2 is "
                                             "l0.b (65) on rank 2 but l0.b (64) on rank 0"));
    else
        CHILD_CHECK(strstr(ddp_last_error(), "reducer: rank 2 has 8 regions, rank 0 has 7 "
                                             "(first extra: extra (3) on rank 2)"));
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_mismatch(void **state)
{
    (void)state;
    int sizes = 0, extra = 1;
    assert_int_equal(run_children(3, mismatch_rank, &sizes, 60), 0);
    assert_int_equal(run_children(3, mismatch_rank, &extra, 60), 0);
}

/* ==== a peer that never reduces =========================================== */

/* Rank 1 makes the reducer, then never marks anything: rank 0's wait
 * fails within the group's timeout (2 s) instead of hanging. */
static int silent_peer_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg;
    ddp_reducer_t *r;
    ddp_reducer_options o = tiny_options();
    CHILD_CHECK(open_reducer(rank, 2, "silent", 2.0, &o, &pg, &r) == 0);
    if (rank == 1) {
        sleep_s(5.0);
    } else {
        double t0 = ddp_time_now();
        for (int i = NREG - 1; i >= 0; i--)
            CHILD_CHECK(ddp_reducer_mark_ready(r, i) == 0);
        CHILD_CHECK(ddp_reducer_wait(r) < 0);
        CHILD_CHECK(ddp_time_now() - t0 < 4.5);
        CHILD_CHECK(strstr(ddp_last_error(), "rank 1"));
    }
    ddp_reducer_destroy(r);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_silent_peer_times_out(void **state)
{
    (void)state;
    assert_int_equal(run_children(2, silent_peer_rank, NULL, 60), 0);
}

/* ==== join ================================================================ */

/* Rank 1 trains one iteration and joins; rank 0 trains three: its later
 * averages are its own gradient over 2 (the joined rank shadows with
 * zeros), and after the join both hold rank 0's parameters. */
static int join_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg;
    ddp_reducer_t *r;
    ddp_reducer_options o = tiny_options();
    CHILD_CHECK(open_reducer(rank, 2, "join", 20, &o, &pg, &r) == 0);
    CHILD_CHECK(ddp_reducer_join_enable(r, 1, 0) == 0);
    float params[8];
    for (int k = 0; k < 8; k++)
        params[k] = (float)(rank * 10 + k);
    int iters = rank == 0 ? 3 : 1;
    for (int it = 0; it < iters; it++) {
        CHILD_CHECK(ddp_reducer_join_step(r) == 0);
        ddp_reducer_zero_grad(r);
        CHILD_CHECK(backward_regions(r, rank, it, -1) == 0);
        CHILD_CHECK(ddp_reducer_wait(r) == 0);
        double want = it == 0 ? mean(2, 0, 3, 7) : value(0, it, 3, 7) / 2.0;
        CHILD_CHECK(close_to(ddp_reducer_grad(r, 3)[7], want));
    }
    CHILD_CHECK(ddp_reducer_join(r, params, 8) == 0);
    for (int k = 0; k < 8; k++)
        CHILD_CHECK(params[k] == (float)k);
    ddp_reducer_destroy(r);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_join(void **state)
{
    (void)state;
    assert_int_equal(run_children(2, join_rank, NULL, 60), 0);
}

/* ==== misuse, on one rank ================================================== */

static int misuse_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg;
    CHILD_CHECK(join_group(rank, 1, "misuse", 20, &pg) == 0);
    ddp_grad_region regs[2] = {{"a", NULL, 4}, {"", NULL, 4}};
    ddp_reducer_t *r;
    CHILD_CHECK(ddp_reducer_create(pg, regs, 2, NULL, &r) == DDP_ERR_INVALID_ARG);
    CHILD_CHECK(strstr(ddp_last_error(), "reducer: region 1 has no name"));
    regs[1].name = "b";
    ddp_reducer_options o = ddp_reducer_defaults();
    o.bucket_cap_mb = 0;
    CHILD_CHECK(ddp_reducer_create(pg, regs, 2, &o, &r) == DDP_ERR_INVALID_ARG);
    CHILD_CHECK(strstr(ddp_last_error(), "reducer: bucket caps must be > 0 MiB"));
    CHILD_CHECK(ddp_reducer_create(pg, regs, 2, NULL, &r) == 0);
    CHILD_CHECK(ddp_reducer_mark_ready(r, 2) == DDP_ERR_INVALID_ARG);
    CHILD_CHECK(strstr(ddp_last_error(), "region 2 out of range (2 regions)"));
    CHILD_CHECK(ddp_reducer_mark_ready(r, 1) == 0);
    CHILD_CHECK(ddp_reducer_mark_ready(r, 1) == DDP_ERR_STATE);
    CHILD_CHECK(strstr(ddp_last_error(), "reducer: region b was marked ready twice"));
    float *g;
    CHILD_CHECK(ddp_reducer_grad_buffer(r, 1, &g) == DDP_ERR_STATE);
    CHILD_CHECK(strstr(ddp_last_error(), "region b asked for its gradient buffer after it was "
                                         "marked ready"));
    CHILD_CHECK(ddp_reducer_mark_ready(r, 0) == 0);
    CHILD_CHECK(ddp_reducer_wait(r) == 0);
    float *shard;
    CHILD_CHECK(ddp_reducer_shard_grad(r, &shard, NULL, NULL) == DDP_ERR_INVALID_ARG);
    CHILD_CHECK(strstr(ddp_last_error(), "is for reduce-scatter mode"));
    ddp_reducer_destroy(r);
    ddp_reducer_destroy(NULL);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_misuse(void **state)
{
    (void)state;
    assert_int_equal(run_children(1, misuse_rank, NULL, 30), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_out_of_order),
        cmocka_unit_test(test_no_sync),
        cmocka_unit_test(test_unused_region),
        cmocka_unit_test(test_comm_hook),
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_silent_peer_times_out),
        cmocka_unit_test(test_join),
        cmocka_unit_test(test_misuse),
    };
    return cmocka_run_group_tests(tests, scratch_setup, scratch_teardown);
}
