/* What zero.c and shard_ckpt*.c share: the handle's state and the flat
 * partition. */
#ifndef DDP_DDP_ZERO_INTERNAL_H
#define DDP_DDP_ZERO_INTERNAL_H

#include "ddp/reducer.h"
#include "ddp/zero.h"

/* One piece of a real parameter in this rank's shard. */
typedef struct ddp__zero_piece {
    ddp_param *real; /* the model's parameter */
    ddp_param *sp;   /* its piece in the shard model (1-D, len) */
    size_t local;    /* first element of the piece inside real */
    size_t len;
} ddp__zero_piece;

struct ddp_zero {
    ddp_model_t *model;  /* borrowed */
    ddp_model_t *shard;  /* owned: the pieces, in flat order */
    ddp_pg_t *pg;        /* borrowed */
    int stage, rank, world;
    int pool_buffers;    /* stage 2: the reducer's pool (0: its default) */
    size_t total;        /* the model's numel */
    size_t begin, end;   /* this rank's flat range */
    float *shard_grad;   /* stage 2: (end - begin), the reducer's */
    ddp_reducer_t *reducer; /* stage 2: scatter mode, owned */
    ddp__zero_piece *pieces;
    size_t npieces;
};

/* ZeRO's flat partition: shard rank of total floats over world ranks,
 * S = ceil(total / world), [rank*S, min((rank+1)*S, total)). */
void ddp__zero_partition(size_t total, int world, int rank, size_t *begin, size_t *end);
/* Hands the whole pages inside [p, p + bytes) back to the kernel
 * (MADV_DONTNEED): the memory stays valid and reads as zeros when touched
 * again.  For blocks that nothing reads any more, allocated (and touched) by
 * another layer that ZeRO cannot ask not to. */
void ddp__zero_release(void *p, size_t bytes);
/* The shard model and z->pieces (zero.c). */
int ddp__zero_build_shard(ddp_zero_t *z);
/* zero_stage2.c: the reducer in scatter mode, the shard model (built there,
 * in the order that keeps the peak low) and the model's hooks; undone by
 * destroy (a no-op at stage 1). */
int ddp__zero_stage2_init(ddp_zero_t *z);
void ddp__zero_stage2_destroy(ddp_zero_t *z);
/* Every rank's shard of the parameter block into every rank's block. */
int ddp__zero_gather(ddp_zero_t *z);

#endif
