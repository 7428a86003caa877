/* BatchNorm (Ioffe & Szegedy 2015) as PyTorch 1.13 computes it: the tape op
 * ddp_op_batch_norm with its backward, and the BatchNorm1d/2d modules with
 * their buffers.  x is (N, C, S) with S the product of the spatial
 * dimensions; statistics are per channel over N * S values.
 *
 * Training forward: sums of x and x^2 per channel (in double), optionally
 * summed over replicas by the statistics hook (SyncBatchNorm, which is how
 * nn/ stays ignorant of process groups), then mean, biased variance,
 * invstd = 1 / sqrt(var + eps), y = (x - mean) invstd w + b, and the running
 * update with the unbiased variance var * n / (n - 1).
 * Training backward, with xhat = (x - mean) invstd and n the global count:
 *   db = sum dy, dw = sum dy xhat (this replica's share; DDP averages them),
 *   dx = w invstd (dy - sum dy / n - xhat sum dy xhat / n) with both sums
 *   over every replica (the hook again).
 * Evaluation: mean and var are the running ones, dx = w invstd dy. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "nn/module.h"
#include "nn/ops.h"

/* ==== the op ============================================================== */

typedef struct bn_ctx {
    int64_t n, c, s;   /* x is (n, c, s) */
    double count;      /* values per channel over every replica */
    int batch_stats;   /* normalised with batch (1) or running (0) statistics */
    float *mean, *invstd; /* (c) */
    ddp_batch_norm_stats_fn stats;
    void *stats_user;
} bn_ctx;

static int bn_backward(ddp_tape_t *tape, ddp_var_t *v);
static const ddp__op_def bn_def = {"batch_norm", bn_backward, 0};

static int check_args(ddp_tape_t *tape, ddp_var_t *x, ddp_var_t *w, ddp_var_t *b,
                      const ddp_batch_norm_args *a)
{
    DDP_SHAPE_BUFS;
    DDP_FAIL_IF(!tape || !a, DDP_ERR_INVALID_ARG, "batch_norm: NULL tape or arguments");
    DDP_TRY(ddp__op_check_var(tape, x, "batch_norm", "input"));
    DDP_FAIL_IF(x->t.ndim < 2, DDP_ERR_INVALID_ARG,
                "batch_norm: input of shape %s must be (N, C, ...)", DDP_SHAPE(x, 0));
    int64_t c = x->t.shape[1];
    ddp_var_t *wb[2] = {w, b};
    for (int i = 0; i < 2; i++) {
        if (!wb[i])
            continue;
        DDP_TRY(ddp__op_check_var(tape, wb[i], "batch_norm", i ? "bias" : "weight"));
        DDP_FAIL_IF(wb[i]->t.ndim != 1 || wb[i]->t.shape[0] != c, DDP_ERR_INVALID_ARG,
                    "batch_norm: %s of shape %s does not match input %s (%lld channels)",
                    i ? "bias" : "weight", DDP_SHAPE(wb[i], 0), DDP_SHAPE(x, 1), (long long)c);
    }
    DDP_FAIL_IF(!w != !b, DDP_ERR_INVALID_ARG,
                "batch_norm: give both weight and bias (affine) or neither");
    DDP_FAIL_IF(!a->training && (!a->running_mean || !a->running_var), DDP_ERR_INVALID_ARG,
                "batch_norm: evaluation needs running_mean and running_var");
    DDP_FAIL_IF(!(a->eps > 0) || !(a->momentum >= 0 && a->momentum <= 1), DDP_ERR_INVALID_ARG,
                "batch_norm: eps %g must be > 0 and momentum %g in [0, 1]", a->eps,
                a->momentum);
    return 0;
}

/* Batch mean and invstd per channel (stats summed over replicas); updates
 * the running statistics when given. */
static int batch_stats(ddp_tape_t *tape, const float *x, bn_ctx *k,
                       const ddp_batch_norm_args *a, char *shape)
{
    int64_t c = k->c;
    double *buf = ddp__tape_alloc(tape, (size_t)(2 * c + 1) * sizeof *buf); /* sum, sumsq, count */
    if (!buf)
        return DDP_ERR_NOMEM;
    memset(buf, 0, (size_t)(2 * c + 1) * sizeof *buf);
    for (int64_t i = 0; i < k->n; i++)
        for (int64_t j = 0; j < c; j++) {
            const float *p = x + (i * c + j) * k->s;
            double s1 = 0, s2 = 0;
            for (int64_t e = 0; e < k->s; e++)
                s1 += p[e], s2 += (double)p[e] * p[e];
            buf[j] += s1, buf[c + j] += s2;
        }
    buf[2 * c] = (double)(k->n * k->s);
    int rc = a->stats ? a->stats(buf, (size_t)(2 * c + 1), a->stats_user) : 0;
    if (rc < 0)
        return ddp__error_context(rc, "batch_norm: the statistics hook failed");
    k->count = buf[2 * c];
    if (!(k->count > 1))
        return DDP_ERROR(DDP_ERR_INVALID_ARG,
                         "batch_norm: expected more than 1 value per channel when training, "
                         "got input of shape %s (%g values per channel)", shape, k->count);
    for (int64_t j = 0; j < c; j++) {
        double mean = buf[j] / k->count, var = buf[c + j] / k->count - mean * mean;
        if (var < 0) /* rounding of E[x^2] - E[x]^2 for a constant channel */
            var = 0;
        k->mean[j] = (float)mean;
        k->invstd[j] = (float)(1.0 / sqrt(var + a->eps));
        if (a->running_mean && a->running_var) {
            double m = a->momentum, unbiased = var * k->count / (k->count - 1);
            a->running_mean[j] = (float)((1 - m) * a->running_mean[j] + m * mean);
            a->running_var[j] = (float)((1 - m) * a->running_var[j] + m * unbiased);
        }
    }
    return 0;
}

int ddp_op_batch_norm(ddp_tape_t *tape, ddp_var_t *x, ddp_var_t *weight, ddp_var_t *bias,
                      const ddp_batch_norm_args *a, ddp_var_t **y)
{
    DDP_SHAPE_BUFS;
    DDP_FAIL_IF(!y, DDP_ERR_INVALID_ARG, "batch_norm: NULL output");
    DDP_TRY(check_args(tape, x, weight, bias, a));
    ddp_var_t *v;
    DDP_TRY(ddp__op_push(tape, &bn_def, x->t.ndim, x->t.shape, 1, x, weight, bias, &v));
    bn_ctx *k = ddp__tape_alloc(tape, sizeof *k);
    if (!k)
        return DDP_ERR_NOMEM;
    k->n = x->t.shape[0];
    k->c = x->t.shape[1];
    k->s = (k->n * k->c != 0) ? x->t.numel / (k->n * k->c) : 0;
    k->batch_stats = a->training;
    k->stats = a->stats;
    k->stats_user = a->stats_user;
    k->mean = ddp__tape_alloc(tape, 2 * (size_t)k->c * sizeof(float));
    if (!k->mean)
        return DDP_ERR_NOMEM;
    k->invstd = k->mean + k->c;
    if (a->training) {
        DDP_TRY(batch_stats(tape, x->t.data, k, a, DDP_SHAPE(x, 0)));
    } else {
        for (int64_t j = 0; j < k->c; j++) {
            k->mean[j] = a->running_mean[j];
            k->invstd[j] = (float)(1.0 / sqrt((double)a->running_var[j] + a->eps));
        }
    }
    for (int64_t i = 0; i < k->n; i++)
        for (int64_t j = 0; j < k->c; j++) {
            float w = weight ? weight->t.data[j] : 1.0f, b = bias ? bias->t.data[j] : 0.0f;
            float mu = k->mean[j], is = k->invstd[j];
            const float *xp = x->t.data + (i * k->c + j) * k->s;
            float *yp = v->t.data + (i * k->c + j) * k->s;
            for (int64_t e = 0; e < k->s; e++)
                yp[e] = (xp[e] - mu) * is * w + b;
        }
    v->ctx = k;
    *y = v;
    return 0;
}

/* Per channel: sums[j] = sum dy, sums[c + j] = sum dy * xhat (double). */
static void grad_sums(const bn_ctx *k, const float *x, const float *dy, double *sums)
{
    for (int64_t i = 0; i < k->n; i++)
        for (int64_t j = 0; j < k->c; j++) {
            const float *xp = x + (i * k->c + j) * k->s, *gp = dy + (i * k->c + j) * k->s;
            double s1 = 0, s2 = 0;
            for (int64_t e = 0; e < k->s; e++)
                s1 += gp[e], s2 += (double)gp[e] * ((xp[e] - k->mean[j]) * k->invstd[j]);
            sums[j] += s1, sums[k->c + j] += s2;
        }
}

static int affine_grads(ddp_tape_t *tape, ddp_var_t *v, const double *sums)
{
    const bn_ctx *k = v->ctx;
    int acc;
    for (int i = 2; i >= 1 && v->nin == 3; i--) { /* bias, then weight: the contract's order */
        ddp_var_t *p = v->in[i];
        if (!p->requires_grad)
            continue;
        DDP_GRAD_TARGET(g, p);
        const double *s = i == 2 ? sums : sums + k->c;
        for (int64_t j = 0; j < k->c; j++)
            g[j] = (acc ? g[j] : 0.0f) + (float)s[j];
    }
    return 0;
}

static int bn_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    const bn_ctx *k = v->ctx;
    ddp_var_t *x = v->in[0];
    ddp_var_t *w = v->nin == 3 ? v->in[1] : NULL; /* (x, weight, bias) or (x) */
    double *sums = ddp__tape_alloc(tape, (size_t)(2 * k->c) * sizeof *sums);
    if (!sums)
        return DDP_ERR_NOMEM;
    memset(sums, 0, (size_t)(2 * k->c) * sizeof *sums);
    grad_sums(k, x->t.data, v->grad, sums);
    DDP_TRY(affine_grads(tape, v, sums));
    if (x->requires_grad) {
        if (k->batch_stats && k->stats) {
            int rc = k->stats(sums, (size_t)(2 * k->c), k->stats_user);
            if (rc < 0)
                return ddp__error_context(rc, "batch_norm backward: the statistics hook failed");
        }
        int acc;
        DDP_GRAD_TARGET(dx, x);
        for (int64_t i = 0; i < k->n; i++)
            for (int64_t j = 0; j < k->c; j++) {
                size_t at = (size_t)((i * k->c + j) * k->s);
                float scale = (w ? w->t.data[j] : 1.0f) * k->invstd[j];
                float mdy = k->batch_stats ? (float)(sums[j] / k->count) : 0.0f;
                float mdyx = k->batch_stats ? (float)(sums[k->c + j] / k->count) : 0.0f;
                for (int64_t e = 0; e < k->s; e++) {
                    float xhat = (x->t.data[at + e] - k->mean[j]) * k->invstd[j];
                    float g = scale * (v->grad[at + e] - mdy - xhat * mdyx);
                    dx[at + e] = acc ? dx[at + e] + g : g;
                }
            }
    }
    return 0;
}

/* ==== the modules ========================================================= */

typedef struct batchnorm {
    ddp_batchnorm_options o;
    int dims2d;                /* BatchNorm2d (else 1d) */
    ddp_param *weight, *bias;  /* NULL without affine */
    ddp_buffer *running_mean, *running_var, *num_batches_tracked; /* NULL untracked */
    ddp_batch_norm_stats_fn stats;
    void *stats_user;
} batchnorm;

static int bn_module_forward(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y,
                             void *user)
{
    batchnorm *bn = user;
    DDP_FAIL_IF(!tape, DDP_ERR_INVALID_ARG, "%s: NULL tape", ddp_module_type(m));
    DDP_TRY(ddp__op_check_var(tape, x, ddp_module_type(m), "input"));
    int nd = x->t.ndim;
    DDP_FAIL_IF(bn->dims2d ? nd != 4 : nd != 2 && nd != 3, DDP_ERR_INVALID_ARG,
                "%s: expected %s input (got %dD input)", ddp_module_type(m),
                bn->dims2d ? "4D" : "2D or 3D", nd);
    DDP_FAIL_IF(x->t.shape[1] != bn->o.num_features, DDP_ERR_INVALID_ARG,
                "%s: input has %lld channels, the layer %d features", ddp_module_type(m),
                (long long)x->t.shape[1], bn->o.num_features);
    ddp_batch_norm_args a = {.training = m->training || !bn->o.track_running_stats,
                             .momentum = bn->o.momentum,
                             .eps = bn->o.eps,
                             .stats = bn->stats,
                             .stats_user = bn->stats_user};
    if (bn->o.track_running_stats) {
        a.running_mean = bn->running_mean->data;
        a.running_var = bn->running_var->data;
        if (m->training) { /* PyTorch counts the batch before using the count */
            int64_t *nbt = bn->num_batches_tracked->data;
            *nbt += 1;
            if (bn->o.cumulative_average)
                a.momentum = 1.0 / (double)*nbt;
        }
    }
    ddp_var_t *w = NULL, *b = NULL;
    if (bn->weight) {
        DDP_TRY(ddp_tape_param(tape, bn->weight, &w));
        DDP_TRY(ddp_tape_param(tape, bn->bias, &b));
    }
    return ddp_op_batch_norm(tape, x, w, b, &a, y);
}

/* reset_running_stats + reset_parameters: ones and zeros, no draws. */
static int bn_module_reset(ddp_module_t *m, ddp_generator *gen, void *user)
{
    (void)m, (void)gen;
    batchnorm *bn = user;
    if (bn->weight) {
        DDP_TRY(ddp_init_ones(bn->weight));
        DDP_TRY(ddp_init_zeros(bn->bias));
    }
    if (bn->running_mean) {
        float *rm = bn->running_mean->data, *rv = bn->running_var->data;
        for (int j = 0; j < bn->o.num_features; j++)
            rm[j] = 0.0f, rv[j] = 1.0f;
        *(int64_t *)bn->num_batches_tracked->data = 0;
    }
    return 0;
}

static const ddp_module_def bn1d_def = {"BatchNorm1d", bn_module_forward, bn_module_reset, free};
static const ddp_module_def bn2d_def = {"BatchNorm2d", bn_module_forward, bn_module_reset, free};

ddp_batchnorm_options ddp_batchnorm_defaults(int num_features)
{
    return (ddp_batchnorm_options){.num_features = num_features,
                                   .eps = 1e-5,
                                   .momentum = 0.1,
                                   .cumulative_average = 0,
                                   .affine = 1,
                                   .track_running_stats = 1};
}

/* Parameters and buffers in PyTorch's registration order. */
static int bn_register(ddp_module_t *m, batchnorm *bn)
{
    int64_t c = bn->o.num_features;
    if (bn->o.affine) {
        DDP_TRY(ddp_module_add_param(m, "weight", 1, &c, &bn->weight));
        DDP_TRY(ddp_module_add_param(m, "bias", 1, &c, &bn->bias));
    }
    if (bn->o.track_running_stats) {
        DDP_TRY(ddp_module_add_buffer(m, "running_mean", DDP_FLOAT32, 1, &c, &bn->running_mean));
        DDP_TRY(ddp_module_add_buffer(m, "running_var", DDP_FLOAT32, 1, &c, &bn->running_var));
        DDP_TRY(ddp_module_add_buffer(m, "num_batches_tracked", DDP_INT64, 0, NULL,
                                      &bn->num_batches_tracked));
    }
    return bn_module_reset(m, NULL, bn);
}

static int bn_create(const ddp_module_def *def, const ddp_batchnorm_options *o,
                     ddp_module_t **out)
{
    DDP_FAIL_IF(!o || !out, DDP_ERR_INVALID_ARG, "%s: NULL options or output", def->type);
    DDP_FAIL_IF(o->num_features <= 0 || !(o->eps > 0) ||
                    !(o->momentum >= 0 && o->momentum <= 1),
                DDP_ERR_INVALID_ARG,
                "%s: num_features %d must be > 0, eps %g > 0 and momentum %g in [0, 1]",
                def->type, o->num_features, o->eps, o->momentum);
    batchnorm *bn = calloc(1, sizeof *bn);
    DDP_FAIL_IF(!bn, DDP_ERR_NOMEM, "%s: out of memory", def->type);
    bn->o = *o;
    bn->dims2d = def == &bn2d_def;
    ddp_module_t *m;
    DDP_TRY(ddp_module_create(def, bn, &m));
    int rc = bn_register(m, bn);
    if (rc < 0) {
        ddp__module_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

int ddp_batchnorm1d_create(const ddp_batchnorm_options *o, ddp_module_t **out)
{
    return bn_create(&bn1d_def, o, out);
}

int ddp_batchnorm2d_create(const ddp_batchnorm_options *o, ddp_module_t **out)
{
    return bn_create(&bn2d_def, o, out);
}

int ddp_module_is_batchnorm(const ddp_module_t *m)
{
    return m && (m->def == &bn1d_def || m->def == &bn2d_def);
}

int ddp_batchnorm_set_stats_hook(ddp_module_t *m, ddp_batch_norm_stats_fn fn, void *user)
{
    DDP_FAIL_IF(!ddp_module_is_batchnorm(m), DDP_ERR_INVALID_ARG,
                "set stats hook: module %s is not a BatchNorm", ddp_module_type(m));
    batchnorm *bn = m->user;
    bn->stats = fn;
    bn->stats_user = fn ? user : NULL;
    return 0;
}
