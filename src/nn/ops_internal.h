/* What the tensor-op files (ops_*.c) share: dim normalisation, the
 * broadcast/strided loop plan (ops_broadcast.c) that every op with a shape
 * change is written with (broadcasting, permute, slice, cat, reductions over
 * dims), and the element-wise unary op frame (ops_elementwise.c) that the
 * activations reuse. */
#ifndef DDP_NN_OPS_INTERNAL_H
#define DDP_NN_OPS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "ddp/nn_ops.h"
#include "nn/ops.h"

/* ==== dims ================================================================ */

/* dim in [-ndim, ndim) to [0, ndim); else DDP_ERR_INVALID_ARG: "op: dim 5 is
 * out of range for shape (2, 3)".  ndim is a's, or a's + 1 (stack). */
int ddp__op_dim(const char *op, const ddp_var_t *a, int dim, int ndim, int *out);
/* Marks the dims to reduce (reduce[d] = 1; ndims == 0: all), checking range
 * and repeats. */
int ddp__op_reduce_dims(const char *op, const ddp_var_t *a, int ndims, const int *dims,
                        int *reduce);

/* ==== strided loops =======================================================
 * An iteration space of `shape` (contiguous row-major: element i is the i-th
 * of the walk) and up to two operands, each seen through its own strides
 * (in elements; 0 along a dimension it is broadcast along).  The plan drops
 * size-1 dims and merges dims that every operand walks contiguously, so that
 * same-shape operands become one flat loop and a row broadcast two. */
#define DDP__PLAN_OPS 2

typedef struct ddp__plan {
    int ndim;                                  /* >= 1 after merging */
    int64_t shape[DDP_TENSOR_MAX_DIM];
    int64_t stride[DDP__PLAN_OPS][DDP_TENSOR_MAX_DIM];
    int64_t rows, cols;                        /* walk = rows x cols, cols the last dim */
} ddp__plan;

/* nops operands with strides st[k] (ndim entries each; NULL: contiguous). */
void ddp__plan_init(ddp__plan *p, int ndim, const int64_t *shape, int nops,
                    const int64_t *const *st);
/* Offset of operand k at the start of row r, and at walk element i. */
int64_t ddp__plan_row(const ddp__plan *p, int k, int64_t r);
int64_t ddp__plan_offset(const ddp__plan *p, int k, int64_t i);
/* y (the walk, contiguous) (=|+=) scale * x (operand k). */
void ddp__plan_gather(const ddp__plan *p, int k, float *y, const float *x, float scale, int acc);
/* x (operand k) (=|+=) scale * y (the walk, contiguous), element by element in
 * walk order: with add, elements the walk visits twice (a broadcast) sum. */
void ddp__plan_scatter(const ddp__plan *p, int k, float *x, const float *y, float scale,
                       int add);

/* Strides of t seen in an ndim-dim shape that it broadcasts to (aligned at
 * the last dim; 0 where t has size 1 or no dim). */
void ddp__bcast_strides(const ddp_tensor *t, int ndim, const int64_t *shape, int64_t *stride);
/* The broadcast shape (*n dims) of shapes sa (na dims) and sb (nb dims);
 * -1 - d when they do not broadcast at dim d of the result. */
int ddp__bcast_dims(int na, const int64_t *sa, int nb, const int64_t *sb, int *n, int64_t *out);
/* The broadcast shape of a and b, or "op: shapes (2, 3) and (4, 3) do not
 * broadcast". */
int ddp__bcast_shape(const char *op, const ddp_var_t *a, const ddp_var_t *b, int *ndim,
                     int64_t *shape);
/* dx (x's numel, the gradient of x broadcast to the walk of p, operand k)
 * (=|+=) the sum of scale * dy over the broadcast. */
void ddp__bcast_reduce_to(const ddp__plan *p, int k, float *dx, size_t nx, const float *dy,
                          float scale, int acc);

/* ==== element-wise unary ops ============================================
 * y = f(x, p) element by element; backward dx = dy * df(x, y, p), p the
 * op's two scalar arguments (slope, bounds, exponent; saved in v->ctx).  An
 * op is one ddp__unary_def (its def first, so that v->def leads back to it);
 * ops_elementwise.c and ops_activation.c define theirs. */
typedef struct ddp__unary_def {
    ddp__op_def def;
    float (*f)(float x, const float *p);
    float (*df)(float x, float y, const float *p);
} ddp__unary_def;

int ddp__unary_op(ddp_tape_t *tape, const ddp__unary_def *k, ddp_var_t *a, float p0, float p1,
                  ddp_var_t **y);
/* The backward of every ddp__unary_def (its def.backward). */
int ddp__unary_backward(ddp_tape_t *tape, ddp_var_t *v);

#endif
