/* libddp data layer: IDX files, datasets, samplers and the DataLoader.
 *
 * The shape of torch.utils.data, in C:
 *
 *   ddp_idx_read        one IDX file (MNIST's format), raw or gzip'ed, checked
 *   ddp_dataset_t         a vtable (length, get item): ddp_mnist_create is one;
 *                       user code can implement its own with ddp_dataset_create
 *   ddp_sampler_t         the index order of an epoch (length, fill, set_epoch):
 *                       sequential, random (seeded), distributed (a rank's share)
 *   ddp_loader_t          batches of float32 samples and integer labels, built by
 *                       background threads (num_workers) into buffers it owns
 *
 * A typical loop (see examples/mnist/train.c):
 *
 *   ddp_dataset_t *ds; ddp_loader_t *dl; ddp_batch b;
 *   ddp_mnist_create("/usr/share/datasets/fashion-mnist", NULL, &ds);
 *   ddp_loader_options o = ddp_loader_defaults(); o.batch_size = 64; o.shuffle = 1;
 *   ddp_loader_create(ds, &o, &dl);
 *   for (int epoch = 0; epoch < n; epoch++) {
 *       ddp_loader_epoch_begin(dl, epoch);
 *       while ((rc = ddp_loader_next(dl, &b)) == 1)
 *           train_step(b.x, b.y64, b.size);      // (B, 784) floats, (B) labels
 *       if (rc < 0) fail(ddp_last_error());
 *   }
 *   ddp_loader_destroy(dl); ddp_dataset_destroy(ds);
 *
 * Details, costs and the error messages: docs/data.md.
 */
#ifndef DDP_DATA_H
#define DDP_DATA_H

#include "ddp/base.h"
#include "ddp/nn.h"
#include "ddp/pg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ IDX files */

/* Magic numbers (big-endian on disk): 0x00 0x00, element type 0x08 (unsigned
 * byte), number of dimensions. */
#define DDP_IDX_MAGIC_IMAGES 0x00000803u /* (count, rows, cols) */
#define DDP_IDX_MAGIC_LABELS 0x00000801u /* (count) */
#define DDP_IDX_MAX_DIM 4

/* One IDX file held in memory.  data holds count * item_bytes bytes, as
 * stored in the file; the struct owns it (free with ddp_idx_destroy). */
typedef struct ddp_idx {
    uint8_t *data;                  /* (count, dims[1], ..., dims[ndim-1]) */
    size_t count;                   /* dims[0]: number of items */
    size_t item_bytes;              /* product of dims[1..ndim) (1 for labels) */
    int ndim;                       /* 1 .. DDP_IDX_MAX_DIM */
    uint32_t dims[DDP_IDX_MAX_DIM]; /* unused entries are 0 */
    size_t alloc_bytes_;            /* private: size of the allocation */
} ddp_idx;

/* Reads an IDX file of unsigned bytes with `magic` (DDP_IDX_MAGIC_IMAGES,
 * DDP_IDX_MAGIC_LABELS, or any 0x000008NN) into *out.  The file may be raw or
 * gzip'ed: gzip is recognised by its magic bytes (1f 8b), not by the name.
 * Checks the magic, that no dimension is 0, that the file holds exactly the
 * bytes the header declares (truncated and trailing data are errors), and
 * the gzip stream (corrupt data, bad CRC).  Errors name the file:
 * "train-labels-idx1-ubyte.gz: truncated: header says 60000 items, file
 * holds 5912".  Codes: DDP_ERR_NOT_FOUND / DDP_ERR_IO (open, read),
 * DDP_ERR_FORMAT (content), DDP_ERR_NOMEM.  On error *out is zeroed.
 * The data is decompressed straight into one allocation. */
DDP_API int ddp_idx_read(const char *path, uint32_t magic, ddp_idx *out);
/* Frees idx->data and zeroes *idx; NULL and repeated calls are no-ops. */
DDP_API void ddp_idx_destroy(ddp_idx *idx);

/* ------------------------------------------------------------------ datasets */

/* What a dataset implements.  Samples are `sample_numel` float32 features
 * and one integer label.  get (and get_batch) may be called from several
 * loader threads at once, for different samples: keep them free of shared
 * mutable state.  A failing call returns a negative DDP_ERR_* code; the
 * library names the sample in the message ("dataset get(21) failed:
 * input/output error", or the message a libddp call inside get left) and
 * the loader passes it on with the batch number. */
typedef struct ddp_dataset_ops {
    /* Number of samples. */
    size_t (*length)(void *self);
    /* Writes sample `index` (< length) into x[0 .. sample_numel) and *label. */
    int (*get)(void *self, size_t index, float *x, int64_t *label);
    /* Optional (NULL: the loader calls get n times): writes samples
     * indices[0..n) into x, (n, sample_numel), and labels[0..n). */
    int (*get_batch)(void *self, const size_t *indices, size_t n, float *x,
                     int64_t *labels);
    /* Optional: frees self when the dataset is destroyed. */
    void (*destroy)(void *self);
} ddp_dataset_ops;

typedef struct ddp_dataset ddp_dataset_t;

/* Wraps a user implementation.  ops is borrowed (keep it alive, usually a
 * static const); self is owned by the dataset from now on when ops->destroy
 * is set (called by ddp_dataset_destroy, and on failure of this call), else
 * borrowed.  sample_numel > 0. */
DDP_API int ddp_dataset_create(const ddp_dataset_ops *ops, void *self,
                               size_t sample_numel, ddp_dataset_t **out);
DDP_API void ddp_dataset_destroy(ddp_dataset_t *ds);
DDP_API size_t ddp_dataset_length(const ddp_dataset_t *ds);
DDP_API size_t ddp_dataset_sample_numel(const ddp_dataset_t *ds);
/* One sample into caller buffers: x holds sample_numel floats.  Checks the
 * index (DDP_ERR_INVALID_ARG when out of range). */
DDP_API int ddp_dataset_get(ddp_dataset_t *ds, size_t index, float *x, int64_t *label);
/* n samples into x (n, sample_numel) and labels (n); every index checked. */
DDP_API int ddp_dataset_get_batch(ddp_dataset_t *ds, const size_t *indices, size_t n,
                                  float *x, int64_t *labels);

/* MNIST-format data sets (MNIST, Fashion-MNIST, KMNIST): a folder holding
 * train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte
 * and t10k-labels-idx1-ubyte, each raw or with a .gz suffix (raw preferred
 * when both exist).  Pixels stay uint8 in memory (47 MB for 60000 28x28
 * images) and become floats per sample, as torchvision's ToTensor() and an
 * optional Normalize((mean,), (std,)) do: x = (p / 255 - mean) / std. */
typedef struct ddp_mnist_options {
    int train;         /* 1: train-* files (default), 0: t10k-* files */
    int normalize;     /* 0 (default): x = p / 255; 1: also (x - mean) / std */
    float mean, std;   /* used when normalize (std > 0) */
    int num_classes;   /* labels must be < num_classes (default 10) */
} ddp_mnist_options;

/* Defaults: train split, no normalisation, 10 classes. */
DDP_API ddp_mnist_options ddp_mnist_defaults(void);
/* Reads the split's images and labels from dir (opts NULL: defaults) and
 * checks them: both files' IDX checks, images and labels counts equal,
 * every label < num_classes.  Errors name the file; a missing file is
 * DDP_ERR_NOT_FOUND ("DIR/train-images-idx3-ubyte[.gz]: not found").
 * sample_numel is rows * cols (784 for MNIST). */
DDP_API int ddp_mnist_create(const char *dir, const ddp_mnist_options *opts,
                             ddp_dataset_t **out);

/* ------------------------------------------------------------------ samplers */

/* What a sampler implements: the order in which an epoch visits samples. */
typedef struct ddp_sampler_ops {
    /* Number of indices per epoch. */
    size_t (*length)(void *self);
    /* Writes the epoch's length() indices into out.  Must give the same
     * sequence for the same epoch (the loader may call it once per epoch). */
    int (*fill)(void *self, uint64_t epoch, size_t *out);
    /* Optional: frees self. */
    void (*destroy)(void *self);
} ddp_sampler_ops;

typedef struct ddp_sampler ddp_sampler_t;

/* Wraps a user implementation; ownership of self as in ddp_dataset_create. */
DDP_API int ddp_sampler_create(const ddp_sampler_ops *ops, void *self,
                               ddp_sampler_t **out);
DDP_API void ddp_sampler_destroy(ddp_sampler_t *s);
DDP_API size_t ddp_sampler_length(const ddp_sampler_t *s);
/* The epoch that the next ddp_sampler_fill uses (torch's set_epoch). */
DDP_API void ddp_sampler_set_epoch(ddp_sampler_t *s, uint64_t epoch);
DDP_API uint64_t ddp_sampler_epoch(const ddp_sampler_t *s);
/* Writes the current epoch's ddp_sampler_length(s) indices into out. */
DDP_API int ddp_sampler_fill(ddp_sampler_t *s, size_t *out);

/* 0, 1, ..., n-1 every epoch. */
DDP_API int ddp_sampler_sequential_create(size_t n, ddp_sampler_t **out);
/* A permutation of 0..n-1 that depends only on (seed, epoch): a different
 * one every epoch, the same one for the same seed and epoch. */
DDP_API int ddp_sampler_random_create(size_t n, uint64_t seed, ddp_sampler_t **out);

/* torch.utils.data.DistributedSampler: rank's share of n samples among
 * num_replicas.  Every rank gets the same count: without drop_last
 * ceil(n / R), padding by repeating indices from the start of the (shuffled)
 * sequence; with drop_last floor(n / R), dropping the tail.  Rank r takes
 * positions r, r + R, r + 2R, ... of the epoch's sequence, which is a
 * permutation depending only on (seed, epoch) when shuffle is set, so that
 * all ranks agree without talking. */
typedef struct ddp_sampler_distributed_options {
    int num_replicas; /* >= 1 */
    int rank;         /* 0 .. num_replicas-1 */
    int shuffle;      /* default 1 */
    uint64_t seed;    /* default 0 */
    int drop_last;    /* default 0 */
} ddp_sampler_distributed_options;
DDP_API ddp_sampler_distributed_options ddp_sampler_distributed_defaults(void);
DDP_API int ddp_sampler_distributed_create(size_t n,
                                           const ddp_sampler_distributed_options *opts,
                                           ddp_sampler_t **out);

/* ------------------------------------------------------------------ DataLoader */

enum ddp_label_type { DDP_LABEL_INT64 = 0, DDP_LABEL_INT32 = 1 };

typedef struct ddp_loader_options {
    size_t batch_size;     /* >= 1 (default 1) */
    int shuffle;           /* without a sampler: random (1) or sequential (0); with
                              one it must stay 0 (ddp_loader_create fails, as
                              PyTorch raises: the sampler does the shuffling) */
    uint64_t seed;         /* the random sampler's seed (default 0) */
    int drop_last;         /* drop the last, incomplete batch */
    int num_workers;       /* 0: batches built in ddp_loader_next; N: N threads */
    int prefetch_factor;   /* batches queued per worker (default 4, see docs/data.md) */
    int pin_memory;        /* accepted; a no-op (no GPU in libddp) */
    int label_type;        /* DDP_LABEL_INT64 (default) or DDP_LABEL_INT32 */
    ddp_sampler_t *sampler;  /* borrowed; NULL: chosen from shuffle and seed */
    double timeout_s;      /* the longest ddp_loader_epoch_begin waits for the
                            * workers to finish the batches they are building
                            * (default 120 s); ddp_loader_next never waits */
} ddp_loader_options;

/* Defaults: batch 1, no shuffle, seed 0, no drop_last, 0 workers, prefetch 4,
 * int64 labels, timeout 120 s. */
DDP_API ddp_loader_options ddp_loader_defaults(void);

/* One batch.  x, y64 / y32 belong to the loader and stay valid until the
 * next ddp_loader_next, ddp_loader_epoch_begin or ddp_loader_destroy. */
typedef struct ddp_batch {
    float *x;          /* (size, sample_numel), contiguous, 64-byte aligned */
    int64_t *y64;      /* (size) labels when label_type is DDP_LABEL_INT64, else NULL */
    int32_t *y32;      /* (size) labels when label_type is DDP_LABEL_INT32, else NULL */
    size_t size;       /* samples in this batch (<= batch_size: the last may be short) */
    size_t sample_numel;
    size_t index;      /* 0-based batch number within the epoch */
} ddp_batch;

typedef struct ddp_loader ddp_loader_t;

/* Creates a loader over ds (borrowed: keep it alive until the loader is
 * destroyed) and starts its worker threads.  Buffers for 1 batch, or
 * max(2, num_workers * prefetch_factor) + 1 with workers, are allocated
 * here, once.  One consumer thread calls the loader. */
DDP_API int ddp_loader_create(ddp_dataset_t *ds, const ddp_loader_options *opts,
                              ddp_loader_t **out);
/* Stops the workers (mid-epoch too: each finishes at most the batch it is
 * building) and frees everything.  NULL is a no-op. */
DDP_API void ddp_loader_destroy(ddp_loader_t *dl);
/* Batches per epoch. */
DDP_API size_t ddp_loader_length(const ddp_loader_t *dl);
/* Starts an epoch: sets the sampler's epoch, takes its index order and lets
 * the workers start on it.  An unfinished previous epoch is abandoned: its
 * batches being built are waited for (DDP_ERR_TIMEOUT after timeout_s). */
DDP_API int ddp_loader_epoch_begin(ddp_loader_t *dl, uint64_t epoch);
/* The next batch of the epoch, in order: returns 1 and fills *batch, 0 at the
 * end of the epoch, or a negative code (a dataset error, which ends the
 * epoch; DDP_ERR_STATE before epoch_begin).  Never waits for a worker: a
 * batch that is not ready is built here (see docs/data.md). */
DDP_API int ddp_loader_next(ddp_loader_t *dl, ddp_batch *batch);

/* ------------------------------------------------------------------ with a group */

/* DataLoader(ds, sampler=DistributedSampler(ds)) for the group pg in one
 * call: each rank loads its share (ddp_sampler_distributed_create with the
 * group's rank and size; pg NULL: one process).  opts as for
 * ddp_loader_create (NULL: defaults), except that shuffle and seed go to the
 * sampler (shuffled when opts->shuffle) and opts->sampler must be NULL.  The
 * loader owns its sampler; caller destroys the loader. */
DDP_API int ddp_loader_distributed_create(ddp_dataset_t *ds, ddp_pg_t *pg,
                                          const ddp_loader_options *opts, ddp_loader_t **out);
/* The batch's images as a leaf var on tape, shape (size, sample_numel), not
 * requiring grad: a view of b->x (borrowed, valid until the next
 * ddp_loader_next), so reset the tape before the next batch. */
DDP_API int ddp_batch_input(const ddp_batch *b, ddp_tape_t *tape, ddp_var_t **x);

#ifdef __cplusplus
}
#endif
#endif
