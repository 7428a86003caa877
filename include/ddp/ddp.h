/* libddp DistributedDataParallel: keeps the replicas of a model identical on
 * every rank of a process group by averaging gradients during backward, as
 * torch.nn.parallel.DistributedDataParallel does.
 *
 *     ddp_data_parallel_t *dm;
 *     ddp_data_parallel_create(model, pg, NULL, &dm);        // checks + broadcast from rank 0
 *     for each batch:
 *         ddp_tape_reset(tape);
 *         ddp_data_parallel_forward(dm, tape, x, &logits);    // model forward (+ bookkeeping)
 *         ddp_op_cross_entropy(tape, logits, labels, &loss);
 *         ddp_optim_zero_grad(opt);
 *         ddp_data_parallel_backward(dm, tape, loss);         // backward; buckets reduced meanwhile
 *         ddp_optim_step(opt);
 *     ddp_data_parallel_destroy(dm);
 *
 * Gradient buckets.  Parameters are grouped into buckets in reverse
 * registration order (a small first bucket, then bucket_cap_mb each); after
 * the first synchronised iteration the buckets are rebuilt once in the order
 * gradients actually became ready on rank 0, and every rank adopts that
 * layout.  The model's gradients live in the bucket memory
 * (gradient_as_bucket_view): each bucket is one contiguous slice that is
 * all-reduced in place, launched asynchronously the moment its last gradient
 * is final, so communication overlaps the rest of backward.  Buckets are
 * launched in the same order on every rank; ddp_data_parallel_backward waits for all of
 * them before it returns, so the optimizer step sees averaged gradients.
 *
 * Threading: a ddp_data_parallel_t, its model and its tape belong to one thread; the
 * process group's communication thread does the reductions.
 */
#ifndef DDP_DDP_H
#define DDP_DDP_H

#include "ddp/base.h"
#include "ddp/pg.h"
#include "ddp/nn.h"
#include "ddp/optim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddp_data_parallel ddp_data_parallel_t;

/* Built-in communication hooks (torch.distributed.algorithms.ddp_comm_hooks). */
typedef enum ddp_comm_hook_kind {
    DDP_HOOK_ALLREDUCE = 0, /* average in float32 (default) */
    DDP_HOOK_FP16 = 1,      /* divide by world size, compress to float16, all-reduce, decompress */
    DDP_HOOK_BF16 = 2,      /* the same with bfloat16 */
} ddp_comm_hook_kind;

typedef struct ddp_data_parallel_options {
    double bucket_cap_mb;       /* 25: cap of every bucket after the first */
    double first_bucket_cap_mb; /* 1: PyTorch's smaller first bucket */
    int find_unused_parameters; /* 0: see ddp_data_parallel_backward */
    int rebuild_buckets;        /* 1: re-bucket once from the observed ready order */
    ddp_comm_hook_kind comm_hook;
    /* Tail-free overlap: 0 (default) off; N >= 2: the gradient computed
     * last (the first Linear's weight, last in the bucket fill order) is
     * computed in up to N row chunks (nn.h rule 7) and the last bucket is
     * all-reduced in the matching pieces as the chunks are done, overlapping
     * that layer's own backward.  Parameters are bitwise those of the
     * unchunked path with 2 ranks; with more, the ring's reduction order
     * depends on an element's position in the vector (docs/ddp.md).  Default
     * comm hook only.  DDP_TAIL_CHUNKS, when set, overrides it.  Off by
     * default: it pays for a wide first layer in a large last bucket; small
     * pieces cost more in thread hand-offs than they save, hence the floor
     * below (docs/ddp.md). */
    int tail_chunks;
    /* 1: with tail_chunks, fewer chunks so that each piece of the last
     * bucket holds at least this many MiB (none when the bucket is smaller
     * than two): smaller pieces cost more in thread hand-offs than their
     * overlap saves (docs/ddp.md).  0: no floor. */
    double tail_min_piece_mb;
    /* 1: ZeRO-2's gradient side (the reducer's reduce-scatter mode,
     * include/ddp/reducer.h): each bucket is reduced to the owners of the
     * shards it overlaps, and after backward this rank holds the averaged
     * gradient of its shard of the flat parameter block only
     * (ddp_data_parallel_shard_grad); the parameters' own p->grad are then
     * scratch.  Gradients are written into a pool of grad_pool_buffers
     * bucket buffers through nn's grad-write hook (ext.h rule 8), so the
     * full gradient is never alive at once.  Default comm hook only; no
     * no_sync, join or tail_chunks (each backward reduces and the shard
     * accumulates).  0 (default): every rank gets every averaged gradient. */
    int reduce_scatter;
    int grad_pool_buffers; /* 2: with reduce_scatter, buffers in the pool */
    /* 1 (PyTorch's default): rank 0's module buffers (BatchNorm's running
     * statistics) are broadcast to every rank before each forward (not
     * with join enabled); 0: each rank keeps its own.  Buffers are always
     * broadcast once at construction, and never go into a bucket. */
    int broadcast_buffers;
} ddp_data_parallel_options;

/* PyTorch's defaults. */
DDP_API ddp_data_parallel_options ddp_data_parallel_defaults(void);

/* Wraps model (borrowed; it must outlive the wrapper) for the group pg.
 * The wrapper holds a reference on pg (its bucket memory is the group's
 * symmetric memory, ddp_pg_symmetric_alloc): ddp_destroy_process_group
 * before ddp_data_parallel_destroy is safe, the group then being torn down
 * by the wrapper's destroy (pg.h), as PyTorch's DDP keeps its ProcessGroup
 * alive.  Every rank checks that all ranks hold the same parameters
 * (count, names, shapes): if not, every rank fails with DDP_ERR_MISMATCH and a
 * message that names the first difference ("rank 1 differs from rank 0:
 * parameter 2 is 2.weight (10, 128) on rank 1 but 2.weight (10, 256) on rank
 * 0").  Then rank 0's parameter values are broadcast to all.  Installs the
 * model's grad-ready hook and re-points its gradients into the bucket memory
 * (current gradients are kept).  opts NULL: defaults.  Caller destroys. */
DDP_API int ddp_data_parallel_create(ddp_model_t *model, ddp_pg_t *pg,
                                     const ddp_data_parallel_options *opts,
                                     ddp_data_parallel_t **out);
/* Waits for any reduction still in flight (at most the group's timeout),
 * gives the model its own gradient block back (values kept), removes the
 * hook and releases the group (tearing it down if ddp_destroy_process_group
 * was called already).  NULL: no-op. */
DDP_API void ddp_data_parallel_destroy(ddp_data_parallel_t *dm);

/* The model's forward, with DDP's per-iteration bookkeeping first (the join
 * protocol's "still training" all-reduce when join is enabled). */
DDP_API int ddp_data_parallel_forward(ddp_data_parallel_t *dm, ddp_tape_t *tape, ddp_var_t *x,
                                      ddp_var_t **y);

/* Backward from loss with gradient synchronisation: each bucket is
 * all-reduced (averaged over the group) as soon as its gradients are final,
 * and the call returns once every bucket is reduced.  Inside no_sync it is a
 * plain local backward (gradients accumulate; the next synchronised backward
 * reduces the sum).
 * Parameters that receive no gradient: with find_unused_parameters they
 * count as ready at once and their current gradient (normally zero) is
 * reduced.  Without it the reduction still completes on every rank (no peer
 * is left waiting), and then this call fails with DDP_ERR_STATE naming the
 * parameters ("parameters 2.weight, 2.bias received no gradient in this
 * iteration; ...").  A failed collective fails the call with the group's
 * error (a dead peer, a timeout). */
DDP_API int ddp_data_parallel_backward(ddp_data_parallel_t *dm, ddp_tape_t *tape, ddp_var_t *loss);

/* PyTorch's `with model.no_sync():` — 1 to skip synchronisation (gradients
 * accumulate locally), 0 to resume.  The last backward before an optimizer
 * step must synchronise: if the parameters change (their version, nn.h:
 * ddp_optim_step, a checkpoint load, ...) after a no_sync backward and
 * before any synchronising one, the step used this rank's gradients alone
 * and the replicas have diverged, and the next ddp_data_parallel_forward or
 * _backward fails with DDP_ERR_STATE saying so. */
DDP_API void ddp_data_parallel_set_no_sync(ddp_data_parallel_t *dm, int no_sync);

/* A user communication hook, called once per bucket per synchronised
 * iteration, in bucket order.  launch starts the reduction of data (n
 * floats, the bucket's gradients, to be replaced by their average) and
 * returns its work handle (or NULL if it completed synchronously); finish,
 * when not NULL, runs after that work completed (decompression, scaling).
 * bucket is the bucket's index (for per-bucket scratch). */
typedef struct ddp_comm_hook {
    int (*launch)(void *state, ddp_pg_t *pg, int bucket, float *data, size_t n,
                  ddp_work_t **work);
    int (*finish)(void *state, ddp_pg_t *pg, int bucket, float *data, size_t n);
    void *state; /* borrowed */
} ddp_comm_hook;
/* Replaces the communication hook (NULL: back to opts.comm_hook). */
DDP_API int ddp_data_parallel_register_comm_hook(ddp_data_parallel_t *dm,
                                                 const ddp_comm_hook *hook);

/* Join for uneven inputs (torch.distributed.algorithms.Join).  With join
 * enabled on every rank, each ddp_data_parallel_forward first all-reduces a "still
 * training" flag.  A rank that runs out of data calls ddp_data_parallel_join: it
 * shadows the others' iterations (answering their flag and bucket
 * reductions with zeros) until every rank has joined; then the model of the
 * last rank to join is broadcast to all, so every replica ends identical.
 * Gradients are averaged over the whole group (PyTorch's
 * divide_by_initial_world_size).  With throw_on_early_termination, the
 * first rank to run out makes every rank's next ddp_data_parallel_forward fail with
 * DDP_ERR_STATE instead.  Works with no_sync: joined ranks shadow only the
 * iterations whose backward reduces. */
DDP_API int ddp_data_parallel_join_enable(ddp_data_parallel_t *dm, int enable,
                                          int throw_on_early_termination);
DDP_API int ddp_data_parallel_join(ddp_data_parallel_t *dm);

/* With reduce_scatter: this rank's shard of the averaged gradient, count
 * floats for [*begin, *begin + count) of the model's flat parameter block
 * (ZeRO's flat partition: S = ceil(total / world), shard r = [r*S,
 * min((r+1)*S, total))), borrowed from the wrapper.  It ACCUMULATES over
 * backwards (as p->grad does without DDP): zero it after the optimizer step
 * (ddp_data_parallel_zero_shard_grad, or a zero_grad of an optimizer whose
 * gradients view it).  The first backward after ddp_data_parallel_zero_shard_grad
 * (or after create) writes the shard instead of adding to it: do not write it
 * yourself in between.  DDP_ERR_INVALID_ARG without reduce_scatter. */
DDP_API int ddp_data_parallel_shard_grad(ddp_data_parallel_t *dm, float **grad, size_t *begin,
                                         size_t *count);
DDP_API void ddp_data_parallel_zero_shard_grad(ddp_data_parallel_t *dm);


/* ==== checkpoints ========================================================
 * A training checkpoint is one safetensors file: the model's parameters
 * under their state_dict names, each optimizer state buffer as the 1-D tensor
 * "optimizer.<name>" (e.g. optimizer.momentum_buffer), and the training
 * position in __metadata__ ("libddp.epoch", "libddp.step", ...).  Written to
 * a temporary file, fsynced and renamed: a crash leaves the previous
 * checkpoint whole. */
typedef struct ddp_train_state {
    int64_t epoch;       /* the epoch in progress (0-based) */
    int64_t step;        /* batches of that epoch already trained */
    int64_t global_step; /* optimizer steps since the start */
    uint64_t seed;       /* the run's seed (data order, initialisation) */
    int world_size;      /* ranks that trained it */
} ddp_train_state;

/* Saves model (and opt when not NULL) with st.  Borrows everything. */
DDP_API int ddp_checkpoint_save(const char *path, ddp_model_t *model, ddp_optim_t *opt,
                                const ddp_train_state *st);
/* Loads a checkpoint written by ddp_checkpoint_save into model, opt (may be
 * NULL) and *st (may be NULL).  Every parameter and optimizer buffer is
 * checked (name, dtype, shape) before anything is changed; a difference
 * fails with DDP_ERR_MISMATCH naming it, a missing file with
 * DDP_ERR_NOT_FOUND, a damaged one with DDP_ERR_FORMAT. */
DDP_API int ddp_checkpoint_load(const char *path, ddp_model_t *model, ddp_optim_t *opt,
                                ddp_train_state *st);

/* What a checkpoint keeps besides the model, the optimizer and the position
 * (ddp_checkpoint_save_ex / load_ex): an lr scheduler's state (last_epoch,
 * ReduceLROnPlateau's counters: "libddp.lr_scheduler.*" in __metadata__)
 * and random generators' states (e.g. a data or dropout stream of the
 * caller's: "libddp.rng.<name>", nwords 64-bit words in hex).  Every
 * checkpoint with an optimizer also keeps its groups' lrs
 * ("libddp.optimizer.lr"), restored by every load that has them, as
 * torch's optimizer.load_state_dict does. */
typedef struct ddp_checkpoint_rng {
    const char *name;
    uint64_t *state;   /* nwords words; read at save, written at load */
    int nwords;
} ddp_checkpoint_rng;

typedef struct ddp_checkpoint_options {
    ddp_lr_scheduler_t *scheduler;  /* NULL: none */
    const ddp_checkpoint_rng *rngs; /* nrngs generators */
    int nrngs;
} ddp_checkpoint_options;

/* Nothing extra. */
DDP_API ddp_checkpoint_options ddp_checkpoint_defaults(void);
/* ddp_checkpoint_save / load with x's extras (x may be NULL).  A load with a
 * scheduler or rngs that the file does not hold fails with DDP_ERR_FORMAT
 * naming the key, before anything is changed; after a load the scheduler
 * has the saved state (and sets its lrs for it), so that a resumed run
 * follows the same lr sequence. */
DDP_API int ddp_checkpoint_save_ex(const char *path, ddp_model_t *model, ddp_optim_t *opt,
                                   const ddp_train_state *st, const ddp_checkpoint_options *x);
DDP_API int ddp_checkpoint_load_ex(const char *path, ddp_model_t *model, ddp_optim_t *opt,
                                   ddp_train_state *st, const ddp_checkpoint_options *x);

/* Loads only parameter values from a checkpoint (or any safetensors file of
 * named F32 tensors), ignoring the optimizer's entries ("optimizer.*") and
 * the metadata, like torch's model.load_state_dict(sd, strict).  strict:
 * every parameter must be there and nothing else, or DDP_ERR_MISMATCH
 * names every difference; not strict: parameters the file lacks keep their
 * values and entries the model lacks are skipped.  A shape or dtype
 * difference fails either way, before anything is changed.  *report (may
 * be NULL) gets what was skipped, "missing 0.bias; unexpected 3.weight"
 * ("" when nothing was); caller frees it with free(). */
DDP_API int ddp_checkpoint_load_weights(const char *path, ddp_model_t *model, int strict,
                                        char **report);

#ifdef __cplusplus
}
#endif
#endif
