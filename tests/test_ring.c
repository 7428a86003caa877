/* The ring's staging window over TCP (reduce_scatter_ring.c): many units in
 * flight through 4 slots, 2, 3 and 5 ranks, odd sizes, a rank that starts
 * late, the all-reduce and the standalone reduce-scatter.  Every output is
 * checked bit for bit against the ring order of coll_ref.h, and the
 * transport's counters must show that no frame larger than the eager limit
 * was ever copied: receives are posted in the order the sender sends, so an
 * early frame waits in the kernel instead of going through a buffer.
 *
 * The standalone reduce-scatter's scratch bound (3, 4 and 5 ranks, over tcp
 * and shm): the collective layer runs straight over a transport, with a
 * window of a few units so that a block takes several groups and every
 * partial place is reused many times; the group's scratch must stay within
 * the bound the file header states, whatever the count. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll/coll.h"
#include "coll_ref.h"
#include "ddp/pg.h"
#include "ddp/store.h"
#include "pg/internal.h"
#include "pg_util.h"
#include "fork_children.h"
#include "transport/shm.h"
#include "transport/tcp.h"

#define CHUNK (128u << 10) /* above the transport's 64 KiB eager limit */
#define UNIT_FLOATS (CHUNK / 4)

typedef struct ring_arg {
    job j;
    int n;
    int late_rank; /* starts its collectives 0.2 s late, or -1 */
} ring_arg;

static int sanitizer(void)
{
    const char *s = getenv("DDP_TEST_SANITIZER");
    return s && *s == '1';
}

static int check(const float *got, size_t count, uint64_t id, int n, int rank, int ring_block,
                 size_t first, const char *what)
{
    for (size_t i = 0; i < count; i++) {
        float want;
        int b = ring_block >= 0 ? ring_block : (int)ring_block_of(i, count, n);
        ref_reduce(&want, DDP_FLOAT32, DDP_SUM, id, n, first + i, ORDER_RING, b);
        if (memcmp(&want, &got[i], 4) != 0) {
            fprintf(stderr, "rank %d: %s case %llu: element %zu is %a, expected %a\n", rank, what,
                    (unsigned long long)id, i, (double)got[i], (double)want);
            return 1;
        }
    }
    return 0;
}

static int all_reduce_case(ddp_pg_t *pg, uint64_t id, size_t count, int late)
{
    int n = ddp_pg_size(pg), r = ddp_pg_rank(pg);
    float *buf = malloc(count * 4 + 4);
    CHILD_CHECK(buf);
    for (size_t i = 0; i < count; i++)
        ref_input(&buf[i], DDP_FLOAT32, DDP_SUM, id, r, i);
    if (late)
        sleep_s(0.2);
    int rc = ddp_pg_all_reduce(pg, buf, count, DDP_FLOAT32, DDP_SUM);
    if (rc != 0)
        fprintf(stderr, "rank %d: all_reduce of %zu: %s\n", r, count, ddp_last_error());
    rc = rc != 0 || check(buf, count, id, n, r, -1, 0, "all_reduce");
    free(buf);
    return rc;
}

/* One reduce-scatter of count elements per rank, run by run(arg, ...) (a
 * process group's or the collective layer's), checked bit for bit against
 * the ring order. */
typedef int (*rs_fn)(void *arg, const float *in, float *out, size_t count);

static int rs_check(rs_fn run, void *arg, int n, int r, uint64_t id, size_t count, int late)
{
    float *in = malloc(count * (size_t)n * 4 + 4), *out = malloc(count * 4 + 4);
    CHILD_CHECK(in && out);
    for (size_t i = 0; i < count * (size_t)n; i++)
        ref_input(&in[i], DDP_FLOAT32, DDP_SUM, id, r, i);
    if (late)
        sleep_s(0.2);
    int rc = run(arg, in, out, count);
    if (rc != 0)
        fprintf(stderr, "rank %d: reduce_scatter of %zu: %s\n", r, count, ddp_last_error());
    rc = rc != 0 || check(out, count, id, n, r, r, (size_t)r * count, "reduce_scatter");
    free(in);
    free(out);
    return rc;
}

static int pg_reduce_scatter(void *pg, const float *in, float *out, size_t count)
{
    return ddp_pg_reduce_scatter(pg, in, out, count, DDP_FLOAT32, DDP_SUM);
}

static int reduce_scatter_case(ddp_pg_t *pg, uint64_t id, size_t count, int late)
{
    return rs_check(pg_reduce_scatter, pg, ddp_pg_size(pg), ddp_pg_rank(pg), id, count, late);
}

static int ring_rank(int rank, void *p)
{
    ring_arg *a = p;
    ddp_pg_t *pg = NULL;
    setenv("DDP_TRANSPORT", "tcp", 1);
    CHILD_CHECK(ddp_init_process_group("tcp", a->j.url, rank, a->n, 60.0, &pg) == 0);
    CHILD_CHECK(ddp__pg_set_option(pg, "allreduce_algo", "ring") == 0);
    char chunk[32];
    snprintf(chunk, sizeof chunk, "%u", CHUNK);
    CHILD_CHECK(ddp__pg_set_option(pg, "chunk_bytes", chunk) == 0);
    int late = rank == a->late_rank, failed = 0;
    size_t units = sanitizer() ? 3 : 12; /* per block: several windows' worth */
    /* Whole units only: no frame at or under the eager limit, so every early
     * frame must be held, never copied. */
    failed += all_reduce_case(pg, 1, units * UNIT_FLOATS * (size_t)a->n, late);
    failed += reduce_scatter_case(pg, 2, units * UNIT_FLOATS, late);
    ddp__tcp_stats st;
    CHILD_CHECK(ddp__tcp_debug_stats(ddp__pg_transport(pg), &st) == 0);
    if (st.copied_frames != 0) {
        fprintf(stderr, "rank %d: %llu frames (%llu bytes) were copied, expected none\n", rank,
                (unsigned long long)st.copied_frames, (unsigned long long)st.copied_bytes);
        failed++;
    }
    /* Odd sizes: short blocks, short last units, empty units. */
    size_t odd[] = {1, 7, (size_t)a->n * UNIT_FLOATS + 3, sanitizer() ? 65539 : (1u << 20) + 3};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        failed += all_reduce_case(pg, 10 + i, odd[i], late && i == 2);
        failed += reduce_scatter_case(pg, 20 + i, odd[i], late && i == 3);
    }
    ddp_destroy_process_group(pg);
    return failed;
}

static void run_ring(int n, int late_rank)
{
    ring_arg a = {.n = n, .late_rank = late_rank};
    job_init(&a.j);
    assert_int_equal(run_children(n, ring_rank, &a, 300.0), 0);
    job_cleanup(&a.j);
}

static void test_ring_2_ranks(void **state)
{
    (void)state;
    run_ring(2, 1);
}

static void test_ring_3_ranks(void **state)
{
    (void)state;
    run_ring(3, 0);
}

static void test_ring_5_ranks(void **state)
{
    (void)state;
    run_ring(5, 2);
}

/* ---- the standalone reduce-scatter's scratch bound ---------------------- */

/* Transports of the bound tests.  Over shm, a large send completes only
 * once the receiver takes it: by cross-memory attach (the receiver pulls it
 * into a posted receive: a rendezvous), or through a ring smaller than one
 * unit (the sender waits for the receiver to drain it). */
enum { RS_TCP, RS_SHM_CMA, RS_SHM_SMALL_RING };

typedef struct rs_arg {
    job j;
    int n;
    int late_rank;   /* starts the big cases 0.2 s late, or -1 */
    int mode;        /* RS_* */
    size_t window;   /* ctx->ring_window, bytes */
} rs_arg;

/* A reduce-scatter through the collective layer (ctx->seq, deadline). */
static int coll_reduce_scatter(void *ctx, const float *in, float *out, size_t count)
{
    ddp__coll_ctx *c = ctx;
    ddp__coll_args a = {.kind = DDP__REDUCE_SCATTER, .send = in, .recv = out, .count = count,
                        .dtype = DDP_FLOAT32, .op = DDP_SUM};
    c->seq++;
    c->deadline = ddp_time_now() + 60.0;
    return ddp__coll_run(c, &a);
}

static int rs_case(ddp__coll_ctx *c, uint64_t id, size_t count, int late)
{
    return rs_check(coll_reduce_scatter, c, c->size, c->rank, id, count, late);
}

static int rs_rank(int rank, void *p)
{
    rs_arg *a = p;
    ddp_store_t *st = NULL;
    ddp__tp *tp = NULL;
    ddp__coll_ctx c;
    CHILD_CHECK(ddp_store_file_create(a->j.path, a->n, &st) == 0);
    if (a->mode == RS_TCP) {
        CHILD_CHECK(ddp__tcp_create(st, "rs/", rank, a->n, 30.0, &tp) == 0);
    } else {
        setenv("DDP_SHM_CMA", a->mode == RS_SHM_CMA ? "1" : "0", 1);
        setenv("DDP_SHM_RING_BYTES", a->mode == RS_SHM_SMALL_RING ? "65536" : "1048576", 1);
        CHILD_CHECK(ddp__shm_create(st, "rs/", rank, a->n, 30.0, &tp) == 0);
    }
    CHILD_CHECK(ddp__coll_ctx_init(&c, rank, a->n) == 0);
    c.tp = tp;
    c.chunk = CHUNK;
    c.ring_window = a->window;
    int late = rank == a->late_rank, failed = 0;
    /* Whole units, many windows' worth (a block of 12 units against a
     * window of 4: 3 groups, every partial place reused), then odd sizes:
     * a short last unit and group, a block shorter than the window, tiny. */
    size_t units = sanitizer() ? 6 : 12;
    failed += rs_case(&c, 30, units * UNIT_FLOATS, late);
    failed += rs_case(&c, 31, units * UNIT_FLOATS, 0);
    ddp__tcp_stats ts;
    if (a->mode == RS_TCP) {
        CHILD_CHECK(ddp__tcp_debug_stats(tp, &ts) == 0);
        if (ts.copied_frames != 0) {
            fprintf(stderr, "rank %d: %llu frames (%llu bytes) were copied, expected none\n",
                    rank, (unsigned long long)ts.copied_frames,
                    (unsigned long long)ts.copied_bytes);
            failed++;
        }
    }
    size_t odd[] = {(units - 1) * UNIT_FLOATS + 3, 2 * UNIT_FLOATS + 1, 7, 1};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++)
        failed += rs_case(&c, 32 + i, odd[i], late && i == 0);
    /* The bound (reduce_scatter_ring.c): at most window + 1 staging slots
     * and as many partial places of one unit each, however large the count
     * and the group.  Before it, the partials took a block per step but the
     * last and the slots a block: (n - 1) blocks. */
    size_t w = a->window / CHUNK ? a->window / CHUNK : 1;
    size_t bound = 2 * (w + 1) * CHUNK;
    if (c.scratch_len == 0 || c.scratch_len > bound) {
        fprintf(stderr, "rank %d of %d: scratch %zu bytes, bound %zu (window %zu)\n", rank,
                a->n, c.scratch_len, bound, a->window);
        failed++;
    }
    ddp__coll_ctx_free(&c);
    ddp__tp_destroy(tp);
    ddp_store_destroy(st);
    return failed;
}

static void run_rs(int n, int mode, int late_rank, size_t window)
{
    rs_arg a = {.n = n, .late_rank = late_rank, .mode = mode, .window = window};
    job_init(&a.j);
    assert_int_equal(run_children(n, rs_rank, &a, 120.0), 0);
    job_cleanup(&a.j);
}

static void test_rs_bound_3_ranks(void **state)
{
    (void)state;
    run_rs(3, RS_TCP, 1, 4 * CHUNK);
    run_rs(3, RS_SHM_CMA, 2, 4 * CHUNK);
}

static void test_rs_bound_4_ranks(void **state)
{
    (void)state;
    run_rs(4, RS_TCP, 0, 4 * CHUNK);
    run_rs(4, RS_SHM_SMALL_RING, 3, 4 * CHUNK);
}

static void test_rs_bound_5_ranks(void **state)
{
    (void)state;
    run_rs(5, RS_TCP, 2, 4 * CHUNK);
    run_rs(5, RS_SHM_CMA, 0, 4 * CHUNK);
    run_rs(5, RS_SHM_SMALL_RING, 4, 4 * CHUNK);
}

/* A window of one unit: groups of one, unit by unit through every step
 * (the tightest schedule: 2 slots and 2 partial places). */
static void test_rs_window_one_unit(void **state)
{
    (void)state;
    run_rs(4, RS_TCP, 1, CHUNK);
    run_rs(4, RS_SHM_CMA, 2, CHUNK);
    run_rs(4, RS_SHM_SMALL_RING, 3, CHUNK);
}

/* A malformed window is refused when the group is created, with its name. */
static void test_rs_window_env(void **state)
{
    (void)state;
    job j;
    job_init(&j);
    setenv("DDP_TRANSPORT", "tcp", 1);
    setenv("DDP_RING_WINDOW_BYTES", "0", 1);
    ddp_pg_t *pg = NULL;
    assert_int_equal(ddp_init_process_group("tcp", j.url, 0, 1, 5.0, &pg), DDP_ERR_INVALID_ARG);
    const char *msg = "DDP_RING_WINDOW_BYTES=0: expected a size in bytes from 1 to 1 TiB";
    if (!contains(ddp_last_error(), msg))
        fail_msg("expected '%s' in '%s'", msg, ddp_last_error());
    ddp__coll_ctx c;
    setenv("DDP_RING_WINDOW_BYTES", "262144", 1);
    assert_int_equal(ddp__coll_ctx_init(&c, 0, 3), 0);
    assert_int_equal(c.ring_window, 262144);
    unsetenv("DDP_RING_WINDOW_BYTES");
    assert_int_equal(ddp__coll_ctx_init(&c, 0, 3), 0);
    assert_int_equal(c.ring_window, 4u << 20);
    unsetenv("DDP_TRANSPORT");
    job_cleanup(&j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_2_ranks),
        cmocka_unit_test(test_ring_3_ranks),
        cmocka_unit_test(test_ring_5_ranks),
        cmocka_unit_test(test_rs_bound_3_ranks),
        cmocka_unit_test(test_rs_bound_4_ranks),
        cmocka_unit_test(test_rs_bound_5_ranks),
        cmocka_unit_test(test_rs_window_one_unit),
        cmocka_unit_test(test_rs_window_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
