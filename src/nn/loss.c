/* The losses, each forward followed by its backward (as in ops.c):
 * log_softmax, nll_loss, mse_loss and cross_entropy (fused log-softmax and
 * nll, numerically stable: max subtracted, sums in double).  Labels are
 * checked with the bad label and its index named. */
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "nn/ops.h"
#include "tensor/kernels.h"

/* Checks a (B, C) logits / log-probability input and its B labels. */
static int log_softmax_backward(ddp_tape_t *tape, ddp_var_t *v);
/* nll (probs NULL) and cross-entropy (probs: its saved softmax). */
static int labels_backward(ddp_tape_t *tape, ddp_var_t *v, const float *probs);
static int mse_backward(ddp_tape_t *tape, ddp_var_t *v);
static int nll_backward(ddp_tape_t *tape, ddp_var_t *v) { return labels_backward(tape, v, NULL); }
static int cross_entropy_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    return labels_backward(tape, v, v->aux);
}

static const ddp__op_def log_softmax_def = {"log_softmax", log_softmax_backward, 0};
static const ddp__op_def nll_def = {"nll_loss", nll_backward, 0};
static const ddp__op_def mse_def = {"mse_loss", mse_backward, 0};
static const ddp__op_def cross_entropy_def = {"cross_entropy", cross_entropy_backward, 0};

static int check_logits(const ddp_tape_t *tape, ddp_var_t *x, const int64_t *labels,
                        const char *op)
{
    DDP_SHAPE_BUFS;
    DDP_TRY(ddp__op_check_var(tape, x, op, "input"));
    DDP_FAIL_IF(x->t.ndim != 2, DDP_ERR_INVALID_ARG,
                "%s: input must be (batch, classes), got shape %s", op, DDP_SHAPE(x, 0));
    DDP_FAIL_IF(!labels, DDP_ERR_INVALID_ARG, "%s: labels are NULL", op);
    int64_t rows = x->t.shape[0], classes = x->t.shape[1];
    for (int64_t i = 0; i < rows; i++)
        DDP_FAIL_IF(labels[i] < 0 || labels[i] >= classes, DDP_ERR_INVALID_ARG,
                    "%s: label %lld at index %lld is out of range for %lld classes", op,
                    (long long)labels[i], (long long)i, (long long)classes);
    return 0;
}

static int copy_labels(ddp_tape_t *tape, ddp_var_t *v, const int64_t *labels, int64_t n)
{
    v->labels = ddp__tape_alloc(tape, (size_t)n * sizeof *labels);
    if (!v->labels)
        return DDP_ERR_NOMEM;
    memcpy(v->labels, labels, (size_t)n * sizeof *labels);
    return 0;
}

int ddp_op_log_softmax(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y)
{
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "log_softmax: NULL tape or output");
    DDP_TRY(ddp__op_check_var(tape, a, "log_softmax", "input"));
    ddp_var_t *v;
    DDP_TRY(ddp__op_push(tape, &log_softmax_def, a->t.ndim, a->t.shape, 1, a, NULL, NULL, &v));
    int64_t c = ddp__op_last_dim(a), rows = a->t.numel / c;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = a->t.data + r * c;
        float *o = v->t.data + r * c;
        float mx = x[0];
        for (int64_t j = 1; j < c; j++)
            mx = x[j] > mx ? x[j] : mx;
        double s = 0.0;
        for (int64_t j = 0; j < c; j++)
            s += exp((double)(x[j] - mx));
        float lse = mx + (float)log(s);
        for (int64_t j = 0; j < c; j++)
            o[j] = x[j] - lse;
    }
    *y = v;
    return 0;
}

/* dx = dy - softmax * sum(dy), softmax = exp(y) */
static int log_softmax_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    ddp_var_t *a = v->in[0];
    int64_t c = ddp__op_last_dim(a), rows = a->t.numel / c;
    int acc;
    DDP_GRAD_TARGET(da, a);
    for (int64_t r = 0; r < rows; r++) {
        const float *dy = v->grad + r * c, *y = v->t.data + r * c;
        float *dx = da + r * c;
        double s = 0.0;
        for (int64_t j = 0; j < c; j++)
            s += dy[j];
        for (int64_t j = 0; j < c; j++) {
            float g = dy[j] - expf(y[j]) * (float)s;
            dx[j] = acc ? dx[j] + g : g;
        }
    }
    return 0;
}

int ddp_op_nll_loss(ddp_tape_t *tape, ddp_var_t *logp, const int64_t *labels, ddp_var_t **y)
{
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "nll_loss: NULL tape or output");
    DDP_TRY(check_logits(tape, logp, labels, "nll_loss"));
    int64_t rows = logp->t.shape[0], c = logp->t.shape[1];
    ddp_var_t *v;
    DDP_TRY(ddp__op_push(tape, &nll_def, 0, NULL, 1, logp, NULL, NULL, &v));
    DDP_TRY(copy_labels(tape, v, labels, rows));
    double s = 0.0;
    for (int64_t r = 0; r < rows; r++)
        s -= logp->t.data[r * c + labels[r]];
    v->t.data[0] = (float)(s / (double)rows);
    *y = v;
    return 0;
}

/* nll: dx = -dloss / B at the labels; with probs (cross-entropy, its saved
 * softmax): dx = (p - onehot) dloss / B. */
static int labels_backward(ddp_tape_t *tape, ddp_var_t *v, const float *probs)
{
    ddp_var_t *a = v->in[0];
    int64_t c = ddp__op_last_dim(a), rows = a->t.numel / c;
    int acc;
    DDP_GRAD_TARGET(da, a);
    float scale = v->grad[0] / (float)rows;
    if (probs)
        ddp__vec_scale_to(da, scale, probs, (size_t)a->t.numel, acc);
    else if (!acc)
        ddp__vec_fill_to(da, 0.0f, (size_t)a->t.numel, 0);
    for (int64_t r = 0; r < rows; r++)
        da[r * c + v->labels[r]] -= scale;
    return 0;
}

int ddp_op_mse_loss(ddp_tape_t *tape, ddp_var_t *input, ddp_var_t *target, ddp_var_t **y)
{
    DDP_SHAPE_BUFS;
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "mse_loss: NULL tape or output");
    DDP_TRY(ddp__op_check_var(tape, input, "mse_loss", "input"));
    DDP_TRY(ddp__op_check_var(tape, target, "mse_loss", "target"));
    DDP_FAIL_IF(!ddp_tensor_same_shape(&input->t, &target->t), DDP_ERR_INVALID_ARG,
                "mse_loss: input of shape %s and target of shape %s differ", DDP_SHAPE(input, 0),
                DDP_SHAPE(target, 1));
    ddp_var_t *v;
    DDP_TRY(ddp__op_push(tape, &mse_def, 0, NULL, 1, input, target, NULL, &v));
    double s = 0.0;
    for (int64_t i = 0; i < input->t.numel; i++) {
        double d = (double)input->t.data[i] - target->t.data[i];
        s += d * d;
    }
    v->t.data[0] = (float)(s / (double)input->t.numel);
    *y = v;
    return 0;
}

/* d/da = 2 (a - b) / n, d/db = -d/da */
static int mse_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    ddp_var_t *a = v->in[0], *b = v->in[1];
    size_t n = (size_t)a->t.numel;
    const float *dy = v->grad;
    int acc;
    float k = 2.0f * dy[0] / (float)n;
    for (int side = 0; side < 2; side++) {
        ddp_var_t *t = side ? b : a;
        if (!t->requires_grad)
            continue;
        DDP_GRAD_TARGET(dt, t);
        float ks = side ? -k : k;
        for (size_t i = 0; i < n; i++) {
            float g = ks * (a->t.data[i] - b->t.data[i]);
            dt[i] = acc ? dt[i] + g : g;
        }
    }
    return 0;
}

int ddp_op_cross_entropy(ddp_tape_t *tape, ddp_var_t *logits, const int64_t *labels,
                         ddp_var_t **y)
{
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "cross_entropy: NULL tape or output");
    DDP_TRY(check_logits(tape, logits, labels, "cross_entropy"));
    int64_t rows = logits->t.shape[0], c = logits->t.shape[1];
    ddp_var_t *v;
    DDP_TRY(ddp__op_push(tape, &cross_entropy_def, 0, NULL, 1, logits, NULL, NULL, &v));
    DDP_TRY(copy_labels(tape, v, labels, rows));
    /* Save softmax probabilities for backward: d/dlogits = (p - onehot) / B
     * (without grad, one row of scratch is enough). */
    int save = v->requires_grad;
    v->aux = ddp__tape_alloc(tape, (size_t)(save ? logits->t.numel : c) * sizeof(float));
    if (!v->aux)
        return DDP_ERR_NOMEM;
    double loss = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits->t.data + r * c;
        float *p = v->aux + (save ? r * c : 0);
        float mx = x[0];
        for (int64_t j = 1; j < c; j++)
            mx = x[j] > mx ? x[j] : mx;
        double s = 0.0;
        for (int64_t j = 0; j < c; j++) {
            float e = expf(x[j] - mx);
            p[j] = e;
            s += e;
        }
        float inv = (float)(1.0 / s);
        for (int64_t j = 0; j < c; j++)
            p[j] *= inv;
        loss += log(s) + (double)(mx - x[labels[r]]);
    }
    v->t.data[0] = (float)(loss / (double)rows);
    *y = v;
    return 0;
}

/* Its backward is nll's with the saved probabilities: labels_backward. */
