/* ddp-llmc's network, llm.c-style: Linear(784, 256), ReLU, Linear(256, 10)
 * and the fused softmax + cross-entropy, each a _forward/_backward pair
 * over plain arrays (outputs first, then inputs, then sizes; gradients
 * d<name>, accumulated with +=).  Every float operation is done in the
 * order libddp's tape does it (src/nn/ops.c, loss.c, src/tensor/kernels.c),
 * which is what makes the trained weights bitwise ddp-mnist's: the same
 * GEMM calls with the same transposes, leading dimensions and beta, the
 * bias set before the forward GEMM (beta 1), the bias gradient summed row
 * by row, the softmax's sum in double. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "llmc.h"

const char *const tensor_names[NTENSORS] = {"0.weight", "0.bias", "2.weight", "2.bias"};
const size_t tensor_sizes[NTENSORS] = {HIDDEN * IN, HIDDEN, CLASSES * HIDDEN, CLASSES};

void mlp_carve(mlp_tensors *t, float *block)
{
    float **slot[NTENSORS] = {&t->w1, &t->b1, &t->w2, &t->b2};
    for (int i = 0; i < NTENSORS; i++) {
        *slot[i] = block;
        block += tensor_sizes[i];
    }
}

int mlp_acts_create(mlp_acts *a, size_t max_b)
{
    memset(a, 0, sizeof *a);
    a->max_b = max_b;
    float **h[] = {&a->h_pre, &a->h, &a->dh, &a->dh_pre};
    float **c[] = {&a->logits, &a->probs, &a->dlogits};
    for (size_t i = 0; i < 4; i++)
        if (!(*h[i] = malloc(max_b * HIDDEN * sizeof(float))))
            return DDP_ERR_NOMEM;
    for (size_t i = 0; i < 3; i++)
        if (!(*c[i] = malloc(max_b * CLASSES * sizeof(float))))
            return DDP_ERR_NOMEM;
    return 0;
}

void mlp_acts_free(mlp_acts *a)
{
    free(a->h_pre);
    free(a->h);
    free(a->dh);
    free(a->dh_pre);
    free(a->logits);
    free(a->probs);
    free(a->dlogits);
}

/* ==== linear ============================================================== */

/* out (B, OC) = inp (B, C) w^T + bias: the bias is the GEMM's C (beta 1). */
static void linear_forward(float *out, const float *inp, const float *w, const float *bias,
                           size_t B, int C, int OC)
{
    for (size_t r = 0; r < B; r++)
        memcpy(out + r * (size_t)OC, bias, (size_t)OC * sizeof *out);
    ddp_sgemm(0, 1, (int)B, OC, C, 1.0f, inp, C, w, C, 1.0f, out, OC);
}

/* dbias += column sums of dout, row by row; dw (OC, C) += dout^T inp;
 * dinp (B, C) = dout w (written, not accumulated: a fresh activation
 * gradient), when dinp is not NULL. */
static void linear_backward_bias(float *dbias, const float *dout, size_t B, int OC)
{
    for (size_t r = 0; r < B; r++)
        for (int c = 0; c < OC; c++)
            dbias[c] += dout[r * (size_t)OC + (size_t)c];
}

static void linear_backward_weight(float *dw, const float *dout, const float *inp, size_t B, int C,
                                   int OC)
{
    ddp_sgemm(1, 0, OC, C, (int)B, 1.0f, dout, OC, inp, C, 1.0f, dw, C);
}

static void linear_backward_input(float *dinp, const float *dout, const float *w, size_t B, int C,
                                  int OC)
{
    ddp_sgemm(0, 0, (int)B, C, OC, 1.0f, dout, OC, w, C, 0.0f, dinp, C);
}

/* ==== relu ================================================================ */

static void relu_forward(float *out, const float *inp, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = inp[i] > 0.0f ? inp[i] : 0.0f;
}

/* dinp = dout where the output is positive (written). */
static void relu_backward(float *dinp, const float *dout, const float *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dinp[i] = out[i] > 0.0f ? dout[i] : 0.0f;
}

/* ==== softmax + cross-entropy ============================================= */

/* probs (B, V) = softmax(logits); returns the mean of -log probs[label]
 * as log(sum) + max - logit[label], summed in double. */
static float crossentropy_forward(float *probs, const float *logits, const int64_t *labels,
                                  size_t B, int V)
{
    double loss = 0.0;
    for (size_t r = 0; r < B; r++) {
        const float *x = logits + r * (size_t)V;
        float *p = probs + r * (size_t)V;
        float mx = x[0];
        for (int j = 1; j < V; j++)
            mx = x[j] > mx ? x[j] : mx;
        double s = 0.0;
        for (int j = 0; j < V; j++) {
            float e = expf(x[j] - mx);
            p[j] = e;
            s += e;
        }
        float inv = (float)(1.0 / s);
        for (int j = 0; j < V; j++)
            p[j] *= inv;
        loss += log(s) + (double)(mx - x[labels[r]]);
    }
    return (float)(loss / (double)B);
}

/* dlogits = (probs - onehot) / B (written). */
static void crossentropy_backward(float *dlogits, const float *probs, const int64_t *labels,
                                  size_t B, int V)
{
    float scale = 1.0f / (float)B;
    for (size_t i = 0; i < B * (size_t)V; i++)
        dlogits[i] = scale * probs[i];
    for (size_t r = 0; r < B; r++)
        dlogits[r * (size_t)V + (size_t)labels[r]] -= scale;
}

/* ==== the network ========================================================= */

float mlp_forward(const mlp_tensors *p, mlp_acts *a, const float *x, const int64_t *labels,
                  size_t B)
{
    linear_forward(a->h_pre, x, p->w1, p->b1, B, IN, HIDDEN);
    relu_forward(a->h, a->h_pre, B * HIDDEN);
    linear_forward(a->logits, a->h, p->w2, p->b2, B, HIDDEN, CLASSES);
    return crossentropy_forward(a->probs, a->logits, labels, B, CLASSES);
}

/* Where tensor i's gradient is to be written (declares g). */
#define GRAD(i, g) \
    float *g;      \
    if ((rc = io->grad(io->user, (i), &g)) < 0) \
        return rc

int mlp_backward(const mlp_tensors *p, mlp_acts *a, const float *x, const int64_t *labels,
                 size_t B, const mlp_grad_io *io)
{
    int rc;
    crossentropy_backward(a->dlogits, a->probs, labels, B, CLASSES);
    /* layer 2: bias, weight (ready in that order), then the input's gradient */
    GRAD(3, db2);
    linear_backward_bias(db2, a->dlogits, B, CLASSES);
    if ((rc = io->ready(io->user, 3)) < 0)
        return rc;
    GRAD(2, dw2);
    linear_backward_weight(dw2, a->dlogits, a->h, B, HIDDEN, CLASSES);
    linear_backward_input(a->dh, a->dlogits, p->w2, B, HIDDEN, CLASSES);
    if ((rc = io->ready(io->user, 2)) < 0)
        return rc;
    relu_backward(a->dh_pre, a->dh, a->h, B * HIDDEN);
    /* layer 1: x needs no gradient */
    GRAD(1, db1);
    linear_backward_bias(db1, a->dh_pre, B, HIDDEN);
    if ((rc = io->ready(io->user, 1)) < 0)
        return rc;
    GRAD(0, dw1);
    linear_backward_weight(dw1, a->dh_pre, x, B, IN, HIDDEN);
    return io->ready(io->user, 0);
}
