/* torch.matmul (ddp_op_matmul): batches, batch broadcasting and 1-D
 * operands against PyTorch 1.13 (tests/fixtures/ops_matmul.h), a larger
 * batched product against a float64 loop, and the errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "fixtures/ops_matmul.h"

static int b_matmul(ddp_tape_t *t, ddp_var_t **in, const ops_case *c, ddp_var_t **y)
{
    (void)c;
    return ddp_op_matmul(t, in[0], in[1], y);
}

static const ops_builder builders[] = {{"matmul", b_matmul}, {NULL, NULL}};

static void test_against_torch(void **state)
{
    (void)state;
    assert_int_equal(OPS_RUN_ALL(ops_matmul_cases, builders), 0);
}

/* (3, 1, 17, 19) x (4, 19, 13): 12 GEMMs with both inputs broadcast, the
 * output against a float64 triple loop. */
static void test_broadcast_batches(void **state)
{
    (void)state;
    enum { B0 = 3, B1 = 4, M = 17, K = 19, N = 13 };
    static float a[B0 * M * K], b[B1 * K * N];
    for (int i = 0; i < B0 * M * K; i++)
        a[i] = (float)((i * 37 % 101) - 50) / 50.0f;
    for (int i = 0; i < B1 * K * N; i++)
        b[i] = (float)((i * 53 % 97) - 48) / 48.0f;
    ddp_tape_t *tape;
    ddp_var_t *va, *vb, *y;
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_non_null(va = ops_leaf(tape, a, 4, (int64_t[]){B0, 1, M, K}, 0));
    assert_non_null(vb = ops_leaf(tape, b, 3, (int64_t[]){B1, K, N}, 0));
    assert_int_equal(ddp_op_matmul(tape, va, vb, &y), 0);
    const ddp_tensor *yt = ddp_var_tensor(y);
    assert_int_equal(yt->ndim, 4);
    assert_int_equal(yt->shape[0], B0);
    assert_int_equal(yt->shape[1], B1);
    double worst = 0;
    for (int i = 0; i < B0; i++)
        for (int j = 0; j < B1; j++)
            for (int m = 0; m < M; m++)
                for (int n = 0; n < N; n++) {
                    double s = 0;
                    for (int k = 0; k < K; k++)
                        s += (double)a[(i * M + m) * K + k] * b[(j * K + k) * N + n];
                    double got = yt->data[((i * B1 + j) * M + m) * N + n];
                    worst = fmax(worst, fabs(got - s));
                }
    assert_true(worst < 1e-5);
    ddp_tape_destroy(tape);
}

static void test_errors(void **state)
{
    (void)state;
    float buf[64] = {0};
    ddp_tape_t *tape;
    ddp_var_t *a, *b, *c, *s, *y;
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_non_null(a = ops_leaf(tape, buf, 3, (int64_t[]){2, 2, 3}, 1));
    assert_non_null(b = ops_leaf(tape, buf, 3, (int64_t[]){3, 3, 2}, 1));
    assert_non_null(c = ops_leaf(tape, buf, 2, (int64_t[]){2, 2}, 1));
    assert_non_null(s = ops_leaf(tape, buf, 0, NULL, 1));
    OPS_EXPECT_ERROR(ddp_op_matmul(tape, a, b, &y),
                     "matmul: the batch dims of shapes (2, 2, 3) and (3, 3, 2) do not broadcast");
    OPS_EXPECT_ERROR(ddp_op_matmul(tape, a, c, &y),
                     "matmul: shapes (2, 2, 3) and (2, 2) cannot be multiplied (3 columns "
                     "against 2 rows)");
    OPS_EXPECT_ERROR(ddp_op_matmul(tape, s, c, &y), "matmul: shapes () and (2, 2): both need");
    ddp_tape_destroy(tape);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_torch),
        cmocka_unit_test(test_broadcast_batches),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
