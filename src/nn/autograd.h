/* Private autograd structures: the tape, its arena, and vars (see
 * include/ddp/nn.h for the public contract, docs/autograd.md for the design).
 */
#ifndef DDP_NN_AUTOGRAD_H
#define DDP_NN_AUTOGRAD_H

#include "ddp/ext.h"
#include "ddp/nn.h"

/* What an op is: its name (messages) and its backward.  Each op file
 * defines its own (static const) ops; there is no central list, so a new op
 * (a layer, a user's custom op) touches no other file. */
typedef struct ddp__op_def {
    const char *name;
    /* Reads v->grad and adds each input's share into the input's gradient
     * (ddp__grad_target).  NULL: the op has nothing to do (a view). */
    int (*backward)(ddp_tape_t *tape, ddp_var_t *v);
    unsigned flags; /* DDP__OP_* */
} ddp__op_def;

/* The output is a view of in[0]: its data is in[0]'s at element offset
 * view_offset, and so is its gradient (writers go straight there). */
#define DDP__OP_VIEW 1u

/* Inputs of one op (the released mask has one bit per input).  Up to
 * DDP__VAR_INLINE_IN live in the var itself, more in the arena. */
#define DDP_VAR_MAX_IN 64
#define DDP__VAR_INLINE_IN 3

struct ddp_var {
    ddp_tensor t;       /* value (data in the arena, or borrowed) */
    float *grad;        /* gradient (arena), p->grad for a parameter, or NULL */
    const ddp__op_def *def; /* NULL for a leaf (an input or a parameter) */
    int requires_grad;
    int nin;
    ddp_var_t **in;     /* nin inputs: in_inline, or the arena for more */
    ddp_var_t *in_inline[DDP__VAR_INLINE_IN];
    ddp_param *param;   /* the parameter of a parameter leaf */
    float f;            /* scalar argument (scale) */
    float *aux;         /* saved for backward: softmax probabilities, dropout mask */
    int64_t *labels;    /* nll / cross-entropy labels (arena copy) */
    void *ctx;          /* an op's own saved state (arena) */
    int64_t view_offset; /* DDP__OP_VIEW: element offset into in[0] */
    size_t index;       /* position on the tape */
    /* backward bookkeeping, reset at the start of every backward */
    int reachable;      /* on a path to the loss */
    int grad_written;   /* grad holds a value for this backward (else write, not add) */
    uint64_t released;  /* bit j: this op's use of in[j] is accounted (ddp__tape_release) */
};

struct ddp_tape {
    char *arena;        /* one chunk; reused across resets */
    size_t cap, used;
    char **spill;       /* chunks taken when the arena overflowed this iteration */
    size_t nspill, spill_cap;
    size_t spill_bytes; /* total requested while spilling: the next arena size */
    ddp_var_t **vars;   /* tape order (a topological order) */
    size_t nvars, vars_cap;
    uint64_t gen;       /* bumped by reset: invalidates parameter leaf caches */
    int grad_enabled;   /* 0: ops record no gradient state (ddp_tape_set_grad_enabled) */
    int backward_ran;   /* a backward ran since the last reset: no new var until reset */
    /* the backward in progress (NULL model outside ddp_tape_backward) */
    ddp_model_t *bw_model;
    ddp_grad_ready_fn bw_hook;
    void *bw_user;
    ddp_grad_write_fn bw_write;  /* rule 8 hook of bw_model, or NULL */
    void *bw_write_user;
    uint64_t bw_pass;            /* this backward's pass id */
    int grad_target_rc;          /* why ddp__grad_target last returned NULL */
};

/* 64-byte aligned scratch from the tape's arena, valid until reset; NULL
 * (with the error set) when memory runs out. */
void *ddp__tape_alloc(ddp_tape_t *tape, size_t bytes);
/* Appends a new var of the given shape with arena storage for its value
 * (data NULL: storage not allocated, the op sets t.data). */
int ddp__tape_push(ddp_tape_t *tape, const ddp__op_def *def, int ndim, const int64_t *shape,
                   int alloc_data, ddp_var_t **out);

/* Is v a var of this tape's current iteration?  Never dereferences v. */
int ddp__tape_has(const ddp_tape_t *tape, const ddp_var_t *v);
/* Accounts for v's use of its input j (once; later calls do nothing): one
 * pending use of its parameter less, and the grad-ready hook when that was
 * the last (contract rule 3).  Returns the hook's status. */
int ddp__tape_release(ddp_tape_t *tape, ddp_var_t *v, int j);
/* The gradient buffer of v for writing and whether to add (1) or write (0);
 * NULL on failure, with tape->grad_target_rc the code (DDP_GRAD_TARGET). */
float *ddp__grad_target(ddp_tape_t *tape, ddp_var_t *v, int *acc);

#endif
