/* libddp custom autograd ops (PyTorch's torch.autograd.Function) and
 * gradient checking (torch.autograd.gradcheck).
 *
 * A custom op is a forward and a backward written by the user over plain
 * float32 tensors, with a context for what backward needs:
 *
 *   static int fwd(ddp_function_ctx *ctx, int nin, const ddp_tensor *in,
 *                  int nout, ddp_tensor *out);     // writes out[k].data
 *   static int bwd(ddp_function_ctx *ctx, int nout, const ddp_tensor *dout,
 *                  int nin, ddp_tensor *din);      // writes din[i].data
 *   static const ddp_function swish = {"swish", fwd, bwd, NULL};
 *   ddp_function_apply(&swish, tape, 1, &x, 1, NULL, &y);
 *
 * Inputs may be any vars, parameter vars included: their gradients go
 * through the same path as a built-in op's, so the grad-ready contract of
 * include/ddp/ext.h holds and DDP buckets them as usual.  Several outputs
 * are views into one hidden node of the tape; an output that backward does
 * not reach gets a zero gradient.
 */
#ifndef DDP_NN_FUNCTION_H
#define DDP_NN_FUNCTION_H

#include "ddp/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ==== custom ops ========================================================== */

/* At most this many outputs per custom op (inputs: up to 64). */
#define DDP_FUNCTION_MAX_OUT 16

/* One application's context (PyTorch's ctx): lives on the tape until reset. */
typedef struct ddp_function_ctx ddp_function_ctx;

/* A shape: ndim dimensions dim[0 .. ndim). */
typedef struct ddp_shape {
    int ndim;
    int64_t dim[DDP_TENSOR_MAX_DIM];
} ddp_shape;

typedef struct ddp_function {
    const char *name; /* for messages: "swish" */
    /* Computes the outputs from the inputs: in[i] are the input values
     * (read-only), out[k] have their shapes and arena storage; write every
     * element of each out[k].data.  Save what backward needs with the ctx
     * calls below.  Returns 0 or a negative code (with ddp_last_error set,
     * e.g. through ddp_function_fail). */
    int (*forward)(ddp_function_ctx *ctx, int nin, const ddp_tensor *in, int nout,
                   ddp_tensor *out);
    /* Given dout[k] (the gradient of the loss with respect to out[k]; zeros
     * for an output the loss does not use), writes din[i].data, the gradient
     * with respect to in[i] (every element: it starts at zero), for each i
     * whose din[i].data is not NULL (NULL: the input needs no gradient).
     * The library adds din into the inputs' gradients. */
    int (*backward)(ddp_function_ctx *ctx, int nout, const ddp_tensor *dout, int nin,
                    ddp_tensor *din);
    void *user; /* borrowed; given back by ddp_function_ctx_user */
} ddp_function;

/* Applies fn to the nin vars in (1 .. 64, of this tape) and returns its
 * nout outputs (1 .. DDP_FUNCTION_MAX_OUT) in out[0 .. nout).  out_shapes:
 * the outputs' shapes (NULL: each has in[0]'s shape).  fn is borrowed until
 * the tape is reset.  The outputs require grad when an input does (and the
 * tape records gradients). */
DDP_API int ddp_function_apply(const ddp_function *fn, ddp_tape_t *tape, int nin,
                               ddp_var_t *const *in, int nout, const ddp_shape *out_shapes,
                               ddp_var_t **out);

/* Scratch that lives with the ctx (64-byte aligned, until the tape is
 * reset): what forward saves for backward.  NULL when memory runs out. */
DDP_API void *ddp_function_ctx_alloc(ddp_function_ctx *ctx, size_t bytes);
/* One pointer slot for forward to leave for backward (a struct made with
 * ddp_function_ctx_alloc, say), and reading it back. */
DDP_API void ddp_function_ctx_save(ddp_function_ctx *ctx, void *saved);
DDP_API void *ddp_function_ctx_saved(const ddp_function_ctx *ctx);
/* The application's inputs and outputs (values as forward saw and wrote
 * them; borrowed, until the tape is reset), i.e. ctx.saved_tensors for
 * free: inputs stay valid until reset, outputs live in the arena. */
DDP_API const ddp_tensor *ddp_function_ctx_input(const ddp_function_ctx *ctx, int i);
DDP_API const ddp_tensor *ddp_function_ctx_output(const ddp_function_ctx *ctx, int k);
/* ctx.needs_input_grad[i]. */
DDP_API int ddp_function_ctx_needs_grad(const ddp_function_ctx *ctx, int i);
/* fn->user. */
DDP_API void *ddp_function_ctx_user(const ddp_function_ctx *ctx);
/* For callbacks: sets the last-error message "<fn name>: <message>" and
 * returns code, so that `return ddp_function_fail(ctx, DDP_ERR_INVALID_ARG,
 * "x must be positive");` reports a failure. */
DDP_API int ddp_function_fail(const ddp_function_ctx *ctx, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ==== gradient check ======================================================
 * torch.autograd.gradcheck for libddp's float32 tape: the op under test
 * (a custom op, a layer, any ops) runs in float32 and its backward gives the
 * analytic gradient; a float64 REFERENCE of the same function, written by
 * the caller, gives the numeric one by central differences,
 * (f(x + eps) - f(x - eps)) / 2 eps.
 *
 * Why a reference: with eps = 1e-6 a float32 forward would lose the
 * difference in rounding (float32 resolves about 6e-8 relative), so
 * "float64" here means the numeric side is computed in double from the
 * caller's double implementation, and the float32 forward is first checked
 * against that reference at the same point (so the reference is the op's
 * function, not another).  The analytic side keeps float32's rounding, about
 * 1e-7 relative per operation, far inside the default rtol 1e-3.
 *
 * The outputs are reduced with a fixed pseudo-random weight w per element
 * (seeded), so one backward per output checks every input against
 * d(sum w . y)/dx, which a wrong Jacobian entry changes. */

/* Builds the computation under test on tape from the input vars in[0 ..
 * nin) and returns its nout output vars in out. */
typedef int (*ddp_gradcheck_build_fn)(ddp_tape_t *tape, ddp_var_t *const *in, int nin,
                                      ddp_var_t **out, int nout, void *user);
/* The same function in float64: from in[i] (shapes as the inputs'), writes
 * the outputs one after the other into out (their numels summed). */
typedef int (*ddp_gradcheck_ref_fn)(const double *const *in, int nin, double *out, void *user);

typedef struct ddp_gradcheck_options {
    double eps;     /* central difference step (default 1e-6, as PyTorch) */
    double atol;    /* |analytic - numeric| <= atol + rtol |numeric| (1e-5) */
    double rtol;    /* (1e-3, as PyTorch) */
    double fwd_tol; /* float32 forward vs reference: relative to max(1, |ref|)
                       (default 1e-5) */
    int nout;       /* outputs of build (default 1) */
    uint64_t seed;  /* of the output weights (default 0) */
} ddp_gradcheck_options;
DDP_API ddp_gradcheck_options ddp_gradcheck_defaults(void);

/* Checks build's gradients at the nin points in (float32 tensors, copied)
 * against ref.  0 when every input element agrees; DDP_ERR_MISMATCH naming
 * the first that does not: "gradcheck: input 1 element 3: analytic 0.5,
 * numeric 0.25 (tolerance 0.00026)", or the forward output that differs from
 * the reference; a failing callback's code and message otherwise.  opts NULL:
 * defaults. */
DDP_API int ddp_gradcheck(ddp_gradcheck_build_fn build, ddp_gradcheck_ref_fn ref, int nin,
                          const ddp_tensor *in, const ddp_gradcheck_options *opts, void *user);

#ifdef __cplusplus
}
#endif
#endif
