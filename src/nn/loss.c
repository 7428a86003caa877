/* The losses, each forward followed by its backward (as in ops.c):
 * nll_loss, mse_loss, cross_entropy (fused log-softmax and
 * nll, numerically stable: max subtracted, sums in double) with PyTorch
 * 1.13's ignore_index and label_smoothing, and binary_cross_entropy_with_logits
 * (stable for any logit, optional pos_weight).  Labels are checked with the bad label and its index named.
 * log_softmax itself is ops_activation.c's. */
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "nn/ops.h"
#include "tensor/kernels.h"

static int labels_backward(ddp_tape_t *tape, ddp_var_t *v);
static int mse_backward(ddp_tape_t *tape, ddp_var_t *v);

static const ddp__op_def nll_def = {"nll_loss", labels_backward, 0};
static const ddp__op_def mse_def = {"mse_loss", mse_backward, 0};
static const ddp__op_def cross_entropy_def = {"cross_entropy", labels_backward, 0};

/* What nll and cross-entropy keep for backward (v->ctx); cross-entropy's
 * softmax probabilities are in v->aux, nll has none. */
typedef struct labels_ctx {
    int64_t ignore_index;
    float smoothing; /* label_smoothing (cross-entropy only) */
    int64_t valid;   /* rows whose label is not ignore_index: the mean's divisor */
} labels_ctx;

ddp_cross_entropy_options ddp_cross_entropy_defaults(void)
{
    return (ddp_cross_entropy_options){.ignore_index = -100, .label_smoothing = 0.0f};
}

ddp_nll_loss_options ddp_nll_loss_defaults(void)
{
    return (ddp_nll_loss_options){.ignore_index = -100};
}

/* Checks a (B, C) logits / log-probability input and its B labels, each in
 * [0, C) or ignore_index; counts the rows not ignored. */
static int check_logits(const ddp_tape_t *tape, ddp_var_t *x, const int64_t *labels,
                        int64_t ignore, const char *op, int64_t *valid)
{
    DDP_SHAPE_BUFS;
    DDP_TRY(ddp__op_check_var(tape, x, op, "input"));
    DDP_FAIL_IF(x->t.ndim != 2, DDP_ERR_INVALID_ARG,
                "%s: input must be (batch, classes), got shape %s", op, DDP_SHAPE(x, 0));
    DDP_FAIL_IF(!labels, DDP_ERR_INVALID_ARG, "%s: labels are NULL", op);
    int64_t rows = x->t.shape[0], classes = x->t.shape[1];
    *valid = 0;
    for (int64_t i = 0; i < rows; i++) {
        if (labels[i] == ignore)
            continue;
        DDP_FAIL_IF(labels[i] < 0 || labels[i] >= classes, DDP_ERR_INVALID_ARG,
                    "%s: label %lld at index %lld is out of range for %lld classes", op,
                    (long long)labels[i], (long long)i, (long long)classes);
        (*valid)++;
    }
    return 0;
}

/* The op's var with its labels copied and its ctx. */
static int push_labels_op(ddp_tape_t *tape, const ddp__op_def *def, ddp_var_t *x,
                          const int64_t *labels, int64_t ignore, float smoothing,
                          int64_t valid, ddp_var_t **out)
{
    ddp_var_t *v;
    DDP_TRY(ddp__op_push(tape, def, 0, NULL, 1, x, NULL, NULL, &v));
    int64_t n = x->t.shape[0];
    v->labels = ddp__tape_alloc(tape, (size_t)n * sizeof *labels);
    labels_ctx *c = ddp__tape_alloc(tape, sizeof *c);
    if (!v->labels || !c)
        return DDP_ERR_NOMEM;
    memcpy(v->labels, labels, (size_t)n * sizeof *labels);
    *c = (labels_ctx){.ignore_index = ignore, .smoothing = smoothing, .valid = valid};
    v->ctx = c;
    *out = v;
    return 0;
}

int ddp_op_nll_loss(ddp_tape_t *tape, ddp_var_t *logp, const int64_t *labels, ddp_var_t **y)
{
    ddp_nll_loss_options o = ddp_nll_loss_defaults();
    return ddp_op_nll_loss_opts(tape, logp, labels, &o, y);
}

int ddp_op_nll_loss_opts(ddp_tape_t *tape, ddp_var_t *logp, const int64_t *labels,
                       const ddp_nll_loss_options *opts, ddp_var_t **y)
{
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "nll_loss: NULL tape or output");
    ddp_nll_loss_options o = opts ? *opts : ddp_nll_loss_defaults();
    int64_t valid;
    DDP_TRY(check_logits(tape, logp, labels, o.ignore_index, "nll_loss", &valid));
    int64_t rows = logp->t.shape[0], c = logp->t.shape[1];
    ddp_var_t *v;
    DDP_TRY(push_labels_op(tape, &nll_def, logp, labels, o.ignore_index, 0.0f, valid, &v));
    double s = 0.0;
    for (int64_t r = 0; r < rows; r++)
        if (labels[r] != o.ignore_index)
            s -= logp->t.data[r * c + labels[r]];
    v->t.data[0] = (float)(s / (double)valid); /* every row ignored: NaN, as PyTorch */
    *y = v;
    return 0;
}

/* nll: dx = -dloss / n at the labels; cross-entropy (v->aux: its saved
 * softmax): dx = (p - (1 - e) onehot - e / C) dloss / n, with n the rows not
 * ignored and e the label smoothing; ignored rows get 0. */
static int labels_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    ddp_var_t *a = v->in[0];
    const labels_ctx *lc = v->ctx;
    const float *probs = v->aux;
    int64_t c = ddp__op_last_dim(a), rows = a->t.numel / c;
    int acc;
    DDP_GRAD_TARGET(da, a);
    float scale = lc->valid ? v->grad[0] / (float)lc->valid : 0.0f;
    float e = lc->smoothing, off = e / (float)c, on = scale * (1.0f - e);
    for (int64_t r = 0; r < rows; r++) {
        float *d = da + r * c;
        int ignored = v->labels[r] == lc->ignore_index;
        if (ignored || !probs) /* nll, or a row with no gradient */
            ddp__vec_fill_to(d, 0.0f, (size_t)c, acc);
        else if (e == 0.0f) /* the plain loss: exactly scale * p */
            ddp__vec_scale_to(d, scale, probs + r * c, (size_t)c, acc);
        else
            for (int64_t j = 0; j < c; j++)
                d[j] = (acc ? d[j] : 0.0f) + scale * (probs[r * c + j] - off);
        if (!ignored)
            d[v->labels[r]] -= probs ? on : scale;
    }
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
    ddp_cross_entropy_options o = ddp_cross_entropy_defaults();
    return ddp_op_cross_entropy_opts(tape, logits, labels, &o, y);
}

/* Row r's softmax into p; returns log sum exp(x - max), the max in *mx. */
static double softmax_row(const float *x, int64_t c, float *p, float *mxo)
{
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
    *mxo = mx;
    return log(s);
}

int ddp_op_cross_entropy_opts(ddp_tape_t *tape, ddp_var_t *logits, const int64_t *labels,
                            const ddp_cross_entropy_options *opts, ddp_var_t **y)
{
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "cross_entropy: NULL tape or output");
    ddp_cross_entropy_options o = opts ? *opts : ddp_cross_entropy_defaults();
    DDP_FAIL_IF(!(o.label_smoothing >= 0.0f && o.label_smoothing <= 1.0f), DDP_ERR_INVALID_ARG,
                "cross_entropy: label_smoothing %g is not in [0, 1]", (double)o.label_smoothing);
    int64_t valid;
    DDP_TRY(check_logits(tape, logits, labels, o.ignore_index, "cross_entropy", &valid));
    int64_t rows = logits->t.shape[0], c = logits->t.shape[1];
    ddp_var_t *v;
    DDP_TRY(push_labels_op(tape, &cross_entropy_def, logits, labels, o.ignore_index,
                           o.label_smoothing, valid, &v));
    /* Save softmax probabilities for backward (without grad, one row of
     * scratch is enough). */
    int save = v->requires_grad;
    v->aux = ddp__tape_alloc(tape, (size_t)(save ? logits->t.numel : c) * sizeof(float));
    if (!v->aux)
        return DDP_ERR_NOMEM;
    /* PyTorch 1.13: (1 - e) nll + e / C * sum_c -log p_c, each summed over
     * the rows not ignored and divided by their count. */
    double nll = 0.0, smooth = 0.0;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits->t.data + r * c;
        float mx;
        double ls = softmax_row(x, c, v->aux + (save ? r * c : 0), &mx);
        if (labels[r] == o.ignore_index)
            continue;
        nll += ls + (double)(mx - x[labels[r]]); /* -log p[label] */
        for (int64_t j = 0; o.label_smoothing != 0.0f && j < c; j++)
            smooth += ls + (double)(mx - x[j]); /* -log p[j] */
    }
    double e = o.label_smoothing;
    double loss = e == 0.0 ? nll / (double)valid
                           : (1.0 - e) * (nll / (double)valid) + smooth / (double)valid * (e / (double)c);
    v->t.data[0] = (float)loss; /* every row ignored: NaN, as PyTorch */
    *y = v;
    return 0;
}

/* ==== binary cross-entropy with logits ==================================== */

static int bce_backward(ddp_tape_t *tape, ddp_var_t *v);
static const ddp__op_def bce_def = {"binary_cross_entropy_with_logits", bce_backward, 0};

/* log(1 + exp(-x)) for any x without overflow: max(-x, 0) + log1p(exp(-|x|)). */
static double softplus_neg(double x) { return (x < 0 ? -x : 0.0) + log1p(exp(-fabs(x))); }

int ddp_op_bce_with_logits(ddp_tape_t *tape, ddp_var_t *input, ddp_var_t *target,
                           const float *pos_weight, ddp_var_t **y)
{
    DDP_SHAPE_BUFS;
    const char *op = "binary_cross_entropy_with_logits";
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "%s: NULL tape or output", op);
    DDP_TRY(ddp__op_check_var(tape, input, op, "input"));
    DDP_TRY(ddp__op_check_var(tape, target, op, "target"));
    DDP_FAIL_IF(!ddp_tensor_same_shape(&input->t, &target->t), DDP_ERR_INVALID_ARG,
                "%s: input of shape %s and target of shape %s differ", op, DDP_SHAPE(input, 0),
                DDP_SHAPE(target, 1));
    ddp_var_t *v;
    DDP_TRY(ddp__op_push(tape, &bce_def, 0, NULL, 1, input, target, NULL, &v));
    int64_t c = ddp__op_last_dim(input), n = input->t.numel;
    if (pos_weight) { /* (C), broadcast over the rows as PyTorch's pos_weight */
        v->aux = ddp__tape_alloc(tape, (size_t)c * sizeof(float));
        if (!v->aux)
            return DDP_ERR_NOMEM;
        memcpy(v->aux, pos_weight, (size_t)c * sizeof(float));
    }
    /* l = (1 - t) x + (1 + (pw - 1) t) log(1 + exp(-x)), PyTorch's form. */
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double x = input->t.data[i], t = target->t.data[i];
        double lw = pos_weight ? 1.0 + ((double)pos_weight[i % c] - 1.0) * t : 1.0;
        s += (1.0 - t) * x + lw * softplus_neg(x);
    }
    v->t.data[0] = (float)(s / (double)n);
    *y = v;
    return 0;
}

/* dl/dx = ((1 - t) - lw sigmoid(-x)) / n; dl/dt = (-x + (pw - 1) softplus(-x)) / n. */
static int bce_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    ddp_var_t *in = v->in[0], *tg = v->in[1];
    int64_t c = ddp__op_last_dim(in), n = in->t.numel;
    double k = (double)v->grad[0] / (double)n;
    const float *pw = v->aux;
    for (int side = 0; side < 2; side++) {
        ddp_var_t *w = v->in[side];
        if (!w->requires_grad)
            continue;
        int acc;
        DDP_GRAD_TARGET(g, w);
        for (int64_t i = 0; i < n; i++) {
            double x = in->t.data[i], t = tg->t.data[i], p = pw ? pw[i % c] : 1.0, d;
            if (side == 0) {
                double sneg = x >= 0 ? exp(-x) / (1.0 + exp(-x)) : 1.0 / (1.0 + exp(x));
                d = (1.0 - t) - (1.0 + (p - 1.0) * t) * sneg;
            } else {
                d = -x + (p - 1.0) * softplus_neg(x);
            }
            float gi = (float)(k * d);
            g[i] = acc ? g[i] + gi : gi;
        }
    }
    return 0;
}
