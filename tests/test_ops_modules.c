/* The activation modules (ddp_leaky_relu_create, ...): each module's forward
 * gives its op's values bit for bit, they chain in a Sequential that
 * backpropagates, and bad arguments fail at creation.  They need the
 * user-module interface (ddp/nn_module.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "fixtures/ops_case.h"

static const float X[12] = {-2.5f, -1, -0.25f, 0, 0.5f, 1, 2, 3, -0.75f, 0.125f, 1.5f, -3};

typedef int (*op_fn)(ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y);
static int op_leaky(ddp_tape_t *t, ddp_var_t *x, ddp_var_t **y) { return ddp_op_leaky_relu(t, x, 0.2f, y); }
static int op_gelu(ddp_tape_t *t, ddp_var_t *x, ddp_var_t **y) { return ddp_op_gelu(t, x, DDP_GELU_TANH, y); }
static int op_softmax(ddp_tape_t *t, ddp_var_t *x, ddp_var_t **y) { return ddp_op_softmax(t, x, 0, y); }
static int op_log_softmax(ddp_tape_t *t, ddp_var_t *x, ddp_var_t **y)
{
    return ddp_op_log_softmax_dim(t, x, -1, y);
}

/* Module m's forward equals op's on X (3, 4), bit for bit. */
static void same_as_op(ddp_module_t *m, op_fn op)
{
    float x[12];
    memcpy(x, X, sizeof x);
    ddp_tape_t *tape;
    ddp_var_t *vx, *a, *b;
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_non_null(vx = ops_leaf(tape, x, 2, (int64_t[]){3, 4}, 0));
    assert_int_equal(ddp_module_forward(m, tape, vx, &a), 0);
    assert_int_equal(op(tape, vx, &b), 0);
    assert_memory_equal(ddp_var_tensor(a)->data, ddp_var_tensor(b)->data, sizeof x);
    ddp_tape_destroy(tape);
    ddp_module_destroy(m);
}

static void test_modules_run_their_ops(void **state)
{
    (void)state;
    ddp_module_t *m;
    assert_int_equal(ddp_leaky_relu_create(0.2f, &m), 0);
    same_as_op(m, op_leaky);
    assert_int_equal(ddp_gelu_create(DDP_GELU_TANH, &m), 0);
    same_as_op(m, op_gelu);
    assert_int_equal(ddp_silu_create(&m), 0);
    same_as_op(m, ddp_op_silu);
    assert_int_equal(ddp_tanh_create(&m), 0);
    same_as_op(m, ddp_op_tanh);
    assert_int_equal(ddp_sigmoid_create(&m), 0);
    same_as_op(m, ddp_op_sigmoid);
    assert_int_equal(ddp_softmax_create(0, &m), 0);
    same_as_op(m, op_softmax);
    assert_int_equal(ddp_log_softmax_create(-1, &m), 0);
    same_as_op(m, op_log_softmax);
}

/* Linear(4, 5) -> GELU -> SiLU -> LeakyReLU -> Linear(5, 3) -> LogSoftmax in
 * a model: forward and backward run, and every parameter gets a gradient. */
static void test_in_sequential(void **state)
{
    (void)state;
    ddp_module_t *mods[6];
    assert_int_equal(ddp_linear_create(4, 5, 1, 1, &mods[0]), 0);
    assert_int_equal(ddp_gelu_create(DDP_GELU_EXACT, &mods[1]), 0);
    assert_int_equal(ddp_silu_create(&mods[2]), 0);
    assert_int_equal(ddp_leaky_relu_create(0.01f, &mods[3]), 0);
    assert_int_equal(ddp_linear_create(5, 3, 1, 2, &mods[4]), 0);
    assert_int_equal(ddp_log_softmax_create(1, &mods[5]), 0);
    ddp_module_t *seq;
    ddp_model_t *model;
    assert_int_equal(ddp_sequential_create(mods, 6, &seq), 0);
    assert_int_equal(ddp_model_from_module(seq, &model), 0);
    float x[12];
    memcpy(x, X, sizeof x);
    ddp_tape_t *tape;
    ddp_var_t *vx, *y, *loss;
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_non_null(vx = ops_leaf(tape, x, 2, (int64_t[]){3, 4}, 0));
    assert_int_equal(ddp_model_forward(model, tape, vx, &y), 0);
    assert_int_equal(ddp_op_nll_loss(tape, y, (int64_t[]){0, 2, 1}, &loss), 0);
    ddp_model_zero_grad(model);
    assert_int_equal(ddp_tape_backward(tape, loss, model), 0);
    for (size_t i = 0; i < ddp_model_num_params(model); i++) {
        ddp_param *p = ddp_model_param(model, i);
        double s = 0;
        for (size_t j = 0; j < p->numel; j++)
            s += p->grad[j] * p->grad[j];
        assert_true(s > 0);
    }
    ddp_tape_destroy(tape);
    ddp_model_destroy(model);
}

static void test_errors(void **state)
{
    (void)state;
    ddp_module_t *m = NULL;
    assert_int_equal(ddp_leaky_relu_create(NAN, &m), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "LeakyReLU: slope nan is not finite"));
    assert_int_equal(ddp_gelu_create(3, &m), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "GELU: approximation 3 is neither"));
    assert_int_equal(ddp_softmax_create(0, NULL), DDP_ERR_INVALID_ARG);
    /* a dim out of range fails at forward, naming the op and the shape */
    float x[12] = {0};
    ddp_tape_t *tape;
    ddp_var_t *vx, *y;
    assert_int_equal(ddp_softmax_create(2, &m), 0);
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_non_null(vx = ops_leaf(tape, x, 2, (int64_t[]){3, 4}, 0));
    assert_int_equal(ddp_module_forward(m, tape, vx, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "softmax: dim 2 is out of range for shape (3, 4)"));
    ddp_tape_destroy(tape);
    ddp_module_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_modules_run_their_ops),
        cmocka_unit_test(test_in_sequential),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
