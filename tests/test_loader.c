/* Tests of the DataLoader (src/data/loader.c): every sample exactly once per
 * epoch, shuffles that differ by epoch and repeat by seed, identical batches
 * for 0..4 workers, drop_last, int32 labels, errors from the dataset, a stuck
 * worker and the timeout, a new epoch and destroy while workers are busy (no hang; ASan
 * checks for leaks), and the real Fashion-MNIST set end to end. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdatomic.h>
#include <time.h>

#include "data_fixture.h"

/* Sample i: x[j] = i * 16 + j (exact in float), label i % 7.  Optionally
 * slow (sleep_us per sample), failing at fail_at, or stuck at block_at. */
typedef struct synth {
    size_t n, numel;
    atomic_long sleep_us; /* changed while workers run */
    size_t fail_at, block_at;
    long block_us;
    atomic_int blocked; /* block_at blocks only once */
    atomic_long gets;
} synth;

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static size_t synth_len(void *self) { return ((synth *)self)->n; }

static int synth_get(void *self, size_t i, float *x, int64_t *y)
{
    synth *s = self;
    atomic_fetch_add(&s->gets, 1);
    long us = atomic_load(&s->sleep_us);
    if (us)
        sleep_us(us);
    if (i == s->block_at && atomic_exchange(&s->blocked, 1) == 0)
        sleep_us(s->block_us);
    if (i == s->fail_at)
        return DDP_ERR_IO;
    for (size_t j = 0; j < s->numel; j++)
        x[j] = (float)(i * 16 + j);
    *y = (int64_t)(i % 7);
    return 0;
}

static const ddp_dataset_ops synth_ops = {.length = synth_len, .get = synth_get};

static ddp_dataset_t *synth_create(synth *s, size_t n, size_t numel)
{
    memset(s, 0, sizeof *s);
    atomic_init(&s->sleep_us, 0);
    atomic_init(&s->gets, 0);
    atomic_init(&s->blocked, 0);
    s->n = n;
    s->numel = numel;
    s->fail_at = s->block_at = SIZE_MAX;
    ddp_dataset_t *ds;
    assert_int_equal(ddp_dataset_create(&synth_ops, s, numel, &ds), 0);
    return ds;
}

static ddp_loader_t *loader(ddp_dataset_t *ds, size_t batch, int shuffle, int workers,
                            uint64_t seed, int drop_last)
{
    ddp_loader_options o = ddp_loader_defaults();
    o.batch_size = batch;
    o.shuffle = shuffle;
    o.num_workers = workers;
    o.seed = seed;
    o.drop_last = drop_last;
    o.pin_memory = 1; /* accepted, no effect */
    ddp_loader_t *dl;
    int rc = ddp_loader_create(ds, &o, &dl);
    if (rc != 0)
        fail_msg("%s", ddp_last_error());
    return dl;
}

/* Runs one epoch; records the sample order into order (n entries) and
 * checks each sample's features and label against its index. */
static size_t run_epoch(ddp_loader_t *dl, uint64_t epoch, size_t numel, size_t *order,
                        size_t *sizes)
{
    ddp_batch b;
    int rc;
    size_t seen = 0, k = 0;
    assert_int_equal(ddp_loader_epoch_begin(dl, epoch), 0);
    while ((rc = ddp_loader_next(dl, &b)) == 1) {
        assert_int_equal(b.index, k);
        assert_int_equal(b.sample_numel, numel);
        assert_int_equal((uintptr_t)b.x % 64, 0);
        if (sizes)
            sizes[k] = b.size;
        for (size_t i = 0; i < b.size; i++) {
            size_t idx = (size_t)b.x[i * numel] / 16;
            for (size_t j = 0; j < numel; j++)
                assert_true(b.x[i * numel + j] == (float)(idx * 16 + j));
            assert_int_equal(b.y64[i], (int64_t)(idx % 7));
            order[seen++] = idx;
        }
        k++;
    }
    assert_int_equal(rc, 0);
    assert_int_equal(k, ddp_loader_length(dl));
    assert_int_equal(ddp_loader_next(dl, &b), 0); /* stays at the end */
    return seen;
}

static void test_each_sample_once(void **state)
{
    (void)state;
    enum { N = 1000, D = 5 };
    synth s;
    ddp_dataset_t *ds = synth_create(&s, N, D);
    static size_t order[N];
    for (int w = 0; w <= 4; w++) {
        ddp_loader_t *dl = loader(ds, 64, 1, w, 3, 0);
        assert_int_equal(ddp_loader_length(dl), 16);
        for (uint64_t e = 0; e < 2; e++) {
            size_t sizes[16];
            assert_int_equal(run_epoch(dl, e, D, order, sizes), N);
            char seen[N] = {0};
            for (size_t i = 0; i < N; i++) {
                assert_false(seen[order[i]]);
                seen[order[i]] = 1;
            }
            assert_int_equal(sizes[0], 64);
            assert_int_equal(sizes[15], N - 15 * 64);
        }
        ddp_loader_destroy(dl);
    }
    ddp_dataset_destroy(ds);
}

static void test_shuffle_by_epoch_and_seed(void **state)
{
    (void)state;
    enum { N = 500 };
    synth s;
    ddp_dataset_t *ds = synth_create(&s, N, 1);
    static size_t a0[N], a1[N], b0[N], b1[N], c0[N], seq[N];
    ddp_loader_t *a = loader(ds, 32, 1, 2, 11, 0), *b = loader(ds, 32, 1, 0, 11, 0);
    ddp_loader_t *c = loader(ds, 32, 1, 1, 12, 0), *q = loader(ds, 32, 0, 3, 11, 0);
    run_epoch(a, 0, 1, a0, NULL);
    run_epoch(a, 1, 1, a1, NULL);
    run_epoch(b, 1, 1, b1, NULL); /* epoch 1 first: depends on the epoch only */
    run_epoch(b, 0, 1, b0, NULL);
    run_epoch(c, 0, 1, c0, NULL);
    run_epoch(q, 0, 1, seq, NULL);
    assert_memory_not_equal(a0, a1, sizeof a0);
    assert_memory_equal(a0, b0, sizeof a0);
    assert_memory_equal(a1, b1, sizeof a1);
    assert_memory_not_equal(a0, c0, sizeof a0);
    for (size_t i = 0; i < N; i++)
        assert_int_equal(seq[i], i);
    /* The order is the random sampler's for the same seed and epoch. */
    ddp_sampler_t *rs;
    static size_t perm[N];
    assert_int_equal(ddp_sampler_random_create(N, 11, &rs), 0);
    ddp_sampler_set_epoch(rs, 1);
    ddp_sampler_fill(rs, perm);
    assert_memory_equal(perm, a1, sizeof perm);
    ddp_sampler_destroy(rs);
    ddp_loader_destroy(a);
    ddp_loader_destroy(b);
    ddp_loader_destroy(c);
    ddp_loader_destroy(q);
    ddp_dataset_destroy(ds);
}

/* Batches compared byte for byte across worker counts, on generated MNIST
 * files (the dataset's own get_batch path), int32 labels. */
static void test_identical_batches_for_any_workers(void **state)
{
    (void)state;
    char *dir = fx_mkdtemp();
    fx_write_split(dir, "train", 1, 300, 28, 28, 10);
    ddp_dataset_t *ds;
    assert_int_equal(ddp_mnist_create(dir, NULL, &ds), 0);
    enum { B = 32, BATCHES = 10, PER_EPOCH = 300 * 784 };
    static float ref_x[2][PER_EPOCH];
    static int32_t ref_y[2][300];
    for (int w = 0; w <= 4; w++) {
        ddp_loader_options o = ddp_loader_defaults();
        o.batch_size = B;
        o.shuffle = 1;
        o.seed = 99;
        o.num_workers = w;
        o.prefetch_factor = w == 3 ? 1 : 4; /* a ring of 3 too */
        o.label_type = DDP_LABEL_INT32;
        ddp_loader_t *dl;
        assert_int_equal(ddp_loader_create(ds, &o, &dl), 0);
        assert_int_equal(ddp_loader_length(dl), BATCHES);
        for (int e = 0; e < 2; e++) {
            assert_int_equal(ddp_loader_epoch_begin(dl, (uint64_t)e), 0);
            ddp_batch b;
            size_t off = 0;
            while (ddp_loader_next(dl, &b) == 1) {
                assert_null(b.y64);
                assert_non_null(b.y32);
                if (w == 0) {
                    memcpy(ref_x[e] + off * 784, b.x, b.size * 784 * sizeof(float));
                    memcpy(ref_y[e] + off, b.y32, b.size * sizeof(int32_t));
                } else {
                    assert_memory_equal(ref_x[e] + off * 784, b.x,
                                        b.size * 784 * sizeof(float));
                    assert_memory_equal(ref_y[e] + off, b.y32, b.size * sizeof(int32_t));
                }
                off += b.size;
            }
            assert_int_equal(off, 300);
        }
        ddp_loader_destroy(dl);
    }
    /* Epochs 0 and 1 differ; labels are i % 10 of pixel rows fx_pixel(i, .). */
    assert_memory_not_equal(ref_y[0], ref_y[1], sizeof ref_y[0]);
    ddp_dataset_destroy(ds);
    fx_rmdir(dir);
}

static void test_drop_last(void **state)
{
    (void)state;
    synth s;
    ddp_dataset_t *ds = synth_create(&s, 100, 2);
    static size_t order[100];
    for (int w = 0; w <= 2; w += 2) {
        ddp_loader_t *dl = loader(ds, 30, 1, w, 0, 1);
        assert_int_equal(ddp_loader_length(dl), 3);
        size_t sizes[3];
        assert_int_equal(run_epoch(dl, 0, 2, order, sizes), 90);
        assert_int_equal(sizes[2], 30);
        ddp_loader_destroy(dl);
        dl = loader(ds, 30, 0, w, 0, 0);
        size_t sizes4[4];
        assert_int_equal(ddp_loader_length(dl), 4);
        assert_int_equal(run_epoch(dl, 0, 2, order, sizes4), 100);
        assert_int_equal(sizes4[3], 10);
        ddp_loader_destroy(dl);
    }
    /* Fewer samples than a batch. */
    ddp_loader_t *dl = loader(ds, 128, 0, 1, 0, 1);
    assert_int_equal(ddp_loader_length(dl), 0);
    assert_int_equal(run_epoch(dl, 0, 2, order, NULL), 0);
    ddp_loader_destroy(dl);
    ddp_dataset_destroy(ds);
}

static void test_with_distributed_sampler(void **state)
{
    (void)state;
    synth s;
    ddp_dataset_t *ds = synth_create(&s, 50, 1);
    static size_t got[4][16];
    int count[50] = {0};
    for (int r = 0; r < 4; r++) {
        ddp_sampler_distributed_options so = ddp_sampler_distributed_defaults();
        so.num_replicas = 4;
        so.rank = r;
        ddp_sampler_t *sm;
        assert_int_equal(ddp_sampler_distributed_create(50, &so, &sm), 0);
        ddp_loader_options o = ddp_loader_defaults();
        o.batch_size = 4;
        o.sampler = sm;
        o.num_workers = r % 2;
        ddp_loader_t *dl;
        assert_int_equal(ddp_loader_create(ds, &o, &dl), 0);
        assert_int_equal(ddp_loader_length(dl), 4); /* 13 samples */
        assert_int_equal(run_epoch(dl, 2, 1, got[r], NULL), 13);
        assert_int_equal(ddp_sampler_epoch(sm), 2); /* epoch_begin set it */
        for (int i = 0; i < 13; i++)
            count[got[r][i]]++;
        ddp_loader_destroy(dl);
        ddp_sampler_destroy(sm);
    }
    int twice = 0;
    for (int i = 0; i < 50; i++) {
        assert_true(count[i] == 1 || count[i] == 2);
        twice += count[i] == 2;
    }
    assert_int_equal(twice, 2); /* 52 slots for 50 samples */
    ddp_dataset_destroy(ds);
}

static void test_errors(void **state)
{
    (void)state;
    synth s;
    ddp_dataset_t *ds = synth_create(&s, 40, 3);
    ddp_loader_t *dl;
    ddp_loader_options o = ddp_loader_defaults();
    o.batch_size = 0;
    assert_int_equal(ddp_loader_create(ds, &o, &dl), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "batch_size must be >= 1"));
    assert_null(dl);
    o = ddp_loader_defaults();
    o.num_workers = -1;
    assert_int_equal(ddp_loader_create(ds, &o, &dl), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "num_workers -1 not in 0..256"));
    o = ddp_loader_defaults();
    o.label_type = 7;
    assert_int_equal(ddp_loader_create(ds, &o, &dl), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "unknown label_type 7"));
    o = ddp_loader_defaults();
    o.num_workers = 2;
    o.prefetch_factor = 0;
    assert_int_equal(ddp_loader_create(ds, &o, &dl), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "prefetch_factor 0 not in 1..64"));
    o = ddp_loader_defaults();
    o.timeout_s = 0;
    assert_int_equal(ddp_loader_create(ds, &o, &dl), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "timeout_s must be > 0"));
    /* shuffle with a sampler: torch raises rather than ignore one of them. */
    ddp_sampler_t *sm;
    assert_int_equal(ddp_sampler_sequential_create(40, &sm), 0);
    o = ddp_loader_defaults();
    o.sampler = sm;
    o.shuffle = 1;
    assert_int_equal(ddp_loader_create(ds, &o, &dl), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "sampler option is mutually exclusive with shuffle"));
    assert_null(dl);
    ddp_sampler_destroy(sm);

    /* next before epoch_begin. */
    dl = loader(ds, 8, 0, 0, 0, 0);
    ddp_batch b;
    assert_int_equal(ddp_loader_next(dl, &b), DDP_ERR_STATE);
    assert_non_null(strstr(ddp_last_error(), "call ddp_loader_epoch_begin first"));
    ddp_loader_destroy(dl);

    /* A failing sample: the error reaches the consumer with the batch number,
     * for 0 and 2 workers; a new epoch starts cleanly after it. */
    s.fail_at = 21;
    for (int w = 0; w <= 2; w += 2) {
        dl = loader(ds, 8, 0, w, 0, 0);
        for (int round = 0; round < 2; round++) {
            assert_int_equal(ddp_loader_epoch_begin(dl, 0), 0);
            int rc, k = 0;
            while ((rc = ddp_loader_next(dl, &b)) == 1)
                k++;
            assert_int_equal(rc, DDP_ERR_IO);
            assert_int_equal(k, 2);
            const char *msg = ddp_last_error();
            if (!strstr(msg, "batch 2") || !strstr(msg, "dataset get(21) failed"))
                fail_msg("workers %d: %s", w, msg);
            assert_int_equal(ddp_loader_next(dl, &b), DDP_ERR_IO); /* stays failed */
            assert_non_null(strstr(ddp_last_error(), "this epoch already failed"));
        }
        ddp_loader_destroy(dl);
    }
    ddp_dataset_destroy(ds);
}

/* A worker stuck in a sample does not hold the consumer up (it builds that
 * batch itself), and a new epoch gives up waiting for it after timeout_s. */
static void test_stuck_worker(void **state)
{
    (void)state;
    synth s;
    ddp_dataset_t *ds = synth_create(&s, 64, 1);
    s.block_at = 0;
    s.block_us = 1000000;
    ddp_loader_options o = ddp_loader_defaults();
    o.batch_size = 4;
    o.num_workers = 1;
    o.timeout_s = 0.1;
    ddp_loader_t *dl;
    assert_int_equal(ddp_loader_create(ds, &o, &dl), 0);
    assert_int_equal(ddp_loader_epoch_begin(dl, 0), 0);
    for (int i = 0; i < 5000 && atomic_load(&s.blocked) == 0; i++)
        sleep_us(1000); /* until the worker is stuck inside batch 0 */
    assert_int_equal(atomic_load(&s.blocked), 1);
    double t0 = ddp_time_now();
    static size_t order[64];
    ddp_batch b;
    int rc, n = 0;
    while ((rc = ddp_loader_next(dl, &b)) == 1)
        for (size_t i = 0; i < b.size; i++)
            order[n++] = (size_t)b.x[i] / 16;
    assert_int_equal(rc, 0);
    assert_int_equal(n, 64);
    for (int i = 0; i < 64; i++)
        assert_int_equal(order[i], (size_t)i);
    assert_true(ddp_time_now() - t0 < 0.9); /* the worker is stuck for 1 s */
    /* A new epoch must wait for the stuck batch, and gives up at 0.1 s. */
    assert_int_equal(ddp_loader_epoch_begin(dl, 1), DDP_ERR_TIMEOUT);
    assert_non_null(strstr(ddp_last_error(), "1 batch(es) still being built after 0.1 s"));
    assert_int_equal(ddp_loader_next(dl, &b), DDP_ERR_STATE);
    ddp_loader_destroy(dl); /* waits for the stuck get (bounded), no leak */
    ddp_dataset_destroy(ds);
}

/* Destroy and restart while workers are in the middle of batches. */
static void test_destroy_and_restart_mid_epoch(void **state)
{
    (void)state;
    synth s;
    ddp_dataset_t *ds = synth_create(&s, 2000, 4);
    s.sleep_us = 200; /* 6.4 ms per batch of 32 */
    static size_t order[2000];
    for (int w = 1; w <= 4; w++) {
        ddp_loader_t *dl = loader(ds, 32, 1, w, 1, 0);
        ddp_batch b;
        assert_int_equal(ddp_loader_epoch_begin(dl, 0), 0);
        assert_int_equal(ddp_loader_next(dl, &b), 1);
        assert_int_equal(ddp_loader_next(dl, &b), 1);
        /* Restart: the old epoch's batches in flight are dropped. */
        s.sleep_us = 0;
        assert_int_equal(run_epoch(dl, 1, 4, order, NULL), 2000);
        s.sleep_us = 200;
        assert_int_equal(ddp_loader_epoch_begin(dl, 2), 0);
        assert_int_equal(ddp_loader_next(dl, &b), 1);
        double t0 = ddp_time_now();
        ddp_loader_destroy(dl); /* workers busy: each finishes one batch */
        assert_true(ddp_time_now() - t0 < 2.0);
    }
    /* Destroy right after create and right after epoch_begin. */
    ddp_loader_t *dl = loader(ds, 32, 1, 3, 1, 0);
    ddp_loader_destroy(dl);
    dl = loader(ds, 32, 1, 3, 1, 0);
    assert_int_equal(ddp_loader_epoch_begin(dl, 0), 0);
    ddp_loader_destroy(dl);
    ddp_loader_destroy(NULL);
    ddp_dataset_destroy(ds);
}

static void test_fashion_mnist_epoch(void **state)
{
    (void)state;
    ddp_dataset_t *ds;
    ddp_mnist_options mo = ddp_mnist_defaults();
    mo.train = 0;
    int rc = ddp_mnist_create("/usr/share/datasets/fashion-mnist", &mo, &ds);
    if (rc != 0)
        fail_msg("%s", ddp_last_error());
    ddp_loader_t *dl = loader(ds, 64, 1, 2, 0, 0);
    assert_int_equal(ddp_loader_length(dl), 157);
    assert_int_equal(ddp_loader_epoch_begin(dl, 0), 0);
    ddp_batch b;
    size_t n = 0, label_sum = 0;
    double px = 0;
    while ((rc = ddp_loader_next(dl, &b)) == 1) {
        for (size_t i = 0; i < b.size; i++)
            label_sum += (size_t)b.y64[i];
        for (size_t j = 0; j < b.size * 784; j++)
            px += b.x[j];
        n += b.size;
    }
    assert_int_equal(rc, 0);
    assert_int_equal(n, 10000);
    assert_int_equal(label_sum, 45000);
    assert_true(fabs(px - 573469082.0 / 255.0) < 1.0);
    ddp_loader_destroy(dl);
    ddp_dataset_destroy(ds);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_sample_once),
        cmocka_unit_test(test_shuffle_by_epoch_and_seed),
        cmocka_unit_test(test_identical_batches_for_any_workers),
        cmocka_unit_test(test_drop_last),
        cmocka_unit_test(test_with_distributed_sampler),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_stuck_worker),
        cmocka_unit_test(test_destroy_and_restart_mid_epoch),
        cmocka_unit_test(test_fashion_mnist_epoch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
