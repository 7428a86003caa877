/* Element-wise and reduction kernels on contiguous float arrays (private to
 * libddp: tensor/, nn/ and optim/ use them).
 *
 * Written so that the compiler vectorises them: restrict pointers, one simple
 * loop each, no calls inside.  kernels.c builds them with the loop vectoriser
 * at full strength and, on x86-64, clones them for AVX2 and AVX-512 (picked at
 * load time), so the portable build stays correct and the fast path is used
 * where the CPU has it.  Kernels whose name ends in _to take `acc`: 0 writes
 * the result, 1 adds it to what is there (gradient accumulation).
 */
#ifndef DDP_TENSOR_KERNELS_H
#define DDP_TENSOR_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* Marks a hot loop function for AVX-512 / AVX2 / baseline clones (x86-64,
 * GNU ifunc); elsewhere, and under AddressSanitizer, a plain function.
 * gcc only: clang 14 cannot link target_clones from a hidden-visibility
 * static library. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__) && \
    defined(__has_attribute)
#if __has_attribute(target_clones)
#define DDP_KERNEL __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef DDP_KERNEL
#define DDP_KERNEL
#endif

/* Before a loop that writes several rows of one array (o[z], o[os + z],
 * ...): gcc cannot prove the rows apart and leaves such loops scalar; the
 * caller's strides keep them apart. */
#if defined(__GNUC__) && !defined(__clang__)
#define DDP_ROWS_APART _Pragma("GCC ivdep")
#else
#define DDP_ROWS_APART
#endif

/* The name of the kernel set OpenBLAS runs (openblas_get_corename(): "Haswell",
 * "SkylakeX", "Cooperlake", ...), for choices that depend on its kernels. */
const char *ddp__blas_corename(void);

/* y = x */
void ddp__vec_copy(float *restrict y, const float *restrict x, size_t n);
/* y (=|+=) x */
void ddp__vec_acc_to(float *restrict y, const float *restrict x, size_t n, int acc);
/* y += alpha * x */
void ddp__vec_axpy(float *restrict y, float alpha, const float *restrict x, size_t n);
/* y (=|+=) alpha * x */
void ddp__vec_scale_to(float *restrict y, float alpha, const float *restrict x, size_t n,
                       int acc);
/* y *= alpha (in place) */
void ddp__vec_scale_inplace(float *restrict y, float alpha, size_t n);
/* y = a + b */
void ddp__vec_add(float *restrict y, const float *restrict a, const float *restrict b,
                  size_t n);
/* y (=|+=) a * b */
void ddp__vec_mul_to(float *restrict y, const float *restrict a, const float *restrict b,
                     size_t n, int acc);
/* y = max(x, 0) */
void ddp__vec_relu(float *restrict y, const float *restrict x, size_t n);
/* y = max(y, 0) in place */
void ddp__vec_relu_self(float *y, size_t n);
/* dx (=|+=) dy where y > 0 (y: the ReLU output) */
void ddp__vec_relu_backward_to(float *restrict dx, const float *restrict dy,
                               const float *restrict y, size_t n, int acc);
/* Sum of x, accumulated in double. */
double ddp__vec_sum(const float *restrict x, size_t n);
/* y (=|+=) c (the same value everywhere) */
void ddp__vec_fill_to(float *restrict y, float c, size_t n, int acc);

/* Each of the rows rows of y (rows, cols) = b (cols): bias broadcast. */
void ddp__rows_set(float *restrict y, const float *restrict b, size_t rows, size_t cols);
/* y (rows, cols) = a (rows, cols) + b (cols) broadcast over rows. */
void ddp__rows_add(float *restrict y, const float *restrict a, const float *restrict b,
                   size_t rows, size_t cols);
/* db (cols) (=|+=) sum over rows of dy (rows, cols). */
void ddp__rows_sum_to(float *restrict db, const float *restrict dy, size_t rows, size_t cols,
                      int acc);

#endif
