/* The basic layers of torch.nn as modules (module.c): Linear, ReLU,
 * Flatten, Dropout, Sequential.  Each is a ddp_module_def with a forward
 * that appends ops to a tape; autograd does the backward. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "nn/conv.h"
#include "nn/module.h"

/* ==== Linear ============================================================== */

typedef struct linear {
    int in_features, out_features;
    ddp_param *weight, *bias; /* bias NULL without one */
} linear;

static int linear_forward(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y,
                          void *user)
{
    (void)m;
    linear *l = user;
    ddp_var_t *w, *b = NULL;
    DDP_TRY(ddp_tape_param(tape, l->weight, &w));
    if (l->bias)
        DDP_TRY(ddp_tape_param(tape, l->bias, &b));
    return ddp_op_linear(tape, x, w, b, y);
}

static int linear_reset(ddp_module_t *m, ddp_generator *gen, void *user)
{
    (void)m;
    linear *l = user;
    /* kaiming_uniform_(a=sqrt(5)) gives bound = gain * sqrt(3 / fan_in) with
     * gain = sqrt(2 / (1 + 5)): exactly 1/sqrt(fan_in); the bias uses the
     * same bound.  Written as 1/sqrt(in) so that the draws stay bitwise
     * what they have always been (ddp-mnist's tests depend on them). */
    double bound = 1.0 / sqrt((double)l->in_features);
    DDP_TRY(ddp_init_uniform(l->weight, -bound, bound, gen));
    return l->bias ? ddp_init_uniform(l->bias, -bound, bound, gen) : 0;
}

static const ddp_module_def linear_def = {"Linear", linear_forward, linear_reset, free};

int ddp_linear_create(int in_features, int out_features, int bias, uint64_t seed,
                      ddp_module_t **out)
{
    DDP_FAIL_IF(in_features <= 0 || out_features <= 0, DDP_ERR_INVALID_ARG,
                "linear: in_features %d and out_features %d must be > 0", in_features,
                out_features);
    linear *l = calloc(1, sizeof *l);
    DDP_FAIL_IF(!l, DDP_ERR_NOMEM, "linear: out of memory");
    l->in_features = in_features;
    l->out_features = out_features;
    ddp_module_t *m;
    DDP_TRY(ddp_module_create(&linear_def, l, &m));
    int rc = ddp_module_add_param(m, "weight", 2, (int64_t[]){out_features, in_features},
                                  &l->weight);
    if (rc == 0 && bias)
        rc = ddp_module_add_param(m, "bias", 1, (int64_t[]){out_features}, &l->bias);
    ddp_generator gen;
    ddp_generator_seed(&gen, seed);
    if (rc == 0)
        rc = linear_reset(m, &gen, l);
    if (rc < 0) {
        ddp__module_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* ==== ReLU, Flatten ======================================================= */

static int relu_forward(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y,
                        void *user)
{
    (void)m, (void)user;
    return ddp_op_relu(tape, x, y);
}

static int flatten_forward(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y,
                           void *user)
{
    (void)m, (void)user;
    return ddp_op_flatten(tape, x, y);
}

static const ddp_module_def relu_def = {"ReLU", relu_forward, NULL, NULL};
static const ddp_module_def flatten_def = {"Flatten", flatten_forward, NULL, NULL};

int ddp_relu_create(ddp_module_t **out) { return ddp_module_create(&relu_def, NULL, out); }

int ddp_flatten_create(ddp_module_t **out) { return ddp_module_create(&flatten_def, NULL, out); }

/* ==== Dropout ============================================================= */

typedef struct dropout {
    float p;
    ddp__rng rng; /* masks */
} dropout;

static int dropout_forward(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y,
                           void *user)
{
    dropout *d = user;
    /* One seed per training forward from the module's generator:
     * reproducible; eval draws nothing, so that evaluating between epochs
     * leaves the masks of the next one as they were (PyTorch's likewise). */
    uint64_t seed = m->training ? ddp__rng_next(&d->rng) : 0;
    return ddp_op_dropout(tape, x, d->p, m->training, seed, y);
}

static const ddp_module_def dropout_def = {"Dropout", dropout_forward, NULL, free};

int ddp_dropout_create(float p, uint64_t seed, ddp_module_t **out)
{
    DDP_FAIL_IF(!(p >= 0.0f && p <= 1.0f), DDP_ERR_INVALID_ARG,
                "dropout: probability %g is not in [0, 1]", (double)p);
    dropout *d = calloc(1, sizeof *d);
    DDP_FAIL_IF(!d, DDP_ERR_NOMEM, "dropout: out of memory");
    d->p = p;
    ddp__rng_seed(&d->rng, seed);
    DDP_TRY(ddp_module_create(&dropout_def, d, out));
    (*out)->rng = &d->rng; /* checkpoints keep where the masks are */
    return 0;
}

/* ==== Sequential ========================================================== */

/* A Conv2d followed by a ReLU runs as one op (conv.c: the values and
 * gradients of the two, without the pre-activation tensor, which no one
 * outside Sequential could reach): 9 % of ddp-cnn's cycles went to the
 * ReLUs' passes over the convolutions' outputs. */
static int sequential_forward(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y,
                              void *user)
{
    (void)user;
    for (int i = 0; i < m->nchildren; i++) {
        ddp_module_t *c = m->children[i];
        /* Conv2d, ReLU (, MaxPool2d(2)) as one op: fuse counts the modules after c */
        int fuse = i + 1 < m->nchildren && m->children[i + 1]->def == &relu_def &&
                   ddp__conv2d_module_is(c);
        fuse += fuse && i + 2 < m->nchildren && ddp__max_pool2_module_is(m->children[i + 2]);
        int rc = fuse ? ddp__conv2d_module_forward(
                            c, tape, x, fuse == 2 ? DDP__CONV_RELU_POOL2 : DDP__CONV_RELU, &x)
                      : ddp_module_forward(c, tape, x, &x);
        if (rc < 0 && fuse)
            return ddp__error_context(rc, "sequential layers %d to %d", i, i + fuse);
        if (rc < 0)
            return ddp__error_context(rc, "sequential layer %d", i);
        i += fuse;
    }
    *y = x;
    return 0;
}

static const ddp_module_def sequential_def = {"Sequential", sequential_forward, NULL, NULL};

/* Frees what Sequential was given and no one else owns, once each. */
static void free_given(ddp_module_t *const *modules, int n)
{
    for (int i = 0; modules && i < n; i++) {
        int dup = 0;
        for (int j = 0; j < i; j++)
            dup |= modules[j] == modules[i];
        if (modules[i] && !dup && !modules[i]->owned)
            ddp__module_free(modules[i]);
    }
}

int ddp_sequential_create(ddp_module_t *const *modules, int n, ddp_module_t **out)
{
    int rc = 0, added = 0;
    ddp_module_t *m = NULL;
    DDP_FAIL_OUT(n < 0 || (n > 0 && !modules), DDP_ERR_INVALID_ARG,
                 "sequential: %d modules from a NULL array", n);
    for (int i = 0; i < n; i++) {
        DDP_FAIL_OUT(!modules[i], DDP_ERR_INVALID_ARG, "sequential: module %d is NULL", i);
        DDP_FAIL_OUT(modules[i]->owned, DDP_ERR_INVALID_ARG,
                     "sequential: module %d already belongs to a container or model", i);
        for (int j = 0; j < i; j++)
            DDP_FAIL_OUT(modules[j] == modules[i], DDP_ERR_INVALID_ARG,
                         "sequential: module %d is module %d again (share parameters with "
                         "the ops API instead)", i, j);
    }
    DDP_TRY_OUT(ddp_module_create(&sequential_def, NULL, &m));
    for (; added < n; added++) {
        char name[16];
        snprintf(name, sizeof name, "%d", added);
        DDP_TRY_OUT(ddp_module_add_child(m, name, modules[added]));
    }
    *out = m;
    return 0;
out:
    /* Ownership was taken: the children added go with m, the one that failed
     * was freed by add_child, the rest are freed here. */
    if (m) {
        ddp__module_free(m);
        modules += added + 1;
        n -= added + 1;
    }
    free_given(modules, n);
    return rc;
}
