/* libddp PowerSGD: gradient compression for slow links (Vogels, Karimireddy
 * & Jaggi 2019), PyTorch's ddp_comm_hooks.powerSGD_hook as a communication
 * hook (ddp.h's ddp_comm_hook) of DistributedDataParallel or the reducer.
 *
 * Each gradient tensor of a bucket is viewed as a matrix M (rows =
 * shape[0], cols = the rest).  With rank r it sends P = M Q (rows x r) and
 * Q = M^T P (cols x r) instead of M: two all-reduces of (rows + cols) r
 * floats instead of rows x cols.  As PyTorch 1.13 does:
 *   - the first start_powersgd_iter iterations are plain averaged
 *     all-reduces (PowerSGD hurts accuracy when it starts too early);
 *   - error feedback: what compression lost on this rank is added to the
 *     next iteration's gradient;
 *   - warm start: Q is kept from one iteration to the next (orthogonalised
 *     again), else drawn at random each time (the same on every rank);
 *   - a tensor whose compression saves less than min_compression_rate
 *     (1-D tensors: biases) is all-reduced as it is, with the others of its
 *     bucket in one message;
 *   - P is orthogonalised (Gram-Schmidt) after its all-reduce; Q's sum is
 *     divided by the world size; M becomes P Q^T.
 * Q's first values come from libddp's generator seeded with random_seed
 * (PyTorch's from numpy and torch's): the same on every rank, not
 * PyTorch's numbers.
 *
 * Its state (the iteration, each bucket's error and Q) belongs in a
 * checkpoint: ddp_powersgd_num_states / ddp_powersgd_state enumerate it.
 */
#ifndef DDP_POWERSGD_H
#define DDP_POWERSGD_H

#include "ddp/ddp.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddp_powersgd ddp_powersgd_t;

/* torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.PowerSGDState. */
typedef struct ddp_powersgd_options {
    int matrix_approximation_rank;    /* 1 */
    int64_t start_powersgd_iter;      /* 1000 (> 1 with error feedback or warm start) */
    double min_compression_rate;      /* 2 */
    int use_error_feedback;           /* 1 */
    int warm_start;                   /* 1 */
    double orthogonalization_epsilon; /* 0 */
    uint64_t random_seed;             /* 0 */
} ddp_powersgd_options;

DDP_API ddp_powersgd_options ddp_powersgd_defaults(void);

/* One tensor of a bucket: where it starts (in floats from the bucket's
 * first element) and its matrix view. */
typedef struct ddp_powersgd_tensor {
    size_t offset;
    int64_t rows, cols;
} ddp_powersgd_tensor;

/* Tells the hook bucket b's tensors (*tensors borrowed until the next
 * call, *n of them) and how many buckets there are; 0 or a negative code.
 * The layout may change between iterations (DDP rebuilds its buckets
 * once); the hook follows it (the state of a bucket whose layout changed
 * starts afresh). */
typedef int (*ddp_powersgd_layout_fn)(void *user, int bucket, const ddp_powersgd_tensor **tensors,
                                      int *n, int *nbuckets);

/* A PowerSGD state over buckets described by layout (user borrowed).
 * Invalid options fail with DDP_ERR_INVALID_ARG naming them; as PyTorch,
 * start_powersgd_iter must be > 1 with error feedback or warm start.  Caller
 * destroys (after the hook's last use). */
DDP_API int ddp_powersgd_create(const ddp_powersgd_options *o, ddp_powersgd_layout_fn layout,
                                void *user, ddp_powersgd_t **out);
DDP_API void ddp_powersgd_destroy(ddp_powersgd_t *s);
/* The communication hook (its state is s): register it with
 * ddp_data_parallel_register_comm_hook or ddp_reducer_register_comm_hook. */
DDP_API ddp_comm_hook ddp_powersgd_hook(ddp_powersgd_t *s);

/* DistributedDataParallel with PowerSGD: creates the state over dm's
 * buckets (each parameter a matrix of shape[0] rows) and registers its
 * hook on dm.  Destroy the state after dm. */
DDP_API int ddp_data_parallel_register_powersgd(ddp_data_parallel_t *dm,
                                                const ddp_powersgd_options *o,
                                                ddp_powersgd_t **out);
/* Iterations done (PyTorch's state.iter); set_iter restores it. */
DDP_API int64_t ddp_powersgd_iter(const ddp_powersgd_t *s);
DDP_API void ddp_powersgd_set_iter(ddp_powersgd_t *s, int64_t iter);
/* Floats before and after compression, summed over every compressed
 * iteration (PyTorch's compression stats). */
DDP_API void ddp_powersgd_stats(const ddp_powersgd_t *s, double *before, double *after);
/* Checkpoint state: 2 buffers per bucket seen so far ("powersgd.error.B",
 * "powersgd.q.B"); data borrowed (writable, to load a checkpoint into a
 * state that ran one iteration with the same layout). */
DDP_API int ddp_powersgd_num_states(const ddp_powersgd_t *s);
DDP_API int ddp_powersgd_state(ddp_powersgd_t *s, int i, const char **name, float **data,
                               size_t *count);
/* The whole state of this rank (the iteration, the generator of Q's random
 * starts, every bucket's error, Q and warm-start flag, with its layout) as
 * bytes in a malloc'ed *blob (caller frees), for a per-rank checkpoint
 * file; error feedback differs from rank to rank.  Native byte order. */
DDP_API int ddp_powersgd_state_save(const ddp_powersgd_t *s, void **blob, size_t *len);
/* Restores what ddp_powersgd_state_save wrote (borrows blob), replacing
 * the state; a bucket whose layout turns out to differ at its next
 * iteration starts afresh, as after a bucket rebuild.  A damaged blob
 * fails with DDP_ERR_FORMAT and changes nothing. */
DDP_API int ddp_powersgd_state_load(ddp_powersgd_t *s, const void *blob, size_t len);
/* The same bytes in a file, for a per-rank checkpoint.  save_file writes
 * "<path>.tmp", fsyncs it, renames it over path and fsyncs the folder: a
 * reader finds the old file or the whole new one, also after a crash or a
 * power loss; DDP_ERR_IO names the step that failed (the temporary file is
 * removed).  load_file restores such a file: DDP_ERR_NOT_FOUND when there
 * is none, DDP_ERR_IO when it cannot be read or is not a regular file (a
 * folder, a FIFO), DDP_ERR_FORMAT when it is damaged or ends early (the
 * message names the file and the fault); the state is unchanged by any
 * failure.  Both: DDP_ERR_INVALID_ARG for a NULL state or an empty path,
 * DDP_ERR_NOMEM. */
DDP_API int ddp_powersgd_state_save_file(const ddp_powersgd_t *s, const char *path);
DDP_API int ddp_powersgd_state_load_file(ddp_powersgd_t *s, const char *path);

#ifdef __cplusplus
}
#endif
#endif
