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
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/alloc.h"
#include "ddp.h"
#include "pg/internal.h"
#include "pg_util.h"
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
    unsigned id;
    return ddp__tp_sym_find(ddp__pg_transport(pg), p, len, &off, &id) != NULL;
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
    CHILD_CHECK(ddp_pg_barrier(pg) == 0); /* every rank has removed its region's name */
    CHILD_CHECK(group_entries(pg) == 0);
    for (size_t i = 0; i < bytes; i++)
        CHILD_CHECK(region[i] == 0);
    uint8_t *sym = region + c->offset * es, *plain = malloc(c->count * es);
    CHILD_CHECK(plain != NULL);
    for (int k = 0; k < c->rounds; k++) {
        fill(sym, c->dt, c->count, rank, k);
        fill(plain, c->dt, c->count, rank, k);
        CHILD_CHECK(ddp_pg_all_reduce(pg, sym, c->count, c->dt, c->op) == 0);
        /* Kept for the comparison, then overwritten at once, as a training
         * step overwrites its gradients: a peer still copying out of this
         * buffer would get these values. */
        uint8_t *got = malloc(c->count * es);
        CHILD_CHECK(got != NULL);
        memcpy(got, sym, c->count * es);
        memset(sym, 0x7f, c->count * es);
        CHILD_CHECK(ddp_pg_all_reduce(pg, plain, c->count, c->dt, c->op) == 0);
        int same = memcmp(got, plain, c->count * es) == 0;
        free(got);
        if (!same)
            fprintf(stderr, "rank %d round %d: symmetric result differs from private\n", rank, k);
        CHILD_CHECK(same);
    }
    ddp_pg_symmetric_free(pg, region);
    free(plain);
    ddp_destroy_process_group(pg);
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

/* ---- ranks whose buffers do not correspond: an error ---------------- */

enum { PRIVATE_ON_ONE, OTHER_OFFSET, OTHER_ALLOCATION };

/* Rank 1 passes private memory, or the same allocation at another offset,
 * or another allocation at the same offset; rank 0 the first allocation.
 * arg: {how, 1 when the all-reduce must fail}. */
static int mismatch_rank(int rank, void *arg)
{
    int how = ((const int *)arg)[0], must_fail = ((const int *)arg)[1];
    ddp_pg_t *pg;
    CHILD_CHECK(init_group(rank, 2, "shm", 10.0, &pg) == 0);
    CHILD_CHECK(ddp__pg_set_option(pg, "allreduce_algo", "shared") == 0);
    size_t count = 100000;
    float *a, *b, *plain = calloc(count, sizeof *plain);
    CHILD_CHECK(ddp_pg_symmetric_alloc(pg, (count + 16) * sizeof *a, (void **)&a) == 0);
    CHILD_CHECK(ddp_pg_symmetric_alloc(pg, (count + 16) * sizeof *b, (void **)&b) == 0);
    float *mine = rank == 0                 ? a
                  : how == PRIVATE_ON_ONE   ? plain
                  : how == OTHER_OFFSET     ? a + 16
                                            : b;
    int rc = ddp_pg_all_reduce(pg, mine, count, DDP_FLOAT32, DDP_SUM);
    CHILD_CHECK(must_fail ? rc < 0 : rc == 0);
    CHILD_CHECK(!must_fail || contains(ddp_last_error(), "runs a different collective"));
    CHILD_CHECK(!must_fail || contains(ddp_last_error(), "symmetric"));
    ddp_pg_symmetric_free(pg, b);
    ddp_pg_symmetric_free(pg, a);
    free(plain);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_mismatch_fails(void **state)
{
    (void)state;
    for (int how = PRIVATE_ON_ONE; how <= OTHER_ALLOCATION; how++) {
        int arg[2] = {how, 1};
        job_init(&J);
        assert_int_equal(run_children(2, mismatch_rank, arg, 30.0), 0);
        job_cleanup(&J);
    }
}

/* Below DDP_ALLREDUCE_SYMMETRIC_BYTES symmetric memory is staged like
 * private memory: the same buffers that fail above (another offset on
 * rank 1) make a valid all-reduce, and the bits match private memory. */
static void test_staged_below_threshold(void **state)
{
    (void)state;
    setenv("DDP_ALLREDUCE_SYMMETRIC_BYTES", "1048576", 1);
    run_allreduce((ar_case){2, 200003, 5, DDP_FLOAT32, DDP_AVG, 3}); /* 800 KB: staged */
    int arg[2] = {OTHER_OFFSET, 0};
    job_init(&J);
    assert_int_equal(run_children(2, mismatch_rank, arg, 30.0), 0);
    job_cleanup(&J);
    setenv("DDP_ALLREDUCE_SYMMETRIC_BYTES", "1", 1);
}

/* Ranks asking for different sizes: an error naming the rank. */
static int size_mismatch_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg;
    CHILD_CHECK(init_group(rank, 2, "shm", 10.0, &pg) == 0);
    void *p = NULL;
    CHILD_CHECK(ddp_pg_symmetric_alloc(pg, rank ? 8192 : 8000, &p) < 0);
    CHILD_CHECK(contains(ddp_last_error(), rank ? "rank 0 asks for 8000 bytes" : "rank 1 asks "
                                                                              "for 8192 bytes"));
    CHILD_CHECK(p == NULL);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_size_mismatch_fails(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(2, size_mismatch_rank, NULL, 30.0), 0);
    job_cleanup(&J);
}

/* ---- fallbacks -------------------------------------------------------- */

/* Rank 1's region name is taken before it allocates (as if /dev/shm
 * refused it), or rank 0 sets DDP_SYMMETRIC_MEMORY=0: every rank falls back
 * to private memory, which works. */
static int fallback_rank(int rank, void *arg)
{
    int knob = *(const int *)arg;
    ddp_pg_t *pg;
    CHILD_CHECK(init_group(rank, 2, "shm", 10.0, &pg) == 0);
    char taken[128] = "";
    if (knob && rank == 0)
        setenv("DDP_SYMMETRIC_MEMORY", "0", 1);
    if (!knob && rank == 1) {
        snprintf(taken, sizeof taken, "%s.m1.1", ddp__shm_debug_name(ddp__pg_transport(pg)));
        int fd = shm_open(taken, O_RDWR | O_CREAT | O_EXCL, 0600);
        CHILD_CHECK(fd >= 0);
        close(fd);
    }
    CHILD_CHECK(ddp_pg_barrier(pg) == 0);
    size_t count = 300000;
    float *p;
    CHILD_CHECK(ddp_pg_symmetric_alloc(pg, count * sizeof *p, (void **)&p) == 0);
    CHILD_CHECK(!is_symmetric(pg, p, count * sizeof *p));
    if (taken[0])
        shm_unlink(taken);
    unsetenv("DDP_SYMMETRIC_MEMORY");
    CHILD_CHECK(ddp_pg_barrier(pg) == 0);
    CHILD_CHECK(group_entries(pg) == 0); /* rank 0's region is gone too */
    for (size_t i = 0; i < count; i++)
        p[i] = (float)(rank + 1);
    CHILD_CHECK(ddp_pg_all_reduce(pg, p, count, DDP_FLOAT32, DDP_SUM) == 0);
    for (size_t i = 0; i < count; i++)
        CHILD_CHECK(p[i] == 3.0f);
    /* The next allocation is symmetric again. */
    float *q;
    CHILD_CHECK(ddp_pg_symmetric_alloc(pg, 4096, (void **)&q) == 0);
    CHILD_CHECK(is_symmetric(pg, q, 4096));
    ddp_pg_symmetric_free(pg, q);
    ddp_pg_symmetric_free(pg, p);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_fallback_when_a_rank_cannot(void **state)
{
    (void)state;
    for (int knob = 0; knob < 2; knob++) {
        job_init(&J);
        assert_int_equal(run_children(2, fallback_rank, &knob, 30.0), 0);
        job_cleanup(&J);
    }
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
    CHILD_CHECK(ddp_pg_all_reduce(pg, p, count, DDP_FLOAT32, DDP_SUM) == 0);
    CHILD_CHECK(p[0] == 3.0f && p[count - 1] == 3.0f);
    ddp_pg_symmetric_free(pg, p);
    ddp_destroy_process_group(pg);
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
    ddp_destroy_process_group(pg);
    job_cleanup(&J);
}

/* ---- a rank that dies in the middle of an allocation ------------------ */

/* Rank 1 creates its region's file, as its make step would, and dies:
 * rank 0 names it, and no file of the group is left in /dev/shm. */
static int dead_rank(int rank, void *arg)
{
    char *seg = arg; /* shared page: the segment's name, for the parent */
    ddp_pg_t *pg;
    CHILD_CHECK(init_group(rank, 2, "shm", 5.0, &pg) == 0);
    const char *name = ddp__shm_debug_name(ddp__pg_transport(pg));
    if (rank == 1) {
        char made[128];
        snprintf(made, sizeof made, "%s.m1.1", name);
        int fd = shm_open(made, O_RDWR | O_CREAT | O_EXCL, 0600);
        CHILD_CHECK(fd >= 0);
        _exit(0); /* gone without a word */
    }
    snprintf(seg, 64, "%s", name + 1);
    void *p = NULL;
    double t0 = ddp_time_now();
    CHILD_CHECK(ddp_pg_symmetric_alloc(pg, 1 << 20, &p) < 0);
    CHILD_CHECK(ddp_time_now() - t0 < 4.0);
    CHILD_CHECK(contains(ddp_last_error(), "rank 1"));
    CHILD_CHECK(contains(ddp_last_error(), "symmetric_alloc"));
    CHILD_CHECK(p == NULL);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_dead_peer_is_named(void **state)
{
    (void)state;
    char *seg = shared_page(64);
    job_init(&J);
    assert_int_equal(run_children(2, dead_rank, seg, 30.0), 0);
    job_cleanup(&J);
    assert_true(seg[0] != 0);
    assert_int_equal(shm_entries(seg), 0);
    munmap(seg, 64);
}

/* ---- the allocation and the group's queue ----------------------------- */

/* An allocation issued behind an async all-reduce on symmetric memory runs
 * after it (the executor's place is taken only once the queue is empty). */
static int queued_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg;
    CHILD_CHECK(init_group(rank, 3, "shm", 10.0, &pg) == 0);
    CHILD_CHECK(ddp__pg_set_option(pg, "allreduce_algo", "shared") == 0);
    size_t n = 1 << 20;
    float *a, *b;
    CHILD_CHECK(ddp_pg_symmetric_alloc(pg, n * sizeof *a, (void **)&a) == 0);
    for (int k = 0; k < 4; k++) {
        for (size_t i = 0; i < n; i++)
            a[i] = (float)(rank + 1);
        ddp_work_t *w;
        CHILD_CHECK(ddp_pg_all_reduce_async(pg, a, n, DDP_FLOAT32, DDP_SUM, &w) == 0);
        CHILD_CHECK(ddp_pg_symmetric_alloc(pg, 4096, (void **)&b) == 0);
        CHILD_CHECK(ddp_work_wait(w, 10) == 0);
        ddp_work_destroy(w);
        for (size_t i = 0; i < n; i++)
            CHILD_CHECK(a[i] == 6.0f);
        ddp_pg_symmetric_free(pg, b);
    }
    ddp_pg_symmetric_free(pg, a);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_alloc_behind_queued_work(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(3, queued_rank, NULL, 60.0), 0);
    job_cleanup(&J);
}

/* Frees on one thread while another runs blocking collectives inline: the
 * free waits for each to end, and is woken when it does. */
static ddp_pg_t *Racing;

static void *blocking_calls(void *arg)
{
    (void)arg;
    float x = 1;
    for (int i = 0; i < 2000; i++)
        if (ddp_pg_all_reduce(Racing, &x, 1, DDP_FLOAT32, DDP_SUM) < 0)
            return (void *)1;
    return NULL;
}

static int racing_rank(int rank, void *arg)
{
    (void)arg;
    CHILD_CHECK(init_group(rank, 2, "shm", 20.0, &Racing) == 0);
    pthread_t t;
    CHILD_CHECK(pthread_create(&t, NULL, blocking_calls, NULL) == 0);
    double t0 = ddp_time_now();
    for (int i = 0; i < 2000; i++)
        ddp_pg_symmetric_free(Racing, ddp__calloc_aligned(64)); /* private: freed */
    void *bad;
    pthread_join(t, &bad);
    CHILD_CHECK(bad == NULL);
    /* A free that missed its wake-up would sleep until the group's timeout
     * (20 s) and leak. */
    CHILD_CHECK(ddp_time_now() - t0 < 10.0);
    ddp_destroy_process_group(Racing);
    return 0;
}

static void test_free_beside_blocking_calls(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(2, racing_rank, NULL, 60.0), 0);
    job_cleanup(&J);
}

/* ---- /dev/shm too small ---------------------------------------------- */

/* In a mount namespace with a 16 MiB /dev/shm (the group's segment takes
 * about 6), two ranks ask for 8 MiB each (then big_ring_rank): one cannot have it, so both get
 * private memory that works, where a region reserved by ftruncate alone
 * would have been found full by SIGBUS at the first write. */
static int small_shm_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg;
    CHILD_CHECK(init_group(rank, 2, "shm", 10.0, &pg) == 0);
    size_t n = (8u << 20) / sizeof(float);
    float *p;
    CHILD_CHECK(ddp_pg_symmetric_alloc(pg, n * sizeof *p, (void **)&p) == 0);
    CHILD_CHECK(!is_symmetric(pg, p, n * sizeof *p));
    for (size_t i = 0; i < n; i++)
        p[i] = 1.0f;
    CHILD_CHECK(ddp_pg_all_reduce(pg, p, n, DDP_FLOAT32, DDP_SUM) == 0);
    CHILD_CHECK(p[0] == 2.0f && p[n - 1] == 2.0f);
    ddp_pg_symmetric_free(pg, p);
    ddp_destroy_process_group(pg);
    return 0;
}

/* The group's own segment does not fit (8 MiB rings: 34 MiB): rank 0, who
 * creates it, fails at setup with a message instead of a SIGBUS later. */
static int big_ring_rank(int rank, void *arg)
{
    (void)arg;
    setenv("DDP_SHM_RING_BYTES", "8388608", 1);
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(init_group(rank, 2, "shm", 2.0, &pg) < 0);
    CHILD_CHECK(rank != 0 || (contains(ddp_last_error(), "fallocate(") &&
                              contains(ddp_last_error(), "DDP_SHM_RING_BYTES")));
    return 0;
}

static void test_small_dev_shm(void **state)
{
    (void)state;
    pid_t pid = fork();
    if (pid == 0) {
        if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
            mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=16m") < 0)
            _exit(77); /* no mount namespace here (not root, or a container) */
        job_init(&J);
        int failed = run_children(2, small_shm_rank, NULL, 30.0);
        job_cleanup(&J);
        job_init(&J);
        failed += run_children(2, big_ring_rank, NULL, 30.0);
        job_cleanup(&J);
        _exit(failed ? 1 : 0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
        skip(); /* no mount namespace here (not root, or a container) */
    }
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
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
    ddp_data_parallel_options o = ddp_data_parallel_defaults();
    ddp_data_parallel_t *dm;
    CHILD_CHECK(ddp_data_parallel_create(m, pg, &o, &dm) == 0);
    for (size_t i = 0; i < ddp_model_num_params(m); i++) {
        const ddp_param *p = ddp_model_param(m, i);
        CHILD_CHECK(is_symmetric(pg, p->grad, (size_t)p->numel * sizeof(float)));
    }
    ddp_data_parallel_destroy(dm);
    ddp_model_destroy(m);
    ddp_destroy_process_group(pg);
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
    /* Symmetric memory in place from any size (by default from 32 MiB). */
    setenv("DDP_ALLREDUCE_SYMMETRIC_BYTES", "1", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allreduce_two_ranks),
        cmocka_unit_test(test_allreduce_more_ranks),
        cmocka_unit_test(test_mismatch_fails),
        cmocka_unit_test(test_staged_below_threshold),
        cmocka_unit_test(test_size_mismatch_fails),
        cmocka_unit_test(test_fallback_when_a_rank_cannot),
        cmocka_unit_test(test_tcp_gives_private_memory),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_dead_peer_is_named),
        cmocka_unit_test(test_alloc_behind_queued_work),
        cmocka_unit_test(test_free_beside_blocking_calls),
        cmocka_unit_test(test_small_dev_shm),
        cmocka_unit_test(test_ddp_buckets_are_symmetric),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
