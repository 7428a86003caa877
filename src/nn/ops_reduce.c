/* Reductions over dims: sum, mean and var over a dim list (keepdim or
 * not), max and argmax along one dim.
 *
 * sum/mean/var walk the input once (ops_broadcast.c's plan) with the output
 * seen through strides that are 0 along the reduced dims: the forward of a
 * reduction is the backward of a broadcast, and its backward a broadcast
 * (the same walk, gathering).  var is torch.var's two passes: the mean,
 * then the squared deviations, divided by N - 1 (unbiased) or N.
 *
 * max along a dim follows torch 1.13 on the CPU: the value and index of the
 * FIRST maximum (a nan counts as the maximum, the first nan wins), and the
 * gradient goes to that one element only.  (torch.max() without a dim and
 * torch.amax spread a tie's gradient evenly instead; not here.) */
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "nn/ops_internal.h"

typedef struct reduce_ctx {
    ddp__plan p;    /* walk: the input; operand 0: the output, 0 along reduced dims */
    float scale;    /* sum 1, mean 1/N, var 1/(N - correction) */
    float *mean;    /* var: the mean, one per output element */
} reduce_ctx;

static int sum_backward(ddp_tape_t *tape, ddp_var_t *v);
static int var_backward(ddp_tape_t *tape, ddp_var_t *v);
static const ddp__op_def sum_def = {"sum", sum_backward, 0};
static const ddp__op_def mean_def = {"mean", sum_backward, 0};
static const ddp__op_def var_def = {"var", var_backward, 0};

/* Pushes the output of reducing a over dims (ctx with the plan; data zero). */
static int reduce_push(ddp_tape_t *tape, const ddp__op_def *def, ddp_var_t *a, int ndims,
                       const int *dims, int keepdim, ddp_var_t **out, reduce_ctx **ctx)
{
    const char *op = def->name;
    DDP_FAIL_IF(!tape || !out, DDP_ERR_INVALID_ARG, "%s: NULL tape or output", op);
    DDP_TRY(ddp__op_check_var(tape, a, op, "input"));
    int reduce[DDP_TENSOR_MAX_DIM];
    DDP_TRY(ddp__op_reduce_dims(op, a, ndims, dims, reduce));
    int64_t kept[DDP_TENSOR_MAX_DIM], shape[DDP_TENSOR_MAX_DIM], st[DDP_TENSOR_MAX_DIM];
    int nd = 0;
    for (int d = 0; d < a->t.ndim; d++) {
        kept[d] = reduce[d] ? 1 : a->t.shape[d];
        if (keepdim || !reduce[d])
            shape[nd++] = kept[d];
    }
    int64_t s = 1; /* the output's strides in the kept layout, 0 where reduced */
    for (int d = a->t.ndim - 1; d >= 0; d--) {
        st[d] = reduce[d] ? 0 : s;
        s *= kept[d];
    }
    ddp_var_t *v;
    DDP_TRY(ddp__op_push(tape, def, nd, shape, 1, a, NULL, NULL, &v));
    reduce_ctx *c = ddp__tape_alloc(tape, sizeof *c);
    if (!c)
        return DDP_ERR_NOMEM;
    memset(c, 0, sizeof *c);
    ddp__plan_init(&c->p, a->t.ndim, a->t.shape, 1, (const int64_t *const[]){st});
    v->ctx = c;
    *out = v;
    *ctx = c;
    return 0;
}

/* out (n) = scale * the sums of x (the walk of p) over the reduced dims, or
 * with mean of its squared deviations from mean (n floats), accumulated in
 * double: a float running sum along a long dim would lose about one ulp
 * per term (torch sums float in cascades for the same reason). */
static int sum_lines(ddp_tape_t *tape, const ddp__plan *p, const float *x, const float *mean,
                     float scale, float *out, size_t n)
{
    double *acc = ddp__tape_alloc(tape, n * sizeof *acc);
    if (!acc)
        return DDP_ERR_NOMEM;
    memset(acc, 0, n * sizeof *acc);
    int64_t s = p->stride[0][p->ndim - 1];
    for (int64_t r = 0; r < p->rows; r++) {
        int64_t o = ddp__plan_row(p, 0, r);
        const float *xr = x + r * p->cols;
        if (mean)
            for (int64_t j = 0; j < p->cols; j++) {
                double dev = (double)xr[j] - mean[o + j * s];
                acc[o + j * s] += dev * dev;
            }
        else
            for (int64_t j = 0; j < p->cols; j++)
                acc[o + j * s] += xr[j];
    }
    for (size_t i = 0; i < n; i++)
        out[i] = (float)(acc[i] * scale);
    return 0;
}

static int sum_mean(ddp_tape_t *tape, const ddp__op_def *def, ddp_var_t *a, int ndims,
                    const int *dims, int keepdim, ddp_var_t **y)
{
    ddp_var_t *v;
    reduce_ctx *c;
    DDP_TRY(reduce_push(tape, def, a, ndims, dims, keepdim, &v, &c));
    c->scale = def == &mean_def ? (float)((double)v->t.numel / (double)a->t.numel) : 1.0f;
    DDP_TRY(sum_lines(tape, &c->p, a->t.data, NULL, c->scale, v->t.data, (size_t)v->t.numel));
    *y = v;
    return 0;
}

int ddp_op_sum_dims(ddp_tape_t *tape, ddp_var_t *a, int ndims, const int *dims, int keepdim,
                    ddp_var_t **y)
{
    return sum_mean(tape, &sum_def, a, ndims, dims, keepdim, y);
}

int ddp_op_mean_dims(ddp_tape_t *tape, ddp_var_t *a, int ndims, const int *dims, int keepdim,
                     ddp_var_t **y)
{
    return sum_mean(tape, &mean_def, a, ndims, dims, keepdim, y);
}

/* sum and mean: da = scale * dy, broadcast back over the reduced dims. */
static int sum_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    const reduce_ctx *c = v->ctx;
    int acc;
    DDP_GRAD_TARGET(da, v->in[0]);
    ddp__plan_gather(&c->p, 0, da, v->grad, c->scale, acc);
    return 0;
}

int ddp_op_var(ddp_tape_t *tape, ddp_var_t *a, int ndims, const int *dims, int unbiased,
               int keepdim, ddp_var_t **y)
{
    ddp_var_t *v;
    reduce_ctx *c;
    DDP_TRY(reduce_push(tape, &var_def, a, ndims, dims, keepdim, &v, &c));
    size_t n = (size_t)v->t.numel;
    double count = (double)a->t.numel / (double)n;
    c->mean = ddp__tape_alloc(tape, n * sizeof *c->mean);
    if (!c->mean)
        return DDP_ERR_NOMEM;
    DDP_TRY(sum_lines(tape, &c->p, a->t.data, NULL, (float)(1.0 / count), c->mean, n));
    /* N - 1 == 0 makes 1/0 = inf, and 0 * inf = nan: torch's answer */
    c->scale = (float)(1.0 / (count - (unbiased ? 1.0 : 0.0)));
    DDP_TRY(sum_lines(tape, &c->p, a->t.data, c->mean, c->scale, v->t.data, n));
    *y = v;
    return 0;
}

/* dx = dy * 2 (x - mean) / (N - correction) */
static int var_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    const reduce_ctx *c = v->ctx;
    const ddp__plan *p = &c->p;
    const ddp_var_t *a = v->in[0];
    int acc;
    DDP_GRAD_TARGET(da, v->in[0]);
    int64_t s = p->stride[0][p->ndim - 1];
    float k = 2.0f * c->scale;
    for (int64_t r = 0; r < p->rows; r++) {
        int64_t o = ddp__plan_row(p, 0, r);
        const float *x = a->t.data + r * p->cols;
        float *dx = da + r * p->cols;
        for (int64_t j = 0; j < p->cols; j++) {
            float g = k * v->grad[o + j * s] * (x[j] - c->mean[o + j * s]);
            dx[j] = acc ? dx[j] + g : g;
        }
    }
    return 0;
}

/* ==== max and argmax along one dim ======================================== */

static int max_backward(ddp_tape_t *tape, ddp_var_t *v);
static const ddp__op_def max_def = {"max", max_backward, 0};
static const ddp__op_def argmax_def = {"argmax", NULL, 0};

/* a seen as (outer, n, inner) around dim d. */
typedef struct along {
    int64_t outer, n, inner;
} along;

/* The first maximum of each (outer, inner) line: value and index. */
static void max_along(const float *x, along g, float *val, int64_t *idx)
{
    for (int64_t o = 0; o < g.outer; o++)
        for (int64_t i = 0; i < g.inner; i++) {
            const float *line = x + o * g.n * g.inner + i;
            float best = line[0];
            int64_t at = 0;
            for (int64_t j = 1; j < g.n && !isnan(best); j++) {
                float e = line[j * g.inner];
                if (e > best || isnan(e))
                    best = e, at = j;
            }
            val[o * g.inner + i] = best;
            idx[o * g.inner + i] = at;
        }
}

/* Checks, pushes y (a without dim d, or with it as 1) and fills g. */
static int along_push(ddp_tape_t *tape, const ddp__op_def *def, ddp_var_t *a, int dim,
                      int keepdim, along *g, ddp_var_t **out)
{
    const char *op = def->name;
    DDP_FAIL_IF(!tape || !out, DDP_ERR_INVALID_ARG, "%s: NULL tape or output", op);
    DDP_TRY(ddp__op_check_var(tape, a, op, "input"));
    int d;
    DDP_TRY(ddp__op_dim(op, a, dim, a->t.ndim, &d));
    int64_t shape[DDP_TENSOR_MAX_DIM];
    int nd = 0;
    *g = (along){1, a->t.shape[d], 1};
    for (int i = 0; i < a->t.ndim; i++) {
        if (i < d)
            g->outer *= a->t.shape[i];
        if (i > d)
            g->inner *= a->t.shape[i];
        if (i != d || keepdim)
            shape[nd++] = i == d ? 1 : a->t.shape[i];
    }
    return ddp__op_push(tape, def, nd, shape, 1, a, NULL, NULL, out);
}

typedef struct max_ctx {
    along g;
    int64_t *idx;
} max_ctx;

int ddp_op_max(ddp_tape_t *tape, ddp_var_t *a, int dim, int keepdim, ddp_var_t **y)
{
    along g;
    ddp_var_t *v;
    DDP_TRY(along_push(tape, &max_def, a, dim, keepdim, &g, &v));
    max_ctx *c = ddp__tape_alloc(tape, sizeof *c);
    int64_t *idx = ddp__tape_alloc(tape, (size_t)v->t.numel * sizeof *idx);
    if (!c || !idx)
        return DDP_ERR_NOMEM;
    c->g = g;
    c->idx = idx;
    v->ctx = c;
    max_along(a->t.data, g, v->t.data, idx);
    *y = v;
    return 0;
}

/* The gradient goes to the arg max of each line; the rest gets 0. */
static int max_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    const max_ctx *c = v->ctx;
    ddp_var_t *a = v->in[0];
    int acc;
    DDP_GRAD_TARGET(da, a);
    if (!acc)
        memset(da, 0, (size_t)a->t.numel * sizeof *da);
    along g = c->g;
    for (int64_t o = 0; o < g.outer; o++)
        for (int64_t i = 0; i < g.inner; i++) {
            int64_t k = o * g.inner + i;
            da[(o * g.n + c->idx[k]) * g.inner + i] += v->grad[k];
        }
    return 0;
}

int ddp_op_argmax(ddp_tape_t *tape, ddp_var_t *a, int dim, int keepdim, int64_t *indices,
                  ddp_var_t **y)
{
    along g;
    ddp_var_t *v;
    DDP_TRY(along_push(tape, &argmax_def, a, dim, keepdim, &g, &v));
    v->requires_grad = 0; /* an index has no gradient */
    size_t n = (size_t)v->t.numel;
    int64_t *idx = indices ? indices : ddp__tape_alloc(tape, n * sizeof *idx);
    float *val = ddp__tape_alloc(tape, n * sizeof *val);
    if (!idx || !val)
        return DDP_ERR_NOMEM;
    max_along(a->t.data, g, val, idx);
    for (size_t i = 0; i < n; i++)
        v->t.data[i] = (float)idx[i];
    *y = v;
    return 0;
}
