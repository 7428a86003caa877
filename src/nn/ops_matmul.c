/* torch.matmul: batched matrix products through CBLAS, one GEMM per batch
 * (ddp_sgemm), with the batch dims broadcast (ops_broadcast.c's plan gives
 * each batch's matrix offsets).  When b is one matrix shared by every batch
 * of a, the batches fold into the rows of a single GEMM (the (B, T, C) x
 * (C, D) case of a projection).
 *
 * Cost: 2 M K N flops per batch forward; backward as much again for each
 * input that requires grad (dA = dY B^T, dB = A^T dY).  A broadcast input's
 * gradient sums the GEMMs of the batches that share it (beta = 1). */
#include <limits.h>
#include <string.h>

#include "base/error.h"
#include "nn/ops_internal.h"

typedef struct mm_ctx {
    int m, k, n;          /* per batch: (m, k) x (k, n) */
    int fold;             /* b shared: one GEMM with rows = every batch's m */
    int64_t nbatch;
    ddp__plan batches;    /* the batch walk; operands a (0) and b (1), in elements */
} mm_ctx;

static int matmul_backward(ddp_tape_t *tape, ddp_var_t *v);
static const ddp__op_def matmul_def = {"matmul", matmul_backward, 0};

/* Checks shapes and fills c and the output shape. */
static int matmul_shapes(const ddp_var_t *a, const ddp_var_t *b, mm_ctx *c, int *ndim,
                         int64_t *shape)
{
    DDP_SHAPE_BUFS;
    int na = a->t.ndim, nb = b->t.ndim;
    DDP_FAIL_IF(na < 1 || nb < 1, DDP_ERR_INVALID_ARG,
                "matmul: shapes %s and %s: both need at least one dim", DDP_SHAPE(a, 0),
                DDP_SHAPE(b, 1));
    int64_t m = na == 1 ? 1 : a->t.shape[na - 2], k = a->t.shape[na - 1];
    int64_t kb = nb == 1 ? b->t.shape[0] : b->t.shape[nb - 2], n = nb == 1 ? 1 : b->t.shape[nb - 1];
    DDP_FAIL_IF(k != kb, DDP_ERR_INVALID_ARG,
                "matmul: shapes %s and %s cannot be multiplied (%lld columns against %lld rows)",
                DDP_SHAPE(a, 0), DDP_SHAPE(b, 1), (long long)k, (long long)kb);
    int ba = na > 2 ? na - 2 : 0, bb = nb > 2 ? nb - 2 : 0, nd;
    int64_t bshape[DDP_TENSOR_MAX_DIM];
    DDP_FAIL_IF(ddp__bcast_dims(ba, a->t.shape, bb, b->t.shape, &nd, bshape) < 0,
                DDP_ERR_INVALID_ARG, "matmul: the batch dims of shapes %s and %s do not "
                "broadcast", DDP_SHAPE(a, 0), DDP_SHAPE(b, 1));
    int64_t nbatch = 1;
    for (int d = 0; d < nd; d++)
        nbatch *= bshape[d];
    DDP_FAIL_IF(m * nbatch > INT_MAX || k > INT_MAX || n > INT_MAX, DDP_ERR_UNSUPPORTED,
                "matmul: shapes %s and %s exceed BLAS's int dimensions", DDP_SHAPE(a, 0),
                DDP_SHAPE(b, 1));
    /* Each batch's matrix offset: the input's stride along the batch dim (it
     * includes the matrix size), 0 where the input is broadcast. */
    int64_t st[2][DDP_TENSOR_MAX_DIM];
    const ddp_var_t *x[2] = {a, b};
    int nx[2] = {ba, bb};
    for (int i = 0; i < 2; i++)
        for (int d = 0; d < nd; d++) {
            int dd = d - (nd - nx[i]);
            st[i][d] = dd < 0 || x[i]->t.shape[dd] != bshape[d] ? 0 : x[i]->t.stride[dd];
        }
    ddp__plan_init(&c->batches, nd, bshape, 2, (const int64_t *const[]){st[0], st[1]});
    c->m = (int)m, c->k = (int)k, c->n = (int)n;
    c->nbatch = nbatch;
    c->fold = bb == 0; /* b one matrix: the batch dims are a's own */
    memcpy(shape, bshape, sizeof bshape);
    *ndim = nd;
    if (na > 1)
        shape[(*ndim)++] = m;
    if (nb > 1)
        shape[(*ndim)++] = n;
    return 0;
}

int ddp_op_matmul(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t *b, ddp_var_t **y)
{
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "matmul: NULL tape or output");
    DDP_TRY(ddp__op_check_var(tape, a, "matmul", "a"));
    DDP_TRY(ddp__op_check_var(tape, b, "matmul", "b"));
    mm_ctx c;
    int ndim = 0;
    int64_t shape[DDP_TENSOR_MAX_DIM];
    DDP_TRY(matmul_shapes(a, b, &c, &ndim, shape));
    ddp_var_t *v;
    DDP_TRY(ddp__op_push(tape, &matmul_def, ndim, shape, 1, a, b, NULL, &v));
    mm_ctx *saved = ddp__tape_alloc(tape, sizeof *saved);
    if (!saved)
        return DDP_ERR_NOMEM;
    *saved = c;
    v->ctx = saved;
    int m = c.m, k = c.k, n = c.n;
    if (c.fold) {
        ddp_sgemm(0, 0, m * (int)c.nbatch, n, k, 1.0f, a->t.data, k, b->t.data, n, 0.0f,
                  v->t.data, n);
    } else {
        for (int64_t i = 0; i < c.nbatch; i++)
            ddp_sgemm(0, 0, m, n, k, 1.0f, a->t.data + ddp__plan_offset(&c.batches, 0, i), k,
                      b->t.data + ddp__plan_offset(&c.batches, 1, i), n, 0.0f,
                      v->t.data + i * m * n, n);
    }
    *y = v;
    return 0;
}

/* Every batch's GEMM of one input's gradient: side 0 dA_i (m, k) = dY_i B_i^T,
 * side 1 dB_i (k, n) = A_i^T dY_i.  An input shared by several batches gets
 * their sum: it starts at 0 (or its previous value) and every GEMM adds. */
static void matmul_grad(const ddp_var_t *v, const mm_ctx *c, int side, float *dx, int acc)
{
    const ddp_var_t *a = v->in[0], *b = v->in[1], *x = v->in[side];
    int m = c->m, k = c->k, n = c->n;
    const float *dy = v->grad;
    if (c->fold) { /* rows = every batch */
        int rows = m * (int)c->nbatch;
        if (side == 0)
            ddp_sgemm(0, 1, rows, k, n, 1.0f, dy, n, b->t.data, n, acc ? 1.0f : 0.0f, dx, k);
        else
            ddp_sgemm(1, 0, k, n, rows, 1.0f, a->t.data, k, dy, n, acc ? 1.0f : 0.0f, dx, n);
        return;
    }
    int64_t per = side == 0 ? (int64_t)m * k : (int64_t)k * n;
    int shared = x->t.numel < c->nbatch * per;
    if (shared && !acc)
        memset(dx, 0, (size_t)x->t.numel * sizeof *dx);
    float beta = shared || acc ? 1.0f : 0.0f;
    for (int64_t i = 0; i < c->nbatch; i++) {
        const float *ai = a->t.data + ddp__plan_offset(&c->batches, 0, i);
        const float *bi = b->t.data + ddp__plan_offset(&c->batches, 1, i);
        float *di = dx + ddp__plan_offset(&c->batches, side, i);
        const float *dyi = dy + i * m * n;
        if (side == 0)
            ddp_sgemm(0, 1, m, k, n, 1.0f, dyi, n, bi, n, beta, di, k);
        else
            ddp_sgemm(1, 0, k, n, m, 1.0f, ai, k, dyi, n, beta, di, n);
    }
}

static int matmul_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    const mm_ctx *c = v->ctx;
    for (int side = 0; side < 2; side++) {
        if (!v->in[side]->requires_grad)
            continue;
        int acc;
        DDP_GRAD_TARGET(dx, v->in[side]);
        matmul_grad(v, c, side, dx, acc);
    }
    return 0;
}
