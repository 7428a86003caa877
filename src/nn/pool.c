/* Pooling and channel dropout as tape ops: MaxPool2d, AvgPool2d,
 * AdaptiveAvgPool2d, Dropout2d (NCHW), with PyTorch 1.13's CPU semantics:
 *   max: padding never wins; the first maximum in row-major window order
 *        takes the gradient (ties), the last NaN wins (CPU max_pool2d's rule);
 *   avg: window [o*s - p, min(o*s - p + k, in + p)) clipped to the image;
 *        the divisor is the unclipped size with count_include_pad, else the
 *        clipped one;
 *   adaptive: window [floor(o in / out), ceil((o + 1) in / out)).
 * Average pooling of both kinds is one kernel over per-row and per-column
 * window tables (start, end, divisor span), built once per op. */
#if defined(__GNUC__) && !defined(__clang__)
/* O3: vectorises MaxPool2d(2)'s row kernels (-O2's cheap cost model does not). */
#pragma GCC optimize("O3")
#endif

#include <math.h>
#include <string.h>

#include "base/error.h"
#include "base/rng.h"
#include "nn/autograd.h"
#include "nn/conv.h"
#include "nn/ops.h"
#include "tensor/im2col.h"
#include "tensor/kernels.h"

ddp_pool2d_options ddp_pool2d_defaults(int kernel_size)
{
    ddp_pool2d_options o = {
        .kernel_size = {kernel_size, kernel_size}, .stride = {kernel_size, kernel_size},
        .padding = {0, 0}, .dilation = {1, 1}, .count_include_pad = 1,
    };
    return o;
}

/* The window of every output along one dimension. */
typedef struct pool_axis {
    int *lo, *hi;  /* [lo, hi) clipped to the input */
    int *span;     /* the divisor's factor (avg) */
} pool_axis;

typedef struct pool_ctx {
    int n, c, h, w, oh, ow;
    pool_axis rows, cols;  /* avg pools */
    int32_t *argmax;       /* max pool: the winning input of each output in its plane */
    int tiles2;            /* max pool: MaxPool2d(2) windows that tile the plane */
} pool_ctx;

static int axis_alloc(ddp_tape_t *tape, pool_axis *a, int n)
{
    int *m = ddp__tape_alloc(tape, 3 * (size_t)n * sizeof *m);
    if (!m)
        return DDP_ERR_NOMEM;
    a->lo = m, a->hi = m + n, a->span = m + 2 * n;
    return 0;
}

/* AvgPool2d's windows along one dimension of size in. */
static void axis_avg(pool_axis *a, int out, int in, int k, int s, int p, int include_pad)
{
    for (int o = 0; o < out; o++) {
        int lo = o * s - p, hi = lo + k < in + p ? lo + k : in + p;
        int span = hi - lo;
        lo = lo < 0 ? 0 : lo;
        hi = hi > in ? in : hi;
        a->lo[o] = lo, a->hi[o] = hi, a->span[o] = include_pad ? span : hi - lo;
    }
}

/* AdaptiveAvgPool2d's windows along one dimension. */
static void axis_adaptive(pool_axis *a, int out, int in)
{
    for (int o = 0; o < out; o++) {
        a->lo[o] = (int)((int64_t)o * in / out);
        a->hi[o] = (int)(((int64_t)(o + 1) * in + out - 1) / out);
        a->span[o] = a->hi[o] - a->lo[o];
    }
}

/* Shared checks and the output var of a pooling op over x (N, C, H, W). */
static int pool_push(ddp_tape_t *tape, ddp_var_t *x, const ddp__op_def *def, int oh, int ow,
                     ddp_var_t **out, pool_ctx **ctx)
{
    ddp_var_t *v;
    DDP_TRY(ddp__op_push(tape, def, 4, (int64_t[]){x->t.shape[0], x->t.shape[1], oh, ow}, 1,
                         x, NULL, NULL, &v));
    pool_ctx *c = ddp__tape_alloc(tape, sizeof *c);
    if (!c)
        return DDP_ERR_NOMEM;
    *c = (pool_ctx){.n = (int)x->t.shape[0], .c = (int)x->t.shape[1], .h = (int)x->t.shape[2],
                    .w = (int)x->t.shape[3], .oh = oh, .ow = ow};
    v->ctx = c;
    *out = v;
    *ctx = c;
    return 0;
}

/* The output size of a max or avg pool, checked as PyTorch does. */
static int pool_out_sizes(const char *op, const ddp_var_t *x, const ddp_pool2d_options *o,
                          int *st, int *oh, int *ow)
{
    char buf[64];
    DDP_FAIL_IF(!o, DDP_ERR_INVALID_ARG, "%s: options are NULL", op);
    DDP_TRY(ddp__conv_input_4d(x, op));
    DDP_FAIL_IF(o->kernel_size[0] < 1 || o->kernel_size[1] < 1, DDP_ERR_INVALID_ARG,
                "%s: kernel size (%d, %d) must be >= 1", op, o->kernel_size[0],
                o->kernel_size[1]);
    for (int i = 0; i < 2; i++) /* stride 0: the kernel size (PyTorch's None) */
        st[i] = o->stride[i] ? o->stride[i] : o->kernel_size[i];
    DDP_TRY(ddp__conv_check_pairs(op, st, o->padding, o->dilation));
    for (int i = 0; i < 2; i++) {
        int span = o->dilation[i] * (o->kernel_size[i] - 1) + 1;
        DDP_FAIL_IF(2 * o->padding[i] > span, DDP_ERR_INVALID_ARG,
                    "%s: padding (%d, %d) must be at most half the kernel (%d, %d)", op,
                    o->padding[0], o->padding[1], o->kernel_size[0], o->kernel_size[1]);
    }
    *oh = ddp__conv_out_size((int)x->t.shape[2], o->kernel_size[0], st[0], o->padding[0],
                             o->dilation[0]);
    *ow = ddp__conv_out_size((int)x->t.shape[3], o->kernel_size[1], st[1], o->padding[1],
                             o->dilation[1]);
    DDP_FAIL_IF(*oh < 1 || *ow < 1, DDP_ERR_INVALID_ARG,
                "%s: input of shape %s is smaller than the kernel (%d, %d)", op,
                ddp_tensor_shape_str(&x->t, buf, sizeof buf), o->kernel_size[0],
                o->kernel_size[1]);
    return 0;
}

/* ==== max pool ============================================================ */

static int max_pool_backward(ddp_tape_t *tape, ddp_var_t *v);
static const ddp__op_def max_pool_def = {"max_pool2d", max_pool_backward, 0};

/* MaxPool2d(2) (stride 2): one output row from two input rows, written so
 * that the compiler vectorises it (the stride-2 loads become permutes):
 * the scalar loop over windows was 8 % of ddp-cnn's step. */
DDP_KERNEL static void max_pool_row_2x2(float *restrict y, int32_t *restrict arg,
                                        const float *restrict r0, const float *restrict r1,
                                        int ow, int32_t at0, int w)
{
    for (int j = 0; j < ow; j++) {
        float a = r0[2 * j], b = r0[2 * j + 1], c = r1[2 * j], d = r1[2 * j + 1];
        int32_t k = at0 + 2 * j, at = k;
        float best = a;
        int take = b > best || b != b; /* the first maximum; a NaN wins */
        best = take ? b : best, at = take ? k + 1 : at;
        take = c > best || c != c;
        best = take ? c : best, at = take ? k + w : at;
        take = d > best || d != d;
        best = take ? d : best, at = take ? k + w + 1 : at;
        y[j] = best;
        arg[j] = at;
    }
}

/* One plane without padding or dilation (the common case: MaxPool2d(k)):
 * no bounds to test, the window's first element starts the scan. */
static void max_pool_plane_dense(float *restrict y, int32_t *restrict arg,
                                 const float *restrict x, const pool_ctx *c,
                                 const ddp_pool2d_options *o, const int *st)
{
    const int kh = o->kernel_size[0], kw = o->kernel_size[1], w = c->w;
    if (kh == 2 && kw == 2 && st[0] == 2 && st[1] == 2) {
        for (int i = 0; i < c->oh; i++)
            max_pool_row_2x2(y + (size_t)i * (size_t)c->ow, arg + (size_t)i * (size_t)c->ow,
                             x + (size_t)(2 * i) * (size_t)w, x + (size_t)(2 * i + 1) * (size_t)w,
                             c->ow, 2 * i * w, w);
        return;
    }
    for (int i = 0; i < c->oh; i++)
        for (int j = 0; j < c->ow; j++) {
            int at0 = i * st[0] * w + j * st[1], at = at0;
            float best = x[at0];
            for (int ki = 0; ki < kh; ki++)
                for (int kj = 0; kj < kw; kj++) {
                    int k = at0 + ki * w + kj;
                    float val = x[k];
                    int take = val > best || val != val; /* the first maximum; a NaN wins */
                    best = take ? val : best; /* selects, not branches: ties are common */
                    at = take ? k : at;
                }
            y[i * c->ow + j] = best;
            arg[i * c->ow + j] = at;
        }
}

/* One plane: y (oh, ow) and the argmax of each output. */
static void max_pool_plane(float *y, int32_t *arg, const float *x, const pool_ctx *c,
                           const ddp_pool2d_options *o, const int *st)
{
    for (int i = 0; i < c->oh; i++)
        for (int j = 0; j < c->ow; j++) {
            float best = -INFINITY;
            int32_t at = -1;
            for (int ki = 0; ki < o->kernel_size[0]; ki++) {
                int ih = i * st[0] - o->padding[0] + ki * o->dilation[0];
                if (ih < 0 || ih >= c->h)
                    continue;
                for (int kj = 0; kj < o->kernel_size[1]; kj++) {
                    int iw = j * st[1] - o->padding[1] + kj * o->dilation[1];
                    if (iw < 0 || iw >= c->w)
                        continue;
                    float val = x[ih * c->w + iw];
                    if (val > best || isnan(val) || at < 0) {
                        best = val;
                        at = ih * c->w + iw;
                    }
                }
            }
            y[i * c->ow + j] = best;
            arg[i * c->ow + j] = at;
        }
}

int ddp_op_max_pool2d(ddp_tape_t *tape, ddp_var_t *x, const ddp_pool2d_options *o,
                      ddp_var_t **y)
{
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "max_pool2d: NULL tape or output");
    DDP_TRY(ddp__op_check_var(tape, x, "max_pool2d", "input"));
    int st[2], oh, ow;
    DDP_TRY(pool_out_sizes("max_pool2d", x, o, st, &oh, &ow));
    ddp_var_t *v;
    pool_ctx *c;
    DDP_TRY(pool_push(tape, x, &max_pool_def, oh, ow, &v, &c));
    size_t planes = (size_t)c->n * (size_t)c->c, in = (size_t)c->h * (size_t)c->w,
           out = (size_t)oh * (size_t)ow;
    c->argmax = ddp__tape_alloc(tape, planes * out * sizeof *c->argmax);
    if (!c->argmax)
        return DDP_ERR_NOMEM;
    int dense = !o->padding[0] && !o->padding[1] && o->dilation[0] == 1 && o->dilation[1] == 1;
    c->tiles2 = dense && o->kernel_size[0] == 2 && o->kernel_size[1] == 2 && st[0] == 2 &&
                st[1] == 2 && c->h == 2 * oh && c->w == 2 * ow;
    for (size_t pl = 0; pl < planes; pl++)
        (dense ? max_pool_plane_dense : max_pool_plane)(v->t.data + pl * out,
                                                        c->argmax + pl * out,
                                                        x->t.data + pl * in, c, o, st);
    *y = v;
    return 0;
}

/* The input's gradient buffer, zeroed unless it accumulates: both pools'
 * backwards add into it.  NULL on failure (code in tape->grad_target_rc). */
static float *pool_grad_begin(ddp_tape_t *tape, ddp_var_t *v, size_t *planes, size_t *in,
                              size_t *out)
{
    const pool_ctx *c = v->ctx;
    int acc;
    float *dx = ddp__grad_target(tape, v->in[0], &acc);
    *planes = (size_t)c->n * (size_t)c->c, *in = (size_t)c->h * (size_t)c->w;
    *out = (size_t)c->oh * (size_t)c->ow;
    if (dx && !acc)
        memset(dx, 0, *planes * *in * sizeof *dx);
    return dx;
}

/* MaxPool2d(2) over windows that tile the plane: every input is in exactly
 * one window, so dx is written (the winner gets dy, the others 0) with no
 * memset before, or added to. */
DDP_KERNEL static void max_pool_backward_2x2(float *restrict dx, const float *restrict dy,
                                             const int32_t *restrict arg, int oh, int ow,
                                             int acc)
{
    int w = 2 * ow;
    for (int i = 0; i < oh; i++) {
        float *r0 = dx + (size_t)(2 * i) * (size_t)w, *r1 = r0 + w;
        const float *g = dy + (size_t)i * (size_t)ow;
        const int32_t *a = arg + (size_t)i * (size_t)ow;
        for (int j = 0; j < ow; j++) {
            int32_t k = a[j] - 2 * i * w - 2 * j; /* 0, 1, w, w + 1 */
            float v[4] = {k == 0 ? g[j] : 0.0f, k == 1 ? g[j] : 0.0f, k == w ? g[j] : 0.0f,
                          k == w + 1 ? g[j] : 0.0f};
            if (acc) {
                r0[2 * j] += v[0], r0[2 * j + 1] += v[1], r1[2 * j] += v[2],
                    r1[2 * j + 1] += v[3];
            } else {
                r0[2 * j] = v[0], r0[2 * j + 1] = v[1], r1[2 * j] = v[2], r1[2 * j + 1] = v[3];
            }
        }
    }
}

static int max_pool_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    const pool_ctx *c = v->ctx;
    size_t planes = (size_t)c->n * (size_t)c->c, in = (size_t)c->h * (size_t)c->w,
           out = (size_t)c->oh * (size_t)c->ow;
    if (c->tiles2) {
        int acc;
        DDP_GRAD_TARGET(dx, v->in[0]);
        for (size_t pl = 0; pl < planes; pl++)
            max_pool_backward_2x2(dx + pl * in, v->grad + pl * out, c->argmax + pl * out, c->oh,
                                  c->ow, acc);
        return 0;
    }
    float *dx = pool_grad_begin(tape, v, &planes, &in, &out);
    if (!dx)
        return tape->grad_target_rc;
    for (size_t pl = 0; pl < planes; pl++) {
        float *d = dx + pl * in;
        const float *dy = v->grad + pl * out;
        const int32_t *arg = c->argmax + pl * out;
        for (size_t k = 0; k < out; k++)
            d[arg[k]] += dy[k];
    }
    return 0;
}

/* ==== average pools ======================================================= */

static int avg_pool_backward(ddp_tape_t *tape, ddp_var_t *v);
static const ddp__op_def avg_pool_def = {"avg_pool2d", avg_pool_backward, 0};
static const ddp__op_def adaptive_def = {"adaptive_avg_pool2d", avg_pool_backward, 0};

static void avg_pool_plane(float *y, const float *x, const pool_ctx *c)
{
    for (int i = 0; i < c->oh; i++)
        for (int j = 0; j < c->ow; j++) {
            float s = 0.0f;
            for (int ih = c->rows.lo[i]; ih < c->rows.hi[i]; ih++)
                for (int iw = c->cols.lo[j]; iw < c->cols.hi[j]; iw++)
                    s += x[ih * c->w + iw];
            y[i * c->ow + j] = s / (float)(c->rows.span[i] * c->cols.span[j]);
        }
}

static int avg_pool_run(ddp_tape_t *tape, ddp_var_t *v, pool_ctx *c, ddp_var_t *x,
                        ddp_var_t **y)
{
    size_t planes = (size_t)c->n * (size_t)c->c, in = (size_t)c->h * (size_t)c->w,
           out = (size_t)c->oh * (size_t)c->ow;
    (void)tape;
    for (size_t pl = 0; pl < planes; pl++)
        avg_pool_plane(v->t.data + pl * out, x->t.data + pl * in, c);
    *y = v;
    return 0;
}

int ddp_op_avg_pool2d(ddp_tape_t *tape, ddp_var_t *x, const ddp_pool2d_options *o,
                      ddp_var_t **y)
{
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "avg_pool2d: NULL tape or output");
    DDP_TRY(ddp__op_check_var(tape, x, "avg_pool2d", "input"));
    int st[2], oh, ow;
    DDP_TRY(pool_out_sizes("avg_pool2d", x, o, st, &oh, &ow));
    DDP_FAIL_IF(o->dilation[0] != 1 || o->dilation[1] != 1, DDP_ERR_INVALID_ARG,
                "avg_pool2d: dilation (%d, %d) is not supported (AvgPool2d has none)",
                o->dilation[0], o->dilation[1]);
    ddp_var_t *v;
    pool_ctx *c;
    DDP_TRY(pool_push(tape, x, &avg_pool_def, oh, ow, &v, &c));
    DDP_TRY(axis_alloc(tape, &c->rows, oh));
    DDP_TRY(axis_alloc(tape, &c->cols, ow));
    axis_avg(&c->rows, oh, c->h, o->kernel_size[0], st[0], o->padding[0], o->count_include_pad);
    axis_avg(&c->cols, ow, c->w, o->kernel_size[1], st[1], o->padding[1], o->count_include_pad);
    return avg_pool_run(tape, v, c, x, y);
}

int ddp_op_adaptive_avg_pool2d(ddp_tape_t *tape, ddp_var_t *x, int oh, int ow, ddp_var_t **y)
{
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "adaptive_avg_pool2d: NULL tape or output");
    DDP_TRY(ddp__op_check_var(tape, x, "adaptive_avg_pool2d", "input"));
    DDP_TRY(ddp__conv_input_4d(x, "adaptive_avg_pool2d"));
    DDP_FAIL_IF(oh < 1 || ow < 1, DDP_ERR_INVALID_ARG,
                "adaptive_avg_pool2d: output size (%d, %d) must be >= 1", oh, ow);
    ddp_var_t *v;
    pool_ctx *c;
    DDP_TRY(pool_push(tape, x, &adaptive_def, oh, ow, &v, &c));
    DDP_TRY(axis_alloc(tape, &c->rows, oh));
    DDP_TRY(axis_alloc(tape, &c->cols, ow));
    axis_adaptive(&c->rows, oh, c->h);
    axis_adaptive(&c->cols, ow, c->w);
    return avg_pool_run(tape, v, c, x, y);
}

static int avg_pool_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    const pool_ctx *c = v->ctx;
    size_t planes, in, out;
    float *dx = pool_grad_begin(tape, v, &planes, &in, &out);
    if (!dx)
        return tape->grad_target_rc;
    for (size_t pl = 0; pl < planes; pl++) {
        float *d = dx + pl * in;
        const float *dy = v->grad + pl * out;
        for (int i = 0; i < c->oh; i++)
            for (int j = 0; j < c->ow; j++) {
                float g = dy[i * c->ow + j] / (float)(c->rows.span[i] * c->cols.span[j]);
                for (int ih = c->rows.lo[i]; ih < c->rows.hi[i]; ih++)
                    for (int iw = c->cols.lo[j]; iw < c->cols.hi[j]; iw++)
                        d[ih * c->w + iw] += g;
            }
    }
    return 0;
}

/* ==== channel dropout ===================================================== */

static int dropout2d_backward(ddp_tape_t *tape, ddp_var_t *v);
static const ddp__op_def dropout2d_def = {"dropout2d", dropout2d_backward, 0};

/* y (=|+=) x scaled per plane by mask (planes of n floats). */
static void planes_scale_to(float *y, const float *x, const float *mask, size_t planes,
                            size_t n, int acc)
{
    for (size_t pl = 0; pl < planes; pl++)
        ddp__vec_scale_to(y + pl * n, mask[pl], x + pl * n, n, acc);
}

int ddp_op_dropout2d(ddp_tape_t *tape, ddp_var_t *x, float p, int training, uint64_t seed,
                     ddp_var_t **y)
{
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "dropout2d: NULL tape or output");
    DDP_TRY(ddp__op_check_var(tape, x, "dropout2d", "input"));
    DDP_TRY(ddp__conv_input_4d(x, "dropout2d"));
    DDP_FAIL_IF(!(p >= 0.0f && p <= 1.0f), DDP_ERR_INVALID_ARG,
                "dropout2d: probability %g is not in [0, 1]", (double)p);
    if (!training || p == 0.0f) {
        *y = x;
        return 0;
    }
    ddp_var_t *v;
    DDP_TRY(ddp__op_push(tape, &dropout2d_def, 4, x->t.shape, 1, x, NULL, NULL, &v));
    size_t planes = (size_t)(x->t.shape[0] * x->t.shape[1]);
    v->aux = ddp__tape_alloc(tape, planes * sizeof(float));
    if (!v->aux)
        return DDP_ERR_NOMEM;
    ddp__rng rng;
    ddp__rng_seed(&rng, seed);
    float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    for (size_t i = 0; i < planes; i++)
        v->aux[i] = ddp__rng_uniform(&rng) >= (double)p ? keep_scale : 0.0f;
    planes_scale_to(v->t.data, x->t.data, v->aux, planes, (size_t)x->t.numel / planes, 0);
    *y = v;
    return 0;
}

static int dropout2d_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    ddp_var_t *x = v->in[0];
    int acc;
    DDP_GRAD_TARGET(dx, x);
    size_t planes = (size_t)(x->t.shape[0] * x->t.shape[1]);
    planes_scale_to(dx, v->grad, v->aux, planes, (size_t)x->t.numel / planes, acc);
    return 0;
}
