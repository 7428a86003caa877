/* Private safetensors reader/writer (https://github.com/huggingface/safetensors):
 * an 8-byte little-endian header length N, N bytes of JSON
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 * "__metadata__": {"k": "v"}} padded with spaces, then the data buffer;
 * offsets are relative to the buffer.  Generic over named float32 and int64
 * tensors so checkpoints (model and optimizer state) can reuse it; the
 * model's state dict (parameters and buffers) is written and checked by the
 * helpers at the end. */
#ifndef DDP_NN_SAFETENSORS_H
#define DDP_NN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "ddp/base.h"

#define DDP_ST_MAX_DIM 8
#define DDP_ST_MAX_HEADER 100000000u /* the reference implementation's limit */

typedef struct ddp__st_out {
    const char *name;
    int ndim;
    const int64_t *shape;
    const void *data;  /* numel = product of shape */
    ddp_dtype dtype;   /* DDP_FLOAT32 (F32, the default 0) or DDP_INT64 (I64) */
} ddp__st_out;

/* Writes the tensors in order (F32 or I64) to "<path>.tmp", fsyncs, renames it over
 * path and fsyncs the directory.  __metadata__ holds {"format": "pt"} and
 * the nmeta key/value string pairs of meta (meta[2i] = key, meta[2i+1] =
 * value; may be NULL when nmeta is 0). */
int ddp__st_write(const char *path, const ddp__st_out *t, size_t n, const char *const *meta,
                  size_t nmeta);

typedef struct ddp__st_entry {
    char *name;
    char dtype[8];
    size_t elem_size;
    int ndim;
    int64_t shape[DDP_ST_MAX_DIM];
    uint64_t begin, end; /* byte offsets in the data buffer */
} ddp__st_entry;

typedef struct ddp__st_file {
    ddp__st_entry *entries; /* in header order */
    size_t n;
    unsigned char *data;    /* the data buffer (data_len bytes) */
    size_t data_len;
    char **meta;            /* __metadata__: key, value, key, value, ... */
    size_t nmeta;           /* pairs */
} ddp__st_file;

/* Reads and validates a whole file: header length and JSON, every entry's
 * dtype, shape and offsets (in range, sized for dtype x shape, tiling the
 * buffer with no overlap or hole).  F32 and I64 data are converted to host
 * order.
 * Errors are DDP_ERR_FORMAT / DDP_ERR_IO naming path and the problem.
 * Free with ddp__st_close. */
int ddp__st_read(const char *path, ddp__st_file *out);
void ddp__st_close(ddp__st_file *f);
/* The entry named name, or NULL. */
const ddp__st_entry *ddp__st_find(const ddp__st_file *f, const char *name);
/* The __metadata__ value of key (borrowed from f), or NULL. */
const char *ddp__st_meta(const ddp__st_file *f, const char *key);

/* "(2, 3)" for messages, cut to len bytes. */
void ddp__st_shape_str(char *buf, size_t len, int ndim, const int64_t *shape);

/* The model's state dict (parameters and buffers, PyTorch's names and
 * order) as tensors to write: *out (*n entries) is malloc'ed, caller frees;
 * the data pointers are borrowed from the model.  Seals the model. */
struct ddp_model;
int ddp__st_state_dict(struct ddp_model *m, ddp__st_out **out, size_t *n);
/* Checks that the file entry e (may be NULL: missing) can hold a state-dict
 * tensor of dtype, ndim and shape; on a mismatch writes the reason
 * ("missing", "dtype I64 in file, F32 in model", "shape (3) in file, (4) in
 * model") into why and returns 0, else returns 1. */
int ddp__st_entry_fits(const ddp__st_entry *e, ddp_dtype dtype, int ndim, const int64_t *shape,
                       char *why, size_t len);

#endif
