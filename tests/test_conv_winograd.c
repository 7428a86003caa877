/* Conv2d's Winograd paths, F(2x2, 3x3) (src/nn/conv_winograd.c) and
 * F(4x4, 3x3) (conv_winograd4.c), which the op picks for 3x3, stride-1,
 * undilated convolutions of >= 8 channels: with each tile forced
 * (DDP_CONV_WINOGRAD) and by default, y and the gradients of sum(y * r)
 * against the convolution's definition in float64 (odd and even outputs,
 * cut tiles, padding 0, 1, 2 and uneven, groups, with and without bias, the
 * gradients accumulated by two uses), a float64 gradient check, which
 * geometries take the path and which tile, and the arena's steady size. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "ddp.h"
#include "conv_util.h"
#include "gradcheck.h"
#include "nn/conv_winograd.h"

typedef struct wcase {
    const char *name;
    int n, c, h, w, o, ph, pw, groups, bias;
} wcase;

static const wcase cases[] = {
    {"odd_out", 2, 8, 7, 6, 8, 0, 0, 1, 1},    /* 5x4 output: cut tiles */
    {"pad1", 2, 8, 6, 6, 12, 1, 1, 1, 0},      /* 6x6, padded copy */
    {"pad2_groups", 1, 16, 5, 7, 16, 2, 2, 2, 1}, /* dx with padding 0 */
    {"uneven_pad", 1, 8, 6, 5, 8, 1, 0, 1, 1},
    {"mnist2", 2, 32, 26, 26, 64, 0, 0, 1, 1}, /* ddp-cnn's second layer */
    {"cut17x21", 1, 8, 19, 21, 8, 0, 1, 1, 1}, /* by default F(4x4), both sides cut */
};

/* The tiles every case runs with: forced, then DDP_CONV_WINOGRAD's default. */
static const char *const tiles[] = {"2", "4", NULL};

static void set_tile(const char *tile)
{
    if (tile)
        setenv("DDP_CONV_WINOGRAD", tile, 1);
    else
        unsetenv("DDP_CONV_WINOGRAD");
}

static int oh_of(const wcase *c) { return c->h + 2 * c->ph - 2; }
static int ow_of(const wcase *c) { return c->w + 2 * c->pw - 2; }
static size_t xnum(const wcase *c) { return (size_t)c->n * c->c * c->h * c->w; }
static size_t wnum(const wcase *c) { return (size_t)c->o * (c->c / c->groups) * 9; }
static size_t ynum(const wcase *c) { return (size_t)c->n * c->o * oh_of(c) * ow_of(c); }

/* Calls f(yi, xi, wi) for every (output, input, weight) index triple of
 * the convolution's definition. */
#define FOR_TERMS(c, BODY)                                                                    \
    do {                                                                                      \
        int cg_ = (c)->c / (c)->groups, og_ = (c)->o / (c)->groups, oh_ = oh_of(c),           \
            ow_ = ow_of(c);                                                                   \
        for (int n_ = 0; n_ < (c)->n; n_++)                                                   \
            for (int o_ = 0; o_ < (c)->o; o_++)                                               \
                for (int i_ = 0; i_ < oh_; i_++)                                              \
                    for (int j_ = 0; j_ < ow_; j_++)                                          \
                        for (int ci_ = 0; ci_ < cg_; ci_++)                                   \
                            for (int k_ = 0; k_ < 9; k_++) {                                  \
                                int ih_ = i_ - (c)->ph + k_ / 3, iw_ = j_ - (c)->pw + k_ % 3; \
                                if (ih_ < 0 || ih_ >= (c)->h || iw_ < 0 || iw_ >= (c)->w)     \
                                    continue;                                                 \
                                size_t yi = (((size_t)n_ * (c)->o + o_) * oh_ + i_) * ow_ + j_; \
                                size_t xi = (((size_t)n_ * (c)->c + o_ / og_ * cg_ + ci_) *   \
                                                 (c)->h + ih_) * (c)->w + iw_;                \
                                size_t wi = ((size_t)o_ * cg_ + ci_) * 9 + k_;                \
                                BODY;                                                         \
                            }                                                                 \
    } while (0)

/* float64 y, and dx, dw, db of sum(y * r), by the definition. */
static void reference(const wcase *c, const float *x, const float *w, const float *b,
                      const float *r, float *y, float *dx, float *dw, float *db)
{
    double *yd = calloc(ynum(c), sizeof *yd), *dxd = calloc(xnum(c), sizeof *dxd);
    double *dwd = calloc(wnum(c), sizeof *dwd);
    FOR_TERMS(c, {
        yd[yi] += (double)w[wi] * x[xi];
        dxd[xi] += (double)w[wi] * r[yi];
        dwd[wi] += (double)x[xi] * r[yi];
    });
    int p = oh_of(c) * ow_of(c);
    for (size_t i = 0; i < ynum(c); i++)
        y[i] = (float)(yd[i] + (b ? b[i / (size_t)p % (size_t)c->o] : 0.0));
    for (size_t i = 0; i < xnum(c); i++)
        dx[i] = (float)dxd[i];
    for (size_t i = 0; i < wnum(c); i++)
        dw[i] = (float)dwd[i];
    for (int o = 0; o < c->o; o++) {
        double s = 0;
        for (int n = 0; n < c->n; n++)
            for (int k = 0; k < p; k++)
                s += r[((size_t)n * c->o + o) * p + k];
        db[o] = (float)s;
    }
    free(yd), free(dxd), free(dwd);
}

static ddp_conv2d_options options(const wcase *c)
{
    ddp_conv2d_options o = ddp_conv2d_defaults(c->c, c->o, 3);
    o.padding[0] = c->ph, o.padding[1] = c->pw;
    o.groups = c->groups;
    o.bias = c->bias;
    return o;
}

static float *randoms(size_t n, ddp__rng *rng)
{
    float *p = malloc(n * sizeof *p);
    gc_fill(p, n, rng);
    return p;
}

/* uses 1: loss = sum(y * r); uses 2: the same op twice on the same inputs,
 * loss = sum(y1 * r1) + sum(y2 * r2), whose gradients are those of r1 + r2
 * (the second backward accumulates). */
static void check_case(const wcase *c, int uses)
{
    ddp__rng rng;
    ddp__rng_seed(&rng, 11);
    float *x = randoms(xnum(c), &rng), *w = randoms(wnum(c), &rng);
    float *b = c->bias ? randoms((size_t)c->o, &rng) : NULL;
    float *r1 = randoms(ynum(c), &rng), *r2 = randoms(ynum(c), &rng), *rs = malloc(ynum(c) * 4);
    for (size_t i = 0; i < ynum(c); i++)
        rs[i] = uses == 2 ? r1[i] + r2[i] : r1[i];
    float *y = malloc(ynum(c) * 4), *dx = malloc(xnum(c) * 4), *dw = malloc(wnum(c) * 4);
    float db[64];
    reference(c, x, w, b, rs, y, dx, dw, db);

    ddp_tape_t *tape;
    assert_int_equal(ddp_tape_create(&tape), 0);
    ddp_conv2d_options o = options(c);
    int cg = c->c / c->groups;
    ddp_var_t *xv = cu_input(tape, x, 4, (int64_t[]){c->n, c->c, c->h, c->w}, 1);
    ddp_var_t *wv = cu_input(tape, w, 4, (int64_t[]){c->o, cg, 3, 3}, 1);
    ddp_var_t *bv = b ? cu_input(tape, b, 1, (int64_t[]){c->o}, 1) : NULL, *yv, *y2, *l1, *l2;
    assert_int_equal(ddp_op_conv2d(tape, xv, wv, bv, &o, &yv), 0);
    assert_int_equal(cu_weighted_sum(tape, yv, r1, &l1), 0);
    if (uses == 2) {
        assert_int_equal(ddp_op_conv2d(tape, xv, wv, bv, &o, &y2), 0);
        assert_int_equal(cu_weighted_sum(tape, y2, r2, &l2), 0);
        assert_int_equal(ddp_op_add(tape, l1, l2, &l1), 0);
    }
    assert_int_equal(ddp_tape_backward(tape, l1, NULL), 0);
    double ey = cu_rel_err(ddp_var_tensor(yv)->data, y, ynum(c));
    double ex = cu_rel_err(ddp_var_grad(xv), dx, xnum(c));
    double ew = cu_rel_err(ddp_var_grad(wv), dw, wnum(c));
    double eb = b ? cu_rel_err(ddp_var_grad(bv), db, (size_t)c->o) : 0;
    if (getenv("DDP_TEST_VERBOSE") || fmax(fmax(ey, ex), fmax(ew, eb)) > 1e-5)
        fprintf(stderr, "%s x%d tile %s: y %.3g dx %.3g dw %.3g db %.3g\n", c->name, uses,
                getenv("DDP_CONV_WINOGRAD") ? getenv("DDP_CONV_WINOGRAD") : "auto", ey, ex, ew,
                eb);
    assert_true(ey <= 1e-5 && ex <= 1e-5 && ew <= 1e-5 && eb <= 1e-5);
    ddp_tape_destroy(tape);
    free(x), free(w), free(b), free(r1), free(r2), free(rs), free(y), free(dx), free(dw);
}

static ddp__conv_geom geom(const wcase *c)
{
    ddp__conv_geom g = {.c = c->c / c->groups, .h = c->h, .w = c->w, .kh = 3, .kw = 3,
                        .sh = 1, .sw = 1, .ph = c->ph, .pw = c->pw, .dh = 1, .dw = 1};
    g.oh = oh_of(c), g.ow = ow_of(c);
    return g;
}

/* Every case takes the Winograd path and matches the definition, with
 * either tile. */
static void test_winograd_reference(void **state)
{
    (void)state;
    for (size_t ti = 0; ti < sizeof tiles / sizeof tiles[0]; ti++) {
        set_tile(tiles[ti]);
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
            const wcase *c = &cases[k];
            ddp__conv_geom g = geom(c);
            assert_true(ddp__wino_fits(&g, c->o / c->groups));
            check_case(c, 1);
            check_case(c, 2);
        }
    }
    set_tile(NULL);
}

/* Which tile: by default F(4x4) from a 16x16 output (ddp-cnn's conv2),
 * F(2x2) below; DDP_CONV_WINOGRAD forces either; a bad value is an error
 * of the op that reads it. */
static void test_winograd_tile(void **state)
{
    (void)state;
    ddp__conv_geom g = geom(&cases[4]);
    int m = 0;
    assert_int_equal(ddp__wino_tile(&g, &m), 0);
    assert_int_equal(m, 4);
    g.oh = DDP__WINO4_MIN - 1;
    assert_int_equal(ddp__wino_tile(&g, &m), 0);
    assert_int_equal(m, 2);
    set_tile("4");
    assert_int_equal(ddp__wino_tile(&g, &m), 0);
    assert_int_equal(m, 4);
    g = geom(&cases[4]);
    set_tile("2");
    assert_int_equal(ddp__wino_tile(&g, &m), 0);
    assert_int_equal(m, 2);
    set_tile("3");
    assert_int_equal(ddp__wino_tile(&g, &m), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "DDP_CONV_WINOGRAD=3"));
    const wcase *c = &cases[1];
    float buf[4096] = {0};
    ddp_tape_t *tape;
    assert_int_equal(ddp_tape_create(&tape), 0);
    ddp_conv2d_options o = options(c);
    ddp_var_t *xv = cu_input(tape, buf, 4, (int64_t[]){c->n, c->c, c->h, c->w}, 1);
    ddp_var_t *wv = cu_input(tape, buf, 4, (int64_t[]){c->o, c->c, 3, 3}, 1), *y;
    assert_int_equal(ddp_op_conv2d(tape, xv, wv, NULL, &o, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "DDP_CONV_WINOGRAD=3"));
    ddp_tape_destroy(tape);
    set_tile(NULL);
}

/* F(4x4)'s two ways with M: its GEMMs writing it (beta 0, where OpenBLAS
 * makes that free) or adding into an M that the previous call's output
 * transform cleared (elsewhere): the same outputs (to rounding), a first
 * call and a second on the same scratch alike, whichever way this host's
 * OpenBLAS takes.  12 output channels: a block of 8 and a short one; 10 input
 * channels, the same in the input transform. */
static void test_wino4_beta_paths(void **state)
{
    (void)state;
    enum { C = 10, O = 12, H = 18, W = 18 };
    ddp__rng rng;
    ddp__rng_seed(&rng, 3);
    float *x = randoms(C * H * W, &rng), *w = randoms(O * C * 9, &rng), *b = randoms(O, &rng);
    float *u = malloc(36 * O * C * sizeof *u), *y[4];
    ddp__wino_filters(u, w, 4, O, C, 0);
    ddp__wino_plan p;
    ddp__wino_plan_init(&p, 4, C, O, H, W, 1, 1);
    assert_int_equal(p.beta0, ddp__wino_beta0_free());
    size_t ny = (size_t)O * (size_t)p.oh * (size_t)p.ow;
    float *scratch = malloc(ddp__wino_scratch_floats(&p) * sizeof *scratch);
    for (int k = 0; k < 4; k++) { /* beta 0, then clearing; fresh, then not */
        p.beta0 = k < 2;
        y[k] = malloc(ny * sizeof *y[k]);
        ddp__wino_conv(&p, y[k], NULL, x, u, b, 0, k % 2 == 0, scratch);
    }
    /* OpenBLAS may sum a beta-0 product in another order than a beta-1
     * one: equal to float32 rounding (a missed clear doubles M) */
    for (int k = 1; k < 4; k++)
        for (size_t i = 0; i < ny; i++)
            if (fabsf(y[k][i] - y[0][i]) > 1e-5f * (1.0f + fabsf(y[0][i])))
                fail_msg("way %d: y[%zu] %.9g, beta 0's first call %.9g", k, i, y[k][i],
                         y[0][i]);
    for (int k = 0; k < 4; k++)
        free(y[k]);
    free(x), free(w), free(b), free(u), free(scratch);
}

/* What takes the path: ddp-cnn's conv2, not conv1 (1 input channel), nor
 * strides, dilations, other kernels or padding beyond 2. */
static void test_winograd_fits(void **state)
{
    (void)state;
    ddp__conv_geom g = geom(&cases[4]);
    assert_true(ddp__wino_fits(&g, 64));
    ddp__conv_geom c1 = g;
    c1.c = 1;
    assert_false(ddp__wino_fits(&c1, 32)); /* conv1 */
    assert_false(ddp__wino_fits(&g, 4));   /* few output channels */
    ddp__conv_geom s = g;
    s.sh = 2;
    assert_false(ddp__wino_fits(&s, 64));
    s = g, s.dw = 2;
    assert_false(ddp__wino_fits(&s, 64));
    s = g, s.kw = 5;
    assert_false(ddp__wino_fits(&s, 64));
    s = g, s.ph = 3;
    assert_false(ddp__wino_fits(&s, 64));
}

typedef struct gc_ctx {
    const wcase *c;
    const double *r;
} gc_ctx;

static double ref_loss(double *const *v, void *ctx)
{
    const gc_ctx *g = ctx;
    const wcase *c = g->c;
    double s = 0;
    int p = oh_of(c) * ow_of(c);
    FOR_TERMS(c, s += v[1][wi] * v[0][xi] * g->r[yi]);
    for (size_t i = 0; c->bias && i < ynum(c); i++)
        s += v[2][i / (size_t)p % (size_t)c->o] * g->r[i];
    return s;
}

/* float64 central differences on a small padded, grouped case, with
 * either tile. */
static void gradcheck_case(const wcase *c)
{
    ddp__rng rng;
    ddp__rng_seed(&rng, 5);
    size_t lens[3] = {xnum(c), wnum(c), (size_t)c->o};
    float *vals[3] = {randoms(lens[0], &rng), randoms(lens[1], &rng), randoms(lens[2], &rng)};
    float *r = randoms(ynum(c), &rng);
    double *rd = malloc(ynum(c) * sizeof *rd);
    for (size_t i = 0; i < ynum(c); i++)
        rd[i] = r[i];
    ddp_tape_t *tape;
    assert_int_equal(ddp_tape_create(&tape), 0);
    ddp_conv2d_options o = options(c);
    ddp_var_t *xv = cu_input(tape, vals[0], 4, (int64_t[]){c->n, c->c, c->h, c->w}, 1);
    ddp_var_t *wv = cu_input(tape, vals[1], 4, (int64_t[]){c->o, c->c / c->groups, 3, 3}, 1);
    ddp_var_t *bv = cu_input(tape, vals[2], 1, (int64_t[]){c->o}, 1), *y, *l;
    assert_int_equal(ddp_op_conv2d(tape, xv, wv, bv, &o, &y), 0);
    assert_int_equal(cu_weighted_sum(tape, y, r, &l), 0);
    assert_int_equal(ddp_tape_backward(tape, l, NULL), 0);
    const float *grads[3] = {ddp_var_grad(xv), ddp_var_grad(wv), ddp_var_grad(bv)};
    gc_ctx ctx = {c, rd};
    double err = gc_check(3, vals, grads, lens, ref_loss, &ctx);
    if (err > GC_TOL)
        fprintf(stderr, "gradcheck rel err %.3g\n", err);
    assert_true(err <= GC_TOL);
    ddp_tape_destroy(tape);
    for (int i = 0; i < 3; i++)
        free(vals[i]);
    free(r), free(rd);
}

static void test_winograd_gradcheck(void **state)
{
    (void)state;
    for (int ti = 0; ti < 2; ti++) {
        set_tile(tiles[ti]);
        gradcheck_case(&cases[2]);
    }
    set_tile(NULL);
}

/* Steady steps allocate nothing new (filters and scratch from the arena),
 * with either tile. */
static void arena_case(const wcase *c)
{
    ddp__rng rng;
    ddp__rng_seed(&rng, 3);
    float *x = randoms(xnum(c), &rng), *w = randoms(wnum(c), &rng), *r = randoms(ynum(c), &rng);
    ddp_tape_t *tape;
    assert_int_equal(ddp_tape_create(&tape), 0);
    ddp_conv2d_options o = options(c);
    size_t bytes[4];
    for (int it = 0; it < 4; it++) {
        ddp_tape_reset(tape);
        ddp_var_t *xv = cu_input(tape, x, 4, (int64_t[]){c->n, c->c, c->h, c->w}, 1);
        ddp_var_t *wv = cu_input(tape, w, 4, (int64_t[]){c->o, c->c, 3, 3}, 1), *y, *l;
        assert_int_equal(ddp_op_conv2d(tape, xv, wv, NULL, &o, &y), 0);
        assert_int_equal(cu_weighted_sum(tape, y, r, &l), 0);
        assert_int_equal(ddp_tape_backward(tape, l, NULL), 0);
        bytes[it] = ddp_tape_arena_bytes(tape);
    }
    assert_true(bytes[1] > 0 && bytes[1] == bytes[2] && bytes[2] == bytes[3]);
    ddp_tape_destroy(tape);
    free(x), free(w), free(r);
}

static void test_winograd_arena_stable(void **state)
{
    (void)state;
    for (int ti = 0; ti < 2; ti++) {
        set_tile(tiles[ti]);
        arena_case(&cases[1]);
    }
    set_tile(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_winograd_reference),
        cmocka_unit_test(test_winograd_fits),
        cmocka_unit_test(test_wino4_beta_paths),
        cmocka_unit_test(test_winograd_tile),
        cmocka_unit_test(test_winograd_gradcheck),
        cmocka_unit_test(test_winograd_arena_stable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
