/* Autograd: every op's gradients against central finite differences of a
 * float64 reference forward (relative error <= 1e-4), tape arena reuse,
 * accumulation across backward calls, and the errors users can reach. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "ddp.h"
#include "gradcheck.h"

/* ==== op cases ============================================================ */

typedef struct opcase opcase;
typedef int (*build_fn)(ddp_tape_t *tape, ddp_var_t **in, opcase *c, ddp_var_t **out);

struct opcase {
    const char *name;
    int nin;
    int ndim[GC_MAX];
    int64_t shape[GC_MAX][4];
    build_fn build;        /* the op; its output is then weighted by R and summed */
    gc_ref_fn ref;         /* float64: the op, weighted by R, summed */
    int64_t rlen;          /* output numel (R's length); 0: the op's output is the loss */
    float R[64];
    double Rd[64];
    int64_t labels[8];
    float p;
    uint64_t seed;
    size_t numel[GC_MAX];
};

static double wsum(const double *y, const opcase *c)
{
    double s = 0;
    for (int64_t i = 0; i < c->rlen; i++)
        s += y[i] * c->Rd[i];
    return s;
}

static void d_log_softmax(double *y, const double *x, int rows, int c)
{
    for (int r = 0; r < rows; r++) {
        double mx = x[r * c], s = 0;
        for (int j = 1; j < c; j++)
            mx = fmax(mx, x[r * c + j]);
        for (int j = 0; j < c; j++)
            s += exp(x[r * c + j] - mx);
        for (int j = 0; j < c; j++)
            y[r * c + j] = x[r * c + j] - mx - log(s);
    }
}

#define CTX opcase *c = ctx

static int b_linear(ddp_tape_t *t, ddp_var_t **in, opcase *c, ddp_var_t **y)
{
    return ddp_op_linear(t, in[0], in[1], c->nin > 2 ? in[2] : NULL, y);
}
static double r_linear(double *const *x, void *ctx)
{
    CTX;
    int in = (int)c->shape[1][1], out = (int)c->shape[1][0];
    int rows = (int)(c->numel[0] / (size_t)in);
    double y[64];
    gc_linear(y, x[0], x[1], c->nin > 2 ? x[2] : NULL, rows, in, out);
    return wsum(y, c);
}

static int b_matmul(ddp_tape_t *t, ddp_var_t **in, opcase *c, ddp_var_t **y)
{
    (void)c;
    return ddp_op_matmul(t, in[0], in[1], y);
}
static double r_matmul(double *const *x, void *ctx)
{
    CTX;
    int m = (int)c->shape[0][0], k = (int)c->shape[0][1], n = (int)c->shape[1][1];
    double y[64];
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int q = 0; q < k; q++)
                s += x[0][i * k + q] * x[1][q * n + j];
            y[i * n + j] = s;
        }
    return wsum(y, c);
}

static int b_add(ddp_tape_t *t, ddp_var_t **in, opcase *c, ddp_var_t **y)
{
    return ddp_op_add(t, in[0], c->nin > 1 ? in[1] : in[0], y);
}
static double r_add(double *const *x, void *ctx)
{
    CTX;
    double y[64];
    size_t nb = c->nin > 1 ? c->numel[1] : c->numel[0];
    const double *b = c->nin > 1 ? x[1] : x[0];
    for (int64_t i = 0; i < c->rlen; i++)
        y[i] = x[0][i] + b[(size_t)i % nb];
    return wsum(y, c);
}

static int b_mul(ddp_tape_t *t, ddp_var_t **in, opcase *c, ddp_var_t **y)
{
    return ddp_op_mul(t, in[0], c->nin > 1 ? in[1] : in[0], y);
}
static double r_mul(double *const *x, void *ctx)
{
    CTX;
    double y[64];
    const double *b = c->nin > 1 ? x[1] : x[0];
    for (int64_t i = 0; i < c->rlen; i++)
        y[i] = x[0][i] * b[i];
    return wsum(y, c);
}

static int b_scale(ddp_tape_t *t, ddp_var_t **in, opcase *c, ddp_var_t **y)
{
    (void)c;
    return ddp_op_scale(t, in[0], -2.5f, y);
}
static double r_scale(double *const *x, void *ctx)
{
    CTX;
    double y[64];
    for (int64_t i = 0; i < c->rlen; i++)
        y[i] = -2.5 * x[0][i];
    return wsum(y, c);
}

static int b_relu(ddp_tape_t *t, ddp_var_t **in, opcase *c, ddp_var_t **y)
{
    (void)c;
    return ddp_op_relu(t, in[0], y);
}
static double r_relu(double *const *x, void *ctx)
{
    CTX;
    double y[64];
    for (int64_t i = 0; i < c->rlen; i++)
        y[i] = x[0][i] > 0 ? x[0][i] : 0;
    return wsum(y, c);
}

static int b_sigmoid(ddp_tape_t *t, ddp_var_t **in, opcase *c, ddp_var_t **y)
{
    (void)c;
    return ddp_op_sigmoid(t, in[0], y);
}
static double r_sigmoid(double *const *x, void *ctx)
{
    CTX;
    double y[64];
    for (int64_t i = 0; i < c->rlen; i++)
        y[i] = 1.0 / (1.0 + exp(-x[0][i]));
    return wsum(y, c);
}

static int b_tanh(ddp_tape_t *t, ddp_var_t **in, opcase *c, ddp_var_t **y)
{
    (void)c;
    return ddp_op_tanh(t, in[0], y);
}
static double r_tanh(double *const *x, void *ctx)
{
    CTX;
    double y[64];
    for (int64_t i = 0; i < c->rlen; i++)
        y[i] = tanh(x[0][i]);
    return wsum(y, c);
}

static int b_mse(ddp_tape_t *t, ddp_var_t **in, opcase *c, ddp_var_t **y)
{
    (void)c;
    return ddp_op_mse_loss(t, in[0], in[1], y);
}
static double r_mse(double *const *x, void *ctx)
{
    CTX;
    double s = 0;
    for (size_t i = 0; i < c->numel[0]; i++)
        s += (x[0][i] - x[1][i]) * (x[0][i] - x[1][i]);
    return s / (double)c->numel[0];
}

static int b_dropout(ddp_tape_t *t, ddp_var_t **in, opcase *c, ddp_var_t **y)
{
    return ddp_op_dropout(t, in[0], c->p, 1, c->seed, y);
}
static double r_dropout(double *const *x, void *ctx)
{
    CTX;
    double y[64];
    ddp__rng rng;
    ddp__rng_seed(&rng, c->seed);
    uint64_t draw = 0; /* each draw: the high 32 bits, then the low, against p 2^32 */
    for (int64_t i = 0; i < c->rlen; i++) {
        if (i % 2 == 0)
            draw = ddp__rng_next(&rng);
        double u = (double)(i % 2 ? draw & 0xffffffffu : draw >> 32);
        y[i] = u >= ceil(c->p * 4294967296.0) ? x[0][i] / (1.0 - c->p) : 0.0;
    }
    return wsum(y, c);
}

static int b_sum(ddp_tape_t *t, ddp_var_t **in, opcase *c, ddp_var_t **y)
{
    (void)c;
    ddp_var_t *s;
    int rc = ddp_op_relu(t, in[0], &s);
    return rc < 0 ? rc : ddp_op_sum(t, s, y);
}
static double r_sum(double *const *x, void *ctx)
{
    CTX;
    double s = 0;
    for (size_t i = 0; i < c->numel[0]; i++)
        s += x[0][i] > 0 ? x[0][i] : 0;
    return s;
}

static int b_mean(ddp_tape_t *t, ddp_var_t **in, opcase *c, ddp_var_t **y)
{
    (void)c;
    ddp_var_t *s;
    int rc = ddp_op_mul(t, in[0], in[0], &s);
    return rc < 0 ? rc : ddp_op_mean(t, s, y);
}
static double r_mean(double *const *x, void *ctx)
{
    CTX;
    double s = 0;
    for (size_t i = 0; i < c->numel[0]; i++)
        s += x[0][i] * x[0][i];
    return s / (double)c->numel[0];
}

static int b_reshape(ddp_tape_t *t, ddp_var_t **in, opcase *c, ddp_var_t **y)
{
    (void)c;
    ddp_var_t *r;
    int rc = ddp_op_reshape(t, in[0], 2, (int64_t[]){-1, 6}, &r);
    return rc < 0 ? rc : ddp_op_relu(t, r, y);
}
/* h = 1.5 x; y = reshape(relu(reshape(h, (-1, 6))), (3, 4)) + h: a view of
 * a var used twice, its gradient shared with the var's. */
static int b_reshape_twice(ddp_tape_t *t, ddp_var_t **in, opcase *c, ddp_var_t **y)
{
    (void)c;
    ddp_var_t *h, *r, *a, *b;
    int rc;
    if ((rc = ddp_op_scale(t, in[0], 1.5f, &h)) < 0 ||
        (rc = ddp_op_reshape(t, h, 2, (int64_t[]){-1, 6}, &r)) < 0 ||
        (rc = ddp_op_relu(t, r, &a)) < 0 ||
        (rc = ddp_op_reshape(t, a, 2, (int64_t[]){3, 4}, &b)) < 0)
        return rc;
    return ddp_op_add(t, b, h, y);
}
static double r_reshape_twice(double *const *x, void *ctx)
{
    CTX;
    double y[64];
    for (int64_t i = 0; i < c->rlen; i++)
        y[i] = fmax(1.5 * x[0][i], 0) + 1.5 * x[0][i];
    return wsum(y, c);
}

/* y = x reshape(w, (4, 3)) with w of shape (12): a view of a weight. */
static int b_reshape_weight(ddp_tape_t *t, ddp_var_t **in, opcase *c, ddp_var_t **y)
{
    (void)c;
    ddp_var_t *w;
    int rc = ddp_op_reshape(t, in[1], 2, (int64_t[]){4, 3}, &w);
    return rc < 0 ? rc : ddp_op_matmul(t, in[0], w, y);
}
static double r_reshape_weight(double *const *x, void *ctx)
{
    CTX;
    double y[64];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) {
            double s = 0;
            for (int k = 0; k < 4; k++)
                s += x[0][i * 4 + k] * x[1][k * 3 + j];
            y[i * 3 + j] = s;
        }
    return wsum(y, c);
}

static int b_flatten(ddp_tape_t *t, ddp_var_t **in, opcase *c, ddp_var_t **y)
{
    (void)c;
    ddp_var_t *r;
    int rc = ddp_op_flatten(t, in[0], &r);
    return rc < 0 ? rc : ddp_op_relu(t, r, y);
}

static int b_log_softmax(ddp_tape_t *t, ddp_var_t **in, opcase *c, ddp_var_t **y)
{
    (void)c;
    return ddp_op_log_softmax(t, in[0], y);
}
static double r_log_softmax(double *const *x, void *ctx)
{
    CTX;
    double y[64];
    d_log_softmax(y, x[0], (int)c->shape[0][0], (int)c->shape[0][1]);
    return wsum(y, c);
}

static int b_nll(ddp_tape_t *t, ddp_var_t **in, opcase *c, ddp_var_t **y)
{
    ddp_var_t *lp;
    int rc = ddp_op_log_softmax(t, in[0], &lp);
    return rc < 0 ? rc : ddp_op_nll_loss(t, lp, c->labels, y);
}
static int b_ce(ddp_tape_t *t, ddp_var_t **in, opcase *c, ddp_var_t **y)
{
    return ddp_op_cross_entropy(t, in[0], c->labels, y);
}
static double r_ce(double *const *x, void *ctx)
{
    CTX;
    int rows = (int)c->shape[0][0], k = (int)c->shape[0][1];
    double y[64], s = 0;
    d_log_softmax(y, x[0], rows, k);
    for (int r = 0; r < rows; r++)
        s -= y[r * k + c->labels[r]];
    return s / rows;
}

/* ddp_gradcheck's callbacks for a case: its op, weighted by R and summed
 * (R from the case, not gradcheck's own weights: the scalar is the output),
 * and its float64 reference. */
static int case_build(ddp_tape_t *tape, ddp_var_t *const *in, int nin, ddp_var_t **out,
                      int nout, void *user)
{
    (void)nin, (void)nout;
    opcase *c = user;
    ddp_var_t *y, *rv, *prod;
    int rc = c->build(tape, (ddp_var_t **)in, c, &y);
    if (rc < 0 || !c->rlen) {
        *out = y;
        return rc;
    }
    ddp_tensor rt;
    if ((rc = ddp_tensor_wrap(&rt, c->R, ddp_var_tensor(y)->ndim, ddp_var_tensor(y)->shape)) < 0 ||
        (rc = ddp_tape_input(tape, &rt, 0, &rv)) < 0 || (rc = ddp_op_mul(tape, y, rv, &prod)) < 0)
        return rc;
    return ddp_op_sum(tape, prod, out);
}

static int case_ref(const double *const *in, int nin, double *out, void *user)
{
    (void)nin;
    out[0] = ((opcase *)user)->ref((double *const *)in, user);
    return 0;
}

/* Checks the case's forward value and the gradients of every input against
 * the float64 reference (ddp_gradcheck). */
static void run_case(opcase *c)
{
    ddp__rng rng;
    ddp__rng_seed(&rng, 7);
    float *vals[GC_MAX];
    ddp_tensor in[GC_MAX];
    for (int i = 0; i < c->nin; i++) {
        size_t n = 1;
        for (int d = 0; d < c->ndim[i]; d++)
            n *= (size_t)c->shape[i][d];
        c->numel[i] = n;
        vals[i] = malloc(n * sizeof(float));
        gc_fill(vals[i], n, &rng);
        assert_int_equal(ddp_tensor_wrap(&in[i], vals[i], c->ndim[i], c->shape[i]), 0);
    }
    gc_fill(c->R, (size_t)c->rlen, &rng);
    for (int64_t i = 0; i < c->rlen; i++)
        c->Rd[i] = c->R[i];
    if (ddp_gradcheck(case_build, case_ref, c->nin, in, NULL, c) != 0)
        fail_msg("%s: %s", c->name, ddp_last_error());
    for (int i = 0; i < c->nin; i++)
        free(vals[i]);
}

#define SHAPES(...) {__VA_ARGS__}

static void test_gradcheck_ops(void **state)
{
    (void)state;
    opcase cases[] = {
        {.name = "linear", .nin = 3, .ndim = {2, 2, 1}, .shape = SHAPES({3, 5}, {4, 5}, {4}),
         .build = b_linear, .ref = r_linear, .rlen = 12},
        {.name = "linear no bias", .nin = 2, .ndim = {2, 2}, .shape = SHAPES({3, 5}, {4, 5}),
         .build = b_linear, .ref = r_linear, .rlen = 12},
        {.name = "linear 3-d input", .nin = 3, .ndim = {3, 2, 1},
         .shape = SHAPES({2, 3, 5}, {4, 5}, {4}), .build = b_linear, .ref = r_linear,
         .rlen = 24},
        {.name = "matmul", .nin = 2, .ndim = {2, 2}, .shape = SHAPES({3, 5}, {5, 4}),
         .build = b_matmul, .ref = r_matmul, .rlen = 12},
        {.name = "add", .nin = 2, .ndim = {2, 2}, .shape = SHAPES({3, 4}, {3, 4}),
         .build = b_add, .ref = r_add, .rlen = 12},
        {.name = "add rows", .nin = 2, .ndim = {2, 1}, .shape = SHAPES({3, 4}, {4}),
         .build = b_add, .ref = r_add, .rlen = 12},
        {.name = "add x+x", .nin = 1, .ndim = {2}, .shape = SHAPES({3, 4}), .build = b_add,
         .ref = r_add, .rlen = 12},
        {.name = "mul", .nin = 2, .ndim = {2, 2}, .shape = SHAPES({3, 4}, {3, 4}),
         .build = b_mul, .ref = r_mul, .rlen = 12},
        {.name = "mul x*x", .nin = 1, .ndim = {1}, .shape = SHAPES({7}), .build = b_mul,
         .ref = r_mul, .rlen = 7},
        {.name = "scale", .nin = 1, .ndim = {2}, .shape = SHAPES({2, 5}), .build = b_scale,
         .ref = r_scale, .rlen = 10},
        {.name = "relu", .nin = 1, .ndim = {2}, .shape = SHAPES({4, 6}), .build = b_relu,
         .ref = r_relu, .rlen = 24},
        {.name = "sigmoid", .nin = 1, .ndim = {2}, .shape = SHAPES({3, 5}),
         .build = b_sigmoid, .ref = r_sigmoid, .rlen = 15},
        {.name = "tanh", .nin = 1, .ndim = {2}, .shape = SHAPES({3, 5}), .build = b_tanh,
         .ref = r_tanh, .rlen = 15},
        {.name = "mse_loss", .nin = 2, .ndim = {2, 2}, .shape = SHAPES({3, 4}, {3, 4}),
         .build = b_mse, .ref = r_mse},
        {.name = "dropout", .nin = 1, .ndim = {2}, .shape = SHAPES({4, 8}), .build = b_dropout,
         .ref = r_dropout, .rlen = 32, .p = 0.3f, .seed = 99},
        {.name = "sum", .nin = 1, .ndim = {2}, .shape = SHAPES({3, 4}), .build = b_sum,
         .ref = r_sum},
        {.name = "mean", .nin = 1, .ndim = {2}, .shape = SHAPES({3, 4}), .build = b_mean,
         .ref = r_mean},
        {.name = "reshape", .nin = 1, .ndim = {2}, .shape = SHAPES({3, 4}),
         .build = b_reshape, .ref = r_relu, .rlen = 12},
        {.name = "reshape of a var used twice", .nin = 1, .ndim = {2},
         .shape = SHAPES({3, 4}), .build = b_reshape_twice, .ref = r_reshape_twice,
         .rlen = 12},
        {.name = "reshape of a weight", .nin = 2, .ndim = {2, 1}, .shape = SHAPES({2, 4}, {12}),
         .build = b_reshape_weight, .ref = r_reshape_weight, .rlen = 6},
        {.name = "flatten", .nin = 1, .ndim = {3}, .shape = SHAPES({2, 3, 2}),
         .build = b_flatten, .ref = r_relu, .rlen = 12},
        {.name = "log_softmax", .nin = 1, .ndim = {2}, .shape = SHAPES({3, 5}),
         .build = b_log_softmax, .ref = r_log_softmax, .rlen = 15},
        {.name = "nll(log_softmax)", .nin = 1, .ndim = {2}, .shape = SHAPES({4, 5}),
         .build = b_nll, .ref = r_ce, .labels = {0, 4, 2, 2}},
        {.name = "cross_entropy", .nin = 1, .ndim = {2}, .shape = SHAPES({4, 5}),
         .build = b_ce, .ref = r_ce, .labels = {3, 0, 4, 1}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(&cases[i]);
}

/* Cross-entropy stays finite and right with huge logits (log-sum-exp). */
static void test_cross_entropy_stable(void **state)
{
    (void)state;
    float x[6] = {1000.0f, 0.0f, -1000.0f, 50.0f, 51.0f, 52.0f};
    int64_t labels[2] = {1, 2};
    ddp_tape_t *tape;
    ddp_tensor t;
    ddp_var_t *in, *loss;
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_int_equal(ddp_tensor_wrap(&t, x, 2, (int64_t[]){2, 3}), 0);
    assert_int_equal(ddp_tape_input(tape, &t, 1, &in), 0);
    assert_int_equal(ddp_op_cross_entropy(tape, in, labels, &loss), 0);
    /* row 0: 1000 - 0 = 1000; row 1: log(e^-2 + e^-1 + 1) */
    double expect = (1000.0 + log(exp(-2.0) + exp(-1.0) + 1.0)) / 2;
    assert_true(fabs(ddp_var_item(loss) - expect) < 1e-3);
    assert_int_equal(ddp_tape_backward(tape, loss, NULL), 0);
    const float *g = ddp_var_grad(in);
    assert_true(fabs(g[0] - 0.5) < 1e-6 && fabs(g[1] + 0.5) < 1e-6 && isfinite(g[2]));
    ddp_tape_destroy(tape);
}

/* ==== tape mechanics ====================================================== */

static int mlp_step(ddp_tape_t *tape, ddp_model_t *m, float *xs, int64_t *labels,
                    ddp_var_t **loss, const float **h_data)
{
    ddp_tensor t;
    ddp_var_t *x, *y;
    if (ddp_tensor_wrap(&t, xs, 2, (int64_t[]){8, 6}) < 0 || ddp_tape_input(tape, &t, 0, &x) < 0 ||
        ddp_model_forward(m, tape, x, &y) < 0 || ddp_op_cross_entropy(tape, y, labels, loss) < 0)
        return -1;
    *h_data = ddp_var_tensor(y)->data;
    return ddp_tape_backward(tape, *loss, m);
}

static ddp_model_t *small_mlp(int in, int hidden, int out)
{
    ddp_module_t *l[3], *seq;
    ddp_model_t *m;
    assert_int_equal(ddp_linear_create(in, hidden, 1, 1, &l[0]), 0);
    assert_int_equal(ddp_relu_create(&l[1]), 0);
    assert_int_equal(ddp_linear_create(hidden, out, 1, 2, &l[2]), 0);
    assert_int_equal(ddp_sequential_create(l, 3, &seq), 0);
    assert_int_equal(ddp_model_from_module(seq, &m), 0);
    return m;
}

/* In steady state a step allocates nothing: same arena size, same buffers. */
static void test_arena_reused(void **state)
{
    (void)state;
    ddp_model_t *m = small_mlp(6, 5, 3);
    ddp_tape_t *tape;
    assert_int_equal(ddp_tape_create(&tape), 0);
    float xs[48];
    int64_t labels[8] = {0, 1, 2, 0, 1, 2, 0, 1};
    for (int i = 0; i < 48; i++)
        xs[i] = (float)sin(i);
    ddp_var_t *loss;
    const float *out[4];
    size_t bytes[4];
    for (int it = 0; it < 4; it++) {
        ddp_tape_reset(tape);
        assert_int_equal(mlp_step(tape, m, xs, labels, &loss, &out[it]), 0);
        bytes[it] = ddp_tape_arena_bytes(tape);
    }
    assert_true(bytes[1] == bytes[2] && bytes[2] == bytes[3] && bytes[1] > 0);
    assert_ptr_equal(out[1], out[2]);
    assert_ptr_equal(out[2], out[3]);
    ddp_tape_destroy(tape);
    ddp_model_destroy(m);
}

/* With grad disabled (evaluation) the same forward gives the same loss,
 * saves nothing for backward and cannot be backpropagated. */
static void test_no_grad(void **state)
{
    (void)state;
    ddp_model_t *m = small_mlp(6, 5, 3);
    float xs[48];
    int64_t labels[8] = {0, 1, 2, 0, 1, 2, 0, 1};
    for (int i = 0; i < 48; i++)
        xs[i] = (float)sin(i * 1.3);
    float loss_grad = 0;
    size_t bytes[2];
    for (int enabled = 1; enabled >= 0; enabled--) {
        ddp_tape_t *tape; /* fresh: its arena bytes are what this pass took */
        ddp_tensor t;
        ddp_var_t *x, *y, *loss;
        assert_int_equal(ddp_tape_create(&tape), 0);
        ddp_tape_set_grad_enabled(tape, enabled);
        assert_int_equal(ddp_tensor_wrap(&t, xs, 2, (int64_t[]){8, 6}), 0);
        assert_int_equal(ddp_tape_input(tape, &t, 0, &x), 0);
        assert_int_equal(ddp_model_forward(m, tape, x, &y), 0);
        assert_int_equal(ddp_op_cross_entropy(tape, y, labels, &loss), 0);
        bytes[enabled] = ddp_tape_arena_bytes(tape);
        if (enabled) {
            loss_grad = ddp_var_item(loss);
        } else {
            assert_true(ddp_var_item(loss) == loss_grad);
            assert_int_equal(ddp_tape_backward(tape, loss, m), DDP_ERR_INVALID_ARG);
            assert_non_null(strstr(ddp_last_error(), "does not depend on any parameter"));
        }
        ddp_tape_destroy(tape);
    }
    /* the (8, 3) softmax probabilities are not kept: 96 bytes -> one row */
    assert_true(bytes[0] < bytes[1]);
    ddp_model_destroy(m);
}

/* Two backward passes without zero_grad sum their gradients (no_sync); a
 * forward needs a reset after backward. */
static void test_grads_accumulate(void **state)
{
    (void)state;
    ddp_model_t *m = small_mlp(6, 5, 3);
    ddp_tape_t *tape;
    assert_int_equal(ddp_tape_create(&tape), 0);
    float xs[48];
    int64_t labels[8] = {2, 1, 0, 0, 1, 2, 0, 1};
    for (int i = 0; i < 48; i++)
        xs[i] = (float)cos(i * 0.7);
    ddp_var_t *loss;
    const float *h;
    size_t n;
    float *g = ddp_model_grad_block(m, &n);
    ddp_model_zero_grad(m);
    assert_int_equal(mlp_step(tape, m, xs, labels, &loss, &h), 0);
    float *once = malloc(n * sizeof(float));
    memcpy(once, g, n * sizeof(float));
    /* the same graph again (retain_graph), then a fresh tape */
    assert_int_equal(ddp_tape_backward(tape, loss, m), 0);
    /* A forgotten reset: the next forward is refused (the tape would keep
     * every step's vars and grow) and adds nothing. */
    size_t bytes = ddp_tape_arena_bytes(tape);
    assert_int_equal(mlp_step(tape, m, xs, labels, &loss, &h), -1);
    assert_non_null(strstr(ddp_last_error(), "a forward op on a tape whose backward already ran; "
                                             "call ddp_tape_reset(tape)"));
    ddp_var_t *y;
    assert_int_equal(ddp_op_relu(tape, loss, &y), DDP_ERR_STATE);
    assert_non_null(strstr(ddp_last_error(), "call ddp_tape_reset(tape)"));
    assert_true(ddp_tape_arena_bytes(tape) == bytes);
    ddp_tape_reset(tape);
    assert_int_equal(mlp_step(tape, m, xs, labels, &loss, &h), 0);
    double maxerr = 0, maxg = 0;
    for (size_t i = 0; i < n; i++) {
        maxerr = fmax(maxerr, fabs(g[i] - 3 * once[i]));
        maxg = fmax(maxg, fabs(once[i]));
    }
    assert_true(maxg > 1e-3);
    assert_true(maxerr <= 1e-6 * maxg * 3);
    ddp_model_zero_grad(m);
    for (size_t i = 0; i < n; i++)
        assert_true(g[i] == 0.0f);
    free(once);
    ddp_tape_destroy(tape);
    ddp_model_destroy(m);
}

/* A view of a parameter: gradients land in p->grad through the view and
 * accumulate over two backward passes; d/dW sum(x W) = column sums of x. */
static void test_reshape_param(void **state)
{
    (void)state;
    ddp_model_t *m;
    ddp_param *p;
    assert_int_equal(ddp_model_create(&m), 0);
    assert_int_equal(ddp_model_add_param(m, "w", 1, (int64_t[]){12}, &p), 0);
    assert_int_equal(ddp_model_seal(m), 0);
    float xs[8] = {1, 2, 3, 4, -1, 0.5f, 2, 0};
    ddp_tape_t *t;
    ddp_tensor xt;
    ddp_var_t *x, *w, *wv, *y, *loss;
    assert_int_equal(ddp_tape_create(&t), 0);
    assert_int_equal(ddp_tensor_wrap(&xt, xs, 2, (int64_t[]){2, 4}), 0);
    assert_int_equal(ddp_tape_input(t, &xt, 0, &x), 0);
    assert_int_equal(ddp_tape_param(t, p, &w), 0);
    assert_int_equal(ddp_op_reshape(t, w, 2, (int64_t[]){4, 3}, &wv), 0);
    assert_ptr_equal(ddp_var_tensor(wv)->data, p->data);
    assert_int_equal(ddp_op_matmul(t, x, wv, &y), 0);
    assert_int_equal(ddp_op_sum(t, y, &loss), 0);
    ddp_model_zero_grad(m);
    assert_int_equal(ddp_tape_backward(t, loss, m), 0);
    assert_int_equal(ddp_tape_backward(t, loss, m), 0);
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 3; j++)
            assert_true(p->grad[k * 3 + j] == 2 * (xs[k] + xs[4 + k]));
    assert_ptr_equal(ddp_var_grad(wv), p->grad);
    ddp_tape_destroy(t);
    ddp_model_destroy(m);
}

/* ==== errors ============================================================== */

static void test_op_errors(void **state)
{
    (void)state;
    ddp_tape_t *tape, *other;
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_int_equal(ddp_tape_create(&other), 0);
    float buf[64] = {0};
    ddp_tensor tx, tw, tb;
    ddp_var_t *x, *w, *b, *y, *foreign;
    assert_int_equal(ddp_tensor_wrap(&tx, buf, 2, (int64_t[]){4, 3}), 0);
    assert_int_equal(ddp_tensor_wrap(&tw, buf, 2, (int64_t[]){5, 2}), 0);
    assert_int_equal(ddp_tensor_wrap(&tb, buf, 1, (int64_t[]){4}), 0);
    assert_int_equal(ddp_tape_input(tape, &tx, 1, &x), 0);
    assert_int_equal(ddp_tape_input(tape, &tw, 1, &w), 0);
    assert_int_equal(ddp_tape_input(tape, &tb, 1, &b), 0);
    assert_int_equal(ddp_tape_input(other, &tx, 1, &foreign), 0);

    assert_int_equal(ddp_op_linear(tape, x, w, NULL, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(),
                           "linear: input of shape (4, 3) does not match weight of shape (5, 2)"));
    assert_int_equal(ddp_op_matmul(tape, x, w, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(
        strstr(ddp_last_error(), "matmul: shapes (4, 3) and (5, 2) cannot be multiplied"));
    assert_int_equal(ddp_op_add(tape, x, w, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "add: shapes (4, 3) and (5, 2) do not broadcast"));
    assert_int_equal(ddp_op_mse_loss(tape, x, w, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(),
                           "mse_loss: input of shape (4, 3) and target of shape (5, 2) differ"));
    assert_int_equal(ddp_op_mul(tape, x, b, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "mul: shapes (4, 3) and (4) do not broadcast"));
    assert_int_equal(ddp_op_relu(tape, foreign, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "relu: input is not a var of this tape"));
    assert_int_equal(ddp_op_dropout(tape, x, 1.5f, 1, 0, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "dropout: probability 1.5 is not in [0, 1]"));
    assert_int_equal(ddp_op_reshape(tape, x, 2, (int64_t[]){5, -1}, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "cannot view a tensor of shape (4, 3)"));

    /* BLAS takes int dimensions: a (2^31, 1) input is refused before any
     * data is touched */
    ddp_tensor thuge, tone;
    ddp_var_t *huge, *one;
    assert_int_equal(ddp_tensor_wrap(&thuge, buf, 2, (int64_t[]){INT64_C(1) << 31, 1}), 0);
    assert_int_equal(ddp_tensor_wrap(&tone, buf, 2, (int64_t[]){1, 1}), 0);
    assert_int_equal(ddp_tape_input(tape, &thuge, 0, &huge), 0);
    assert_int_equal(ddp_tape_input(tape, &tone, 1, &one), 0);
    assert_int_equal(ddp_op_linear(tape, huge, one, NULL, &y), DDP_ERR_UNSUPPORTED);
    assert_non_null(strstr(ddp_last_error(), "linear: input (2147483648, 1) and weight (1, 1) "
                                             "exceed BLAS's int dimensions"));

    int64_t labels[4] = {0, 2, 12, 1};
    assert_int_equal(ddp_op_cross_entropy(tape, x, labels, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(),
                           "cross_entropy: label 12 at index 2 is out of range for 3 classes"));
    labels[2] = -1;
    assert_int_equal(ddp_op_nll_loss(tape, x, labels, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(),
                           "nll_loss: label -1 at index 2 is out of range for 3 classes"));
    assert_int_equal(ddp_op_cross_entropy(tape, b, labels, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "input must be (batch, classes), got shape (4)"));

    /* backward on a non-scalar, on a constant, on a var of a reset tape */
    assert_int_equal(ddp_tape_backward(tape, x, NULL), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "the loss must have one element, not shape (4, 3)"));
    ddp_tensor ts;
    ddp_var_t *c, *s;
    assert_int_equal(ddp_tensor_wrap(&ts, buf, 1, (int64_t[]){1}), 0);
    assert_int_equal(ddp_tape_input(tape, &ts, 0, &c), 0);
    assert_int_equal(ddp_op_sum(tape, c, &s), 0);
    assert_int_equal(ddp_tape_backward(tape, s, NULL), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "does not depend on any parameter or input"));
    assert_int_equal(ddp_op_sum(tape, x, &s), 0);
    ddp_tape_reset(tape);
    assert_int_equal(ddp_tape_backward(tape, s, NULL), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "the loss var is not on this tape"));
    ddp_tape_destroy(tape);
    ddp_tape_destroy(other);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradcheck_ops),
        cmocka_unit_test(test_cross_entropy_stable),
        cmocka_unit_test(test_arena_reused),
        cmocka_unit_test(test_grads_accumulate),
        cmocka_unit_test(test_no_grad),
        cmocka_unit_test(test_reshape_param),
        cmocka_unit_test(test_op_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
