/* Conv2d: forward values and gradients against PyTorch 1.13's (fixtures in
 * tests/fixtures/conv_torch.h, written by conv_torch.py), gradients against
 * float64 central differences over stride, padding, dilation and groups,
 * the module's init and names, the arena's steady size and the errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "ddp.h"
#include "conv_util.h"
#include "fixtures/conv_torch.h"
#include "gradcheck.h"
#include "nn/autograd.h"

static ddp_conv2d_options case_options(const conv_case *c)
{
    ddp_conv2d_options o = ddp_conv2d_defaults(c->cin, c->cout, c->kh);
    o.kernel_size[1] = c->kw;
    o.stride[0] = c->sh, o.stride[1] = c->sw;
    o.padding[0] = c->ph, o.padding[1] = c->pw;
    o.dilation[0] = c->dh, o.dilation[1] = c->dw;
    o.groups = c->groups;
    o.bias = c->bias;
    return o;
}

static size_t x_numel(const conv_case *c) { return (size_t)c->n * c->cin * c->h * c->w; }
static size_t w_numel(const conv_case *c)
{
    return (size_t)c->cout * (c->cin / c->groups) * c->kh * c->kw;
}
static size_t y_numel(const conv_case *c) { return (size_t)c->n * c->cout * c->oh * c->ow; }

/* Runs conv2d on (x, w, b) and backward of sum(y * r); returns the output
 * var (on tape) and the three inputs. */
static ddp_var_t *run_conv(ddp_tape_t *tape, const conv_case *c, float *x, float *w, float *b,
                           const float *r, ddp_var_t **in)
{
    ddp_conv2d_options o = case_options(c);
    in[0] = cu_input(tape, x, 4, (int64_t[]){c->n, c->cin, c->h, c->w}, 1);
    in[1] = cu_input(tape, w, 4, (int64_t[]){c->cout, c->cin / c->groups, c->kh, c->kw}, 1);
    in[2] = b ? cu_input(tape, b, 1, (int64_t[]){c->cout}, 1) : NULL;
    ddp_var_t *y, *loss;
    assert_int_equal(ddp_op_conv2d(tape, in[0], in[1], in[2], &o, &y), 0);
    const ddp_tensor *t = ddp_var_tensor(y);
    assert_int_equal(t->ndim, 4);
    assert_true(t->shape[0] == c->n && t->shape[1] == c->cout && t->shape[2] == c->oh &&
                t->shape[3] == c->ow);
    assert_int_equal(cu_weighted_sum(tape, y, r, &loss), 0);
    assert_int_equal(ddp_tape_backward(tape, loss, NULL), 0);
    return y;
}

static float *dup(const float *src, size_t n)
{
    float *d = malloc(n * sizeof *d);
    memcpy(d, src, n * sizeof *d);
    return d;
}

/* y and the gradients of sum(y * r) equal PyTorch's. */
static void test_conv_torch(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof conv_cases / sizeof conv_cases[0]; k++) {
        const conv_case *c = &conv_cases[k];
        ddp_tape_t *tape;
        assert_int_equal(ddp_tape_create(&tape), 0);
        float *x = dup(c->x, x_numel(c)), *w = dup(c->wt, w_numel(c));
        float *b = c->bias ? dup(c->b, (size_t)c->cout) : NULL;
        ddp_var_t *in[3];
        ddp_var_t *y = run_conv(tape, c, x, w, b, c->r, in);
        double ey = cu_rel_err(ddp_var_tensor(y)->data, c->y, y_numel(c));
        double ex = cu_rel_err(ddp_var_grad(in[0]), c->dx, x_numel(c));
        double ew = cu_rel_err(ddp_var_grad(in[1]), c->dwt, w_numel(c));
        double eb = b ? cu_rel_err(ddp_var_grad(in[2]), c->db, (size_t)c->cout) : 0;
        if (getenv("DDP_TEST_VERBOSE") || fmax(fmax(ey, ex), fmax(ew, eb)) > 1e-5)
            fprintf(stderr, "%s: y %.3g dx %.3g dw %.3g db %.3g\n", c->name, ey, ex, ew, eb);
        assert_true(ey <= 1e-5 && ex <= 1e-5 && ew <= 1e-5 && eb <= 1e-5);
        free(x), free(w), free(b);
        ddp_tape_destroy(tape);
    }
}

/* ==== float64 finite differences ========================================== */

typedef struct gc_conv {
    const conv_case *c;
    const double *r;
} gc_conv;

/* float64 sum(conv2d(x, w, b) * r) by the definition. */
static double ref_conv(double *const *v, void *ctx)
{
    const gc_conv *g = ctx;
    const conv_case *c = g->c;
    const double *x = v[0], *w = v[1], *b = c->bias ? v[2] : NULL;
    int cg = c->cin / c->groups, og = c->cout / c->groups;
    double s = 0;
    size_t at = 0;
    for (int n = 0; n < c->n; n++)
        for (int o = 0; o < c->cout; o++)
            for (int i = 0; i < c->oh; i++)
                for (int j = 0; j < c->ow; j++, at++) {
                    double y = b ? b[o] : 0;
                    for (int ci = 0; ci < cg; ci++)
                        for (int ki = 0; ki < c->kh; ki++)
                            for (int kj = 0; kj < c->kw; kj++) {
                                int ih = i * c->sh - c->ph + ki * c->dh;
                                int iw = j * c->sw - c->pw + kj * c->dw;
                                if (ih < 0 || ih >= c->h || iw < 0 || iw >= c->w)
                                    continue;
                                int cin = o / og * cg + ci;
                                y += w[((o * cg + ci) * c->kh + ki) * c->kw + kj] *
                                     x[((n * c->cin + cin) * c->h + ih) * c->w + iw];
                            }
                    s += y * g->r[at];
                }
    return s;
}

/* Every fixture geometry with fresh random values. */
static void test_conv_gradcheck(void **state)
{
    (void)state;
    ddp__rng rng;
    ddp__rng_seed(&rng, 7);
    for (size_t k = 0; k < sizeof conv_cases / sizeof conv_cases[0]; k++) {
        const conv_case *c = &conv_cases[k];
        size_t lens[3] = {x_numel(c), w_numel(c), (size_t)c->cout}, ny = y_numel(c);
        float *vals[3], *r = malloc(ny * sizeof *r);
        double *rd = malloc(ny * sizeof *rd);
        for (int i = 0; i < 3; i++) {
            vals[i] = malloc(lens[i] * sizeof(float));
            gc_fill(vals[i], lens[i], &rng);
        }
        gc_fill(r, ny, &rng);
        for (size_t i = 0; i < ny; i++)
            rd[i] = r[i];
        ddp_tape_t *tape;
        assert_int_equal(ddp_tape_create(&tape), 0);
        ddp_var_t *in[3];
        run_conv(tape, c, vals[0], vals[1], c->bias ? vals[2] : NULL, r, in);
        const float *grads[3] = {ddp_var_grad(in[0]), ddp_var_grad(in[1]),
                                 c->bias ? ddp_var_grad(in[2]) : NULL};
        gc_conv ctx = {c, rd};
        double err = gc_check(c->bias ? 3 : 2, vals, grads, lens, ref_conv, &ctx);
        if (err > GC_TOL)
            fprintf(stderr, "%s: gradcheck rel err %.3g\n", c->name, err);
        assert_true(err <= GC_TOL);
        ddp_tape_destroy(tape);
        for (int i = 0; i < 3; i++)
            free(vals[i]);
        free(r), free(rd);
    }
}

/* ==== arena, module, errors =============================================== */

/* Steady training steps allocate nothing new: the arena keeps its size. */
static void test_conv_arena_stable(void **state)
{
    (void)state;
    const conv_case *c = &conv_cases[1];
    float *x = dup(c->x, x_numel(c)), *w = dup(c->wt, w_numel(c)), *b = dup(c->b, 6);
    ddp_tape_t *tape;
    assert_int_equal(ddp_tape_create(&tape), 0);
    size_t bytes[4];
    for (int it = 0; it < 4; it++) {
        ddp_tape_reset(tape);
        ddp_var_t *in[3];
        run_conv(tape, c, x, w, b, c->r, in);
        bytes[it] = ddp_tape_arena_bytes(tape);
    }
    assert_true(bytes[1] > 0 && bytes[1] == bytes[2] && bytes[2] == bytes[3]);
    ddp_tape_destroy(tape);
    free(x), free(w), free(b);
}

/* PyTorch's init bounds (1/sqrt(fan_in) for weight and bias), names and
 * shapes through Sequential, the module's forward equal to the op's, and a
 * reset that redraws. */
static void test_conv_module(void **state)
{
    (void)state;
    ddp_conv2d_options o = ddp_conv2d_defaults(4, 6, 3);
    o.kernel_size[1] = 2;
    o.groups = 2;
    o.padding[0] = 1;
    ddp_module_t *conv, *seq;
    ddp_model_t *m;
    assert_int_equal(ddp_conv2d_create(&o, 3, &conv), 0);
    assert_int_equal(ddp_sequential_create(&conv, 1, &seq), 0);
    assert_int_equal(ddp_model_from_module(seq, &m), 0);
    ddp_param *w = ddp_model_find_param(m, "0.weight"), *b = ddp_model_find_param(m, "0.bias");
    assert_non_null(w);
    assert_non_null(b);
    assert_int_equal(w->ndim, 4);
    assert_true(w->shape[0] == 6 && w->shape[1] == 2 && w->shape[2] == 3 && w->shape[3] == 2);
    assert_true(b->ndim == 1 && b->shape[0] == 6);
    double bound = 1.0 / sqrt(2 * 3 * 2), wmax = 0, bmax = 0;
    for (size_t i = 0; i < w->numel; i++)
        wmax = fmax(wmax, fabs(w->data[i]));
    for (size_t i = 0; i < b->numel; i++)
        bmax = fmax(bmax, fabs(b->data[i]));
    assert_true(wmax <= bound && wmax > 0.8 * bound && bmax <= bound && bmax > 0);
    float first = w->data[0];
    assert_int_equal(ddp_model_reset_parameters(m, 99), 0);
    assert_true(w->data[0] != first && fabs(w->data[0]) <= bound);

    float xs[2 * 4 * 5 * 3];
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++)
        xs[i] = (float)sin(0.3 * (double)i);
    ddp_tape_t *tape;
    assert_int_equal(ddp_tape_create(&tape), 0);
    ddp_var_t *x = cu_input(tape, xs, 4, (int64_t[]){2, 4, 5, 3}, 0), *y, *y2, *wv, *bv;
    assert_int_equal(ddp_model_forward(m, tape, x, &y), 0);
    assert_int_equal(ddp_tape_param(tape, w, &wv), 0);
    assert_int_equal(ddp_tape_param(tape, b, &bv), 0);
    assert_int_equal(ddp_op_conv2d(tape, x, wv, bv, &o, &y2), 0);
    const ddp_tensor *t = ddp_var_tensor(y), *t2 = ddp_var_tensor(y2);
    assert_true(t->shape[1] == 6 && t->shape[2] == 5 && t->shape[3] == 2);
    assert_memory_equal(t->data, t2->data, (size_t)t->numel * sizeof(float));
    ddp_tape_destroy(tape);
    ddp_model_destroy(m);

    o.bias = 0;
    assert_int_equal(ddp_conv2d_create(&o, 3, &conv), 0);
    assert_null(ddp_module_param(conv, "bias"));
    ddp_module_destroy(conv);
    o.groups = 4; /* does not divide 6 */
    assert_int_equal(ddp_conv2d_create(&o, 3, &conv), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "conv2d: groups 4 must divide"));
}

/* A fusion case: Sequential(Conv2d(o), ReLU, [MaxPool2d(2),] Flatten) on
 * x (2, c, h, w), and the op Sequential runs for the fused modules; ties:
 * zero weights and biases of +-0.5, so that every pool window of an odd
 * channel ties and only the first winner (MaxPool2d's) gives its dW. */
typedef struct fuse_case {
    ddp_conv2d_options o;
    int pool, h, w;
    const char *op;
    int ties;
} fuse_case;

/* One pass of a fuse_case against a loss sum(y * r): y, dy, dx and the
 * conv's dW and db into out (concatenated), by the model's forward (fused:
 * 1, which must run k->op) or by the ops one by one on the same parameters
 * (0). */
static size_t conv_relu_pass(ddp_model_t *m, const fuse_case *k, int fused, float *out)
{
    int c = k->o.in_channels;
    size_t nx = (size_t)2 * (size_t)c * (size_t)k->h * (size_t)k->w;
    static float xs[4096], r[4096];
    assert_true(nx <= 4096);
    for (size_t i = 0; i < nx; i++) /* signs mixed: the ReLU cuts */
        xs[i] = (float)sin(0.7 * (double)i), r[i] = (float)cos(0.3 * (double)i);
    ddp_tape_t *tape;
    assert_int_equal(ddp_tape_create(&tape), 0);
    ddp_var_t *x = cu_input(tape, xs, 4, (int64_t[]){2, c, k->h, k->w}, 1), *y, *loss;
    ddp_param *w = ddp_model_find_param(m, "0.weight"), *b = ddp_model_find_param(m, "0.bias");
    ddp_model_zero_grad(m);
    if (fused) {
        assert_int_equal(ddp_model_forward(m, tape, x, &y), 0);
        assert_string_equal(y->in[0]->def->name, k->op); /* Flatten's input */
    } else {
        ddp_var_t *wv, *bv, *pre;
        ddp_pool2d_options po = ddp_pool2d_defaults(2);
        assert_int_equal(ddp_tape_param(tape, w, &wv), 0);
        assert_int_equal(ddp_tape_param(tape, b, &bv), 0);
        assert_int_equal(ddp_op_conv2d(tape, x, wv, bv, &k->o, &pre), 0);
        assert_int_equal(ddp_op_relu(tape, pre, &y), 0);
        if (k->pool)
            assert_int_equal(ddp_op_max_pool2d(tape, y, &po, &y), 0);
        assert_int_equal(ddp_op_flatten(tape, y, &y), 0);
    }
    assert_int_equal(cu_weighted_sum(tape, y, r, &loss), 0);
    assert_int_equal(ddp_tape_backward(tape, loss, m), 0);
    const ddp_tensor *t = ddp_var_tensor(y);
    size_t n = 0;
    memcpy(out + n, t->data, (size_t)t->numel * sizeof *out), n += (size_t)t->numel;
    /* y's own gradient too: Flatten's is a view of the fused op's, which
     * must stay the output's gradient, unmasked */
    memcpy(out + n, ddp_var_grad(y), (size_t)t->numel * sizeof *out), n += (size_t)t->numel;
    memcpy(out + n, ddp_var_grad(x), nx * sizeof *out), n += nx;
    memcpy(out + n, w->grad, w->numel * sizeof *out), n += w->numel;
    memcpy(out + n, b->grad, b->numel * sizeof *out), n += b->numel;
    int zeros = 0;
    for (size_t i = 0; i < (size_t)t->numel; i++)
        zeros += t->data[i] == 0.0f;
    assert_true(zeros > 0 && zeros < t->numel); /* the ReLU did cut, not everywhere */
    ddp_tape_destroy(tape);
    return n;
}

/* Sequential runs Conv2d + ReLU, and Conv2d + ReLU + MaxPool2d(2), as one
 * op (layers.c): bitwise the values and gradients of the ops one by one,
 * on the im2col path and on Winograd's (either tile), with groups; the pool
 * fused where Winograd's tiles hold whole windows (an even output), a separate op
 * elsewhere; the module after them still runs (Flatten: it lets the loss's
 * gradient reach the fused op unmasked). */
static void test_conv_relu_fused(void **state)
{
    (void)state;
    ddp_conv2d_options gemm = ddp_conv2d_defaults(4, 6, 3), wino = ddp_conv2d_defaults(8, 8, 3);
    gemm.kernel_size[1] = 2, gemm.groups = 2, gemm.padding[0] = 1;
    wino.padding[0] = wino.padding[1] = 1;
    ddp_conv2d_options grouped = ddp_conv2d_defaults(16, 16, 3);
    grouped.groups = 2;
    ddp_conv2d_options wide = ddp_conv2d_defaults(8, 12, 3); /* F(4x4)'s blocks: 8 + 4 */
    wide.padding[0] = wide.padding[1] = 1;
    const fuse_case cases[] = {
        {gemm, 0, 6, 5, "conv2d_relu", 0},
        {wino, 0, 6, 5, "conv2d_relu", 0},
        {wino, 1, 6, 6, "conv2d_relu_max_pool2d", 0},     /* 6 x 6 output: 3 x 3 tiles */
        {wino, 1, 6, 6, "conv2d_relu_max_pool2d", 1},     /* ties in every window */
        {grouped, 1, 8, 10, "conv2d_relu_max_pool2d", 0}, /* 6 x 8 */
        {wide, 1, 16, 16, "conv2d_relu_max_pool2d", 0},   /* 16 x 16: F(4x4) by default */
        {wino, 1, 6, 5, "max_pool2d", 0},                 /* 6 x 5: pooled apart */
        {gemm, 1, 6, 5, "max_pool2d", 0},
    };
    for (size_t k = 0; k < 2 * (sizeof cases / sizeof cases[0]); k++) {
        if (k == sizeof cases / sizeof cases[0]) /* again with F(4x4)'s tiles (4 windows each) */
            setenv("DDP_CONV_WINOGRAD", "4", 1);
        const fuse_case *fc = &cases[k % (sizeof cases / sizeof cases[0])];
        ddp_module_t *l[4], *seq;
        ddp_model_t *m;
        ddp_pool2d_options po = ddp_pool2d_defaults(2);
        int nl = 0;
        assert_int_equal(ddp_conv2d_create(&fc->o, 3, &l[nl++]), 0);
        assert_int_equal(ddp_relu_create(&l[nl++]), 0);
        if (fc->pool)
            assert_int_equal(ddp_max_pool2d_create(&po, &l[nl++]), 0);
        assert_int_equal(ddp_flatten_create(&l[nl++]), 0);
        assert_int_equal(ddp_sequential_create(l, nl, &seq), 0);
        assert_int_equal(ddp_model_from_module(seq, &m), 0);
        if (fc->ties) {
            ddp_param *w = ddp_model_find_param(m, "0.weight"), *bp = ddp_model_find_param(m, "0.bias");
            memset(w->data, 0, w->numel * sizeof *w->data);
            for (size_t i = 0; i < bp->numel; i++)
                bp->data[i] = i % 2 ? 0.5f : -0.5f;
        }
        static float a[8192], b[8192];
        size_t n = conv_relu_pass(m, fc, 1, a);
        assert_int_equal(conv_relu_pass(m, fc, 0, b), n);
        assert_memory_equal(a, b, n * sizeof *a);
        ddp_model_destroy(m);
    }
    unsetenv("DDP_CONV_WINOGRAD");
}

static void test_conv_errors(void **state)
{
    (void)state;
    float buf[512] = {0};
    ddp_tape_t *tape;
    assert_int_equal(ddp_tape_create(&tape), 0);
    ddp_var_t *x = cu_input(tape, buf, 4, (int64_t[]){2, 3, 5, 5}, 1);
    ddp_var_t *x3 = cu_input(tape, buf, 3, (int64_t[]){3, 5, 5}, 1);
    ddp_var_t *w = cu_input(tape, buf, 4, (int64_t[]){4, 3, 3, 3}, 1);
    ddp_var_t *w2 = cu_input(tape, buf, 4, (int64_t[]){4, 2, 3, 3}, 1);
    ddp_var_t *big = cu_input(tape, buf, 4, (int64_t[]){4, 3, 7, 3}, 1);
    ddp_var_t *b = cu_input(tape, buf, 1, (int64_t[]){5}, 1), *y;
    ddp_conv2d_options o = ddp_conv2d_defaults(3, 4, 3);
    assert_int_equal(ddp_op_conv2d(tape, x3, w, NULL, &o, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "conv2d: input must be (N, C, H, W), got shape (3, 5, 5)"));
    assert_int_equal(ddp_op_conv2d(tape, x, w2, NULL, &o, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "conv2d: weight of shape (4, 2, 3, 3) expects 2 input "
                                             "channels (groups 1), the input of shape (2, 3, 5, 5) has 3"));
    assert_int_equal(ddp_op_conv2d(tape, x, w, b, &o, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "conv2d: bias of shape (5) does not match weight"));
    assert_int_equal(ddp_op_conv2d(tape, x, big, NULL, &o, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "conv2d: input of shape (2, 3, 5, 5) padded by (0, 0) "
                                             "is smaller than the kernel (7, 3)"));
    o.groups = 2;
    assert_int_equal(ddp_op_conv2d(tape, x, w, NULL, &o, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "groups 2 must be >= 1 and divide the input's 3"));
    o.groups = 1;
    o.stride[1] = 0;
    assert_int_equal(ddp_op_conv2d(tape, x, w, NULL, &o, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "conv2d: stride (1, 0) must be >= 1"));
    o.stride[1] = 1;
    o.padding[0] = -1;
    assert_int_equal(ddp_op_conv2d(tape, x, w, NULL, &o, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "conv2d: padding (-1, 0) must be >= 0"));
    assert_int_equal(ddp_op_conv2d(tape, x, w, NULL, NULL, &y), DDP_ERR_INVALID_ARG);
    ddp_module_t *m;
    o = ddp_conv2d_defaults(3, 0, 3);
    assert_int_equal(ddp_conv2d_create(&o, 0, &m), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "conv2d: in_channels 3 and out_channels 0 must be > 0"));
    ddp_tape_destroy(tape);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_torch),
        cmocka_unit_test(test_conv_gradcheck),
        cmocka_unit_test(test_conv_arena_stable),
        cmocka_unit_test(test_conv_module),
        cmocka_unit_test(test_conv_relu_fused),
        cmocka_unit_test(test_conv_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
