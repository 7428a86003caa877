/* What the op files share (ops.c: the tensor ops and the backward
 * dispatch; loss.c: the losses): argument checks, pushing an op's output
 * var, the gradient target, shape strings for messages. */
#ifndef DDP_NN_OPS_H
#define DDP_NN_OPS_H

#include "nn/autograd.h"

/* v is a var of this tape's current iteration (else a message naming op and arg). */
int ddp__op_check_var(const ddp_tape_t *tape, const ddp_var_t *v, const char *op,
                      const char *arg);
/* Pushes the output var and links its inputs (NULL inputs are skipped). */
int ddp__op_push(ddp_tape_t *tape, int op, int ndim, const int64_t *shape, int alloc,
                 ddp_var_t *a, ddp_var_t *b, ddp_var_t *c, ddp_var_t **out);

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
        return DDP_ERR_NOMEM

/* The losses' backwards (loss.c), for the dispatch. */
int ddp__log_softmax_backward(ddp_tape_t *tape, ddp_var_t *v);
/* nll (probs NULL) and cross-entropy (probs: its saved softmax). */
int ddp__labels_backward(ddp_tape_t *tape, ddp_var_t *v, const float *probs);
int ddp__mse_backward(ddp_tape_t *tape, ddp_var_t *v);

#endif
