/* libddp ZeRO: less memory per rank by sharding the optimizer state (stage 1,
 * PyTorch's ZeroRedundancyOptimizer) and the gradients (stage 2) over the
 * ranks of a process group, after Rajbhandari et al., "ZeRO: Memory
 * Optimizations Toward Training Trillion Parameter Models" (2020).
 *
 *   stage 1, with DDP:
 *     ddp_data_parallel_t *dm;  ddp_data_parallel_create(model, pg, NULL, &dm);
 *     ddp_zero_t *z;            ddp_zero_create(model, pg, NULL, &z);
 *     ddp_optim_t *opt;         ddp_adam_create(ddp_zero_shard_model(z), &ao, &opt);
 *     for each batch:
 *         ddp_model_zero_grad(model);  // the whole gradients: the shard's are views
 *         ... ddp_data_parallel_forward / _backward as usual ...
 *         ddp_zero_step(z, opt);     // step this rank's shard, then all-gather
 *   stage 2, no DDP (opts.stage = 2):
 *     for each batch:
 *         ddp_optim_zero_grad(opt);  // the shard's gradient
 *         ... ddp_model_forward ...
 *         ddp_zero_backward(z, tape, loss); // reduce-scatter during backward
 *         ddp_zero_step(z, opt);
 *
 * The partition is ZeRO's flat one over the model's flat parameter block of
 * `total` floats: with N ranks and S = ceil(total / N), rank r owns
 * [r*S, min((r+1)*S, total)) (empty for the last ranks of a tiny model).
 * The shard model is a private model whose parameters are the pieces of the
 * real parameters that fall in this rank's shard: each piece is 1-D, carries
 * the real parameter's name (so options chosen by name apply), views its
 * values in the real model's parameter block and its gradient in the real
 * gradient (stage 1: wherever p->grad points after DDP's all-reduce).  Any
 * optimizer of include/ddp/optim.h created over the shard model keeps state
 * for the shard only: 1/N of what it keeps over the whole model.
 *
 * ddp_zero_step steps that optimizer, then every rank's shard is gathered in
 * place into every rank's parameter block, so after the step every replica
 * holds the same parameters again: after the same steps they equal plain
 * DDP's (docs/zero.md says when bitwise and why).
 *
 * Threading: as DDP: the handle, its model and the optimizer belong to one
 * thread; the group's communication thread does the gather.
 */
#ifndef DDP_ZERO_H
#define DDP_ZERO_H

#include "ddp/base.h"
#include "ddp/ddp.h"
#include "ddp/nn.h"
#include "ddp/optim.h"
#include "ddp/pg.h"
#include "ddp/reducer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddp_zero ddp_zero_t;

typedef struct ddp_zero_options {
    int stage; /* 1 (default): shard the optimizer state; 2: and the gradients */
    /* Stage 2: bucket buffers in the reducer's pool (reducer.h), 0 (default):
     * the reducer's default, 2.  Each costs the largest bucket (at least the
     * largest parameter); 1 saves one of them, but backward then waits for
     * each bucket's reduction before it writes the next (less overlap). */
    int pool_buffers;
} ddp_zero_options;

DDP_API ddp_zero_options ddp_zero_defaults(void);

/* Shards model (borrowed, sealed by this call; it must outlive the handle)
 * over pg (borrowed; it must outlive the handle).  Every rank must call it
 * with the same model layout: at stage 1 ddp_data_parallel_create checks
 * that; stage 2's create is collective and checks it itself (below, at
 * ddp_zero_backward).  opts NULL: defaults (stage 1).  A stage other than
 * 1 or 2, or a negative pool_buffers, fails with DDP_ERR_INVALID_ARG.
 * A failed create leaves the model's parameters and gradients as they
 * were (ranks with different models: DDP_ERR_MISMATCH), save a broadcast
 * that fails midway (a dead peer: the job must stop) and, at stage 2, out
 * of memory for the shard model after the gradient block was handed back.
 * Caller destroys. */
DDP_API int ddp_zero_create(ddp_model_t *model, ddp_pg_t *pg, const ddp_zero_options *opts,
                            ddp_zero_t **out);
/* NULL is a no-op.  The shard model goes with it: destroy the optimizer
 * made over it first. */
DDP_API void ddp_zero_destroy(ddp_zero_t *z);

/* The model of this rank's shard (borrowed, owned by z): create the
 * optimizer over it. */
DDP_API ddp_model_t *ddp_zero_shard_model(ddp_zero_t *z);
/* This rank's flat range [*begin, *end) of the parameter block. */
DDP_API void ddp_zero_shard_range(const ddp_zero_t *z, size_t *begin, size_t *end);
DDP_API int ddp_zero_stage(const ddp_zero_t *z);

/* Stage 2's backward (plain DDP does it at stage 1; do not wrap the model
 * in DDP at stage 2): ddp_tape_backward, each bucket of gradients
 * reduce-scattered the moment it is complete, then the wait for the last:
 * the averaged gradient of this rank's shard is then what the shard
 * model's gradients view, accumulated (+=) over backward calls until
 * ddp_optim_zero_grad(opt) clears it.  The full gradients never exist at
 * once: they are written into a pool of bucket buffers (reducer.h, scatter
 * mode).  Stage 2's create is collective: it checks that every rank holds
 * the same parameters (names, sizes) and broadcasts rank 0's values. */
DDP_API int ddp_zero_backward(ddp_zero_t *z, ddp_tape_t *tape, ddp_var_t *loss);

/* One optimizer step over this rank's shard (opt must have been created
 * over ddp_zero_shard_model(z)), then the gather of every rank's shard into
 * every rank's parameter block.  The model's parameter version is bumped.
 * A failed gather fails with the group's error; the replicas are then out
 * of step and the job must stop. */
DDP_API int ddp_zero_step(ddp_zero_t *z, ddp_optim_t *opt);

/* Bytes of optimizer state this rank holds (for the memory benchmark):
 * opt's state buffers, each the shard's length in floats. */
DDP_API size_t ddp_zero_state_bytes(const ddp_zero_t *z, const ddp_optim_t *opt);

/* ==== sharded checkpoints ================================================
 * A folder dir holding one safetensors file per rank (rank r's pieces of the
 * parameters under their names, and of each optimizer state buffer under
 * "optimizer.<state>.<name>", with the training position in __metadata__),
 * for a model with module buffers rank 0's buffers whole in
 * buffers.safetensors, and index.json, written by rank 0 once every shard
 * is on disk (docs/zero.md gives the format).  Every file is written to a
 * temporary name, fsynced and renamed: a crash leaves the previous index
 * (and its shards) whole, as long as successive checkpoints go to
 * different folders. */

/* Collective: every rank of z's group calls it.  Writes this rank's shard
 * of z's model and of opt (may be NULL) with st, then rank 0 writes the
 * index.  dir must exist.  Any rank's failure fails every rank. */
DDP_API int ddp_zero_checkpoint_save(const char *dir, ddp_zero_t *z, ddp_optim_t *opt,
                                     const ddp_train_state *st);
/* Collective: loads a checkpoint saved by any number of ranks into z's
 * model (every rank gets the whole parameters), opt (may be NULL: the
 * state of this rank's shard, resharded from the saved partition) and *st
 * (may be NULL; world_size is the saving run's), and the saved buffers into
 * every rank's model.  Every rank checks the index, the buffers and every
 * shard it needs (names, shapes, ranges, the step of each shard against
 * the index's) before anything is changed, and the ranks agree
 * on the outcome: a missing or damaged file, an index naming a shard that is
 * not there, shards of different steps or a model that does not match fail
 * every rank and change nothing (DDP_ERR_NOT_FOUND, DDP_ERR_FORMAT,
 * DDP_ERR_MISMATCH; the rank that found the problem names it). */
DDP_API int ddp_zero_checkpoint_load(const char *dir, ddp_zero_t *z, ddp_optim_t *opt,
                                     ddp_train_state *st);
/* Not collective (any one process, no group): writes the parameters of the
 * checkpoint in dir, then its module buffers (rank 0's: BatchNorm's
 * running statistics, num_batches_tracked as I64), as one ordinary
 * safetensors file at path, full shapes and PyTorch's state_dict names
 * (what ddp_model_load_safetensors, safetensors.torch.load_file and
 * load_state_dict(strict=True) read).  The same checks as a load. */
DDP_API int ddp_zero_checkpoint_export(const char *dir, const char *path);

#ifdef __cplusplus
}
#endif
#endif
