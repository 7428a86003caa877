/* Seeing what a job does: the flight recorder and its dumps (on failure,
 * at exit, on SIGUSR1), tools/ddp-trace's diagnosis of forced desyncs and
 * of a stopped rank, DDP_DEBUG=detail's fingerprint check, the monitored
 * barrier and the communication statistics.  Ranks are forked processes
 * on one host (shared memory); each sets its own environment. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/json.h"
#include "ddp.h"
#include "fork_children.h"
#include "pg/internal.h"
#include "pg_util.h"

static job J;
static char trace_dir[128];

static void job_start(void)
{
    job_init(&J);
    snprintf(trace_dir, sizeof trace_dir, "%s/trace", J.dir);
}

static void job_end(void)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", J.dir);
    assert_int_equal(system(cmd), 0);
}

/* Runs ddp-trace on trace_dir; its output (caller frees). */
static char *run_ddp_trace(void)
{
    const char *build = getenv("DDP_TEST_BUILD");
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s/bin/ddp-trace %s 2>&1", build ? build : "build", trace_dir);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t cap = 1 << 16, n = 0;
    char *out = calloc(cap, 1);
    size_t r;
    while ((r = fread(out + n, 1, cap - 1 - n, p)) > 0)
        n += r;
    int status = pclose(p);
    if (status != 0)
        fprintf(stderr, "%s", out);
    assert_int_equal(status, 0);
    return out;
}

/* This rank's dump, parsed (NULL when absent or unreadable). */
static ddp__json *read_dump(int rank)
{
    char path[256];
    snprintf(path, sizeof path, "%s/trace-rank%d.json", trace_dir, rank);
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    ddp__json *j = NULL;
    return ddp__json_parse(buf, n, &j) == 0 ? j : NULL;
}

/* The entries of the first group of a dump. */
static const ddp__json *entries(const ddp__json *dump)
{
    const ddp__json *g = ddp__json_get(dump, "groups");
    return g && g->child ? ddp__json_get(g->child, "entries") : NULL;
}

static int init(int rank, int n, double timeout, ddp_pg_t **pg)
{
    setenv("DDP_TRACE_DIR", trace_dir, 1);
    return ddp_init_process_group("tcp", J.url, rank, n, timeout, pg);
}

/* ---- the ring ---------------------------------------------------------- */

static int ring_rank(int rank, void *arg)
{
    (void)arg;
    setenv("DDP_TRACE_BUFFER", "4", 1);
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(init(rank, 2, 10, &pg) == 0);
    int64_t v = 1;
    for (int i = 0; i < 10; i++) {
        CHILD_CHECK(ddp_pg_set_label(pg, i == 9 ? "last one" : NULL) == 0);
        CHILD_CHECK(ddp_pg_all_reduce(pg, &v, 1, DDP_INT64, DDP_SUM) == 0);
    }
    CHILD_CHECK(ddp_pg_dump_trace(pg, NULL) == 0);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_ring_keeps_the_last_n(void **state)
{
    (void)state;
    job_start();
    assert_int_equal(run_children(2, ring_rank, NULL, 60), 0);
    for (int r = 0; r < 2; r++) {
        ddp__json *d = read_dump(r);
        assert_non_null(d);
        assert_string_equal(ddp__json_get(d, "reason")->str, "destroyed");
        const ddp__json *es = entries(d);
        assert_int_equal(es->len, 4);
        double seq = 6;
        for (const ddp__json *e = es->child; e; e = e->next, seq++) {
            assert_true(ddp__json_get(e, "seq")->num == seq);
            assert_string_equal(ddp__json_get(e, "op")->str, "all_reduce");
            assert_string_equal(ddp__json_get(e, "state")->str, "done");
            assert_string_equal(ddp__json_get(e, "reduce_op")->str, "sum");
            assert_true(ddp__json_get(e, "count")->num == 1);
            const ddp__json *l = ddp__json_get(e, "label");
            if (seq == 9)
                assert_string_equal(l->str, "last one");
            else
                assert_null(l);
            assert_true(ddp__json_get(e, "done_us")->num >= ddp__json_get(e, "started_us")->num);
        }
        ddp__json_free(d);
    }
    job_end();
}

static int recorder_off_rank(int rank, void *arg)
{
    (void)arg;
    setenv("DDP_TRACE_BUFFER", "0", 1);
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(init(rank, 1, 10, &pg) == 0);
    CHILD_CHECK(ddp_pg_dump_trace(pg, NULL) == DDP_ERR_STATE);
    CHILD_CHECK(contains(ddp_last_error(), "DDP_TRACE_BUFFER=0"));
    ddp_destroy_process_group(pg);
    setenv("DDP_TRACE_BUFFER", "many", 1);
    CHILD_CHECK(init(rank, 1, 10, &pg) == DDP_ERR_INVALID_ARG);
    CHILD_CHECK(contains(ddp_last_error(), "DDP_TRACE_BUFFER=many"));
    return 0;
}

static void test_recorder_off_and_bad_value(void **state)
{
    (void)state;
    job_start();
    assert_int_equal(run_children(1, recorder_off_rank, NULL, 30), 0);
    struct stat st;
    assert_true(stat(trace_dir, &st) < 0); /* nothing written */
    job_end();
}

/* ---- forced desyncs ----------------------------------------------------- */

typedef struct desync {
    int detail;   /* DDP_DEBUG=detail */
    int skip;     /* rank 1 skips the 4th collective (else: another count) */
    int *named;   /* shared: ranks whose error named both calls */
} desync;

static int desync_rank(int rank, void *arg)
{
    desync *d = arg;
    if (d->detail)
        setenv("DDP_DEBUG", "detail", 1);
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(init(rank, 2, 5, &pg) == 0);
    float x[8] = {0};
    for (int i = 0; i < 3; i++)
        CHILD_CHECK(ddp_pg_all_reduce(pg, x, 4, DDP_FLOAT32, DDP_SUM) == 0);
    if (d->skip && rank == 1) {
        ddp_destroy_process_group(pg); /* rank 0 waits for #3 in vain */
        return 0;
    }
    CHILD_CHECK(ddp_pg_set_label(pg, "the odd one") == 0);
    int rc = ddp_pg_all_reduce(pg, x, rank == 1 ? 5 : 4, DDP_FLOAT32, DDP_SUM);
    CHILD_CHECK(rc < 0);
    CHILD_CHECK(contains(ddp_last_error(), "(flight recorder: "));
    CHILD_CHECK(contains(ddp_last_error(), "ddp-trace "));
    if (d->detail) {
        CHILD_CHECK(contains(ddp_last_error(), "DDP_DEBUG=detail: collective #3 differs between "
                                               "ranks: rank 1 called all_reduce (5 x float32, "
                                               "sum) where rank 0 called all_reduce (4 x "
                                               "float32, sum)"));
        CHILD_CHECK(rc == DDP_ERR_MISMATCH);
        __atomic_fetch_add(d->named, 1, __ATOMIC_SEQ_CST);
    }
    ddp_destroy_process_group(pg);
    return 0;
}

static void run_desync(int detail, int skip)
{
    desync d = {detail, skip, shared_page(4096)};
    job_start();
    assert_int_equal(run_children(2, desync_rank, &d, 60), 0);
    if (detail)
        assert_int_equal(*d.named, 2); /* every rank, the same message */
    char *out = run_ddp_trace();
    fprintf(stderr, "%s", out);
    assert_true(contains(out, "the ranks first disagree at collective #3."));
    if (skip)
        assert_true(contains(out, "Rank 1 never reached it (rank 1 issued 3 collectives) while "
                                  "the others called all_reduce (4 x float32, sum)"));
    else
        assert_true(contains(out, "Rank 1 called all_reduce (5 x float32, sum) where the others "
                                  "called all_reduce (4 x float32, sum)"));
    assert_true(contains(out, "[the odd one]"));
    free(out);
    munmap(d.named, 4096);
    job_end();
}

static void test_desync_count(void **state)
{
    (void)state;
    run_desync(0, 0);
}

static void test_desync_skip(void **state)
{
    (void)state;
    run_desync(0, 1);
}

static void test_desync_count_detail(void **state)
{
    (void)state;
    run_desync(1, 0);
}

/* DDP_DEBUG=detail under the hierarchical backend (hosts A A B B, faked
 * with DDP_HOST_ID): the fingerprint exchange's tags stay apart from its
 * collective's on the sub-transports (hier.c shifts the sequence number),
 * results are right, and a mismatch still fails every rank. */
static int hier_detail_rank(int rank, void *arg)
{
    (void)arg;
    setenv("DDP_HOST_ID", rank < 2 ? "hostA" : "hostB", 1);
    setenv("DDP_DEBUG", "detail", 1);
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 4, 20, &pg) == 0);
    CHILD_CHECK(ddp__pg_hier(pg) != NULL);
    static float x[1 << 18];
    for (int i = 0; i < 12; i++) {
        size_t n = i % 2 ? (size_t)1 << 18 : (size_t)(i + 1);
        for (size_t k = 0; k < n; k++)
            x[k] = (float)(rank + 1);
        CHILD_CHECK(ddp_pg_all_reduce(pg, x, n, DDP_FLOAT32, DDP_SUM) == 0);
        CHILD_CHECK(x[0] == 10.0f && x[n - 1] == 10.0f);
        int64_t b = rank == i % 4 ? 42 + i : -1;
        CHILD_CHECK(ddp_pg_broadcast(pg, &b, 1, DDP_INT64, i % 4) == 0 && b == 42 + i);
    }
    /* Every rank fails naming the odd call: with DDP_ERR_MISMATCH, or (a
     * rank still finishing the exchange) with a peer's giving up that
     * carries the same message. */
    int rc = ddp_pg_all_reduce(pg, x, rank == 3 ? 5 : 4, DDP_FLOAT32, DDP_SUM);
    CHILD_CHECK(rc < 0);
    CHILD_CHECK(contains(ddp_last_error(), "collective #24 differs between ranks: rank 3"));
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_detail_hierarchical(void **state)
{
    (void)state;
    job_start();
    assert_int_equal(run_children(4, hier_detail_rank, NULL, 60), 0);
    job_end();
}

/* arg non-NULL: the recorder at its default (off). */
static int hint_rank(int rank, void *arg)
{
    if (arg)
        unsetenv("DDP_TRACE_BUFFER");
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 2, 5, &pg) == 0);
    float x[8] = {0};
    CHILD_CHECK(ddp_pg_all_reduce(pg, x, rank == 1 ? 5 : 4, DDP_FLOAT32, DDP_SUM) < 0);
    CHILD_CHECK(contains(ddp_last_error(), arg ? " (DDP_TRACE_BUFFER=2000 DDP_TRACE_DIR=DIR: every "
                                                 "rank's flight recorder, explained by ddp-trace "
                                                 "DIR)"
                                               : " (DDP_TRACE_DIR=DIR: every rank's flight "
                                                 "recorder, explained by ddp-trace DIR)"));
    ddp_destroy_process_group(pg);
    return 0;
}

/* Without DDP_TRACE_DIR a failure writes nothing and says how to get dumps. */
static void test_failure_without_dir_says_how(void **state)
{
    (void)state;
    job_start();
    assert_int_equal(run_children(2, hint_rank, NULL, 60), 0);
    struct stat st;
    assert_true(stat(trace_dir, &st) < 0);
    job_end();
}

/* Off (the default), a failure says how to turn the recorder on. */
static void test_failure_with_recorder_off_says_how(void **state)
{
    (void)state;
    job_start();
    assert_int_equal(run_children(2, hint_rank, (void *)1, 60), 0);
    struct stat st;
    assert_true(stat(trace_dir, &st) < 0);
    job_end();
}

/* A program that exits without destroying its group (an error path, say)
 * still leaves its dump with DDP_TRACE_DIR: the atexit hook writes it. */
static int exit_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(init(rank, 2, 10, &pg) == 0);
    int64_t v = 1;
    CHILD_CHECK(ddp_pg_all_reduce(pg, &v, 1, DDP_INT64, DDP_SUM) == 0);
    CHILD_CHECK(ddp_pg_barrier(pg) == 0);
    exit(0); /* no destroy */
}

static void test_exit_without_destroy_dumps(void **state)
{
    (void)state;
    job_start();
    assert_int_equal(run_children(2, exit_rank, NULL, 60), 0);
    for (int r = 0; r < 2; r++) {
        ddp__json *d = read_dump(r);
        assert_non_null(d);
        assert_string_equal(ddp__json_get(d, "reason")->str, "exit without destroying the group");
        const ddp__json *es = entries(d);
        assert_int_equal(es->len, 2);
        assert_string_equal(ddp__json_get(es->child, "op")->str, "all_reduce");
        ddp__json_free(d);
    }
    job_end();
}

/* ---- a stopped rank ------------------------------------------------------ */

static int stopped_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(init(rank, 3, 2.0, &pg) == 0);
    int64_t v = 1;
    for (int i = 0; i < 5; i++)
        CHILD_CHECK(ddp_pg_all_reduce(pg, &v, 1, DDP_INT64, DDP_SUM) == 0);
    if (rank == 1)
        raise(SIGSTOP); /* the parent kills it once the others are done */
    CHILD_CHECK(ddp_pg_all_reduce(pg, &v, 1, DDP_INT64, DDP_SUM) < 0);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_stopped_rank_named(void **state)
{
    (void)state;
    job_start();
    rank_group g;
    start_ranks(&g, 0, 3, stopped_rank, NULL);
    for (int r = 0; r < 3; r += 2) {
        int status = 0;
        assert_int_equal(waitpid(g.pids[r], &status, 0), g.pids[r]);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    kill(g.pids[1], SIGKILL);
    waitpid(g.pids[1], NULL, 0);
    for (int r = 0; r < 3; r += 2) { /* the timeout's dumps: #5 started, never done */
        ddp__json *d = read_dump(r);
        assert_non_null(d);
        const ddp__json *e = entries(d)->child;
        while (e->next)
            e = e->next;
        assert_true(ddp__json_get(e, "seq")->num == 5);
        assert_string_equal(ddp__json_get(e, "state")->str, "failed");
        ddp__json_free(d);
    }
    assert_null(read_dump(1));
    char *out = run_ddp_trace();
    fprintf(stderr, "%s", out);
    assert_true(contains(out, "Group ddp/world (3 ranks, 2 dumps): the ranks first disagree at "
                              "collective #5."));
    assert_true(contains(out, "Rank 1 wrote no dump and never said it reached #5, which every "
                              "other rank started and none finished"));
    free(out);
    job_end();
}

/* ---- SIGUSR1 ------------------------------------------------------------- */

static void own_handler(int sig) { (void)sig; }

static int sigusr1_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(init(rank, 2, 10, &pg) == 0);
    int64_t v = 1;
    CHILD_CHECK(ddp_pg_set_label(pg, "before the signal") == 0);
    CHILD_CHECK(ddp_pg_all_reduce(pg, &v, 1, DDP_INT64, DDP_SUM) == 0);
    raise(SIGUSR1); /* a dump, written by the watcher thread */
    char path[256];
    snprintf(path, sizeof path, "%s/trace-rank%d.json", trace_dir, rank);
    double t0 = ddp_time_now();
    while (access(path, R_OK) != 0 && ddp_time_now() - t0 < 10)
        sleep_s(0.01);
    ddp__json *d = read_dump(rank);
    CHILD_CHECK(d != NULL);
    CHILD_CHECK(strcmp(ddp__json_get(d, "reason")->str, "SIGUSR1") == 0);
    CHILD_CHECK(entries(d)->len == 1);
    CHILD_CHECK(strcmp(ddp__json_get(entries(d)->child, "label")->str, "before the signal") == 0);
    ddp__json_free(d);
    CHILD_CHECK(ddp_pg_barrier(pg) == 0);
    ddp_destroy_process_group(pg);
    /* A program's own handler is left alone. */
    signal(SIGUSR1, own_handler);
    char url[200];
    snprintf(url, sizeof url, "file://%s/solo%d", J.dir, rank);
    CHILD_CHECK(ddp_init_process_group("tcp", url, 0, 1, 10, &pg) == 0);
    struct sigaction sa;
    sigaction(SIGUSR1, NULL, &sa);
    CHILD_CHECK(sa.sa_handler == own_handler);
    ddp_destroy_process_group(pg);
    sigaction(SIGUSR1, NULL, &sa);
    CHILD_CHECK(sa.sa_handler == own_handler);
    return 0;
}

static void test_sigusr1_dump(void **state)
{
    (void)state;
    job_start();
    assert_int_equal(run_children(2, sigusr1_rank, NULL, 60), 0);
    job_end();
}

/* 1 once pid catches SIGUSR1 (its handler is installed), 0 after limit_s. */
static int catches_sigusr1(pid_t pid, double limit_s)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%ld/status", (long)pid);
    for (double t0 = ddp_time_now(); ddp_time_now() - t0 < limit_s; sleep_s(0.01)) {
        FILE *f = fopen(path, "r");
        unsigned long long caught = 0;
        while (f && fgets(line, sizeof line, f))
            if (sscanf(line, "SigCgt: %llx", &caught) == 1)
                break;
        if (f)
            fclose(f);
        if (caught & (1ull << (SIGUSR1 - 1)))
            return 1;
    }
    return 0;
}

static int setup_rank(int rank, void *arg)
{
    if (arg)
        setenv("DDP_TRACE_BUFFER", "0", 1);
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(init(rank, 2, 30, &pg) == 0);
    CHILD_CHECK(ddp_pg_barrier(pg) == 0);
    ddp_destroy_process_group(pg);
    return 0;
}

/* SIGUSR1 to a rank stuck in ddp_init_process_group (rank 1 never came, the
 * usual hang to look at) neither kills it nor, with the recorder off, does
 * anything; with it on, the dump shows the world group setting up.  Then
 * rank 1 comes and both finish. */
static void run_sigusr1_in_setup(int recorder_off)
{
    job_start();
    void *arg = recorder_off ? (void *)1 : NULL;
    fflush(NULL);
    pid_t r0 = fork();
    if (r0 == 0)
        _exit(setup_rank(0, arg) == 0 ? 0 : 1);
    assert_true(r0 > 0);
    int caught = catches_sigusr1(r0, 20);
    char path[256];
    snprintf(path, sizeof path, "%s/trace-rank0.json", trace_dir);
    /* Signalled until the dump is there: the handler comes a moment before
     * the group, so the first signal may find nothing to dump yet. */
    for (double t0 = ddp_time_now(); ddp_time_now() - t0 < (recorder_off ? 0.5 : 10);
         sleep_s(0.1)) {
        kill(r0, SIGUSR1);
        if (!recorder_off && access(path, R_OK) == 0)
            break;
    }
    int status = 0;
    assert_int_equal(waitpid(r0, &status, WNOHANG), 0); /* alive */
    assert_true(caught);
    if (recorder_off) {
        assert_int_not_equal(access(path, F_OK), 0);
    } else {
        ddp__json *d = read_dump(0);
        assert_non_null(d);
        assert_string_equal(ddp__json_get(d, "reason")->str, "SIGUSR1");
        const ddp__json *g = ddp__json_get(d, "groups")->child;
        assert_string_equal(ddp__json_get(g, "name")->str, "ddp/world");
        assert_int_equal(ddp__json_get(g, "setting_up")->type, DDP_JSON_TRUE);
        ddp__json_free(d);
    }
    pid_t r1 = fork();
    if (r1 == 0)
        _exit(setup_rank(1, arg) == 0 ? 0 : 1);
    assert_true(r1 > 0);
    assert_int_equal(waitpid(r1, &status, 0), r1);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    assert_int_equal(waitpid(r0, &status, 0), r0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    job_end();
}

static void test_sigusr1_during_setup(void **state)
{
    (void)state;
    run_sigusr1_in_setup(0);
    run_sigusr1_in_setup(1);
}

/* A child forked without exec from a process with a group: a SIGUSR1 it
 * gets before it has a group of its own does nothing (it must not make its
 * parent dump), and it lives on to make a group of its own. */
static int fork_child_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg = NULL;
    char url[200], path[400];
    snprintf(url, sizeof url, "file://%s/solo", J.dir);
    setenv("DDP_TRACE_DIR", trace_dir, 1);
    CHILD_CHECK(ddp_init_process_group("tcp", url, rank, 1, 10, &pg) == 0);
    fflush(NULL);
    pid_t c = fork();
    if (c == 0) {
        raise(SIGUSR1);
        sleep_s(0.5); /* time for a (wrong) dump by the parent's watcher */
        /* No libddp here: after fork in a process with threads (the
         * parent's communication thread and watcher) only async-signal-safe
         * calls are defined until exec, and under the sanitizers a group
         * made here hung at times (their allocator's locks). */
        _exit(0);
    }
    CHILD_CHECK(c > 0);
    int status = 0;
    CHILD_CHECK(waitpid(c, &status, 0) == c);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fprintf(stderr, "forked child: status %#x\n", status);
    CHILD_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    snprintf(path, sizeof path, "%s/trace-rank0.json", trace_dir);
    CHILD_CHECK(access(path, F_OK) != 0); /* the parent wrote nothing */
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_forked_child_sigusr1(void **state)
{
    (void)state;
    job_start();
    assert_int_equal(run_children(1, fork_child_rank, NULL, 60), 0);
    job_end();
}

/* ---- the dump file ------------------------------------------------------- */

/* DDP_TRACE_DIR may be shared: a link planted at the temporary name is not
 * followed (the dump fails, the link's target is untouched); a write that
 * fails (the file size limit stands in for a full disk) fails the dump and
 * leaves no file behind, rather than a truncated one in place. */
static int dump_file_rank(int rank, void *arg)
{
    (void)arg;
    char url[200], tmp[400], target[300], path[300];
    snprintf(url, sizeof url, "file://%s/solo", J.dir);
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", url, rank, 1, 10, &pg) == 0);
    CHILD_CHECK(mkdir(trace_dir, 0777) == 0);
    snprintf(path, sizeof path, "%s/trace-rank0.json", trace_dir);
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    snprintf(target, sizeof target, "%s/victim", J.dir);
    FILE *f = fopen(target, "w");
    CHILD_CHECK(f && fputs("precious", f) >= 0 && fclose(f) == 0);
    CHILD_CHECK(symlink(target, tmp) == 0);
    CHILD_CHECK(ddp_pg_dump_trace(pg, trace_dir) == DDP_ERR_IO);
    CHILD_CHECK(contains(ddp_last_error(), "cannot create"));
    char buf[64] = "";
    f = fopen(target, "r");
    CHILD_CHECK(f && fgets(buf, sizeof buf, f) && fclose(f) == 0);
    CHILD_CHECK(strcmp(buf, "precious") == 0);
    CHILD_CHECK(access(path, F_OK) != 0);
    CHILD_CHECK(unlink(tmp) == 0);
    /* A short write: entries enough to pass stdio's buffer, 100 bytes allowed. */
    int64_t v = 1;
    for (int i = 0; i < 100; i++)
        CHILD_CHECK(ddp_pg_all_reduce(pg, &v, 1, DDP_INT64, DDP_SUM) == 0);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {100, 100};
    CHILD_CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    CHILD_CHECK(ddp_pg_dump_trace(pg, trace_dir) == DDP_ERR_IO);
    CHILD_CHECK(contains(ddp_last_error(), "cannot write"));
    CHILD_CHECK(access(path, F_OK) != 0 && access(tmp, F_OK) != 0);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_dump_file_is_safe(void **state)
{
    (void)state;
    job_start();
    assert_int_equal(run_children(1, dump_file_rank, NULL, 60), 0);
    job_end();
}

/* ---- monitored barrier --------------------------------------------------- */

static int barrier_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(init(rank, 4, 20, &pg) == 0);
    CHILD_CHECK(ddp_pg_monitored_barrier(pg, 5.0, 1) == 0);
    /* Ranks 0 and 1 meet first (a barrier of their own), and the timeout
     * leaves room for a loaded machine: only 2 and 3 are really absent. */
    ddp_pg_t *pair = NULL;
    CHILD_CHECK(ddp_pg_new_group(pg, (const int[]){0, 1}, 2, &pair) == 0);
    if (rank < 2) {
        CHILD_CHECK(ddp_pg_barrier(pair) == 0);
        int rc = ddp_pg_monitored_barrier(pg, 1.0, 1);
        CHILD_CHECK(rc == DDP_ERR_TIMEOUT);
        CHILD_CHECK(contains(ddp_last_error(), "monitored_barrier: ranks 2, 3 did not reach the "
                                               "barrier within 1.0 s"));
        CHILD_CHECK(ddp_pg_barrier(pair) == 0);
        rc = ddp_pg_monitored_barrier(pg, 1.0, 0);
        CHILD_CHECK(rc == DDP_ERR_TIMEOUT);
        CHILD_CHECK(contains(ddp_last_error(), "monitored_barrier: rank 2 did not reach the "
                                               "barrier within 1.0 s (the first missing"));
        ddp_destroy_process_group(pair);
    }
    int64_t v = 1; /* the group still works */
    CHILD_CHECK(ddp_pg_all_reduce(pg, &v, 1, DDP_INT64, DDP_SUM) == 0 && v == 4);
    ddp_destroy_process_group(pg);
    return 0;
}

/* How many of barriers first..last's keys (in/1, in/2, out, ack) are in
 * the store. */
static int barrier_keys_left(ddp_store_t *store, int first, int last)
{
    int left = 0;
    for (int id = first; id <= last; id++)
        for (int k = 0; k < 4; k++) {
            char key[128];
            const char *names[4] = {"in/1", "in/2", "out", "ack"};
            snprintf(key, sizeof key, "ddp/world/mb%d/%s", id, names[k]);
            const char *keys[1] = {key};
            int there = 0;
            if (ddp_store_check(store, keys, 1, &there) < 0 || there)
                left++;
        }
    return left;
}

/* The store does not grow with failed barriers: rank 2 late for each of
 * six (it enters once the others failed: nothing may stay), then absent
 * from six more (the last two barriers' keys may stay, no older ones). */
static int sweep_rank(int rank, void *arg)
{
    (void)arg;
    ddp_store_t *store = NULL;
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_store_from_url(J.url, rank, 3, 20, &store, NULL, NULL) == 0);
    CHILD_CHECK(ddp_init_process_group_store("tcp", store, rank, 3, 20, &pg) == 0);
    CHILD_CHECK(ddp_pg_monitored_barrier(pg, 5.0, 1) == 0); /* #1 */
    CHILD_CHECK(ddp_pg_barrier(pg) == 0);
    int64_t late = 0, absent = 0;
    for (int i = 0; i < 6; i++) { /* #2 .. #7 */
        if (rank == 2)
            CHILD_CHECK(ddp_pg_barrier(pg) == 0); /* the others failed by now */
        CHILD_CHECK(ddp_pg_monitored_barrier(pg, 0.2, 1) == DDP_ERR_TIMEOUT);
        if (rank < 2)
            CHILD_CHECK(ddp_pg_barrier(pg) == 0);
    }
    CHILD_CHECK(ddp_pg_barrier(pg) == 0);
    if (rank == 0) {
        CHILD_CHECK(barrier_keys_left(store, 1, 7) == 0);
        CHILD_CHECK(ddp_store_num_keys(store, &late) == 0);
    }
    for (int i = 0; i < 6 && rank < 2; i++) /* #8 .. #13 */
        CHILD_CHECK(ddp_pg_monitored_barrier(pg, 0.2, 1) == DDP_ERR_TIMEOUT);
    CHILD_CHECK(ddp_pg_barrier(pg) == 0);
    if (rank == 0) {
        CHILD_CHECK(barrier_keys_left(store, 8, 11) == 0);
        CHILD_CHECK(barrier_keys_left(store, 12, 13) == 4); /* out and ack of each */
        CHILD_CHECK(ddp_store_num_keys(store, &absent) == 0);
        CHILD_CHECK(absent <= late + 4);
    }
    ddp_destroy_process_group(pg);
    ddp_store_destroy(store);
    return 0;
}

static void test_monitored_barrier_store_bounded(void **state)
{
    (void)state;
    job_start();
    assert_int_equal(run_children(3, sweep_rank, NULL, 60), 0);
    job_end();
}

static int no_root_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(init(rank, 2, 20, &pg) == 0);
    if (rank == 1) {
        CHILD_CHECK(ddp_pg_monitored_barrier(pg, 0.2, 0) == DDP_ERR_TIMEOUT);
        CHILD_CHECK(contains(ddp_last_error(), "monitored_barrier on rank 1: rank 0 did not "
                                               "answer within 2.2 s"));
    }
    CHILD_CHECK(ddp_pg_barrier(pg) == 0);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_monitored_barrier_without_rank0(void **state)
{
    (void)state;
    job_start();
    assert_int_equal(run_children(2, no_root_rank, NULL, 60), 0);
    job_end();
}

static void test_monitored_barrier_names_missing(void **state)
{
    (void)state;
    job_start();
    assert_int_equal(run_children(4, barrier_rank, NULL, 60), 0);
    job_end();
}

/* ---- communication statistics -------------------------------------------- */

static char logged[8192];

static void capture(int level, const char *msg, void *user)
{
    (void)level;
    (void)user;
    size_t at = strlen(logged);
    snprintf(logged + at, sizeof logged - at, "%s\n", msg);
}

static int stats_rank(int rank, void *arg)
{
    (void)arg;
    setenv("DDP_COMM_STATS", "1", 1);
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(init(rank, 2, 10, &pg) == 0);
    float x[1024] = {0};
    for (int i = 0; i < 3; i++)
        CHILD_CHECK(ddp_pg_all_reduce(pg, x, 1024, DDP_FLOAT32, DDP_SUM) == 0);
    CHILD_CHECK(ddp_pg_broadcast(pg, x, 10, DDP_FLOAT32, 0) == 0);
    ddp_log_set_callback(capture, NULL);
    CHILD_CHECK(ddp_pg_log_comm_stats(pg) == 0);
    /* 3 x 4 KiB all-reduces: 12288 bytes in the 4 KiB bucket; 40 B broadcast in 32 B's */
    CHILD_CHECK(contains(logged, "group ddp/world, rank"));
    char *ar = strstr(logged, "all_reduce");
    CHILD_CHECK(ar != NULL);
    unsigned long long calls = 0, bytes = 0;
    CHILD_CHECK(sscanf(ar, "all_reduce 4 KiB %llu %llu", &calls, &bytes) == 2);
    CHILD_CHECK(calls == 3 && bytes == 12288);
    char *bc = strstr(logged, "broadcast");
    CHILD_CHECK(bc && sscanf(bc, "broadcast 32 B %llu %llu", &calls, &bytes) == 2);
    CHILD_CHECK(calls == 1 && bytes == 40);
    CHILD_CHECK(contains(logged, "comm stats: op ") && contains(logged, "busbw GB/s"));
    ddp_destroy_process_group(pg); /* DDP_COMM_STATS=1: the table once more */
    ddp_log_set_callback(NULL, NULL);
    int tables = 0;
    const char *t = "comm stats: group";
    for (const char *p = strstr(logged, t); p; p = strstr(p + 1, t))
        tables++;
    CHILD_CHECK(tables == 2);
    return 0;
}

static void test_comm_stats(void **state)
{
    (void)state;
    job_start();
    assert_int_equal(run_children(2, stats_rank, NULL, 60), 0);
    job_end();
}

int main(void)
{
    /* The recorder is off by default: on for every test here unless a test
     * sets its own size (children inherit this). */
    setenv("DDP_TRACE_BUFFER", "2000", 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_keeps_the_last_n),
        cmocka_unit_test(test_recorder_off_and_bad_value),
        cmocka_unit_test(test_desync_count),
        cmocka_unit_test(test_desync_skip),
        cmocka_unit_test(test_desync_count_detail),
        cmocka_unit_test(test_detail_hierarchical),
        cmocka_unit_test(test_failure_without_dir_says_how),
        cmocka_unit_test(test_failure_with_recorder_off_says_how),
        cmocka_unit_test(test_exit_without_destroy_dumps),
        cmocka_unit_test(test_stopped_rank_named),
        cmocka_unit_test(test_sigusr1_dump),
        cmocka_unit_test(test_dump_file_is_safe),
        cmocka_unit_test(test_sigusr1_during_setup),
        cmocka_unit_test(test_forked_child_sigusr1),
        cmocka_unit_test(test_monitored_barrier_names_missing),
        cmocka_unit_test(test_monitored_barrier_without_rank0),
        cmocka_unit_test(test_monitored_barrier_store_bounded),
        cmocka_unit_test(test_comm_stats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
