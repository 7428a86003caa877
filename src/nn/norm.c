/* layer_norm and group_norm, one mechanism: both normalise K contiguous
 * groups of L elements (statistics in double, biased variance, as PyTorch),
 * then scale and shift each element by its channel's weight and bias.  A
 * layer norm is one group per slice (K = rows, L = D) whose channel is the
 * element's position in the slice; a group norm's group k holds cpg
 * channels of S positions each, channel (k mod G) cpg + j / S.
 *
 * Backward (llm.c's layernorm_backward, per group): with xhat = (x - mean)
 * rstd and g = dy * w,
 *   dx = rstd (g - mean(g) - xhat mean(g xhat)),
 *   dw[c] += sum dy xhat,  db[c] += sum dy  over the elements of channel c. */
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "nn/ops.h"

typedef struct norm_ctx {
    int64_t groups, len;   /* K groups of L elements */
    int64_t G, cpg, S;     /* channel of element j in group k: (k % G) cpg + j / S */
    int has_w, has_b;      /* inputs: x, then weight, then bias when present */
    float *mean, *rstd;    /* (K) */
} norm_ctx;

static int norm_backward(ddp_tape_t *tape, ddp_var_t *v);
static const ddp__op_def layer_norm_def = {"layer_norm", norm_backward, 0};
static const ddp__op_def group_norm_def = {"group_norm", norm_backward, 0};

static inline int64_t channel(const norm_ctx *c, int64_t k, int64_t j)
{
    return (k % c->G) * c->cpg + j / c->S;
}

/* Pushes the op, saves its statistics and computes y. */
static int norm_forward(ddp_tape_t *tape, const ddp__op_def *def, ddp_var_t *x, ddp_var_t *w,
                        ddp_var_t *b, float eps, norm_ctx geo, ddp_var_t **y)
{
    ddp_var_t *v;
    DDP_TRY(ddp__op_push(tape, def, x->t.ndim, x->t.shape, 1, x, w, b, &v));
    norm_ctx *c = ddp__tape_alloc(tape, sizeof *c);
    if (!c)
        return DDP_ERR_NOMEM;
    *c = geo;
    c->has_w = w != NULL;
    c->has_b = b != NULL;
    c->mean = ddp__tape_alloc(tape, (size_t)c->groups * sizeof(float));
    c->rstd = ddp__tape_alloc(tape, (size_t)c->groups * sizeof(float));
    if (!c->mean || !c->rstd)
        return DDP_ERR_NOMEM;
    v->ctx = c;
    const float *wd = w ? w->t.data : NULL, *bd = b ? b->t.data : NULL;
    for (int64_t k = 0; k < c->groups; k++) {
        const float *xk = x->t.data + k * c->len;
        float *yk = v->t.data + k * c->len;
        double s = 0.0, ss = 0.0;
        for (int64_t j = 0; j < c->len; j++)
            s += xk[j];
        double mean = s / (double)c->len;
        for (int64_t j = 0; j < c->len; j++)
            ss += ((double)xk[j] - mean) * ((double)xk[j] - mean);
        double rstd = 1.0 / sqrt(ss / (double)c->len + (double)eps);
        c->mean[k] = (float)mean;
        c->rstd[k] = (float)rstd;
        for (int64_t j = 0; j < c->len; j++) {
            int64_t ch = channel(c, k, j);
            double o = ((double)xk[j] - mean) * rstd;
            yk[j] = (float)(o * (wd ? wd[ch] : 1.0) + (bd ? bd[ch] : 0.0));
        }
    }
    *y = v;
    return 0;
}

static int norm_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    const norm_ctx *c = v->ctx;
    ddp_var_t *x = v->in[0], *w = c->has_w ? v->in[1] : NULL;
    ddp_var_t *b = c->has_b ? v->in[c->has_w ? 2 : 1] : NULL;
    const float *dy = v->grad, *wd = w ? w->t.data : NULL;
    int acc;
    float *dw = NULL, *db = NULL, *dx = NULL;
    int acc_w = 0, acc_b = 0, acc_x = 0;
    if (b && b->requires_grad) {
        DDP_GRAD_TARGET(g, b);
        db = g, acc_b = acc;
    }
    if (w && w->requires_grad) {
        DDP_GRAD_TARGET(g, w);
        dw = g, acc_w = acc;
    }
    if (x->requires_grad) {
        DDP_GRAD_TARGET(g, x);
        dx = g, acc_x = acc;
    }
    int64_t nch = w ? w->t.numel : b ? b->t.numel : 0;
    if (dw && !acc_w)
        memset(dw, 0, (size_t)nch * sizeof *dw);
    if (db && !acc_b)
        memset(db, 0, (size_t)nch * sizeof *db);
    for (int64_t k = 0; k < c->groups; k++) {
        const float *xk = x->t.data + k * c->len, *dyk = dy + k * c->len;
        double mean = c->mean[k], rstd = c->rstd[k], sg = 0.0, sgx = 0.0;
        for (int64_t j = 0; j < c->len; j++) {
            int64_t ch = channel(c, k, j);
            double xhat = ((double)xk[j] - mean) * rstd, g = dyk[j] * (wd ? wd[ch] : 1.0);
            sg += g;
            sgx += g * xhat;
            if (dw)
                dw[ch] += (float)(dyk[j] * xhat);
            if (db)
                db[ch] += dyk[j];
        }
        sg /= (double)c->len;
        sgx /= (double)c->len;
        for (int64_t j = 0; dx && j < c->len; j++) {
            int64_t ch = channel(c, k, j);
            double xhat = ((double)xk[j] - mean) * rstd, g = dyk[j] * (wd ? wd[ch] : 1.0);
            float d = (float)(rstd * (g - sg - xhat * sgx));
            dx[k * c->len + j] = acc_x ? dx[k * c->len + j] + d : d;
        }
    }
    return 0;
}

/* weight and bias, when given: vars of this tape of shape (n) or, for a
 * layer norm, normalized_shape (checked by the caller through want). */
static int check_affine(const ddp_tape_t *tape, ddp_var_t *p, const char *op, const char *arg,
                        const ddp_tensor *want)
{
    DDP_SHAPE_BUFS;
    if (!p)
        return 0;
    DDP_TRY(ddp__op_check_var(tape, p, op, arg));
    DDP_FAIL_IF(!ddp_tensor_same_shape(&p->t, want), DDP_ERR_INVALID_ARG,
                "%s: %s of shape %s, expected %s", op, arg, DDP_SHAPE(p, 0),
                ddp_tensor_shape_str(want, sbuf[1], sizeof sbuf[1]));
    return 0;
}

int ddp_op_layer_norm(ddp_tape_t *tape, ddp_var_t *x, int nd, const int64_t *normalized_shape,
                      ddp_var_t *weight, ddp_var_t *bias, float eps, ddp_var_t **y)
{
    DDP_SHAPE_BUFS;
    DDP_FAIL_IF(!tape || !y || !normalized_shape, DDP_ERR_INVALID_ARG,
                "layer_norm: NULL tape, normalized_shape or output");
    DDP_TRY(ddp__op_check_var(tape, x, "layer_norm", "input"));
    DDP_FAIL_IF(!(eps > 0.0f), DDP_ERR_INVALID_ARG, "layer_norm: eps %g must be > 0", (double)eps);
    ddp_tensor want;
    float dummy;
    DDP_FAIL_IF(nd < 1 || nd > x->t.ndim, DDP_ERR_INVALID_ARG,
                "layer_norm: %d normalized dimensions for an input of shape %s", nd,
                DDP_SHAPE(x, 0));
    DDP_TRY(ddp_tensor_wrap(&want, &dummy, nd, normalized_shape));
    for (int i = 0; i < nd; i++)
        DDP_FAIL_IF(x->t.shape[x->t.ndim - nd + i] != normalized_shape[i], DDP_ERR_INVALID_ARG,
                    "layer_norm: input of shape %s does not end in normalized_shape %s",
                    DDP_SHAPE(x, 0), ddp_tensor_shape_str(&want, sbuf[1], sizeof sbuf[1]));
    DDP_TRY(check_affine(tape, weight, "layer_norm", "weight", &want));
    DDP_TRY(check_affine(tape, bias, "layer_norm", "bias", &want));
    norm_ctx geo = {.groups = x->t.numel / want.numel, .len = want.numel, .G = 1,
                    .cpg = want.numel, .S = 1};
    return norm_forward(tape, &layer_norm_def, x, weight, bias, eps, geo, y);
}

int ddp_op_group_norm(ddp_tape_t *tape, ddp_var_t *x, int num_groups, ddp_var_t *weight,
                      ddp_var_t *bias, float eps, ddp_var_t **y)
{
    DDP_SHAPE_BUFS;
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "group_norm: NULL tape or output");
    DDP_TRY(ddp__op_check_var(tape, x, "group_norm", "input"));
    DDP_FAIL_IF(!(eps > 0.0f), DDP_ERR_INVALID_ARG, "group_norm: eps %g must be > 0", (double)eps);
    DDP_FAIL_IF(x->t.ndim < 2, DDP_ERR_INVALID_ARG,
                "group_norm: input must be (N, C, ...), got shape %s", DDP_SHAPE(x, 0));
    int64_t n = x->t.shape[0], ch = x->t.shape[1];
    DDP_FAIL_IF(num_groups < 1 || ch % num_groups != 0, DDP_ERR_INVALID_ARG,
                "group_norm: %lld channels are not divisible into %d groups", (long long)ch,
                num_groups);
    ddp_tensor want;
    float dummy;
    DDP_TRY(ddp_tensor_wrap(&want, &dummy, 1, &ch));
    DDP_TRY(check_affine(tape, weight, "group_norm", "weight", &want));
    DDP_TRY(check_affine(tape, bias, "group_norm", "bias", &want));
    int64_t S = x->t.numel / (n * ch), cpg = ch / num_groups;
    norm_ctx geo = {.groups = n * num_groups, .len = cpg * S, .G = num_groups, .cpg = cpg, .S = S};
    return norm_forward(tape, &group_norm_def, x, weight, bias, eps, geo, y);
}
