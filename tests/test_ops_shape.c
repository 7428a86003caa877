/* Shape ops (permute, transpose, slice/narrow, expand, cat, stack) against
 * PyTorch 1.13 (tests/fixtures/ops_shape.h), which of them are views, and
 * their errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "fixtures/ops_shape.h"

static int b_permute(ddp_tape_t *t, ddp_var_t **in, const ops_case *c, ddp_var_t **y)
{
    int dims[DDP_TENSOR_MAX_DIM];
    for (int i = 0; i < c->niarg; i++)
        dims[i] = (int)c->iarg[i];
    return ddp_op_permute(t, in[0], dims, y);
}

static int b_transpose(ddp_tape_t *t, ddp_var_t **in, const ops_case *c, ddp_var_t **y)
{
    return ddp_op_transpose(t, in[0], (int)c->iarg[0], (int)c->iarg[1], y);
}

static int b_slice(ddp_tape_t *t, ddp_var_t **in, const ops_case *c, ddp_var_t **y)
{
    return ddp_op_slice(t, in[0], (int)c->iarg[0], c->iarg[1], c->iarg[2], c->iarg[3], y);
}

static int b_narrow(ddp_tape_t *t, ddp_var_t **in, const ops_case *c, ddp_var_t **y)
{
    return ddp_op_narrow(t, in[0], (int)c->iarg[0], c->iarg[1], c->iarg[2], y);
}

static int b_expand(ddp_tape_t *t, ddp_var_t **in, const ops_case *c, ddp_var_t **y)
{
    return ddp_op_expand(t, in[0], c->niarg, c->iarg, y);
}

static int b_cat(ddp_tape_t *t, ddp_var_t **in, const ops_case *c, ddp_var_t **y)
{
    return ddp_op_cat(t, c->nin, in, (int)c->iarg[0], y);
}

static int b_stack(ddp_tape_t *t, ddp_var_t **in, const ops_case *c, ddp_var_t **y)
{
    return ddp_op_stack(t, c->nin, in, (int)c->iarg[0], y);
}

static const ops_builder builders[] = {
    {"permute", b_permute}, {"transpose", b_transpose}, {"slice", b_slice},
    {"narrow", b_narrow},   {"expand", b_expand},       {"cat", b_cat},
    {"stack", b_stack},     {NULL, NULL},
};

static void test_against_torch(void **state)
{
    (void)state;
    assert_int_equal(OPS_RUN_ALL(ops_shape_cases, builders), 0);
}

/* Views share the input's storage; copies do not; identity ops return the
 * input itself.  A dim-0 slice's gradient lands in its rows of the input's
 * and the other rows are 0 (also when two slices of one input are used). */
static void test_views(void **state)
{
    (void)state;
    float x[12];
    for (int i = 0; i < 12; i++)
        x[i] = (float)i;
    ddp_tape_t *tape;
    ddp_var_t *vx, *top, *mid, *col, *same, *sum, *y;
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_non_null(vx = ops_leaf(tape, x, 2, (int64_t[]){4, 3}, 1));
    assert_int_equal(ddp_op_slice(tape, vx, 0, 0, 1, 1, &top), 0);
    assert_ptr_equal(ddp_var_tensor(top)->data, x);
    assert_int_equal(ddp_op_narrow(tape, vx, 0, 2, 2, &mid), 0);
    assert_ptr_equal(ddp_var_tensor(mid)->data, x + 6); /* a view at offset 6 */
    assert_int_equal(ddp_op_narrow(tape, vx, 1, 1, 1, &col), 0); /* a copy */
    assert_true(ddp_var_tensor(col)->data != x + 1);
    assert_float_equal(ddp_var_tensor(col)->data[2], 7.0f, 0);
    assert_int_equal(ddp_op_contiguous(tape, vx, &same), 0);
    assert_ptr_equal(same, vx);
    assert_int_equal(ddp_op_transpose(tape, vx, 1, 1, &same), 0);
    assert_ptr_equal(same, vx);
    assert_int_equal(ddp_op_expand(tape, vx, 2, (int64_t[]){-1, 3}, &same), 0);
    assert_ptr_equal(same, vx);
    /* y = top (1, 3) + mid (2, 3) broadcast: dx rows 0 = 2, rows 2, 3 = 1, row 1 = 0 */
    assert_int_equal(ddp_op_add(tape, top, mid, &sum), 0);
    assert_int_equal(ddp_op_sum(tape, sum, &y), 0);
    assert_int_equal(ddp_tape_backward(tape, y, NULL), 0);
    const float *g = ddp_var_grad(vx);
    const float want[12] = {2, 2, 2, 0, 0, 0, 1, 1, 1, 1, 1, 1};
    for (int i = 0; i < 12; i++)
        assert_float_equal(g[i], want[i], 0);
    ddp_tape_destroy(tape);
}

static void test_errors(void **state)
{
    (void)state;
    float buf[24] = {0};
    ddp_tape_t *tape;
    ddp_var_t *a, *b, *y;
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_non_null(a = ops_leaf(tape, buf, 2, (int64_t[]){2, 3}, 1));
    assert_non_null(b = ops_leaf(tape, buf, 2, (int64_t[]){4, 2}, 1));
    OPS_EXPECT_ERROR(ddp_op_permute(tape, a, (int[]){0, 0}, &y), "permute: dim 0 appears twice");
    OPS_EXPECT_ERROR(ddp_op_permute(tape, a, (int[]){0, 2}, &y),
                     "permute: dim 2 is out of range for shape (2, 3)");
    OPS_EXPECT_ERROR(ddp_op_transpose(tape, a, -3, 0, &y),
                     "transpose: dim -3 is out of range for shape (2, 3)");
    OPS_EXPECT_ERROR(ddp_op_slice(tape, a, 1, 2, 2, 1, &y), "slice: 2:2:1 of dim 1 of shape (2, 3) is empty");
    OPS_EXPECT_ERROR(ddp_op_slice(tape, a, 1, 0, 2, 0, &y), "slice: step 0 must be >= 1");
    OPS_EXPECT_ERROR(ddp_op_narrow(tape, a, 1, 2, 2, &y),
                     "narrow: start 2, length 2 do not fit dim 1 of shape (2, 3)");
    OPS_EXPECT_ERROR(ddp_op_expand(tape, a, 2, (int64_t[]){4, 3}, &y),
                     "expand: shape (2, 3) cannot be expanded to size 4 at dim 0");
    OPS_EXPECT_ERROR(ddp_op_expand(tape, a, 3, (int64_t[]){-1, 2, 3}, &y),
                     "expand: shape (2, 3) cannot be expanded to size -1 at dim 0");
    OPS_EXPECT_ERROR(ddp_op_expand(tape, a, 1, (int64_t[]){3}, &y), "expand: 1 dims for shape (2, 3)");
    OPS_EXPECT_ERROR(ddp_op_cat(tape, 2, (ddp_var_t *[]){a, b}, 0, &y),
                     "cat: input 1 of shape (4, 2) does not match input 0 of shape (2, 3)");
    OPS_EXPECT_ERROR(ddp_op_cat(tape, 0, (ddp_var_t *[]){a}, 0, &y), "cat: 0 inputs");
    OPS_EXPECT_ERROR(ddp_op_stack(tape, 2, (ddp_var_t *[]){a, b}, 0, &y),
                     "stack: input 1 of shape (4, 2) does not match input 0 of shape (2, 3)");
    OPS_EXPECT_ERROR(ddp_op_stack(tape, 2, (ddp_var_t *[]){a, a}, 3, &y),
                     "stack: dim 3 is out of range for shape (2, 3)");
    ddp_tape_destroy(tape);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_torch),
        cmocka_unit_test(test_views),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
