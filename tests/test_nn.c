/* nn modules and models: PyTorch default init statistics, names and flat
 * blocks, Sequential against the ops it stands for, Dropout train/eval,
 * Flatten, reset_parameters, a short training run, and model errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ddp.h"

/* Linear(784, 256) and Linear(256, 10): every value inside PyTorch's bound
 * gain * sqrt(3 / fan_in) with gain = sqrt(2 / (1 + a^2)), a = sqrt(5), mean
 * and variance those of U(-bound, bound) within 5 standard errors. */
static void check_uniform(const float *x, size_t n, double bound)
{
    double sum = 0, sumsq = 0, mx = 0;
    for (size_t i = 0; i < n; i++) {
        assert_true(x[i] >= -bound && x[i] < bound);
        sum += x[i];
        sumsq += (double)x[i] * x[i];
        mx = fmax(mx, fabs(x[i]));
    }
    double mean = sum / n, var = sumsq / n - mean * mean, sd = bound / sqrt(3.0);
    assert_true(fabs(mean) < 5 * sd / sqrt((double)n));
    /* var of U(-b, b) is b^2/3; the variance of x^2 is 4 b^4 / 45 */
    assert_true(fabs(var - bound * bound / 3) < 5 * sqrt(4.0 / 45 / n) * bound * bound + 1e-12);
    assert_true(mx > bound * (1 - 20.0 / n)); /* the range is used */
}

static void test_linear_init(void **state)
{
    (void)state;
    int shapes[2][2] = {{784, 256}, {256, 10}};
    for (int s = 0; s < 2; s++) {
        ddp_module_t *l;
        int in = shapes[s][0], out = shapes[s][1];
        assert_int_equal(ddp_linear_create(in, out, 1, 42 + s, &l), 0);
        double a = sqrt(5.0), gain = sqrt(2.0 / (1 + a * a));
        double bound = gain * sqrt(3.0 / in);
        assert_true(fabs(bound - 1 / sqrt((double)in)) < 1e-12);
        ddp_param *w = ddp_module_param(l, "weight"), *b = ddp_module_param(l, "bias");
        assert_int_equal(w->numel, (size_t)in * out);
        assert_int_equal(w->ndim, 2);
        assert_true(w->shape[0] == out && w->shape[1] == in);
        assert_int_equal(b->numel, (size_t)out);
        check_uniform(w->data, w->numel, bound);
        for (size_t i = 0; i < b->numel; i++)
            assert_true(b->data[i] >= -bound && b->data[i] < bound);
        if (out >= 256)
            check_uniform(b->data, b->numel, bound);
        for (size_t i = 0; i < w->numel; i++)
            assert_true(w->grad[i] == 0.0f);
        assert_null(ddp_module_param(l, "gamma"));
        ddp_module_destroy(l);
    }
    /* same seed, same values; another seed, others */
    ddp_module_t *a, *b, *c;
    assert_int_equal(ddp_linear_create(8, 4, 0, 5, &a), 0);
    assert_int_equal(ddp_linear_create(8, 4, 0, 5, &b), 0);
    assert_int_equal(ddp_linear_create(8, 4, 0, 6, &c), 0);
    assert_null(ddp_module_param(a, "bias"));
    assert_memory_equal(ddp_module_param(a, "weight")->data, ddp_module_param(b, "weight")->data,
                        32 * sizeof(float));
    assert_memory_not_equal(ddp_module_param(a, "weight")->data,
                            ddp_module_param(c, "weight")->data, 32 * sizeof(float));
    ddp_module_destroy(a);
    ddp_module_destroy(b);
    ddp_module_destroy(c);
}

static ddp_model_t *mlp(uint64_t seed, int with_dropout)
{
    ddp_module_t *l[5], *seq;
    int n = 0;
    ddp_model_t *m;
    assert_int_equal(ddp_flatten_create(&l[n++]), 0);
    assert_int_equal(ddp_linear_create(12, 16, 1, seed, &l[n++]), 0);
    assert_int_equal(ddp_relu_create(&l[n++]), 0);
    if (with_dropout)
        assert_int_equal(ddp_dropout_create(0.5f, 9, &l[n++]), 0);
    assert_int_equal(ddp_linear_create(16, 3, 1, seed + 1, &l[n++]), 0);
    assert_int_equal(ddp_sequential_create(l, n, &seq), 0);
    assert_int_equal(ddp_model_from_module(seq, &m), 0);
    return m;
}

/* Sequential(Flatten, Linear, ReLU, Linear) equals the same ops by hand. */
static void test_sequential_matches_ops(void **state)
{
    (void)state;
    ddp_model_t *m = mlp(1, 0);
    assert_string_equal(ddp_model_param(m, 0)->name, "1.weight");
    assert_string_equal(ddp_model_param(m, 3)->name, "3.bias");
    float xs[4 * 3 * 4];
    for (int i = 0; i < 48; i++)
        xs[i] = (float)sin(i * 0.3);
    ddp_tape_t *t;
    ddp_tensor xt;
    ddp_var_t *x, *y, *xf, *w1, *b1, *w2, *b2, *h, *r, *z;
    assert_int_equal(ddp_tape_create(&t), 0);
    assert_int_equal(ddp_tensor_wrap(&xt, xs, 3, (int64_t[]){4, 3, 4}), 0);
    assert_int_equal(ddp_tape_input(t, &xt, 0, &x), 0);
    assert_int_equal(ddp_model_forward(m, t, x, &y), 0);
    assert_int_equal(ddp_var_tensor(y)->ndim, 2);
    assert_true(ddp_var_tensor(y)->shape[0] == 4 && ddp_var_tensor(y)->shape[1] == 3);
    assert_int_equal(ddp_op_reshape(t, x, 2, (int64_t[]){4, 12}, &xf), 0);
    assert_ptr_equal(ddp_var_tensor(xf)->data, xs); /* a view */
    assert_int_equal(ddp_tape_param(t, ddp_model_param(m, 0), &w1), 0);
    assert_int_equal(ddp_tape_param(t, ddp_model_param(m, 1), &b1), 0);
    assert_int_equal(ddp_tape_param(t, ddp_model_param(m, 2), &w2), 0);
    assert_int_equal(ddp_tape_param(t, ddp_model_param(m, 3), &b2), 0);
    assert_int_equal(ddp_op_matmul(t, xf, xf, &z), DDP_ERR_INVALID_ARG); /* (4,12)x(4,12) */
    assert_int_equal(ddp_op_linear(t, xf, w1, b1, &h), 0);
    assert_int_equal(ddp_op_relu(t, h, &r), 0);
    assert_int_equal(ddp_op_linear(t, r, w2, b2, &z), 0);
    assert_memory_equal(ddp_var_tensor(z)->data, ddp_var_tensor(y)->data, 12 * sizeof(float));
    ddp_tape_destroy(t);
    ddp_model_destroy(m);
}

/* Dropout: in training about p of the values are zeroed and the rest scaled
 * by 1/(1-p), masks differ between forwards; in eval it is the identity. */
static void test_dropout_modes(void **state)
{
    (void)state;
    ddp_module_t *d;
    assert_int_equal(ddp_dropout_create(0.25f, 11, &d), 0);
    enum { N = 20000 };
    static float xs[N];
    for (int i = 0; i < N; i++)
        xs[i] = 1.0f + (float)(i % 7);
    ddp_tape_t *t;
    ddp_tensor xt;
    ddp_var_t *x, *y1, *y2;
    assert_int_equal(ddp_tape_create(&t), 0);
    assert_int_equal(ddp_tensor_wrap(&xt, xs, 2, (int64_t[]){N / 10, 10}), 0);
    assert_int_equal(ddp_tape_input(t, &xt, 0, &x), 0);
    assert_int_equal(ddp_module_forward(d, t, x, &y1), 0);
    assert_int_equal(ddp_module_forward(d, t, x, &y2), 0);
    const float *a = ddp_var_tensor(y1)->data, *b = ddp_var_tensor(y2)->data;
    int zeros = 0, differ = 0;
    for (int i = 0; i < N; i++) {
        if (a[i] == 0.0f)
            zeros++;
        else
            assert_true(fabsf(a[i] - xs[i] / 0.75f) < 1e-5f);
        differ += (a[i] == 0.0f) != (b[i] == 0.0f);
    }
    /* binomial(N, 0.25): sd = sqrt(N * 0.25 * 0.75) ~ 61 */
    assert_true(abs(zeros - N / 4) < 5 * 62);
    assert_true(differ > N / 10);
    /* the same seed gives the same masks, forward after forward */
    ddp_module_t *d2;
    ddp_var_t *z1, *z2;
    assert_int_equal(ddp_dropout_create(0.25f, 11, &d2), 0);
    assert_int_equal(ddp_module_forward(d2, t, x, &z1), 0);
    assert_int_equal(ddp_module_forward(d2, t, x, &z2), 0);
    assert_memory_equal(ddp_var_tensor(z1)->data, a, N * sizeof(float));
    assert_memory_equal(ddp_var_tensor(z2)->data, b, N * sizeof(float));
    ddp_module_destroy(d2);
    ddp_module_train(d, 0);
    assert_int_equal(ddp_module_forward(d, t, x, &y1), 0);
    assert_ptr_equal(y1, x);
    ddp_tape_destroy(t);
    ddp_module_destroy(d);

    /* through a model's train/eval switch */
    ddp_model_t *m = mlp(3, 1);
    assert_int_equal(ddp_model_is_training(m), 1);
    ddp_model_train(m, 0);
    assert_int_equal(ddp_model_is_training(m), 0);
    ddp_model_t *ref = mlp(3, 0);
    assert_int_equal(ddp_tape_create(&t), 0);
    assert_int_equal(ddp_tensor_wrap(&xt, xs, 2, (int64_t[]){4, 12}), 0);
    assert_int_equal(ddp_tape_input(t, &xt, 0, &x), 0);
    assert_int_equal(ddp_model_forward(m, t, x, &y1), 0);
    assert_int_equal(ddp_model_forward(ref, t, x, &y2), 0);
    assert_memory_equal(ddp_var_tensor(y1)->data, ddp_var_tensor(y2)->data, 12 * sizeof(float));
    ddp_model_train(m, 1);
    assert_int_equal(ddp_model_forward(m, t, x, &y1), 0);
    assert_memory_not_equal(ddp_var_tensor(y1)->data, ddp_var_tensor(y2)->data,
                            12 * sizeof(float));
    ddp_tape_destroy(t);
    ddp_model_destroy(m);
    ddp_model_destroy(ref);
}

/* reset_parameters draws every Linear again from one generator. */
static void test_reset_parameters(void **state)
{
    (void)state;
    ddp_model_t *a = mlp(1, 0), *b = mlp(100, 0);
    size_t n;
    float *pa = ddp_model_param_block(a, &n), *pb = ddp_model_param_block(b, NULL);
    assert_memory_not_equal(pa, pb, n * sizeof(float));
    uint64_t version = ddp_model_param_version(a);
    assert_int_equal(ddp_model_reset_parameters(a, 77), 0);
    assert_true(ddp_model_param_version(a) != version);
    assert_int_equal(ddp_model_reset_parameters(b, 77), 0);
    assert_memory_equal(pa, pb, n * sizeof(float));
    ddp_param *w = ddp_model_find_param(a, "3.weight");
    for (size_t i = 0; i < w->numel; i++)
        assert_true(fabsf(w->data[i]) <= 0.25f); /* 1/sqrt(16) */
    ddp_model_destroy(a);
    ddp_model_destroy(b);
}

/* A few hundred SGD steps learn a separable 3-class problem. */
static void test_training_learns(void **state)
{
    (void)state;
    ddp_model_t *m = mlp(5, 0);
    ddp_sgd_options so = ddp_sgd_defaults(0.1);
    so.momentum = 0.9;
    ddp_optim_t *opt;
    assert_int_equal(ddp_sgd_create(m, &so, &opt), 0);
    enum { BATCH = 30 };
    float xs[BATCH * 12];
    int64_t labels[BATCH];
    for (int i = 0; i < BATCH; i++) {
        labels[i] = i % 3;
        for (int j = 0; j < 12; j++)
            xs[i * 12 + j] = (float)(0.3 * sin(i * 12 + j) + (j % 3 == labels[i] ? 1.0 : 0.0));
    }
    ddp_tape_t *t;
    assert_int_equal(ddp_tape_create(&t), 0);
    float first = 0, last = 0;
    for (int it = 0; it < 200; it++) {
        ddp_tensor xt;
        ddp_var_t *x, *y, *loss;
        ddp_tape_reset(t);
        assert_int_equal(ddp_tensor_wrap(&xt, xs, 2, (int64_t[]){BATCH, 12}), 0);
        assert_int_equal(ddp_tape_input(t, &xt, 0, &x), 0);
        assert_int_equal(ddp_model_forward(m, t, x, &y), 0);
        assert_int_equal(ddp_op_cross_entropy(t, y, labels, &loss), 0);
        ddp_optim_zero_grad(opt);
        assert_int_equal(ddp_tape_backward(t, loss, m), 0);
        assert_int_equal(ddp_optim_step(opt), 0);
        if (it == 0)
            first = ddp_var_item(loss);
        last = ddp_var_item(loss);
    }
    assert_true(first > 0.9f);
    assert_true(last < 0.05f);
    ddp_tape_destroy(t);
    ddp_optim_destroy(opt);
    ddp_model_destroy(m);
}

/* Against PyTorch (tests/data/mlp_reference.py printed the numbers):
 * Sequential(Linear(3, 4), ReLU, Linear(4, 2)) with fixed parameters,
 * CrossEntropyLoss over five samples: the loss, every gradient in state_dict
 * order (the flat grad block), and the parameters after two steps of
 * SGD(lr=0.1, momentum=0.9, weight_decay=0.01). */
static void test_matches_torch(void **state)
{
    (void)state;
    static const float params0[26] = {0.1f, -0.2f, 0.3f, 0.4f, 0.5f, -0.6f, -0.7f, 0.8f, 0.9f,
                                      0.25f, -0.35f, 0.45f, 0.01f, -0.02f, 0.03f, 0.5f, 0.3f,
                                      -0.1f, 0.2f, 0.6f, -0.5f, 0.4f, 0.7f, -0.2f, 0.05f, -0.05f};
    static const float torch_loss = 1.113259315e+00f;
    static const float torch_grads[26] = {
        3.173106313e-01f, -1.929802597e-01f, 1.478393376e-01f, 8.294981718e-02f, 1.541474164e-01f,
        -5.944536254e-02f, 8.559118211e-02f, 1.532440782e-01f, -1.240485832e-01f, 3.173106611e-01f,
        -1.929802597e-01f, 1.478393525e-01f, 1.971722841e-01f, 1.103716865e-01f, -1.970604062e-04f,
        1.971722841e-01f, 1.458133012e-01f, -2.874268293e-01f, 9.793639183e-02f, 3.899807334e-01f,
        -1.458133161e-01f, 2.874268293e-01f, -9.793639928e-02f, -3.899807632e-01f, 1.722180843e-01f,
        -1.722181141e-01f};
    static const float torch_params[26] = {
        1.079721935e-02f, -1.449741870e-01f, 2.578315437e-01f, 3.759036064e-01f, 4.560239315e-01f,
        -5.820178986e-01f, -7.159107327e-01f, 7.674270868e-01f, 9.259881377e-01f, 1.679180562e-01f,
        -2.990155220e-01f, 4.077570736e-01f, -4.464744404e-02f, -5.068856105e-02f, 3.653392568e-02f,
        4.402392209e-01f, 2.600553632e-01f, -1.828729734e-02f, 1.710320711e-01f, 4.900848866e-01f,
        -4.594755471e-01f, 3.174175918e-01f, 7.263588309e-01f, -9.124445170e-02f, 1.946605975e-03f,
        -1.946603064e-03f};
    float xs[15] = {1.0f, 2.0f, -1.0f, 0.5f, -0.3f, 0.8f, -1.2f, 0.7f, 0.1f,
                    0.3f, 0.3f, 0.3f, 2.0f, -1.0f, 0.5f};
    int64_t labels[5] = {0, 1, 1, 0, 1};
    ddp_module_t *l[3], *seq;
    ddp_model_t *m;
    assert_int_equal(ddp_linear_create(3, 4, 1, 0, &l[0]), 0);
    assert_int_equal(ddp_relu_create(&l[1]), 0);
    assert_int_equal(ddp_linear_create(4, 2, 1, 0, &l[2]), 0);
    assert_int_equal(ddp_sequential_create(l, 3, &seq), 0);
    assert_int_equal(ddp_model_from_module(seq, &m), 0);
    size_t n;
    float *pb = ddp_model_param_block(m, &n), *gb = ddp_model_grad_block(m, NULL);
    assert_int_equal(n, 26);
    memcpy(pb, params0, sizeof params0);
    ddp_sgd_options so = ddp_sgd_defaults(0.1);
    so.momentum = 0.9;
    so.weight_decay = 0.01;
    ddp_optim_t *opt;
    assert_int_equal(ddp_sgd_create(m, &so, &opt), 0);
    ddp_tape_t *t;
    assert_int_equal(ddp_tape_create(&t), 0);
    for (int step = 0; step < 2; step++) {
        ddp_tensor xt;
        ddp_var_t *x, *y, *loss;
        ddp_tape_reset(t);
        assert_int_equal(ddp_tensor_wrap(&xt, xs, 2, (int64_t[]){5, 3}), 0);
        assert_int_equal(ddp_tape_input(t, &xt, 0, &x), 0);
        assert_int_equal(ddp_model_forward(m, t, x, &y), 0);
        assert_int_equal(ddp_op_cross_entropy(t, y, labels, &loss), 0);
        ddp_optim_zero_grad(opt);
        assert_int_equal(ddp_tape_backward(t, loss, m), 0);
        if (step == 0) {
            assert_true(fabsf(ddp_var_item(loss) - torch_loss) < 1e-6f);
            for (int i = 0; i < 26; i++)
                if (fabsf(gb[i] - torch_grads[i]) > 1e-6f)
                    fail_msg("grad %d: %.9g, torch %.9g", i, (double)gb[i],
                             (double)torch_grads[i]);
        }
        assert_int_equal(ddp_optim_step(opt), 0);
    }
    for (int i = 0; i < 26; i++)
        if (fabsf(pb[i] - torch_params[i]) > 1e-6f)
            fail_msg("param %d after two steps: %.9g, torch %.9g", i, (double)pb[i],
                     (double)torch_params[i]);
    ddp_tape_destroy(t);
    ddp_optim_destroy(opt);
    ddp_model_destroy(m);
}

/* clip_grad_norm: gradients (3, 4) and (12) have 2-norm 13 and inf-norm 12
 * (torch.nn.utils.clip_grad_norm_'s total_norm); over max_norm they are
 * scaled by max_norm / (norm + 1e-6), under it left alone. */
static void test_clip_grad_norm(void **state)
{
    (void)state;
    ddp_model_t *m;
    ddp_param *a, *b;
    assert_int_equal(ddp_model_create(&m), 0);
    assert_int_equal(ddp_model_add_param(m, "a", 1, (int64_t[]){2}, &a), 0);
    assert_int_equal(ddp_model_add_param(m, "b", 1, (int64_t[]){1}, &b), 0);
    assert_int_equal(ddp_model_seal(m), 0);
    double norm;
    a->grad[0] = 3, a->grad[1] = -4, b->grad[0] = 12;
    assert_int_equal(ddp_model_clip_grad_norm(m, 100.0, 2.0, &norm), 0);
    assert_true(fabs(norm - 13.0) < 1e-9);
    assert_true(a->grad[0] == 3 && a->grad[1] == -4 && b->grad[0] == 12); /* untouched */
    assert_int_equal(ddp_model_clip_grad_norm(m, 6.5, 2.0, &norm), 0);
    double c = 6.5 / (13.0 + 1e-6);
    assert_true(fabs(a->grad[0] - 3 * c) < 1e-6 && fabs(a->grad[1] + 4 * c) < 1e-6);
    assert_true(fabs(b->grad[0] - 12 * c) < 1e-6);
    a->grad[0] = 3, a->grad[1] = -4, b->grad[0] = 12;
    assert_int_equal(ddp_model_clip_grad_norm(m, 6.0, INFINITY, &norm), 0);
    assert_true(norm == 12.0);
    assert_true(fabs(b->grad[0] - 12 * 6.0 / (12.0 + 1e-6)) < 1e-6);
    a->grad[0] = 3, a->grad[1] = -4, b->grad[0] = 12;
    assert_int_equal(ddp_model_clip_grad_norm(m, 100.0, 1.0, &norm), 0);
    assert_true(fabs(norm - 19.0) < 1e-9);
    assert_int_equal(ddp_model_clip_grad_norm(m, 1.0, 0.0, &norm), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "norm_type 0 must be > 0 (or INFINITY)"));
    ddp_model_destroy(m);
}

static void test_model_errors(void **state)
{
    (void)state;
    ddp_model_t *m;
    ddp_module_t *l, *r, *seq;
    ddp_param *p;
    assert_int_equal(ddp_model_create(&m), 0);
    assert_int_equal(ddp_model_add_param(m, "w", 1, (int64_t[]){3}, &p), 0);
    assert_int_equal(ddp_model_add_param(m, "w", 1, (int64_t[]){2}, &p), 0);
    assert_int_equal(ddp_model_seal(m), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "two parameters are named \"w\""));
    ddp_model_destroy(m);

    assert_int_equal(ddp_model_create(&m), 0);
    assert_int_equal(ddp_model_add_param(m, "w", 2, (int64_t[]){3, 0}, &p), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "tensor dimension 1 has size 0"));
    assert_int_equal(ddp_linear_create(4, 2, 1, 0, &l), 0);
    assert_int_equal(ddp_model_add_module(m, "fc", l), 0);
    assert_string_equal(ddp_model_param(m, 0)->name, "fc.weight");
    ddp_tape_t *t;
    assert_int_equal(ddp_tape_create(&t), 0);
    float xs[6] = {0};
    ddp_tensor xt;
    ddp_var_t *x, *y;
    assert_int_equal(ddp_tensor_wrap(&xt, xs, 2, (int64_t[]){2, 3}), 0);
    assert_int_equal(ddp_tape_input(t, &xt, 0, &x), 0);
    assert_int_equal(ddp_model_forward(m, t, x, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(),
                           "model module \"fc\": ") && strstr(ddp_last_error(),
                           "linear: input of shape (2, 3) does not match weight of shape (2, 4)"));
    /* a Sequential names the failing layer */
    ddp_module_t *sl[2], *sq;
    assert_int_equal(ddp_relu_create(&sl[0]), 0);
    assert_int_equal(ddp_linear_create(5, 2, 1, 0, &sl[1]), 0);
    assert_int_equal(ddp_sequential_create(sl, 2, &sq), 0);
    assert_int_equal(ddp_module_forward(sq, t, x, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "sequential layer 1: "));
    assert_non_null(strstr(ddp_last_error(), "linear: input of shape (2, 3) does not match"));
    ddp_module_destroy(sq);
    /* sealed: nothing more can be added */
    assert_int_equal(ddp_relu_create(&r), 0);
    assert_int_equal(ddp_model_add_module(m, "act", r), DDP_ERR_STATE);
    assert_non_null(strstr(ddp_last_error(), "cannot add \"act\": the model is sealed"));
    ddp_model_destroy(m);

    /* a module can have one owner */
    assert_int_equal(ddp_relu_create(&r), 0);
    assert_int_equal(ddp_sequential_create(&r, 1, &seq), 0);
    ddp_module_destroy(r); /* owned by seq: a no-op */
    ddp_module_t *again[2] = {NULL, NULL};
    assert_int_equal(ddp_relu_create(&again[0]), 0);
    again[1] = again[0];
    assert_int_equal(ddp_sequential_create(again, 2, &l), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "module 1 is module 0 again"));
    assert_int_equal(ddp_model_create(&m), 0);
    assert_int_equal(ddp_model_add_module(m, "a", seq), 0);
    assert_int_equal(ddp_model_forward(m, t, x, &y), 0); /* ReLU only */
    ddp_model_destroy(m);

    assert_int_equal(ddp_model_create(&m), 0);
    assert_int_equal(ddp_model_forward(m, t, x, &y), DDP_ERR_STATE);
    assert_non_null(strstr(ddp_last_error(), "the model has no modules"));
    ddp_model_destroy(m);
    assert_int_equal(ddp_linear_create(0, 2, 1, 0, &l), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "in_features 0 and out_features 2 must be > 0"));
    assert_int_equal(ddp_dropout_create(-0.1f, 0, &l), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "dropout: probability -0.1 is not in [0, 1]"));
    ddp_tape_destroy(t);
    ddp_model_destroy(NULL);
    ddp_module_destroy(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear_init),
        cmocka_unit_test(test_sequential_matches_ops),
        cmocka_unit_test(test_dropout_modes),
        cmocka_unit_test(test_reset_parameters),
        cmocka_unit_test(test_training_learns),
        cmocka_unit_test(test_matches_torch),
        cmocka_unit_test(test_clip_grad_norm),
        cmocka_unit_test(test_model_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
