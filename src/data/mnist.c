/* MNIST-format dataset (torchvision.datasets.MNIST / FashionMNIST with
 * transform=ToTensor() and an optional Normalize): the split's two IDX files,
 * checked against each other, pixels kept as uint8 and turned into floats
 * per sample, x = (p / 255 - mean) / std, in float32 as torch computes it. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"
#include "data/idx_internal.h"
#include "ddp/ext.h"

typedef struct mnist {
    ddp_idx images; /* (count, rows, cols) uint8 */
    ddp_idx labels; /* (count) uint8 */
    int normalize;
    float mean, std;
} mnist;

ddp_mnist_options ddp_mnist_defaults(void)
{
    ddp_mnist_options o = {.train = 1, .normalize = 0, .mean = 0.0f, .std = 1.0f,
                        .num_classes = 10};
    return o;
}

static size_t mnist_length(void *self) { return ((mnist *)self)->images.count; }

/* p / 255 in float32 as torch's ToTensor (a division, not a multiplication
 * by 1/255: the results differ in the last bit).  Blocks of 16 so that the
 * compiler vectorises the conversion at -O2. */
static void convert(const mnist *m, const uint8_t *restrict p, float *restrict x, size_t n)
{
    size_t i = 0;
    if (!m->normalize) {
        for (; i + 16 <= n; i += 16)
            for (size_t j = 0; j < 16; j++)
                x[i + j] = (float)p[i + j] / 255.0f;
        for (; i < n; i++)
            x[i] = (float)p[i] / 255.0f;
        return;
    }
    const float mean = m->mean, std = m->std;
    for (; i + 16 <= n; i += 16)
        for (size_t j = 0; j < 16; j++)
            x[i + j] = ((float)p[i + j] / 255.0f - mean) / std;
    for (; i < n; i++)
        x[i] = ((float)p[i] / 255.0f - mean) / std;
}

static int mnist_get(void *self, size_t index, float *x, int64_t *label)
{
    const mnist *m = self;
    size_t numel = m->images.item_bytes;
    convert(m, m->images.data + index * numel, x, numel);
    *label = m->labels.data[index];
    return 0;
}

/* How far ahead of the conversion mnist_get_batch asks for samples' pixels:
 * 64 KiB (83 samples of 28 x 28), a batch of 64 all at once. */
#define PREFETCH_BYTES ((size_t)64 << 10)

/* Asks the CPU to start loading sample `index`'s pixels (up to
 * PREFETCH_BYTES of them: beyond that the hardware's stream prefetcher
 * keeps up) and its label.  A hint: it changes no data. */
static void prefetch_sample(const mnist *m, size_t index)
{
    size_t numel = m->images.item_bytes;
    size_t bytes = numel < PREFETCH_BYTES ? numel : PREFETCH_BYTES;
    uintptr_t p = (uintptr_t)(m->images.data + index * numel);
    for (uintptr_t line = p & ~(uintptr_t)63; line < p + bytes; line += 64)
        __builtin_prefetch((const void *)line, 0, 3);
    __builtin_prefetch(m->labels.data + index, 0, 3);
}

/* A batch's samples are random rows of a 47 MB array: each one misses the
 * caches, and converting row by row leaves those misses one after another,
 * 0.6-0.9 us per sample once a training step has evicted the caches.  Prefetching the rows PREFETCH_BYTES ahead (a batch of 64 all
 * at once, before the first conversion) overlaps the misses: 2-2.5x less
 * time per batch (bench/loader_gather.c, bench/RESULTS.md).  Same bytes
 * out: the conversion is unchanged. */
static int mnist_get_batch(void *self, const size_t *indices, size_t n, float *x,
                           int64_t *labels)
{
    const mnist *m = self;
    size_t numel = m->images.item_bytes;
    size_t ahead = PREFETCH_BYTES / numel > 0 ? PREFETCH_BYTES / numel : 1;
    for (size_t i = 0; i < n && i < ahead; i++)
        prefetch_sample(m, indices[i]);
    for (size_t i = 0; i < n; i++) {
        if (i + ahead < n)
            prefetch_sample(m, indices[i + ahead]);
        convert(m, m->images.data + indices[i] * numel, x + i * numel, numel);
        labels[i] = m->labels.data[indices[i]];
    }
    return 0;
}

static void mnist_destroy(void *self)
{
    mnist *m = self;
    if (!m)
        return;
    ddp_idx_destroy(&m->images);
    ddp_idx_destroy(&m->labels);
    free(m);
}

static const ddp_dataset_ops mnist_ops = {
    .length = mnist_length,
    .get = mnist_get,
    .get_batch = mnist_get_batch,
    .destroy = mnist_destroy,
};

/* dir/name, or dir/name.gz when only that exists. */
static int find_file(const char *dir, const char *name, char *path, size_t len)
{
    struct stat st;
    int n = snprintf(path, len, "%s/%s", dir, name);
    DDP_FAIL_IF(n < 0 || (size_t)n + 4 >= len, DDP_ERR_INVALID_ARG,
                "data folder path too long: %s", dir);
    if (stat(path, &st) == 0)
        return 0;
    strcat(path, ".gz");
    if (stat(path, &st) == 0)
        return 0;
    return DDP_ERROR(DDP_ERR_NOT_FOUND, "%s/%s[.gz]: not found", dir, name);
}

int ddp_mnist_create(const char *dir, const ddp_mnist_options *opts, ddp_dataset_t **out)
{
    int rc = 0;
    mnist *m = NULL;
    char ipath[4096], lpath[4096];
    DDP_FAIL_OUT(!dir || !out, DDP_ERR_INVALID_ARG, "ddp_mnist_create: NULL argument");
    *out = NULL;
    ddp_mnist_options o = opts ? *opts : ddp_mnist_defaults();
    DDP_FAIL_OUT(o.num_classes < 1 || o.num_classes > 256, DDP_ERR_INVALID_ARG,
                 "ddp_mnist_create: num_classes %d not in 1..256", o.num_classes);
    DDP_FAIL_OUT(o.normalize && !(o.std > 0.0f), DDP_ERR_INVALID_ARG,
                 "ddp_mnist_create: normalize needs std > 0 (got %g)", (double)o.std);
    struct stat st;
    if (stat(dir, &st) != 0)
        DDP_TRY_OUT(DDP_ERROR_ERRNO(errno == ENOENT ? DDP_ERR_NOT_FOUND : DDP_ERR_IO, errno,
                                    "data folder %s", dir));
    DDP_FAIL_OUT(!S_ISDIR(st.st_mode), DDP_ERR_INVALID_ARG, "data folder %s: not a folder",
                 dir);
    const char *split = o.train ? "train" : "t10k";
    char name[64];
    snprintf(name, sizeof name, "%s-images-idx3-ubyte", split);
    DDP_TRY_OUT(find_file(dir, name, ipath, sizeof ipath));
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte", split);
    DDP_TRY_OUT(find_file(dir, name, lpath, sizeof lpath));

    m = calloc(1, sizeof *m);
    DDP_FAIL_OUT(!m, DDP_ERR_NOMEM, "ddp_mnist_create: out of memory");
    m->normalize = o.normalize;
    m->mean = o.mean;
    m->std = o.std;
    DDP_TRY_OUT(ddp_idx_read(lpath, DDP_IDX_MAGIC_LABELS, &m->labels));
    const uint8_t *y = m->labels.data;
    for (size_t i = 0; i < m->labels.count; i++)
        DDP_FAIL_OUT(y[i] >= o.num_classes, DDP_ERR_FORMAT,
                     "%s: label %u at item %zu out of range (expected < %d)", lpath, y[i], i,
                     o.num_classes);
    DDP_TRY_OUT(ddp_idx_read(ipath, DDP_IDX_MAGIC_IMAGES, &m->images));
    DDP_FAIL_OUT(m->images.count != m->labels.count, DDP_ERR_FORMAT,
                 "%s holds %zu images but %s holds %zu labels", ipath, m->images.count, lpath,
                 m->labels.count);
    rc = ddp_dataset_create(&mnist_ops, m, m->images.item_bytes, out);
    m = NULL; /* owned by the dataset, or freed by ddp_dataset_create */
out:
    mnist_destroy(m);
    return rc;
}

int ddp_mnist_raw(const ddp_dataset_t *ds, const ddp_idx **images, const ddp_idx **labels)
{
    DDP_FAIL_IF(!ds || ds->ops != &mnist_ops, DDP_ERR_INVALID_ARG,
                "ddp_mnist_raw: not an MNIST dataset");
    const mnist *m = ds->self;
    if (images)
        *images = &m->images;
    if (labels)
        *labels = &m->labels;
    return 0;
}
