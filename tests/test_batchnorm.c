/* BatchNorm1d/2d against PyTorch 1.13 (tests/fixtures/batchnorm_ref.h, made
 * by tests/fixtures/batchnorm_ref.py): outputs, gradients of x, weight and
 * bias, running statistics (momentum, cumulative average), the step count,
 * evaluation mode; the op's gradients against float64 central differences;
 * the statistics hook's contract; and the errors a user can reach. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ddp.h"
#include "fixtures/batchnorm_ref.h"
#include "gradcheck.h"

#define TOL 2e-5

static void near(const float *got, const float *want, size_t n, double tol, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]);
        if (err > tol * (1.0 + fabs((double)want[i]))) {
            fprintf(stderr, "%s[%zu]: %.9g, PyTorch %.9g\n", what, i, (double)got[i],
                    (double)want[i]);
            fail();
        }
    }
}

typedef struct bn_case {
    const char *tag;
    int is2d;
    ddp_batchnorm_options o;
    int ndim;
    int64_t shape[4];
    int steps;
    const float *w, *b, *x, *r, *y, *dx, *dw, *db, *rm, *rv, *xe, *ye;
    int64_t nbt;
} bn_case;

static size_t numel(const bn_case *c)
{
    size_t n = 1;
    for (int d = 0; d < c->ndim; d++)
        n *= (size_t)c->shape[d];
    return n;
}

/* One forward (+ backward when training) of the case's model on x; *xv gets
 * the input var (for its gradient), *y the output. */
static void step(ddp_model_t *m, ddp_tape_t *tape, const bn_case *c, const float *x, int backward,
                 ddp_var_t **xv, ddp_var_t **y)
{
    ddp_tensor tx, tr;
    assert_int_equal(ddp_tensor_wrap(&tx, (float *)x, c->ndim, c->shape), 0);
    assert_int_equal(ddp_tensor_wrap(&tr, (float *)c->r, c->ndim, c->shape), 0);
    ddp_tape_reset(tape);
    ddp_var_t *r, *yr, *loss;
    assert_int_equal(ddp_tape_input(tape, &tx, 1, xv), 0);
    assert_int_equal(ddp_tape_input(tape, &tr, 0, &r), 0);
    assert_int_equal(ddp_model_forward(m, tape, *xv, y), 0);
    if (!backward)
        return;
    assert_int_equal(ddp_op_mul(tape, *y, r, &yr), 0);
    assert_int_equal(ddp_op_sum(tape, yr, &loss), 0);
    ddp_model_zero_grad(m);
    assert_int_equal(ddp_tape_backward(tape, loss, m), 0);
}

static void run_case(const bn_case *c)
{
    ddp_module_t *bn;
    if (c->is2d)
        assert_int_equal(ddp_batchnorm2d_create(&c->o, &bn), 0);
    else
        assert_int_equal(ddp_batchnorm1d_create(&c->o, &bn), 0);
    ddp_model_t *m;
    assert_int_equal(ddp_model_from_module(bn, &m), 0);
    int C = c->o.num_features;
    if (c->w) {
        memcpy(ddp_model_find_param(m, "weight")->data, c->w, (size_t)C * sizeof(float));
        memcpy(ddp_model_find_param(m, "bias")->data, c->b, (size_t)C * sizeof(float));
    }
    ddp_tape_t *tape;
    assert_int_equal(ddp_tape_create(&tape), 0);
    size_t n = numel(c);
    for (int s = 0; s < c->steps; s++) {
        ddp_var_t *x, *y;
        step(m, tape, c, c->x + (size_t)s * n, 1, &x, &y);
        if (s == 0) {
            near(ddp_var_tensor(y)->data, c->y, n, TOL, "y");
            near(ddp_var_grad(x), c->dx, n, TOL, "dx");
            if (c->w) {
                near(ddp_model_find_param(m, "weight")->grad, c->dw, (size_t)C, TOL, "dweight");
                near(ddp_model_find_param(m, "bias")->grad, c->db, (size_t)C, TOL, "dbias");
            }
        }
    }
    if (c->rm) {
        near(ddp_model_find_buffer(m, "running_mean")->data, c->rm, (size_t)C, TOL, "running_mean");
        near(ddp_model_find_buffer(m, "running_var")->data, c->rv, (size_t)C, TOL, "running_var");
        ddp_buffer *nbt = ddp_model_find_buffer(m, "num_batches_tracked");
        assert_int_equal(nbt->dtype, DDP_INT64);
        assert_int_equal(*(int64_t *)nbt->data, c->nbt);
    } else {
        assert_int_equal(ddp_model_num_buffers(m), 0);
    }
    ddp_model_train(m, 0);
    ddp_var_t *x, *y;
    step(m, tape, c, c->xe, 0, &x, &y);
    near(ddp_var_tensor(y)->data, c->ye, n, TOL, "eval y");
    ddp_tape_destroy(tape);
    ddp_model_destroy(m);
}

#define CASE_ARRAYS(t) t##_x, t##_r, t##_y, t##_dx
static void test_batchnorm1d(void **state)
{
    (void)state;
    bn_case c = {"bn1", 0, ddp_batchnorm_defaults(3), 2, {6, 3}, 2, bn1_w, bn1_b,
                 CASE_ARRAYS(bn1), bn1_dw, bn1_db, bn1_rm, bn1_rv, bn1_xe, bn1_ye, bn1_nbt};
    run_case(&c);
}

static void test_batchnorm2d_momentum(void **state)
{
    (void)state;
    ddp_batchnorm_options o = ddp_batchnorm_defaults(3);
    o.momentum = 0.3;
    bn_case c = {"bn2d", 1, o, 4, {2, 3, 2, 3}, 2, bn2d_w, bn2d_b, CASE_ARRAYS(bn2d), bn2d_dw,
                 bn2d_db, bn2d_rm, bn2d_rv, bn2d_xe, bn2d_ye, bn2d_nbt};
    run_case(&c);
}

/* momentum=None on (N, C, L): the cumulative average over three batches. */
static void test_batchnorm1d_cumulative(void **state)
{
    (void)state;
    ddp_batchnorm_options o = ddp_batchnorm_defaults(2);
    o.cumulative_average = 1;
    bn_case c = {"bn3", 0, o, 3, {4, 2, 3}, 3, bn3_w, bn3_b, CASE_ARRAYS(bn3), bn3_dw,
                 bn3_db, bn3_rm, bn3_rv, bn3_xe, bn3_ye, bn3_nbt};
    run_case(&c);
}

/* No affine, no running statistics: evaluation uses the batch's. */
static void test_batchnorm_untracked(void **state)
{
    (void)state;
    ddp_batchnorm_options o = ddp_batchnorm_defaults(2);
    o.affine = 0;
    o.track_running_stats = 0;
    bn_case c = {"bnoff", 0, o, 2, {5, 2}, 1, NULL, NULL, CASE_ARRAYS(bnoff), NULL, NULL,
                 NULL, NULL, bnoff_xe, bnoff_ye, 0};
    run_case(&c);
}

/* ==== float64 finite differences ========================================== */

#define GN 4
#define GC 3
#define GS 2
typedef struct gc_ctx {
    const float *r;
} gc_ctx;

/* sum(r * batch_norm(x) w + b) in float64, training statistics. */
static double bn_ref(double *const *v, void *ctx)
{
    const gc_ctx *g = ctx;
    const double *x = v[0], *w = v[1], *b = v[2];
    double loss = 0;
    for (int c = 0; c < GC; c++) {
        double s = 0, s2 = 0;
        for (int n = 0; n < GN; n++)
            for (int e = 0; e < GS; e++)
                s += x[(n * GC + c) * GS + e];
        double mean = s / (GN * GS);
        for (int n = 0; n < GN; n++)
            for (int e = 0; e < GS; e++) {
                double d = x[(n * GC + c) * GS + e] - mean;
                s2 += d * d;
            }
        double invstd = 1.0 / sqrt(s2 / (GN * GS) + 1e-5);
        for (int n = 0; n < GN; n++)
            for (int e = 0; e < GS; e++) {
                int i = (n * GC + c) * GS + e;
                loss += g->r[i] * ((x[i] - mean) * invstd * w[c] + b[c]);
            }
    }
    return loss;
}

static void test_batchnorm_gradcheck(void **state)
{
    (void)state;
    static float x[GN * GC * GS], w[GC], b[GC], r[GN * GC * GS];
    ddp__rng rng;
    ddp__rng_seed(&rng, 5);
    gc_fill(x, GN * GC * GS, &rng);
    gc_fill(w, GC, &rng);
    gc_fill(b, GC, &rng);
    gc_fill(r, GN * GC * GS, &rng);
    ddp_tape_t *tape;
    assert_int_equal(ddp_tape_create(&tape), 0);
    ddp_tensor tx, tw, tb, tr;
    int64_t shape[3] = {GN, GC, GS}, cs[1] = {GC};
    assert_int_equal(ddp_tensor_wrap(&tx, x, 3, shape), 0);
    assert_int_equal(ddp_tensor_wrap(&tr, r, 3, shape), 0);
    assert_int_equal(ddp_tensor_wrap(&tw, w, 1, cs), 0);
    assert_int_equal(ddp_tensor_wrap(&tb, b, 1, cs), 0);
    ddp_var_t *vx, *vw, *vb, *vr, *y, *yr, *loss;
    assert_int_equal(ddp_tape_input(tape, &tx, 1, &vx), 0);
    assert_int_equal(ddp_tape_input(tape, &tw, 1, &vw), 0);
    assert_int_equal(ddp_tape_input(tape, &tb, 1, &vb), 0);
    assert_int_equal(ddp_tape_input(tape, &tr, 0, &vr), 0);
    float rm[GC] = {0}, rv[GC] = {1, 1, 1};
    ddp_batch_norm_args a = {.running_mean = rm, .running_var = rv, .training = 1,
                             .momentum = 0.1, .eps = 1e-5};
    assert_int_equal(ddp_op_batch_norm(tape, vx, vw, vb, &a, &y), 0);
    assert_int_equal(ddp_op_mul(tape, y, vr, &yr), 0);
    assert_int_equal(ddp_op_sum(tape, yr, &loss), 0);
    assert_int_equal(ddp_tape_backward(tape, loss, NULL), 0);
    gc_ctx ctx = {r};
    float *vals[3] = {x, w, b};
    const float *grads[3] = {ddp_var_grad(vx), ddp_var_grad(vw), ddp_var_grad(vb)};
    size_t lens[3] = {GN * GC * GS, GC, GC};
    assert_true(gc_check(3, vals, grads, lens, bn_ref, &ctx) < 1e-3);
    ddp_tape_destroy(tape);
}

/* ==== the statistics hook and errors ====================================== */

typedef struct hook_log {
    int calls;
    size_t n[4];
    double scale; /* pretend this many identical replicas */
} hook_log;

static int doubling_hook(double *buf, size_t n, void *user)
{
    hook_log *h = user;
    if (h->calls < 4)
        h->n[h->calls] = n;
    h->calls++;
    for (size_t i = 0; i < n; i++)
        buf[i] *= h->scale;
    return 0;
}

/* A hook that sums two identical replicas leaves y and dx as they are
 * (statistics are means) while the count it returns doubles: the unbiased
 * running variance uses n = 2 N and so differs from the local one. */
static void test_batchnorm_stats_hook(void **state)
{
    (void)state;
    ddp_batchnorm_options o = ddp_batchnorm_defaults(3);
    ddp_module_t *bn;
    assert_int_equal(ddp_batchnorm1d_create(&o, &bn), 0);
    hook_log h = {0, {0}, 2.0};
    assert_int_equal(ddp_batchnorm_set_stats_hook(bn, doubling_hook, &h), 0);
    ddp_model_t *m;
    assert_int_equal(ddp_model_from_module(bn, &m), 0);
    memcpy(ddp_model_find_param(m, "weight")->data, bn1_w, sizeof bn1_w);
    memcpy(ddp_model_find_param(m, "bias")->data, bn1_b, sizeof bn1_b);
    ddp_tape_t *tape;
    assert_int_equal(ddp_tape_create(&tape), 0);
    bn_case c = {"bn1", 0, o, 2, {6, 3}, 1, bn1_w, bn1_b, CASE_ARRAYS(bn1), 0, 0, 0, 0, 0, 0, 0};
    ddp_var_t *x, *y;
    step(m, tape, &c, bn1_x, 1, &x, &y);
    near(ddp_var_tensor(y)->data, bn1_y, 18, TOL, "y");
    near(ddp_var_grad(x), bn1_dx, 18, TOL, "dx");
    assert_int_equal(h.calls, 2);
    assert_int_equal(h.n[0], 2 * 3 + 1); /* sum, sum of squares, count */
    assert_int_equal(h.n[1], 2 * 3);     /* sum dy, sum dy xhat */
    const float *rv = ddp_model_find_buffer(m, "running_var")->data;
    double s = 0, s2 = 0; /* channel 0's batch variance, by hand */
    for (int i = 0; i < 6; i++)
        s += bn1_x[i * 3], s2 += (double)bn1_x[i * 3] * bn1_x[i * 3];
    double var = s2 / 6 - (s / 6) * (s / 6);
    assert_true(fabs(rv[0] - (0.9 + 0.1 * var * 12 / 11)) < 1e-5);
    /* Evaluation does not call the hook. */
    ddp_model_train(m, 0);
    step(m, tape, &c, bn1_xe, 0, &x, &y);
    assert_int_equal(h.calls, 2);
    ddp_tape_destroy(tape);
    ddp_model_destroy(m);
}

static void test_batchnorm_errors(void **state)
{
    (void)state;
    ddp_batchnorm_options o = ddp_batchnorm_defaults(3);
    ddp_module_t *bn, *relu;
    o.num_features = 0;
    assert_int_equal(ddp_batchnorm1d_create(&o, &bn), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "num_features 0 must be > 0"));
    o = ddp_batchnorm_defaults(3);
    assert_int_equal(ddp_relu_create(&relu), 0);
    assert_int_equal(ddp_batchnorm_set_stats_hook(relu, doubling_hook, NULL),
                     DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "ReLU is not a BatchNorm"));
    ddp_module_destroy(relu);
    assert_int_equal(ddp_batchnorm2d_create(&o, &bn), 0);
    ddp_model_t *m;
    assert_int_equal(ddp_model_from_module(bn, &m), 0);
    ddp_tape_t *tape;
    assert_int_equal(ddp_tape_create(&tape), 0);
    float data[24] = {0};
    ddp_tensor t;
    ddp_var_t *x, *y;
    assert_int_equal(ddp_tensor_wrap(&t, data, 2, (int64_t[]){8, 3}), 0);
    assert_int_equal(ddp_tape_input(tape, &t, 0, &x), 0);
    assert_int_equal(ddp_model_forward(m, tape, x, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "BatchNorm2d: expected 4D input (got 2D input)"));
    assert_int_equal(ddp_tensor_wrap(&t, data, 4, (int64_t[]){2, 4, 3, 1}), 0);
    assert_int_equal(ddp_tape_input(tape, &t, 0, &x), 0);
    assert_int_equal(ddp_model_forward(m, tape, x, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "input has 4 channels, the layer 3 features"));
    assert_int_equal(ddp_tensor_wrap(&t, data, 4, (int64_t[]){1, 3, 1, 1}), 0);
    assert_int_equal(ddp_tape_input(tape, &t, 0, &x), 0);
    assert_int_equal(ddp_model_forward(m, tape, x, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "expected more than 1 value per channel"));
    ddp_tape_destroy(tape);
    ddp_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batchnorm1d),
        cmocka_unit_test(test_batchnorm2d_momentum),
        cmocka_unit_test(test_batchnorm1d_cumulative),
        cmocka_unit_test(test_batchnorm_untracked),
        cmocka_unit_test(test_batchnorm_gradcheck),
        cmocka_unit_test(test_batchnorm_stats_hook),
        cmocka_unit_test(test_batchnorm_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
