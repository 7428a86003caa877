/* Element-wise unary ops: one frame (ddp__unary_op: forward y = f(x, p),
 * backward dx = dy * df(x, y, p)) and the ops written on it: neg, exp, log,
 * sqrt, abs, pow (scalar exponent), clamp.  Gradients follow PyTorch 1.13's
 * derivatives.yaml, including its choices at the kinks: abs' is sign(x)
 * (0 at 0), clamp passes the gradient on its bounds, pow with exponent 0
 * has gradient 0.  The activations (ops_activation.c) use the same frame. */
#include <math.h>

#include "base/error.h"
#include "nn/ops_internal.h"

/* ==== the frame =========================================================== */

int ddp__unary_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    const ddp__unary_def *k = (const ddp__unary_def *)v->def;
    const float *p = v->ctx, *x = v->in[0]->t.data, *y = v->t.data, *dy = v->grad;
    size_t n = (size_t)v->t.numel;
    int acc;
    DDP_GRAD_TARGET(dx, v->in[0]);
    if (acc)
        for (size_t i = 0; i < n; i++)
            dx[i] += dy[i] * k->df(x[i], y[i], p);
    else
        for (size_t i = 0; i < n; i++)
            dx[i] = dy[i] * k->df(x[i], y[i], p);
    return 0;
}

int ddp__unary_op(ddp_tape_t *tape, const ddp__unary_def *k, ddp_var_t *a, float p0, float p1,
                  ddp_var_t **y)
{
    const char *name = k->def.name;
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "%s: NULL tape or output", name);
    DDP_TRY(ddp__op_check_var(tape, a, name, "input"));
    ddp_var_t *v;
    DDP_TRY(ddp__op_push(tape, &k->def, a->t.ndim, a->t.shape, 1, a, NULL, NULL, &v));
    float *p = ddp__tape_alloc(tape, 2 * sizeof *p);
    if (!p)
        return DDP_ERR_NOMEM;
    p[0] = p0;
    p[1] = p1;
    v->ctx = p;
    const float *x = a->t.data;
    for (int64_t i = 0; i < a->t.numel; i++)
        v->t.data[i] = k->f(x[i], p);
    *y = v;
    return 0;
}

/* ==== the ops ============================================================= */

static float neg_f(float x, const float *p) { return (void)p, -x; }
static float neg_df(float x, float y, const float *p) { return (void)x, (void)y, (void)p, -1.0f; }
static float exp_f(float x, const float *p) { return (void)p, expf(x); }
static float exp_df(float x, float y, const float *p) { return (void)x, (void)p, y; }
static float log_f(float x, const float *p) { return (void)p, logf(x); }
static float log_df(float x, float y, const float *p) { return (void)y, (void)p, 1.0f / x; }
static float sqrt_f(float x, const float *p) { return (void)p, sqrtf(x); }
/* torch: grad / (2 * result) */
static float sqrt_df(float x, float y, const float *p) { return (void)x, (void)p, 0.5f / y; }
static float abs_f(float x, const float *p) { return (void)p, fabsf(x); }
static float abs_df(float x, float y, const float *p)
{
    (void)y, (void)p;
    return (float)((x > 0) - (x < 0)); /* sign, 0 at 0 */
}
static float pow_f(float x, const float *p) { return powf(x, p[0]); }
static float pow_df(float x, float y, const float *p)
{
    (void)y;
    return p[0] == 0.0f ? 0.0f : p[0] * powf(x, p[0] - 1.0f);
}
/* Comparisons, not fminf/fmaxf, so that a nan input stays nan (as torch). */
static float clamp_f(float x, const float *p) { return x < p[0] ? p[0] : x > p[1] ? p[1] : x; }
static float clamp_df(float x, float y, const float *p)
{
    (void)y;
    return x >= p[0] && x <= p[1] ? 1.0f : 0.0f;
}

#define UNARY(op) \
    static const ddp__unary_def op##_def = {{#op, ddp__unary_backward, 0}, op##_f, op##_df}
UNARY(neg);
UNARY(exp);
UNARY(log);
UNARY(sqrt);
UNARY(abs);
UNARY(pow);
UNARY(clamp);
#undef UNARY

int ddp_op_neg(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y)
{
    return ddp__unary_op(tape, &neg_def, a, 0, 0, y);
}

int ddp_op_exp(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y)
{
    return ddp__unary_op(tape, &exp_def, a, 0, 0, y);
}

int ddp_op_log(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y)
{
    return ddp__unary_op(tape, &log_def, a, 0, 0, y);
}

int ddp_op_sqrt(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y)
{
    return ddp__unary_op(tape, &sqrt_def, a, 0, 0, y);
}

int ddp_op_abs(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y)
{
    return ddp__unary_op(tape, &abs_def, a, 0, 0, y);
}

int ddp_op_pow(ddp_tape_t *tape, ddp_var_t *a, float p, ddp_var_t **y)
{
    DDP_FAIL_IF(isnan(p), DDP_ERR_INVALID_ARG, "pow: the exponent is nan");
    return ddp__unary_op(tape, &pow_def, a, p, 0, y);
}

int ddp_op_clamp(ddp_tape_t *tape, ddp_var_t *a, float lo, float hi, ddp_var_t **y)
{
    DDP_FAIL_IF(isnan(lo) || isnan(hi) || lo > hi, DDP_ERR_INVALID_ARG,
                "clamp: bounds [%g, %g] are not an interval (nan, or min > max)", (double)lo,
                (double)hi);
    return ddp__unary_op(tape, &clamp_def, a, lo, hi, y);
}
