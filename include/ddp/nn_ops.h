/* libddp nn ops beyond the core set of nn.h: broadcasting element-wise ops,
 * shape ops and views, reductions over dimensions, batched matmul and
 * activations, each a tape op with its backward (PyTorch 1.13's values and
 * gradients; docs/autograd.md "Tensor ops").  Included by ddp/nn.h.
 *
 * Conventions, as torch's:
 *   - dims may be negative (-1 is the last); a bad dim fails with
 *     DDP_ERR_INVALID_ARG naming the op, the dim and the input's shape.
 *   - Broadcasting (NumPy's rule): shapes are aligned at their last
 *     dimension; each pair of sizes must be equal or one of them 1; the
 *     output takes the larger.  The gradient of a broadcast input is summed
 *     over the dimensions it was broadcast along.  Shapes that do not
 *     broadcast fail: "add: shapes (2, 3) and (4, 3) do not broadcast".
 *   - Tensors here are contiguous row-major, so a "view" is an op whose
 *     output shares its input's storage (no copy) and a "copy" one whose
 *     output is new memory.  With no in-place ops, values and gradients are
 *     PyTorch's either way; only the cost differs.  Each op says which.
 *   - Up to DDP_TENSOR_MAX_DIM (8) dimensions everywhere.
 */
#ifndef DDP_PUBLIC_NN_OPS_H
#define DDP_PUBLIC_NN_OPS_H

#include "ddp/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ==== element-wise, broadcasting ======================================== */

/* y = a - b and y = a / b with broadcasting (ddp_op_add and ddp_op_mul of
 * nn.h broadcast the same way).  Division by zero gives inf/nan, as torch. */
DDP_API int ddp_op_sub(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t *b, ddp_var_t **y);
DDP_API int ddp_op_div(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t *b, ddp_var_t **y);

/* Unary element-wise: -a, exp(a), log(a), sqrt(a), |a| (gradient sign(a),
 * 0 at 0, as torch).  log and sqrt of negatives give nan, as torch. */
DDP_API int ddp_op_neg(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y);
DDP_API int ddp_op_exp(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y);
DDP_API int ddp_op_log(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y);
DDP_API int ddp_op_sqrt(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y);
DDP_API int ddp_op_abs(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y);
/* y = a^p for a scalar exponent p (torch.pow(a, p)); gradient p a^(p-1),
 * 0 when p == 0. */
DDP_API int ddp_op_pow(ddp_tape_t *tape, ddp_var_t *a, float p, ddp_var_t **y);
/* y = min(max(a, lo), hi) (torch.clamp); -INFINITY / INFINITY for no bound.
 * The gradient passes where lo <= a <= hi (bounds included, as torch 1.13).
 * lo > hi, or a nan bound, fails. */
DDP_API int ddp_op_clamp(ddp_tape_t *tape, ddp_var_t *a, float lo, float hi, ddp_var_t **y);

/* ==== shape ops ========================================================== */

/* torch.permute: y's dimension i is a's dimension dims[i] (ndim entries, a
 * permutation).  A copy (the identity permutation returns a itself). */
DDP_API int ddp_op_permute(ddp_tape_t *tape, ddp_var_t *a, const int *dims, ddp_var_t **y);
/* torch.transpose(a, d0, d1): permute swapping two dims.  A copy (d0 == d1
 * returns a itself). */
DDP_API int ddp_op_transpose(ddp_tape_t *tape, ddp_var_t *a, int d0, int d1, ddp_var_t **y);
/* a[..., start:end:step, ...] along dim (Python slicing with step >= 1;
 * start and end may be negative, counted from the end, and are clipped to
 * the dim as Python does; the result must not be empty).  A view (no copy)
 * when step is 1 and every dim before dim has size 1 (dim 0 included: the
 * slice is one contiguous block at an offset); a copy otherwise. */
DDP_API int ddp_op_slice(ddp_tape_t *tape, ddp_var_t *a, int dim, int64_t start, int64_t end,
                         int64_t step, ddp_var_t **y);
/* torch.narrow(a, dim, start, length): slice(dim, start, start + length, 1);
 * start may be negative; the range must lie inside the dim. */
DDP_API int ddp_op_narrow(ddp_tape_t *tape, ddp_var_t *a, int dim, int64_t start,
                          int64_t length, ddp_var_t **y);
/* torch.expand: a broadcast to shape (ndim entries, ndim >= a's; -1 keeps
 * a's size; a's sizes must be 1 or equal).  A copy; the gradient sums. */
DDP_API int ddp_op_expand(ddp_tape_t *tape, ddp_var_t *a, int ndim, const int64_t *shape,
                          ddp_var_t **y);
/* torch.contiguous: every var here is contiguous, so y is a itself. */
DDP_API int ddp_op_contiguous(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y);
/* torch.cat(in[0..n-1], dim): same shapes but along dim.  torch.stack: same
 * shapes, joined along a new dim (in [-(ndim+1), ndim]).  Copies. */
DDP_API int ddp_op_cat(ddp_tape_t *tape, int n, ddp_var_t *const *in, int dim, ddp_var_t **y);
DDP_API int ddp_op_stack(ddp_tape_t *tape, int n, ddp_var_t *const *in, int dim,
                         ddp_var_t **y);

/* ==== reductions over dims ==============================================
 * dims: ndims distinct dims to reduce (ndims == 0: all of them); keepdim
 * keeps them as size 1.  Reducing everything without keepdim gives a
 * 0-d var. */

/* torch.sum(a, dims, keepdim) and torch.mean(a, dims, keepdim). */
DDP_API int ddp_op_sum_dims(ddp_tape_t *tape, ddp_var_t *a, int ndims, const int *dims,
                            int keepdim, ddp_var_t **y);
DDP_API int ddp_op_mean_dims(ddp_tape_t *tape, ddp_var_t *a, int ndims, const int *dims,
                             int keepdim, ddp_var_t **y);
/* torch.var(a, dims, unbiased, keepdim): the mean squared deviation divided
 * by N - 1 (unbiased) or N, N the number of elements reduced; N - 1 == 0
 * gives nan, as torch. */
DDP_API int ddp_op_var(ddp_tape_t *tape, ddp_var_t *a, int ndims, const int *dims,
                       int unbiased, int keepdim, ddp_var_t **y);
/* The values of torch.max(a, dim, keepdim): the gradient goes to the arg
 * max, the FIRST of equal maxima (torch 1.13's CPU rule; a nan counts as
 * the maximum, as torch). */
DDP_API int ddp_op_max(ddp_tape_t *tape, ddp_var_t *a, int dim, int keepdim, ddp_var_t **y);
/* torch.argmax(a, dim, keepdim): the index of the first maximum, as a float
 * var (exact below 2^24) that never requires grad; *indices, when not
 * NULL, also gets them as int64 (y's numel entries, caller's memory). */
DDP_API int ddp_op_argmax(ddp_tape_t *tape, ddp_var_t *a, int dim, int keepdim,
                          int64_t *indices, ddp_var_t **y);

/* ==== matmul =============================================================
 * ddp_op_matmul of nn.h is torch.matmul: a (..., M, K) and b (..., K, N),
 * one GEMM per batch with the batch dims broadcast, y (batch..., M, N); a
 * 1-D a is a row (1, K) and a 1-D b a column (K, 1), that dim removed from
 * y.  Its gradient sums over the batches an input was broadcast along. */

/* ==== activations ======================================================== */

/* nn.LeakyReLU(slope): a for a > 0, slope * a otherwise (gradient slope at 0,
 * as torch). */
DDP_API int ddp_op_leaky_relu(ddp_tape_t *tape, ddp_var_t *a, float slope, ddp_var_t **y);
/* nn.GELU(approximate): approx 0 is the exact 0.5 a (1 + erf(a / sqrt 2)),
 * 1 the "tanh" approximation 0.5 a (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3))). */
#define DDP_GELU_EXACT 0
#define DDP_GELU_TANH 1
DDP_API int ddp_op_gelu(ddp_tape_t *tape, ddp_var_t *a, int approx, ddp_var_t **y);
/* nn.SiLU: a * sigmoid(a). */
DDP_API int ddp_op_silu(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y);
/* softmax and log-softmax along any dim, numerically stable (max
 * subtracted, sums in double).  ddp_op_log_softmax of nn.h is the last dim. */
DDP_API int ddp_op_softmax(ddp_tape_t *tape, ddp_var_t *a, int dim, ddp_var_t **y);
DDP_API int ddp_op_log_softmax_dim(ddp_tape_t *tape, ddp_var_t *a, int dim, ddp_var_t **y);

/* ==== activation modules =================================================
 * nn.LeakyReLU(slope), nn.GELU(approximate), nn.SiLU(), nn.Tanh(),
 * nn.Sigmoid(), nn.Softmax(dim), nn.LogSoftmax(dim): modules without
 * parameters (for Sequential), each running its op above.  Bad arguments
 * (a non-finite slope, an unknown approximation) fail at creation; a dim
 * out of range for the input fails at forward.  Built on the user-module
 * interface of ddp/nn_module.h (ddp_module_create). */
DDP_API int ddp_leaky_relu_create(float slope, ddp_module_t **out);
DDP_API int ddp_gelu_create(int approx, ddp_module_t **out);
DDP_API int ddp_silu_create(ddp_module_t **out);
DDP_API int ddp_tanh_create(ddp_module_t **out);
DDP_API int ddp_sigmoid_create(ddp_module_t **out);
DDP_API int ddp_softmax_create(int dim, ddp_module_t **out);
DDP_API int ddp_log_softmax_create(int dim, ddp_module_t **out);

#ifdef __cplusplus
}
#endif
#endif
