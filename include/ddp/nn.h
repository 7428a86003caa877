/* libddp nn layer: autograd tape, parameters, modules, models, losses.
 *
 * The pieces, in the order a training step uses them:
 *
 *   ddp_model_t   owns modules and parameters.  All parameters of a model live
 *                 in ONE flat float block and their gradients in ANOTHER
 *                 (STYLE.md rule 8), in registration order, packed with no
 *                 gaps; each ddp_param is a view (offset, numel, shape,
 *                 state_dict name) into both.
 *   ddp_tape_t    records the ops of one forward pass (reverse-mode autograd
 *                 over a tape, as micrograd/ggml/PyTorch).  Values and
 *                 gradients live in a per-tape arena that is reused from one
 *                 iteration to the next (ddp_tape_reset): in steady state a
 *                 training step allocates nothing.
 *   ddp_var_t     one value on a tape (an input, a parameter, an op's result).
 *   ddp_tape_backward  walks the tape backwards from a scalar loss, accumulates
 *                 (+=) every parameter's gradient into wherever p->grad points,
 *                 and reports each parameter to the model's grad-ready hook.
 *
 * A typical step (PyTorch's `out = model(x); loss = crit(out, y);
 * opt.zero_grad(); loss.backward(); opt.step()`):
 *
 *   ddp_tape_reset(tape);
 *   ddp_tape_input(tape, &images, 0, &x);
 *   ddp_model_forward(model, tape, x, &logits);
 *   ddp_op_cross_entropy(tape, logits, labels, &loss);
 *   ddp_optim_zero_grad(opt);
 *   ddp_tape_backward(tape, loss, model);
 *   ddp_optim_step(opt);
 *
 * Users write their own models with the ddp_op_* functions: a var used twice
 * (a residual connection) and a parameter used by two ops (shared weights)
 * accumulate their gradients; parameters a step does not use get none.
 *
 * DistributedDataParallel builds on the grad-ready contract and the other
 * seams of include/ddp/ext.h (not included by ddp.h).
 *
 * Threading: a model, a tape and its vars belong to one thread at a time.
 */
#ifndef DDP_NN_H
#define DDP_NN_H

#include "ddp/base.h"
#include "ddp/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddp_tape ddp_tape_t;
typedef struct ddp_var ddp_var_t;
typedef struct ddp_module ddp_module_t;
typedef struct ddp_model ddp_model_t;

#define DDP_PARAM_NAME_MAX 128

/* A parameter: a view into its model's flat blocks.  Fields are read-only for
 * users except through the functions below; data may be written in place
 * (initialisation, optimizers, broadcast). */
typedef struct ddp_param {
    char name[DDP_PARAM_NAME_MAX]; /* state_dict name: "0.weight", "2.bias" */
    float *data;                   /* (shape) values: view into the flat param block */
    float *grad;                   /* (shape) where backward accumulates (+=): the
                                      flat grad block, or memory set by
                                      ddp_param_set_grad (ext.h) */
    size_t offset;                 /* position in the flat blocks, in floats */
    size_t numel;
    int ndim;
    int64_t shape[DDP_TENSOR_MAX_DIM];
    int index;                     /* registration order, 0.. */
    struct {                       /* private to libddp */
        ddp_model_t *model;
        float *home_grad;          /* this parameter's slice of the model's grad block */
        float *home_data;          /* ... and of its parameter block */
        int owns_storage;          /* standalone storage before the model seals */
        const void *tape;          /* leaf var cache: tape, generation, var */
        uint64_t tape_gen;
        ddp_var_t *var;
        uint64_t used_pass;        /* the last backward pass that reached it */
        uint64_t write_pass;       /* the last pass whose grad-write hook it had */
        int64_t pending;           /* its uses that pass has still to process */
    } priv;
} ddp_param;

/* ==== tape ================================================================ */

/* Creates an empty tape.  Caller destroys it. */
DDP_API int ddp_tape_create(ddp_tape_t **out);
/* Frees the tape, its arena and all its vars; NULL is a no-op. */
DDP_API void ddp_tape_destroy(ddp_tape_t *tape);
/* Forgets every var (their pointers become invalid) and keeps the arena for
 * the next iteration.  Call it at the start of each step: once a backward
 * has run on a tape, recording on it (an input, a parameter, an op) fails
 * with DDP_ERR_STATE until it is reset ("call ddp_tape_reset(tape) at the
 * start of each iteration"), since the tape would otherwise keep every
 * step's vars and grow. */
DDP_API void ddp_tape_reset(ddp_tape_t *tape);
/* torch.no_grad() for this tape (kept across resets until changed): with
 * enabled 0, op outputs do not require grad and ops save nothing for
 * backward (evaluation).  Default 1. */
DDP_API void ddp_tape_set_grad_enabled(ddp_tape_t *tape, int enabled);
/* Bytes the arena holds (its high-water mark once steady). */
DDP_API size_t ddp_tape_arena_bytes(const ddp_tape_t *tape);

/* A leaf var over t's data (borrowed, not copied: it must stay valid until
 * the tape is reset).  With requires_grad, backward gives it a gradient
 * (ddp_var_grad). */
DDP_API int ddp_tape_input(ddp_tape_t *tape, const ddp_tensor *t, int requires_grad,
                           ddp_var_t **out);
/* The leaf var of parameter p on this tape (the same var every time within
 * one iteration). */
DDP_API int ddp_tape_param(ddp_tape_t *tape, ddp_param *p, ddp_var_t **out);

/* The var's value: borrowed, valid until the tape is reset. */
DDP_API const ddp_tensor *ddp_var_tensor(const ddp_var_t *v);
/* The var's gradient after backward (same shape as the value), or NULL if it
 * has none.  For a parameter's var this is p->grad. */
DDP_API const float *ddp_var_grad(const ddp_var_t *v);
/* The first element of the value (the loss of a scalar var). */
DDP_API float ddp_var_item(const ddp_var_t *v);

/* ==== ops ==================================================================
 * Each op appends one var to the tape (outputs last argument).  Shapes are
 * checked; a mismatch fails with DDP_ERR_INVALID_ARG naming both shapes.  The
 * output requires grad when any input does.  Inputs are listed in the order
 * the grad-ready contract reverses. */

/* y = x W^T + b, as nn.Linear: x (..., in), w (out, in), b (out) or NULL;
 * y (..., out).  Backward order: b, w, x. */
DDP_API int ddp_op_linear(ddp_tape_t *tape, ddp_var_t *x, ddp_var_t *w, ddp_var_t *b,
                          ddp_var_t **y);
/* y = a b, torch.matmul: a (M, K), b (K, N), y (M, N); batched (..., M, K) x
 * (..., K, N) with the batch dims broadcast, and 1-D operands (nn_ops.h). */
DDP_API int ddp_op_matmul(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t *b, ddp_var_t **y);
/* y = a + b with NumPy/PyTorch broadcasting (nn_ops.h); a broadcast input's
 * gradient sums over its broadcast dims. */
DDP_API int ddp_op_add(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t *b, ddp_var_t **y);
/* y = a * b element-wise, broadcasting as ddp_op_add. */
DDP_API int ddp_op_mul(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t *b, ddp_var_t **y);
/* y = s * a. */
DDP_API int ddp_op_scale(ddp_tape_t *tape, ddp_var_t *a, float s, ddp_var_t **y);
/* y = max(a, 0). */
DDP_API int ddp_op_relu(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y);
/* y = 1 / (1 + exp(-a)) and y = tanh(a), element-wise. */
DDP_API int ddp_op_sigmoid(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y);
DDP_API int ddp_op_tanh(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y);
/* Inverted dropout: in training, each element is zeroed with probability p
 * and the rest scaled by 1/(1-p), the mask drawn from a generator seeded with
 * seed; with training == 0 or p == 0, y is x itself (no new var).  0 <= p <= 1. */
DDP_API int ddp_op_dropout(ddp_tape_t *tape, ddp_var_t *x, float p, int training,
                           uint64_t seed, ddp_var_t **y);
/* Scalar (0-d) y = sum of all elements / mean of all elements. */
DDP_API int ddp_op_sum(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y);
DDP_API int ddp_op_mean(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y);
/* A view of a with another shape (one entry may be -1); no copy, and its
 * gradient is a's, seen through the view. */
DDP_API int ddp_op_reshape(ddp_tape_t *tape, ddp_var_t *a, int ndim, const int64_t *shape,
                           ddp_var_t **y);
/* (B, d1, d2, ...) -> (B, d1*d2*...), as nn.Flatten(); a view. */
DDP_API int ddp_op_flatten(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y);
/* Row-wise log-softmax over the last dimension, numerically stable. */
DDP_API int ddp_op_log_softmax(ddp_tape_t *tape, ddp_var_t *a, ddp_var_t **y);
/* Mean negative log-likelihood: logp (B, C), labels[B] in [0, C) (copied);
 * a label equal to -100 is ignored (ddp_op_nll_loss_opts). */
DDP_API int ddp_op_nll_loss(ddp_tape_t *tape, ddp_var_t *logp, const int64_t *labels,
                            ddp_var_t **y);
/* nn.MSELoss() (mean reduction): scalar mean((input - target)^2), same
 * shapes; target may require grad too. */
DDP_API int ddp_op_mse_loss(ddp_tape_t *tape, ddp_var_t *input, ddp_var_t *target,
                            ddp_var_t **y);
/* Cross-entropy with mean reduction = nll_loss(log_softmax(logits)), fused:
 * logits (B, C), labels[B] (copied).  A label outside [0, C) fails with
 * DDP_ERR_INVALID_ARG: "label 12 at index 5 is out of range for 10 classes",
 * except -100, PyTorch's default ignore_index (ddp_op_cross_entropy_opts). */
DDP_API int ddp_op_cross_entropy(ddp_tape_t *tape, ddp_var_t *logits, const int64_t *labels,
                                 ddp_var_t **y);

/* nn.CrossEntropyLoss's knobs (mean reduction, PyTorch 1.13 semantics). */
typedef struct ddp_cross_entropy_options {
    int64_t ignore_index;  /* rows with this label count for nothing: the mean is
                              over the others (all ignored: NaN, as PyTorch); default -100 */
    float label_smoothing; /* e in [0, 1]: the target is (1 - e) onehot + e / C (0) */
} ddp_cross_entropy_options;
DDP_API ddp_cross_entropy_options ddp_cross_entropy_defaults(void);
/* Cross-entropy with options (opts NULL: defaults, = ddp_op_cross_entropy):
 * labels in [0, C) or ignore_index. */
DDP_API int ddp_op_cross_entropy_opts(ddp_tape_t *tape, ddp_var_t *logits, const int64_t *labels,
                                      const ddp_cross_entropy_options *opts, ddp_var_t **y);
/* nn.NLLLoss's knob: ignore_index as for cross-entropy (default -100). */
typedef struct ddp_nll_loss_options {
    int64_t ignore_index;
} ddp_nll_loss_options;
DDP_API ddp_nll_loss_options ddp_nll_loss_defaults(void);
DDP_API int ddp_op_nll_loss_opts(ddp_tape_t *tape, ddp_var_t *logp, const int64_t *labels,
                                 const ddp_nll_loss_options *opts, ddp_var_t **y);
/* nn.BCEWithLogitsLoss (mean reduction): scalar mean of (1 - t) x + (1 +
 * (pw - 1) t) log(1 + exp(-x)), computed stably for any logit x; target t
 * of input's shape (may require grad); pos_weight NULL (all 1) or one weight
 * per class of the last dimension, broadcast over the rows (copied). */
DDP_API int ddp_op_bce_with_logits(ddp_tape_t *tape, ddp_var_t *input, ddp_var_t *target,
                                   const float *pos_weight, ddp_var_t **y);

/* ==== backward ============================================================ */


/* Backpropagates from loss (one element) through the tape, accumulating into
 * the gradients of every var that requires grad (parameters: into p->grad).
 * model may be NULL (then no hook is called).  May be called again on the
 * same tape (gradients accumulate again); the next forward needs a
 * ddp_tape_reset first. */
DDP_API int ddp_tape_backward(ddp_tape_t *tape, ddp_var_t *loss, ddp_model_t *model);
/* PyTorch's y.backward(gradient): the same from a var y of any shape whose
 * upstream gradient is dy (y's numel floats, borrowed for the call), as a
 * pipeline stage does with the gradient the next stage sends back. */
DDP_API int ddp_tape_backward_grad(ddp_tape_t *tape, ddp_var_t *y, const float *dy,
                                   ddp_model_t *model);

/* ==== modules =============================================================
 * Modules are created alone, then handed to a container or a model, which
 * takes ownership.  A module's forward appends its ops to a tape.  Users'
 * own modules (a forward callback with state, parameters, buffers, named
 * children), BatchNorm and torch.nn.init: include/ddp/nn_module.h. */

/* nn.Linear(in, out, bias): weight (out, in) and bias (out) drawn from
 * U(-1/sqrt(in), 1/sqrt(in)) (PyTorch's default init) by a generator seeded
 * with seed.  Parameters registered as "weight", "bias". */
DDP_API int ddp_linear_create(int in_features, int out_features, int bias, uint64_t seed,
                              ddp_module_t **out);
DDP_API int ddp_relu_create(ddp_module_t **out);
/* nn.Flatten(): (B, ...) -> (B, prod ...). */
DDP_API int ddp_flatten_create(ddp_module_t **out);
/* nn.Dropout(p): active in training mode only; masks drawn from a generator
 * seeded with seed, advanced at every forward. */
DDP_API int ddp_dropout_create(float p, uint64_t seed, ddp_module_t **out);
/* nn.Sequential: takes ownership of the n modules (also on failure); their
 * parameters are named "<i>.<name>". */
DDP_API int ddp_sequential_create(ddp_module_t *const *modules, int n, ddp_module_t **out);
/* Frees a module that no container or model owns; NULL is a no-op. */
DDP_API void ddp_module_destroy(ddp_module_t *m);
/* Runs the module: appends its ops to tape, *y is the output var. */
DDP_API int ddp_module_forward(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y);
/* The module's own parameter by local name ("weight", "bias"), or NULL. */
DDP_API ddp_param *ddp_module_param(ddp_module_t *m, const char *name);
/* The i-th child in the order added (Sequential's i-th layer), or NULL. */
DDP_API ddp_module_t *ddp_module_child(ddp_module_t *m, int i);
/* Training (1) or evaluation (0) mode of the module and its children. */
DDP_API void ddp_module_train(ddp_module_t *m, int training);

/* ==== models ============================================================== */

/* An empty model: add modules and parameters, then use it.  The first call
 * that needs the flat blocks (forward, parameters, blocks, hooks, backward)
 * seals it: after that nothing can be added, and p->data/p->grad stay put
 * (until re-pointed by ddp_param_set_grad).  Caller destroys it. */
DDP_API int ddp_model_create(ddp_model_t **out);
/* Adds a module (takes ownership, also on failure); its parameters are named
 * "<name>.<local>", or just "<local>" when name is "" (a model made of one
 * Sequential gets PyTorch's "0.weight", "0.bias", ...).  ddp_model_forward
 * runs the added modules in order. */
DDP_API int ddp_model_add_module(ddp_model_t *m, const char *name, ddp_module_t *module);
/* Adds a free parameter (for hand-written models), zero-initialised; write
 * p->data after ddp_model_seal (the pointer moves when the model seals). */
DDP_API int ddp_model_add_param(ddp_model_t *m, const char *name, int ndim,
                                const int64_t *shape, ddp_param **out);
/* Convenience: a model made of one module (takes ownership), sealed. */
DDP_API int ddp_model_from_module(ddp_module_t *module, ddp_model_t **out);
/* Allocates the flat blocks and moves every parameter into them (values and
 * gradients copied).  Idempotent. */
DDP_API int ddp_model_seal(ddp_model_t *m);
/* Frees the model, its modules and parameters; NULL is a no-op.  Memory
 * given by ddp_param_set_grad is the caller's and is not freed. */
DDP_API void ddp_model_destroy(ddp_model_t *m);

/* Runs the model's modules in order on x. */
DDP_API int ddp_model_forward(ddp_model_t *m, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y);
/* Training (1, default) or evaluation (0) mode of every module. */
DDP_API void ddp_model_train(ddp_model_t *m, int training);
DDP_API int ddp_model_is_training(const ddp_model_t *m);

/* Number of parameters (tensors) and the i-th in registration order (NULL
 * when out of range); by state_dict name (NULL if absent).  Seals. */
DDP_API size_t ddp_model_num_params(ddp_model_t *m);
DDP_API ddp_param *ddp_model_param(ddp_model_t *m, size_t i);
DDP_API ddp_param *ddp_model_find_param(ddp_model_t *m, const char *name);
/* The flat blocks (borrowed; owned by the model) and their length in floats.
 * Parameter i occupies [p->offset, p->offset + p->numel) of each.  The grad
 * block is the model's own: after ddp_model_set_grad_block or
 * ddp_param_set_grad, gradients live where p->grad points instead. */
DDP_API float *ddp_model_param_block(ddp_model_t *m, size_t *numel);
DDP_API float *ddp_model_grad_block(ddp_model_t *m, size_t *numel);

/* The parameters' version: a counter that every in-place writer through
 * the API bumps (ddp_optim_step, ddp_model_reset_parameters,
 * ddp_model_load_safetensors, ddp_checkpoint_load), so that DDP can tell
 * that the parameters changed under no_sync (ddp.h).  Code that writes p->data or the parameter block
 * itself (a hand-written optimizer) calls ddp_model_bump_param_version
 * after each update. */
DDP_API uint64_t ddp_model_param_version(const ddp_model_t *m);
DDP_API void ddp_model_bump_param_version(ddp_model_t *m);

/* Sets every parameter's gradient (wherever p->grad points) to zero. */
DDP_API void ddp_model_zero_grad(ddp_model_t *m);
/* torch.nn.utils.clip_grad_norm_: the norm of all gradients together (p-norm
 * with norm_type p > 0, or INFINITY for the largest magnitude) goes to
 * *total_norm (may be NULL); when it exceeds max_norm every gradient is
 * scaled by max_norm / (norm + 1e-6).  Reads and writes through p->grad. */
DDP_API int ddp_model_clip_grad_norm(ddp_model_t *m, double max_norm, double norm_type,
                                     double *total_norm);

/* Re-draws every module's parameters (and resets BatchNorm's running
 * statistics) with PyTorch's default init: each module's reset
 * (ddp_module_def), parents before children, in registration order, from
 * ONE generator seeded with seed, so every layer gets the next stretch of
 * the stream (what torch.manual_seed(seed) before building the model does
 * for PyTorch).  Free parameters added with ddp_model_add_param are left
 * alone. */
DDP_API int ddp_model_reset_parameters(ddp_model_t *m, uint64_t seed);

/* ==== safetensors ========================================================= */

/* Writes the state dict (parameters and buffers, PyTorch's names) as a
 * safetensors file: 8-byte little-endian header length, a JSON header
 * {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]},
 * ...} padded with spaces to 8 bytes, then the raw little-endian data in
 * state-dict order (int64 buffers as "I64").  Written to "<path>.tmp",
 * fsynced, then renamed over path. */
DDP_API int ddp_model_save_safetensors(ddp_model_t *m, const char *path);
/* Loads parameter and buffer values from a safetensors file (one torch's
 * safetensors wrote for the same module loads).  The file must hold exactly
 * the model's names with their dtypes (F32; I64 for int64 buffers) and
 * shapes; otherwise nothing is
 * changed and DDP_ERR_MISMATCH names every difference ("2.weight: shape (10, 256) in
 * file, (10, 128) in model", "missing 0.bias", "unexpected 3.weight").  A
 * malformed file (bad length, bad JSON, offsets out of range or overlapping)
 * fails with DDP_ERR_FORMAT saying what is wrong. */
DDP_API int ddp_model_load_safetensors(ddp_model_t *m, const char *path);

#ifdef __cplusplus
}
#endif

#include "ddp/nn_function.h"
#include "ddp/nn_norm.h"
#include "ddp/nn_ops.h" /* broadcasting, shape, reduction, activation ops */
#include "ddp/nn_module.h"
#include "ddp/nn_conv.h"

#endif
