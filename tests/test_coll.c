/* Collectives against references: every collective x world sizes 1, 2, 3,
 * 4, 5, 8 x element counts 0, 1, 7, 1023, 1M+3 x every dtype and op that
 * applies, all-reduce with each of its algorithms.  Ranks are forked
 * processes on loopback; one process group per world size runs every case
 * (one rendezvous), and each rank checks its output bit for bit against a
 * reference folded in the algorithm's documented order (coll_ref.h).  The
 * 1M+3 count runs for a subset of dtypes and ops (and 64K+3 under
 * sanitizers), and checks reductions on a sample of elements that covers
 * every pipeline unit's and ring block's edges (see sampled()), to keep the
 * suite fast. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll/coll.h"
#include "coll/hier.h"
#include "coll/reduce.h"
#include "coll_ref.h"
#include "ddp/pg.h"
#include "pg/internal.h"

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static size_t big_count(void)
{
    const char *san = getenv("DDP_TEST_SANITIZER");
    return san && *san == '1' ? (64u << 10) + 3 : (1u << 20) + 3;
}

typedef struct ccase {
    int kind, algo; /* algo: index into algo_names for all-reduce */
    int into;       /* reduce: out of place (ddp__pg_reduce_into_async) */
    ddp_dtype dt;
    ddp_reduce_op op;
    size_t count;
    int root;
    uint64_t id;
} ccase;

/* Which elements of a reduction's output to check.  Up to 100000 elements:
 * all.  Above (the 1M+3 cases), the n-fold reference would dominate the
 * suite's time, so: every 31st element, the first and last three of every
 * 16384 (so every pipeline unit's edges, whatever the dtype), and the three
 * on either side of every ring block boundary.  The unchecked elements get
 * the expected bytes copied from the output. */
static int sampled(size_t i, size_t count, int n)
{
    if (count <= 100000 || i % 31 == 0 || i % 16384 < 3 || i % 16384 > 16380 || i + 3 >= count)
        return 1;
    size_t base = count / (size_t)n, rem = count % (size_t)n;
    for (size_t b = 1; b < (size_t)n; b++) {
        size_t edge = b * base + (b < rem ? b : rem);
        if (i + 3 >= edge && i < edge + 3)
            return 1;
    }
    return 0;
}

/* Hooks for test_hier_coll.c: the host of each rank ("ABAB": ranks 0, 2 on
 * host A; NULL: DDP_HOST_ID untouched), and a check of the group after the
 * cases (0: fine). */
#ifndef COLL_HOST_LAYOUT
#define COLL_HOST_LAYOUT(n) ((const char *)NULL)
#endif
#ifndef COLL_CHECK_GROUP
#define COLL_CHECK_GROUP(pg) 0
#endif

/* Element i of a hierarchical all-reduce's result, the leaders running
 * the algorithm whose order is given. */
static void want_hier_all_reduce(ddp_pg_t *pg, uint8_t *want, const ccase *c, size_t i,
                                 int order)
{
    const ddp__hier *h = ddp__pg_hier(pg);
    ref_reduce_hier(want, c->dt, c->op, c->id, ddp_pg_size(pg), i, h->host_of, h->nhosts, order,
                    ref_where(order, i, c->count, h->nhosts));
}

/* Element i of a reduce's result at the root: rank order, or on a
 * hierarchical group each host in rank order, then hosts in order. */
static void want_reduce(ddp_pg_t *pg, uint8_t *want, const ccase *c, size_t i)
{
    const int n = ddp_pg_size(pg);
    const ddp__hier *h = ddp__pg_hier(pg);
    if (h)
        ref_reduce_hier(want, c->dt, c->op, c->id, n, i, h->host_of, h->nhosts, ORDER_RANK, 0);
    else
        ref_reduce(want, c->dt, c->op, c->id, n, i, ORDER_RANK, 0);
}

/* Element i of a reduce_scatter's input vector, reduced: the flat ring's
 * order (the block of rank r folded from r+1 on), or on a hierarchical
 * group each host in rank order, then the leaders' ring over hosts (the
 * segment of host h folded from h+1 on). */
static void want_reduce_scatter(ddp_pg_t *pg, uint8_t *want, const ccase *c, size_t i)
{
    const int n = ddp_pg_size(pg), r = ddp_pg_rank(pg);
    const ddp__hier *h = ddp__pg_hier(pg);
    if (h)
        ref_reduce_hier(want, c->dt, c->op, c->id, n, i, h->host_of, h->nhosts, ORDER_RING,
                        h->host_of[r]);
    else
        ref_reduce(want, c->dt, c->op, c->id, n, i, n == 1 ? ORDER_RANK : ORDER_RING, r);
}

static void fill(uint8_t *buf, size_t count, const ccase *c, int rank, size_t first)
{
    size_t es = ddp_dtype_size(c->dt);
    for (size_t i = 0; i < count; i++)
        ref_input(buf + i * es, c->dt, c->op, c->id, rank, first + i);
}

static int compare(const uint8_t *got, const uint8_t *want, size_t count, size_t es,
                   const ccase *c, int rank, const char *what)
{
    for (size_t i = 0; i < count; i++) {
        if (memcmp(got + i * es, want + i * es, es) == 0)
            continue;
        uint64_t g = 0, w = 0;
        memcpy(&g, got + i * es, es);
        memcpy(&w, want + i * es, es);
        fprintf(stderr,
                "rank %d: %s case %llu (%s algo %d, %s, %s, count %zu, root %d): element %zu is "
                "0x%llx, expected 0x%llx\n",
                rank, what, (unsigned long long)c->id, ddp__coll_name(c->kind), c->algo,
                ddp_dtype_name(c->dt), ddp_reduce_op_name(c->op), c->count, c->root, i,
                (unsigned long long)g, (unsigned long long)w);
        return 1;
    }
    return 0;
}

/* All-reduce algorithms the matrix runs, and the order each folds in.
 * test_shm_coll adds "shared" (the shared-window algorithm) by defining
 * COLL_NALGOS 6 before it includes this file. */
#ifndef COLL_NALGOS
#define COLL_NALGOS 5
#endif
enum { ALGO_RING = 1, ALGO_SHARED = 5 };
static const char *algo_names[] = {"direct", "ring", "rd", "rabenseifner", "tree", "shared"};
static const int algo_order[] = {ORDER_RANK, ORDER_RING, ORDER_RD,
                                 ORDER_RAB,  ORDER_TREE, ORDER_RANK};

/* Runs one case on this rank; 0 when the output matches. */
static int run_case(ddp_pg_t *pg, const ccase *c)
{
    const int n = ddp_pg_size(pg), r = ddp_pg_rank(pg);
    const size_t es = ddp_dtype_size(c->dt), cnt = c->count, all = cnt * (size_t)n;
    uint8_t *in = malloc(all * es + 8), *out = malloc(all * es + 8), *want = malloc(all * es + 8);
    int rc = 0, bad = 0;
    if (!in || !out || !want) {
        fprintf(stderr, "out of memory\n");
        bad = 1;
        goto done;
    }
    switch (c->kind) {
    case DDP__ALL_REDUCE:
        if (ddp__pg_set_option(pg, "allreduce_algo", algo_names[c->algo]) < 0) {
            bad = 1;
            goto done;
        }
        fill(out, cnt, c, r, 0);
        rc = ddp_pg_all_reduce(pg, out, cnt, c->dt, c->op);
        for (size_t i = 0; i < cnt; i++)
            if (sampled(i, cnt, n))
                ref_reduce(want + i * es, c->dt, c->op, c->id, n, i,
                           n == 1 ? ORDER_RANK : algo_order[c->algo],
                           ref_where(algo_order[c->algo], i, cnt, n));
            else
                memcpy(want + i * es, out + i * es, es);
        if (ddp__pg_hier(pg)) /* two levels fold in another order */
            for (size_t i = 0; i < cnt; i++)
                if (sampled(i, cnt, n))
                    want_hier_all_reduce(pg, want + i * es, c, i, algo_order[c->algo]);
        bad = rc == 0 && compare(out, want, cnt, es, c, r, "output");
        break;
    case DDP__BROADCAST:
        fill(out, cnt, c, r, 0);
        rc = ddp_pg_broadcast(pg, out, cnt, c->dt, c->root);
        fill(want, cnt, c, c->root, 0);
        bad = rc == 0 && compare(out, want, cnt, es, c, r, "output");
        break;
    case DDP__REDUCE:
        /* "ring": the reduce over messages; "shared": over the window. */
        if (ddp__pg_set_option(pg, "allreduce_algo", algo_names[c->algo]) < 0) {
            bad = 1;
            goto done;
        }
        fill(out, cnt, c, r, 0);
        if (c->into) { /* the input in `in`, unchanged on every rank; only the root's out written */
            fill(in, cnt, c, r, 0);
            memset(out, 0xee, cnt * es + 8);
            ddp_work_t *w = NULL;
            rc = ddp__pg_reduce_into_async(pg, in, out, cnt, c->dt, c->op, c->root, &w);
            if (rc == 0)
                rc = ddp_work_wait(w, -1);
            ddp_work_destroy(w);
            fill(want, cnt, c, r, 0);
            bad = rc == 0 && compare(in, want, cnt, es, c, r, "input");
            memset(want, 0xee, cnt * es + 8);
            if (r != c->root) {
                bad |= rc == 0 && compare(out, want, cnt + 8 / es, es, c, r, "unused output");
                break;
            }
            /* the root writes its count elements, not one byte beyond */
            bad |= rc == 0 && compare(out + cnt * es, want, 8 / es, es, c, r, "output's tail");
        } else {
            rc = ddp_pg_reduce(pg, out, cnt, c->dt, c->op, c->root);
        }
        if (r == c->root)
            for (size_t i = 0; i < cnt; i++)
                if (sampled(i, cnt, n))
                    want_reduce(pg, want + i * es, c, i);
                else
                    memcpy(want + i * es, out + i * es, es);
        else
            fill(want, cnt, c, r, 0);
        bad |= rc == 0 && compare(out, want, cnt, es, c, r, "output");
        break;
    case DDP__ALL_GATHER:
    case DDP__GATHER:
        fill(in, cnt, c, r, 0);
        memset(out, 0xee, all * es);
        rc = c->kind == DDP__GATHER ? ddp_pg_gather(pg, in, out, cnt, c->dt, c->root)
                                    : ddp_pg_all_gather(pg, in, out, cnt, c->dt);
        for (int b = 0; b < n; b++)
            fill(want + (size_t)b * cnt * es, cnt, c, b, 0);
        if (c->kind == DDP__ALL_GATHER || r == c->root)
            bad = rc == 0 && compare(out, want, all, es, c, r, "output");
        break;
    case DDP__SCATTER:
        fill(in, all, c, c->root, 0);
        rc = ddp_pg_scatter(pg, r == c->root ? in : NULL, out, cnt, c->dt, c->root);
        fill(want, cnt, c, c->root, (size_t)r * cnt);
        bad = rc == 0 && compare(out, want, cnt, es, c, r, "output");
        break;
    case DDP__REDUCE_SCATTER:
        fill(in, all, c, r, 0);
        rc = ddp_pg_reduce_scatter(pg, in, out, cnt, c->dt, c->op);
        for (size_t i = 0; i < cnt; i++)
            if (sampled(i, cnt, n))
                want_reduce_scatter(pg, want + i * es, c, (size_t)r * cnt + i);
            else
                memcpy(want + i * es, out + i * es, es);
        bad = rc == 0 && compare(out, want, cnt, es, c, r, "output");
        break;
    case DDP__ALL_TO_ALL:
        fill(in, all, c, r, 0);
        rc = ddp_pg_all_to_all(pg, in, out, cnt, c->dt);
        for (int b = 0; b < n; b++)
            fill(want + (size_t)b * cnt * es, cnt, c, b, (size_t)r * cnt);
        bad = rc == 0 && compare(out, want, all, es, c, r, "output");
        break;
    case DDP__BARRIER:
        rc = ddp_pg_barrier(pg);
        break;
    case DDP__SEND: { /* a ring of send/recv pairs */
        if (n == 1)
            break;
        ddp_work_t *w = NULL;
        fill(in, cnt, c, r, 0);
        rc = ddp_pg_send_async(pg, in, cnt, c->dt, (r + 1) % n, (int)(c->id % 1000), &w);
        if (rc == 0)
            rc = ddp_pg_recv(pg, out, cnt, c->dt, (r + n - 1) % n, (int)(c->id % 1000));
        if (rc == 0)
            rc = ddp_work_wait(w, -1);
        ddp_work_destroy(w);
        fill(want, cnt, c, (r + n - 1) % n, 0);
        bad = rc == 0 && compare(out, want, cnt, es, c, r, "received");
        break;
    }
    }
    if (rc != 0)
        fprintf(stderr, "rank %d: %s case %llu failed: %s\n", r, ddp__coll_name(c->kind),
                (unsigned long long)c->id, ddp_last_error());
done:
    free(in);
    free(out);
    free(want);
    return rc != 0 || bad;
}

/* Every case, in the same order on every rank; returns failures. */
static int run_all_cases(ddp_pg_t *pg, int *ncases)
{
    const int n = ddp_pg_size(pg);
    const size_t counts[] = {0, 1, 7, 1023, big_count()};
    int failed = 0;
    uint64_t id = 0;
    ccase c;
#define RUN(...)                                           \
    do {                                                   \
        c = (ccase){__VA_ARGS__};                          \
        c.id = ++id;                                       \
        c.root = (int)(c.id % (uint64_t)n);                \
        failed += run_case(pg, &c);                        \
        (*ncases)++;                                       \
        if (failed > 5)                                    \
            return failed;                                 \
    } while (0)
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
        size_t cnt = counts[ci];
        int big = ci == 4;
        size_t block = big ? cnt / (size_t)n : cnt; /* per-rank blocks of n-block collectives */
        for (int algo = 0; algo < (n == 1 ? 1 : COLL_NALGOS); algo++)
            for (int dt = 0; dt < DDP_NUM_DTYPES; dt++)
                for (int op = 0; op < DDP_NUM_REDUCE_OPS; op++) {
                    if (!op_applies(dt, op))
                        continue;
                    if (big && !((dt == DDP_FLOAT32 && op == DDP_SUM) ||
                                 ((algo == ALGO_RING || algo == ALGO_SHARED) &&
                                  ((dt == DDP_BFLOAT16 && op == DDP_AVG) ||
                                   (dt == DDP_INT64 && op == DDP_MAX)))))
                        continue;
                    RUN(.kind = DDP__ALL_REDUCE, .algo = algo, .dt = dt, .op = op, .count = cnt);
                }
        for (int dt = 0; dt < DDP_NUM_DTYPES; dt++)
            for (int op = 0; op < DDP_NUM_REDUCE_OPS; op++) {
                if (!op_applies(dt, op) || (big && !(dt == DDP_FLOAT32 && op == DDP_SUM)))
                    continue;
                RUN(.kind = DDP__REDUCE, .algo = ALGO_RING, .dt = dt, .op = op, .count = cnt);
                if (COLL_NALGOS > ALGO_SHARED)
                    RUN(.kind = DDP__REDUCE, .algo = ALGO_SHARED, .dt = dt, .op = op,
                        .count = cnt);
                /* Out of place (ZeRO-2's owner reduces), both ways. */
                RUN(.kind = DDP__REDUCE, .into = 1, .algo = ALGO_RING, .dt = dt, .op = op,
                    .count = cnt);
                if (COLL_NALGOS > ALGO_SHARED)
                    RUN(.kind = DDP__REDUCE, .into = 1, .algo = ALGO_SHARED, .dt = dt, .op = op,
                        .count = cnt);
                RUN(.kind = DDP__REDUCE_SCATTER, .dt = dt, .op = op, .count = block);
            }
        for (int dt = 0; dt < DDP_NUM_DTYPES; dt++) {
            if (big && dt != DDP_FLOAT32 && dt != DDP_UINT8)
                continue;
            RUN(.kind = DDP__BROADCAST, .dt = dt, .count = cnt);
            RUN(.kind = DDP__ALL_GATHER, .dt = dt, .count = block);
            RUN(.kind = DDP__GATHER, .dt = dt, .count = block);
            RUN(.kind = DDP__SCATTER, .dt = dt, .count = block);
            RUN(.kind = DDP__ALL_TO_ALL, .dt = dt, .count = block);
            RUN(.kind = DDP__SEND, .dt = dt, .count = cnt);
        }
        RUN(.kind = DDP__BARRIER, .dt = DDP_UINT8, .count = 0);
    }
#undef RUN
    return failed;
}

typedef struct matrix_arg {
    char url[300];
} matrix_arg;

static int matrix_rank(int rank, void *arg)
{
    matrix_arg *m = arg;
    int n = atoi(strrchr(m->url, '.') + 1);
    ddp_pg_t *pg = NULL;
    const char *layout = COLL_HOST_LAYOUT(n);
    if (layout) {
        char id[16];
        snprintf(id, sizeof id, "host%c", layout[rank]);
        setenv("DDP_HOST_ID", id, 1);
    }
    if (ddp_init_process_group("tcp", m->url, rank, n, 60.0, &pg) != 0) {
        fprintf(stderr, "rank %d: init: %s\n", rank, ddp_last_error());
        return 1;
    }
    int ncases = 0;
    double t0 = ddp_time_now();
    int failed = run_all_cases(pg, &ncases);
    failed += COLL_CHECK_GROUP(pg);
    if (rank == 0)
        fprintf(stderr, "world size %d: %d cases in %.2f s, %d failed\n", n, ncases,
                ddp_time_now() - t0, failed);
    ddp_destroy_process_group(pg);
    return failed;
}

/* The six groups run at the same time: a case is mostly waiting for other
 * ranks to be scheduled, so groups overlap well even on 2 cores.  Each
 * test_world_N waits for its own group's processes. */
#define NGROUPS 6
static const int world_sizes[NGROUPS] = {1, 2, 3, 4, 5, 8};
static struct group {
    pid_t pids[8];
    char dir[64];
    matrix_arg arg;
} groups[NGROUPS];
static int groups_started;

static void start_groups(void)
{
    if (groups_started)
        return;
    groups_started = 1;
    for (int g = 0; g < NGROUPS; g++) {
        struct group *gr = &groups[g];
        char dir[64] = "/tmp/ddp_test_coll_XXXXXX";
        if (!mkdtemp(dir))
            abort();
        memcpy(gr->dir, dir, sizeof dir);
        snprintf(gr->arg.url, sizeof gr->arg.url, "file://%s/store.%d", dir, world_sizes[g]);
        for (int r = 0; r < world_sizes[g]; r++) {
            fflush(NULL);
            gr->pids[r] = fork();
            if (gr->pids[r] == 0)
                _exit(matrix_rank(r, &gr->arg) == 0 ? 0 : 1);
        }
    }
}

/* Waits for group g's ranks (killing them after limit_s); returns failures. */
static int wait_group(int g, double limit_s)
{
    struct group *gr = &groups[g];
    int failed = 0;
    double deadline = ddp_time_now() + limit_s;
    for (int r = 0; r < world_sizes[g]; r++) {
        int status = 0;
        pid_t got;
        while ((got = waitpid(gr->pids[r], &status, WNOHANG)) == 0 && ddp_time_now() < deadline)
            sleep_s(0.005);
        if (got == 0) {
            fprintf(stderr, "world size %d rank %d still running after %.0f s: killed\n",
                    world_sizes[g], r, limit_s);
            kill(gr->pids[r], SIGKILL);
            waitpid(gr->pids[r], &status, 0);
            status = 1;
        }
        failed += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    }
    char path[200];
    snprintf(path, sizeof path, "%s/store.%d", gr->dir, world_sizes[g]);
    unlink(path);
    rmdir(gr->dir);
    return failed;
}

static void run_matrix(int g)
{
    start_groups();
    assert_int_equal(wait_group(g, 900.0), 0);
}

static void test_world_1(void **state) { (void)state; run_matrix(0); }
static void test_world_2(void **state) { (void)state; run_matrix(1); }
static void test_world_3(void **state) { (void)state; run_matrix(2); }
static void test_world_4(void **state) { (void)state; run_matrix(3); }
static void test_world_5(void **state) { (void)state; run_matrix(4); }
static void test_world_8(void **state) { (void)state; run_matrix(5); }

/* The reference itself: a hand-checked ring order on 3 ranks. */
static void test_reference_orders(void **state)
{
    (void)state;
    /* 7 elements over 3 ranks: blocks of 3, 2, 2. */
    assert_int_equal(ring_block_of(0, 7, 3), 0);
    assert_int_equal(ring_block_of(2, 7, 3), 0);
    assert_int_equal(ring_block_of(3, 7, 3), 1);
    assert_int_equal(ring_block_of(5, 7, 3), 2);
    assert_int_equal(ring_block_of(6, 7, 3), 2);
    /* int32 SUM is order-free: all orders agree with a plain sum. */
    for (int order = 0; order <= ORDER_TREE; order++) {
        int32_t got, x;
        uint32_t sum = 0;
        for (int r = 0; r < 5; r++) {
            ref_input(&x, DDP_INT32, DDP_SUM, 9, r, 4);
            sum += (uint32_t)x;
        }
        ref_reduce(&got, DDP_INT32, DDP_SUM, 9, 5, 4, order, 1);
        assert_int_equal(got, (int32_t)sum);
    }
    /* float SUM in ring order from block 1 on 3 ranks: (x2 + x0) + x1. */
    float x0, x1, x2, got;
    ref_input(&x0, DDP_FLOAT32, DDP_SUM, 3, 0, 1);
    ref_input(&x1, DDP_FLOAT32, DDP_SUM, 3, 1, 1);
    ref_input(&x2, DDP_FLOAT32, DDP_SUM, 3, 2, 1);
    ref_reduce(&got, DDP_FLOAT32, DDP_SUM, 3, 3, 1, ORDER_RING, 1);
    float want = (x2 + x0) + x1;
    assert_memory_equal(&got, &want, 4);
    /* The tree's order, by hand: on 6 ranks position 0 has child 4, 4 has
     * 2 and 5, 2 has 1 and 3; tree 1 mirrors the ranks (p = 5 - r); on 5
     * ranks tree 1 shifts them (p = r - 1 mod 5: root rank 1). */
    float x[6];
    for (int r = 0; r < 6; r++)
        ref_input(&x[r], DDP_FLOAT32, DDP_SUM, 4, r, 2);
    ref_reduce(&got, DDP_FLOAT32, DDP_SUM, 4, 6, 2, ORDER_TREE, 0);
    want = x[0] + ((((x[1] + x[2]) + x[3]) + x[4]) + x[5]);
    assert_memory_equal(&got, &want, 4);
    ref_reduce(&got, DDP_FLOAT32, DDP_SUM, 4, 6, 2, ORDER_TREE, 1);
    want = x[5] + ((((x[4] + x[3]) + x[2]) + x[1]) + x[0]);
    assert_memory_equal(&got, &want, 4);
    ref_reduce(&got, DDP_FLOAT32, DDP_SUM, 4, 5, 2, ORDER_TREE, 1);
    want = x[1] + (((x[2] + x[3]) + x[4]) + x[0]);
    assert_memory_equal(&got, &want, 4);
    /* 8 ranks, tree 0: 0 -> 4 -> (2 -> 1, 3), (6 -> 5, 7). */
    float y[8];
    for (int r = 0; r < 8; r++)
        ref_input(&y[r], DDP_FLOAT32, DDP_SUM, 4, r, 2);
    ref_reduce(&got, DDP_FLOAT32, DDP_SUM, 4, 8, 2, ORDER_TREE, 0);
    want = y[0] + ((((y[1] + y[2]) + y[3]) + y[4]) + ((y[5] + y[6]) + y[7]));
    assert_memory_equal(&got, &want, 4);
    assert_int_equal(tree_of(3, 7), 0);
    assert_int_equal(tree_of(4, 7), 1);
}

/* The library's half/bfloat16 conversions against the compiler's _Float16
 * and a direct bit-level bfloat16 rounding, over every 16-bit pattern and a
 * million random floats (ties, subnormals, overflow included). */
static void test_half_conversions(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ddp__half_to_float((uint16_t)h), g = ref_h2f((uint16_t)h);
        if (f != f) { /* NaN stays NaN */
            assert_true(g != g);
            continue;
        }
        assert_memory_equal(&f, &g, 4);
        assert_int_equal(ddp__float_to_half(f), h);
        float b = ddp__bf16_to_float((uint16_t)h);
        if (b == b)
            assert_int_equal(ddp__float_to_bf16(b), h);
    }
    uint64_t x = 1;
    for (int i = 0; i < 1000000; i++) {
        x = ref_hash(x, (uint64_t)i, 5);
        uint32_t bits = (uint32_t)x;
        if (i % 3 == 0) /* concentrate on the half range, ties included */
            bits = (bits & 0x80000000u) | (0x33000000u + (bits & 0x0fffffffu) % 0x14800000u);
        float f;
        memcpy(&f, &bits, 4);
        if (f != f)
            continue;
        assert_int_equal(ddp__float_to_half(f), ref_f2h(f));
        if (fabsf(f) < 3e38f)
            assert_int_equal(ddp__float_to_bf16(f), ref_f2b(f));
    }
}

/* The out-of-place reduce's argument check (ddp__coll_check, local to each
 * rank): the root's output may be its input (in place) or apart from it,
 * not overlap it partly; another rank's output is not looked at. */
static void test_reduce_into_check(void **state)
{
    (void)state;
    float v[16] = {0};
    ddp__coll_args a = {.kind = DDP__REDUCE, .send = v, .recv = v, .count = 8,
                        .dtype = DDP_FLOAT32, .op = DDP_SUM, .root = 1};
    assert_int_equal(ddp__coll_check(&a, 1, 2), 0); /* in place */
    a.recv = v + 8;
    assert_int_equal(ddp__coll_check(&a, 1, 2), 0); /* apart */
    a.recv = v + 4;
    assert_int_equal(ddp__coll_check(&a, 1, 2), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "reduce: input and output buffers overlap (pass "
                                             "the same buffer for in place)"));
    assert_int_equal(ddp__coll_check(&a, 0, 2), 0); /* not the root: recv unused */
    a.recv = NULL;
    assert_int_equal(ddp__coll_check(&a, 0, 2), 0);
    assert_int_equal(ddp__coll_check(&a, 1, 2), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "reduce: NULL output buffer"));
}

int main(void)
{
    /* TCP unless told otherwise (test_shm_coll runs this matrix over shm). */
    setenv("DDP_TRANSPORT", "tcp", 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_orders), cmocka_unit_test(test_half_conversions),
        cmocka_unit_test(test_reduce_into_check),
        cmocka_unit_test(test_world_1),
        cmocka_unit_test(test_world_2),          cmocka_unit_test(test_world_3),
        cmocka_unit_test(test_world_4),          cmocka_unit_test(test_world_5),
        cmocka_unit_test(test_world_8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
