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
} ddp__ckpt_index;

/* Reads and checks dir/index.json.  Free with ddp__ckpt_index_free. */
int ddp__ckpt_index_read(const char *dir, ddp__ckpt_index *ix);
void ddp__ckpt_index_free(ddp__ckpt_index *ix);
/* Reads shard r's file whole and checks its metadata against the index
 * (checkpoint id, step, rank, world size).  Close with ddp__st_close. */
int ddp__ckpt_shard_open(const char *dir, const ddp__ckpt_index *ix, int r, ddp__st_file *f);
/* The 1-D F32 tensor name of len values in shard r's file f, or NULL with
 * *rc set and the message naming file and tensor. */
const float *ddp__ckpt_shard_piece(const char *dir, const ddp__ckpt_index *ix, int r,
                                   const ddp__st_file *f, const char *name, size_t len, int *rc);

#endif
