/* The timeline (src/base/timeline.c, docs/timeline.md): ddp-mnist on 2
 * ranks under ddprun with DDP_TIMELINE_DIR writes one Chrome trace per rank
 * that the JSON parser reads, whose spans nest per thread in start order,
 * whose asynchronous spans pair up, with the expected spans once per step
 * and the model's bucket count, and ddprun's merged file holds both ranks;
 * a 2-rank DDP of 4 buckets shows 3 reductions in flight and the deferred
 * last one; user spans from several threads, the per-thread cap and its
 * "dropped" note, names that need escaping, misuse errors, the variable
 * unset (nothing written) or malformed (off, with a warning); the merge's
 * errors.  Timeline processes are forked: the test process itself never
 * turns the timeline on. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/json.h"
#include "base/timeline.h"
#include "data_fixture.h"
#include "ddp.h"
#include "ddp/ext.h"
#include "pg_util.h"

static char build[1024];

/* ---- reading a trace ----------------------------------------------------- */

static ddp__json *load(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    assert_int_equal(fread(text, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    ddp__json *tree = NULL;
    if (ddp__json_parse(text, (size_t)n, &tree) < 0)
        fail_msg("%s: %s", path, ddp_last_error());
    free(text);
    return tree;
}

static const char *str(const ddp__json *o, const char *key)
{
    const ddp__json *v = ddp__json_get(o, key);
    return v && v->type == DDP_JSON_STRING ? v->str : NULL;
}

static double num(const ddp__json *o, const char *key)
{
    const ddp__json *v = ddp__json_get(o, key);
    if (!v || v->type != DDP_JSON_NUMBER)
        fail_msg("event without a number \"%s\"", key);
    return v->num;
}

#define MAX_NAMES 64
#define MAX_TIDS 16
#define MAX_OPEN 4096

/* What a check of one process's events found. */
typedef struct summary {
    int pids[8], npids;
    char label[8][32];             /* process_name per pid, in order seen */
    const char *names[MAX_NAMES];  /* span names (X, b) and their counts */
    int counts[MAX_NAMES], nnames;
    int buckets[64], nbuckets;     /* distinct "bucket" args of reductions */
    int create_buckets;            /* "DDP create"'s "buckets" arg, -1: none */
    int events, tids;
    const char *dropped;           /* the "dropped" note, if any */
} summary;

static int count_of(const summary *s, const char *name)
{
    for (int i = 0; i < s->nnames; i++)
        if (!strcmp(s->names[i], name))
            return s->counts[i];
    return 0;
}

static void add_name(summary *s, const char *name)
{
    for (int i = 0; i < s->nnames; i++)
        if (!strcmp(s->names[i], name)) {
            s->counts[i]++;
            return;
        }
    assert_true(s->nnames < MAX_NAMES);
    s->names[s->nnames] = name;
    s->counts[s->nnames++] = 1;
}

static void add_bucket(summary *s, const ddp__json *e)
{
    const ddp__json *args = ddp__json_get(e, "args");
    int b = (int)num(args, "bucket");
    for (int i = 0; i < s->nbuckets; i++)
        if (s->buckets[i] == b)
            return;
    s->buckets[s->nbuckets++] = b;
}

/* Per thread: ts never decreases, and every complete span lies inside the
 * span open around it (the X form of "every B has its E"); every "b" has
 * one later "e" of its id.  Rounding of %.3f allows 2 ns. */
static summary check_trace(const ddp__json *tree)
{
    summary s = {.create_buckets = -1};
    struct {
        int pid, tid;
        double last, ends[64];
        int depth;
    } th[MAX_TIDS];
    int nth = 0;
    struct {
        char id[32];
        double ts;
    } open[MAX_OPEN];
    int nopen = 0;
    const ddp__json *ev = ddp__json_get(tree, "traceEvents");
    assert_non_null(ev);
    for (const ddp__json *e = ev->child; e; e = e->next) {
        const char *ph = str(e, "ph"), *name = str(e, "name");
        assert_non_null(ph);
        assert_non_null(name);
        int pid = (int)num(e, "pid"), tid = (int)num(e, "tid");
        if (!strcmp(ph, "M")) {
            if (!strcmp(name, "process_name")) {
                assert_true(s.npids < 8);
                s.pids[s.npids] = pid;
                snprintf(s.label[s.npids++], 32, "%s", str(ddp__json_get(e, "args"), "name"));
            }
            continue;
        }
        s.events++;
        int t = 0;
        while (t < nth && (th[t].pid != pid || th[t].tid != tid))
            t++;
        if (t == nth) {
            assert_true(nth < MAX_TIDS);
            th[nth].pid = pid, th[nth].tid = tid, th[nth].last = -1, th[nth].depth = 0;
            nth++;
        }
        double ts = num(e, "ts");
        if (!strcmp(ph, "i")) {
            s.dropped = name;
            continue;
        }
        if (!strcmp(ph, "e")) {
            int k = 0;
            while (k < nopen && strcmp(open[k].id, str(e, "id")))
                k++;
            if (k == nopen)
                fail_msg("\"e\" of %s without its \"b\"", name);
            assert_true(ts >= open[k].ts);
            open[k] = open[--nopen];
            continue;
        }
        add_name(&s, name);
        if (!strcmp(name, "bucket allreduce") || !strcmp(name, "allreduce last bucket (this thread)"))
            add_bucket(&s, e);
        if (!strcmp(name, "DDP create"))
            s.create_buckets = (int)num(ddp__json_get(e, "args"), "buckets");
        if (!strcmp(ph, "b")) {
            assert_true(nopen < MAX_OPEN);
            snprintf(open[nopen].id, sizeof open[nopen].id, "%s", str(e, "id"));
            open[nopen++].ts = ts;
            continue;
        }
        assert_string_equal(ph, "X");
        double dur = num(e, "dur"), end = ts + dur;
        assert_true(dur >= 0);
        if (ts < th[t].last)
            fail_msg("%s at %.3f starts before the previous span of its thread (%.3f)", name, ts,
                     th[t].last);
        th[t].last = ts;
        while (th[t].depth && th[t].ends[th[t].depth - 1] <= ts + 0.002)
            th[t].depth--;
        if (th[t].depth && end > th[t].ends[th[t].depth - 1] + 0.002)
            fail_msg("%s [%.3f, %.3f] overlaps the end of the span around it (%.3f)", name, ts,
                     end, th[t].ends[th[t].depth - 1]);
        assert_true(th[t].depth < 64);
        th[t].ends[th[t].depth++] = end;
    }
    if (nopen)
        fail_msg("%d \"b\" events without their \"e\" (first: %s)", nopen, open[0].id);
    s.tids = nth;
    return s;
}

/* ---- ddp-mnist under ddprun ------------------------------------------------ */

static int run(const char *cmd)
{
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* 400 training images, 2 ranks, batch 8: 25 steps per rank.  The model's
 * 203530 float gradients (784*256 + 256 + 256*10 + 10) are 814120 bytes,
 * under the first bucket's 1 MiB: one bucket, reduced on the caller's
 * thread after backward. */
static void test_mnist_two_ranks(void **state)
{
    const char *dir = *state;
    char cmd[8192], path[4200];
    fx_write_split(dir, "train", 0, 400, 28, 28, 10);
    fx_write_split(dir, "t10k", 0, 20, 28, 28, 10);
    snprintf(cmd, sizeof cmd,
             "DDP_TIMELINE_DIR=%s/tl timeout -k 5 300 %s/bin/ddprun --standalone --nproc-per-node 2 "
             "%s/bin/ddp-mnist --data %s --batch-size 8 --epochs 1 --workers 1 >%s/log 2>&1",
             dir, build, build, dir, dir);
    if (run(cmd) != 0) {
        snprintf(cmd, sizeof cmd, "cat %s/log", dir);
        run(cmd);
        fail_msg("ddp-mnist under ddprun failed");
    }
    int total = 0;
    for (int r = 0; r < 2; r++) {
        snprintf(path, sizeof path, "%s/tl/timeline-rank%d.json", dir, r);
        ddp__json *tree = load(path);
        summary s = check_trace(tree);
        char want[32];
        snprintf(want, sizeof want, "rank %d", r);
        assert_int_equal(s.npids, 1);
        assert_int_equal(s.pids[0], r);
        assert_string_equal(s.label[0], want);
        assert_int_equal(count_of(&s, "DDP create"), 1);
        assert_int_equal(count_of(&s, "DDP backward"), 25);
        assert_int_equal(count_of(&s, "autograd backward"), 25);
        assert_int_equal(count_of(&s, "optimizer step"), 25);
        assert_int_equal(count_of(&s, "allreduce last bucket (this thread)"), 25);
        assert_int_equal(count_of(&s, "wait buckets"), 0); /* nothing was in flight */
        assert_true(count_of(&s, "DDP forward") >= 25); /* and the test split's */
        assert_true(count_of(&s, "loader next") >= 26); /* 25 batches and the end */
        assert_true(count_of(&s, "batch build") >= 25);
        assert_int_equal(count_of(&s, "rebuild buckets"), 1); /* after the first backward */
        assert_int_equal(s.create_buckets, 1);
        assert_int_equal(s.nbuckets, 1);
        assert_int_equal(s.buckets[0], 0);
        assert_null(s.dropped);
        const ddp__json *other = ddp__json_get(tree, "otherData");
        assert_int_equal((int)num(other, "rank"), r);
        assert_true(num(other, "clock_offset_to_rank0_us") == 0); /* one host: one clock */
        total += s.events;
        ddp__json_free(tree);
    }
    snprintf(path, sizeof path, "%s/tl/timeline.json", dir);
    ddp__json *merged = load(path);
    summary m = check_trace(merged);
    assert_int_equal(m.npids, 2);
    assert_int_equal(m.pids[0], 0);
    assert_int_equal(m.pids[1], 1);
    assert_string_equal(m.label[1], "rank 1");
    assert_int_equal(m.events, total);
    assert_int_equal(count_of(&m, "optimizer step"), 50);
    ddp__json_free(merged);
    /* The picture of its last 3 steps names both ranks' main threads. */
    snprintf(cmd, sizeof cmd, "%s/bin/ddp-timeline svg %s %s/tl.svg 3 && grep -c "
             "'>rank [01] main<' %s/tl.svg >%s/n && grep -q '<title>optimizer step ' %s/tl.svg",
             build, path, dir, dir, dir, dir);
    assert_int_equal(run(cmd), 0);
    snprintf(path, sizeof path, "%s/n", dir);
    FILE *f = fopen(path, "r");
    int rows = 0;
    assert_true(f && fscanf(f, "%d", &rows) == 1);
    fclose(f);
    assert_int_equal(rows, 2);
}

/* ---- DDP with several buckets -------------------------------------------- */

typedef struct {
    const char *url, *dir;
} ddp_job;

/* A child rank's environment: its timeline into dir. */
static void rank_env(int rank, const char *dir)
{
    char r[16];
    snprintf(r, sizeof r, "%d", rank);
    setenv("DDP_TIMELINE_DIR", dir, 1);
    setenv("RANK", r, 1);
    setenv("WORLD_SIZE", "2", 1);
}

/* A tiny MLP (16-32-4) with 3 buckets (caps of 100 bytes, in fill order:
 * fc2's bias and weight, fc1's bias, fc1's weight), 3 steps; the timeline
 * file holds the reductions. */
static int ddp_rank(int rank, void *arg)
{
    const ddp_job *j = arg;
    rank_env(rank, j->dir);
    ddp_pg_t *pg = NULL;
    ddp_module_t *l[3], *seq;
    ddp_model_t *model = NULL;
    ddp_data_parallel_t *dm = NULL;
    ddp_tape_t *tape = NULL;
    ddp_optim_t *opt = NULL;
    ddp_sgd_options so = ddp_sgd_defaults(0.1);
    ddp_data_parallel_options o = ddp_data_parallel_defaults();
    o.bucket_cap_mb = o.first_bucket_cap_mb = 100e-6;
    o.rebuild_buckets = 0;
    if (ddp_init_process_group("tcp", j->url, rank, 2, 60, &pg) < 0 ||
        ddp_linear_create(16, 32, 1, 1, &l[0]) < 0 || ddp_relu_create(&l[1]) < 0 ||
        ddp_linear_create(32, 4, 1, 2, &l[2]) < 0 || ddp_sequential_create(l, 3, &seq) < 0 ||
        ddp_model_from_module(seq, &model) < 0 ||
        ddp_data_parallel_create(model, pg, &o, &dm) < 0 || ddp_tape_create(&tape) < 0 ||
        ddp_sgd_create(model, &so, &opt) < 0)
        goto fail;
    if (ddp_data_parallel_num_buckets(dm) != 3) {
        fprintf(stderr, "rank %d: %d buckets, expected 3\n", rank, ddp_data_parallel_num_buckets(dm));
        return 1;
    }
    float xs[8 * 16];
    for (int i = 0; i < 8 * 16; i++)
        xs[i] = (float)((i * 7 + rank) % 11) / 11.0f;
    int64_t labels[8] = {0, 1, 2, 3, 0, 1, 2, 3};
    for (int step = 0; step < 3; step++) {
        ddp_tensor x;
        ddp_var_t *in, *y, *loss;
        ddp_tape_reset(tape);
        if (ddp_tensor_wrap(&x, xs, 2, (int64_t[]){8, 16}) < 0 ||
            ddp_tape_input(tape, &x, 0, &in) < 0 || ddp_data_parallel_forward(dm, tape, in, &y) < 0 ||
            ddp_op_cross_entropy(tape, y, labels, &loss) < 0 ||
            ddp_data_parallel_backward(dm, tape, loss) < 0 || ddp_optim_step(opt) < 0)
            goto fail;
    }
    ddp_optim_destroy(opt);
    ddp_tape_destroy(tape);
    ddp_data_parallel_destroy(dm); /* writes the file */
    ddp_model_destroy(model);
    ddp_destroy_process_group(pg);
    return 0;
fail:
    fprintf(stderr, "rank %d: %s\n", rank, ddp_last_error());
    return 1;
}

/* Runs fn(rank, job) in 2 forked ranks of a tcp job whose timelines go to
 * dir; both must exit 0. */
static void run_two_ranks(int (*fn)(int, void *), const char *dir)
{
    job jb;
    job_init(&jb);
    ddp_job j = {jb.url, dir};
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        fflush(NULL);
        if ((pids[r] = fork()) == 0)
            _exit(fn(r, &j));
    }
    for (int r = 0; r < 2; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    job_cleanup(&jb);
}

static void test_ddp_buckets(void **state)
{
    const char *dir = *state;
    run_two_ranks(ddp_rank, dir);
    char path[4200];
    for (int r = 0; r < 2; r++) {
        snprintf(path, sizeof path, "%s/timeline-rank%d.json", dir, r);
        ddp__json *tree = load(path);
        summary s = check_trace(tree);
        assert_int_equal(s.create_buckets, 3);
        assert_int_equal(s.nbuckets, 3); /* 0-1 in flight, 2 on the caller's thread */
        assert_int_equal(count_of(&s, "bucket allreduce"), 3 * 2);
        assert_int_equal(count_of(&s, "bucket launch"), 3 * 2);
        assert_int_equal(count_of(&s, "wait bucket"), 3 * 2);
        assert_int_equal(count_of(&s, "wait buckets"), 3);
        assert_int_equal(count_of(&s, "allreduce last bucket (this thread)"), 3);
        assert_int_equal(count_of(&s, "DDP forward"), 3);
        ddp__json_free(tree);
    }
    int n = 0;
    assert_int_equal(ddp__timeline_merge_dir(dir, NULL, &n), 0);
    assert_int_equal(n, 2);
}

/* ---- user spans, threads, the cap ---------------------------------------- */

static void *user_thread(void *arg)
{
    char name[32];
    snprintf(name, sizeof name, "worker %d", (int)(intptr_t)arg);
    ddp__tl_name_thread(name);
    for (int i = 0; i < 20; i++) {
        if (ddp_timeline_begin("outer") < 0 || ddp_timeline_begin("inner") < 0 ||
            ddp_timeline_end() < 0 || ddp_timeline_end() < 0)
            return (void *)1;
    }
    return NULL;
}

/* A child: 3 threads of 40 spans each, the main thread over a cap of 50
 * (70 spans: 20 dropped), a name that needs escaping, misuse errors. */
static int user_child(const char *dir)
{
    setenv("DDP_TIMELINE_DIR", dir, 1);
    setenv("DDP_TIMELINE_MAX_EVENTS", "50", 1);
    setenv("RANK", "3", 1);
    setenv("WORLD_SIZE", "4", 1);
    if (!ddp_timeline_enabled())
        return 10;
    if (ddp_timeline_end() != DDP_ERR_STATE ||
        !strstr(ddp_last_error(), "ddp_timeline_end: no span is open on this thread"))
        return 11;
    if (ddp_timeline_begin(NULL) != DDP_ERR_INVALID_ARG)
        return 12;
    for (int i = 0; i < DDP_TIMELINE_MAX_DEPTH; i++)
        if (ddp_timeline_begin("deep") < 0)
            return 13;
    if (ddp_timeline_begin("too deep") != DDP_ERR_STATE ||
        !strstr(ddp_last_error(), "spans nest deeper than 32 on this thread"))
        return 14;
    for (int i = 0; i < DDP_TIMELINE_MAX_DEPTH - 1; i++)
        if (ddp_timeline_end() < 0)
            return 15;
    /* valid UTF-8 kept, a stray byte and a truncated sequence made '?' */
    if (ddp_timeline_begin("\xc3\xa9t\xe9 \xff\xe2\x82") < 0 || ddp_timeline_end() < 0 ||
        ddp_timeline_end() < 0)
        return 15;
    pthread_t t[3];
    for (intptr_t i = 0; i < 3; i++)
        pthread_create(&t[i], NULL, user_thread, (void *)i);
    for (int i = 0; i < 3; i++) {
        void *rc;
        pthread_join(t[i], &rc);
        if (rc)
            return 16;
    }
    for (int i = 0; i < 70 - DDP_TIMELINE_MAX_DEPTH - 2; i++)
        if (ddp_timeline_begin("say \"hi\"\\\n") < 0 || ddp_timeline_end() < 0)
            return 17;
    return ddp_timeline_flush() < 0 ? 18 : 0;
}

static void test_user_spans_threads_and_cap(void **state)
{
    const char *dir = *state;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        _exit(user_child(dir));
    int st;
    waitpid(pid, &st, 0);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    char path[4200];
    snprintf(path, sizeof path, "%s/timeline-rank3.json", dir);
    ddp__json *tree = load(path);
    summary s = check_trace(tree);
    assert_string_equal(s.label[0], "rank 3");
    assert_int_equal(s.tids, 4);
    assert_int_equal(count_of(&s, "outer"), 60);
    assert_int_equal(count_of(&s, "inner"), 60);
    /* main: 32 "deep", one UTF-8 test, then 50 - 33 = 17 of 36 escaped names kept. */
    assert_int_equal(count_of(&s, "deep"), 32);
    assert_int_equal(count_of(&s, "\xc3\xa9t? ???"), 1);
    assert_int_equal(count_of(&s, "say \"hi\"\\\n"), 17);
    assert_non_null(s.dropped);
    assert_string_equal(s.dropped,
                        "timeline: 19 events dropped (cap 50 per thread, DDP_TIMELINE_MAX_EVENTS)");
    assert_int_equal((int)num(ddp__json_get(tree, "otherData"), "dropped_events"), 19);
    int named = 0;
    const ddp__json *ev = ddp__json_get(tree, "traceEvents");
    for (const ddp__json *e = ev->child; e; e = e->next)
        if (!strcmp(str(e, "name"), "thread_name"))
            named += !strncmp(str(ddp__json_get(e, "args"), "name"), "worker ", 7) ||
                     !strcmp(str(ddp__json_get(e, "args"), "name"), "main");
    assert_int_equal(named, 4);
    ddp__json_free(tree);
}

/* ---- the communication thread's track ------------------------------------ */

/* A rank: 5 asynchronous all-reduces (run by the group's communication
 * thread) then a blocking one with nothing queued (run on this thread). */
static int comm_rank(int rank, void *arg)
{
    const ddp_job *j = arg;
    rank_env(rank, j->dir);
    ddp_pg_t *pg = NULL;
    float v[6][4] = {{0}};
    ddp_work_t *w[5];
    if (ddp_init_process_group("tcp", j->url, rank, 2, 60, &pg) < 0)
        goto fail;
    for (int i = 0; i < 5; i++)
        if (ddp_pg_all_reduce_async(pg, v[i], 4, DDP_FLOAT32, DDP_SUM, &w[i]) < 0)
            goto fail;
    for (int i = 0; i < 5; i++) {
        if (ddp_work_wait(w[i], 60) < 0)
            goto fail;
        ddp_work_destroy(w[i]);
    }
    if (ddp_pg_all_reduce(pg, v[5], 4, DDP_FLOAT32, DDP_SUM) < 0 || ddp_timeline_flush() < 0)
        goto fail;
    ddp_destroy_process_group(pg);
    return 0;
fail:
    fprintf(stderr, "rank %d: %s\n", rank, ddp_last_error());
    return 1;
}

static void test_comm_thread_track(void **state)
{
    const char *dir = *state;
    run_two_ranks(comm_rank, dir);
    char path[4200];
    for (int r = 0; r < 2; r++) {
        snprintf(path, sizeof path, "%s/timeline-rank%d.json", dir, r);
        ddp__json *tree = load(path);
        (void)check_trace(tree);
        const ddp__json *ev = ddp__json_get(tree, "traceEvents");
        double comm = -1;
        for (const ddp__json *e = ev->child; e; e = e->next)
            if (!strcmp(str(e, "name"), "thread_name") &&
                !strcmp(str(ddp__json_get(e, "args"), "name"), "comm"))
                comm = num(e, "tid");
        assert_true(comm >= 0);
        /* one span per collective the thread ran, in issue order, with its
         * sequence number; the blocking one on the caller's track, last */
        int on_comm = 0, elsewhere = 0;
        double last_seq = -1, inline_seq = -1;
        for (const ddp__json *e = ev->child; e; e = e->next) {
            if (strcmp(str(e, "name"), "all_reduce") != 0)
                continue;
            double seq = num(ddp__json_get(e, "args"), "seq");
            if (num(e, "tid") == comm) {
                assert_true(seq > last_seq);
                last_seq = seq;
                on_comm++;
            } else {
                inline_seq = seq;
                elsewhere++;
            }
        }
        assert_int_equal(on_comm, 5);
        assert_int_equal(elsewhere, 1);
        assert_true(inline_seq == last_seq + 1);
        ddp__json_free(tree);
    }
}

/* ---- off, bad values, merge errors ---------------------------------------- */

static int off_child(const char *dir, const char *max_events)
{
    if (max_events) {
        setenv("DDP_TIMELINE_DIR", dir, 1);
        setenv("DDP_TIMELINE_MAX_EVENTS", max_events, 1);
        setenv("DDP_LOG_LEVEL", "warn", 1);
    } else {
        unsetenv("DDP_TIMELINE_DIR");
    }
    if (ddp_timeline_enabled() || ddp_timeline_begin("x") != 0 || ddp_timeline_end() != 0 ||
        ddp_timeline_flush() != 0)
        return 1;
    uint64_t t0 = ddp__tl_begin();
    return t0 == 0 ? 0 : 2;
}

static void test_off_writes_nothing(void **state)
{
    const char *dir = *state;
    char log[4200];
    snprintf(log, sizeof log, "%s/err", dir);
    const char *cases[] = {NULL, "0", "12x"};
    for (int i = 0; i < 3; i++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            if (!freopen(log, "w", stderr))
                _exit(3);
            int rc = off_child(dir, cases[i]);
            fflush(stderr);
            _exit(rc);
        }
        int st;
        waitpid(pid, &st, 0);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        assert_int_equal(dir_entries(dir, "timeline"), 0);
        FILE *f = fopen(log, "r");
        char line[512] = "";
        assert_non_null(f);
        if (!fgets(line, sizeof line, f))
            line[0] = '\0';
        fclose(f);
        if (cases[i]) {
            char want[128];
            snprintf(want, sizeof want,
                     "DDP_TIMELINE_MAX_EVENTS=%s: expected an integer from 1 to 1000000000",
                     cases[i]);
            if (!strstr(line, "[ddp W] timeline off: ") || !strstr(line, want))
                fail_msg("stderr '%s', expected '%s'", line, want);
        } else {
            assert_string_equal(line, "");
        }
    }
}

static void test_merge_errors(void **state)
{
    const char *dir = *state;
    char path[4200];
    assert_int_equal(ddp__timeline_merge_dir(dir, NULL, NULL), DDP_ERR_NOT_FOUND);
    assert_non_null(strstr(ddp_last_error(), "timeline: no timeline-rank<R>.json in "));
    snprintf(path, sizeof path, "%s/timeline-rank0.json", dir);
    fx_write(path, (const uint8_t *)"{\"traceEvents\":[{}", 18);
    assert_int_equal(ddp__timeline_merge_dir(dir, NULL, NULL), DDP_ERR_FORMAT);
    assert_non_null(strstr(ddp_last_error(), "timeline-rank0.json"));
    fx_write(path, (const uint8_t *)"{\"events\":[]}", 13);
    assert_int_equal(ddp__timeline_merge_dir(dir, NULL, NULL), DDP_ERR_FORMAT);
    assert_non_null(strstr(ddp_last_error(), "is not a trace (no \"traceEvents\" array)"));
    /* Numbers and strings come back as written. */
    const char *good = "{\"traceEvents\":[{\"name\":\"a\\\"b\",\"ph\":\"X\",\"pid\":0,\"tid\":1,"
                       "\"ts\":1234567.125,\"dur\":0.1}]}";
    fx_write(path, (const uint8_t *)good, strlen(good));
    assert_int_equal(ddp__timeline_merge_dir(dir, NULL, NULL), 0);
    snprintf(path, sizeof path, "%s/timeline.json", dir);
    ddp__json *m = load(path);
    const ddp__json *e = ddp__json_get(m, "traceEvents")->child;
    assert_string_equal(str(e, "name"), "a\"b");
    assert_true(num(e, "ts") == 1234567.125 && num(e, "dur") == 0.1);
    ddp__json_free(m);
}

int main(void)
{
    const char *b = getenv("DDP_TEST_BUILD");
    snprintf(build, sizeof build, "%s", b && *b ? b : "build");
    unsetenv("DDP_TIMELINE_DIR");
    const struct CMUnitTest tests[] = {
        IN_TMPDIR(test_mnist_two_ranks),
        IN_TMPDIR(test_ddp_buckets),
        IN_TMPDIR(test_user_spans_threads_and_cap),
        IN_TMPDIR(test_comm_thread_track),
        IN_TMPDIR(test_off_writes_nothing),
        IN_TMPDIR(test_merge_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
