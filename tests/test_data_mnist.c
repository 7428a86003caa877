/* Tests of the dataset interface and the MNIST dataset (src/data/dataset.c,
 * src/data/mnist.c): generated splits (raw and gzip'ed), every check between
 * the two files, and the real Fashion-MNIST files.  Reference values for
 * the real files were read once with python3's gzip module:
 *   d = gzip.open('train-labels-idx1-ubyte.gz').read(); list(d[8:28])
 *   d = gzip.open('train-images-idx3-ubyte.gz').read(); sum(d[16:16+784]) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>

#include "data_fixture.h"
#include "ddp/ext.h"

#define FASHION_DIR "/usr/share/datasets/fashion-mnist"

static void expect_create_error(const char *dir, const ddp_mnist_options *o, int code,
                                const char *frag)
{
    ddp_dataset_t *ds = (ddp_dataset_t *)1;
    int rc = ddp_mnist_create(dir, o, &ds);
    if (rc != code)
        fail_msg("got %s (%s), expected %s", ddp_err_name(rc), ddp_last_error(),
                 ddp_err_name(code));
    assert_null(ds);
    if (!strstr(ddp_last_error(), frag))
        fail_msg("message lacks \"%s\": %s", frag, ddp_last_error());
}

static void test_generated_splits(void **state)
{
    const char *dir = *state;
    fx_write_split(dir, "train", 1, 50, 4, 5, 10);
    fx_write_split(dir, "t10k", 0, 7, 4, 5, 10);
    for (int train = 0; train <= 1; train++) {
        ddp_mnist_options o = ddp_mnist_defaults();
        o.train = train;
        ddp_dataset_t *ds;
        assert_int_equal(ddp_mnist_create(dir, &o, &ds), 0);
        size_t n = train ? 50 : 7;
        assert_int_equal(ddp_dataset_length(ds), n);
        assert_int_equal(ddp_dataset_sample_numel(ds), 20);
        float x[20];
        int64_t y;
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(ddp_dataset_get(ds, i, x, &y), 0);
            assert_int_equal(y, (int64_t)(i % 10));
            for (size_t j = 0; j < 20; j++)
                assert_true(x[j] == (float)fx_pixel(i, j) / 255.0f);
        }
        const ddp_idx *im, *lb;
        assert_int_equal(ddp_mnist_raw(ds, &im, &lb), 0);
        assert_int_equal(im->dims[1], 4);
        assert_int_equal(im->dims[2], 5);
        assert_int_equal(lb->count, n);
        assert_int_equal(ddp_dataset_get(ds, n, x, &y), DDP_ERR_INVALID_ARG);
        char want[64];
        snprintf(want, sizeof want, "dataset index %zu out of range (length %zu)", n, n);
        assert_non_null(strstr(ddp_last_error(), want));
        ddp_dataset_destroy(ds);
    }
}

static void test_normalize_and_batch(void **state)
{
    const char *dir = *state;
    fx_write_split(dir, "train", 0, 40, 28, 28, 10);
    ddp_mnist_options o = ddp_mnist_defaults();
    o.normalize = 1;
    o.mean = 0.2860f; /* Fashion-MNIST's, as the tutorials use */
    o.std = 0.3530f;
    ddp_dataset_t *ds;
    assert_int_equal(ddp_mnist_create(dir, &o, &ds), 0);
    size_t idx[3] = {39, 0, 17};
    float x[3 * 784];
    int64_t y[3];
    assert_int_equal(ddp_dataset_get_batch(ds, idx, 3, x, y), 0);
    for (int b = 0; b < 3; b++) {
        assert_int_equal(y[b], (int64_t)(idx[b] % 10));
        for (size_t j = 0; j < 784; j++) {
            /* torch: ToTensor then Normalize, float32 all the way. */
            float want = ((float)fx_pixel(idx[b], j) / 255.0f - 0.2860f) / 0.3530f;
            assert_true(x[b * 784 + j] == want);
        }
    }
    idx[1] = 40;
    assert_int_equal(ddp_dataset_get_batch(ds, idx, 3, x, y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "index 40 (batch position 1) out of range"));
    ddp_dataset_destroy(ds);
}

/* get_batch prefetches rows ahead of its conversion (64 KiB: 83 samples of
 * 28 x 28, the first of them all at once; one sample at a time, its first
 * 64 KiB, when a sample is larger): whatever the batch size, the sample
 * size and the order (repeats included), its bytes are those of the
 * formula, sample by sample. */
static void check_batches(const char *dir, uint32_t n, uint32_t rows, uint32_t cols,
                          const size_t *sizes, int n_sizes)
{
    fx_write_split(dir, "train", 0, n, rows, cols, 10);
    size_t numel = (size_t)rows * cols, max = 0;
    for (int k = 0; k < n_sizes; k++)
        max = sizes[k] > max ? sizes[k] : max;
    float *x = malloc(max * numel * sizeof *x), *want = malloc(max * numel * sizeof *want);
    float *one = malloc(numel * sizeof *one);
    int64_t *y = malloc(max * sizeof *y), y1;
    size_t *idx = malloc(max * sizeof *idx);
    for (int normalize = 0; normalize <= 1; normalize++) {
        ddp_mnist_options o = ddp_mnist_defaults();
        o.normalize = normalize;
        o.mean = 0.2860f;
        o.std = 0.3530f;
        ddp_dataset_t *ds;
        assert_int_equal(ddp_mnist_create(dir, &o, &ds), 0);
        uint64_t r = 88172645463325252ULL;
        for (int k = 0; k < n_sizes; k++) {
            size_t B = sizes[k];
            for (size_t b = 0; b < B; b++) { /* xorshift64: any order, repeats too */
                r ^= r << 13, r ^= r >> 7, r ^= r << 17;
                idx[b] = (size_t)(r % n);
                for (size_t j = 0; j < numel; j++) {
                    float p = (float)fx_pixel(idx[b], j) / 255.0f;
                    want[b * numel + j] = normalize ? (p - 0.2860f) / 0.3530f : p;
                }
            }
            memset(x, 0xff, B * numel * sizeof *x);
            assert_int_equal(ddp_dataset_get_batch(ds, idx, B, x, y), 0);
            if (memcmp(x, want, B * numel * sizeof *x) != 0)
                fail_msg("batch of %zu samples of %zu pixels (normalize %d): bytes differ",
                         B, numel, normalize);
            for (size_t b = 0; b < B; b++) {
                assert_int_equal(y[b], (int64_t)(idx[b] % 10));
                assert_int_equal(ddp_dataset_get(ds, idx[b], one, &y1), 0);
                assert_memory_equal(one, x + b * numel, numel * sizeof *x);
            }
        }
        ddp_dataset_destroy(ds);
    }
    free(x);
    free(want);
    free(one);
    free(y);
    free(idx);
}

static void test_batch_bytes_any_size(void **state)
{
    const char *dir = *state;
    static const size_t small[] = {1, 2, 64, 83, 84, 257};
    check_batches(dir, 300, 28, 28, small, 6);
    static const size_t large[] = {1, 2, 5}; /* 90000 bytes a sample: past 64 KiB */
    check_batches(dir, 4, 300, 300, large, 3);
}

static void test_raw_preferred_over_gz(void **state)
{
    const char *dir = *state;
    fx_write_split(dir, "train", 1, 9, 2, 2, 10);
    fx_write_split(dir, "train", 0, 11, 2, 2, 10);
    ddp_dataset_t *ds;
    assert_int_equal(ddp_mnist_create(dir, NULL, &ds), 0);
    assert_int_equal(ddp_dataset_length(ds), 11);
    ddp_dataset_destroy(ds);
}

static void test_label_range_and_count_mismatch(void **state)
{
    const char *dir = *state;
    fx_write_split(dir, "train", 0, 12, 2, 2, 12); /* labels 0..11 */
    expect_create_error(dir, NULL, DDP_ERR_FORMAT,
                        "train-labels-idx1-ubyte: label 10 at item 10 out of range (expected "
                        "< 10)");
    ddp_mnist_options o = ddp_mnist_defaults();
    o.num_classes = 12;
    ddp_dataset_t *ds;
    assert_int_equal(ddp_mnist_create(dir, &o, &ds), 0);
    ddp_dataset_destroy(ds);
    o.num_classes = 0;
    expect_create_error(dir, &o, DDP_ERR_INVALID_ARG, "num_classes 0 not in 1..256");
    o = ddp_mnist_defaults();
    o.normalize = 1;
    o.std = 0;
    expect_create_error(dir, &o, DDP_ERR_INVALID_ARG, "normalize needs std > 0");

    /* 5 images, 4 labels. */
    uint8_t px[20] = {0}, lb[4] = {1, 2, 3, 4};
    uint32_t idims[3] = {5, 2, 2}, ldims[1] = {4};
    fx_write_idx(dir, "t10k-images-idx3-ubyte.gz", 1, DDP_IDX_MAGIC_IMAGES, 3, idims, px,
                 20);
    fx_write_idx(dir, "t10k-labels-idx1-ubyte", 0, DDP_IDX_MAGIC_LABELS, 1, ldims, lb, 4);
    o = ddp_mnist_defaults();
    o.train = 0;
    expect_create_error(dir, &o, DDP_ERR_FORMAT, "t10k-images-idx3-ubyte.gz holds 5 "
                        "images but ");
    assert_non_null(strstr(ddp_last_error(), "t10k-labels-idx1-ubyte holds 4 labels"));
}

static void test_missing_and_malformed_files(void **state)
{
    const char *dir = *state;
    expect_create_error(dir, NULL, DDP_ERR_NOT_FOUND, "train-images-idx3-ubyte[.gz]: not "
                        "found");
    expect_create_error("/nonexistent/ddp", NULL, DDP_ERR_NOT_FOUND,
                        "data folder /nonexistent/ddp: No such file or directory");
    fx_write_split(dir, "train", 0, 3, 2, 2, 10);
    char file[4096];
    snprintf(file, sizeof file, "%s/train-images-idx3-ubyte", dir);
    expect_create_error(file, NULL, DDP_ERR_INVALID_ARG, "not a folder");
    /* Images file with a labels magic: the IDX reader's error, file named. */
    uint8_t lb[3] = {0};
    uint32_t ldims[1] = {3};
    fx_write_idx(dir, "train-images-idx3-ubyte", 0, DDP_IDX_MAGIC_LABELS, 1, ldims, lb, 3);
    expect_create_error(dir, NULL, DDP_ERR_FORMAT, "train-images-idx3-ubyte: bad magic "
                        "0x00000801, expected 0x00000803");
}

/* A user dataset through the vtable: sample i is (i, i+1, i+2), label i % 3;
 * index 5 fails. */
static size_t user_len(void *self) { return *(size_t *)self; }

static int user_get(void *self, size_t i, float *x, int64_t *y)
{
    (void)self;
    if (i == 5)
        return DDP_ERR_IO;
    for (int j = 0; j < 3; j++)
        x[j] = (float)(i + (size_t)j);
    *y = (int64_t)(i % 3);
    return 0;
}

static void user_free(void *self) { free(self); }

static const ddp_dataset_ops user_ops = {.length = user_len, .get = user_get,
                                         .destroy = user_free};

static void test_user_dataset(void **state)
{
    (void)state;
    size_t *n = malloc(sizeof *n);
    *n = 8;
    ddp_dataset_t *ds;
    assert_int_equal(ddp_dataset_create(&user_ops, n, 3, &ds), 0);
    assert_int_equal(ddp_dataset_length(ds), 8);
    size_t idx[2] = {7, 2};
    float x[6];
    int64_t y[2];
    assert_int_equal(ddp_dataset_get_batch(ds, idx, 2, x, y), 0); /* through get */
    assert_true(x[0] == 7.0f && x[2] == 9.0f && x[3] == 2.0f && y[0] == 1 && y[1] == 2);
    idx[1] = 5;
    assert_int_equal(ddp_dataset_get_batch(ds, idx, 2, x, y), DDP_ERR_IO);
    assert_non_null(strstr(ddp_last_error(), "dataset get(5) failed: input/output error"));
    assert_int_equal(ddp_mnist_raw(ds, NULL, NULL), DDP_ERR_INVALID_ARG);
    ddp_dataset_destroy(ds);
    ddp_dataset_destroy(NULL);

    /* Bad arguments: self is freed on failure when ops->destroy is set. */
    n = malloc(sizeof *n);
    assert_int_equal(ddp_dataset_create(&user_ops, n, 0, &ds), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "sample_numel is 0"));
    ddp_dataset_ops no_get = {.length = user_len};
    assert_int_equal(ddp_dataset_create(&no_get, NULL, 3, &ds), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "must provide length and get"));
}

static void test_fashion_mnist(void **state)
{
    (void)state;
    static const int64_t train_first[20] = {9, 0, 0, 3, 0, 2, 7, 2, 5, 5,
                                            0, 9, 5, 5, 7, 9, 1, 0, 6, 4};
    static const int64_t test_first[20] = {9, 2, 1, 1, 6, 1, 4, 6, 5, 7,
                                           4, 5, 7, 3, 4, 1, 2, 4, 8, 0};
    for (int train = 1; train >= 0; train--) {
        ddp_mnist_options o = ddp_mnist_defaults();
        o.train = train;
        ddp_dataset_t *ds;
        double t0 = ddp_time_now();
        int rc = ddp_mnist_create(FASHION_DIR, &o, &ds);
        if (rc != 0)
            fail_msg("%s", ddp_last_error());
        double t = ddp_time_now() - t0;
        print_message("loaded %s split in %.3f s\n", train ? "train" : "test", t);
        size_t n = ddp_dataset_length(ds);
        assert_int_equal(n, train ? 60000 : 10000);
        assert_int_equal(ddp_dataset_sample_numel(ds), 784);
        const ddp_idx *im, *lb;
        assert_int_equal(ddp_mnist_raw(ds, &im, &lb), 0);
        assert_int_equal(im->dims[1], 28);
        assert_int_equal(im->dims[2], 28);
        float x[784];
        int64_t y;
        for (size_t i = 0; i < 20; i++) {
            assert_int_equal(ddp_dataset_get(ds, i, x, &y), 0);
            assert_int_equal(y, train ? train_first[i] : test_first[i]);
        }
        /* Every class 6000 (1000) times; label sum 270000 (45000). */
        size_t count[10] = {0}, sum = 0;
        for (size_t i = 0; i < n; i++) {
            count[lb->data[i]]++;
            sum += lb->data[i];
        }
        for (int c = 0; c < 10; c++)
            assert_int_equal(count[c], n / 10);
        assert_int_equal(sum, train ? 270000 : 45000);
        /* Pixels: sums of the first and the last image, and of all. */
        uint64_t first = 0, last = 0, all = 0;
        for (size_t j = 0; j < 784; j++) {
            first += im->data[j];
            last += im->data[(n - 1) * 784 + j];
        }
        for (size_t j = 0; j < n * 784; j++)
            all += im->data[j];
        assert_int_equal(first, train ? 76247 : 33456);
        assert_int_equal(last, train ? 16684 : 24390);
        assert_int_equal(all, train ? 3431114169ULL : 573469082ULL);
        assert_int_equal(ddp_dataset_get(ds, 0, x, &y), 0);
        double fsum = 0;
        for (size_t j = 0; j < 784; j++)
            fsum += x[j];
        assert_true(fabs(fsum - (train ? 76247.0 : 33456.0) / 255.0) < 1e-3);
        ddp_dataset_destroy(ds);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        IN_TMPDIR(test_generated_splits),
        IN_TMPDIR(test_normalize_and_batch),
        IN_TMPDIR(test_batch_bytes_any_size),
        IN_TMPDIR(test_raw_preferred_over_gz),
        IN_TMPDIR(test_label_range_and_count_mismatch),
        IN_TMPDIR(test_missing_and_malformed_files),
        cmocka_unit_test(test_user_dataset),
        cmocka_unit_test(test_fashion_mnist),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
