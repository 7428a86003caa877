/* Tensors (shape, strides, owned or borrowed storage), the CBLAS GEMM
 * wrapper and the OpenBLAS thread setting; see include/ddp/tensor.h. */
#include "ddp/tensor.h"

#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/cpu.h"
#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "tensor/kernels.h"
#include "tensor/shape.h"

/* ---- shapes --------------------------------------------------------------- */

int ddp__tensor_set_shape(ddp_tensor *t, int ndim, const int64_t *shape)
{
    DDP_FAIL_IF(ndim < 0 || ndim > DDP_TENSOR_MAX_DIM, DDP_ERR_INVALID_ARG,
                "tensor has %d dimensions (at most %d)", ndim, DDP_TENSOR_MAX_DIM);
    DDP_FAIL_IF(ndim > 0 && !shape, DDP_ERR_INVALID_ARG, "tensor shape is NULL");
    int64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        DDP_FAIL_IF(shape[i] <= 0, DDP_ERR_INVALID_ARG,
                    "tensor dimension %d has size %lld (must be > 0)", i, (long long)shape[i]);
        DDP_FAIL_IF(numel > INT64_MAX / 4 / shape[i], DDP_ERR_INVALID_ARG,
                    "tensor of more than 2^61 elements");
        numel *= shape[i];
    }
    t->ndim = ndim;
    t->numel = numel;
    for (int i = 0; i < DDP_TENSOR_MAX_DIM; i++)
        t->shape[i] = i < ndim ? shape[i] : 1;
    int64_t stride = 1;
    for (int i = DDP_TENSOR_MAX_DIM - 1; i >= 0; i--) {
        t->stride[i] = stride;
        stride *= t->shape[i];
    }
    return 0;
}

int ddp_tensor_init(ddp_tensor *t, int ndim, const int64_t *shape)
{
    DDP_FAIL_IF(!t, DDP_ERR_INVALID_ARG, "tensor is NULL");
    memset(t, 0, sizeof *t);
    DDP_TRY(ddp__tensor_set_shape(t, ndim, shape));
    t->data = ddp__calloc_aligned((size_t)t->numel * sizeof(float));
    if (!t->data) {
        char buf[64];
        return DDP_ERROR(DDP_ERR_NOMEM, "cannot allocate a tensor of shape %s",
                         ddp_tensor_shape_str(t, buf, sizeof buf));
    }
    t->owns_data = 1;
    return 0;
}

int ddp_tensor_wrap(ddp_tensor *t, float *data, int ndim, const int64_t *shape)
{
    DDP_FAIL_IF(!t, DDP_ERR_INVALID_ARG, "tensor is NULL");
    memset(t, 0, sizeof *t);
    DDP_FAIL_IF(!data, DDP_ERR_INVALID_ARG, "tensor data is NULL");
    DDP_TRY(ddp__tensor_set_shape(t, ndim, shape));
    t->data = data;
    return 0;
}

int ddp_tensor_view(const ddp_tensor *src, int ndim, const int64_t *shape, ddp_tensor *out)
{
    DDP_FAIL_IF(!src || !out, DDP_ERR_INVALID_ARG, "tensor is NULL");
    DDP_FAIL_IF(ndim < 0 || ndim > DDP_TENSOR_MAX_DIM, DDP_ERR_INVALID_ARG,
                "view has %d dimensions (at most %d)", ndim, DDP_TENSOR_MAX_DIM);
    int64_t s[DDP_TENSOR_MAX_DIM];
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < ndim; i++) {
        s[i] = shape[i];
        if (s[i] == -1) {
            DDP_FAIL_IF(infer >= 0, DDP_ERR_INVALID_ARG,
                        "view shape has more than one -1 (dimensions %d and %d)", infer, i);
            infer = i;
            continue;
        }
        DDP_FAIL_IF(s[i] <= 0, DDP_ERR_INVALID_ARG, "view dimension %d has size %lld", i,
                    (long long)s[i]);
        known *= s[i];
    }
    char buf[64];
    if (infer >= 0) {
        DDP_FAIL_IF(src->numel % known != 0, DDP_ERR_INVALID_ARG,
                    "cannot view a tensor of shape %s (%lld elements) with -1 and %lld known",
                    ddp_tensor_shape_str(src, buf, sizeof buf), (long long)src->numel,
                    (long long)known);
        s[infer] = src->numel / known;
        known = src->numel;
    }
    DDP_FAIL_IF(known != src->numel, DDP_ERR_INVALID_ARG,
                "cannot view a tensor of shape %s (%lld elements) as %lld elements",
                ddp_tensor_shape_str(src, buf, sizeof buf), (long long)src->numel,
                (long long)known);
    ddp_tensor v;
    memset(&v, 0, sizeof v);
    DDP_TRY(ddp__tensor_set_shape(&v, ndim, s));
    v.data = src->data;
    *out = v;
    return 0;
}

void ddp_tensor_destroy(ddp_tensor *t)
{
    if (!t)
        return;
    if (t->owns_data)
        ddp__free_aligned(t->data);
    memset(t, 0, sizeof *t);
}

char *ddp_tensor_shape_str(const ddp_tensor *t, char *buf, size_t len)
{
    if (!buf || len == 0)
        return buf;
    size_t n = (size_t)snprintf(buf, len, "(");
    for (int i = 0; t && i < t->ndim && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (n < len)
        snprintf(buf + n, len - n, ")");
    return buf;
}

int ddp_tensor_same_shape(const ddp_tensor *a, const ddp_tensor *b)
{
    if (a->ndim != b->ndim)
        return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return 0;
    return 1;
}

/* ---- BLAS ----------------------------------------------------------------- */

/* OpenBLAS's thread count is process state of OpenBLAS itself; we only decide
 * its initial value, once, from the environment (one thread per rank). */
static pthread_once_t threads_once = PTHREAD_ONCE_INIT;

/* OPENBLAS_NUM_THREADS is OpenBLAS's own (1-4096, else ignored). */
static int openblas_threads(void)
{
    const char *v = getenv("OPENBLAS_NUM_THREADS");
    if (!v || !*v)
        return 0;
    char *end;
    long n = strtol(v, &end, 10);
    return (*end == '\0' && n >= 1 && n <= 4096) ? (int)n : 0;
}

/* OpenBLAS chose its kernels when it loaded, from the CPU's model number;
 * where it fell back to older ones than the CPU runs (base/cpu.c says
 * when), only the variable it read then can mend that, in the next
 * process: say which.  Unless the user chose the kernels. */
static void blas_core_check(void)
{
    char msg[512];
    if (ddp__cpu_blas_warning(msg, sizeof msg, openblas_get_corename(), ddp__cpu_features(),
                              getenv("OPENBLAS_CORETYPE")))
        DDP_WARN("%s", msg);
}

const char *ddp__blas_corename(void)
{
    return openblas_get_corename();
}

/* A bad DDP_NUM_THREADS cannot fail the GEMM that first reads it: it is
 * logged as a warning and the thread count falls back as when unset. */
static void threads_init(void)
{
    blas_core_check();
    char saved[1024]; /* the caller's error stays (error.c keeps 1024 bytes) */
    snprintf(saved, sizeof saved, "%s", ddp_last_error());
    int n = 0;
    if (ddp__env_int("DDP_NUM_THREADS", &n) < 0)
        DDP_WARN("%s (using OPENBLAS_NUM_THREADS, else 1)", ddp_last_error());
    ddp__error_restore(saved);
    if (n == 0)
        n = openblas_threads();
    openblas_set_num_threads(n ? n : 1);
}

int ddp_set_num_threads(int n)
{
    DDP_FAIL_IF(n < 1, DDP_ERR_INVALID_ARG, "thread count %d (must be >= 1)", n);
    pthread_once(&threads_once, threads_init);
    openblas_set_num_threads(n);
    return 0;
}

int ddp_num_threads(void)
{
    pthread_once(&threads_once, threads_init);
    return openblas_get_num_threads();
}

void ddp_sgemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a,
               int lda, const float *b, int ldb, float beta, float *c, int ldc)
{
    pthread_once(&threads_once, threads_init);
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
