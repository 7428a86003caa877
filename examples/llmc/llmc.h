/* ddp-llmc: a hand-written MLP in llm.c's style (one flat parameter block
 * carved into tensors, a _forward/_backward pair per layer calling
 * ddp_sgemm, no tape, no libddp model) trained data-parallel with the
 * reducer (include/ddp/reducer.h).  model.c holds the network, main.c the
 * job and the training loop.  From the same seed, data and flags it ends
 * with weights bitwise equal to ddp-mnist's (tests/test_llmc.c). */
#ifndef DDP_EXAMPLES_LLMC_H
#define DDP_EXAMPLES_LLMC_H

#include <stddef.h>
#include <stdint.h>

#include "ddp.h"

#define IN 784
#define HIDDEN 256
#define CLASSES 10
#define NTENSORS 4

/* The parameters (and, alike, the gradients): one flat block, in
 * ddp-mnist's registration order, so that the two programs' blocks and
 * files line up. */
typedef struct mlp_tensors {
    float *w1; /* (HIDDEN, IN)      "0.weight" */
    float *b1; /* (HIDDEN)          "0.bias" */
    float *w2; /* (CLASSES, HIDDEN) "2.weight" */
    float *b2; /* (CLASSES)         "2.bias" */
} mlp_tensors;

extern const char *const tensor_names[NTENSORS];
extern const size_t tensor_sizes[NTENSORS];
#define NPARAMS (HIDDEN * IN + HIDDEN + CLASSES * HIDDEN + CLASSES)

/* Activations for batches of up to max_b samples. */
typedef struct mlp_acts {
    size_t max_b;
    float *h_pre;  /* (B, HIDDEN) */
    float *h;      /* (B, HIDDEN) */
    float *logits; /* (B, CLASSES) */
    float *probs;  /* (B, CLASSES) */
    float *dlogits, *dh, *dh_pre; /* the same shapes */
} mlp_acts;

/* Points t's tensors into block (NPARAMS floats). */
void mlp_carve(mlp_tensors *t, float *block);
int mlp_acts_create(mlp_acts *a, size_t max_b);
void mlp_acts_free(mlp_acts *a);
/* Forward of B samples x (B, IN) with labels: logits, probs; returns the
 * mean cross-entropy. */
float mlp_forward(const mlp_tensors *p, mlp_acts *a, const float *x, const int64_t *labels,
                  size_t B);
/* Backward: accumulates (+=) every gradient into g, calling ready(i) the
 * moment tensor i's gradient is final (the last layer's first), and
 * grad(i) just before tensor i's gradient is first written (where to
 * write it: the reducer's buffer).  Returns the first negative code. */
typedef struct mlp_grad_io {
    int (*grad)(void *user, int i, float **g);
    int (*ready)(void *user, int i);
    void *user;
} mlp_grad_io;
int mlp_backward(const mlp_tensors *p, mlp_acts *a, const float *x, const int64_t *labels,
                 size_t B, const mlp_grad_io *io);

#endif
