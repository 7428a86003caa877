/* Broadcasting, NumPy's and PyTorch's rule, and the strided loop plan it is
 * written with; then the broadcasting binary ops add, sub, mul, div.
 *
 * Tensors are contiguous, so a broadcast input is read through strides that
 * are 0 along the dims it is broadcast along, and its gradient is the
 * output's gradient summed back along them (the same strided walk, adding).
 * The plan (ops_internal.h) also serves permute, slice, cat and the
 * reductions over dims: each is a walk over one contiguous shape with an
 * operand seen through other strides. */
#include <string.h>

#include "base/error.h"
#include "nn/ops_internal.h"
#include "tensor/kernels.h"

/* ==== dims ================================================================ */

int ddp__op_dim(const char *op, const ddp_var_t *a, int dim, int ndim, int *out)
{
    DDP_SHAPE_BUFS;
    DDP_FAIL_IF(dim < -ndim || dim >= ndim || ndim == 0, DDP_ERR_INVALID_ARG,
                "%s: dim %d is out of range for shape %s (dims -%d..%d)", op, dim,
                DDP_SHAPE(a, 0), ndim, ndim - 1);
    *out = dim < 0 ? dim + ndim : dim;
    return 0;
}

int ddp__op_reduce_dims(const char *op, const ddp_var_t *a, int ndims, const int *dims,
                        int *reduce)
{
    DDP_SHAPE_BUFS;
    DDP_FAIL_IF(ndims < 0 || ndims > a->t.ndim || (ndims > 0 && !dims), DDP_ERR_INVALID_ARG,
                "%s: %d dims for shape %s", op, ndims, DDP_SHAPE(a, 0));
    for (int d = 0; d < DDP_TENSOR_MAX_DIM; d++)
        reduce[d] = ndims == 0 && d < a->t.ndim; /* none given: all */
    for (int i = 0; i < ndims; i++) {
        int d;
        DDP_TRY(ddp__op_dim(op, a, dims[i], a->t.ndim, &d));
        DDP_FAIL_IF(reduce[d], DDP_ERR_INVALID_ARG, "%s: dim %d appears twice in the dim list",
                    op, d);
        reduce[d] = 1;
    }
    return 0;
}

/* ==== the plan ============================================================ */

void ddp__plan_init(ddp__plan *p, int ndim, const int64_t *shape, int nops,
                    const int64_t *const *st)
{
    int64_t contig[DDP_TENSOR_MAX_DIM];
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        contig[d] = s;
        s *= shape[d];
    }
    memset(p, 0, sizeof *p);
    int n = 0;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 1) /* walked once: its stride never matters */
            continue;
        int merge = n > 0;
        for (int k = 0; k < nops && merge; k++) {
            const int64_t *sk = st[k] ? st[k] : contig;
            merge = p->stride[k][n - 1] == sk[d] * shape[d];
        }
        if (!merge)
            n++;
        p->shape[n - 1] = merge ? p->shape[n - 1] * shape[d] : shape[d];
        for (int k = 0; k < nops; k++)
            p->stride[k][n - 1] = st[k] ? st[k][d] : contig[d];
    }
    if (n == 0) /* one element */
        p->shape[n++] = 1;
    p->ndim = n;
    p->cols = p->shape[n - 1];
    p->rows = 1;
    for (int d = 0; d < n - 1; d++)
        p->rows *= p->shape[d];
}

int64_t ddp__plan_row(const ddp__plan *p, int k, int64_t r)
{
    int64_t off = 0;
    for (int d = p->ndim - 2; d >= 0 && r > 0; d--) {
        off += r % p->shape[d] * p->stride[k][d];
        r /= p->shape[d];
    }
    return off;
}

int64_t ddp__plan_offset(const ddp__plan *p, int k, int64_t i)
{
    return ddp__plan_row(p, k, i / p->cols) + i % p->cols * p->stride[k][p->ndim - 1];
}

void ddp__plan_gather(const ddp__plan *p, int k, float *y, const float *x, float scale, int acc)
{
    int64_t s = p->stride[k][p->ndim - 1], cols = p->cols;
    for (int64_t r = 0; r < p->rows; r++) {
        const float *xr = x + ddp__plan_row(p, k, r);
        float *yr = y + r * cols;
        if (acc)
            for (int64_t c = 0; c < cols; c++)
                yr[c] += scale * xr[c * s];
        else
            for (int64_t c = 0; c < cols; c++)
                yr[c] = scale * xr[c * s];
    }
}

void ddp__plan_scatter(const ddp__plan *p, int k, float *x, const float *y, float scale,
                       int add)
{
    int64_t s = p->stride[k][p->ndim - 1], cols = p->cols;
    for (int64_t r = 0; r < p->rows; r++) {
        float *xr = x + ddp__plan_row(p, k, r);
        const float *yr = y + r * cols;
        if (add)
            for (int64_t c = 0; c < cols; c++)
                xr[c * s] += scale * yr[c];
        else
            for (int64_t c = 0; c < cols; c++)
                xr[c * s] = scale * yr[c];
    }
}

/* ==== broadcasting ======================================================== */

void ddp__bcast_strides(const ddp_tensor *t, int ndim, const int64_t *shape, int64_t *stride)
{
    int lead = ndim - t->ndim; /* t's dims align with the last of shape */
    for (int d = 0; d < ndim; d++) {
        int td = d - lead;
        stride[d] = td < 0 || (t->shape[td] == 1 && shape[d] != 1) ? 0 : t->stride[td];
    }
}

int ddp__bcast_dims(int na, const int64_t *sa, int nb, const int64_t *sb, int *n, int64_t *out)
{
    int nd = na > nb ? na : nb;
    for (int d = nd - 1; d >= 0; d--) {
        int ia = d - (nd - na), ib = d - (nd - nb);
        int64_t x = ia >= 0 ? sa[ia] : 1, y = ib >= 0 ? sb[ib] : 1;
        if (x != y && x != 1 && y != 1)
            return -1 - d;
        out[d] = x == 1 ? y : x;
    }
    *n = nd;
    return 0;
}

int ddp__bcast_shape(const char *op, const ddp_var_t *a, const ddp_var_t *b, int *ndim,
                     int64_t *shape)
{
    DDP_SHAPE_BUFS;
    int bad = ddp__bcast_dims(a->t.ndim, a->t.shape, b->t.ndim, b->t.shape, ndim, shape);
    DDP_FAIL_IF(bad < 0, DDP_ERR_INVALID_ARG, "%s: shapes %s and %s do not broadcast (aligned "
                "at the last dim, sizes must be equal or 1)", op, DDP_SHAPE(a, 0),
                DDP_SHAPE(b, 1));
    return 0;
}

void ddp__bcast_reduce_to(const ddp__plan *p, int k, float *dx, size_t nx, const float *dy,
                          float scale, int acc)
{
    if (!acc) /* several walk elements may land on one of dx's: sum from 0 */
        memset(dx, 0, nx * sizeof *dx);
    ddp__plan_scatter(p, k, dx, dy, scale, 1);
}

/* ==== add, sub, mul, div ================================================== */

enum { BIN_ADD, BIN_SUB, BIN_MUL, BIN_DIV };

typedef struct binary_def {
    ddp__op_def def; /* first: v->def leads back here */
    int kind;
} binary_def;

static int binary_backward(ddp_tape_t *tape, ddp_var_t *v);

static const binary_def add_def = {{"add", binary_backward, 0}, BIN_ADD};
static const binary_def sub_def = {{"sub", binary_backward, 0}, BIN_SUB};
static const binary_def mul_def = {{"mul", binary_backward, 0}, BIN_MUL};
static const binary_def div_def = {{"div", binary_backward, 0}, BIN_DIV};

/* y (cols) = x (stride sx) op z (stride sz) */
static void binary_row(int kind, float *y, const float *x, int64_t sx, const float *z,
                       int64_t sz, int64_t cols)
{
    switch (kind) {
    case BIN_ADD:
        for (int64_t c = 0; c < cols; c++)
            y[c] = x[c * sx] + z[c * sz];
        break;
    case BIN_SUB:
        for (int64_t c = 0; c < cols; c++)
            y[c] = x[c * sx] - z[c * sz];
        break;
    case BIN_MUL:
        for (int64_t c = 0; c < cols; c++)
            y[c] = x[c * sx] * z[c * sz];
        break;
    default:
        for (int64_t c = 0; c < cols; c++)
            y[c] = x[c * sx] / z[c * sz];
        break;
    }
}

/* The plan of v = a op b: the walk is v's shape, operands a (0) and b (1). */
static void binary_plan(const ddp_var_t *v, ddp__plan *p)
{
    const ddp_var_t *a = v->in[0], *b = v->in[1];
    int64_t sa[DDP_TENSOR_MAX_DIM], sb[DDP_TENSOR_MAX_DIM];
    ddp__bcast_strides(&a->t, v->t.ndim, v->t.shape, sa);
    ddp__bcast_strides(&b->t, v->t.ndim, v->t.shape, sb);
    ddp__plan_init(p, v->t.ndim, v->t.shape, 2, (const int64_t *const[]){sa, sb});
}

static void binary_forward(int kind, ddp_var_t *v)
{
    const ddp_var_t *a = v->in[0], *b = v->in[1];
    size_t n = (size_t)v->t.numel;
    if (kind == BIN_ADD && a->t.numel == v->t.numel && b->t.numel == v->t.numel) {
        ddp__vec_add(v->t.data, a->t.data, b->t.data, n); /* same shape */
        return;
    }
    if (kind == BIN_MUL && a->t.numel == v->t.numel && b->t.numel == v->t.numel) {
        ddp__vec_mul_to(v->t.data, a->t.data, b->t.data, n, 0);
        return;
    }
    if (kind == BIN_ADD && a->t.numel == v->t.numel && b->t.ndim == 1 && a->t.ndim >= 1 &&
        b->t.shape[0] == a->t.shape[a->t.ndim - 1]) { /* a bias row: linear's kernel */
        ddp__rows_add(v->t.data, a->t.data, b->t.data, n / (size_t)b->t.numel,
                      (size_t)b->t.numel);
        return;
    }
    ddp__plan p;
    binary_plan(v, &p);
    int64_t s0 = p.stride[0][p.ndim - 1], s1 = p.stride[1][p.ndim - 1];
    for (int64_t r = 0; r < p.rows; r++)
        binary_row(kind, v->t.data + r * p.cols, a->t.data + ddp__plan_row(&p, 0, r), s0,
                   b->t.data + ddp__plan_row(&p, 1, r), s1, p.cols);
}

static int binary_op(ddp_tape_t *tape, const binary_def *k, ddp_var_t *a, ddp_var_t *b,
                     ddp_var_t **y)
{
    const char *name = k->def.name;
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "%s: NULL tape or output", name);
    DDP_TRY(ddp__op_check_var(tape, a, name, "a"));
    DDP_TRY(ddp__op_check_var(tape, b, name, "b"));
    int ndim;
    int64_t shape[DDP_TENSOR_MAX_DIM];
    DDP_TRY(ddp__bcast_shape(name, a, b, &ndim, shape));
    ddp_var_t *v;
    DDP_TRY(ddp__op_push(tape, &k->def, ndim, shape, 1, a, b, NULL, &v));
    binary_forward(k->kind, v);
    *y = v;
    return 0;
}

int ddp_op_add(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t *b, ddp_var_t **y)
{
    return binary_op(tape, &add_def, a, b, y);
}

int ddp_op_sub(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t *b, ddp_var_t **y)
{
    return binary_op(tape, &sub_def, a, b, y);
}

int ddp_op_mul(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t *b, ddp_var_t **y)
{
    return binary_op(tape, &mul_def, a, b, y);
}

int ddp_op_div(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t *b, ddp_var_t **y)
{
    return binary_op(tape, &div_def, a, b, y);
}

/* g (the walk) = dy * d(a op b)/d(side) for mul and div. */
static void binary_local_grad(int kind, int side, const ddp_var_t *v, const ddp__plan *p,
                              float *g)
{
    const ddp_var_t *a = v->in[0], *b = v->in[1];
    const float *dy = v->grad;
    size_t n = (size_t)v->t.numel;
    if (kind == BIN_MUL) { /* d/da = b, d/db = a */
        ddp__plan_gather(p, 1 - side, g, (side ? a : b)->t.data, 1.0f, 0);
        for (size_t i = 0; i < n; i++)
            g[i] *= dy[i];
        return;
    }
    ddp__plan_gather(p, 1, g, b->t.data, 1.0f, 0); /* g = b, broadcast */
    if (side == 0) /* d/da = 1 / b */
        for (size_t i = 0; i < n; i++)
            g[i] = dy[i] / g[i];
    else /* d/db = -a / b^2 = -y / b */
        for (size_t i = 0; i < n; i++)
            g[i] = -dy[i] * v->t.data[i] / g[i];
}

static int binary_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    int kind = ((const binary_def *)v->def)->kind;
    ddp__plan p;
    binary_plan(v, &p);
    float *g = NULL;
    for (int side = 0; side < 2; side++) {
        ddp_var_t *x = v->in[side];
        if (!x->requires_grad)
            continue;
        int acc;
        DDP_GRAD_TARGET(dx, x);
        if (kind == BIN_ADD || kind == BIN_SUB) {
            float sign = kind == BIN_SUB && side == 1 ? -1.0f : 1.0f;
            if (x->t.numel == v->t.numel) /* not broadcast: the gradient as is */
                ddp__vec_scale_to(dx, sign, v->grad, (size_t)x->t.numel, acc);
            else
                ddp__bcast_reduce_to(&p, side, dx, (size_t)x->t.numel, v->grad, sign, acc);
            continue;
        }
        if (!g && !(g = ddp__tape_alloc(tape, (size_t)v->t.numel * sizeof *g)))
            return DDP_ERR_NOMEM;
        binary_local_grad(kind, side, v, &p, g);
        ddp__bcast_reduce_to(&p, side, dx, (size_t)x->t.numel, g, 1.0f, acc);
    }
    return 0;
}
