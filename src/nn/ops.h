/* What the op files share (ops.c: the tensor ops; loss.c: the losses;
 * every other op file): argument checks, pushing an op's output
 * var, the gradient target, shape strings for messages. */
#ifndef DDP_NN_OPS_H
#define DDP_NN_OPS_H

#include "nn/autograd.h"

/* v is a var of this tape's current iteration (else a message naming op and arg). */
int ddp__op_check_var(const ddp_tape_t *tape, const ddp_var_t *v, const char *op,
                      const char *arg);
/* Pushes the output var of op def and links its inputs (NULL inputs are
 * skipped); alloc: arena storage for its value. */
int ddp__op_push(ddp_tape_t *tape, const ddp__op_def *def, int ndim, const int64_t *shape,
                 int alloc, ddp_var_t *a, ddp_var_t *b, ddp_var_t *c, ddp_var_t **out);
/* The same for nin inputs (1 .. DDP_VAR_MAX_IN; none NULL). */
int ddp__op_push_n(ddp_tape_t *tape, const ddp__op_def *def, int ndim, const int64_t *shape,
                   int alloc, int nin, ddp_var_t *const *in, ddp_var_t **out);

static inline int64_t ddp__op_last_dim(const ddp_var_t *v)
{
    return v->t.ndim ? v->t.shape[v->t.ndim - 1] : 1;
}

/* Shape strings for messages: DDP_SHAPE(v, i) formats into the i-th buffer. */
#define DDP_SHAPE(v, i) ddp_tensor_shape_str(&(v)->t, sbuf[i], sizeof sbuf[0])
#define DDP_SHAPE_BUFS char sbuf[2][64]

/* g = the gradient buffer of var, acc = add (1) or write (0). */
#define DDP_GRAD_TARGET(g, var)                     \
    float *g = ddp__grad_target(tape, (var), &acc); \
    if (!g)                                         \
        return tape->grad_target_rc

#endif
