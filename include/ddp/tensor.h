/* libddp tensor layer: float32 tensors and the BLAS thread setting.
 *
 * A ddp_tensor is a plain struct (STYLE.md rule 6: hot numeric data is
 * transparent): a data pointer, up to DDP_TENSOR_MAX_DIM dimensions, and
 * contiguous row-major strides (in elements).  Storage is either owned (made
 * by ddp_tensor_init, freed by ddp_tensor_destroy) or borrowed (ddp_tensor_wrap,
 * ddp_tensor_view: the caller keeps the memory alive, the library never frees
 * it).  Matrix products go through CBLAS (OpenBLAS); element-wise kernels are
 * simple loops that the compiler vectorises.
 *
 * BLAS threads: OpenBLAS runs one thread per process unless told otherwise
 * (DDP_NUM_THREADS, else OPENBLAS_NUM_THREADS, else 1), read the first time
 * libddp does a product; ddp_set_num_threads() overrides it at any time.
 */
#ifndef DDP_TENSOR_H
#define DDP_TENSOR_H

#include "ddp/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DDP_TENSOR_MAX_DIM 8

typedef struct ddp_tensor {
    float *data;                          /* numel floats, 64-byte aligned when owned */
    int ndim;                             /* 0 (scalar) .. DDP_TENSOR_MAX_DIM */
    int owns_data;                        /* 1: ddp_tensor_destroy frees data */
    int64_t numel;                        /* product of shape (1 for a scalar) */
    int64_t shape[DDP_TENSOR_MAX_DIM];    /* unused dimensions are 1 */
    int64_t stride[DDP_TENSOR_MAX_DIM];   /* row-major, contiguous, in elements */
} ddp_tensor;

/* Allocates zeroed, owned storage for a tensor of the given shape (ndim
 * entries, each > 0).  Free with ddp_tensor_destroy. */
DDP_API int ddp_tensor_init(ddp_tensor *t, int ndim, const int64_t *shape);
/* Describes borrowed memory (numel floats at data) as a tensor; the library
 * never frees it.  data may be NULL only when numel is 0 (not allowed). */
DDP_API int ddp_tensor_wrap(ddp_tensor *t, float *data, int ndim, const int64_t *shape);
/* A view of src with another shape and the same number of elements (one
 * entry may be -1: inferred, as torch.reshape).  Borrows src's data. */
DDP_API int ddp_tensor_view(const ddp_tensor *src, int ndim, const int64_t *shape,
                            ddp_tensor *out);
/* Frees owned storage; borrowed storage is left alone.  Resets *t; NULL and
 * repeated calls are no-ops. */
DDP_API void ddp_tensor_destroy(ddp_tensor *t);
/* Writes "(2, 3, 4)" into buf (always NUL-terminated); returns buf. */
DDP_API char *ddp_tensor_shape_str(const ddp_tensor *t, char *buf, size_t len);
/* Same shape (ndim and every dimension)? */
DDP_API int ddp_tensor_same_shape(const ddp_tensor *a, const ddp_tensor *b);

/* C = alpha * op(A) op(B) + beta * C, row-major, through cblas_sgemm.
 * op(A) is M x K, op(B) is K x N, C is M x N; trans_a/trans_b select the
 * transposes; lda/ldb/ldc are the row strides of the stored matrices. */
DDP_API void ddp_sgemm(int trans_a, int trans_b, int m, int n, int k, float alpha,
                       const float *a, int lda, const float *b, int ldb, float beta,
                       float *c, int ldc);

/* Number of OpenBLAS threads for this process (n >= 1).  Returns 0, or
 * DDP_ERR_INVALID_ARG for n < 1. */
DDP_API int ddp_set_num_threads(int n);
/* The thread count in force (after reading the environment if not set). */
DDP_API int ddp_num_threads(void);

#ifdef __cplusplus
}
#endif
#endif
