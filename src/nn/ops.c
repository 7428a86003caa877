/* Autograd ops: each forward appends one var to the tape and is followed by
 * its backward (llm.c's _forward/_backward pairs); each op's ddp__op_def
 * names its backward, which the tape calls.  The losses are in loss.c;
 * add and mul (broadcasting) are in ops_broadcast.c, matmul (batched) in
 * ops_matmul.c, the other tensor ops in ops_*.c (include/ddp/nn_ops.h).
 * Gradients are written on first contribution and added (+=) after that
 * (ddp__grad_target's acc flag), so no gradient buffer is ever cleared. */
#include <limits.h>
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "base/rng.h"
#include "nn/autograd.h"
#include "tensor/kernels.h"
#include "ddp/ext.h"
#include "nn/ops.h"

/* ==== helpers ============================================================= */

int ddp__op_check_var(const ddp_tape_t *tape, const ddp_var_t *v, const char *op,
                      const char *arg)
{
    DDP_FAIL_IF(!v, DDP_ERR_INVALID_ARG, "%s: %s is NULL", op, arg);
    DDP_FAIL_IF(!ddp__tape_has(tape, v), DDP_ERR_INVALID_ARG,
                "%s: %s is not a var of this tape (was the tape reset?)", op, arg);
    return 0;
}

int ddp__op_push_n(ddp_tape_t *tape, const ddp__op_def *def, int ndim, const int64_t *shape,
                   int alloc, int nin, ddp_var_t *const *in, ddp_var_t **out)
{
    DDP_FAIL_IF(nin < 0 || nin > DDP_VAR_MAX_IN, DDP_ERR_INVALID_ARG,
                "%s: %d inputs (at most %d)", def->name, nin, DDP_VAR_MAX_IN);
    ddp_var_t *v;
    DDP_TRY(ddp__tape_push(tape, def, ndim, shape, alloc, &v));
    if (nin > DDP__VAR_INLINE_IN) {
        v->in = ddp__tape_alloc(tape, (size_t)nin * sizeof *v->in);
        if (!v->in)
            return DDP_ERR_NOMEM;
    }
    for (int j = 0; j < nin; j++) {
        v->in[v->nin++] = in[j];
        v->requires_grad |= in[j]->requires_grad;
    }
    if (!tape->grad_enabled) /* torch.no_grad(): nothing to backpropagate */
        v->requires_grad = 0;
    *out = v;
    return 0;
}

int ddp__op_push(ddp_tape_t *tape, const ddp__op_def *def, int ndim, const int64_t *shape,
                 int alloc, ddp_var_t *a, ddp_var_t *b, ddp_var_t *c, ddp_var_t **out)
{
    ddp_var_t *ins[3], *given[3] = {a, b, c};
    int n = 0;
    for (int j = 0; j < 3; j++)
        if (given[j])
            ins[n++] = given[j];
    return ddp__op_push_n(tape, def, ndim, shape, alloc, n, ins, out);
}

/* ==== op definitions ====================================================== */

static int linear_backward(ddp_tape_t *tape, ddp_var_t *v);
static int scale_backward(ddp_tape_t *tape, ddp_var_t *v);
static int relu_backward(ddp_tape_t *tape, ddp_var_t *v);
static int sigmoid_backward(ddp_tape_t *tape, ddp_var_t *v);
static int tanh_backward(ddp_tape_t *tape, ddp_var_t *v);
static int dropout_backward(ddp_tape_t *tape, ddp_var_t *v);
static int sum_backward(ddp_tape_t *tape, ddp_var_t *v);
static int mean_backward(ddp_tape_t *tape, ddp_var_t *v);

static const ddp__op_def linear_def = {"linear", linear_backward, 0};
static const ddp__op_def scale_def = {"scale", scale_backward, 0};
static const ddp__op_def relu_def = {"relu", relu_backward, 0};
static const ddp__op_def sigmoid_def = {"sigmoid", sigmoid_backward, 0};
static const ddp__op_def tanh_def = {"tanh", tanh_backward, 0};
static const ddp__op_def dropout_def = {"dropout", dropout_backward, 0};
static const ddp__op_def sum_def = {"sum", sum_backward, 0};
static const ddp__op_def mean_def = {"mean", mean_backward, 0};
static const ddp__op_def reshape_def = {"reshape", NULL, DDP__OP_VIEW};

/* The single-input element-wise backward: da (the input's numel) from dy. */
typedef void (*unary_grad_fn)(float *da, const float *dy, const ddp_var_t *v, size_t n,
                              int acc);
static int unary_backward_with(ddp_tape_t *tape, ddp_var_t *v, unary_grad_fn fn)
{
    ddp_var_t *a = v->in[0];
    int acc;
    DDP_GRAD_TARGET(da, a);
    fn(da, v->grad, v, (size_t)a->t.numel, acc);
    return 0;
}

/* ==== ops: each forward, then its backward ================================ */

int ddp_op_linear(ddp_tape_t *tape, ddp_var_t *x, ddp_var_t *w, ddp_var_t *b, ddp_var_t **y)
{
    DDP_SHAPE_BUFS;
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "linear: NULL tape or output");
    DDP_TRY(ddp__op_check_var(tape, x, "linear", "input"));
    DDP_TRY(ddp__op_check_var(tape, w, "linear", "weight"));
    if (b)
        DDP_TRY(ddp__op_check_var(tape, b, "linear", "bias"));
    DDP_FAIL_IF(w->t.ndim != 2, DDP_ERR_INVALID_ARG,
                "linear: weight must be (out, in), got shape %s", DDP_SHAPE(w, 0));
    int64_t out = w->t.shape[0], in = w->t.shape[1];
    DDP_FAIL_IF(x->t.ndim < 1 || ddp__op_last_dim(x) != in, DDP_ERR_INVALID_ARG,
                "linear: input of shape %s does not match weight of shape %s (%lld input "
                "features)", DDP_SHAPE(x, 0), DDP_SHAPE(w, 1), (long long)in);
    DDP_FAIL_IF(b && (b->t.ndim != 1 || b->t.shape[0] != out), DDP_ERR_INVALID_ARG,
                "linear: bias of shape %s does not match weight of shape %s", DDP_SHAPE(b, 0),
                DDP_SHAPE(w, 1));
    int64_t rows = x->t.numel / in;
    DDP_FAIL_IF(rows > INT_MAX || in > INT_MAX || out > INT_MAX, DDP_ERR_UNSUPPORTED,
                "linear: input %s and weight %s exceed BLAS's int dimensions", DDP_SHAPE(x, 0),
                DDP_SHAPE(w, 1));
    int64_t shape[DDP_TENSOR_MAX_DIM];
    memcpy(shape, x->t.shape, sizeof shape);
    shape[x->t.ndim - 1] = out;
    ddp_var_t *v;
    DDP_TRY(ddp__op_push(tape, &linear_def, x->t.ndim, shape, 1, x, w, b, &v));
    /* (rows, out) = x (rows, in) W^T (in, out) + b: the bias is the GEMM's C. */
    if (b)
        ddp__rows_set(v->t.data, b->t.data, (size_t)rows, (size_t)out);
    ddp_sgemm(0, 1, (int)rows, (int)out, (int)in, 1.0f, x->t.data, (int)in, w->t.data, (int)in,
              b ? 1.0f : 0.0f, v->t.data, (int)out);
    *y = v;
    return 0;
}

/* The chunk hook that applies to weight w of linear op v, or NULL: w is a
 * parameter of the model being differentiated, this is its last reachable
 * use, and it is none of the op's other inputs (contract rule 7). */
static const ddp_grad_chunk_hook *chunk_hook_for(ddp_tape_t *tape, ddp_var_t *v, ddp_var_t *w)
{
    ddp_param *p = w->param;
    if (!p || !tape->bw_model || p->priv.model != tape->bw_model || p->priv.pending != 1)
        return NULL;
    for (int j = 0; j < v->nin; j++)
        if (j != 1 && v->in[j]->param == p)
            return NULL;
    return ddp_model_grad_chunk_hook(tape->bw_model);
}

/* dW (out, in) += dy^T x in row chunks (rule 7): boundaries on multiples of
 * DDP_GRAD_CHUNK_ROW_ALIGN so that each row is computed exactly as in the
 * whole GEMM (OpenBLAS's micro-kernels tile the output rows from the first;
 * an unaligned cut moves rows to other tile positions and changes their
 * last bits). */
int ddp_grad_chunk_bounds(int64_t rows, int nchunks, int64_t *bounds)
{
    int64_t units = (rows + DDP_GRAD_CHUNK_ROW_ALIGN - 1) / DDP_GRAD_CHUNK_ROW_ALIGN;
    int64_t n = nchunks < units ? nchunks : units;
    if (n < 1)
        n = 1;
    bounds[0] = 0;
    for (int64_t k = 1; k <= n; k++)
        bounds[k] = k == n ? rows : (units * k / n) * DDP_GRAD_CHUNK_ROW_ALIGN;
    return (int)n;
}

static int linear_dw_chunked(ddp_tape_t *tape, const ddp_grad_chunk_hook *h, ddp_param *p,
                             int nchunks, const float *dy, const float *x, float *dw, int out,
                             int in, int rows, int acc)
{
    if (nchunks > out) /* at most one chunk per row: bounds stays small */
        nchunks = out;
    int64_t *bounds = ddp__tape_alloc(tape, ((size_t)nchunks + 1) * sizeof *bounds);
    if (!bounds)
        return DDP_ERR_NOMEM;
    int n = ddp_grad_chunk_bounds(out, nchunks, bounds);
    for (int k = 0; k < n; k++) {
        int64_t r0 = bounds[k], r1 = bounds[k + 1];
        ddp_sgemm(1, 0, (int)(r1 - r0), in, rows, 1.0f, dy + r0, out, x, in, acc ? 1.0f : 0.0f,
                  dw + (size_t)r0 * (size_t)in, in);
        DDP_TRY(h->chunk(p, r0, r1, h->user));
    }
    return 0;
}

static int linear_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    ddp_var_t *x = v->in[0], *w = v->in[1], *b = v->nin > 2 ? v->in[2] : NULL;
    int out = (int)w->t.shape[0], in = (int)w->t.shape[1];
    int rows = (int)(x->t.numel / in);
    const float *dy = v->grad; /* (rows, out) */
    int acc;
    const ddp_grad_chunk_hook *h = w->requires_grad ? chunk_hook_for(tape, v, w) : NULL;
    if (b && b->requires_grad) {
        DDP_GRAD_TARGET(db, b); /* (out) */
        ddp__rows_sum_to(db, dy, (size_t)rows, (size_t)out, acc);
        if (h) /* final before dW is computed: report it now (rule 7) */
            DDP_TRY(ddp__tape_release(tape, v, 2));
    }
    int nchunks = h ? h->plan(w->param, out, h->user) : 0;
    if (nchunks < 0)
        return nchunks;
    if (w->requires_grad) {
        DDP_GRAD_TARGET(dw, w); /* (out, in) += dy^T x */
        if (nchunks > 1)
            DDP_TRY(linear_dw_chunked(tape, h, w->param, nchunks, dy, x->t.data, dw, out, in,
                                      rows, acc));
        else
            ddp_sgemm(1, 0, out, in, rows, 1.0f, dy, out, x->t.data, in, acc ? 1.0f : 0.0f,
                      dw, in);
    }
    if (x->requires_grad) {
        DDP_GRAD_TARGET(dx, x); /* (rows, in) += dy W */
        ddp_sgemm(0, 0, rows, in, out, 1.0f, dy, out, w->t.data, in, acc ? 1.0f : 0.0f, dx, in);
    }
    return 0;
}

int ddp_op_scale(ddp_tape_t *tape, ddp_var_t *a, float s, ddp_var_t **y)
{
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "scale: NULL tape or output");
    DDP_TRY(ddp__op_check_var(tape, a, "scale", "input"));
    ddp_var_t *v;
    DDP_TRY(ddp__op_push(tape, &scale_def, a->t.ndim, a->t.shape, 1, a, NULL, NULL, &v));
    v->f = s;
    ddp__vec_scale_to(v->t.data, s, a->t.data, (size_t)a->t.numel, 0);
    *y = v;
    return 0;
}

static void scale_grad(float *da, const float *dy, const ddp_var_t *v, size_t n, int acc)
{
    ddp__vec_scale_to(da, v->f, dy, n, acc);
}

int ddp_op_relu(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y)
{
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "relu: NULL tape or output");
    DDP_TRY(ddp__op_check_var(tape, a, "relu", "input"));
    ddp_var_t *v;
    DDP_TRY(ddp__op_push(tape, &relu_def, a->t.ndim, a->t.shape, 1, a, NULL, NULL, &v));
    ddp__vec_relu(v->t.data, a->t.data, (size_t)a->t.numel);
    *y = v;
    return 0;
}

static void relu_grad(float *da, const float *dy, const ddp_var_t *v, size_t n, int acc)
{
    ddp__vec_relu_backward_to(da, dy, v->t.data, n, acc);
}

static int unary_op(ddp_tape_t *tape, ddp_var_t *a, const ddp__op_def *op, const char *name,
                    ddp_var_t **y)
{
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "%s: NULL tape or output", name);
    DDP_TRY(ddp__op_check_var(tape, a, name, "input"));
    ddp_var_t *v;
    DDP_TRY(ddp__op_push(tape, op, a->t.ndim, a->t.shape, 1, a, NULL, NULL, &v));
    const float *x = a->t.data;
    float *o = v->t.data;
    size_t n = (size_t)a->t.numel;
    if (op == &sigmoid_def)
        for (size_t i = 0; i < n; i++)
            o[i] = 1.0f / (1.0f + expf(-x[i]));
    else
        for (size_t i = 0; i < n; i++)
            o[i] = tanhf(x[i]);
    *y = v;
    return 0;
}

int ddp_op_sigmoid(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y)
{
    return unary_op(tape, a, &sigmoid_def, "sigmoid", y);
}

int ddp_op_tanh(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y)
{
    return unary_op(tape, a, &tanh_def, "tanh", y);
}

/* sigmoid: dy * y (1 - y); tanh: dy * (1 - y^2) */
static void sigmoid_tanh_grad(float *da, const float *dy, const ddp_var_t *v, size_t n, int acc)
{
    for (size_t i = 0; i < n; i++) {
        float yi = v->t.data[i];
        float g = dy[i] * (v->def == &sigmoid_def ? yi * (1.0f - yi) : 1.0f - yi * yi);
        da[i] = acc ? da[i] + g : g;
    }
}

int ddp_op_dropout(ddp_tape_t *tape, ddp_var_t *x, float p, int training, uint64_t seed,
                   ddp_var_t **y)
{
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "dropout: NULL tape or output");
    DDP_TRY(ddp__op_check_var(tape, x, "dropout", "input"));
    DDP_FAIL_IF(!(p >= 0.0f && p <= 1.0f), DDP_ERR_INVALID_ARG,
                "dropout: probability %g is not in [0, 1]", (double)p);
    if (!training || p == 0.0f) {
        *y = x;
        return 0;
    }
    ddp_var_t *v;
    DDP_TRY(ddp__op_push(tape, &dropout_def, x->t.ndim, x->t.shape, 1, x, NULL, NULL, &v));
    size_t n = (size_t)x->t.numel;
    v->aux = ddp__tape_alloc(tape, n * sizeof(float));
    if (!v->aux)
        return DDP_ERR_NOMEM;
    ddp__rng rng;
    ddp__rng_seed(&rng, seed);
    float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    ddp__rng_keep_mask(&rng, v->aux, n, (double)p, keep_scale);
    ddp__vec_mul_to(v->t.data, x->t.data, v->aux, n, 0);
    *y = v;
    return 0;
}

static void dropout_grad(float *da, const float *dy, const ddp_var_t *v, size_t n, int acc)
{
    ddp__vec_mul_to(da, dy, v->aux, n, acc);
}

static int reduce_op(ddp_tape_t *tape, ddp_var_t *a, const ddp__op_def *op, const char *name,
                     ddp_var_t **y)
{
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "%s: NULL tape or output", name);
    DDP_TRY(ddp__op_check_var(tape, a, name, "input"));
    ddp_var_t *v;
    DDP_TRY(ddp__op_push(tape, op, 0, NULL, 1, a, NULL, NULL, &v));
    double s = ddp__vec_sum(a->t.data, (size_t)a->t.numel);
    v->t.data[0] = (float)(op == &mean_def ? s / (double)a->t.numel : s);
    *y = v;
    return 0;
}

int ddp_op_sum(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y)
{
    return reduce_op(tape, a, &sum_def, "sum", y);
}

int ddp_op_mean(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y)
{
    return reduce_op(tape, a, &mean_def, "mean", y);
}

static void reduce_grad(float *da, const float *dy, const ddp_var_t *v, size_t n, int acc)
{
    if (v->def == &sum_def)
        ddp__vec_fill_to(da, dy[0], n, acc);
    else /* mean */
        ddp__vec_fill_to(da, dy[0] / (float)n, n, acc);
}

int ddp_op_reshape(ddp_tape_t *tape, ddp_var_t *a, int ndim, const int64_t *shape,
                   ddp_var_t **y)
{
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "reshape: NULL tape or output");
    DDP_TRY(ddp__op_check_var(tape, a, "reshape", "input"));
    ddp_tensor view;
    DDP_TRY(ddp_tensor_view(&a->t, ndim, shape, &view));
    ddp_var_t *v;
    DDP_TRY(ddp__op_push(tape, &reshape_def, view.ndim, view.shape, 0, a, NULL, NULL, &v));
    v->t.data = a->t.data; /* a view: no copy */
    *y = v;
    return 0;
}

int ddp_op_flatten(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y)
{
    DDP_SHAPE_BUFS;
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "flatten: NULL tape or output");
    DDP_TRY(ddp__op_check_var(tape, a, "flatten", "input"));
    DDP_FAIL_IF(a->t.ndim < 1, DDP_ERR_INVALID_ARG,
                "flatten: input of shape %s has no batch dimension", DDP_SHAPE(a, 0));
    if (a->t.ndim == 2) {
        *y = a; /* already (B, features) */
        return 0;
    }
    return ddp_op_reshape(tape, a, 2, (int64_t[]){a->t.shape[0], -1}, y);
}

/* ==== single-input backwards ============================================== */

static int scale_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    return unary_backward_with(tape, v, scale_grad);
}
static int relu_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    return unary_backward_with(tape, v, relu_grad);
}
static int sigmoid_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    return unary_backward_with(tape, v, sigmoid_tanh_grad);
}
static int tanh_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    return unary_backward_with(tape, v, sigmoid_tanh_grad);
}
static int dropout_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    return unary_backward_with(tape, v, dropout_grad);
}
static int sum_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    return unary_backward_with(tape, v, reduce_grad);
}
static int mean_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    return unary_backward_with(tape, v, reduce_grad);
}
