/* The shared-memory transport beyond the collective matrix (test_shm_coll):
 * transport selection (auto, DDP_TRANSPORT, DDP_HOST_ID), crash safety
 * (kill -9 of a rank during a large all-reduce, shared-window and ring, is
 * reported by name within 2 s; /dev/shm keeps nothing of the job), a peer
 * that leaves, timeouts (message waits and shared-window waits), the ring
 * path without cross-memory attach and through a tiny ring, the shared
 * window through a tiny window and without one, and the error messages a
 * user can reach.  Ranks are forked processes.  A group's setup (its pages
 * mapped, the CPU each rank waits on): test_shm_setup.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ddp/pg.h"
#include "pg/internal.h"
#include "pg_util.h"
#include "fork_children.h"
#include "transport/shm.h"
#include "transport/shm/internal.h"
#include "transport/transport.h"
#include "transport_util.h"

static job J;

/* ---- selection -------------------------------------------------------- */

typedef struct sel_arg {
    const char *mode[4];    /* DDP_TRANSPORT per rank (NULL: unset) */
    const char *host[4];    /* DDP_HOST_ID per rank (NULL: unset) */
    const char *want;       /* transport name, or NULL when init must fail */
    const char *msg;        /* expected part of the error */
    const char *rank_msg[4]; /* per rank, where it differs from msg */
    double timeout;         /* of the group (default 10 s) */
    int n;
} sel_arg;

static int sel_rank(int rank, void *arg)
{
    sel_arg *a = arg;
    if (a->mode[rank])
        setenv("DDP_TRANSPORT", a->mode[rank], 1);
    else
        unsetenv("DDP_TRANSPORT");
    if (a->host[rank])
        setenv("DDP_HOST_ID", a->host[rank], 1);
    else
        unsetenv("DDP_HOST_ID");
    ddp_pg_t *pg = NULL;
    int rc = ddp_init_process_group("tcp", J.url, rank, a->n, a->timeout > 0 ? a->timeout : 10.0,
                                    &pg);
    if (!a->want) {
        CHILD_CHECK(rc < 0 &&
                    contains(ddp_last_error(), a->rank_msg[rank] ? a->rank_msg[rank] : a->msg));
        return 0;
    }
    CHILD_CHECK(rc == 0);
    CHILD_CHECK(strcmp(transport_of(pg), a->want) == 0);
    /* And it works: an order-free sum. */
    int32_t x[5] = {rank, 1, 2, 3, rank * 10};
    CHILD_CHECK(ddp_pg_all_reduce(pg, x, 5, DDP_INT32, DDP_SUM) == 0);
    int s = a->n * (a->n - 1) / 2;
    CHILD_CHECK(x[0] == s && x[1] == a->n && x[2] == 2 * a->n && x[3] == 3 * a->n &&
                x[4] == 10 * s);
    ddp_destroy_process_group(pg);
    return 0;
}

static void run_sel(sel_arg *a)
{
    job_init(&J);
    assert_int_equal(run_children(a->n, sel_rank, a, 30.0), 0);
    job_cleanup(&J);
}

static void test_auto_picks_shm_on_one_host(void **state)
{
    (void)state;
    sel_arg a = {.n = 3, .want = "shm"};
    run_sel(&a);
}

static void test_env_tcp_forces_tcp(void **state)
{
    (void)state;
    sel_arg a = {.n = 2, .want = "tcp", .mode = {"tcp", "tcp"}};
    run_sel(&a);
    /* One rank asking for tcp is enough: the others follow. */
    sel_arg b = {.n = 2, .want = "tcp", .mode = {"auto", "tcp"}};
    run_sel(&b);
}

static void test_other_host_forces_tcp(void **state)
{
    (void)state;
    sel_arg a = {.n = 3, .want = "tcp", .host = {"hostA", "hostA", "hostB"}};
    run_sel(&a);
    sel_arg b = {.n = 2, .want = "shm", .host = {"same", "same"}, .mode = {"shm", "shm"}};
    run_sel(&b);
}

static void test_shm_forced_across_hosts_fails(void **state)
{
    (void)state;
    sel_arg a = {.n = 2,
                 .host = {"hostA", "hostB"},
                 .mode = {"shm", NULL},
                 .msg = "DDP_TRANSPORT=shm (rank 0) but the group spans hosts: rank 0 is on "
                        "'hostA', rank 1 on 'hostB'"};
    run_sel(&a);
}

static void test_ranks_disagree_on_transport(void **state)
{
    (void)state;
    /* Rank 0 goes straight to TCP (a tcp rank never waits for the others'
     * choice) and times out waiting for rank 1, which names the cause. */
    sel_arg a = {.n = 2,
                 .mode = {"tcp", "shm"},
                 .timeout = 1.0,
                 .rank_msg = {"rank 1 did not join within 1.0 s"},
                 .msg = "ranks disagree on DDP_TRANSPORT: rank 0 says tcp, rank 1 says shm"};
    run_sel(&a);
}

/* A one-rank init under env name=value fails with msg (a fresh store each
 * time: a failed init leaves its rank's join behind). */
static void init_fails(const char *name, const char *value, const char *msg)
{
    job_init(&J);
    setenv("DDP_TRANSPORT", "shm", 1);
    setenv(name, value, 1);
    ddp_pg_t *pg = NULL;
    assert_true(ddp_init_process_group("tcp", J.url, 0, 1, 5.0, &pg) < 0);
    if (!contains(ddp_last_error(), msg))
        fail_msg("expected '%s' in '%s'", msg, ddp_last_error());
    unsetenv(name);
    unsetenv("DDP_TRANSPORT");
    job_cleanup(&J);
}

static void test_bad_environment(void **state)
{
    (void)state;
    init_fails("DDP_TRANSPORT", "infiniband", "DDP_TRANSPORT=infiniband: expected auto, tcp or shm");
    init_fails("DDP_HOST_ID", "a b", "DDP_HOST_ID=a b: expected at most");
    init_fails("DDP_SHM_RING_BYTES", "12",
               "DDP_SHM_RING_BYTES=12: expected a size in bytes from 4 KiB to 1 GiB");
    init_fails("DDP_SHM_SPIN_US", "fast", "DDP_SHM_SPIN_US=fast: expected microseconds from 0 to 1e+07");
    init_fails("DDP_SHM_YIELD_US", "nan", "DDP_SHM_YIELD_US=nan: expected microseconds from 0 to 1e+07");
    init_fails("DDP_SHM_CMA", "yes", "DDP_SHM_CMA=yes: expected 0 or 1");
    init_fails("DDP_SHM_WINDOW_BYTES", "2e9",
               "DDP_SHM_WINDOW_BYTES=2e9: expected a size in bytes from 0 to 1 GiB");
    init_fails("DDP_SHARED_CHUNK_BYTES", "0",
               "DDP_SHARED_CHUNK_BYTES=0: expected a size in bytes from 1 to 1 TiB");
    init_fails("DDP_ALLREDUCE_SHARED_BYTES", "64k",
               "DDP_ALLREDUCE_SHARED_BYTES=64k: expected a size in bytes from 1 to 1 TiB");
    init_fails("DDP_REDUCE_ISA", "sse9",
               "DDP_REDUCE_ISA=sse9: expected auto, avx512, avx2 or portable");
}

/* Ranks that disagree on the window's size: the segment's size gives it
 * away on the rank that attaches; rank 0 times out waiting for it. */
static int window_mismatch_rank(int rank, void *arg)
{
    (void)arg;
    setenv("DDP_TRANSPORT", "shm", 1);
    if (rank == 1)
        setenv("DDP_SHM_WINDOW_BYTES", "8192", 1);
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 2, 1.0, &pg) < 0);
    if (rank == 1)
        CHILD_CHECK(contains(ddp_last_error(), "were expected (ranks disagree on world size, "
                                               "DDP_SHM_RING_BYTES or DDP_SHM_WINDOW_BYTES?)"));
    return 0;
}

static void test_window_size_mismatch(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(2, window_mismatch_rank, NULL, 30.0), 0);
    job_cleanup(&J);
}

/* Ranks whose shared-window all-reduces differ (here in count: 4 and 5
 * chunks) fail with a message instead of mixing the two calls' data. */
static int count_mismatch_rank(int rank, void *arg)
{
    (void)arg;
    setenv("DDP_TRANSPORT", "shm", 1);
    setenv("DDP_ALLREDUCE_ALGO", "shared", 1);
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 2, 10.0, &pg) == 0);
    size_t cnt = (size_t)(rank == 0 ? 4 : 5) << 16; /* 256 KiB chunks */
    float *x = calloc(cnt, sizeof *x);
    CHILD_CHECK(x != NULL);
    double t0 = ddp_time_now();
    int rc = ddp_pg_all_reduce(pg, x, cnt, DDP_FLOAT32, DDP_SUM);
    CHILD_CHECK(rc < 0 && ddp_time_now() - t0 < 5.0);
    char want[64];
    snprintf(want, sizeof want, "rank %d runs a different collective", 1 - rank);
    if (!contains(ddp_last_error(), want))
        fprintf(stderr, "rank %d: %s\n", rank, ddp_last_error());
    /* Its own finding, or its peer's passed on ("gave up: ..."). */
    CHILD_CHECK(contains(ddp_last_error(), "runs a different collective (do the ranks call the "
                                           "same collectives with the same counts"));
    free(x);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_shared_calls_differ(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(2, count_mismatch_rank, NULL, 30.0), 0);
    job_cleanup(&J);
}

/* The shared-window all-reduce (or reduce) forced where there is no window:
 * tcp, or shm with DDP_SHM_WINDOW_BYTES=0.  arg: "MODE all_reduce" or
 * "MODE reduce". */
static int no_window_rank(int rank, void *arg)
{
    char mode[8];
    const char *op = strchr(arg, ' ') + 1;
    snprintf(mode, sizeof mode, "%.*s", (int)(op - 1 - (const char *)arg), (const char *)arg);
    setenv("DDP_TRANSPORT", mode, 1);
    setenv("DDP_ALLREDUCE_ALGO", "shared", 1);
    setenv("DDP_SHM_WINDOW_BYTES", "0", 1);
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 2, 10.0, &pg) == 0);
    float x[4] = {1, 2, 3, 4};
    int rc = strcmp(op, "reduce") == 0 ? ddp_pg_reduce(pg, x, 4, DDP_FLOAT32, DDP_SUM, 1)
                                       : ddp_pg_all_reduce(pg, x, 4, DDP_FLOAT32, DDP_SUM);
    CHILD_CHECK(rc == DDP_ERR_UNSUPPORTED);
    char want[160];
    snprintf(want, sizeof want,
             "%s algorithm 'shared' needs a shared window: the shm transport with "
             "DDP_SHM_WINDOW_BYTES > 0 (this group: %s%s)",
             op, mode, strcmp(mode, "shm") == 0 ? " without a window" : "");
    CHILD_CHECK(contains(ddp_last_error(), want));
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_shared_algo_needs_window(void **state)
{
    (void)state;
    const char *cases[] = {"tcp all_reduce", "shm all_reduce", "tcp reduce", "shm reduce"};
    for (int i = 0; i < 4; i++) {
        job_init(&J);
        assert_int_equal(run_children(2, no_window_rank, (void *)cases[i], 30.0), 0);
        job_cleanup(&J);
    }
}

/* A DDP_SHARED_CHUNK_BYTES too small for the ranks (64 bytes, 2 ranks
 * need 128): forced, the shared-window all-reduce fails with a message;
 * auto runs the ring instead. */
static int small_chunk_rank(int rank, void *arg)
{
    const char *algo = arg;
    setenv("DDP_TRANSPORT", "shm", 1);
    setenv("DDP_ALLREDUCE_ALGO", algo, 1);
    setenv("DDP_SHARED_CHUNK_BYTES", "64", 1);
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 2, 10.0, &pg) == 0);
    size_t n = 1 << 18; /* 1 MiB: auto would take the shared window */
    float *x = malloc(n * sizeof *x);
    CHILD_CHECK(x != NULL);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(rank + 1);
    int rc = ddp_pg_all_reduce(pg, x, n, DDP_FLOAT32, DDP_SUM);
    if (strcmp(algo, "shared") == 0) {
        CHILD_CHECK(rc == DDP_ERR_INVALID_ARG);
        CHILD_CHECK(contains(ddp_last_error(), "(chunk 64) too small for 2 ranks"));
    } else {
        CHILD_CHECK(rc == 0 && x[0] == 3.0f && x[n - 1] == 3.0f);
    }
    free(x);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_shared_chunk_too_small(void **state)
{
    (void)state;
    const char *algos[] = {"shared", "auto"};
    for (int i = 0; i < 2; i++) {
        job_init(&J);
        assert_int_equal(run_children(2, small_chunk_rank, (void *)algos[i], 30.0), 0);
        job_cleanup(&J);
    }
}

/* ---- crash safety ----------------------------------------------------- */

typedef struct crash_report {
    int started[4];
    int unlinked[4];  /* the segment's name was gone once setup finished */
    int rc[4];
    double err_time[4];
    char msg[4][512];
} crash_report;

/* algo: DDP_ALLREDUCE_ALGO of the ranks. */
static void kill9_during_all_reduce(const char *algo)
{
    job_init(&J);
    const int n = 3, victim = 1;
    crash_report *rep = shared_page(sizeof *rep);
    pid_t pids[3];
    for (int r = 0; r < n; r++) {
        fflush(NULL);
        pids[r] = fork();
        if (pids[r] == 0) {
            setenv("DDP_TRANSPORT", "shm", 1);
            setenv("DDP_ALLREDUCE_ALGO", algo, 1);
            ddp_pg_t *pg = NULL;
            if (ddp_init_process_group("tcp", J.url, r, n, 30.0, &pg) != 0)
                _exit(2);
            char path[128];
            snprintf(path, sizeof path, "/dev/shm%s", ddp__shm_debug_name(ddp__pg_transport(pg)));
            rep->unlinked[r] = access(path, F_OK) < 0 && errno == ENOENT;
            size_t cnt = (size_t)4 << 20; /* 16 MiB */
            float *x = calloc(cnt, sizeof *x);
            int rc = 0;
            for (int it = 0; rc == 0 && it < 1000000; it++) {
                rc = ddp_pg_all_reduce(pg, x, cnt, DDP_FLOAT32, DDP_SUM);
                rep->started[r] = 1;
            }
            rep->err_time[r] = ddp_time_now();
            rep->rc[r] = rc;
            snprintf(rep->msg[r], sizeof rep->msg[r], "%s", ddp_last_error());
            ddp_destroy_process_group(pg);
            free(x);
            _exit(0);
        }
    }
    double until = ddp_time_now() + 20;
    while (!(rep->started[0] && rep->started[1] && rep->started[2]) && ddp_time_now() < until)
        sleep_s(0.01);
    sleep_s(0.05);
    double killed = ddp_time_now();
    kill(pids[victim], SIGKILL);
    int status;
    /* The victim stays a zombie until reaped: pidfds see it anyway. */
    char want[64];
    snprintf(want, sizeof want, "rank %d (pid %d) died", victim, (int)pids[victim]);
    for (int r = 0; r < n; r++) {
        if (r == victim)
            continue;
        if (!reap_by(pids[r], ddp_time_now() + 10, &status)) {
            kill_children(pids, n);
            fail_msg("rank %d hangs after rank %d was killed", r, victim);
        }
        fprintf(stderr, "%s: rank %d failed %.3f s after the kill: %s\n", algo, r,
                rep->err_time[r] - killed, rep->msg[r]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
        assert_int_equal(rep->rc[r], DDP_ERR_PEER);
        assert_true(contains(rep->msg[r], want));
        assert_true(rep->err_time[r] - killed < 2.0);
        assert_true(rep->unlinked[r]);
    }
    waitpid(pids[victim], &status, 0);
    char prefix[32];
    snprintf(prefix, sizeof prefix, "ddp-%d-", (int)pids[0]); /* rank 0 names the segment */
    assert_int_equal(shm_entries(prefix), 0);
    munmap(rep, sizeof *rep);
    job_cleanup(&J);
}

static void test_kill9_during_large_all_reduce(void **state)
{
    (void)state;
    kill9_during_all_reduce("shared");
    kill9_during_all_reduce("ring");
}

/* ---- leaving, timeouts ------------------------------------------------ */

static int leave_rank(int rank, void *arg)
{
    (void)arg;
    setenv("DDP_TRANSPORT", "shm", 1);
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 2, 10.0, &pg) == 0);
    int32_t v[3] = {7, 8, 9}, got[3] = {0};
    if (rank == 1) {
        /* Send, then leave at once: what was sent is still delivered. */
        CHILD_CHECK(ddp_pg_send(pg, v, 3, DDP_INT32, 0, 5) == 0);
        ddp_destroy_process_group(pg);
        return 0;
    }
    sleep_s(0.2);
    CHILD_CHECK(ddp_pg_recv(pg, got, 3, DDP_INT32, 1, 5) == 0);
    CHILD_CHECK(got[0] == 7 && got[1] == 8 && got[2] == 9);
    int rc = ddp_pg_recv(pg, got, 3, DDP_INT32, 1, 6);
    CHILD_CHECK(rc == DDP_ERR_PEER);
    CHILD_CHECK(contains(ddp_last_error(), "rank 1 (pid ") &&
                contains(ddp_last_error(), "left the group"));
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_peer_leaves(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(2, leave_rank, NULL, 30.0), 0);
    job_cleanup(&J);
}

/* A peer that leaves instead of joining a shared-window all-reduce: the
 * others fail at once naming it (not at the deadline).  timeout: the
 * group's; rank 1 sleeps for sleep_s, then leaves (or, sleep_s < 0, never
 * comes: rank 0 times out naming it). */
typedef struct shared_wait_arg {
    double timeout, sleep_s;
    const char *want, *want_too; /* parts of rank 0's message (want_too may be NULL) */
    double min_s, max_s; /* rank 0's failure comes within [min_s, max_s] */
} shared_wait_arg;

static int shared_wait_rank(int rank, void *arg)
{
    shared_wait_arg *a = arg;
    setenv("DDP_TRANSPORT", "shm", 1);
    setenv("DDP_ALLREDUCE_ALGO", "shared", 1);
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 2, a->timeout, &pg) == 0);
    if (rank == 1) {
        sleep_s(a->sleep_s < 0 ? -a->sleep_s : a->sleep_s);
        ddp_destroy_process_group(pg);
        return 0;
    }
    size_t cnt = (size_t)1 << 20; /* 4 MiB */
    float *x = calloc(cnt, sizeof *x);
    CHILD_CHECK(x != NULL);
    double t0 = ddp_time_now();
    int rc = ddp_pg_all_reduce(pg, x, cnt, DDP_FLOAT32, DDP_SUM);
    double took = ddp_time_now() - t0;
    free(x);
    if (!(rc < 0 && contains(ddp_last_error(), a->want) && took >= a->min_s && took <= a->max_s))
        fprintf(stderr, "rank 0: rc %d after %.3f s: %s\n", rc, took, ddp_last_error());
    CHILD_CHECK(rc < 0 && contains(ddp_last_error(), a->want));
    CHILD_CHECK(!a->want_too || contains(ddp_last_error(), a->want_too));
    CHILD_CHECK(took >= a->min_s && took <= a->max_s);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_shared_window_peer_leaves(void **state)
{
    (void)state;
    job_init(&J);
    shared_wait_arg a = {.timeout = 30.0, .sleep_s = 0.2, .want = "left the group",
                         .min_s = 0.1, .max_s = 2.0};
    assert_int_equal(run_children(2, shared_wait_rank, &a, 60.0), 0);
    job_cleanup(&J);
}

static void test_shared_window_wait_honours_deadline(void **state)
{
    (void)state;
    job_init(&J);
    shared_wait_arg a = {.timeout = 0.3, .sleep_s = -0.8,
                         .want = "timed out after 0.3 s waiting for rank 1 (pid ",
                         .want_too = ") in a shared-memory collective",
                         .min_s = 0.25, .max_s = 1.5};
    assert_int_equal(run_children(2, shared_wait_rank, &a, 60.0), 0);
    job_cleanup(&J);
}

static int timeout_rank(int rank, void *arg)
{
    (void)arg;
    setenv("DDP_TRANSPORT", "shm", 1);
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 2, 0.3, &pg) == 0);
    if (rank == 0) {
        float x = 1;
        double t0 = ddp_time_now();
        int rc = ddp_pg_recv(pg, &x, 1, DDP_FLOAT32, 1, 3);
        double took = ddp_time_now() - t0;
        CHILD_CHECK(rc == DDP_ERR_TIMEOUT);
        CHILD_CHECK(contains(ddp_last_error(), "timed out after 0.3 s waiting for rank 1 (pid "));
        CHILD_CHECK(took > 0.25 && took < 1.5);
    } else {
        sleep_s(0.6);
    }
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_wait_honours_deadline(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(2, timeout_rank, NULL, 30.0), 0);
    job_cleanup(&J);
}

/* ---- data paths ------------------------------------------------------- */

typedef struct path_arg {
    const char *cma;    /* DDP_SHM_CMA */
    const char *ring;   /* DDP_SHM_RING_BYTES */
    const char *window; /* DDP_SHM_WINDOW_BYTES */
    const char *algo;   /* DDP_ALLREDUCE_ALGO */
    int n;
} path_arg;

/* All-reduce (int32 sum: any order gives the same bits), all-gather and
 * large send/recv in both directions at once through the configured path. */
static int path_rank(int rank, void *arg)
{
    path_arg *a = arg;
    setenv("DDP_TRANSPORT", "shm", 1);
    if (a->cma)
        setenv("DDP_SHM_CMA", a->cma, 1);
    if (a->ring)
        setenv("DDP_SHM_RING_BYTES", a->ring, 1);
    if (a->window)
        setenv("DDP_SHM_WINDOW_BYTES", a->window, 1);
    if (a->algo)
        setenv("DDP_ALLREDUCE_ALGO", a->algo, 1);
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, a->n, 30.0, &pg) == 0);
    const size_t sizes[] = {1, 100, 4097, 70000, (1u << 20) + 3};
    int n = a->n, bad = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0] && !bad; si++) {
        size_t cnt = sizes[si];
        int32_t *x = malloc(cnt * 4 * (size_t)n), *y = malloc(cnt * 4 * (size_t)n);
        CHILD_CHECK(x && y);
        for (size_t i = 0; i < cnt; i++)
            x[i] = (int32_t)(i * 2654435761u) ^ rank;
        CHILD_CHECK(ddp_pg_all_reduce(pg, x, cnt, DDP_INT32, DDP_SUM) == 0);
        for (size_t i = 0; i < cnt && !bad; i++) {
            uint32_t want = 0;
            for (int r = 0; r < n; r++)
                want += (uint32_t)((int32_t)(i * 2654435761u) ^ r);
            bad = (uint32_t)x[i] != want;
        }
        for (size_t i = 0; i < cnt; i++)
            x[i] = (int32_t)(i + (size_t)rank * 7);
        CHILD_CHECK(ddp_pg_all_gather(pg, x, y, cnt, DDP_INT32) == 0);
        for (int r = 0; r < n && !bad; r++)
            for (size_t i = 0; i < cnt && !bad; i++)
                bad = y[(size_t)r * cnt + i] != (int32_t)(i + (size_t)r * 7);
        /* Everyone sends to its right neighbour first, then receives. */
        ddp_work_t *w = NULL;
        CHILD_CHECK(ddp_pg_send_async(pg, x, cnt, DDP_INT32, (rank + 1) % n, 1, &w) == 0);
        CHILD_CHECK(ddp_pg_recv(pg, y, cnt, DDP_INT32, (rank + n - 1) % n, 1) == 0);
        CHILD_CHECK(ddp_work_wait(w, -1) == 0);
        ddp_work_destroy(w);
        for (size_t i = 0; i < cnt && !bad; i++)
            bad = y[i] != (int32_t)(i + (size_t)((rank + n - 1) % n) * 7);
        if (bad)
            fprintf(stderr, "rank %d: wrong result at count %zu\n", rank, cnt);
        free(x);
        free(y);
    }
    ddp_destroy_process_group(pg);
    return bad;
}

static void run_path(path_arg *a)
{
    job_init(&J);
    assert_int_equal(run_children(a->n, path_rank, a, 60.0), 0);
    job_cleanup(&J);
}

static void test_cross_memory_attach(void **state)
{
    (void)state;
    path_arg a = {.n = 3, .cma = "1"};
    run_path(&a);
}

static void test_ring_only(void **state)
{
    (void)state;
    path_arg a = {.n = 3, .cma = "0"};
    run_path(&a);
}

static void test_tiny_ring_wraps(void **state)
{
    (void)state;
    path_arg a = {.n = 2, .cma = "0", .ring = "4096"};
    run_path(&a);
}

/* The all-reduces through the shared window of one page per rank (2 slots
 * of 4032 bytes on 3 ranks: every slot reused hundreds of times), then
 * with no window at all (auto takes the ring). */
static void test_tiny_window_wraps(void **state)
{
    (void)state;
    path_arg a = {.n = 3, .window = "4096", .algo = "shared"};
    run_path(&a);
    path_arg b = {.n = 2, .window = "0"};
    run_path(&b);
}

int main(void)
{
    unsetenv("DDP_TRANSPORT");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auto_picks_shm_on_one_host),
        cmocka_unit_test(test_env_tcp_forces_tcp),
        cmocka_unit_test(test_other_host_forces_tcp),
        cmocka_unit_test(test_shm_forced_across_hosts_fails),
        cmocka_unit_test(test_ranks_disagree_on_transport),
        cmocka_unit_test(test_bad_environment),
        cmocka_unit_test(test_kill9_during_large_all_reduce),
        cmocka_unit_test(test_peer_leaves),
        cmocka_unit_test(test_wait_honours_deadline),
        cmocka_unit_test(test_cross_memory_attach),
        cmocka_unit_test(test_ring_only),
        cmocka_unit_test(test_tiny_ring_wraps),
        cmocka_unit_test(test_tiny_window_wraps),
        cmocka_unit_test(test_shared_algo_needs_window),
        cmocka_unit_test(test_shared_chunk_too_small),
        cmocka_unit_test(test_window_size_mismatch),
        cmocka_unit_test(test_shared_calls_differ),
        cmocka_unit_test(test_shared_window_peer_leaves),
        cmocka_unit_test(test_shared_window_wait_honours_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
