/* Conv2d as a tape op: forward and backward lowered to GEMMs (ddp_sgemm)
 * through im2col (src/tensor/im2col.c); docs/cnn.md has the cost model.
 *
 * Per sample and group (Og = O / groups output channels, K = C / groups *
 * kh * kw, P = OH * OW output positions):
 *   forward   y_n (Og, P)  = W_g (Og, K) cols_n (K, P) [+ b]
 *   backward  dW_g (Og, K) += dy_n (Og, P) cols_n^T (P, K)
 *             dcols (K, P)  = W_g^T (K, Og) dy_n (Og, P);  dx_n = col2im(dcols)
 * One sample at a time keeps cols (K x P floats: 648 KiB for the MNIST
 * network's second layer) in cache between im2col and the GEMM that reads
 * it; a whole-batch cols would be 64 times that, read back from memory.
 * Backward recomputes cols instead of keeping every sample's from forward:
 * the same bytes written once more, in cache, for a 64 times smaller
 * arena.  A 1x1, stride-1, unpadded kernel needs no cols at all: x is cols. */
#include <limits.h>
#include <string.h>

#include "base/error.h"
#include "nn/autograd.h"
#include "nn/conv.h"
#include "nn/conv_winograd.h"
#include "nn/ops.h"
#include "tensor/im2col.h"
#include "tensor/kernels.h"

typedef struct conv_ctx {
    ddp__conv_geom g; /* one group of one sample */
    int n, groups, og; /* batch, groups, output channels per group */
    int wino;          /* 0, or the tile m of Winograd F(m x m, 3x3) (2 or 4) */
    int relu;          /* a ReLU fused in: y = max(conv, 0) */
    uint8_t *arg;      /* MaxPool2d(2) fused in after the ReLU: each window's winner */
} conv_ctx;

ddp_conv2d_options ddp_conv2d_defaults(int in_channels, int out_channels, int kernel_size)
{
    ddp_conv2d_options o = {
        .in_channels = in_channels, .out_channels = out_channels,
        .kernel_size = {kernel_size, kernel_size}, .stride = {1, 1}, .padding = {0, 0},
        .dilation = {1, 1}, .groups = 1, .bias = 1,
    };
    return o;
}

int ddp__conv_check_pairs(const char *op, const int *stride, const int *padding,
                          const int *dilation)
{
    DDP_FAIL_IF(stride[0] < 1 || stride[1] < 1, DDP_ERR_INVALID_ARG,
                "%s: stride (%d, %d) must be >= 1", op, stride[0], stride[1]);
    DDP_FAIL_IF(padding[0] < 0 || padding[1] < 0, DDP_ERR_INVALID_ARG,
                "%s: padding (%d, %d) must be >= 0", op, padding[0], padding[1]);
    DDP_FAIL_IF(dilation[0] < 1 || dilation[1] < 1, DDP_ERR_INVALID_ARG,
                "%s: dilation (%d, %d) must be >= 1", op, dilation[0], dilation[1]);
    return 0;
}

int ddp__conv_input_4d(const ddp_var_t *x, const char *op)
{
    char buf[96];
    DDP_FAIL_IF(x->t.ndim != 4, DDP_ERR_INVALID_ARG,
                "%s: input must be (N, C, H, W), got shape %s", op,
                ddp_tensor_shape_str(&x->t, buf, sizeof buf));
    DDP_FAIL_IF(x->t.numel > INT_MAX, DDP_ERR_UNSUPPORTED,
                "%s: input of shape %s has more than INT_MAX elements", op,
                ddp_tensor_shape_str(&x->t, buf, sizeof buf));
    return 0;
}

/* The geometry of one group of one sample; checks w and b against x. */
static int conv_geometry(const ddp_var_t *x, const ddp_var_t *w, const ddp_var_t *b,
                         const ddp_conv2d_options *o, conv_ctx *c)
{
    DDP_SHAPE_BUFS;
    DDP_TRY(ddp__conv_input_4d(x, "conv2d"));
    DDP_TRY(ddp__conv_check_pairs("conv2d", o->stride, o->padding, o->dilation));
    DDP_FAIL_IF(w->t.ndim != 4, DDP_ERR_INVALID_ARG,
                "conv2d: weight must be (out, in / groups, kh, kw), got shape %s",
                DDP_SHAPE(w, 0));
    int64_t cin = x->t.shape[1], cout = w->t.shape[0];
    DDP_FAIL_IF(o->groups < 1 || cin % o->groups || cout % o->groups, DDP_ERR_INVALID_ARG,
                "conv2d: groups %d must be >= 1 and divide the input's %lld and the output's "
                "%lld channels", o->groups, (long long)cin, (long long)cout);
    DDP_FAIL_IF(w->t.shape[1] * o->groups != cin, DDP_ERR_INVALID_ARG,
                "conv2d: weight of shape %s expects %lld input channels (groups %d), the input "
                "of shape %s has %lld", DDP_SHAPE(w, 0), (long long)(w->t.shape[1] * o->groups),
                o->groups, DDP_SHAPE(x, 1), (long long)cin);
    DDP_FAIL_IF(b && (b->t.ndim != 1 || b->t.shape[0] != cout), DDP_ERR_INVALID_ARG,
                "conv2d: bias of shape %s does not match weight of shape %s", DDP_SHAPE(b, 0),
                DDP_SHAPE(w, 1));
    ddp__conv_geom *g = &c->g;
    *g = (ddp__conv_geom){
        .c = (int)(cin / o->groups), .h = (int)x->t.shape[2], .w = (int)x->t.shape[3],
        .kh = (int)w->t.shape[2], .kw = (int)w->t.shape[3], .sh = o->stride[0],
        .sw = o->stride[1], .ph = o->padding[0], .pw = o->padding[1], .dh = o->dilation[0],
        .dw = o->dilation[1],
    };
    g->oh = ddp__conv_out_size(g->h, g->kh, g->sh, g->ph, g->dh);
    g->ow = ddp__conv_out_size(g->w, g->kw, g->sw, g->pw, g->dw);
    DDP_FAIL_IF(g->oh < 1 || g->ow < 1, DDP_ERR_INVALID_ARG,
                "conv2d: input of shape %s padded by (%d, %d) is smaller than the kernel "
                "(%d, %d) dilated by (%d, %d)", DDP_SHAPE(x, 0), g->ph, g->pw, g->kh, g->kw,
                g->dh, g->dw);
    int64_t k = (int64_t)g->c * g->kh * g->kw, p = (int64_t)g->oh * g->ow;
    DDP_FAIL_IF(k * p > INT_MAX || cout * p > INT_MAX, DDP_ERR_UNSUPPORTED,
                "conv2d: input %s and weight %s exceed BLAS's int dimensions", DDP_SHAPE(x, 0),
                DDP_SHAPE(w, 1));
    c->n = (int)x->t.shape[0];
    c->groups = o->groups;
    c->og = (int)(cout / o->groups);
    c->wino = 0;
    if (ddp__wino_fits(g, c->og))
        DDP_TRY(ddp__wino_tile(g, &c->wino));
    return 0;
}

static int conv_k(const conv_ctx *c) { return c->g.c * c->g.kh * c->g.kw; }
static int conv_p(const conv_ctx *c) { return c->g.oh * c->g.ow; }

/* cols for (sample, group) from the input: x itself when pointwise. */
static const float *conv_cols(const conv_ctx *c, const float *x, int s, int gi, float *buf)
{
    const float *xg = x + ((size_t)s * (size_t)c->groups + (size_t)gi) * (size_t)c->g.c *
                              (size_t)c->g.h * (size_t)c->g.w;
    if (ddp__conv_is_pointwise(&c->g))
        return xg;
    ddp__im2col(buf, xg, &c->g);
    return buf;
}

/* y = W cols + b per sample and group, through im2col. */
static int conv_forward_gemm(ddp_tape_t *tape, const conv_ctx *c, const ddp_var_t *x,
                             const ddp_var_t *w, const ddp_var_t *b, ddp_var_t *v)
{
    int k = conv_k(c), p = conv_p(c), og = c->og;
    float *buf = ddp__conv_is_pointwise(&c->g)
                     ? NULL : ddp__tape_alloc(tape, (size_t)k * (size_t)p * sizeof *buf);
    if (!buf && !ddp__conv_is_pointwise(&c->g))
        return DDP_ERR_NOMEM;
    for (int s = 0; s < c->n; s++)
        for (int gi = 0; gi < c->groups; gi++) {
            const float *cols = conv_cols(c, x->t.data, s, gi, buf);
            float *yg = v->t.data + ((size_t)s * (size_t)c->groups + (size_t)gi) * (size_t)og *
                                        (size_t)p; /* (Og, P) */
            if (b) /* the bias is the GEMM's C, as in linear */
                for (int r = 0; r < og; r++)
                    ddp__vec_fill_to(yg + (size_t)r * (size_t)p, b->t.data[gi * og + r],
                                     (size_t)p, 0);
            ddp_sgemm(0, 0, og, p, k, 1.0f, w->t.data + (size_t)gi * (size_t)og * (size_t)k, k,
                      cols, p, b ? 1.0f : 0.0f, yg, p);
            if (c->relu) /* while the block is in cache */
                ddp__vec_relu_self(yg, (size_t)og * (size_t)p);
        }
    return 0;
}

/* The points of c's Winograd tiles times (Og, C): one group's filters. */
static size_t conv_wino_per_group(const conv_ctx *c)
{
    return (size_t)ddp__wino_points(c->wino) * (size_t)c->og * (size_t)c->g.c;
}

/* Winograd's filters for every group: (P, Og, C) each, or (P, C, Og)
 * flipped for the input gradient; NULL when the arena is out of memory. */
static float *conv_wino_filters(ddp_tape_t *tape, const conv_ctx *c, const float *w, int flip)
{
    size_t per = conv_wino_per_group(c);
    float *u = ddp__tape_alloc(tape, per * (size_t)c->groups * sizeof *u);
    for (int gi = 0; u && gi < c->groups; gi++)
        ddp__wino_filters(u + (size_t)gi * per, w + (size_t)gi * (size_t)c->og * (size_t)c->g.c * 9,
                          c->wino, c->og, c->g.c, flip);
    return u;
}

/* One Winograd convolution per sample and group.  flip 0: the
 * forward, out = y (+ the bias in the output transform), in = x; flip 1: the
 * input gradient, out = dx (=|+= by acc), in = dy, with the filters rotated
 * by 180 degrees and their channels swapped, padding 2 - p. */
static int conv_wino_run(ddp_tape_t *tape, const conv_ctx *c, int flip, float *out,
                         const float *in, const float *w, const float *bias, int acc)
{
    ddp__wino_plan pl;
    if (flip)
        ddp__wino_plan_init(&pl, c->wino, c->og, c->g.c, c->g.oh, c->g.ow, 2 - c->g.ph,
                            2 - c->g.pw);
    else
        ddp__wino_plan_init(&pl, c->wino, c->g.c, c->og, c->g.h, c->g.w, c->g.ph, c->g.pw);
    float *u = conv_wino_filters(tape, c, w, flip);
    float *scratch = ddp__tape_alloc(tape, ddp__wino_scratch_floats(&pl) * sizeof *scratch);
    if (!u || !scratch)
        return DDP_ERR_NOMEM;
    size_t xs = (size_t)c->g.c * (size_t)c->g.h * (size_t)c->g.w;
    size_t ys = (size_t)c->og * (size_t)conv_p(c), us = conv_wino_per_group(c);
    uint8_t *arg = flip ? NULL : c->arg; /* pooled: a quarter of y per sample */
    size_t os = flip ? xs : arg ? ys / 4 : ys, is = flip ? ys : xs;
    for (int s = 0; s < c->n; s++)
        for (int gi = 0; gi < c->groups; gi++) {
            size_t sg = (size_t)s * (size_t)c->groups + (size_t)gi;
            ddp__wino_conv(&pl, out + sg * os, arg ? arg + sg * os : NULL, in + sg * is,
                           u + (size_t)gi * us, bias ? bias + (size_t)gi * (size_t)c->og : NULL,
                           acc, sg == 0, scratch);
        }
    return 0;
}

/* dw (=|+= by acc) by Winograd F(3x3, m x m) (conv_winograd_dw.c): dU (P,
 * Og, C) per group summed over the samples, then G^T dU G. */
static int conv_wino_dw(ddp_tape_t *tape, const conv_ctx *c, float *dw, const float *x,
                        const float *dy, int acc)
{
    ddp__wino_plan pl;
    ddp__wino_plan_init(&pl, c->wino, c->g.c, c->og, c->g.h, c->g.w, c->g.ph, c->g.pw);
    size_t us = conv_wino_per_group(c);
    float *du = ddp__tape_alloc(tape, us * sizeof *du);
    float *scratch = ddp__tape_alloc(tape, ddp__wino_scratch_floats(&pl) * sizeof *scratch);
    if (!du || !scratch)
        return DDP_ERR_NOMEM;
    size_t xs = (size_t)c->g.c * (size_t)c->g.h * (size_t)c->g.w;
    size_t ys = (size_t)c->og * (size_t)conv_p(c);
    for (int gi = 0; gi < c->groups; gi++) {
        for (int s = 0; s < c->n; s++) {
            size_t sg = (size_t)s * (size_t)c->groups + (size_t)gi;
            ddp__wino_dw_sample(&pl, du, x + sg * xs, dy + sg * ys, s > 0, scratch);
        }
        ddp__wino_filters_grad(dw + (size_t)gi * (size_t)c->og * (size_t)c->g.c * 9, du,
                               c->wino, c->og, c->g.c, acc);
    }
    return 0;
}

static int conv2d_backward(ddp_tape_t *tape, ddp_var_t *v);
static int conv_pool_backward(ddp_tape_t *tape, ddp_var_t *v);
static const ddp__op_def conv2d_def = {"conv2d", conv2d_backward, 0};
static const ddp__op_def conv2d_relu_def = {"conv2d_relu", conv2d_backward, 0};
static const ddp__op_def conv2d_relu_pool_def = {"conv2d_relu_max_pool2d", conv_pool_backward, 0};

/* The unfused tail of DDP__CONV_RELU_POOL2 where Winograd's tiles are not
 * the pool's windows: MaxPool2d(2) as its own op. */
static int conv_pool_apart(ddp_tape_t *tape, ddp_var_t *v, ddp_var_t **y)
{
    ddp_pool2d_options po = ddp_pool2d_defaults(2);
    return ddp_op_max_pool2d(tape, v, &po, y);
}

static int conv2d_push(ddp_tape_t *tape, ddp_var_t *x, ddp_var_t *w, ddp_var_t *b,
                       const ddp_conv2d_options *o, int epilogue, ddp_var_t **y)
{
    DDP_FAIL_IF(!tape || !y || !o, DDP_ERR_INVALID_ARG, "conv2d: NULL tape, options or output");
    DDP_TRY(ddp__op_check_var(tape, x, "conv2d", "input"));
    DDP_TRY(ddp__op_check_var(tape, w, "conv2d", "weight"));
    if (b)
        DDP_TRY(ddp__op_check_var(tape, b, "conv2d", "bias"));
    conv_ctx c;
    DDP_TRY(conv_geometry(x, w, b, o, &c));
    c.relu = epilogue != DDP__CONV_PLAIN;
    c.arg = NULL;
    int pool = epilogue == DDP__CONV_RELU_POOL2;
    int fuse_pool = pool && c.wino && c.g.oh % 2 == 0 && c.g.ow % 2 == 0;
    int64_t d = fuse_pool ? 2 : 1;
    int64_t shape[4] = {c.n, (int64_t)c.og * c.groups, c.g.oh / d, c.g.ow / d};
    ddp_var_t *v;
    DDP_TRY(ddp__op_push(tape, fuse_pool ? &conv2d_relu_pool_def
                               : c.relu  ? &conv2d_relu_def
                                         : &conv2d_def,
                         4, shape, 1, x, w, b, &v));
    conv_ctx *saved = ddp__tape_alloc(tape, sizeof *saved);
    if (!saved)
        return DDP_ERR_NOMEM;
    if (fuse_pool && !(c.arg = ddp__tape_alloc(tape, (size_t)v->t.numel)))
        return DDP_ERR_NOMEM;
    *saved = c;
    v->ctx = saved;
    int acc = fuse_pool ? DDP__WINO_RELU_POOL : c.relu ? DDP__WINO_RELU : 0;
    if (c.wino)
        DDP_TRY(conv_wino_run(tape, &c, 0, v->t.data, x->t.data, w->t.data, b ? b->t.data : NULL,
                              acc));
    else
        DDP_TRY(conv_forward_gemm(tape, &c, x, w, b, v));
    if (pool && !fuse_pool)
        return conv_pool_apart(tape, v, y);
    *y = v;
    return 0;
}

int ddp_op_conv2d(ddp_tape_t *tape, ddp_var_t *x, ddp_var_t *w, ddp_var_t *b,
                  const ddp_conv2d_options *o, ddp_var_t **y)
{
    return conv2d_push(tape, x, w, b, o, DDP__CONV_PLAIN, y);
}

int ddp__op_conv2d_fused(ddp_tape_t *tape, ddp_var_t *x, ddp_var_t *w, ddp_var_t *b,
                         const ddp_conv2d_options *o, int epilogue, ddp_var_t **y)
{
    DDP_FAIL_IF(epilogue < DDP__CONV_PLAIN || epilogue > DDP__CONV_RELU_POOL2,
                DDP_ERR_INVALID_ARG, "conv2d: unknown epilogue %d", epilogue);
    return conv2d_push(tape, x, w, b, o, epilogue, y);
}

/* The sum of x (n floats) in 16 float lanes, which the compiler keeps in
 * vector registers (a plain loop's one float sum must run serially). */
DDP_KERNEL static float row_sum(const float *restrict x, size_t n)
{
    float lane[16] = {0}, s = 0.0f;
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++)
            lane[l] += x[i + (size_t)l];
    for (; i < n; i++)
        s += x[i];
    for (int l = 0; l < 16; l++)
        s += lane[l];
    return s;
}

/* db (O) (=|+=) the sum of dy over n samples and positions, one row of dy
 * (P floats) at a time: a GEMV against a ones vector spent more time
 * packing dy than adding it. */
static void conv_bias_backward(float *db, const float *dy, const conv_ctx *c, int n, int acc)
{
    size_t cout = (size_t)c->og * (size_t)c->groups, p = (size_t)conv_p(c);
    for (size_t o = 0; o < cout; o++) {
        float s = acc ? db[o] : 0.0f;
        for (size_t k = 0; k < (size_t)n; k++)
            s += row_sum(dy + (k * cout + o) * p, p);
        db[o] = s;
    }
}

static int conv2d_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    ddp_var_t *x = v->in[0], *w = v->in[1], *b = v->nin > 2 ? v->in[2] : NULL;
    const conv_ctx *c = v->ctx;
    int k = conv_k(c), p = conv_p(c), og = c->og, pw = ddp__conv_is_pointwise(&c->g);
    size_t xs = (size_t)c->g.c * (size_t)c->g.h * (size_t)c->g.w; /* one group's input */
    int acc;
    const float *dy = v->grad;
    if (c->relu) { /* through the fused ReLU, into a buffer of its own: v->grad stays the
                    * output's gradient (ddp_var_grad), as with the two ops */
        size_t n = (size_t)v->t.numel;
        float *g = ddp__tape_alloc(tape, n * sizeof *g);
        if (!g)
            return DDP_ERR_NOMEM;
        ddp__vec_relu_backward_to(g, v->grad, v->t.data, n, 0);
        dy = g;
    }
    if (b && b->requires_grad) {
        DDP_GRAD_TARGET(db, b);
        conv_bias_backward(db, dy, c, c->n, acc);
    }
    float *dw = NULL, *dx = NULL, *cols = NULL, *dcols = NULL;
    int acc_w = 0, acc_x = 0;
    if (w->requires_grad) {
        DDP_GRAD_TARGET(g, w);
        dw = g, acc_w = acc;
        if (c->wino) { /* dw by Winograd too; the loop below makes neither */
            DDP_TRY(conv_wino_dw(tape, c, dw, x->t.data, dy, acc_w));
            dw = NULL;
        } else if (!pw && !(cols = ddp__tape_alloc(tape, (size_t)k * (size_t)p * sizeof *cols)))
            return DDP_ERR_NOMEM;
    }
    if (x->requires_grad) {
        DDP_GRAD_TARGET(g, x);
        dx = g, acc_x = acc;
        if (c->wino) { /* dx by Winograd */
            DDP_TRY(conv_wino_run(tape, c, 1, dx, dy, w->t.data, NULL, acc_x));
            dx = NULL;
        } else if (!pw && !(dcols = ddp__tape_alloc(tape, (size_t)k * (size_t)p * sizeof *dcols)))
            return DDP_ERR_NOMEM;
    }
    for (int s = 0; (dw || dx) && s < c->n; s++)
        for (int gi = 0; gi < c->groups; gi++) {
            size_t sg = (size_t)s * (size_t)c->groups + (size_t)gi;
            const float *dyg = dy + sg * (size_t)og * (size_t)p; /* (Og, P) */
            const float *wg = w->t.data + (size_t)gi * (size_t)og * (size_t)k; /* (Og, K) */
            if (dw) /* (Og, K) += dy (Og, P) cols^T (P, K); the first sample writes */
                ddp_sgemm(0, 1, og, k, p, 1.0f, dyg, p, conv_cols(c, x->t.data, s, gi, cols), p,
                          acc_w || s > 0 ? 1.0f : 0.0f,
                          dw + (size_t)gi * (size_t)og * (size_t)k, k);
            if (!dx)
                continue;
            float *dxg = dx + sg * xs;
            if (pw) { /* dx (C, HW) (=|+=) W^T dy directly */
                ddp_sgemm(1, 0, k, p, og, 1.0f, wg, k, dyg, p, acc_x ? 1.0f : 0.0f, dxg, p);
                continue;
            }
            ddp_sgemm(1, 0, k, p, og, 1.0f, wg, k, dyg, p, 0.0f, dcols, p);
            ddp__col2im(dxg, dcols, &c->g, acc_x);
        }
    return 0;
}

/* ==== Conv2d + ReLU + MaxPool2d(2) ========================================= */

/* The fused op's backward, one sample at a time: its conv output gradient
 * (147 KiB for the MNIST network's second layer) made in cache from the
 * pooled one and used there by the bias, the weight (Winograd dU, summed
 * per group over the samples, in their order) and the input gradient, the
 * same operations in the same order as conv2d_backward after the two ops'
 * backwards: the same bits, without a batch of it in memory. */
static int conv_pool_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    ddp_var_t *x = v->in[0], *w = v->in[1], *b = v->nin > 2 ? v->in[2] : NULL;
    const conv_ctx *c = v->ctx;
    size_t xs = (size_t)c->g.c * (size_t)c->g.h * (size_t)c->g.w, p = (size_t)conv_p(c);
    size_t ys = (size_t)c->og * p, us = conv_wino_per_group(c);
    size_t cout = (size_t)c->og * (size_t)c->groups;
    int acc, acc_b = 0, acc_w = 0, acc_x = 0;
    float *db = NULL, *dw = NULL, *dx = NULL, *du = NULL, *sw = NULL, *uf = NULL, *sx = NULL;
    ddp__wino_plan pw, px;
    ddp__wino_plan_init(&pw, c->wino, c->g.c, c->og, c->g.h, c->g.w, c->g.ph, c->g.pw);
    ddp__wino_plan_init(&px, c->wino, c->og, c->g.c, c->g.oh, c->g.ow, 2 - c->g.ph,
                        2 - c->g.pw);
    if (b && b->requires_grad) {
        DDP_GRAD_TARGET(g, b);
        db = g, acc_b = acc;
    }
    if (w->requires_grad) {
        DDP_GRAD_TARGET(g, w);
        dw = g, acc_w = acc;
        du = ddp__tape_alloc(tape, us * (size_t)c->groups * sizeof *du);
        sw = ddp__tape_alloc(tape, ddp__wino_scratch_floats(&pw) * sizeof *sw);
        if (!du || !sw)
            return DDP_ERR_NOMEM;
    }
    if (x->requires_grad) {
        DDP_GRAD_TARGET(g, x);
        dx = g, acc_x = acc;
        uf = conv_wino_filters(tape, c, w->t.data, 1);
        sx = ddp__tape_alloc(tape, ddp__wino_scratch_floats(&px) * sizeof *sx);
        if (!uf || !sx)
            return DDP_ERR_NOMEM;
    }
    float *dy = ddp__tape_alloc(tape, cout * p * sizeof *dy); /* one sample's */
    if (!dy)
        return DDP_ERR_NOMEM;
    size_t q = cout * p / 4; /* one sample's pooled outputs */
    for (int s = 0; s < c->n; s++) {
        ddp__wino_unpool_relu(dy, v->grad + (size_t)s * q, v->t.data + (size_t)s * q,
                              c->arg + (size_t)s * q, cout, c->g.oh / 2, c->g.ow / 2);
        if (db)
            conv_bias_backward(db, dy, c, 1, acc_b || s > 0);
        for (int gi = 0; gi < c->groups; gi++) {
            size_t sg = (size_t)s * (size_t)c->groups + (size_t)gi;
            const float *dyg = dy + (size_t)gi * ys;
            if (dw)
                ddp__wino_dw_sample(&pw, du + (size_t)gi * us, x->t.data + sg * xs, dyg, s > 0,
                                    sw);
            if (dx)
                ddp__wino_conv(&px, dx + sg * xs, NULL, dyg, uf + (size_t)gi * us, NULL, acc_x,
                               sg == 0, sx);
        }
    }
    for (int gi = 0; dw && gi < c->groups; gi++)
        ddp__wino_filters_grad(dw + (size_t)gi * (size_t)c->og * (size_t)c->g.c * 9,
                               du + (size_t)gi * us, c->wino, c->og, c->g.c, acc_w);
    return 0;
}
