/* Shape ops: permute/transpose, slice/narrow, expand, contiguous, cat and
 * stack.
 *
 * Views and copies.  A ddp_tensor is contiguous row-major, so an op can
 * share its input's storage only when its result is one contiguous block of
 * it: reshape/flatten (ops.c) and a slice with step 1 whose leading dims
 * are all 1 (along dim 0, say) are views (DDP__OP_VIEW at an element
 * offset: no copy forward, and the gradient is written straight into the
 * input's).  Everything else here is a copy: one strided walk (the plan of
 * ops_broadcast.c) gathers the result, and backward scatters the gradient
 * back through the same walk.  Without in-place ops the values and the
 * gradients are PyTorch's either way; only the cost differs.
 * `contiguous` has nothing to do: every var already is. */
#include <string.h>

#include "base/error.h"
#include "nn/ops_internal.h"

/* ==== strided gathers: permute, slice (copy), expand ====================== */

/* y = the walk of p over in[0]'s data from element base; a bijective walk
 * (permute) visits every input element once, so its backward writes. */
typedef struct gather_ctx {
    ddp__plan p;
    int64_t base;
    int bijective;
} gather_ctx;

static int gather_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    const gather_ctx *c = v->ctx;
    ddp_var_t *a = v->in[0];
    int acc;
    DDP_GRAD_TARGET(da, a);
    if (!c->bijective && !acc) /* parts of a get nothing, or several terms */
        memset(da, 0, (size_t)a->t.numel * sizeof *da);
    ddp__plan_scatter(&c->p, 0, da + c->base, v->grad, 1.0f, acc || !c->bijective);
    return 0;
}

static const ddp__op_def permute_def = {"permute", gather_backward, 0};
static const ddp__op_def slice_def = {"slice", gather_backward, 0};
static const ddp__op_def slice_view_def = {"slice", NULL, DDP__OP_VIEW};
static const ddp__op_def expand_def = {"expand", gather_backward, 0};

/* Pushes y of shape (ndim, shape) = a read through strides st from base. */
static int gather_op(ddp_tape_t *tape, const ddp__op_def *def, ddp_var_t *a, int ndim,
                     const int64_t *shape, const int64_t *st, int64_t base, int bijective,
                     ddp_var_t **y)
{
    ddp_var_t *v;
    DDP_TRY(ddp__op_push(tape, def, ndim, shape, 1, a, NULL, NULL, &v));
    gather_ctx *c = ddp__tape_alloc(tape, sizeof *c);
    if (!c)
        return DDP_ERR_NOMEM;
    ddp__plan_init(&c->p, ndim, shape, 1, (const int64_t *const[]){st});
    c->base = base;
    c->bijective = bijective;
    v->ctx = c;
    ddp__plan_gather(&c->p, 0, v->t.data, a->t.data + base, 1.0f, 0);
    *y = v;
    return 0;
}

static int check_args(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y, const char *op)
{
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "%s: NULL tape or output", op);
    return ddp__op_check_var(tape, a, op, "input");
}

static int permute_named(ddp_tape_t *tape, ddp_var_t *a, const int *dims, const char *op,
                         ddp_var_t **y)
{
    DDP_TRY(check_args(tape, a, y, op));
    DDP_FAIL_IF(!dims && a->t.ndim > 0, DDP_ERR_INVALID_ARG, "%s: dims is NULL", op);
    int seen[DDP_TENSOR_MAX_DIM] = {0}, identity = 1;
    int64_t shape[DDP_TENSOR_MAX_DIM], st[DDP_TENSOR_MAX_DIM];
    for (int i = 0; i < a->t.ndim; i++) {
        int d;
        DDP_TRY(ddp__op_dim(op, a, dims[i], a->t.ndim, &d));
        DDP_FAIL_IF(seen[d]++, DDP_ERR_INVALID_ARG, "%s: dim %d appears twice", op, d);
        shape[i] = a->t.shape[d];
        st[i] = a->t.stride[d];
        identity &= d == i;
    }
    if (identity) { /* torch returns a view equal to a: a itself, here */
        *y = a;
        return 0;
    }
    return gather_op(tape, &permute_def, a, a->t.ndim, shape, st, 0, 1, y);
}

int ddp_op_permute(ddp_tape_t *tape, ddp_var_t *a, const int *dims, ddp_var_t **y)
{
    return permute_named(tape, a, dims, "permute", y);
}

int ddp_op_transpose(ddp_tape_t *tape, ddp_var_t *a, int d0, int d1, ddp_var_t **y)
{
    DDP_TRY(check_args(tape, a, y, "transpose"));
    int dims[DDP_TENSOR_MAX_DIM], i0, i1;
    DDP_TRY(ddp__op_dim("transpose", a, d0, a->t.ndim, &i0));
    DDP_TRY(ddp__op_dim("transpose", a, d1, a->t.ndim, &i1));
    for (int i = 0; i < a->t.ndim; i++)
        dims[i] = i == i0 ? i1 : i == i1 ? i0 : i;
    return permute_named(tape, a, dims, "transpose", y);
}

/* start..end (end excluded) along dim d with step, already in range. */
static int slice_core(ddp_tape_t *tape, ddp_var_t *a, int d, int64_t start, int64_t len,
                      int64_t step, ddp_var_t **y)
{
    int64_t shape[DDP_TENSOR_MAX_DIM], st[DDP_TENSOR_MAX_DIM], lead = 1;
    for (int i = 0; i < a->t.ndim; i++) {
        shape[i] = i == d ? len : a->t.shape[i];
        st[i] = a->t.stride[i] * (i == d ? step : 1);
        lead *= i < d ? a->t.shape[i] : 1;
    }
    int64_t base = start * a->t.stride[d];
    if (len == a->t.shape[d]) { /* the whole dim: a itself */
        *y = a;
        return 0;
    }
    if (step == 1 && lead == 1) { /* one contiguous block: a view */
        ddp_var_t *v;
        DDP_TRY(ddp__op_push(tape, &slice_view_def, a->t.ndim, shape, 0, a, NULL, NULL, &v));
        v->view_offset = base;
        v->t.data = a->t.data + base;
        *y = v;
        return 0;
    }
    return gather_op(tape, &slice_def, a, a->t.ndim, shape, st, base, 0, y);
}

/* Python's slice.indices: negative from the end, then clipped to [0, size]. */
static int64_t clip_index(int64_t i, int64_t size)
{
    if (i < 0)
        i += size;
    return i < 0 ? 0 : i > size ? size : i;
}

int ddp_op_slice(ddp_tape_t *tape, ddp_var_t *a, int dim, int64_t start, int64_t end,
                 int64_t step, ddp_var_t **y)
{
    DDP_SHAPE_BUFS;
    DDP_TRY(check_args(tape, a, y, "slice"));
    int d;
    DDP_TRY(ddp__op_dim("slice", a, dim, a->t.ndim, &d));
    DDP_FAIL_IF(step < 1, DDP_ERR_INVALID_ARG, "slice: step %lld must be >= 1", (long long)step);
    int64_t size = a->t.shape[d], s = clip_index(start, size), e = clip_index(end, size);
    int64_t len = e > s ? (e - s + step - 1) / step : 0;
    DDP_FAIL_IF(len == 0, DDP_ERR_INVALID_ARG,
                "slice: %lld:%lld:%lld of dim %d of shape %s is empty (empty tensors are not "
                "supported)", (long long)start, (long long)end, (long long)step, d,
                DDP_SHAPE(a, 0));
    return slice_core(tape, a, d, s, len, step, y);
}

int ddp_op_narrow(ddp_tape_t *tape, ddp_var_t *a, int dim, int64_t start, int64_t length,
                  ddp_var_t **y)
{
    DDP_SHAPE_BUFS;
    DDP_TRY(check_args(tape, a, y, "narrow"));
    int d;
    DDP_TRY(ddp__op_dim("narrow", a, dim, a->t.ndim, &d));
    int64_t size = a->t.shape[d], s = start < 0 ? start + size : start;
    DDP_FAIL_IF(s < 0 || length < 1 || length > size - s, DDP_ERR_INVALID_ARG,
                "narrow: start %lld, length %lld do not fit dim %d of shape %s", (long long)start,
                (long long)length, d, DDP_SHAPE(a, 0));
    return slice_core(tape, a, d, s, length, 1, y);
}

int ddp_op_expand(ddp_tape_t *tape, ddp_var_t *a, int ndim, const int64_t *shape, ddp_var_t **y)
{
    DDP_SHAPE_BUFS;
    DDP_TRY(check_args(tape, a, y, "expand"));
    DDP_FAIL_IF(ndim < a->t.ndim || ndim > DDP_TENSOR_MAX_DIM || (ndim > 0 && !shape),
                DDP_ERR_INVALID_ARG, "expand: %d dims for shape %s (needs %d..%d)", ndim,
                DDP_SHAPE(a, 0), a->t.ndim, DDP_TENSOR_MAX_DIM);
    int64_t out[DDP_TENSOR_MAX_DIM];
    int lead = ndim - a->t.ndim, same = lead == 0;
    for (int d = 0; d < ndim; d++) {
        int64_t have = d < lead ? 1 : a->t.shape[d - lead];
        out[d] = shape[d] == -1 && d >= lead ? have : shape[d];
        DDP_FAIL_IF(out[d] < 1 || (have != 1 && have != out[d]), DDP_ERR_INVALID_ARG,
                    "expand: shape %s cannot be expanded to size %lld at dim %d (its size "
                    "there must be 1 or equal; -1 keeps it, new leading dims need a size)",
                    DDP_SHAPE(a, 0), (long long)shape[d], d);
        same &= out[d] == have;
    }
    if (same) {
        *y = a;
        return 0;
    }
    int64_t st[DDP_TENSOR_MAX_DIM];
    ddp__bcast_strides(&a->t, ndim, out, st);
    return gather_op(tape, &expand_def, a, ndim, out, st, 0, 0, y);
}

int ddp_op_contiguous(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y)
{
    DDP_TRY(check_args(tape, a, y, "contiguous"));
    *y = a;
    return 0;
}

/* ==== cat and stack ======================================================= */

/* Input j occupies a block of y: its own shape (stack: with a 1 inserted at
 * dim) walked through y's strides from offset[j]. */
typedef struct join_ctx {
    int dim, stacked;
    int64_t *offset; /* nin entries */
} join_ctx;

static int join_backward(ddp_tape_t *tape, ddp_var_t *v);
static const ddp__op_def cat_def = {"cat", join_backward, 0};
static const ddp__op_def stack_def = {"stack", join_backward, 0};

/* The walk of input j over y's block. */
static void join_plan(const ddp_var_t *v, const join_ctx *c, int j, ddp__plan *p)
{
    const ddp_tensor *x = &v->in[j]->t;
    int64_t shape[DDP_TENSOR_MAX_DIM];
    for (int d = 0; d < v->t.ndim; d++)
        shape[d] = !c->stacked ? x->shape[d] : d < c->dim ? x->shape[d]
                                 : d == c->dim ? 1 : x->shape[d - 1];
    ddp__plan_init(p, v->t.ndim, shape, 1, (const int64_t *const[]){v->t.stride});
}

static int join_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    const join_ctx *c = v->ctx;
    for (int j = 0; j < v->nin; j++) {
        ddp_var_t *x = v->in[j];
        if (!x->requires_grad)
            continue;
        int acc;
        DDP_GRAD_TARGET(dx, x);
        ddp__plan p;
        join_plan(v, c, j, &p);
        ddp__plan_gather(&p, 0, dx, v->grad + c->offset[j], 1.0f, acc);
    }
    return 0;
}

/* Checks in[] against in[0] (all dims equal but dim for cat) and sets the
 * output shape. */
static int join_shapes(ddp_tape_t *tape, int n, ddp_var_t *const *in, int dim, int stacked,
                       const char *op, int *d, int *ndim, int64_t *shape)
{
    DDP_SHAPE_BUFS;
    DDP_FAIL_IF(n < 1 || n > DDP_VAR_MAX_IN || !in, DDP_ERR_INVALID_ARG,
                "%s: %d inputs (1..%d)", op, n, DDP_VAR_MAX_IN);
    for (int j = 0; j < n; j++)
        DDP_TRY(ddp__op_check_var(tape, in[j], op, "an input"));
    const ddp_var_t *a = in[0];
    DDP_FAIL_IF(stacked && a->t.ndim == DDP_TENSOR_MAX_DIM, DDP_ERR_INVALID_ARG,
                "stack: inputs of shape %s already have %d dims", DDP_SHAPE(a, 0),
                DDP_TENSOR_MAX_DIM);
    *ndim = a->t.ndim + stacked;
    DDP_TRY(ddp__op_dim(op, a, dim, *ndim, d));
    int64_t along = 0;
    for (int j = 0; j < n; j++) {
        const ddp_var_t *x = in[j];
        int same = x->t.ndim == a->t.ndim;
        for (int i = 0; same && i < a->t.ndim; i++)
            same = x->t.shape[i] == a->t.shape[i] || (!stacked && i == *d);
        DDP_FAIL_IF(!same, DDP_ERR_INVALID_ARG,
                    "%s: input %d of shape %s does not match input 0 of shape %s%s", op, j,
                    DDP_SHAPE(x, 0), DDP_SHAPE(a, 1), stacked ? "" : " (but along dim)");
        along += stacked ? 1 : x->t.shape[*d];
    }
    for (int i = 0; i < *ndim; i++)
        shape[i] = i == *d ? along : stacked && i > *d ? a->t.shape[i - 1] : a->t.shape[i];
    return 0;
}

static int join_op(ddp_tape_t *tape, int n, ddp_var_t *const *in, int dim, int stacked,
                   ddp_var_t **y)
{
    const ddp__op_def *def = stacked ? &stack_def : &cat_def;
    DDP_FAIL_IF(!tape || !y, DDP_ERR_INVALID_ARG, "%s: NULL tape or output", def->name);
    int d = 0, ndim = 0;
    int64_t shape[DDP_TENSOR_MAX_DIM];
    DDP_TRY(join_shapes(tape, n, in, dim, stacked, def->name, &d, &ndim, shape));
    if (n == 1 && !stacked) {
        *y = in[0];
        return 0;
    }
    ddp_var_t *v;
    DDP_TRY(ddp__op_push_n(tape, def, ndim, shape, 1, n, in, &v));
    join_ctx *c = ddp__tape_alloc(tape, sizeof *c);
    int64_t *offset = ddp__tape_alloc(tape, (size_t)n * sizeof *offset);
    if (!c || !offset)
        return DDP_ERR_NOMEM;
    c->dim = d;
    c->stacked = stacked;
    c->offset = offset;
    v->ctx = c;
    int64_t at = 0; /* position along dim */
    for (int j = 0; j < n; j++) {
        offset[j] = at * v->t.stride[d];
        at += stacked ? 1 : in[j]->t.shape[d];
        ddp__plan p;
        join_plan(v, c, j, &p);
        ddp__plan_scatter(&p, 0, v->t.data + offset[j], in[j]->t.data, 1.0f, 0);
    }
    *y = v;
    return 0;
}

int ddp_op_cat(ddp_tape_t *tape, int n, ddp_var_t *const *in, int dim, ddp_var_t **y)
{
    return join_op(tape, n, in, dim, 0, y);
}

int ddp_op_stack(ddp_tape_t *tape, int n, ddp_var_t *const *in, int dim, ddp_var_t **y)
{
    return join_op(tape, n, in, dim, 1, y);
}
