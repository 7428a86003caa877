/* libddp extension seams: the unstable interfaces that DistributedDataParallel
 * (and other layers that wrap a model, such as a user's own reducer) build
 * on, kept out of the umbrella header ddp.h as zstd keeps its
 * ZSTD_STATIC_LINKING_ONLY section apart.  Include it explicitly
 * (#include <ddp/ext.h>); what it declares may change between minor
 * versions, and the plain API never needs it.
 *
 * GRAD-READY CONTRACT (what DistributedDataParallel builds on):
 *
 *   1. During ddp_tape_backward(tape, loss, model), the model's hook
 *      (ddp_model_set_grad_ready_hook) is called exactly once for every
 *      parameter of the model.
 *   2. First, at the START of backward, before any gradient is computed, every
 *      parameter that the loss does not depend on in this graph (not on the
 *      tape, or on the tape but with no path to the loss) is reported with
 *      used = 0, in registration order.  Its gradient is left as it was.
 *   3. Then each used parameter is reported with used = 1 at the moment its
 *      gradient is FINAL for this backward: all contributions have been added
 *      into p->grad, including every use of a shared weight (the hook fires
 *      after the op that is processed last, i.e. the earliest use in forward
 *      order).  Hooks fire in the order gradients become final.  Within one
 *      op, its inputs are reported in reverse argument order (linear(x, w,
 *      b): b, then w); for a Sequential MLP this is reverse registration
 *      order (2.bias, 2.weight, 0.bias, 0.weight).
 *   4. Gradients accumulate: backward adds into p->grad, so two backward
 *      calls without a zero_grad in between sum their gradients (PyTorch
 *      semantics; DDP's no_sync relies on it).
 *   5. p->grad may be re-pointed by an outside party between steps (or
 *      between forward and backward) with ddp_param_set_grad or
 *      ddp_model_set_grad_block; backward reads p->grad when it writes, so
 *      gradient buckets can be views into the owner's memory with no copy.
 *   6. A hook returning a negative code stops the backward pass, which
 *      returns that code (the hook sets ddp_last_error's message).
 *
 * CHUNKED WEIGHT GRADIENTS (optional; what DDP's tail-free overlap builds on):
 *
 *   7. With a chunk hook installed (ddp_model_set_grad_chunk_hook), when the
 *      backward of ddp_op_linear(x, w, b) is about to add the LAST
 *      contribution to a weight w of the model (its last reachable use, w
 *      appearing once among the op's inputs), it first reports the op's bias
 *      as ready if that was its last use (rule 3 still holds: b before w),
 *      then asks plan(w, rows, user) how many row chunks to compute dW in.
 *      With n > 1, dW (rows = w->shape[0] output features, each row
 *      contiguous) is computed in n row ranges [r0, r1), ascending, their
 *      boundaries on multiples of DDP_GRAD_CHUNK_ROW_ALIGN (fewer chunks when
 *      the rows do not allow n), and chunk(w, r0, r1, user) is called after
 *      each: rows r0 .. r1-1 of w->grad are final then.  The last call has
 *      r1 == rows.  w's grad-ready hook then fires as rule 3 says.  The
 *      gradient is bitwise the one an unchunked backward computes (the
 *      alignment keeps every row in the GEMM micro-kernel position it has in
 *      the whole product; tests/test_autograd_hooks.c checks it).  Negative
 *      returns stop backward as in rule 6.
 *
 * WHERE A GRADIENT IS WRITTEN (optional; what ZeRO-2's gradient pool builds on):
 *
 *   8. With a grad-write hook installed (ddp_model_set_grad_write_hook),
 *      backward calls it once per used parameter per backward pass, just
 *      before its first write into that parameter's gradient, with *grad =
 *      p->grad.  The hook may point *grad at other memory (p->numel floats
 *      that stay valid until the grad-ready hook, or later, is done with
 *      them); backward then adds (+=) every contribution there, so the hook
 *      zeroes that memory unless it means to accumulate, and p->grad is set
 *      to it.  Parameters the pass does not use get no call.  A negative
 *      return stops backward as in rule 6.
 *
 * WHEN THE GRADIENTS ARE ZERO (optional; what ZeRO-2 saves a pass with):
 *
 *   9. With a zero-grad hook installed (ddp_model_set_zero_grad_hook),
 *      ddp_model_zero_grad (so also ddp_optim_zero_grad) calls it once,
 *      after zeroing every gradient.  The owner of the memory the
 *      gradients view (ZeRO-2's reducer) may then write its next results
 *      there instead of adding them: the same numbers, one pass less.
 *
 */
#ifndef DDP_EXT_H
#define DDP_EXT_H

#include "ddp/data.h"
#include "ddp/ddp.h"
#include "ddp/nn.h"
#include "ddp/reducer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ==== gradients: where backward writes, and who hears of it =============== */

/* Grad-ready hook: see the contract at the top.  Return 0, or a negative
 * code to stop backward. */
typedef int (*ddp_grad_ready_fn)(ddp_param *p, int used, void *user);

/* Points p->grad at ptr (p->numel floats, borrowed: it must outlive its use
 * by the model), copying the current gradient there first.  ptr NULL points
 * it back at the model's own grad block (copying back). */
DDP_API int ddp_param_set_grad(ddp_param *p, float *ptr);
/* Points p->data at ptr (p->numel floats, borrowed: the caller keeps it
 * alive), whose values become the parameter's (nothing is copied): a view
 * of a parameter in memory someone else owns, as ZeRO's shard optimizer
 * steps a piece of another model's parameter block.  ptr NULL points it
 * back at the model's own block (copying the values back). */
DDP_API int ddp_param_set_data(ddp_param *p, float *ptr);
/* Same for every parameter at once: block holds the model's total numel
 * floats laid out as the grad block (NULL: back to the model's own). */
DDP_API int ddp_model_set_grad_block(ddp_model_t *m, float *block);
/* Registers the grad-ready hook (replacing any earlier one; fn NULL removes
 * it).  DistributedDataParallel installs its own. */
DDP_API void ddp_model_set_grad_ready_hook(ddp_model_t *m, ddp_grad_ready_fn fn, void *user);
DDP_API ddp_grad_ready_fn ddp_model_grad_ready_hook(const ddp_model_t *m, void **user);

/* Grad-write hook (contract rule 8): *grad may be replaced; return 0 or a
 * negative code to stop backward.  fn NULL removes it. */
typedef int (*ddp_grad_write_fn)(ddp_param *p, float **grad, void *user);
DDP_API void ddp_model_set_grad_write_hook(ddp_model_t *m, ddp_grad_write_fn fn, void *user);
DDP_API ddp_grad_write_fn ddp_model_grad_write_hook(const ddp_model_t *m, void **user);

/* Zero-grad hook (contract rule 9), replacing any earlier one; fn NULL
 * removes it. */
typedef void (*ddp_zero_grad_fn)(ddp_model_t *m, void *user);
DDP_API void ddp_model_set_zero_grad_hook(ddp_model_t *m, ddp_zero_grad_fn fn, void *user);

/* Row chunks of a weight gradient (contract rule 7).  plan returns the number
 * of chunks wanted (0 or 1: compute dW whole) or a negative code; chunk is
 * called after each chunk with its row range. */
#define DDP_GRAD_CHUNK_ROW_ALIGN 48
typedef struct ddp_grad_chunk_hook {
    int (*plan)(ddp_param *p, int64_t rows, void *user);
    int (*chunk)(ddp_param *p, int64_t row_begin, int64_t row_end, void *user);
    void *user; /* borrowed */
} ddp_grad_chunk_hook;
/* The row boundaries backward uses for nchunks chunks of a weight with rows
 * output features: bounds[0] = 0 < bounds[1] < ... < bounds[n] = rows, n
 * returned (1 <= n <= nchunks; bounds holds nchunks + 1 entries). */
DDP_API int ddp_grad_chunk_bounds(int64_t rows, int nchunks, int64_t *bounds);
/* Installs (a copy of) hook, replacing any earlier one; NULL removes it. */
DDP_API void ddp_model_set_grad_chunk_hook(ddp_model_t *m, const ddp_grad_chunk_hook *hook);
/* The installed chunk hook, or NULL (borrowed from the model). */
DDP_API const ddp_grad_chunk_hook *ddp_model_grad_chunk_hook(const ddp_model_t *m);

/* ==== DistributedDataParallel introspection ================================ */

/* Introspection: number of buckets, and bucket b's parameter count and
 * size in floats; whether the buckets were rebuilt. */
DDP_API int ddp_data_parallel_num_buckets(const ddp_data_parallel_t *dm);
DDP_API int ddp_data_parallel_bucket_info(const ddp_data_parallel_t *dm, int b, int *nparams,
                                          size_t *numel);
DDP_API int ddp_data_parallel_buckets_rebuilt(const ddp_data_parallel_t *dm);
/* The reducer under the wrapper (borrowed; include/ddp/reducer.h), for its
 * stats and shard bounds.  Driving it by hand under DDP is not supported. */
DDP_API ddp_reducer_t *ddp_data_parallel_reducer(ddp_data_parallel_t *dm);

/* ==== data ================================================================= */

/* The images of an MNIST dataset as stored, (count, rows, cols) uint8, and its
 * labels (count); borrowed from the dataset.  DDP_ERR_INVALID_ARG when ds is
 * not an MNIST dataset. */
DDP_API int ddp_mnist_raw(const ddp_dataset_t *ds, const ddp_idx **images,
                          const ddp_idx **labels);

#ifdef __cplusplus
}
#endif

#endif
