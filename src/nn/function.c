/* Custom autograd ops (PyTorch's torch.autograd.Function): a user's forward
 * and backward over float32 tensors, with a context saved on the tape.
 *
 * One application is one hidden NODE var whose inputs are the op's inputs
 * and whose value holds every output one after the other (a 1-D vector of
 * their numels summed); each output is a DDP__OP_VIEW of the node at its
 * offset.  So the tape's view mechanism does the bookkeeping: gradients of
 * the outputs land straight in the node's gradient at their offsets, the
 * part of an output that nothing used is zero (the tape clears a partial
 * view's base on its first write), and the node's backward runs once with
 * all of them.  The node's inputs are released by the tape like any op's,
 * so parameter inputs take part in the grad-ready contract (ext.h) with no
 * special case. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "ddp/nn_function.h"
#include "nn/ops.h"
#include "tensor/kernels.h"
#include "tensor/shape.h"

struct ddp_function_ctx {
    const ddp_function *fn;
    ddp_tape_t *tape;
    int nin, nout;
    ddp_tensor *in;      /* (nin) the inputs' values */
    ddp_tensor *out;     /* (nout) views of the node's value */
    int64_t *offset;     /* (nout) element offset of out[k] in the node */
    unsigned char *needs; /* (nin) input i gets a gradient */
    float **din;         /* (nin) backward's scratch, made at its first run */
    void *saved;
};

static int node_backward(ddp_tape_t *tape, ddp_var_t *v);

static const ddp__op_def node_def = {"function", node_backward, 0};
static const ddp__op_def output_def = {"function output", NULL, DDP__OP_VIEW};

/* ==== context ============================================================= */

void *ddp_function_ctx_alloc(ddp_function_ctx *ctx, size_t bytes)
{
    return ctx ? ddp__tape_alloc(ctx->tape, bytes) : NULL;
}

void ddp_function_ctx_save(ddp_function_ctx *ctx, void *saved)
{
    if (ctx)
        ctx->saved = saved;
}

void *ddp_function_ctx_saved(const ddp_function_ctx *ctx) { return ctx ? ctx->saved : NULL; }

const ddp_tensor *ddp_function_ctx_input(const ddp_function_ctx *ctx, int i)
{
    return ctx && i >= 0 && i < ctx->nin ? &ctx->in[i] : NULL;
}

const ddp_tensor *ddp_function_ctx_output(const ddp_function_ctx *ctx, int k)
{
    return ctx && k >= 0 && k < ctx->nout ? &ctx->out[k] : NULL;
}

void *ddp_function_ctx_user(const ddp_function_ctx *ctx) { return ctx ? ctx->fn->user : NULL; }

int ddp_function_ctx_needs_grad(const ddp_function_ctx *ctx, int i)
{
    return ctx && i >= 0 && i < ctx->nin && ctx->needs[i];
}

int ddp_function_fail(const ddp_function_ctx *ctx, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return DDP_ERROR(code, "%s: %s", ctx && ctx->fn->name ? ctx->fn->name : "function", msg);
}

/* ==== apply =============================================================== */

static int check_args(ddp_tape_t *tape, const ddp_function *fn, int nin, ddp_var_t *const *in,
                      int nout, ddp_var_t **out)
{
    DDP_FAIL_IF(!tape || !fn || !out, DDP_ERR_INVALID_ARG, "function: NULL tape, fn or out");
    const char *name = fn->name ? fn->name : "function";
    DDP_FAIL_IF(!fn->forward, DDP_ERR_INVALID_ARG, "%s: no forward", name);
    DDP_FAIL_IF(nin < 1 || nin > DDP_VAR_MAX_IN || !in, DDP_ERR_INVALID_ARG,
                "%s: %d inputs (1 .. %d)", name, nin, DDP_VAR_MAX_IN);
    DDP_FAIL_IF(nout < 1 || nout > DDP_FUNCTION_MAX_OUT, DDP_ERR_INVALID_ARG,
                "%s: %d outputs (1 .. %d)", name, nout, DDP_FUNCTION_MAX_OUT);
    for (int i = 0; i < nin; i++) {
        char arg[32];
        snprintf(arg, sizeof arg, "input %d", i);
        DDP_TRY(ddp__op_check_var(tape, in[i], name, arg));
    }
    return 0;
}

/* The context, with the inputs' values and the outputs' shapes and offsets;
 * *total is the node's length. */
static int make_ctx(ddp_tape_t *tape, const ddp_function *fn, int nin, ddp_var_t *const *in,
                    int nout, const ddp_shape *shapes, ddp_function_ctx **out, int64_t *total)
{
    ddp_function_ctx *c = ddp__tape_alloc(tape, sizeof *c);
    if (!c)
        return DDP_ERR_NOMEM;
    memset(c, 0, sizeof *c);
    c->fn = fn;
    c->tape = tape;
    c->nin = nin;
    c->nout = nout;
    c->in = ddp__tape_alloc(tape, (size_t)nin * sizeof *c->in);
    c->out = ddp__tape_alloc(tape, (size_t)nout * sizeof *c->out);
    c->offset = ddp__tape_alloc(tape, (size_t)nout * sizeof *c->offset);
    c->din = ddp__tape_alloc(tape, (size_t)nin * sizeof *c->din);
    c->needs = ddp__tape_alloc(tape, (size_t)nin);
    if (!c->in || !c->out || !c->offset || !c->din || !c->needs)
        return DDP_ERR_NOMEM;
    memset(c->din, 0, (size_t)nin * sizeof *c->din);
    memset(c->needs, 0, (size_t)nin);
    for (int i = 0; i < nin; i++)
        c->in[i] = in[i]->t;
    *total = 0;
    for (int k = 0; k < nout; k++) {
        memset(&c->out[k], 0, sizeof c->out[k]);
        int rc = shapes ? ddp__tensor_set_shape(&c->out[k], shapes[k].ndim, shapes[k].dim)
                        : ddp__tensor_set_shape(&c->out[k], in[0]->t.ndim, in[0]->t.shape);
        if (rc < 0)
            return ddp__error_context(rc, "%s: output %d", fn->name ? fn->name : "function", k);
        c->offset[k] = *total;
        *total += c->out[k].numel;
    }
    *out = c;
    return 0;
}

int ddp_function_apply(const ddp_function *fn, ddp_tape_t *tape, int nin, ddp_var_t *const *in,
                       int nout, const ddp_shape *out_shapes, ddp_var_t **out)
{
    DDP_TRY(check_args(tape, fn, nin, in, nout, out));
    ddp_function_ctx *c = NULL;
    int64_t total = 0;
    DDP_TRY(make_ctx(tape, fn, nin, in, nout, out_shapes, &c, &total));
    ddp_var_t *node;
    DDP_TRY(ddp__op_push_n(tape, &node_def, 1, &total, 1, nin, in, &node));
    node->ctx = c;
    for (int i = 0; i < nin; i++)
        c->needs[i] = node->requires_grad && in[i]->requires_grad;
    for (int k = 0; k < nout; k++) {
        ddp_var_t *o;
        DDP_TRY(ddp__op_push(tape, &output_def, c->out[k].ndim, c->out[k].shape, 0, node, NULL,
                             NULL, &o));
        o->view_offset = c->offset[k];
        o->t.data = node->t.data + c->offset[k];
        c->out[k].data = o->t.data;
        out[k] = o;
    }
    int rc = fn->forward(c, nin, c->in, nout, c->out);
    if (rc < 0)
        return ddp__error_context(rc, "%s forward", fn->name ? fn->name : "function");
    return 0;
}

/* ==== backward ============================================================ */

/* The user's backward into zeroed scratch (kept in the ctx for later
 * backward passes), then each input's share added through the tape's
 * gradient target, as built-in ops do. */
static int node_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    ddp_function_ctx *c = v->ctx;
    const char *name = c->fn->name ? c->fn->name : "function";
    DDP_FAIL_IF(!c->fn->backward, DDP_ERR_UNSUPPORTED,
                "%s: no backward (the op was used on a path to the loss)", name);
    ddp_tensor *dout = ddp__tape_alloc(tape, (size_t)c->nout * sizeof *dout);
    ddp_tensor *din = ddp__tape_alloc(tape, (size_t)c->nin * sizeof *din);
    if (!dout || !din)
        return DDP_ERR_NOMEM;
    for (int k = 0; k < c->nout; k++) {
        dout[k] = c->out[k];
        dout[k].data = v->grad + c->offset[k];
    }
    for (int i = 0; i < c->nin; i++) {
        din[i] = c->in[i];
        din[i].data = NULL;
        if (!c->needs[i])
            continue;
        size_t bytes = (size_t)c->in[i].numel * sizeof(float);
        if (!c->din[i] && !(c->din[i] = ddp__tape_alloc(tape, bytes)))
            return DDP_ERR_NOMEM;
        din[i].data = c->din[i];
        memset(din[i].data, 0, bytes);
    }
    int rc = c->fn->backward(c, c->nout, dout, c->nin, din);
    if (rc < 0)
        return ddp__error_context(rc, "%s backward", name);
    for (int i = 0; i < c->nin; i++) {
        if (!din[i].data)
            continue;
        int acc;
        DDP_GRAD_TARGET(g, v->in[i]);
        ddp__vec_acc_to(g, din[i].data, (size_t)c->in[i].numel, acc);
    }
    return 0;
}
