/* One rank of the mpi backend's tests, started by mpirun from
 * tests/test_mpi.c:
 *
 *   mpi_worker matrix [big]  every collective x dtype x op x count 0, 1, 7,
 *                            1023 (and 1M+3 for a subset with "big")
 *   mpi_worker async         overlapping async work, in issue order
 *   mpi_worker subgroup      new_group of the even ranks, world ops between
 *   mpi_worker mismatch      rank / world size that disagree with MPI's
 *   mpi_worker timeout       (DDP_MPI_PROGRESS=poll) rank 1 skips a collective
 *
 * Checks.  Integer results and MIN/MAX are exact whatever MPI's reduction
 * order, and are compared bit for bit with coll_ref.h's references; float
 * SUM/PRODUCT/AVG depend on MPI's (undocumented) order, so they are compared
 * with a tolerance, and every rank's result is then all-gathered and must
 * be bitwise identical on all ranks.  Each rank prints "rank R: ok N" or the
 * first failures to stderr and exits 0 only when all passed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../coll_ref.h"
#include "coll/coll.h"
#include "ddp.h"
#include "pg/internal.h"

static int g_rank, g_size, g_failed;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "rank %d: line %d: ", g_rank, __LINE__);       \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, " [%s]\n", ddp_last_error());                  \
            g_failed++;                                                    \
        }                                                                  \
    } while (0)

static double as_double(const void *p, ddp_dtype dt)
{
    switch (dt) {
    case DDP_FLOAT32: return *(const float *)p;
    case DDP_FLOAT64: return *(const double *)p;
    case DDP_FLOAT16: return ref_h2f(*(const uint16_t *)p);
    case DDP_BFLOAT16: return ref_b2f(*(const uint16_t *)p);
    default: return 0;
    }
}

/* Relative tolerance of a float reduction over n ranks (each step rounds). */
static double tolerance(ddp_dtype dt, int n)
{
    double ulp = dt == DDP_FLOAT32 ? 0x1p-23 : dt == DDP_FLOAT64 ? 0x1p-52
               : dt == DDP_FLOAT16 ? 0x1p-10 : 0x1p-7;
    return 2.0 * n * ulp;
}

static int is_float(ddp_dtype dt) { return dt == DDP_FLOAT32 || dt == DDP_FLOAT64 ||
                                           dt == DDP_FLOAT16 || dt == DDP_BFLOAT16; }

/* got against the rank-order reduction of elements first.. (exact where the
 * order cannot matter).  Returns 0 when all match. */
static int check_reduced(const uint8_t *got, size_t count, ddp_dtype dt, ddp_reduce_op op,
                         uint64_t id, size_t first, const char *what)
{
    size_t es = ddp_dtype_size(dt);
    int exact = !is_float(dt) || op == DDP_MIN || op == DDP_MAX;
    /* Sums of n terms in [-1, 1] may cancel: tolerance relative to n. */
    double tol = tolerance(dt, g_size) * (op == DDP_PRODUCT ? 1.0 : g_size);
    for (size_t i = 0; i < count; i++) {
        uint8_t want[8];
        ref_reduce(want, dt, op, id, g_size, first + i, ORDER_RANK, 0);
        const uint8_t *g = got + i * es;
        int ok;
        if (exact) {
            ok = memcmp(g, want, es) == 0;
        } else {
            double x = as_double(g, dt), y = as_double(want, dt);
            ok = fabs(x - y) <= tol * (fabs(y) > 1 ? fabs(y) : 1);
        }
        if (!ok) {
            uint64_t gb = 0, wb = 0;
            memcpy(&gb, g, es);
            memcpy(&wb, want, es);
            fprintf(stderr,
                    "rank %d: %s case %llu (%s %s count %zu): element %zu is %g (0x%llx), "
                    "expected %g (0x%llx)\n",
                    g_rank, what, (unsigned long long)id, ddp_dtype_name(dt),
                    ddp_reduce_op_name(op), count, i, as_double(g, dt), (unsigned long long)gb,
                    as_double(want, dt), (unsigned long long)wb);
            return 1;
        }
    }
    return 0;
}

/* Every rank's buf (count) must be the same bits. */
static int check_identical(ddp_pg_t *pg, const uint8_t *buf, size_t count, ddp_dtype dt,
                           uint64_t id)
{
    size_t bytes = count * ddp_dtype_size(dt);
    uint8_t *all = malloc(bytes * (size_t)g_size + 1);
    int bad = !all || ddp_pg_all_gather(pg, buf, all, count, dt) != 0;
    for (int r = 0; !bad && r < g_size; r++)
        bad = memcmp(all + (size_t)r * bytes, buf, bytes) != 0;
    if (bad)
        fprintf(stderr, "rank %d: case %llu: results differ between ranks (%s)\n", g_rank,
                (unsigned long long)id, ddp_last_error());
    free(all);
    return bad;
}

static void fill(uint8_t *buf, size_t count, ddp_dtype dt, ddp_reduce_op op, uint64_t id,
                 int rank, size_t first)
{
    size_t es = ddp_dtype_size(dt);
    for (size_t i = 0; i < count; i++)
        ref_input(buf + i * es, dt, op, id, rank, first + i);
}

/* The reducing collectives of one case. */
static int reducing_case(ddp_pg_t *pg, int kind, ddp_dtype dt, ddp_reduce_op op, size_t cnt,
                         uint64_t id)
{
    const int n = g_size, r = g_rank, root = (int)(id % (uint64_t)n);
    const size_t es = ddp_dtype_size(dt), all = cnt * (size_t)n;
    uint8_t *in = malloc(all * es + 8), *out = malloc(all * es + 8);
    int bad = 0, rc = 0;
    if (kind == DDP__ALL_REDUCE) {
        fill(out, cnt, dt, op, id, r, 0);
        rc = ddp_pg_all_reduce(pg, out, cnt, dt, op);
        bad = rc || check_reduced(out, cnt, dt, op, id, 0, "all_reduce") ||
              check_identical(pg, out, cnt, dt, id);
    } else if (kind == DDP__REDUCE) {
        fill(out, cnt, dt, op, id, r, 0);
        fill(in, cnt, dt, op, id, r, 0);
        rc = ddp_pg_reduce(pg, out, cnt, dt, op, root);
        bad = rc || (r == root ? check_reduced(out, cnt, dt, op, id, 0, "reduce")
                               : memcmp(out, in, cnt * es) != 0);
        /* Out of place (ddp__pg_reduce_into_async): the input stays, only
         * the root's output is written. */
        uint8_t *was = malloc(cnt * es + 8);
        ddp_work_t *w = NULL;
        if (!was) {
            fprintf(stderr, "rank %d: out of memory\n", r);
            free(in);
            free(out);
            return 1;
        }
        memset(out, 0xee, cnt * es + 8);
        memset(was, 0xee, cnt * es + 8);
        if (!rc)
            rc = ddp__pg_reduce_into_async(pg, in, out, cnt, dt, op, root, &w);
        if (!rc)
            rc = ddp_work_wait(w, -1);
        ddp_work_destroy(w);
        bad = bad || rc || (r == root ? check_reduced(out, cnt, dt, op, id, 0, "reduce into")
                                      : memcmp(out, was, cnt * es + 8) != 0);
        fill(was, cnt, dt, op, id, r, 0);
        bad = bad || memcmp(in, was, cnt * es) != 0;
        free(was);
    } else { /* reduce_scatter: block r of the reduction */
        fill(in, all, dt, op, id, r, 0);
        rc = ddp_pg_reduce_scatter(pg, in, out, cnt, dt, op);
        bad = rc || check_reduced(out, cnt, dt, op, id, (size_t)r * cnt, "reduce_scatter");
    }
    if (rc)
        fprintf(stderr, "rank %d: %s case %llu failed: %s\n", r, ddp__coll_name(kind),
                (unsigned long long)id, ddp_last_error());
    free(in);
    free(out);
    return bad;
}

/* The data-moving collectives of one case (exact). */
static int moving_case(ddp_pg_t *pg, int kind, ddp_dtype dt, size_t cnt, uint64_t id)
{
    const int n = g_size, r = g_rank, root = (int)(id % (uint64_t)n);
    const size_t es = ddp_dtype_size(dt), all = cnt * (size_t)n;
    uint8_t *in = malloc(all * es + 8), *out = malloc(all * es + 8), *want = malloc(all * es + 8);
    int rc = 0, check = 1;
    size_t cmp = cnt;
    memset(out, 0xee, all * es + 8);
    switch (kind) {
    case DDP__BROADCAST:
        fill(out, cnt, dt, DDP_SUM, id, r, 0);
        rc = ddp_pg_broadcast(pg, out, cnt, dt, root);
        fill(want, cnt, dt, DDP_SUM, id, root, 0);
        break;
    case DDP__ALL_GATHER:
    case DDP__GATHER:
        fill(in, cnt, dt, DDP_SUM, id, r, 0);
        rc = kind == DDP__GATHER ? ddp_pg_gather(pg, in, r == root ? out : NULL, cnt, dt, root)
                                 : ddp_pg_all_gather(pg, in, out, cnt, dt);
        for (int b = 0; b < n; b++)
            fill(want + (size_t)b * cnt * es, cnt, dt, DDP_SUM, id, b, 0);
        cmp = all;
        check = kind == DDP__ALL_GATHER || r == root;
        break;
    case DDP__SCATTER:
        fill(in, all, dt, DDP_SUM, id, root, 0);
        rc = ddp_pg_scatter(pg, r == root ? in : NULL, out, cnt, dt, root);
        fill(want, cnt, dt, DDP_SUM, id, root, (size_t)r * cnt);
        break;
    case DDP__ALL_TO_ALL:
        fill(in, all, dt, DDP_SUM, id, r, 0);
        rc = ddp_pg_all_to_all(pg, in, out, cnt, dt);
        for (int b = 0; b < n; b++)
            fill(want + (size_t)b * cnt * es, cnt, dt, DDP_SUM, id, b, (size_t)r * cnt);
        cmp = all;
        break;
    case DDP__SEND: { /* a ring: send async to the next, receive from the previous */
        if (n == 1) {
            check = 0;
            break;
        }
        ddp_work_t *w = NULL;
        int tag = (int)(id % 1000);
        fill(in, cnt, dt, DDP_SUM, id, r, 0);
        rc = ddp_pg_send_async(pg, in, cnt, dt, (r + 1) % n, tag, &w);
        if (rc == 0)
            rc = ddp_pg_recv(pg, out, cnt, dt, (r + n - 1) % n, tag);
        if (rc == 0)
            rc = ddp_work_wait(w, -1);
        ddp_work_destroy(w);
        fill(want, cnt, dt, DDP_SUM, id, (r + n - 1) % n, 0);
        break;
    }
    }
    int bad = rc != 0 || (check && memcmp(out, want, cmp * es) != 0);
    if (bad)
        fprintf(stderr, "rank %d: %s case %llu (%s, count %zu) %s: %s\n", r, ddp__coll_name(kind),
                (unsigned long long)id, ddp_dtype_name(dt), cnt, rc ? "failed" : "wrong output",
                rc ? ddp_last_error() : "");
    free(in);
    free(out);
    free(want);
    return bad;
}

static int run_matrix(ddp_pg_t *pg, int big)
{
    const size_t counts[] = {0, 1, 7, 1023, (1u << 20) + 3};
    const int nc = big ? 5 : 4;
    uint64_t id = 0;
    int cases = 0;
    static const int moving[] = {DDP__BROADCAST, DDP__ALL_GATHER, DDP__GATHER, DDP__SCATTER,
                                 DDP__ALL_TO_ALL, DDP__SEND};
    for (int ci = 0; ci < nc && g_failed < 5; ci++) {
        size_t cnt = counts[ci];
        int large = ci == 4;
        size_t block = large ? cnt / (size_t)g_size : cnt;
        for (int dt = 0; dt < DDP_NUM_DTYPES; dt++)
            for (int op = 0; op < DDP_NUM_REDUCE_OPS; op++) {
                if (!op_applies(dt, op))
                    continue;
                if (large && !((dt == DDP_FLOAT32 && op == DDP_SUM) ||
                               (dt == DDP_BFLOAT16 && op == DDP_AVG) ||
                               (dt == DDP_INT64 && op == DDP_MAX)))
                    continue;
                g_failed += reducing_case(pg, DDP__ALL_REDUCE, dt, op, cnt, ++id);
                g_failed += reducing_case(pg, DDP__REDUCE, dt, op, cnt, ++id);
                g_failed += reducing_case(pg, DDP__REDUCE_SCATTER, dt, op, block, ++id);
                cases += 3;
            }
        for (int dt = 0; dt < DDP_NUM_DTYPES; dt++) {
            if (large && dt != DDP_FLOAT32 && dt != DDP_UINT8)
                continue;
            for (size_t k = 0; k < sizeof moving / sizeof moving[0]; k++) {
                int kind = moving[k];
                size_t c = kind == DDP__BROADCAST || kind == DDP__SEND ? cnt : block;
                g_failed += moving_case(pg, kind, (ddp_dtype)dt, c, ++id);
                cases++;
            }
        }
        CHECK(ddp_pg_barrier(pg) == 0, "barrier");
        cases++;
    }
    return cases;
}

/* Several async all-reduces in flight, a blocking broadcast behind them,
 * waited for out of order: each result as if run alone, in issue order. */
static void run_async(ddp_pg_t *pg)
{
    enum { K = 6, N = 100003 };
    float *bufs[K];
    ddp_work_t *w[K];
    for (int k = 0; k < K; k++) {
        bufs[k] = malloc(sizeof(float) * N);
        for (int i = 0; i < N; i++)
            bufs[k][i] = (float)(g_rank + 1) * (float)(k + 1) + (float)(i % 7);
        CHECK(ddp_pg_all_reduce_async(pg, bufs[k], N, DDP_FLOAT32, k % 2 ? DDP_MAX : DDP_SUM, &w[k]) == 0,
              "all_reduce_async %d", k);
    }
    int64_t token = g_rank == 0 ? 4242 : -1;
    CHECK(ddp_pg_broadcast(pg, &token, 1, DDP_INT64, 0) == 0 && token == 4242, "broadcast behind async");
    for (int k = K - 1; k >= 0; k--) {
        CHECK(ddp_work_wait(w[k], 30.0) == 0, "wait %d", k);
        int done = 0;
        CHECK(ddp_work_test(w[k], &done) == 0 && done, "test %d", k);
        ddp_work_destroy(w[k]);
        /* SUM: (k+1)(1+..+n) + n(i%7); MAX: n(k+1) + i%7 (exact in float) */
        for (int i = 0; i < N; i += 997) {
            float want = k % 2 ? (float)g_size * (float)(k + 1) + (float)(i % 7)
                               : (float)(k + 1) * (float)(g_size * (g_size + 1) / 2) +
                                     (float)g_size * (float)(i % 7);
            if (bufs[k][i] != want) {
                CHECK(0, "async %d element %d: %g, expected %g", k, i, bufs[k][i], want);
                break;
            }
        }
        free(bufs[k]);
    }
}

/* new_group of the even ranks (in reverse order), used between world ops. */
static void run_subgroup(ddp_pg_t *pg)
{
    int ranks[8], n = 0;
    for (int r = g_size - 1; r >= 0; r--)
        if (r % 2 == 0)
            ranks[n++] = r;
    ddp_pg_t *sub = NULL;
    CHECK(ddp_pg_new_group(pg, ranks, n, &sub) == 0, "new_group");
    CHECK((sub != NULL) == (g_rank % 2 == 0), "membership");
    if (sub) {
        int me = ddp_pg_rank(sub);
        CHECK(ddp_pg_size(sub) == n && ranks[me] == g_rank, "sub rank %d size %d", me,
              ddp_pg_size(sub));
        CHECK(strcmp(ddp_pg_backend(sub), "mpi") == 0, "backend name");
        int32_t v = g_rank, sum = 0;
        for (int i = 0; i < n; i++)
            sum += ranks[i];
        CHECK(ddp_pg_all_reduce(sub, &v, 1, DDP_INT32, DDP_SUM) == 0 && v == sum,
              "sub all_reduce %d != %d", v, sum);
        int32_t first = me == 0 ? g_rank : -1; /* sub rank 0 is the highest even rank */
        CHECK(ddp_pg_broadcast(sub, &first, 1, DDP_INT32, 0) == 0 && first == ranks[0],
              "sub broadcast %d", first);
    }
    int32_t w = 1;
    CHECK(ddp_pg_all_reduce(pg, &w, 1, DDP_INT32, DDP_SUM) == 0 && w == g_size, "world after sub");
    ddp_destroy_process_group(sub);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "matrix";
    ddp_pg_t *pg = NULL;
    /* "mixed": only the first rank asks for poll mode; the group must agree
     * on one mode (a blocking collective never matches a non-blocking one). */
    const char *wr = getenv("OMPI_COMM_WORLD_RANK") ? getenv("OMPI_COMM_WORLD_RANK")
                                                      : getenv("PMI_RANK");
    if (strcmp(mode, "mixed") == 0) {
        if (wr && strcmp(wr, "0") == 0)
            setenv("DDP_MPI_PROGRESS", "poll", 1);
        mode = "async";
    }
    double timeout = strcmp(mode, "timeout") == 0 ? 2.0 : 60.0;
    if (strcmp(mode, "mismatch") == 0) {
        /* a world size MPI does not have, then a rank that is not ours */
        int rc = ddp_init_process_group("mpi", "env://", 0, 99, 10.0, &pg);
        printf("size: %s: %s\n", ddp_err_name(rc), ddp_last_error());
        rc = ddp_init_process_group("mpi", NULL, 7, -1, 10.0, &pg);
        printf("rank: %s: %s\n", ddp_err_name(rc), ddp_last_error());
    }
    if (ddp_init_process_group("mpi", NULL, -1, -1, timeout, &pg) != 0) {
        fprintf(stderr, "init: %s\n", ddp_last_error());
        return 1;
    }
    g_rank = ddp_pg_rank(pg);
    g_size = ddp_pg_size(pg);
    double t0 = ddp_time_now();
    int cases = 0;
    if (strcmp(mode, "matrix") == 0) {
        cases = run_matrix(pg, argc > 2 && strcmp(argv[2], "big") == 0);
    } else if (strcmp(mode, "async") == 0) {
        run_async(pg);
    } else if (strcmp(mode, "subgroup") == 0) {
        run_subgroup(pg);
    } else if (strcmp(mode, "timeout") == 0) {
        float x = 1;
        if (g_rank == 1) { /* never joins: rank 0 must time out, not hang */
            sleep(6);
            _exit(0);
        }
        int rc = ddp_pg_all_reduce(pg, &x, 1, DDP_FLOAT32, DDP_SUM);
        printf("timeout: %s after %.1f s: %s\n", ddp_err_name(rc), ddp_time_now() - t0,
               ddp_last_error());
        rc = ddp_pg_barrier(pg);
        printf("after: %s: %s\n", ddp_err_name(rc), ddp_last_error());
        fflush(stdout);
        _exit(0); /* the communicator is abandoned: no MPI_Finalize */
    } else if (strcmp(mode, "mismatch") != 0) {
        fprintf(stderr, "unknown mode %s\n", mode);
        g_failed++;
    }
    if (g_failed == 0)
        fprintf(stderr, "rank %d: ok %d cases in %.2f s\n", g_rank, cases, ddp_time_now() - t0);
    ddp_destroy_process_group(pg);
    return g_failed ? 1 : 0;
}
