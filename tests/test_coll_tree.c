/* The tree all-reduce (src/coll/allreduce_tree.c) on its own, chosen by
 * DDP_ALLREDUCE_ALGO=tree: every world size from 2 to 8 (the matrix of
 * test_coll.c has 2, 3, 4, 5, 8), every dtype and op that applies, counts
 * that leave a short last unit and more units than the staging slots
 * (DDP_CHUNK_BYTES of 1000: 250 floats, 125 doubles, a non-multiple of
 * every count below), each rank's output bit for bit against the tree's
 * documented order (coll_ref.h's ORDER_TREE).  Then the failures: a killed
 * rank fails the others at once with its name, and a vector of more units
 * than a tag can number is refused with a message.  Real processes over
 * tcp loopback. */
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
#include "pg/internal.h"
#include "pg_util.h"
#include "transport/tcp.h"

static job J;

static const size_t counts[] = {0, 1, 2, 7, 999, 2503, 9001};

/* Joins a group of n ranks over tcp that runs the tree, with pipeline
 * units of chunk bytes (NULL: the default); NULL on failure. */
static ddp_pg_t *tree_group(int rank, int n, const char *chunk)
{
    setenv("DDP_TRANSPORT", "tcp", 1);
    setenv("DDP_ALLREDUCE_ALGO", "tree", 1);
    if (chunk)
        setenv("DDP_CHUNK_BYTES", chunk, 1);
    ddp_pg_t *pg = NULL;
    if (ddp_init_process_group("tcp", J.url, rank, n, 60.0, &pg) != 0) {
        fprintf(stderr, "rank %d: init: %s\n", rank, ddp_last_error());
        return NULL;
    }
    return pg;
}

/* One case: all-reduce of count elements, compared with the reference. */
static int check_case(ddp_pg_t *pg, ddp_dtype dt, ddp_reduce_op op, size_t count, uint64_t id)
{
    const int n = ddp_pg_size(pg), r = ddp_pg_rank(pg);
    const size_t es = ddp_dtype_size(dt);
    uint8_t *x = malloc(count * es + 8), want[8];
    if (!x)
        return 1;
    for (size_t i = 0; i < count; i++)
        ref_input(x + i * es, dt, op, id, r, i);
    int bad = ddp_pg_all_reduce(pg, x, count, dt, op) != 0;
    if (bad)
        fprintf(stderr, "rank %d of %d: all-reduce failed: %s\n", r, n, ddp_last_error());
    for (size_t i = 0; i < count && !bad; i++) {
        ref_reduce(want, dt, op, id, n, i, ORDER_TREE, tree_of(i, count));
        if (memcmp(want, x + i * es, es) != 0) {
            uint64_t g = 0, w = 0;
            memcpy(&g, x + i * es, es);
            memcpy(&w, want, es);
            fprintf(stderr, "rank %d of %d: %s %s, count %zu: element %zu is 0x%llx, expected "
                            "0x%llx\n",
                    r, n, ddp_dtype_name(dt), ddp_reduce_op_name(op), count, i,
                    (unsigned long long)g, (unsigned long long)w);
            bad = 1;
        }
    }
    free(x);
    return bad;
}

static int every_case_rank(int rank, void *arg)
{
    int n = *(int *)arg;
    ddp_pg_t *pg = tree_group(rank, n, "1000");
    CHILD_CHECK(pg != NULL);
    int failed = 0;
    uint64_t id = 100;
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
        for (int dt = 0; dt < DDP_NUM_DTYPES; dt++)
            for (int op = 0; op < DDP_NUM_REDUCE_OPS; op++)
                if (op_applies(dt, op) && failed < 5)
                    failed += check_case(pg, dt, op, counts[ci], ++id);
    ddp_destroy_process_group(pg);
    return failed;
}

static void test_every_size_dtype_op(void **state)
{
    (void)state;
    for (int n = 2; n <= 8; n++) {
        job_init(&J);
        double t0 = ddp_time_now();
        assert_int_equal(run_children(n, every_case_rank, &n, 300.0), 0);
        fprintf(stderr, "world size %d: every case in %.2f s\n", n, ddp_time_now() - t0);
        job_cleanup(&J);
    }
}

/* ---- no unit is copied ---------------------------------------------------- */

/* Units above the transport's eager limit (64 KiB): a unit that arrives
 * before its receive is held in the kernel, and copied only when a
 * receive posted behind it on the same link needs the bytes after it.
 * Each rank posts its receives in the order each peer sends on that link
 * (both trees' traffic included), so none is ever copied. */
static int no_copy_rank(int rank, void *arg)
{
    int n = *(int *)arg;
    ddp_pg_t *pg = tree_group(rank, n, "131072");
    CHILD_CHECK(pg != NULL);
    size_t units = getenv("DDP_TEST_SANITIZER") ? 4 : 12; /* per half */
    CHILD_CHECK(check_case(pg, DDP_FLOAT32, DDP_SUM, 2 * units * 32768, 7) == 0);
    ddp__tcp_stats st;
    CHILD_CHECK(ddp__tcp_debug_stats(ddp__pg_transport(pg), &st) == 0);
    fprintf(stderr, "rank %d of %d: %llu frames (%llu bytes) copied, %llu held\n", rank, n,
            (unsigned long long)st.copied_frames, (unsigned long long)st.copied_bytes,
            (unsigned long long)st.held_frames);
    CHILD_CHECK(st.copied_frames == 0);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_no_unit_copied(void **state)
{
    (void)state;
    for (int n = 2; n <= 8; n++) {
        job_init(&J);
        assert_int_equal(run_children(n, no_copy_rank, &n, 120.0), 0);
        job_cleanup(&J);
    }
}

/* ---- a rank killed mid all-reduce ---------------------------------------- */

#define KILL_N 5
#define VICTIM 3 /* a leaf of tree 0, an inner node of tree 1 */

typedef struct kill_report {
    double err_time[KILL_N];
    int rc[KILL_N];
    char msg[KILL_N][256];
    int started[KILL_N];
} kill_report;

static kill_report *rep;

static int kill_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg = tree_group(rank, KILL_N, NULL);
    CHILD_CHECK(pg != NULL);
    size_t cnt = 1 << 20;
    float *x = calloc(cnt, sizeof *x);
    CHILD_CHECK(x != NULL);
    int rc = 0;
    for (int it = 0; rc == 0 && it < 100000; it++) {
        rc = ddp_pg_all_reduce(pg, x, cnt, DDP_FLOAT32, DDP_SUM);
        rep->started[rank] = 1;
    }
    rep->err_time[rank] = ddp_time_now();
    rep->rc[rank] = rc;
    snprintf(rep->msg[rank], sizeof rep->msg[rank], "%s", ddp_last_error());
    ddp_destroy_process_group(pg);
    free(x);
    return 0;
}

static void test_killed_rank_fails_the_others(void **state)
{
    (void)state;
    job_init(&J);
    rep = shared_page(sizeof *rep);
    rank_group g;
    start_ranks(&g, 0, KILL_N, kill_rank, NULL);
    double until = ddp_time_now() + 60;
    for (int r = 0; r < KILL_N; r++)
        while (!rep->started[r] && ddp_time_now() < until)
            sleep_s(0.01);
    sleep_s(0.2);
    double killed = ddp_time_now();
    kill(g.pids[VICTIM], SIGKILL);
    int failed = join_ranks(&g, 20.0);
    assert_int_equal(failed, 1); /* the victim */
    for (int r = 0; r < KILL_N; r++) {
        if (r == VICTIM)
            continue;
        fprintf(stderr, "rank %d failed %.3f s after the kill: %s\n", r,
                rep->err_time[r] - killed, rep->msg[r]);
        assert_int_equal(rep->rc[r], DDP_ERR_PEER);
        assert_true(contains(rep->msg[r], "rank 3"));
        assert_true(rep->err_time[r] - killed < 2.0);
    }
    munmap(rep, sizeof *rep);
    job_cleanup(&J);
}

/* ---- too many units for a tag ------------------------------------------ */

static int units_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg = tree_group(rank, 2, "1");
    CHILD_CHECK(pg != NULL);
    size_t cnt = 2 * ((size_t)1 << 24) + 4; /* each half: more than 2^24 - 1 units */
    uint8_t *x = calloc(cnt, 1);
    CHILD_CHECK(x != NULL);
    int rc = ddp_pg_all_reduce(pg, x, cnt, DDP_UINT8, DDP_SUM);
    CHILD_CHECK(rc == DDP_ERR_INVALID_ARG);
    CHILD_CHECK(contains(ddp_last_error(),
                         "tree all-reduce: 33554436 elements is too many for 1-byte chunks"));
    free(x);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_too_many_units(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(2, units_rank, NULL, 60.0), 0);
    job_cleanup(&J);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_size_dtype_op),
        cmocka_unit_test(test_no_unit_copied),
        cmocka_unit_test(test_killed_rank_fails_the_others),
        cmocka_unit_test(test_too_many_units),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
