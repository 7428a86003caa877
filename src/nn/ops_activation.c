/* Activations: LeakyReLU, GELU (exact and tanh), SiLU on the element-wise
 * frame of ops_elementwise.c, and softmax / log-softmax along any dim.
 * Formulas and gradients are PyTorch 1.13's (aten/src/ATen/native/
 * Activation.cpp, derivatives.yaml); the fixtures check them to ~1e-6. */
#include <math.h>

#include "base/error.h"
#include "nn/ops_internal.h"

/* ==== element-wise ======================================================== */

static float leaky_f(float x, const float *p) { return x > 0 ? x : p[0] * x; }
static float leaky_df(float x, float y, const float *p)
{
    (void)y;
    return x > 0 ? 1.0f : p[0]; /* the slope at 0, as torch */
}

#define SQRT1_2 0.70710678118654752440f
#define INV_SQRT_2PI 0.39894228040143267794f
#define SQRT_2_PI 0.79788456080286535588f /* sqrt(2 / pi) */
#define GELU_C 0.044715f

static float gelu_f(float x, const float *p)
{
    (void)p;
    return 0.5f * x * (1.0f + erff(x * SQRT1_2));
}
static float gelu_df(float x, float y, const float *p)
{
    (void)y, (void)p;
    return 0.5f * (1.0f + erff(x * SQRT1_2)) + x * INV_SQRT_2PI * expf(-0.5f * x * x);
}
static float gelu_tanh_f(float x, const float *p)
{
    (void)p;
    return 0.5f * x * (1.0f + tanhf(SQRT_2_PI * (x + GELU_C * x * x * x)));
}
static float gelu_tanh_df(float x, float y, const float *p)
{
    (void)y, (void)p;
    float t = tanhf(SQRT_2_PI * (x + GELU_C * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * SQRT_2_PI * (1.0f + 3.0f * GELU_C * x * x);
}
static float silu_f(float x, const float *p)
{
    (void)p;
    return x / (1.0f + expf(-x));
}
static float silu_df(float x, float y, const float *p)
{
    (void)y, (void)p;
    float s = 1.0f / (1.0f + expf(-x));
    return s * (1.0f + x * (1.0f - s));
}

static const ddp__unary_def leaky_relu_def = {{"leaky_relu", ddp__unary_backward, 0}, leaky_f,
                                              leaky_df};
static const ddp__unary_def gelu_def = {{"gelu", ddp__unary_backward, 0}, gelu_f, gelu_df};
static const ddp__unary_def gelu_tanh_def = {{"gelu", ddp__unary_backward, 0}, gelu_tanh_f,
                                             gelu_tanh_df};
static const ddp__unary_def silu_def = {{"silu", ddp__unary_backward, 0}, silu_f, silu_df};

int ddp_op_leaky_relu(ddp_tape_t *tape, ddp_var_t *a, float slope, ddp_var_t **y)
{
    DDP_FAIL_IF(!isfinite(slope), DDP_ERR_INVALID_ARG, "leaky_relu: slope %g is not finite",
                (double)slope);
    return ddp__unary_op(tape, &leaky_relu_def, a, slope, 0, y);
}

int ddp_op_gelu(ddp_tape_t *tape, ddp_var_t *a, int approx, ddp_var_t **y)
{
    DDP_FAIL_IF(approx != DDP_GELU_EXACT && approx != DDP_GELU_TANH, DDP_ERR_INVALID_ARG,
                "gelu: approximation %d is neither DDP_GELU_EXACT nor DDP_GELU_TANH", approx);
    return ddp__unary_op(tape, approx == DDP_GELU_TANH ? &gelu_tanh_def : &gelu_def, a, 0, 0, y);
}

int ddp_op_silu(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y)
{
    return ddp__unary_op(tape, &silu_def, a, 0, 0, y);
}

/* ==== softmax and log-softmax along a dim ================================= */

typedef struct line_ctx {
    int64_t outer, n, inner; /* a as (outer, n, inner) around the dim */
} line_ctx;

static int softmax_backward(ddp_tape_t *tape, ddp_var_t *v);
static const ddp__op_def softmax_def = {"softmax", softmax_backward, 0};
static const ddp__op_def log_softmax_def = {"log_softmax", softmax_backward, 0};

/* One line of n values, stride s: y = softmax or log-softmax of x. */
static void softmax_line(float *y, const float *x, int64_t n, int64_t s, int want_log)
{
    float mx = x[0];
    for (int64_t j = 1; j < n; j++)
        mx = fmaxf(mx, x[j * s]);
    double sum = 0;
    for (int64_t j = 0; j < n; j++)
        sum += exp((double)(x[j * s] - mx));
    if (want_log) {
        float lse = (float)log(sum);
        for (int64_t j = 0; j < n; j++)
            y[j * s] = x[j * s] - mx - lse;
    } else {
        for (int64_t j = 0; j < n; j++)
            y[j * s] = (float)(exp((double)(x[j * s] - mx)) / sum);
    }
}

static int softmax_op(ddp_tape_t *tape, const ddp__op_def *def, ddp_var_t *a, int dim,
                      ddp_var_t **y)
{
    const char *op = def->name;
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "%s: NULL tape or output", op);
    DDP_TRY(ddp__op_check_var(tape, a, op, "input"));
    /* A 0-d tensor is one line of one value along dim 0 or -1, as torch
     * takes it. */
    int d = 0, scalar = a->t.ndim == 0 && (dim == 0 || dim == -1);
    if (!scalar)
        DDP_TRY(ddp__op_dim(op, a, dim, a->t.ndim, &d));
    ddp_var_t *v;
    DDP_TRY(ddp__op_push(tape, def, a->t.ndim, a->t.shape, 1, a, NULL, NULL, &v));
    line_ctx *c = ddp__tape_alloc(tape, sizeof *c);
    if (!c)
        return DDP_ERR_NOMEM;
    *c = scalar ? (line_ctx){1, 1, 1} : (line_ctx){1, a->t.shape[d], a->t.stride[d]};
    c->outer = a->t.numel / (c->n * c->inner);
    v->ctx = c;
    for (int64_t o = 0; o < c->outer; o++)
        for (int64_t i = 0; i < c->inner; i++) {
            int64_t at = o * c->n * c->inner + i;
            softmax_line(v->t.data + at, a->t.data + at, c->n, c->inner, def == &log_softmax_def);
        }
    *y = v;
    return 0;
}

int ddp_op_softmax(ddp_tape_t *tape, ddp_var_t *a, int dim, ddp_var_t **y)
{
    return softmax_op(tape, &softmax_def, a, dim, y);
}

int ddp_op_log_softmax_dim(ddp_tape_t *tape, ddp_var_t *a, int dim, ddp_var_t **y)
{
    return softmax_op(tape, &log_softmax_def, a, dim, y);
}

int ddp_op_log_softmax(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y)
{
    return softmax_op(tape, &log_softmax_def, a, -1, y); /* nn.h's: the last dim */
}

/* softmax: dx = y (dy - sum(dy y)); log-softmax: dx = dy - exp(y) sum(dy). */
static int softmax_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    const line_ctx *c = v->ctx;
    int is_log = v->def == &log_softmax_def, acc;
    DDP_GRAD_TARGET(da, v->in[0]);
    int64_t n = c->n, s = c->inner;
    for (int64_t o = 0; o < c->outer; o++)
        for (int64_t i = 0; i < c->inner; i++) {
            int64_t at = o * n * s + i;
            const float *yl = v->t.data + at, *dy = v->grad + at;
            float *dx = da + at;
            double dot = 0;
            for (int64_t j = 0; j < n; j++)
                dot += is_log ? (double)dy[j * s] : (double)dy[j * s] * yl[j * s];
            for (int64_t j = 0; j < n; j++) {
                float g = is_log ? dy[j * s] - expf(yl[j * s]) * (float)dot
                              : yl[j * s] * (dy[j * s] - (float)dot);
                dx[j * s] = acc ? dx[j * s] + g : g;
            }
        }
    return 0;
}
