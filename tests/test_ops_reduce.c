/* Reductions over dims (sum, mean, var), max and argmax along a dim against
 * PyTorch 1.13 (tests/fixtures/ops_reduce.h, with its tie rule: the first
 * maximum gets the gradient), and their errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "fixtures/ops_reduce.h"

/* iarg = keepdim, dims... */
static int dims_of(const ops_case *c, int *dims)
{
    for (int i = 1; i < c->niarg; i++)
        dims[i - 1] = (int)c->iarg[i];
    return c->niarg - 1;
}

static int b_sum(ddp_tape_t *t, ddp_var_t **in, const ops_case *c, ddp_var_t **y)
{
    int dims[DDP_TENSOR_MAX_DIM], n = dims_of(c, dims);
    return ddp_op_sum_dims(t, in[0], n, dims, (int)c->iarg[0], y);
}

static int b_mean(ddp_tape_t *t, ddp_var_t **in, const ops_case *c, ddp_var_t **y)
{
    int dims[DDP_TENSOR_MAX_DIM], n = dims_of(c, dims);
    return ddp_op_mean_dims(t, in[0], n, dims, (int)c->iarg[0], y);
}

static int b_var(ddp_tape_t *t, ddp_var_t **in, const ops_case *c, ddp_var_t **y)
{
    int dims[DDP_TENSOR_MAX_DIM], n = dims_of(c, dims);
    return ddp_op_var(t, in[0], n, dims, c->farg[0] != 0, (int)c->iarg[0], y);
}

static int b_max(ddp_tape_t *t, ddp_var_t **in, const ops_case *c, ddp_var_t **y)
{
    return ddp_op_max(t, in[0], (int)c->iarg[0], (int)c->iarg[1], y);
}

/* argmax, also checking that the int64 indices match the float ones */
static int b_argmax(ddp_tape_t *t, ddp_var_t **in, const ops_case *c, ddp_var_t **y)
{
    int64_t idx[64];
    int rc = ddp_op_argmax(t, in[0], (int)c->iarg[0], (int)c->iarg[1], idx, y);
    if (rc == 0)
        for (int64_t i = 0; i < ddp_var_tensor(*y)->numel; i++)
            if ((float)idx[i] != ddp_var_tensor(*y)->data[i])
                return -1;
    return rc;
}

static const ops_builder builders[] = {
    {"sum", b_sum}, {"mean", b_mean}, {"var", b_var}, {"max", b_max}, {"argmax", b_argmax},
    {NULL, NULL},
};

static void test_against_torch(void **state)
{
    (void)state;
    assert_int_equal(OPS_RUN_ALL(ops_reduce_cases, builders), 0);
}

/* argmax has no gradient: its output does not require grad even when the
 * input does, and a max over a nan line is nan with the gradient there. */
static void test_argmax_no_grad_and_nan(void **state)
{
    (void)state;
    float x[4] = {1, NAN, 3, NAN}, dy[1] = {2};
    ddp_tape_t *tape;
    ddp_var_t *vx, *am, *mx;
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_non_null(vx = ops_leaf(tape, x, 1, (int64_t[]){4}, 1));
    assert_int_equal(ddp_op_argmax(tape, vx, 0, 0, NULL, &am), 0);
    assert_float_equal(ddp_var_tensor(am)->data[0], 1.0f, 0); /* the first nan, as torch */
    assert_int_equal(ddp_tape_backward_grad(tape, am, dy, NULL), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "does not depend on any parameter or input"));
    ddp_tape_destroy(tape);
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_non_null(vx = ops_leaf(tape, x, 1, (int64_t[]){4}, 1));
    assert_int_equal(ddp_op_max(tape, vx, 0, 0, &mx), 0);
    assert_true(isnan(ddp_var_tensor(mx)->data[0]));
    assert_int_equal(ddp_tape_backward_grad(tape, mx, dy, NULL), 0);
    const float want[4] = {0, 2, 0, 0};
    for (int i = 0; i < 4; i++)
        assert_float_equal(ddp_var_grad(vx)[i], want[i], 0);
    ddp_tape_destroy(tape);
}

/* A long reduced dim keeps float precision (sums accumulate in double):
 * mean and var over 2^20 values against float64 references. */
static void test_long_dim_precision(void **state)
{
    (void)state;
    enum { N = 1 << 20 };
    float *x = malloc(N * sizeof *x);
    assert_non_null(x);
    double s = 0, ss = 0;
    for (int i = 0; i < N; i++) {
        x[i] = 0.1f + (float)(i % 1000) * 1e-4f;
        s += x[i];
    }
    for (int i = 0; i < N; i++)
        ss += (x[i] - s / N) * (x[i] - s / N);
    ddp_tape_t *tape;
    ddp_var_t *vx, *m, *v;
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_non_null(vx = ops_leaf(tape, x, 2, (int64_t[]){1, N}, 0));
    assert_int_equal(ddp_op_mean_dims(tape, vx, 1, (int[]){1}, 0, &m), 0);
    assert_int_equal(ddp_op_var(tape, vx, 1, (int[]){1}, 1, 0, &v), 0);
    assert_true(fabs(ddp_var_tensor(m)->data[0] - s / N) <= 1e-6 * (s / N));
    assert_true(fabs(ddp_var_tensor(v)->data[0] - ss / (N - 1)) <= 1e-5 * (ss / (N - 1)));
    ddp_tape_destroy(tape);
    free(x);
}

static void test_errors(void **state)
{
    (void)state;
    float buf[6] = {0};
    ddp_tape_t *tape;
    ddp_var_t *a, *y;
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_non_null(a = ops_leaf(tape, buf, 2, (int64_t[]){2, 3}, 1));
    OPS_EXPECT_ERROR(ddp_op_sum_dims(tape, a, 2, (int[]){1, -1}, 0, &y),
                     "sum: dim 1 appears twice in the dim list");
    OPS_EXPECT_ERROR(ddp_op_mean_dims(tape, a, 1, (int[]){2}, 0, &y),
                     "mean: dim 2 is out of range for shape (2, 3)");
    OPS_EXPECT_ERROR(ddp_op_var(tape, a, 3, (int[]){0, 1, 1}, 1, 0, &y), "var: 3 dims for shape (2, 3)");
    OPS_EXPECT_ERROR(ddp_op_max(tape, a, -3, 0, &y), "max: dim -3 is out of range for shape (2, 3)");
    OPS_EXPECT_ERROR(ddp_op_argmax(tape, a, 2, 0, NULL, &y),
                     "argmax: dim 2 is out of range for shape (2, 3)");
    OPS_EXPECT_ERROR(ddp_op_sum_dims(tape, a, 1, NULL, 0, &y), "sum: 1 dims for shape (2, 3)");
    ddp_tape_destroy(tape);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_torch),
        cmocka_unit_test(test_argmax_no_grad_and_nan),
        cmocka_unit_test(test_long_dim_precision),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
