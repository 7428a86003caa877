/* The reading side of sharded checkpoints: index.json parsed and checked,
 * shard files opened against it (shard_ckpt_index.c), for loads and
 * exports (shard_ckpt_load.c). */
#ifndef DDP_DDP_SHARD_CKPT_READ_H
#define DDP_DDP_SHARD_CKPT_READ_H

#include "base/json.h"
#include "ddp/shard_ckpt.h"
#include "nn/safetensors.h"

typedef struct ddp__ckpt_shard {
    const char *file;  /* a name inside the folder (borrowed from the tree) */
    size_t begin, end; /* flat range: the partition's */
} ddp__ckpt_shard;

typedef struct ddp__ckpt_tensor {
    const char *name;
    int ndim;
    int64_t shape[DDP_TENSOR_MAX_DIM];
    size_t offset, numel; /* in the flat block */
} ddp__ckpt_tensor;

typedef struct ddp__ckpt_buffer {
    const char *name;
    ddp_dtype dtype; /* DDP_FLOAT32 or DDP_INT64 */
    int ndim;
    int64_t shape[DDP_TENSOR_MAX_DIM];
} ddp__ckpt_buffer;

typedef struct ddp__ckpt_index {
    ddp__json *root;           /* owns every string below */
    int world;
    size_t total;
    uint64_t id;
    ddp_train_state st;        /* world_size: the saving run's */
    int64_t opt_steps;
    int nstates;
    const char *states[DDP__CKPT_MAX_STATES];
    ddp__ckpt_shard *shards;   /* world, rank order */
    ddp__ckpt_tensor *tensors; /* flat order, tiling [0, total) */
    size_t ntensors;
    ddp__ckpt_buffer *buffers; /* state-dict order; none in older checkpoints */
    size_t nbuffers;
} ddp__ckpt_index;

/* Reads and checks dir/index.json.  Free with ddp__ckpt_index_free. */
int ddp__ckpt_index_read(const char *dir, ddp__ckpt_index *ix);
void ddp__ckpt_index_free(ddp__ckpt_index *ix);
/* Reads shard r's file whole and checks its metadata against the index
 * (checkpoint id, step, rank, world size).  Close with ddp__st_close. */
int ddp__ckpt_shard_open(const char *dir, const ddp__ckpt_index *ix, int r, ddp__st_file *f);
/* Reads dir/file whole and checks that its metadata is rank r's of this
 * checkpoint; what names the file in a read error ("shard 2 of the
 * index").  Close with ddp__st_close. */
int ddp__ckpt_file_open(const char *dir, const ddp__ckpt_index *ix, const char *file, int r,
                        const char *what, ddp__st_file *f);
/* The 1-D F32 tensor name of len values in shard r's file f, or NULL with
 * *rc set and the message naming file and tensor. */
const float *ddp__ckpt_shard_piece(const char *dir, const ddp__ckpt_index *ix, int r,
                                   const ddp__st_file *f, const char *name, size_t len, int *rc);


/* shard_ckpt_buffers.c, the reading side. */
/* The index's optional "buffers" into ix->buffers. */
int ddp__ckpt_buffers_parse(const char *path, const ddp__json *root, ddp__ckpt_index *ix);
/* Opens the buffers file (nothing, f zeroed, when the index lists none) and
 * checks it holds every listed buffer with its dtype and shape. */
int ddp__ckpt_buffers_open(const char *dir, const ddp__ckpt_index *ix, ddp__st_file *f);
/* The model's buffers against the index's: the first difference. */
int ddp__ckpt_buffers_check_model(const char *dir, const ddp__ckpt_index *ix, ddp_model_t *model);
/* The checked file's values into the model's buffers. */
void ddp__ckpt_buffers_copy(const ddp__ckpt_index *ix, const ddp__st_file *f, ddp_model_t *model);
/* t[0 .. nbuffers): the buffers as tensors to write (data borrowed from f). */
void ddp__ckpt_buffers_outputs(const ddp__ckpt_index *ix, const ddp__st_file *f, ddp__st_out *t);

#endif
