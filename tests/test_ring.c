/* The ring's staging window over TCP (reduce_scatter_ring.c): many units in
 * flight through 4 slots, 2, 3 and 5 ranks, odd sizes, a rank that starts
 * late, the all-reduce and the standalone reduce-scatter.  Every output is
 * checked bit for bit against the ring order of coll_ref.h, and the
 * transport's counters must show that no frame larger than the eager limit
 * was ever copied: receives are posted in the order the sender sends, so an
 * early frame waits in the kernel instead of going through a buffer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_ref.h"
#include "ddp/dist.h"
#include "dist/internal.h"
#include "dist_util.h"
#include "fork_children.h"
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

/* Block of element i when count is split into n near-equal blocks. */
static int block_of(size_t i, size_t count, int n)
{
    size_t base = count / (size_t)n, rem = count % (size_t)n;
    if (i < rem * (base + 1))
        return (int)(i / (base + 1));
    return (int)(rem + (i - rem * (base + 1)) / base);
}

static int check(const float *got, size_t count, uint64_t id, int n, int rank, int ring_block,
                 size_t first, const char *what)
{
    for (size_t i = 0; i < count; i++) {
        float want;
        int b = ring_block >= 0 ? ring_block : block_of(i, count, n);
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
    int rc = ddp_all_reduce(pg, buf, count, DDP_FLOAT32, DDP_SUM);
    if (rc != 0)
        fprintf(stderr, "rank %d: all_reduce of %zu: %s\n", r, count, ddp_last_error());
    rc = rc != 0 || check(buf, count, id, n, r, -1, 0, "all_reduce");
    free(buf);
    return rc;
}

static int reduce_scatter_case(ddp_pg_t *pg, uint64_t id, size_t count, int late)
{
    int n = ddp_pg_size(pg), r = ddp_pg_rank(pg);
    float *in = malloc(count * (size_t)n * 4 + 4), *out = malloc(count * 4 + 4);
    CHILD_CHECK(in && out);
    for (size_t i = 0; i < count * (size_t)n; i++)
        ref_input(&in[i], DDP_FLOAT32, DDP_SUM, id, r, i);
    if (late)
        sleep_s(0.2);
    int rc = ddp_reduce_scatter(pg, in, out, count, DDP_FLOAT32, DDP_SUM);
    if (rc != 0)
        fprintf(stderr, "rank %d: reduce_scatter of %zu: %s\n", r, count, ddp_last_error());
    rc = rc != 0 || check(out, count, id, n, r, r, (size_t)r * count, "reduce_scatter");
    free(in);
    free(out);
    return rc;
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
    ddp_pg_destroy(pg);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ring_2_ranks),
        cmocka_unit_test(test_ring_3_ranks),
        cmocka_unit_test(test_ring_5_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
