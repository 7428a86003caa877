/* Private autograd structures: the tape, its arena, and vars (see
 * include/ddp/nn.h for the public contract, docs/autograd.md for the design).
 */
#ifndef DDP_NN_AUTOGRAD_H
#define DDP_NN_AUTOGRAD_H

#include "ddp/ext.h"
#include "ddp/nn.h"

enum ddp__op {
    DDP_OP_LEAF = 0,
    DDP_OP_LINEAR,
    DDP_OP_MATMUL,
    DDP_OP_ADD,
    DDP_OP_ADD_ROWS, /* b broadcast over a's rows */
    DDP_OP_MUL,
    DDP_OP_SCALE,
    DDP_OP_RELU,
    DDP_OP_DROPOUT,
    DDP_OP_SUM,
    DDP_OP_MEAN,
    DDP_OP_RESHAPE,
    DDP_OP_LOG_SOFTMAX,
    DDP_OP_NLL,
    DDP_OP_CROSS_ENTROPY,
    DDP_OP_SIGMOID,
    DDP_OP_TANH,
    DDP_OP_MSE,
};

#define DDP_VAR_MAX_IN 3

struct ddp_var {
    ddp_tensor t;       /* value (data in the arena, or borrowed) */
    float *grad;        /* gradient (arena), p->grad for a parameter, or NULL */
    int op;             /* enum ddp__op */
    int requires_grad;
    int nin;
    ddp_var_t *in[DDP_VAR_MAX_IN];
    ddp_param *param;   /* the parameter of a parameter leaf */
    float f;            /* scalar argument (scale) */
    float *aux;         /* saved for backward: softmax probabilities, dropout mask */
    int64_t *labels;    /* nll / cross-entropy labels (arena copy) */
    size_t index;       /* position on the tape */
    /* backward bookkeeping, reset at the start of every backward */
    int reachable;      /* on a path to the loss */
    int grad_written;   /* grad holds a value for this backward (else write, not add) */
    unsigned released;  /* bit j: this op's use of in[j] is accounted (ddp__tape_release) */
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
};

/* 64-byte aligned scratch from the tape's arena, valid until reset; NULL
 * (with the error set) when memory runs out. */
void *ddp__tape_alloc(ddp_tape_t *tape, size_t bytes);
/* Appends a new var of the given shape with arena storage for its value
 * (data NULL: storage not allocated, the op sets t.data). */
int ddp__tape_push(ddp_tape_t *tape, int op, int ndim, const int64_t *shape, int alloc_data,
                   ddp_var_t **out);

/* Is v a var of this tape's current iteration?  Never dereferences v. */
int ddp__tape_has(const ddp_tape_t *tape, const ddp_var_t *v);
/* Backward of one op (ops.c): reads v->grad, writes its inputs' grads. */
int ddp__op_backward(ddp_tape_t *tape, ddp_var_t *v);
/* Accounts for v's use of its input j (once; later calls do nothing): one
 * pending use of its parameter less, and the grad-ready hook when that was
 * the last (contract rule 3).  Returns the hook's status. */
int ddp__tape_release(ddp_tape_t *tape, ddp_var_t *v, int j);
/* The gradient buffer of v for writing and whether to add (1) or write (0). */
float *ddp__grad_target(ddp_tape_t *tape, ddp_var_t *v, int *acc);

#endif
