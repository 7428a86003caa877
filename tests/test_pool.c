/* Pooling and channel dropout: MaxPool2d (ties, padding, dilation),
 * AvgPool2d (count_include_pad both ways), AdaptiveAvgPool2d (shrinking and
 * growing) against PyTorch 1.13's values and gradients (fixtures in
 * tests/fixtures/conv_torch.h) and float64 finite differences; Dropout2d's
 * whole-channel masks; Identity; the modules; the errors. */
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

static ddp_pool2d_options case_options(const pool_case *c)
{
    ddp_pool2d_options o = ddp_pool2d_defaults(c->kh);
    o.kernel_size[1] = c->kw;
    o.stride[0] = c->sh, o.stride[1] = c->sw;
    o.padding[0] = c->ph, o.padding[1] = c->pw;
    o.dilation[0] = c->dh, o.dilation[1] = c->dw;
    o.count_include_pad = c->include_pad;
    return o;
}

static size_t in_numel(const pool_case *c) { return (size_t)c->n * c->c * c->h * c->w; }
static size_t out_numel(const pool_case *c) { return (size_t)c->n * c->c * c->oh * c->ow; }

static int pool_op(ddp_tape_t *tape, const pool_case *c, ddp_var_t *x, ddp_var_t **y)
{
    ddp_pool2d_options o = case_options(c);
    if (c->kind == 0)
        return ddp_op_max_pool2d(tape, x, &o, y);
    if (c->kind == 1)
        return ddp_op_avg_pool2d(tape, x, &o, y);
    return ddp_op_adaptive_avg_pool2d(tape, x, c->oh, c->ow, y);
}

/* The pool of x and backward of sum(y * r): the output var; *xv the input. */
static ddp_var_t *run_pool(ddp_tape_t *tape, const pool_case *c, float *x, const float *r,
                           ddp_var_t **xv)
{
    *xv = cu_input(tape, x, 4, (int64_t[]){c->n, c->c, c->h, c->w}, 1);
    ddp_var_t *y, *loss;
    assert_int_equal(pool_op(tape, c, *xv, &y), 0);
    const ddp_tensor *t = ddp_var_tensor(y);
    assert_true(t->ndim == 4 && t->shape[2] == c->oh && t->shape[3] == c->ow);
    assert_int_equal(cu_weighted_sum(tape, y, r, &loss), 0);
    assert_int_equal(ddp_tape_backward(tape, loss, NULL), 0);
    return y;
}

static void test_pool_torch(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof pool_cases / sizeof pool_cases[0]; k++) {
        const pool_case *c = &pool_cases[k];
        ddp_tape_t *tape;
        assert_int_equal(ddp_tape_create(&tape), 0);
        float *x = malloc(in_numel(c) * sizeof *x);
        memcpy(x, c->x, in_numel(c) * sizeof *x);
        ddp_var_t *xv, *y = run_pool(tape, c, x, c->r, &xv);
        double ey = cu_rel_err(ddp_var_tensor(y)->data, c->y, out_numel(c));
        double ex = cu_rel_err(ddp_var_grad(xv), c->dx, in_numel(c));
        if (getenv("DDP_TEST_VERBOSE") || ey > 1e-6 || ex > 1e-6)
            fprintf(stderr, "%s: y %.3g dx %.3g\n", c->name, ey, ex);
        /* max pool's ties: an exact gradient means the same winner */
        assert_true(ey <= 1e-6 && ex <= 1e-6);
        free(x);
        ddp_tape_destroy(tape);
    }
}

/* ==== float64 finite differences ========================================== */

typedef struct gc_pool {
    const pool_case *c;
    const double *r;
} gc_pool;

/* The window of output o along one dimension: [lo, hi) and the divisor's
 * span, by PyTorch's formulas (written apart from pool.c's tables). */
static void window(const pool_case *c, int dim, int o, int *lo, int *hi, int *span)
{
    int in = dim ? c->w : c->h, out = dim ? c->ow : c->oh;
    int k = dim ? c->kw : c->kh, s = dim ? c->sw : c->sh, p = dim ? c->pw : c->ph;
    if (c->kind == 2) {
        *lo = (int)floor((double)o * in / out);
        *hi = (int)ceil((double)(o + 1) * in / out);
        *span = *hi - *lo;
        return;
    }
    int l = o * s - p, h = l + k < in + p ? l + k : in + p;
    *span = h - l;
    *lo = l < 0 ? 0 : l;
    *hi = h > in ? in : h;
    if (!c->include_pad)
        *span = *hi - *lo;
}

static double ref_pool(double *const *v, void *ctx)
{
    const gc_pool *g = ctx;
    const pool_case *c = g->c;
    const double *x = v[0];
    double s = 0;
    size_t at = 0;
    for (int pl = 0; pl < c->n * c->c; pl++)
        for (int i = 0; i < c->oh; i++)
            for (int j = 0; j < c->ow; j++, at++) {
                const double *xp = x + (size_t)pl * c->h * c->w;
                double y = 0;
                if (c->kind == 0) {
                    y = -INFINITY;
                    for (int ki = 0; ki < c->kh; ki++)
                        for (int kj = 0; kj < c->kw; kj++) {
                            int ih = i * c->sh - c->ph + ki * c->dh;
                            int iw = j * c->sw - c->pw + kj * c->dw;
                            if (ih >= 0 && ih < c->h && iw >= 0 && iw < c->w)
                                y = fmax(y, xp[ih * c->w + iw]);
                        }
                } else {
                    int hl, hh, hs, wl, wh, ws;
                    window(c, 0, i, &hl, &hh, &hs);
                    window(c, 1, j, &wl, &wh, &ws);
                    for (int ih = hl; ih < hh; ih++)
                        for (int iw = wl; iw < wh; iw++)
                            y += xp[ih * c->w + iw];
                    y /= hs * ws;
                }
                s += y * g->r[at];
            }
    return s;
}

/* Random inputs (no ties: a max has one winner, finite differences see it). */
static void test_pool_gradcheck(void **state)
{
    (void)state;
    ddp__rng rng;
    ddp__rng_seed(&rng, 11);
    for (size_t k = 0; k < sizeof pool_cases / sizeof pool_cases[0]; k++) {
        const pool_case *c = &pool_cases[k];
        size_t nx = in_numel(c), ny = out_numel(c);
        float *x = malloc(nx * sizeof *x), *r = malloc(ny * sizeof *r);
        double *rd = malloc(ny * sizeof *rd);
        gc_fill(x, nx, &rng);
        gc_fill(r, ny, &rng);
        for (size_t i = 0; i < ny; i++)
            rd[i] = r[i];
        ddp_tape_t *tape;
        assert_int_equal(ddp_tape_create(&tape), 0);
        ddp_var_t *xv;
        run_pool(tape, c, x, r, &xv);
        const float *grads[1] = {ddp_var_grad(xv)};
        gc_pool ctx = {c, rd};
        double err = gc_check(1, &x, grads, &nx, ref_pool, &ctx);
        if (err > GC_TOL)
            fprintf(stderr, "%s: gradcheck rel err %.3g\n", c->name, err);
        assert_true(err <= GC_TOL);
        ddp_tape_destroy(tape);
        free(x), free(r), free(rd);
    }
}

/* ==== Dropout2d, Identity, modules ======================================== */

/* Every channel is either all zero or all scaled by 1/(1-p), in output and
 * gradient alike; about p of the channels go; eval and p = 0 are the
 * identity (no new var); the module's masks differ per forward. */
static void test_dropout2d(void **state)
{
    (void)state;
    enum { N = 8, C = 50, HW = 6 };
    static float xs[N * C * HW], ones[N * C * HW];
    for (int i = 0; i < N * C * HW; i++)
        xs[i] = 1.0f + (float)(i % 7), ones[i] = 1.0f;
    ddp_tape_t *tape;
    assert_int_equal(ddp_tape_create(&tape), 0);
    ddp_var_t *x = cu_input(tape, xs, 4, (int64_t[]){N, C, 2, 3}, 1), *y, *loss;
    assert_int_equal(ddp_op_dropout2d(tape, x, 0.3f, 1, 42, &y), 0);
    assert_int_equal(cu_weighted_sum(tape, y, ones, &loss), 0);
    assert_int_equal(ddp_tape_backward(tape, loss, NULL), 0);
    const float *yd = ddp_var_tensor(y)->data, *g = ddp_var_grad(x);
    int dropped = 0;
    for (int pl = 0; pl < N * C; pl++) {
        float s = yd[pl * HW] / xs[pl * HW];
        assert_true(s == 0.0f || fabsf(s - 1.0f / 0.7f) < 1e-6f);
        dropped += s == 0.0f;
        for (int k = 0; k < HW; k++) {
            assert_true(fabsf(yd[pl * HW + k] - s * xs[pl * HW + k]) < 1e-5f);
            assert_true(g[pl * HW + k] == (s == 0.0f ? 0.0f : 1.0f / 0.7f));
        }
    }
    assert_true(dropped > 0.2 * N * C && dropped < 0.4 * N * C);
    ddp_var_t *same;
    assert_int_equal(ddp_op_dropout2d(tape, x, 0.3f, 1, 42, &same), DDP_ERR_STATE);
    ddp_tape_reset(tape);
    x = cu_input(tape, xs, 4, (int64_t[]){N, C, 2, 3}, 1);
    assert_int_equal(ddp_op_dropout2d(tape, x, 0.3f, 0, 42, &same), 0);
    assert_ptr_equal(same, x);
    assert_int_equal(ddp_op_dropout2d(tape, x, 0.0f, 1, 42, &same), 0);
    assert_ptr_equal(same, x);
    assert_int_equal(ddp_op_dropout2d(tape, x, 1.5f, 1, 42, &same), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "dropout2d: probability 1.5 is not in [0, 1]"));

    ddp_module_t *m;
    assert_int_equal(ddp_dropout2d_create(0.5f, 3, &m), 0);
    ddp_var_t *y1, *y2;
    assert_int_equal(ddp_module_forward(m, tape, x, &y1), 0);
    assert_int_equal(ddp_module_forward(m, tape, x, &y2), 0);
    assert_true(memcmp(ddp_var_tensor(y1)->data, ddp_var_tensor(y2)->data, sizeof xs) != 0);
    ddp_module_train(m, 0);
    assert_int_equal(ddp_module_forward(m, tape, x, &y1), 0);
    assert_ptr_equal(y1, x);
    ddp_module_destroy(m);
    assert_int_equal(ddp_identity_create(&m), 0);
    assert_int_equal(ddp_module_forward(m, tape, x, &y1), 0);
    assert_ptr_equal(y1, x);
    ddp_module_destroy(m);
    ddp_tape_destroy(tape);
}

/* The pooling modules run their op with their options. */
static void test_pool_modules(void **state)
{
    (void)state;
    const pool_case *cs[3] = {&pool_cases[1], &pool_cases[4], &pool_cases[5]};
    for (int k = 0; k < 3; k++) {
        const pool_case *c = cs[k];
        ddp_pool2d_options o = case_options(c);
        ddp_module_t *m;
        if (c->kind == 0)
            assert_int_equal(ddp_max_pool2d_create(&o, &m), 0);
        else if (c->kind == 1)
            assert_int_equal(ddp_avg_pool2d_create(&o, &m), 0);
        else
            assert_int_equal(ddp_adaptive_avg_pool2d_create(c->oh, c->ow, &m), 0);
        ddp_tape_t *tape;
        assert_int_equal(ddp_tape_create(&tape), 0);
        ddp_var_t *x = cu_input(tape, (float *)c->x, 4, (int64_t[]){c->n, c->c, c->h, c->w}, 0);
        ddp_var_t *y;
        assert_int_equal(ddp_module_forward(m, tape, x, &y), 0);
        assert_true(cu_rel_err(ddp_var_tensor(y)->data, c->y, out_numel(c)) <= 1e-6);
        ddp_tape_destroy(tape);
        ddp_module_destroy(m);
    }
}

static void test_pool_errors(void **state)
{
    (void)state;
    float buf[256] = {0};
    ddp_tape_t *tape;
    assert_int_equal(ddp_tape_create(&tape), 0);
    ddp_var_t *x = cu_input(tape, buf, 4, (int64_t[]){1, 2, 4, 4}, 1), *y;
    ddp_var_t *x2 = cu_input(tape, buf, 2, (int64_t[]){4, 4}, 1);
    ddp_pool2d_options o = ddp_pool2d_defaults(2);
    assert_int_equal(ddp_op_max_pool2d(tape, x2, &o, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "max_pool2d: input must be (N, C, H, W), got shape (4, 4)"));
    o.padding[1] = 2;
    assert_int_equal(ddp_op_max_pool2d(tape, x, &o, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "max_pool2d: padding (0, 2) must be at most half the kernel (2, 2)"));
    o = ddp_pool2d_defaults(5);
    assert_int_equal(ddp_op_avg_pool2d(tape, x, &o, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "avg_pool2d: input of shape (1, 2, 4, 4) is smaller than the kernel (5, 5)"));
    o = ddp_pool2d_defaults(2);
    o.dilation[0] = 2;
    assert_int_equal(ddp_op_avg_pool2d(tape, x, &o, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "avg_pool2d: dilation (2, 1) is not supported"));
    o = ddp_pool2d_defaults(0);
    assert_int_equal(ddp_op_max_pool2d(tape, x, &o, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "max_pool2d: kernel size (0, 0) must be >= 1"));
    assert_int_equal(ddp_op_adaptive_avg_pool2d(tape, x, 0, 2, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "adaptive_avg_pool2d: output size (0, 2) must be >= 1"));
    ddp_module_t *m;
    assert_int_equal(ddp_max_pool2d_create(&o, &m), DDP_ERR_INVALID_ARG);
    assert_int_equal(ddp_max_pool2d_create(NULL, &m), DDP_ERR_INVALID_ARG);
    ddp_tape_destroy(tape);
}

/* Dropout's and Dropout2d's generators: ddp_module_rng_state gives the
 * stream the masks come from (a checkpoint that restores it makes the
 * same mask again), and eval forwards draw nothing from it. */
static void check_rng_state(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, size_t bytes)
{
    int nwords = 0;
    uint64_t *st = ddp_module_rng_state(m, &nwords), saved[4];
    assert_non_null(st);
    assert_int_equal(nwords, 4);
    memcpy(saved, st, sizeof saved);
    ddp_var_t *y1, *y2;
    assert_int_equal(ddp_module_forward(m, tape, x, &y1), 0);
    assert_true(memcmp(saved, st, sizeof saved) != 0); /* training drew */
    memcpy(st, saved, sizeof saved);                   /* as a resume loads it */
    assert_int_equal(ddp_module_forward(m, tape, x, &y2), 0);
    assert_memory_equal(ddp_var_tensor(y1)->data, ddp_var_tensor(y2)->data, bytes);
    memcpy(saved, st, sizeof saved);
    ddp_module_train(m, 0);
    assert_int_equal(ddp_module_forward(m, tape, x, &y1), 0);
    assert_ptr_equal(y1, x);
    assert_memory_equal(saved, st, sizeof saved); /* eval drew nothing */
    ddp_module_destroy(m);
}

static void test_dropout_rng_state(void **state)
{
    (void)state;
    enum { N = 4, C = 16, HW = 6 };
    static float xs[N * C * HW];
    for (int i = 0; i < N * C * HW; i++)
        xs[i] = 1.0f + (float)(i % 5);
    ddp_tape_t *tape;
    assert_int_equal(ddp_tape_create(&tape), 0);
    ddp_var_t *x = cu_input(tape, xs, 4, (int64_t[]){N, C, 2, 3}, 1);
    ddp_module_t *m;
    assert_int_equal(ddp_dropout2d_create(0.5f, 7, &m), 0);
    check_rng_state(m, tape, x, sizeof xs);
    assert_int_equal(ddp_dropout_create(0.5f, 7, &m), 0);
    check_rng_state(m, tape, x, sizeof xs);
    ddp_tape_destroy(tape);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_torch),
        cmocka_unit_test(test_pool_gradcheck),
        cmocka_unit_test(test_dropout2d),
        cmocka_unit_test(test_dropout_rng_state),
        cmocka_unit_test(test_pool_modules),
        cmocka_unit_test(test_pool_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
