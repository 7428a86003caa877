/* Activations (LeakyReLU, GELU exact and tanh, SiLU, softmax and
 * log-softmax over any dim) against PyTorch 1.13
 * (tests/fixtures/ops_activation.h), and their errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "fixtures/ops_activation.h"

static int b_leaky(ddp_tape_t *t, ddp_var_t **in, const ops_case *c, ddp_var_t **y)
{
    return ddp_op_leaky_relu(t, in[0], (float)c->farg[0], y);
}

static int b_gelu(ddp_tape_t *t, ddp_var_t **in, const ops_case *c, ddp_var_t **y)
{
    return ddp_op_gelu(t, in[0], c->iarg[0] ? DDP_GELU_TANH : DDP_GELU_EXACT, y);
}

static int b_silu(ddp_tape_t *t, ddp_var_t **in, const ops_case *c, ddp_var_t **y)
{
    (void)c;
    return ddp_op_silu(t, in[0], y);
}

static int b_softmax(ddp_tape_t *t, ddp_var_t **in, const ops_case *c, ddp_var_t **y)
{
    return ddp_op_softmax(t, in[0], (int)c->iarg[0], y);
}

static int b_log_softmax(ddp_tape_t *t, ddp_var_t **in, const ops_case *c, ddp_var_t **y)
{
    return ddp_op_log_softmax_dim(t, in[0], (int)c->iarg[0], y);
}

static const ops_builder builders[] = {
    {"leaky_relu", b_leaky},   {"gelu", b_gelu},
    {"silu", b_silu},          {"softmax", b_softmax},
    {"log_softmax", b_log_softmax}, {NULL, NULL},
};

static void test_against_torch(void **state)
{
    (void)state;
    assert_int_equal(OPS_RUN_ALL(ops_activation_cases, builders), 0);
}

/* nn.h's ddp_op_log_softmax is log_softmax along the last dim (the same
 * bits from both entry points), within 1e-6 of float64 references computed
 * here; a 0-d input is one value along dim 0 or -1, log_softmax 0, as torch
 * takes it. */
static void test_last_dim_matches_core(void **state)
{
    (void)state;
    float x[6] = {0.5f, -1, 2, 3, 0.25f, -0.75f};
    ddp_tape_t *tape;
    ddp_var_t *vx, *a, *b;
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_non_null(vx = ops_leaf(tape, x, 2, (int64_t[]){2, 3}, 0));
    assert_int_equal(ddp_op_log_softmax(tape, vx, &a), 0);
    assert_int_equal(ddp_op_log_softmax_dim(tape, vx, -1, &b), 0);
    assert_memory_equal(ddp_var_tensor(a)->data, ddp_var_tensor(b)->data, sizeof x);
    for (int r = 0; r < 2; r++) {
        double s = 0;
        for (int j = 0; j < 3; j++)
            s += exp((double)x[r * 3 + j]);
        for (int j = 0; j < 3; j++)
            assert_float_equal(ddp_var_tensor(a)->data[r * 3 + j], x[r * 3 + j] - log(s), 1e-6);
    }
    float one = 4.5f;
    assert_non_null(vx = ops_leaf(tape, &one, 0, NULL, 0));
    assert_int_equal(ddp_op_log_softmax(tape, vx, &a), 0);
    assert_int_equal(ddp_op_log_softmax_dim(tape, vx, 0, &b), 0);
    assert_true(ddp_var_tensor(a)->data[0] == 0.0f && ddp_var_tensor(b)->data[0] == 0.0f);
    OPS_EXPECT_ERROR(ddp_op_log_softmax_dim(tape, vx, 1, &b),
                     "log_softmax: dim 1 is out of range for shape ()");
    ddp_tape_destroy(tape);
}

static void test_errors(void **state)
{
    (void)state;
    float buf[6] = {0};
    ddp_tape_t *tape;
    ddp_var_t *a, *y;
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_non_null(a = ops_leaf(tape, buf, 2, (int64_t[]){2, 3}, 1));
    OPS_EXPECT_ERROR(ddp_op_softmax(tape, a, 2, &y), "softmax: dim 2 is out of range for shape (2, 3)");
    OPS_EXPECT_ERROR(ddp_op_log_softmax_dim(tape, a, -3, &y),
                     "log_softmax: dim -3 is out of range for shape (2, 3)");
    OPS_EXPECT_ERROR(ddp_op_gelu(tape, a, 7, &y), "gelu: approximation 7 is neither");
    OPS_EXPECT_ERROR(ddp_op_leaky_relu(tape, a, INFINITY, &y), "leaky_relu: slope inf is not finite");
    OPS_EXPECT_ERROR(ddp_op_silu(tape, NULL, &y), "silu: input is NULL");
    ddp_tape_destroy(tape);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_torch),
        cmocka_unit_test(test_last_dim_matches_core),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
