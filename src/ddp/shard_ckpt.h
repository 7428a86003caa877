/* What the two halves of the sharded checkpoints share (shard_ckpt.c
 * writes, shard_ckpt_load.c reads and exports): names, the metadata every
 * shard file carries, the ranks' agreement on an outcome. */
#ifndef DDP_DDP_SHARD_CKPT_H
#define DDP_DDP_SHARD_CKPT_H

#include <stdint.h>
#include <stdio.h>

#include "ddp/zero_internal.h"

#define DDP__CKPT_FORMAT "libddp-zero-checkpoint"
#define DDP__CKPT_INDEX "index.json"
#define DDP__CKPT_BUFFERS "buffers.safetensors"
#define DDP__CKPT_MAX_STATES 8
#define DDP__CKPT_NAME_MAX (DDP_PARAM_NAME_MAX + 64)
#define DDP__SHARD_NMETA 8

/* The __metadata__ of a shard file. */
typedef struct ddp__shard_meta {
    ddp_train_state st; /* world_size: the saving run's */
    int64_t opt_steps;
    int rank, world;
    uint64_t id;        /* the checkpoint's, drawn by rank 0 */
} ddp__shard_meta;

/* "shard-00001-of-00004.safetensors" */
void ddp__shard_file_name(char *buf, size_t len, int rank, int world);
/* m as key/value strings for ddp__st_write (values in v). */
void ddp__shard_meta_strings(const ddp__shard_meta *m, char v[][32], const char **meta);
/* Collective: every rank's rc is shared; a rank that succeeded while another
 * failed returns that failure, naming the rank.  Returns rc, the agreed
 * failure, or the all-gather's error. */
int ddp__shard_agree(ddp_pg_t *pg, int rc, const char *what, const char *dir);
/* s as a JSON string literal. */
void ddp__ckpt_json_string(FILE *f, const char *s);

/* shard_ckpt_buffers.c, the writing side.  Rank 0: model's buffers (none:
 * nothing written) into dir/buffers.safetensors with m's metadata. */
int ddp__ckpt_buffers_write(const char *dir, ddp_model_t *model, const ddp__shard_meta *m);
/* The index's "buffers_file" and "buffers" members (none without buffers). */
void ddp__ckpt_buffers_json(FILE *f, ddp_model_t *model);

#endif
