/* libddp pipeline parallelism: a model cut into S stages, one stage per
 * rank, micro-batches flowing through them (torch.distributed.pipelining's
 * PipelineStage with ScheduleGPipe / Schedule1F1B), and data parallelism
 * across R replicas of the whole pipeline.
 *
 *     // every rank builds the full module list and keeps its stage's part
 *     ddp_pipeline_split(modules, 3, (int[]){0, 2, 3}, 2, stage, &stage_model);
 *     ddp_pipeline_options o = ddp_pipeline_defaults(2, 4);   // S = 2, M = 4
 *     o.input_ndim = 1; o.input_shape[0] = stage == 0 ? 784 : 256;
 *     ddp_pipeline_t *pp;
 *     ddp_pipeline_create(world, stage_model, &o, &pp);
 *     for each batch (B rows per replica):
 *         ddp_optim_zero_grad(opt);
 *         ddp_pipeline_step(pp, images, labels, B, &loss);    // forward + backward, all M
 *         ddp_optim_step(opt);                                  // gradients averaged over replicas
 *     ddp_pipeline_destroy(pp);
 *
 * Layout.  The world's W ranks are R = W / S replicas of S stages, rank =
 * replica * S + stage: one replica's stages are neighbouring ranks, so that
 * ddprun with --nproc-per-node S (or a multiple) keeps each pipeline on one
 * host, where the per-micro-batch activations travel over shared memory,
 * and only the replicas' all-reduce, once per step, crosses hosts.
 *
 * Step.  Stage 0 cuts its input (B, ...) into M micro-batches of B/M rows
 * (the first B % M one row more), each stage runs its part of each one
 * (its own tape per micro-batch in flight: GPipe holds M, 1F1B at most
 * S - stage), the last stage computes each micro-batch's loss weighted by
 * its share of the batch (rows / B), so that the accumulated gradient is
 * the gradient of the whole batch's mean loss, and each stage's backward
 * starts from the gradient the next stage sends back.  Gradients
 * accumulate into the stage model's p->grad (zero them before the step, as
 * with PyTorch); after the last micro-batch's backward each stage's
 * gradients are averaged over its R replicas (a subgroup per stage).  So a
 * step equals one step of the unsplit model on the global batch of R * B
 * rows, up to float rounding.
 *
 * Messages.  Each activation and each gradient is preceded by a 128-byte
 * header (step, micro-batch, sending stage, shape); the receiver checks it
 * against the shape it expects (the stage's declared input shape, or the
 * shape of the output it sent) and fails naming the stage, the micro-batch
 * and both shapes.  Activations and gradients travel on separate two-rank
 * subgroups per neighbouring pair and direction, sends asynchronous,
 * receives blocking with the group's timeout, so no schedule can deadlock
 * whatever the transport buffers.  A peer that dies fails the waiting rank
 * within the timeout, the message naming the stage it waited for.
 *
 * Threading: a pipeline, its model and its tapes belong to one thread.
 */
#ifndef DDP_PIPELINE_H
#define DDP_PIPELINE_H

#include "ddp/base.h"
#include "ddp/ddp.h"
#include "ddp/nn.h"
#include "ddp/optim.h"
#include "ddp/pg.h"
#include "ddp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddp_pipeline ddp_pipeline_t;

/* torch.distributed.pipelining's ScheduleGPipe and Schedule1F1B. */
typedef enum ddp_pipeline_schedule {
    DDP_SCHEDULE_GPIPE = 0, /* all forwards, then all backwards: M activations held */
    DDP_SCHEDULE_1F1B = 1,  /* S - stage warm-up forwards, then one forward one backward */
} ddp_pipeline_schedule;

/* The last stage's loss of one micro-batch: out is the stage's output var
 * (rows, ...), labels its rows' labels (borrowed); *loss a scalar var on
 * tape.  Return 0 or a negative code (with a message). */
typedef int (*ddp_pipeline_loss_fn)(ddp_tape_t *tape, ddp_var_t *out, const int64_t *labels,
                                    int64_t rows, ddp_var_t **loss, void *user);

typedef struct ddp_pipeline_options {
    int stages;                      /* S >= 1; the world size is a multiple of it */
    int micro_batches;               /* M >= 1 */
    ddp_pipeline_schedule schedule;  /* default DDP_SCHEDULE_1F1B */
    /* This stage's input per sample (without the batch dimension): (784)
     * for an MNIST MLP's stage 0, (256) after its first Linear.  Stage 0
     * checks its input against it; the other stages every activation they
     * receive.  Required on stages after the first (they allocate from it). */
    int input_ndim;
    int64_t input_shape[DDP_TENSOR_MAX_DIM - 1];
    ddp_pipeline_loss_fn loss;       /* NULL: cross-entropy (mean) */
    void *loss_user;                 /* borrowed, passed to loss */
} ddp_pipeline_options;

/* Cuts a module list into stages, as torch's pipeline splits a Sequential
 * at given points: cuts[0..stages] ascend strictly from 0 to n, and *out
 * is a sealed model of modules [cuts[stage], cuts[stage + 1]), each added
 * under its index in the list, so that parameters keep the unsplit
 * Sequential's names ("2.weight").  Takes ownership of all n modules
 * (also on failure): those of the other stages are destroyed.  Every rank
 * builds the same list with the same seeds and keeps its part, so the
 * stages start from the values of the unsplit model.  Caller destroys
 * *out. */
DDP_API int ddp_pipeline_split(ddp_module_t *const *modules, int n, const int *cuts, int stages,
                               int stage, ddp_model_t **out);

/* stages and micro_batches as given, 1F1B, no input shape, cross-entropy. */
DDP_API ddp_pipeline_options ddp_pipeline_defaults(int stages, int micro_batches);

/* Makes this rank's stage of the pipeline over world (every rank of world
 * calls it, with the same stages, micro_batches and schedule: checked, the
 * first difference named).  model is this stage's part (borrowed; it must
 * outlive the pipeline); its parameters are broadcast from replica 0's
 * stage to the other replicas.  Creates the stage's subgroups (borrowing
 * world, which must outlive the pipeline).  Caller destroys *out. */
DDP_API int ddp_pipeline_create(ddp_pg_t *world, ddp_model_t *model,
                                const ddp_pipeline_options *opt, ddp_pipeline_t **out);
/* Waits for sends in flight, frees the tapes and the subgroups.  NULL: no-op. */
DDP_API void ddp_pipeline_destroy(ddp_pipeline_t *pp);

DDP_API int ddp_pipeline_stage(const ddp_pipeline_t *pp);    /* 0 .. S-1 */
DDP_API int ddp_pipeline_replica(const ddp_pipeline_t *pp);  /* 0 .. R-1 */
DDP_API int ddp_pipeline_num_stages(const ddp_pipeline_t *pp);
DDP_API int ddp_pipeline_num_replicas(const ddp_pipeline_t *pp);

/* One training step: forward and backward of all M micro-batches of this
 * replica's batch of `batch` rows (every stage passes the same batch,
 * >= M), then the gradients averaged over the replicas.  input: stage 0's
 * (batch, input_shape...) tensor (borrowed; ignored elsewhere, may be
 * NULL); labels: the last stage's batch labels (borrowed; ignored
 * elsewhere).  *loss (may be NULL): on the last stage the replica batch's
 * mean loss, elsewhere NAN.  On failure the message names the stage and
 * micro-batch; the pipeline is then unusable (destroy it). */
DDP_API int ddp_pipeline_step(ddp_pipeline_t *pp, const ddp_tensor *input, const int64_t *labels,
                              int64_t batch, float *loss);

/* Evaluation: forward of `batch` rows through every stage as one
 * micro-batch, no gradients (the model's train/eval mode is the caller's).
 * On the last stage *out receives the output (initialised here; caller
 * destroys it); elsewhere *out is left empty. */
DDP_API int ddp_pipeline_forward(ddp_pipeline_t *pp, const ddp_tensor *input, int64_t batch,
                                 ddp_tensor *out);

/* Busy and idle time of this stage since creation (or the last reset), in
 * seconds: busy is forward and backward compute, idle the time waiting to
 * receive; their ratio gives the bubble measured from this stage's own
 * timeline (bench/pipeline_bubble.c). */
DDP_API void ddp_pipeline_times(const ddp_pipeline_t *pp, double *busy_s, double *idle_s);
DDP_API void ddp_pipeline_reset_times(ddp_pipeline_t *pp);

/* ==== checkpoints ========================================================
 * The sharded checkpoint format of include/ddp/zero.h (docs/zero.md), one
 * shard per stage: stage s's parameters (and its optimizer's state) are a
 * contiguous range of the unsplit model's flat block, and replica 0's stage
 * s writes it.  So a pipeline's checkpoint loads into a pipeline cut at
 * other points or with another number of replicas, into ZeRO at any world
 * size (ddp_zero_checkpoint_load), and ddp_zero_checkpoint_export makes it
 * one ordinary safetensors file; a ZeRO checkpoint loads into a pipeline.
 * Every stage must use the same optimizer kind.  Stages with module
 * buffers (BatchNorm) are refused (DDP_ERR_UNSUPPORTED): not yet. */

/* Collective over the pipeline's world (every rank calls it, between
 * steps): writes into dir (which must exist) replica 0's stages' shards,
 * then rank 0 writes the index, naming the replicas as st's data-parallel
 * size.  Any rank's failure fails every rank. */
DDP_API int ddp_pipeline_checkpoint_save(const char *dir, ddp_pipeline_t *pp, ddp_optim_t *opt,
                                         const ddp_train_state *st);
/* Collective over the pipeline's world: every rank (every replica) reads
 * its stage's parameters (found in the index by name: the same names and
 * shapes in the same order), opt's state (may be NULL) and *st (may be
 * NULL; world_size: the saving run's replicas) from the files that hold
 * them.  Every rank checks first and the ranks agree: a missing, damaged
 * or foreign file, or a model that does not match, fails every rank and
 * changes nothing. */
DDP_API int ddp_pipeline_checkpoint_load(const char *dir, ddp_pipeline_t *pp, ddp_optim_t *opt,
                                         ddp_train_state *st);

#ifdef __cplusplus
}
#endif
#endif
