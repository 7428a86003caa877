/* The reducer's reduce-scatter mode (ZeRO-2; include/ddp/reducer.h) with 2
 * and 3 real processes: ZeRO's flat shard bounds, each rank's averaged shard
 * against the same sums computed on one process in float64, accumulation
 * over waits and zero_grad, the pool never holding more buffers than it
 * has (the reducer's stats), the overflow buffer when every pool buffer is
 * held by a bucket that cannot launch yet (results still exact), a silent
 * peer ending the pool's wait within the timeout (and, once reduces into
 * the shard failed, the next wait and pass refused), and the modes' misuse
 * messages. */
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

#include "base/error.h"
#include "ddp.h"
#include "fork_children.h"
#include "scratch_dir.h"

#define NREG 9
static const size_t counts[NREG] = {37, 100, 64, 250, 5, 128, 77, 61, 90};
static const char *const names[NREG] = {"emb", "l0.w", "l0.b", "l1.w", "l1.b",
                                        "l2.w", "l2.b", "head.w", "head.b"};
#define TINY_MB (600.0 / (1024.0 * 1024.0)) /* ~150 floats a bucket */


static int join_group_within(int rank, int n, const char *tag, double timeout, ddp_pg_t **pg)
{
    char url[256];
    snprintf(url, sizeof url, "file://%s/store-%s", dir, tag);
    return ddp_init_process_group("tcp", url, rank, n, timeout, pg);
}

static int join_group(int rank, int n, const char *tag, ddp_pg_t **pg)
{
    return join_group_within(rank, n, tag, 20.0, pg);
}

/* Rank r's gradient at flat position k, iteration it (dyadic: exact sums). */
static float value(int rank, int it, size_t k)
{
    return (float)((rank + 1) * 0.5 + (double)(k % 29) * 0.125 - it * 0.25);
}

static int close_to(double got, double want) { return fabs(got - want) <= 1e-6 * (1 + fabs(want)); }

typedef struct {
    int world;
    int pool;
    int hold_early; /* ask for the two lowest regions' buffers first, mark them last */
    const char *tag;
} scatter_case;

static int write_region(ddp_reducer_t *r, int rank, int it, int i)
{
    float *g;
    size_t off;
    DDP_TRY(ddp_reducer_grad_buffer(r, i, &g));
    DDP_TRY(ddp_reducer_region_offset(r, i, &off));
    for (size_t j = 0; j < counts[i]; j++)
        g[j] += value(rank, it, off + j);
    return 0;
}

static int scatter_rank(int rank, void *arg)
{
    const scatter_case *c = arg;
    ddp_pg_t *pg;
    CHILD_CHECK(join_group(rank, c->world, c->tag, &pg) == 0);
    ddp_grad_region regs[NREG];
    size_t total = 0;
    for (int i = 0; i < NREG; i++) {
        regs[i] = (ddp_grad_region){names[i], NULL, counts[i]};
        total += counts[i];
    }
    ddp_reducer_options o = ddp_reducer_defaults();
    o.bucket_cap_mb = o.first_bucket_cap_mb = TINY_MB;
    o.mode = DDP_REDUCER_SCATTER;
    o.pool_buffers = c->pool;
    ddp_reducer_t *r;
    CHILD_CHECK(ddp_reducer_create(pg, regs, NREG, &o, &r) == 0);
    int nb = ddp_reducer_num_buckets(r);
    CHILD_CHECK(nb >= 5);
    /* ZeRO's flat partition, computed here apart from the reducer. */
    CHILD_CHECK(ddp_reducer_total_count(r) == total);
    size_t S = (total + (size_t)c->world - 1) / (size_t)c->world, begin, count;
    for (int s = 0; s < c->world; s++) {
        CHILD_CHECK(ddp_reducer_shard_bounds(r, s, &begin, &count) == 0);
        size_t e = (size_t)(s + 1) * S < total ? (size_t)(s + 1) * S : total;
        CHILD_CHECK(begin == (size_t)s * S && count == e - begin);
    }
    const int iters = 3;
    for (int it = 0; it < iters; it++) {
        if (c->hold_early) { /* regions 0 and 1 live in the last buckets */
            CHILD_CHECK(write_region(r, rank, it, 0) == 0);
            CHILD_CHECK(write_region(r, rank, it, 1) == 0);
        }
        for (int i = NREG - 1; i >= 0; i--) {
            if (!c->hold_early || i > 1)
                CHILD_CHECK(write_region(r, rank, it, i) == 0);
            CHILD_CHECK(ddp_reducer_mark_ready(r, i) == 0);
        }
        CHILD_CHECK(ddp_reducer_wait(r) == 0);
        float *shard;
        CHILD_CHECK(ddp_reducer_shard_grad(r, &shard, &begin, &count) == 0);
        CHILD_CHECK(ddp_reducer_shard_bounds(r, rank, &begin, &count) == 0);
        /* Iterations 0 and 1 accumulate; zero_grad after 1; 2 alone. */
        for (size_t k = 0; k < count; k++) {
            double want = 0;
            for (int q = it == 2 ? 2 : 0; q <= it; q++) {
                double s = 0;
                for (int w = 0; w < c->world; w++)
                    s += value(w, q, begin + k);
                want += s / c->world;
            }
            CHILD_CHECK(close_to(shard[k], want));
        }
        if (it == 1)
            ddp_reducer_zero_grad(r);
    }
    ddp_reducer_stats st;
    CHILD_CHECK(ddp_reducer_pool_stats(r, &st) == 0);
    CHILD_CHECK(st.pool_buffers == c->pool && st.buffers_in_use == 0);
    CHILD_CHECK(st.buckets_reduced == (uint64_t)(iters * nb));
    if (c->hold_early) {
        /* Two buffers held by buckets that launch last: the third bucket's
         * request finds none free and nothing in flight: one overflow. */
        CHILD_CHECK(st.overflow_buffers == 1);
        CHILD_CHECK(st.buffers_in_use_max == c->pool + 1);
    } else {
        CHILD_CHECK(st.overflow_buffers == 0);
        CHILD_CHECK(st.buffers_in_use_max <= c->pool);
        CHILD_CHECK(st.pool_waits > 0); /* the pool was recycled, not grown */
    }
    ddp_reducer_destroy(r);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_scatter_matches_sums(void **state)
{
    (void)state;
    scatter_case two = {2, 2, 0, "sc2"}, three = {3, 2, 0, "sc3"}, one_buf = {3, 1, 0, "sc3p1"};
    assert_int_equal(run_children(2, scatter_rank, &two, 60), 0);
    assert_int_equal(run_children(3, scatter_rank, &three, 60), 0);
    assert_int_equal(run_children(3, scatter_rank, &one_buf, 60), 0);
}

static void test_scatter_overflow_when_held_early(void **state)
{
    (void)state;
    scatter_case held = {2, 2, 1, "held"};
    assert_int_equal(run_children(2, scatter_rank, &held, 60), 0);
}

/* ==== a peer that never reduces =========================================== */

/* Rank 1 never writes nor marks anything; rank 0, with a one-buffer pool,
 * waits for its first bucket's reduce when the second bucket asks for a
 * buffer: that wait ends within the group's timeout (2 s) with an error
 * naming rank 1, never hangs.  With a pool for every bucket rank 0
 * launches them all, its own shard's reduced straight into the shard (it
 * is zero), and they fail: the shard may be partly written, so the next
 * wait and the next pass's buffer are refused, saying why. */
static int silent_rank(int rank, void *arg)
{
    const int pool = *(const int *)arg;
    ddp_pg_t *pg;
    char tag[32];
    snprintf(tag, sizeof tag, "silent%d", pool);
    CHILD_CHECK(join_group_within(rank, 2, tag, 2.0, &pg) == 0);
    ddp_grad_region regs[NREG];
    for (int i = 0; i < NREG; i++)
        regs[i] = (ddp_grad_region){names[i], NULL, counts[i]};
    ddp_reducer_options o = ddp_reducer_defaults();
    o.bucket_cap_mb = o.first_bucket_cap_mb = TINY_MB;
    o.mode = DDP_REDUCER_SCATTER;
    o.pool_buffers = pool;
    ddp_reducer_t *r;
    CHILD_CHECK(ddp_reducer_create(pg, regs, NREG, &o, &r) == 0);
    if (rank == 1) {
        sleep_s(5.0);
    } else {
        double t0 = ddp_time_now();
        int rc = 0;
        for (int i = NREG - 1; i >= 0 && rc == 0; i--)
            if ((rc = write_region(r, rank, 0, i)) == 0)
                rc = ddp_reducer_mark_ready(r, i);
        if (rc == 0)
            rc = ddp_reducer_wait(r);
        CHILD_CHECK(rc < 0);
        CHILD_CHECK(ddp_time_now() - t0 < 4.5);
        CHILD_CHECK(strstr(ddp_last_error(), "rank 1"));
        rc = ddp_reducer_wait(r); /* whatever is left: returns, within the timeout */
        if (pool > 1) {
            float *g;
            CHILD_CHECK(rc == DDP_ERR_STATE && strstr(ddp_last_error(), "gradient shard failed"));
            CHILD_CHECK(ddp_reducer_grad_buffer(r, 0, &g) == DDP_ERR_STATE);
            CHILD_CHECK(strstr(ddp_last_error(), "may be partly written"));
        }
    }
    ddp_reducer_destroy(r);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_scatter_silent_peer_times_out(void **state)
{
    (void)state;
    int one = 1, all = 16;
    assert_int_equal(run_children(2, silent_rank, &one, 60), 0);
    assert_int_equal(run_children(2, silent_rank, &all, 60), 0);
}

/* ==== misuse =============================================================== */

static int misuse_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg;
    CHILD_CHECK(join_group(rank, 1, "misuse", &pg) == 0);
    ddp_grad_region regs[2] = {{"a", NULL, 4}, {"b", NULL, 4}};
    ddp_reducer_options o = ddp_reducer_defaults();
    o.mode = DDP_REDUCER_SCATTER;
    o.comm_hook = DDP_HOOK_FP16;
    ddp_reducer_t *r;
    CHILD_CHECK(ddp_reducer_create(pg, regs, 2, &o, &r) == DDP_ERR_INVALID_ARG);
    CHILD_CHECK(strstr(ddp_last_error(), "is for the all-reduce mode"));
    o.comm_hook = DDP_HOOK_ALLREDUCE;
    o.pool_buffers = 0;
    CHILD_CHECK(ddp_reducer_create(pg, regs, 2, &o, &r) == DDP_ERR_INVALID_ARG);
    CHILD_CHECK(strstr(ddp_last_error(), "pool_buffers 0 out of range"));
    o.pool_buffers = 2;
    float mine[4] = {1, 2, 3, 4}; /* the pool would never read caller memory */
    ddp_grad_region own[2] = {{"a", NULL, 4}, {"b", mine, 4}};
    CHILD_CHECK(ddp_reducer_create(pg, own, 2, &o, &r) == DDP_ERR_INVALID_ARG);
    CHILD_CHECK(strstr(ddp_last_error(), "'b' brings its own gradient memory"));
    CHILD_CHECK(ddp_reducer_create(pg, regs, 2, &o, &r) == 0);
    CHILD_CHECK(ddp_reducer_set_no_sync(r, 1) == DDP_ERR_INVALID_ARG);
    CHILD_CHECK(strstr(ddp_last_error(), "no_sync needs the full gradients alive"));
    CHILD_CHECK(ddp_reducer_join_enable(r, 1, 0) == DDP_ERR_INVALID_ARG);
    ddp_comm_hook h = {0};
    CHILD_CHECK(ddp_reducer_register_comm_hook(r, &h) == DDP_ERR_INVALID_ARG);
    CHILD_CHECK(ddp_reducer_grad(r, 0) == NULL); /* no buffer yet */
    float *g;
    CHILD_CHECK(ddp_reducer_grad_buffer(r, 0, &g) == 0 && ddp_reducer_grad(r, 0) == g);
    g[0] = 3;
    CHILD_CHECK(ddp_reducer_mark_ready(r, 0) == 0);
    CHILD_CHECK(ddp_reducer_grad_buffer(r, 0, &g) == DDP_ERR_STATE);
    CHILD_CHECK(ddp_reducer_mark_ready(r, 1) == 0); /* b: never written, zeros */
    CHILD_CHECK(ddp_reducer_wait(r) == 0);
    float *shard;
    size_t begin, count;
    CHILD_CHECK(ddp_reducer_shard_grad(r, &shard, &begin, &count) == 0);
    CHILD_CHECK(begin == 0 && count == 8 && shard[0] == 3 && shard[4] == 0);
    ddp_reducer_destroy(r);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_scatter_misuse(void **state)
{
    (void)state;
    assert_int_equal(run_children(1, misuse_rank, NULL, 30), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scatter_matches_sums),
        cmocka_unit_test(test_scatter_overflow_when_held_early),
        cmocka_unit_test(test_scatter_silent_peer_times_out),
        cmocka_unit_test(test_scatter_misuse),
    };
    return cmocka_run_group_tests(tests, scratch_setup, scratch_teardown);
}
