/* Broadcasting add/sub/mul/div and the unary element-wise ops against
 * PyTorch 1.13 (tests/fixtures/ops_elementwise.h: values, autograd
 * gradients and float64 central finite differences), and their errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "fixtures/ops_elementwise.h"

/* A case with one input uses it on both sides: mul(x, x), add(x, x). */
#define BINARY(name)                                                                  \
    static int b_##name(ddp_tape_t *t, ddp_var_t **in, const ops_case *c, ddp_var_t **y) \
    {                                                                                 \
        return ddp_op_##name(t, in[0], c->nin > 1 ? in[1] : in[0], y);               \
    }
#define UNARY(name)                                                                   \
    static int b_##name(ddp_tape_t *t, ddp_var_t **in, const ops_case *c, ddp_var_t **y) \
    {                                                                                 \
        (void)c;                                                                      \
        return ddp_op_##name(t, in[0], y);                                            \
    }
BINARY(add)
BINARY(sub)
BINARY(mul)
BINARY(div)
UNARY(neg)
UNARY(exp)
UNARY(log)
UNARY(sqrt)
UNARY(abs)

static int b_pow(ddp_tape_t *t, ddp_var_t **in, const ops_case *c, ddp_var_t **y)
{
    return ddp_op_pow(t, in[0], (float)c->farg[0], y);
}

static int b_clamp(ddp_tape_t *t, ddp_var_t **in, const ops_case *c, ddp_var_t **y)
{
    return ddp_op_clamp(t, in[0], (float)c->farg[0], (float)c->farg[1], y);
}

static const ops_builder builders[] = {
    {"add", b_add}, {"sub", b_sub}, {"mul", b_mul},   {"div", b_div},     {"neg", b_neg},
    {"exp", b_exp}, {"log", b_log}, {"sqrt", b_sqrt}, {"abs", b_abs},     {"pow", b_pow},
    {"clamp", b_clamp}, {NULL, NULL},
};

static void test_against_torch(void **state)
{
    (void)state;
    assert_int_equal(OPS_RUN_ALL(ops_elementwise_cases, builders), 0);
}

/* A var used by two ops and a broadcast input used twice accumulate: the
 * gradient of sum(x * b + b) for b broadcast over x's rows is (sum over
 * rows of x) + rows. */
static void test_broadcast_accumulates(void **state)
{
    (void)state;
    float x[6] = {1, 2, 3, 4, 5, 6}, b[3] = {0.5f, -1, 2}, dy[6] = {1, 1, 1, 1, 1, 1};
    ddp_tape_t *tape;
    ddp_var_t *vx, *vb, *m, *y;
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_non_null(vx = ops_leaf(tape, x, 2, (int64_t[]){2, 3}, 0));
    assert_non_null(vb = ops_leaf(tape, b, 1, (int64_t[]){3}, 1));
    assert_int_equal(ddp_op_mul(tape, vx, vb, &m), 0);
    assert_int_equal(ddp_op_add(tape, m, vb, &y), 0);
    assert_int_equal(ddp_tape_backward_grad(tape, y, dy, NULL), 0);
    const float *g = ddp_var_grad(vb);
    assert_non_null(g);
    assert_float_equal(g[0], 1 + 4 + 2, 1e-6);
    assert_float_equal(g[1], 2 + 5 + 2, 1e-6);
    assert_float_equal(g[2], 3 + 6 + 2, 1e-6);
    ddp_tape_destroy(tape);
}

static void test_errors(void **state)
{
    (void)state;
    float buf[12] = {0};
    ddp_tape_t *tape;
    ddp_var_t *a, *b, *y;
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_non_null(a = ops_leaf(tape, buf, 2, (int64_t[]){2, 3}, 1));
    assert_non_null(b = ops_leaf(tape, buf, 2, (int64_t[]){4, 3}, 1));
    OPS_EXPECT_ERROR(ddp_op_add(tape, a, b, &y), "add: shapes (2, 3) and (4, 3) do not broadcast");
    OPS_EXPECT_ERROR(ddp_op_sub(tape, b, a, &y), "sub: shapes (4, 3) and (2, 3) do not broadcast");
    OPS_EXPECT_ERROR(ddp_op_mul(tape, a, b, &y), "mul: shapes (2, 3) and (4, 3)");
    OPS_EXPECT_ERROR(ddp_op_div(tape, a, b, &y), "div: shapes (2, 3) and (4, 3)");
    OPS_EXPECT_ERROR(ddp_op_div(tape, a, NULL, &y), "div: b is NULL");
    OPS_EXPECT_ERROR(ddp_op_exp(NULL, a, &y), "exp: NULL tape or output");
    OPS_EXPECT_ERROR(ddp_op_clamp(tape, a, 1.0f, -1.0f, &y),
                     "clamp: bounds [1, -1] are not an interval");
    OPS_EXPECT_ERROR(ddp_op_clamp(tape, a, NAN, 1.0f, &y), "clamp: bounds [nan, 1]");
    OPS_EXPECT_ERROR(ddp_op_pow(tape, a, NAN, &y), "pow: the exponent is nan");
    ddp_tape_destroy(tape);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_torch),
        cmocka_unit_test(test_broadcast_accumulates),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
