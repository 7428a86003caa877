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

/* One run of values a rank writes: elements [0, len) of its piece of the
 * tensor name (1-D in the file), and where the same elements sit in each of
 * the optimizer's state buffers. */
typedef struct ddp__ckpt_piece {
    const char *name;
    size_t len;
    const float *values;
    size_t state_at;
} ddp__ckpt_piece;

/* A tensor of the whole model as the index lists it. */
typedef struct ddp__ckpt_entry {
    const char *name;
    int ndim;
    const int64_t *shape;
    size_t offset, numel; /* in the whole model's flat block */
} ddp__ckpt_entry;

/* One rank's part in a collective save over pg (ZeRO's shards, a
 * pipeline's stages): shard `shard` of nshards, or none (-1: a pipeline's
 * other replicas).  Only pg's rank 0 reads the members below `total`,
 * for the index and the buffers file. */
typedef struct ddp__ckpt_save {
    const char *what;             /* "ZeRO checkpoint", for messages */
    ddp_pg_t *pg;
    int shard, nshards;
    int replicas;                 /* the data-parallel size st's position counts in */
    const ddp__ckpt_piece *pieces;
    size_t npieces;
    ddp_optim_t *opt;             /* may be NULL; the same kind on every rank */
    size_t total;
    const size_t *bounds;         /* nshards + 1 flat boundaries */
    const ddp__ckpt_entry *entries;
    size_t nentries;
    ddp_model_t *buffers;         /* whose buffers to keep, NULL: none */
} ddp__ckpt_save;

/* Collective over s->pg: the checkpoint id from rank 0, every writer's
 * shard file, rank 0's buffers file, the agreement that all are on disk,
 * then rank 0's index; every rank returns the same outcome. */
int ddp__ckpt_save_run(const char *dir, const ddp__ckpt_save *s, const ddp_train_state *st);

/* shard_ckpt_load.c.  Collective over pg: loads into model, a contiguous
 * part of the saved model (its parameters a run of the index's tensors,
 * under the same names and shapes, found by the first one's name), its
 * values, opt's state over the same layout (may be NULL) and *st (may be
 * NULL; world_size: the saving run's replicas).  Every rank checks what
 * it needs first and the ranks agree; on failure nothing is changed. */
int ddp__ckpt_load_part(const char *dir, ddp_pg_t *pg, ddp_model_t *model, ddp_optim_t *opt,
                        ddp_train_state *st);

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
