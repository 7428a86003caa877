/* Modules: Linear, ReLU, Flatten, Dropout, Sequential (torch.nn's), each a
 * forward that appends ops to a tape; autograd does the backward. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "nn/module.h"

/* ==== parameters ========================================================== */

int ddp__param_create(const char *name, int ndim, const int64_t *shape, ddp_param **out)
{
    DDP_FAIL_IF(!name || strlen(name) >= DDP_PARAM_NAME_MAX, DDP_ERR_INVALID_ARG,
                "parameter name is NULL or longer than %d bytes", DDP_PARAM_NAME_MAX - 1);
    ddp_tensor t;
    memset(&t, 0, sizeof t);
    float dummy;
    DDP_TRY(ddp_tensor_wrap(&t, &dummy, ndim, shape)); /* validates the shape */
    ddp_param *p = calloc(1, sizeof *p);
    DDP_FAIL_IF(!p, DDP_ERR_NOMEM, "parameter %s: out of memory", name);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->numel = (size_t)t.numel;
    p->ndim = ndim;
    memcpy(p->shape, t.shape, sizeof p->shape);
    p->data = ddp__calloc_aligned(p->numel * sizeof(float));
    p->grad = ddp__calloc_aligned(p->numel * sizeof(float));
    p->priv.home_grad = p->grad;
    p->priv.owns_storage = 1;
    p->index = -1;
    if (!p->data || !p->grad) {
        ddp__param_destroy(p);
        return DDP_ERROR(DDP_ERR_NOMEM, "parameter %s: cannot allocate %zu floats", name,
                         (size_t)t.numel);
    }
    *out = p;
    return 0;
}

void ddp__param_destroy(ddp_param *p)
{
    if (!p)
        return;
    if (p->priv.owns_storage) {
        ddp__free_aligned(p->data);
        ddp__free_aligned(p->priv.home_grad);
    }
    free(p);
}

/* ==== creation ============================================================ */

static int module_new(int kind, ddp_module_t **out)
{
    DDP_FAIL_IF(!out, DDP_ERR_INVALID_ARG, "module: out is NULL");
    ddp_module_t *m = calloc(1, sizeof *m);
    DDP_FAIL_IF(!m, DDP_ERR_NOMEM, "module: out of memory");
    m->kind = kind;
    m->training = 1;
    *out = m;
    return 0;
}

static void module_free(ddp_module_t *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->nchildren; i++)
        module_free(m->children[i]);
    free(m->children);
    for (int i = 0; i < m->nparams; i++)
        ddp__param_destroy(m->params[i]);
    if (m->def && m->def->destroy)
        m->def->destroy(m->user);
    free(m);
}

void ddp_module_destroy(ddp_module_t *m)
{
    if (m && !m->owned)
        module_free(m);
}

/* Sample U(-bound, bound) as PyTorch's uniform_ does: from + (to - from) * u. */
static void uniform_fill(float *x, size_t n, double bound, ddp__rng *rng)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(-bound + 2.0 * bound * ddp__rng_uniform(rng));
}

void ddp__linear_reset(ddp_module_t *m, ddp__rng *rng)
{
    /* kaiming_uniform_(a=sqrt(5)) gives bound = gain * sqrt(3 / fan_in) with
     * gain = sqrt(2 / (1 + 5)): exactly 1/sqrt(fan_in); the bias uses the
     * same bound. */
    double bound = 1.0 / sqrt((double)m->in_features);
    for (int i = 0; i < m->nparams; i++)
        uniform_fill(m->params[i]->data, m->params[i]->numel, bound, rng);
}

int ddp_linear_create(int in_features, int out_features, int bias, uint64_t seed,
                      ddp_module_t **out)
{
    DDP_FAIL_IF(in_features <= 0 || out_features <= 0, DDP_ERR_INVALID_ARG,
                "linear: in_features %d and out_features %d must be > 0", in_features,
                out_features);
    ddp_module_t *m = NULL;
    DDP_TRY(module_new(DDP_MOD_LINEAR, &m));
    m->in_features = in_features;
    m->out_features = out_features;
    int rc = ddp__param_create("weight", 2, (int64_t[]){out_features, in_features},
                               &m->params[0]);
    if (rc == 0) {
        m->nparams = 1;
        if (bias) {
            rc = ddp__param_create("bias", 1, (int64_t[]){out_features}, &m->params[1]);
            if (rc == 0)
                m->nparams = 2;
        }
    }
    if (rc < 0) {
        module_free(m);
        return rc;
    }
    ddp__rng rng;
    ddp__rng_seed(&rng, seed);
    ddp__linear_reset(m, &rng);
    *out = m;
    return 0;
}

int ddp_relu_create(ddp_module_t **out) { return module_new(DDP_MOD_RELU, out); }

int ddp_flatten_create(ddp_module_t **out) { return module_new(DDP_MOD_FLATTEN, out); }

int ddp_dropout_create(float p, uint64_t seed, ddp_module_t **out)
{
    DDP_FAIL_IF(!(p >= 0.0f && p <= 1.0f), DDP_ERR_INVALID_ARG,
                "dropout: probability %g is not in [0, 1]", (double)p);
    ddp_module_t *m = NULL;
    DDP_TRY(module_new(DDP_MOD_DROPOUT, &m));
    m->p = p;
    ddp__rng_seed(&m->rng, seed);
    *out = m;
    return 0;
}

int ddp_sequential_create(ddp_module_t *const *modules, int n, ddp_module_t **out)
{
    int rc = 0;
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
    DDP_TRY_OUT(module_new(DDP_MOD_SEQUENTIAL, &m));
    m->children = calloc((size_t)(n ? n : 1), sizeof *m->children);
    DDP_FAIL_OUT(!m->children, DDP_ERR_NOMEM, "sequential: out of memory");
    for (int i = 0; i < n; i++) {
        m->children[i] = modules[i];
        modules[i]->owned = 1;
    }
    m->nchildren = n;
    *out = m;
    return 0;
out:
    /* Ownership was taken: free what we were given (not what others own). */
    if (m)
        free(m->children), free(m);
    for (int i = 0; modules && i < n; i++) {
        int dup = 0;
        for (int j = 0; j < i; j++)
            dup |= modules[j] == modules[i];
        if (modules[i] && !dup && !modules[i]->owned)
            module_free(modules[i]);
    }
    return rc;
}

/* ==== use ================================================================= */

int ddp_module_forward(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y)
{
    DDP_FAIL_IF(!m, DDP_ERR_INVALID_ARG, "module forward: module is NULL");
    switch (m->kind) {
    case DDP_MOD_LINEAR: {
        ddp_var_t *w, *b = NULL;
        DDP_TRY(ddp_tape_param(tape, m->params[0], &w));
        if (m->nparams > 1)
            DDP_TRY(ddp_tape_param(tape, m->params[1], &b));
        return ddp_op_linear(tape, x, w, b, y);
    }
    case DDP_MOD_RELU:
        return ddp_op_relu(tape, x, y);
    case DDP_MOD_FLATTEN:
        return ddp_op_flatten(tape, x, y);
    case DDP_MOD_DROPOUT:
        /* One seed per forward from the module's generator: reproducible. */
        return ddp_op_dropout(tape, x, m->p, m->training, ddp__rng_next(&m->rng), y);
    case DDP_MOD_USER:
        return m->def->forward(m, tape, x, y, m->user);
    case DDP_MOD_SEQUENTIAL:
        for (int i = 0; i < m->nchildren; i++) {
            int rc = ddp_module_forward(m->children[i], tape, x, &x);
            if (rc < 0)
                return ddp__error_context(rc, "sequential layer %d", i);
        }
        *y = x;
        return 0;
    default:
        return DDP_ERROR(DDP_ERR_STATE, "module forward: unknown module kind %d", m->kind);
    }
}

ddp_param *ddp_module_param(ddp_module_t *m, const char *name)
{
    if (!m || !name)
        return NULL;
    for (int i = 0; i < m->nparams; i++) {
        const char *full = m->params[i]->name, *dot = strrchr(full, '.');
        if (strcmp(dot ? dot + 1 : full, name) == 0)
            return m->params[i];
    }
    return NULL;
}

ddp_module_t *ddp_module_child(ddp_module_t *m, int i)
{
    return m && i >= 0 && i < m->nchildren ? m->children[i] : NULL;
}

void ddp_module_train(ddp_module_t *m, int training)
{
    if (!m)
        return;
    m->training = training ? 1 : 0;
    for (int i = 0; i < m->nchildren; i++)
        ddp_module_train(m->children[i], training);
}
