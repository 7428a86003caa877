/* Process groups: argument errors, rendezvous failures (missing ranks,
 * disagreeing world sizes, a rank joining twice), asynchronous progress
 * while the caller computes, peers dying mid-operation, operation timeouts,
 * mismatched collectives, subgroups, point-to-point ordering.  Ranks are
 * forked processes on loopback. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/alloc.h"
#include "ddp/pg.h"
#include "pg_util.h"
#include "fork_children.h"

static job J;

static int sanitizer(void)
{
    const char *s = getenv("DDP_TEST_SANITIZER");
    return s && *s == '1';
}

/* ---- argument errors ------------------------------------------------- */

static void test_bad_arguments(void **state)
{
    (void)state;
    job_init(&J);
    ddp_pg_t *pg = (ddp_pg_t *)1;
    assert_int_equal(ddp_init_process_group("nccl", J.url, 0, 1, 5, &pg), DDP_ERR_UNSUPPORTED);
    assert_null(pg);
    assert_true(contains(ddp_last_error(), "unknown backend 'nccl'"));
    assert_true(ddp_init_process_group("tcp", J.url, 2, 2, 5, &pg) < 0);
    assert_true(contains(ddp_last_error(), "rank 2"));
    assert_true(ddp_init_process_group("tcp", "bogus://x", 0, 1, 5, &pg) < 0);
    assert_int_equal(ddp_init_process_group_store("tcp", NULL, 0, 1, 5, &pg), DDP_ERR_INVALID_ARG);

    assert_int_equal(ddp_init_process_group("tcp", J.url, 0, 1, 5, &pg), 0);
    assert_int_equal(ddp_pg_rank(pg), 0);
    assert_int_equal(ddp_pg_size(pg), 1);
    assert_string_equal(ddp_pg_backend(pg), "tcp");
    float f[4] = {1, 2, 3, 4};
    assert_int_equal(ddp_pg_all_reduce(pg, f, 4, DDP_FLOAT32, DDP_BXOR), DDP_ERR_INVALID_ARG);
    assert_true(contains(ddp_last_error(), "bxor does not apply to dtype float32"));
    assert_int_equal(ddp_pg_all_reduce(pg, f, 4, (ddp_dtype)42, DDP_SUM), DDP_ERR_INVALID_ARG);
    assert_true(contains(ddp_last_error(), "unknown dtype 42"));
    assert_int_equal(ddp_pg_all_reduce(pg, f, 4, DDP_FLOAT32, (ddp_reduce_op)9), DDP_ERR_INVALID_ARG);
    assert_true(contains(ddp_last_error(), "unknown reduce op 9"));
    assert_int_equal(ddp_pg_broadcast(pg, f, 4, DDP_FLOAT32, 1), DDP_ERR_INVALID_ARG);
    assert_true(contains(ddp_last_error(), "root 1 out of range for group size 1"));
    assert_int_equal(ddp_pg_send(pg, f, 4, DDP_FLOAT32, 0, 0), DDP_ERR_INVALID_ARG);
    assert_true(contains(ddp_last_error(), "cannot send to itself"));
    assert_int_equal(ddp_pg_all_reduce(pg, NULL, 4, DDP_FLOAT32, DDP_SUM), DDP_ERR_INVALID_ARG);
    assert_true(contains(ddp_last_error(), "NULL input buffer"));
    assert_int_equal(ddp_pg_all_to_all(pg, f, f + 1, 2, DDP_FLOAT32), DDP_ERR_INVALID_ARG);
    assert_true(contains(ddp_last_error(), "overlap"));
    ddp_work_t *w = NULL;
    assert_int_equal(ddp_pg_all_reduce_async(pg, f, 4, DDP_FLOAT32, DDP_AVG, &w), 0);
    assert_int_equal(ddp_work_wait(w, 5), 0);
    int done = 0;
    assert_int_equal(ddp_work_test(w, &done), 0);
    assert_int_equal(done, 1);
    ddp_work_destroy(w);
    assert_true(f[3] == 4.0f);
    int bad[2] = {0, 0};
    ddp_pg_t *sub = NULL;
    assert_int_equal(ddp_pg_new_group(pg, bad, 2, &sub), DDP_ERR_INVALID_ARG);
    ddp_dtype dt;
    ddp_reduce_op op;
    assert_int_equal(ddp_dtype_parse("bf16", &dt), 0);
    assert_int_equal(dt, DDP_BFLOAT16);
    assert_int_equal(ddp_reduce_op_parse("prod", &op), 0);
    assert_int_equal(op, DDP_PRODUCT);
    assert_int_equal(ddp_dtype_parse("float128", &dt), DDP_ERR_INVALID_ARG);
    assert_true(contains(ddp_last_error(), "unknown dtype 'float128'"));
    ddp_destroy_process_group(pg);
    ddp_destroy_process_group(NULL);
    ddp_work_destroy(NULL);
    job_cleanup(&J);
}

/* An unknown backend's message lists every backend built in (mpi too when
 * built); "gloo", the name PyTorch users type, is the tcp backend. */
static void test_backend_names(void **state)
{
    (void)state;
    assert_int_equal(ddp_pg_backend_check("nccl"), DDP_ERR_UNSUPPORTED);
    const char *const *names = ddp_pg_backend_names();
    assert_string_equal(names[0], "tcp");
    for (const char *const *n = names; *n; n++) {
        char want[64];
        snprintf(want, sizeof want, "%s%s", n == names ? "available: " : ", ", *n);
        if (!contains(ddp_last_error(), want))
            fail_msg("'%s' not listed in '%s'", *n, ddp_last_error());
    }
    assert_true(contains(ddp_last_error(), "unknown backend 'nccl'"));
    assert_true(contains(ddp_last_error(), "gloo means tcp"));
    assert_int_equal(ddp_pg_backend_check("tcp"), 0);
    assert_int_equal(ddp_pg_backend_check("gloo"), 0);
    assert_int_equal(ddp_pg_backend_check(NULL), 0);

    job_init(&J);
    ddp_pg_t *pg = NULL;
    assert_int_equal(ddp_init_process_group("gloo", J.url, 0, 1, 5, &pg), 0);
    assert_string_equal(ddp_pg_backend(pg), "tcp");
    int32_t x = 7;
    assert_int_equal(ddp_pg_all_reduce(pg, &x, 1, DDP_INT32, DDP_SUM), 0);
    assert_int_equal(x, 7);
    ddp_destroy_process_group(pg);
    job_cleanup(&J);
}

/* Tuning variables with bad values fail the init with a message naming
 * them (world size 1: no peer needed). */
static void test_bad_environment(void **state)
{
    (void)state;
    static const struct {
        const char *var, *value, *msg;
    } cases[] = {
        {"DDP_ALLREDUCE_ALGO", "bogus",
         "DDP_ALLREDUCE_ALGO=bogus: expected auto, ring, rd, direct, shared, rabenseifner or tree"},
        {"DDP_CHUNK_BYTES", "0", "DDP_CHUNK_BYTES=0: expected a size in bytes from 1 to 1 TiB"},
        {"DDP_ALLREDUCE_RD_BYTES", "12x", "DDP_ALLREDUCE_RD_BYTES=12x: expected a size in bytes"},
        {"DDP_SECRET_FILE", "/dev/null", "DDP_SECRET_FILE=/dev/null: a character device, not a regular file"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        job_init(&J);
        setenv(cases[i].var, cases[i].value, 1);
        ddp_pg_t *pg = NULL;
        int rc = ddp_init_process_group("tcp", J.url, 0, 1, 5, &pg);
        unsetenv(cases[i].var);
        assert_true(rc < 0);
        assert_null(pg);
        if (!contains(ddp_last_error(), cases[i].msg))
            fail_msg("%s=%s: got '%s'", cases[i].var, cases[i].value, ddp_last_error());
        job_cleanup(&J);
    }
}

/* ---- rendezvous failures --------------------------------------------- */

static int missing_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg = NULL;
    double t0 = ddp_time_now();
    int rc = ddp_init_process_group("tcp", J.url, rank, 4, 1.0, &pg);
    double took = ddp_time_now() - t0;
    CHILD_CHECK(rc == DDP_ERR_TIMEOUT && pg == NULL);
    CHILD_CHECK(contains(ddp_last_error(), "ranks 2, 3 did not join within 1.0 s"));
    CHILD_CHECK(took < 2.0); /* timeout + 1 s */
    return 0;
}

static void test_missing_ranks_time_out(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(2, missing_rank, NULL, 30), 0);
    job_cleanup(&J);
}

/* What the rendezvous logged while it waited (warn level, callback). */
static char waited_log[4096];

static void keep_log(int level, const char *msg, void *user)
{
    (void)user;
    if (level != DDP_LOG_WARN)
        return;
    size_t off = strlen(waited_log);
    snprintf(waited_log + off, sizeof waited_log - off, "%s\n", msg);
}

static int reporting_rank(int rank, void *arg)
{
    (void)arg;
    ddp_log_set_callback(keep_log, NULL);
    ddp_log_set_level(DDP_LOG_WARN);
    ddp_pg_t *pg = NULL;
    int rc = ddp_init_process_group("tcp", J.url, rank, 4, 1.2, &pg);
    CHILD_CHECK(rc == DDP_ERR_TIMEOUT);
    /* Reports every 0.3 s: the last ones, once rank 1 is in, name 2 and 3. */
    char me[64];
    snprintf(me, sizeof me, "rank %d: rendezvous 'ddp/world", rank);
    const char *want = "waiting for ranks 2, 3 (2 of 4 joined, ";
    int ok = contains(waited_log, me) && contains(waited_log, want) &&
             contains(waited_log, " s of 1.2 s)");
    if (!ok)
        fprintf(stderr, "rank %d logged:\n%s", rank, waited_log);
    CHILD_CHECK(ok);
    return 0;
}

/* A rank whose peers do not come says every DDP_RENDEZVOUS_REPORT_S who is
 * missing; 0 turns the reports off; a bad value is named. */
static void test_missing_ranks_reported(void **state)
{
    (void)state;
    job_init(&J);
    setenv("DDP_RENDEZVOUS_REPORT_S", "0.3", 1);
    int rc = run_children(2, reporting_rank, NULL, 30);
    job_cleanup(&J);

    job_init(&J);
    setenv("DDP_RENDEZVOUS_REPORT_S", "0", 1);
    waited_log[0] = 0;
    ddp_log_set_callback(keep_log, NULL);
    ddp_log_set_level(DDP_LOG_WARN);
    ddp_pg_t *pg = NULL;
    assert_int_equal(ddp_init_process_group("tcp", J.url, 0, 2, 0.5, &pg), DDP_ERR_TIMEOUT);
    assert_string_equal(waited_log, "");
    job_cleanup(&J);

    job_init(&J);
    setenv("DDP_RENDEZVOUS_REPORT_S", "soon", 1);
    assert_int_equal(ddp_init_process_group("tcp", J.url, 0, 2, 0.5, &pg), DDP_ERR_INVALID_ARG);
    assert_true(contains(ddp_last_error(), "DDP_RENDEZVOUS_REPORT_S=soon: expected seconds"));
    unsetenv("DDP_RENDEZVOUS_REPORT_S");
    ddp_log_set_callback(NULL, NULL);
    ddp_log_set_level(DDP_LOG_OFF);
    job_cleanup(&J);
    assert_int_equal(rc, 0);
}

static int sum_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 2, 10.0, &pg) == 0);
    int32_t x = rank + 1;
    CHILD_CHECK(ddp_pg_all_reduce(pg, &x, 1, DDP_INT32, DDP_SUM) == 0 && x == 3);
    ddp_destroy_process_group(pg);
    return 0;
}

/* A run that timed out in its rendezvous leaves its file:// store behind
 * (fewer than world_size members left); the next run must not trip over it
 * ("rank 0 joined twice") but start afresh. */
static void test_timed_out_run_leaves_no_trap(void **state)
{
    (void)state;
    job_init(&J);
    ddp_pg_t *pg = NULL;
    assert_int_equal(ddp_init_process_group("tcp", J.url, 0, 2, 0.3, &pg), DDP_ERR_TIMEOUT);
    assert_int_equal(access(J.path, F_OK), 0);
    assert_int_equal(run_children(2, sum_rank, NULL, 30), 0);
    job_cleanup(&J);
}

static int mismatch_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg = NULL;
    int rc = ddp_init_process_group("tcp", J.url, rank, rank == 0 ? 2 : 3, 3.0, &pg);
    CHILD_CHECK(rc == DDP_ERR_MISMATCH);
    CHILD_CHECK(contains(ddp_last_error(), "world size mismatch"));
    return 0;
}

static void test_world_size_mismatch(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(2, mismatch_rank, NULL, 30), 0);
    job_cleanup(&J);
}

static int twice_rank(int child, void *arg)
{
    (void)arg;
    int rank = child == 2 ? 0 : child; /* child 2 claims rank 0 again, later */
    if (child == 2)
        sleep_s(0.3);
    ddp_pg_t *pg = NULL;
    int rc = ddp_init_process_group("tcp", J.url, rank, 2, 10.0, &pg);
    if (child == 2) {
        CHILD_CHECK(rc == DDP_ERR_EXISTS);
        CHILD_CHECK(contains(ddp_last_error(), "rank 0 joined twice"));
        return 0;
    }
    CHILD_CHECK(rc == 0);
    int32_t x = rank + 1;
    CHILD_CHECK(ddp_pg_all_reduce(pg, &x, 1, DDP_INT32, DDP_SUM) == 0 && x == 3);
    sleep_s(0.5); /* let the intruder try */
    CHILD_CHECK(ddp_pg_barrier(pg) == 0);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_rank_joins_twice(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(3, twice_rank, NULL, 30), 0);
    job_cleanup(&J);
}

/* ---- asynchronous progress ------------------------------------------- */

static int async_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 2, 30.0, &pg) == 0);
    const size_t n = (sanitizer() ? 4u : 16u) << 20; /* 64 MiB of floats */
    float *x = ddp__alloc_aligned(n * sizeof *x);
    CHILD_CHECK(x != NULL);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(i % 1000) * (float)(rank + 1);
    ddp_work_t *w = NULL;
    CHILD_CHECK(ddp_pg_all_reduce_async(pg, x, n, DDP_FLOAT32, DDP_SUM, &w) == 0);
    /* Compute while it runs; only test(), never wait(). */
    double acc = 0, t0 = ddp_time_now();
    long iters_before_done = 0;
    int done = 0;
    while (!done && ddp_time_now() - t0 < 30) {
        for (int i = 0; i < 100000; i++)
            acc += (double)i * 1e-9;
        CHILD_CHECK(ddp_work_test(w, &done) == 0);
        if (!done)
            iters_before_done++;
    }
    CHILD_CHECK(done);
    CHILD_CHECK(iters_before_done > 0); /* the caller did compute meanwhile */
    CHILD_CHECK(ddp_work_wait(w, 0) == 0);
    ddp_work_destroy(w);
    for (size_t i = 0; i < n; i++)
        if (x[i] != (float)(i % 1000) * 3.0f) {
            fprintf(stderr, "element %zu: %f\n", i, x[i]);
            return 1;
        }
    /* Several in flight, then a blocking one: issue order is kept. */
    int32_t a[4][3];
    ddp_work_t *ws[4];
    for (int k = 0; k < 4; k++) {
        for (int j = 0; j < 3; j++)
            a[k][j] = k * 10 + j + rank;
        CHILD_CHECK(ddp_pg_all_reduce_async(pg, a[k], 3, DDP_INT32, DDP_MAX, &ws[k]) == 0);
    }
    int32_t b = rank;
    CHILD_CHECK(ddp_pg_all_reduce(pg, &b, 1, DDP_INT32, DDP_SUM) == 0 && b == 1);
    for (int k = 3; k >= 0; k--) {
        CHILD_CHECK(ddp_work_wait(ws[k], -1) == 0);
        ddp_work_destroy(ws[k]);
        for (int j = 0; j < 3; j++)
            CHILD_CHECK(a[k][j] == k * 10 + j + 1);
    }
    if (rank == 0)
        fprintf(stderr, "async: %ld compute slices ran while the all-reduce progressed (%.3f)\n",
                iters_before_done, acc);
    ddp__free_aligned(x);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_async_progress_while_computing(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(2, async_rank, NULL, 120), 0);
    job_cleanup(&J);
}

/* ---- a peer killed mid all-reduce ------------------------------------ */

typedef struct kill_report {
    double err_time[8];
    int rc[8];
    char msg[8][256];
    int started[8];
} kill_report;

static void test_peer_killed_mid_all_reduce(void **state)
{
    (void)state;
    job_init(&J);
    const int n = 3;
    kill_report *rep = shared_page(sizeof *rep);
    pid_t pids[3];
    for (int r = 0; r < n; r++) {
        fflush(NULL);
        pids[r] = fork();
        if (pids[r] == 0) {
            ddp_pg_t *pg = NULL;
            if (ddp_init_process_group("tcp", J.url, r, n, 30.0, &pg) != 0)
                _exit(2);
            size_t cnt = 1 << 20;
            float *x = calloc(cnt, sizeof *x);
            int rc = 0;
            for (int it = 0; rc == 0 && it < 100000; it++) {
                rc = ddp_pg_all_reduce(pg, x, cnt, DDP_FLOAT32, DDP_SUM);
                rep->started[r] = 1;
            }
            rep->err_time[r] = ddp_time_now();
            rep->rc[r] = rc;
            snprintf(rep->msg[r], sizeof rep->msg[r], "%s", ddp_last_error());
            /* Broken for good: the next call fails at once, destroy is quick. */
            float y = 1;
            int again = ddp_pg_all_reduce(pg, &y, 1, DDP_FLOAT32, DDP_SUM);
            if (again == 0 || !contains(ddp_last_error(), "already failed"))
                _exit(3);
            ddp_destroy_process_group(pg);
            free(x);
            _exit(0);
        }
    }
    while (!(rep->started[0] && rep->started[1] && rep->started[2]))
        sleep_s(0.01);
    sleep_s(0.2);
    double killed = ddp_time_now();
    kill(pids[2], SIGKILL);
    int status;
    waitpid(pids[2], &status, 0);
    for (int r = 0; r < 2; r++) {
        if (!reap_by(pids[r], ddp_time_now() + 10, &status)) {
            kill_children(pids, n);
            fail_msg("rank %d hangs after rank 2 was killed", r);
        }
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
        assert_int_equal(rep->rc[r], DDP_ERR_PEER);
        assert_true(contains(rep->msg[r], "rank 2"));
        assert_true(rep->err_time[r] - killed < 2.0);
        fprintf(stderr, "rank %d failed %.3f s after the kill: %s\n", r,
                rep->err_time[r] - killed, rep->msg[r]);
    }
    munmap(rep, sizeof *rep);
    job_cleanup(&J);
}

/* ---- timeouts and mismatches ----------------------------------------- */

static int slow_peer_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 2, 1.0, &pg) == 0);
    float x[8] = {0};
    if (rank == 1) {
        sleep_s(2.0); /* never joins rank 0's all-reduce in time */
        ddp_destroy_process_group(pg);
        return 0;
    }
    /* A work handle times out without harm first... */
    ddp_work_t *w = NULL;
    CHILD_CHECK(ddp_pg_all_reduce_async(pg, x, 8, DDP_FLOAT32, DDP_SUM, &w) == 0);
    CHILD_CHECK(ddp_work_wait(w, 0.1) == DDP_ERR_TIMEOUT);
    CHILD_CHECK(contains(ddp_last_error(), "still running after 0.1 s"));
    /* ...then the operation's own timeout (the group's, 1 s) fires. */
    double t0 = ddp_time_now();
    int rc = ddp_work_wait(w, -1);
    CHILD_CHECK(rc == DDP_ERR_TIMEOUT);
    CHILD_CHECK(contains(ddp_last_error(), "rank 1"));
    CHILD_CHECK(ddp_time_now() - t0 < 2.0);
    ddp_work_destroy(w);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_operation_timeout_names_rank(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(2, slow_peer_rank, NULL, 30), 0);
    job_cleanup(&J);
}

/* Ranks that named the length mismatch (shared with the forked ranks). */
static int *mismatch_named;

static int mismatch_count_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 2, 5.0, &pg) == 0);
    float x[20] = {0};
    int rc = ddp_pg_all_reduce(pg, x, rank == 0 ? 10 : 20, DDP_FLOAT32, DDP_SUM);
    CHILD_CHECK(rc < 0);
    /* The rank that sees the wrong length says so; the other may see it quit. */
    if (contains(ddp_last_error(), "were expected")) {
        CHILD_CHECK(rc == DDP_ERR_PROTOCOL); /* a broken protocol, not a dead peer */
        __atomic_fetch_add(mismatch_named, 1, __ATOMIC_SEQ_CST);
    }
    else
        CHILD_CHECK(contains(ddp_last_error(), "closed without goodbye"));
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_mismatched_collectives_fail(void **state)
{
    (void)state;
    mismatch_named = mmap(NULL, sizeof *mismatch_named, PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(mismatch_named != MAP_FAILED);
    *mismatch_named = 0;
    job_init(&J);
    assert_int_equal(run_children(2, mismatch_count_rank, NULL, 30), 0);
    job_cleanup(&J);
    /* Not both "closed without goodbye": one of them names the mismatch. */
    assert_true(*mismatch_named >= 1);
    munmap(mismatch_named, sizeof *mismatch_named);
}

/* ---- subgroups and point to point ------------------------------------ */

static int subgroup_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg = NULL, *sub = NULL, *sub2 = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 4, 10.0, &pg) == 0);
    const int members[2] = {3, 1};
    CHILD_CHECK(ddp_pg_new_group(pg, members, 2, &sub) == 0);
    const int evens[2] = {0, 2};
    CHILD_CHECK(ddp_pg_new_group(pg, evens, 2, &sub2) == 0);
    if (rank == 1 || rank == 3) {
        CHILD_CHECK(sub != NULL && sub2 == NULL);
        CHILD_CHECK(ddp_pg_rank(sub) == (rank == 3 ? 0 : 1) && ddp_pg_size(sub) == 2);
        int64_t v = rank;
        CHILD_CHECK(ddp_pg_all_reduce(sub, &v, 1, DDP_INT64, DDP_SUM) == 0 && v == 4);
    } else {
        CHILD_CHECK(sub == NULL && sub2 != NULL);
        int64_t v = rank + 10;
        CHILD_CHECK(ddp_pg_broadcast(sub2, &v, 1, DDP_INT64, 1) == 0 && v == 12);
    }
    int64_t all = 1;
    CHILD_CHECK(ddp_pg_all_reduce(pg, &all, 1, DDP_INT64, DDP_SUM) == 0 && all == 4);
    ddp_destroy_process_group(sub);
    ddp_destroy_process_group(sub2);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_new_group(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(4, subgroup_rank, NULL, 60), 0);
    job_cleanup(&J);
}

static int p2p_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 2, 10.0, &pg) == 0);
    const size_t n = 1 << 18; /* 1 MiB: larger than the eager limit */
    int32_t *a = malloc(n * 4), *b = malloc(n * 4);
    if (rank == 0) {
        for (size_t i = 0; i < n; i++) {
            a[i] = (int32_t)i;
            b[i] = -(int32_t)i;
        }
        CHILD_CHECK(ddp_pg_send(pg, a, n, DDP_INT32, 1, 1) == 0);
        CHILD_CHECK(ddp_pg_send(pg, b, n, DDP_INT32, 1, 2) == 0);
        CHILD_CHECK(ddp_pg_send(pg, a, 3, DDP_INT32, 1, 7) == 0);
    } else {
        /* Out of order: tag 2 first, though tag 1 is ahead in the stream. */
        CHILD_CHECK(ddp_pg_recv(pg, b, n, DDP_INT32, 0, 2) == 0);
        CHILD_CHECK(ddp_pg_recv(pg, a, n, DDP_INT32, 0, 1) == 0);
        for (size_t i = 0; i < n; i++)
            CHILD_CHECK(a[i] == (int32_t)i && b[i] == -(int32_t)i);
        int32_t small[4];
        CHILD_CHECK(ddp_pg_recv(pg, small, 4, DDP_INT32, 0, 7) < 0); /* 3 sent, 4 expected */
        CHILD_CHECK(contains(ddp_last_error(), "sent 12 bytes"));
    }
    free(a);
    free(b);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_point_to_point(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(2, p2p_rank, NULL, 30), 0);
    job_cleanup(&J);
}

/* ---- destroy gives everything back ----------------------------------- */

static int count_entries(const char *dir) { return dir_entries(dir, ""); }

static int release_rank(int rank, void *arg)
{
    (void)arg;
    setenv("DDP_TRACE_BUFFER", "2000", 1); /* its watcher thread must go too */
    int fds0 = count_entries("/proc/self/fd"), threads0 = count_entries("/proc/self/task");
    for (int round = 0; round < 2; round++) {
        ddp_store_t *st = NULL;
        char path[200];
        snprintf(path, sizeof path, "%s.%d", J.path, round);
        CHILD_CHECK(ddp_store_file_create(path, 2, &st) == 0);
        ddp_pg_t *pg = NULL, *sub = NULL;
        CHILD_CHECK(ddp_init_process_group_store("tcp", st, rank, 2, 10.0, &pg) == 0);
        const int both[2] = {1, 0};
        CHILD_CHECK(ddp_pg_new_group(pg, both, 2, &sub) == 0 && sub);
        /* two communication threads, and the flight recorder's SIGUSR1 watcher */
        CHILD_CHECK(count_entries("/proc/self/task") == threads0 + 3);
        float x[1000] = {0}, y[1000] = {0};
        ddp_work_t *w = NULL;
        CHILD_CHECK(ddp_pg_all_reduce_async(pg, x, 1000, DDP_FLOAT32, DDP_SUM, &w) == 0);
        CHILD_CHECK(ddp_pg_all_reduce(sub, y, 1000, DDP_FLOAT32, DDP_SUM) == 0);
        if (round == 1) /* destroy with the work still queued or running */
            ddp_work_destroy(w);
        ddp_destroy_process_group(sub);
        ddp_destroy_process_group(pg); /* drains the queue first */
        if (round == 0) { /* a handle outlives its group */
            CHILD_CHECK(ddp_work_wait(w, 0) == 0);
            ddp_work_destroy(w);
        }
        ddp_store_destroy(st);
    }
    CHILD_CHECK(count_entries("/proc/self/fd") == fds0);
    CHILD_CHECK(count_entries("/proc/self/task") == threads0);
    return 0;
}

static void test_destroy_releases_everything(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(2, release_rank, NULL, 60), 0);
    char path[200];
    for (int round = 0; round < 2; round++) {
        snprintf(path, sizeof path, "%s.%d", J.path, round);
        unlink(path);
    }
    job_cleanup(&J);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_backend_names),
        cmocka_unit_test(test_bad_environment),
        cmocka_unit_test(test_missing_ranks_time_out),
        cmocka_unit_test(test_missing_ranks_reported),
        cmocka_unit_test(test_timed_out_run_leaves_no_trap),
        cmocka_unit_test(test_world_size_mismatch),
        cmocka_unit_test(test_rank_joins_twice),
        cmocka_unit_test(test_async_progress_while_computing),
        cmocka_unit_test(test_peer_killed_mid_all_reduce),
        cmocka_unit_test(test_operation_timeout_names_rank),
        cmocka_unit_test(test_mismatched_collectives_fail),
        cmocka_unit_test(test_new_group),
        cmocka_unit_test(test_point_to_point),
        cmocka_unit_test(test_destroy_releases_everything),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
