/* tensor/: shapes and strides, owned and borrowed storage, views, GEMM
 * through CBLAS against a naive float64 product, the BLAS thread setting,
 * and the element-wise kernels' write/accumulate modes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ddp.h"
#include "tensor/kernels.h"

static void test_init_wrap_view(void **state)
{
    (void)state;
    ddp_tensor t, v, w;
    char buf[64];
    assert_int_equal(ddp_tensor_init(&t, 3, (int64_t[]){2, 3, 4}), 0);
    assert_int_equal(t.numel, 24);
    assert_int_equal(t.owns_data, 1);
    assert_int_equal((uintptr_t)t.data % 64, 0);
    assert_true(t.stride[0] == 12 && t.stride[1] == 4 && t.stride[2] == 1);
    for (int i = 0; i < 24; i++)
        assert_true(t.data[i] == 0.0f);
    assert_string_equal(ddp_tensor_shape_str(&t, buf, sizeof buf), "(2, 3, 4)");
    assert_int_equal(ddp_tensor_view(&t, 2, (int64_t[]){-1, 6}, &v), 0);
    assert_true(v.shape[0] == 4 && v.shape[1] == 6 && v.data == t.data && !v.owns_data);
    assert_true(v.stride[0] == 6 && v.stride[1] == 1);
    assert_int_equal(ddp_tensor_same_shape(&t, &v), 0);
    assert_int_equal(ddp_tensor_view(&t, 3, (int64_t[]){2, 3, 4}, &w), 0);
    assert_int_equal(ddp_tensor_same_shape(&t, &w), 1);
    ddp_tensor_destroy(&v); /* borrowed: leaves t's data alone */
    t.data[23] = 5.0f;
    assert_true(t.data[23] == 5.0f);

    assert_int_equal(ddp_tensor_view(&t, 2, (int64_t[]){5, -1}, &v), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "cannot view a tensor of shape (2, 3, 4) (24 elements) with -1 and 5 known"));
    assert_int_equal(ddp_tensor_view(&t, 2, (int64_t[]){5, 5}, &v), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "as 25 elements"));
    assert_int_equal(ddp_tensor_view(&t, 2, (int64_t[]){-1, -1}, &v), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "more than one -1"));
    ddp_tensor_destroy(&t);
    assert_null(t.data);
    ddp_tensor_destroy(&t);
    ddp_tensor_destroy(NULL);

    float data[6] = {1, 2, 3, 4, 5, 6};
    assert_int_equal(ddp_tensor_wrap(&t, data, 2, (int64_t[]){2, 3}), 0);
    assert_int_equal(t.owns_data, 0);
    ddp_tensor_destroy(&t); /* must not free the stack array */
    assert_int_equal(ddp_tensor_wrap(&t, data, 0, NULL), 0);
    assert_int_equal(t.numel, 1);
    assert_string_equal(ddp_tensor_shape_str(&t, buf, sizeof buf), "()");

    /* 8-D is the most (PyTorch's tutorials need 5-6; DDP_TENSOR_MAX_DIM) */
    assert_int_equal(ddp_tensor_init(&t, 8, (int64_t[]){1, 2, 1, 3, 1, 1, 2, 1}), 0);
    assert_int_equal(t.numel, 12);
    assert_int_equal(t.stride[0], 12);
    assert_int_equal(t.stride[6], 1);
    assert_string_equal(ddp_tensor_shape_str(&t, buf, sizeof buf), "(1, 2, 1, 3, 1, 1, 2, 1)");
    ddp_tensor_destroy(&t);
    assert_int_equal(ddp_tensor_init(&t, 9, (int64_t[]){1, 1, 1, 1, 1, 1, 1, 1, 1}),
                     DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "tensor has 9 dimensions (at most 8)"));
    assert_int_equal(ddp_tensor_init(&t, 2, (int64_t[]){3, -2}), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "tensor dimension 1 has size -2 (must be > 0)"));
    assert_int_equal(ddp_tensor_wrap(&t, NULL, 1, (int64_t[]){3}), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "tensor data is NULL"));
    assert_int_equal(ddp_tensor_init(&t, 2, (int64_t[]){INT64_C(1) << 40, INT64_C(1) << 40}),
                     DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "more than 2^61 elements"));
}

static void test_sgemm_all_transposes(void **state)
{
    (void)state;
    enum { M = 7, N = 5, K = 9 };
    float a[M * K], b[K * N], at[K * M], bt[N * K], c[M * N];
    for (int i = 0; i < M * K; i++)
        a[i] = (float)sin(i + 1);
    for (int i = 0; i < K * N; i++)
        b[i] = (float)cos(i * 0.5);
    for (int i = 0; i < M; i++)
        for (int k = 0; k < K; k++)
            at[k * M + i] = a[i * K + k];
    for (int k = 0; k < K; k++)
        for (int j = 0; j < N; j++)
            bt[j * K + k] = b[k * N + j];
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            for (int i = 0; i < M * N; i++)
                c[i] = 1.0f;
            /* C = 2 op(A) op(B) + 0.5 C */
            ddp_sgemm(ta, tb, M, N, K, 2.0f, ta ? at : a, ta ? M : K, tb ? bt : b, tb ? K : N,
                      0.5f, c, N);
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double s = 0;
                    for (int k = 0; k < K; k++)
                        s += (double)a[i * K + k] * b[k * N + j];
                    assert_true(fabs(c[i * N + j] - (2 * s + 0.5)) < 1e-5);
                }
        }
}

static void test_threads(void **state)
{
    (void)state;
    /* one thread by default (tests/run.sh does not set DDP_NUM_THREADS) */
    if (!getenv("DDP_NUM_THREADS") && !getenv("OPENBLAS_NUM_THREADS"))
        assert_int_equal(ddp_num_threads(), 1);
    assert_int_equal(ddp_set_num_threads(2), 0);
    assert_int_equal(ddp_num_threads(), 2);
    assert_int_equal(ddp_set_num_threads(0), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "thread count 0 (must be >= 1)"));
    assert_int_equal(ddp_set_num_threads(1), 0);
    assert_int_equal(ddp_num_threads(), 1);
}

/* The thread count a fresh process picks from its environment: this binary
 * re-executed with --threads-child exits with ddp_num_threads(). */
static int threads_in_child(const char *ddp, const char *openblas)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (ddp)
            setenv("DDP_NUM_THREADS", ddp, 1);
        else
            unsetenv("DDP_NUM_THREADS");
        if (openblas)
            setenv("OPENBLAS_NUM_THREADS", openblas, 1);
        else
            unsetenv("OPENBLAS_NUM_THREADS");
        execl("/proc/self/exe", "test_tensor", "--threads-child", (char *)NULL);
        _exit(100);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static void test_threads_from_env(void **state)
{
    (void)state;
    assert_int_equal(threads_in_child(NULL, NULL), 1);         /* one per process */
    assert_int_equal(threads_in_child(NULL, "2"), 2);          /* OpenBLAS's own variable */
    assert_int_equal(threads_in_child("2", "1"), 2);           /* ours wins */
    assert_int_equal(threads_in_child("zero", NULL), 1);       /* garbage is ignored */
}

static void test_kernels(void **state)
{
    (void)state;
    enum { N = 37 }; /* not a multiple of any vector width */
    float x[N], y[N], z[N], g[N];
    for (int i = 0; i < N; i++) {
        x[i] = (float)(i - 18);
        y[i] = 1.0f;
        g[i] = 0.5f * (float)i;
    }
    ddp__vec_relu(z, x, N);
    for (int i = 0; i < N; i++)
        assert_true(z[i] == (x[i] > 0 ? x[i] : 0));
    ddp__vec_relu_backward_to(y, g, z, N, 1); /* y += g where z > 0 */
    for (int i = 0; i < N; i++)
        assert_true(y[i] == 1.0f + (z[i] > 0 ? g[i] : 0));
    ddp__vec_relu_backward_to(y, g, z, N, 0);
    for (int i = 0; i < N; i++)
        assert_true(y[i] == (z[i] > 0 ? g[i] : 0));
    ddp__vec_scale_to(y, 2.0f, x, N, 0);
    ddp__vec_scale_to(y, 1.0f, x, N, 1);
    for (int i = 0; i < N; i++)
        assert_true(y[i] == 3 * x[i]);
    ddp__vec_axpy(y, -3.0f, x, N);
    ddp__vec_add(z, x, g, N);
    ddp__vec_mul_to(y, x, g, N, 1);
    for (int i = 0; i < N; i++) {
        assert_true(z[i] == x[i] + g[i]);
        assert_true(y[i] == x[i] * g[i]);
    }
    assert_true(ddp__vec_sum(x, N) == 0.0); /* -18 .. 18 */
    float rows[3 * 4] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, db[4] = {1, 1, 1, 1}, out[12];
    ddp__rows_sum_to(db, rows, 3, 4, 1);
    assert_true(db[0] == 16 && db[3] == 25);
    ddp__rows_sum_to(db, rows, 3, 4, 0);
    assert_true(db[0] == 15 && db[3] == 24);
    ddp__rows_add(out, rows, db, 3, 4);
    assert_true(out[0] == 16 && out[11] == 36);
    ddp__rows_set(out, db, 3, 4);
    assert_true(out[8] == 15 && out[11] == 24);
    ddp__vec_fill_to(out, 2.0f, 12, 1);
    assert_true(out[11] == 26);
    ddp__vec_acc_to(out, rows, 12, 0);
    assert_memory_equal(out, rows, sizeof rows);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--threads-child") == 0)
        return ddp_num_threads();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_wrap_view),
        cmocka_unit_test(test_sgemm_all_transposes),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_threads_from_env),
        cmocka_unit_test(test_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
