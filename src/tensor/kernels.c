/* Element-wise and reduction kernels; see kernels.h.
 *
 * Why the pragma and the clones: at -O2 gcc 12 vectorises only loops whose
 * trip count is a known multiple of the vector width ("very cheap" cost
 * model), which none of these are, and a portable x86-64 build targets SSE2.
 * The hot kernels therefore get the full vectoriser here and target_clones
 * builds AVX-512 / AVX2 / baseline versions, chosen once at load time by the
 * CPU's features (GNU ifunc); behaviour is identical, only the speed differs.
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif

#include "tensor/kernels.h"

#include <string.h>

void ddp__vec_copy(float *restrict y, const float *restrict x, size_t n)
{
    if (n)
        memcpy(y, x, n * sizeof *y);
}

DDP_KERNEL void ddp__vec_acc_to(float *restrict y, const float *restrict x, size_t n, int acc)
{
    if (!acc) {
        ddp__vec_copy(y, x, n);
        return;
    }
    for (size_t i = 0; i < n; i++)
        y[i] += x[i];
}

DDP_KERNEL void ddp__vec_axpy(float *restrict y, float alpha, const float *restrict x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] += alpha * x[i];
}

DDP_KERNEL void ddp__vec_scale_to(float *restrict y, float alpha, const float *restrict x,
                                  size_t n, int acc)
{
    if (acc) {
        for (size_t i = 0; i < n; i++)
            y[i] += alpha * x[i];
    } else {
        for (size_t i = 0; i < n; i++)
            y[i] = alpha * x[i];
    }
}

DDP_KERNEL void ddp__vec_scale_inplace(float *restrict y, float alpha, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] *= alpha;
}

DDP_KERNEL void ddp__vec_add(float *restrict y, const float *restrict a, const float *restrict b,
                             size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = a[i] + b[i];
}

DDP_KERNEL void ddp__vec_mul_to(float *restrict y, const float *restrict a,
                                const float *restrict b, size_t n, int acc)
{
    if (acc) {
        for (size_t i = 0; i < n; i++)
            y[i] += a[i] * b[i];
    } else {
        for (size_t i = 0; i < n; i++)
            y[i] = a[i] * b[i];
    }
}

DDP_KERNEL void ddp__vec_relu(float *restrict y, const float *restrict x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

DDP_KERNEL void ddp__vec_relu_self(float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = y[i] > 0.0f ? y[i] : 0.0f;
}

DDP_KERNEL void ddp__vec_relu_backward_to(float *restrict dx, const float *restrict dy,
                                          const float *restrict y, size_t n, int acc)
{
    if (acc) {
        for (size_t i = 0; i < n; i++)
            dx[i] += y[i] > 0.0f ? dy[i] : 0.0f;
    } else {
        for (size_t i = 0; i < n; i++)
            dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
    }
}

DDP_KERNEL double ddp__vec_sum(const float *restrict x, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += x[i];
    return s;
}

DDP_KERNEL void ddp__vec_fill_to(float *restrict y, float c, size_t n, int acc)
{
    if (acc) {
        for (size_t i = 0; i < n; i++)
            y[i] += c;
    } else {
        for (size_t i = 0; i < n; i++)
            y[i] = c;
    }
}

void ddp__rows_set(float *restrict y, const float *restrict b, size_t rows, size_t cols)
{
    for (size_t r = 0; r < rows; r++)
        memcpy(y + r * cols, b, cols * sizeof *y);
}

DDP_KERNEL void ddp__rows_add(float *restrict y, const float *restrict a,
                              const float *restrict b, size_t rows, size_t cols)
{
    for (size_t r = 0; r < rows; r++) {
        float *restrict yr = y + r * cols;
        const float *restrict ar = a + r * cols;
        for (size_t c = 0; c < cols; c++)
            yr[c] = ar[c] + b[c];
    }
}

DDP_KERNEL void ddp__rows_sum_to(float *restrict db, const float *restrict dy, size_t rows,
                                 size_t cols, int acc)
{
    size_t r = 0;
    if (!acc) {
        if (rows == 0) {
            memset(db, 0, cols * sizeof *db);
            return;
        }
        memcpy(db, dy, cols * sizeof *db);
        r = 1;
    }
    for (; r < rows; r++) {
        const float *restrict dr = dy + r * cols;
        for (size_t c = 0; c < cols; c++)
            db[c] += dr[c];
    }
}
