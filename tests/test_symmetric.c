/* Symmetric memory (ddp_pg_symmetric_alloc, transport/symmetric.c) and the
 * shared-window all-reduce on it (coll/allreduce_shared.c), with forked
 * ranks on one host:
 *   - the memory is zeroed, shared (every rank maps every rank's region)
 *     and leaves no name in /dev/shm;
 *   - all-reduces on it (2-4 ranks, offsets, odd counts, SUM/AVG/MAX,
 *     float32 and bfloat16) give the bits of the same all-reduce on private
 *     memory, also when each rank rewrites its buffer right after the call
 *     (the call returns only once the peers stopped reading it);
 *   - ranks that pass symmetric memory on one side and private memory on
 *     the other fail with a message instead of mixing data;
 *   - a rank that cannot create its region makes every rank fall back to
 *     private memory, and all-reduces still work; over tcp the memory is
 *     private; a rank that dies before allocating is named;
 *   - DDP keeps its buckets in it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ddp.h"
#include "dist/internal.h"
#include "dist_util.h"
#include "fork_children.h"
#include "transport/shm.h"
#include "transport/transport.h"

static job J;

static int init_group(int rank, int n, const char *transport, double timeout, ddp_pg_t **pg)
{
    setenv("DDP_TRANSPORT", transport, 1);
    return ddp_init_process_group("tcp", J.url, rank, n, timeout, pg);
}

/* Is [p, p + len) symmetric memory of pg's transport? */
static int is_symmetric(ddp_pg_t *pg, const void *p, size_t len)
{
    size_t off;
    return ddp__tp_sym_find(ddp__pg_transport(pg), p, len, &off) != NULL;
}

/* /dev/shm entries named after this group's segment (its regions). */
static int group_entries(ddp_pg_t *pg)
{
    const char *name = ddp__shm_debug_name(ddp__pg_transport(pg));
    return name ? shm_entries(name + 1) : -1;
}

/* Rank r's value at element i of round k: a mix of ranks, positions and
 * magnitudes, so that the fold order shows in the last bits. */
static float value(int r, size_t i, int k)
{
    uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(r * 40503 + k * 977);
    h ^= h >> 13;
    return (float)((int)(h % 20001) - 10000) * (r % 2 ? 1e-3f : 0.7f);
}

static void fill(void *buf, ddp_dtype dt, size_t count, int r, int k)
{
    for (size_t i = 0; i < count; i++) {
        float v = value(r, i, k);
        if (dt == DDP_FLOAT32) {
            ((float *)buf)[i] = v;
        } else {
            uint32_t u;
            memcpy(&u, &v, 4);
            ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);
        }
    }
}

/* ---- all-reduce on symmetric memory = on private memory, bit for bit --- */

typedef struct ar_case {
    int n;
    size_t count, offset; /* elements, and where they start in the region */
    ddp_dtype dt;
    ddp_reduce_op op;
    int rounds;
} ar_case;

static int allreduce_rank(int rank, void *arg)
{
    const ar_case *c = arg;
    ddp_pg_t *pg;
    CHILD_CHECK(init_group(rank, c->n, "shm", 20.0, &pg) == 0);
    CHILD_CHECK(ddp__pg_set_option(pg, "allreduce_algo", "shared") == 0);
    size_t es = ddp_dtype_size(c->dt), bytes = (c->offset + c->count) * es;
    uint8_t *region;
    CHILD_CHECK(ddp_pg_symmetric_alloc(pg, bytes, (void **)&region) == 0);
    CHILD_CHECK(is_symmetric(pg, region, bytes));
    CHILD_CHECK(ddp_barrier(pg) == 0); /* every rank has removed its region's name */
    CHILD_CHECK(group_entries(pg) == 0);
    for (size_t i = 0; i < bytes; i++)
        CHILD_CHECK(region[i] == 0);
    uint8_t *sym = region + c->offset * es, *plain = malloc(c->count * es);
    CHILD_CHECK(plain != NULL);
    for (int k = 0; k < c->rounds; k++) {
        fill(sym, c->dt, c->count, rank, k);
        fill(plain, c->dt, c->count, rank, k);
        CHILD_CHECK(ddp_all_reduce(pg, sym, c->count, c->dt, c->op) == 0);
        /* Kept for the comparison, then overwritten at once, as a training
         * step overwrites its gradients: a peer still copying out of this
         * buffer would get these values. */
        uint8_t *got = malloc(c->count * es);
        CHILD_CHECK(got != NULL);
        memcpy(got, sym, c->count * es);
        memset(sym, 0x7f, c->count * es);
        CHILD_CHECK(ddp_all_reduce(pg, plain, c->count, c->dt, c->op) == 0);
        int same = memcmp(got, plain, c->count * es) == 0;
        free(got);
        if (!same)
            fprintf(stderr, "rank %d round %d: symmetric result differs from private\n", rank, k);
        CHILD_CHECK(same);
    }
    ddp_pg_symmetric_free(pg, region);
    free(plain);
    ddp_pg_destroy(pg);
    return 0;
}

static void run_allreduce(ar_case c)
{
    job_init(&J);
    assert_int_equal(run_children(c.n, allreduce_rank, &c, 60.0), 0);
    job_cleanup(&J);
}

static void test_allreduce_two_ranks(void **state)
{
    (void)state;
    /* Several 256 KiB chunks, an odd tail, not at the region's start. */
    run_allreduce((ar_case){2, (1u << 20) + 3, 5, DDP_FLOAT32, DDP_AVG, 30});
    run_allreduce((ar_case){2, 7, 0, DDP_FLOAT32, DDP_SUM, 3});
}

static void test_allreduce_more_ranks(void **state)
{
    (void)state;
    run_allreduce((ar_case){3, 200003, 17, DDP_FLOAT32, DDP_SUM, 5});
    run_allreduce((ar_case){4, 1023, 1, DDP_FLOAT32, DDP_MAX, 3});
    run_allreduce((ar_case){3, 100001, 3, DDP_BFLOAT16, DDP_AVG, 3});
}

/* ---- one rank in symmetric memory, the other not: an error ---------- */

static int mismatch_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg;
    CHILD_CHECK(init_group(rank, 2, "shm", 10.0, &pg) == 0);
    CHILD_CHECK(ddp__pg_set_option(pg, "allreduce_algo", "shared") == 0);
    size_t count = 100000;
    float *sym, *plain = calloc(count, sizeof *plain);
    CHILD_CHECK(ddp_pg_symmetric_alloc(pg, count * sizeof *sym, (void **)&sym) == 0);
    CHILD_CHECK(ddp_all_reduce(pg, rank ? plain : sym, count, DDP_FLOAT32, DDP_SUM) < 0);
    CHILD_CHECK(contains(ddp_last_error(), "runs a different collective"));
    CHILD_CHECK(contains(ddp_last_error(), "symmetric memory"));
    ddp_pg_symmetric_free(pg, sym);
    free(plain);
    ddp_pg_destroy(pg);
    return 0;
}

static void test_mismatch_fails(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(2, mismatch_rank, NULL, 30.0), 0);
    job_cleanup(&J);
}

/* ---- fallbacks -------------------------------------------------------- */

/* Rank 1's region name is taken before it allocates (as if /dev/shm
 * refused it): every rank falls back to private memory, which works. */
static int fallback_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg;
    CHILD_CHECK(init_group(rank, 2, "shm", 10.0, &pg) == 0);
    char taken[128] = "";
    if (rank == 1) {
        snprintf(taken, sizeof taken, "%s.m1.1", ddp__shm_debug_name(ddp__pg_transport(pg)));
        int fd = shm_open(taken, O_RDWR | O_CREAT | O_EXCL, 0600);
        CHILD_CHECK(fd >= 0);
        close(fd);
    }
    CHILD_CHECK(ddp_barrier(pg) == 0);
    size_t count = 300000;
    float *p;
    CHILD_CHECK(ddp_pg_symmetric_alloc(pg, count * sizeof *p, (void **)&p) == 0);
    CHILD_CHECK(!is_symmetric(pg, p, count * sizeof *p));
    if (rank == 1)
        shm_unlink(taken);
    CHILD_CHECK(ddp_barrier(pg) == 0);
    CHILD_CHECK(group_entries(pg) == 0); /* rank 0's region is gone too */
    for (size_t i = 0; i < count; i++)
        p[i] = (float)(rank + 1);
    CHILD_CHECK(ddp_all_reduce(pg, p, count, DDP_FLOAT32, DDP_SUM) == 0);
    for (size_t i = 0; i < count; i++)
        CHILD_CHECK(p[i] == 3.0f);
    /* The next allocation is symmetric again. */
    float *q;
    CHILD_CHECK(ddp_pg_symmetric_alloc(pg, 4096, (void **)&q) == 0);
    CHILD_CHECK(is_symmetric(pg, q, 4096));
    ddp_pg_symmetric_free(pg, q);
    ddp_pg_symmetric_free(pg, p);
    ddp_pg_destroy(pg);
    return 0;
}

static void test_fallback_when_a_rank_cannot(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(2, fallback_rank, NULL, 30.0), 0);
    job_cleanup(&J);
}

static int tcp_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg;
    CHILD_CHECK(init_group(rank, 2, "tcp", 10.0, &pg) == 0);
    size_t count = 70000;
    float *p;
    CHILD_CHECK(ddp_pg_symmetric_alloc(pg, count * sizeof *p, (void **)&p) == 0);
    CHILD_CHECK(!is_symmetric(pg, p, count * sizeof *p));
    for (size_t i = 0; i < count; i++)
        CHILD_CHECK(p[i] == 0.0f);
    for (size_t i = 0; i < count; i++)
        p[i] = (float)(rank + 1);
    CHILD_CHECK(ddp_all_reduce(pg, p, count, DDP_FLOAT32, DDP_SUM) == 0);
    CHILD_CHECK(p[0] == 3.0f && p[count - 1] == 3.0f);
    ddp_pg_symmetric_free(pg, p);
    ddp_pg_destroy(pg);
    return 0;
}

static void test_tcp_gives_private_memory(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(2, tcp_rank, NULL, 30.0), 0);
    job_cleanup(&J);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    void *p = (void *)1;
    assert_true(ddp_pg_symmetric_alloc(NULL, 16, &p) < 0);
    assert_true(contains(ddp_last_error(), "NULL argument"));
    job_init(&J);
    ddp_pg_t *pg;
    assert_int_equal(init_group(0, 1, "shm", 5.0, &pg), 0);
    assert_true(ddp_pg_symmetric_alloc(pg, 0, &p) < 0);
    assert_true(contains(ddp_last_error(), "0 bytes"));
    assert_null(p);
    assert_int_equal(ddp_pg_symmetric_alloc(pg, 100, &p), 0); /* a group of one: private */
    assert_non_null(p);
    ddp_pg_symmetric_free(pg, p);
    ddp_pg_symmetric_free(pg, NULL);
    ddp_pg_destroy(pg);
    job_cleanup(&J);
}

/* ---- a rank that dies instead of allocating --------------------------- */

static int dead_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg;
    CHILD_CHECK(init_group(rank, 2, "shm", 5.0, &pg) == 0);
    if (rank == 1)
        _exit(0); /* gone without a word */
    void *p = NULL;
    double t0 = ddp_time_now();
    CHILD_CHECK(ddp_pg_symmetric_alloc(pg, 1 << 20, &p) < 0);
    CHILD_CHECK(ddp_time_now() - t0 < 4.0);
    CHILD_CHECK(contains(ddp_last_error(), "rank 1"));
    CHILD_CHECK(contains(ddp_last_error(), "symmetric_alloc"));
    CHILD_CHECK(p == NULL);
    ddp_pg_destroy(pg);
    return 0;
}

static void test_dead_peer_is_named(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(2, dead_rank, NULL, 30.0), 0);
    job_cleanup(&J);
}

/* ---- DDP keeps its buckets there ---------------------------------------- */

static int ddp_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg;
    CHILD_CHECK(init_group(rank, 2, "shm", 10.0, &pg) == 0);
    ddp_module_t *mods[3];
    CHILD_CHECK(ddp_linear_create(64, 512, 1, 1, &mods[0]) == 0);
    CHILD_CHECK(ddp_relu_create(&mods[1]) == 0);
    CHILD_CHECK(ddp_linear_create(512, 10, 1, 2, &mods[2]) == 0);
    ddp_module_t *seq;
    CHILD_CHECK(ddp_sequential_create(mods, 3, &seq) == 0);
    ddp_model_t *m;
    CHILD_CHECK(ddp_model_from_module(seq, &m) == 0);
    ddp_ddp_options o = ddp_ddp_defaults();
    ddp_ddp_t *dm;
    CHILD_CHECK(ddp_ddp_create(m, pg, &o, &dm) == 0);
    for (size_t i = 0; i < ddp_model_num_params(m); i++) {
        const ddp_param *p = ddp_model_param(m, i);
        CHILD_CHECK(is_symmetric(pg, p->grad, (size_t)p->numel * sizeof(float)));
    }
    ddp_ddp_destroy(dm);
    ddp_model_destroy(m);
    ddp_pg_destroy(pg);
    return 0;
}

static void test_ddp_buckets_are_symmetric(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(2, ddp_rank, NULL, 30.0), 0);
    job_cleanup(&J);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allreduce_two_ranks),
        cmocka_unit_test(test_allreduce_more_ranks),
        cmocka_unit_test(test_mismatch_fails),
        cmocka_unit_test(test_fallback_when_a_rank_cannot),
        cmocka_unit_test(test_tcp_gives_private_memory),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_dead_peer_is_named),
        cmocka_unit_test(test_ddp_buckets_are_symmetric),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
