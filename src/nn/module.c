/* Modules (torch.nn.Module): a type with a forward, the user's state, own
 * parameters and buffers, named children to any depth.  The built-in layers
 * (layers.c, batchnorm.c) are modules made this same way; a model
 * (model.c) lays the whole tree's parameters out flat. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "nn/module.h"

/* ==== parameters and buffers ============================================== */

/* Validates name and shape; *numel and *t_shape from the shape. */
static int check_tensor(const char *what, const char *name, int ndim, const int64_t *shape,
                        size_t *numel, int64_t *out_shape)
{
    DDP_FAIL_IF(!name || !*name || strlen(name) >= DDP_PARAM_NAME_MAX, DDP_ERR_INVALID_ARG,
                "%s name is NULL, empty or longer than %d bytes", what,
                DDP_PARAM_NAME_MAX - 1);
    ddp_tensor t;
    memset(&t, 0, sizeof t);
    float dummy;
    DDP_TRY(ddp_tensor_wrap(&t, &dummy, ndim, shape)); /* validates the shape */
    *numel = (size_t)t.numel;
    memcpy(out_shape, t.shape, sizeof t.shape);
    return 0;
}

int ddp__param_create(const char *name, int ndim, const int64_t *shape, ddp_param **out)
{
    size_t numel;
    int64_t sh[DDP_TENSOR_MAX_DIM];
    DDP_TRY(check_tensor("parameter", name, ndim, shape, &numel, sh));
    ddp_param *p = calloc(1, sizeof *p);
    DDP_FAIL_IF(!p, DDP_ERR_NOMEM, "parameter %s: out of memory", name);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->numel = numel;
    p->ndim = ndim;
    memcpy(p->shape, sh, sizeof p->shape);
    p->data = ddp__calloc_aligned(p->numel * sizeof(float));
    p->grad = ddp__calloc_aligned(p->numel * sizeof(float));
    p->priv.home_grad = p->grad;
    p->priv.owns_storage = 1;
    p->index = -1;
    if (!p->data || !p->grad) {
        ddp__param_destroy(p);
        return DDP_ERROR(DDP_ERR_NOMEM, "parameter %s: cannot allocate %zu floats", name, numel);
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

int ddp__buffer_create(const char *name, ddp_dtype dtype, int ndim, const int64_t *shape,
                       ddp_buffer **out)
{
    DDP_FAIL_IF(dtype != DDP_FLOAT32 && dtype != DDP_INT64, DDP_ERR_INVALID_ARG,
                "buffer %s: dtype %s is not float32 or int64", name ? name : "(null)",
                ddp_dtype_name(dtype));
    size_t numel;
    int64_t sh[DDP_TENSOR_MAX_DIM];
    DDP_TRY(check_tensor("buffer", name, ndim, shape, &numel, sh));
    ddp_buffer *b = calloc(1, sizeof *b);
    DDP_FAIL_IF(!b, DDP_ERR_NOMEM, "buffer %s: out of memory", name);
    snprintf(b->name, sizeof b->name, "%s", name);
    b->dtype = dtype;
    b->numel = numel;
    b->nbytes = numel * ddp_dtype_size(dtype);
    b->ndim = ndim;
    memcpy(b->shape, sh, sizeof b->shape);
    b->index = -1;
    b->data = ddp__calloc_aligned(b->nbytes);
    b->priv.owns_storage = 1;
    if (!b->data) {
        size_t nbytes = b->nbytes;
        free(b);
        return DDP_ERROR(DDP_ERR_NOMEM, "buffer %s: cannot allocate %zu bytes", name, nbytes);
    }
    *out = b;
    return 0;
}

void ddp__buffer_destroy(ddp_buffer *b)
{
    if (!b)
        return;
    if (b->priv.owns_storage)
        ddp__free_aligned(b->data);
    free(b);
}

/* ==== creation ============================================================ */

int ddp_module_create(const ddp_module_def *def, void *user, ddp_module_t **out)
{
    int rc = 0;
    DDP_FAIL_OUT(!def || !def->forward || !out, DDP_ERR_INVALID_ARG,
                 "module create: NULL definition, forward or output");
    ddp_module_t *m = calloc(1, sizeof *m);
    DDP_FAIL_OUT(!m, DDP_ERR_NOMEM, "module %s: out of memory", def->type ? def->type : "");
    m->def = def;
    m->user = user;
    m->training = 1;
    *out = m;
    return 0;
out:
    if (def && def->destroy && user)
        def->destroy(user);
    return rc;
}

void ddp__module_free(ddp_module_t *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->nchildren; i++) {
        ddp__module_free(m->children[i]);
        free(m->child_names[i]);
    }
    free(m->children);
    free(m->child_names);
    for (int i = 0; i < m->nparams; i++)
        ddp__param_destroy(m->params[i]);
    free(m->params);
    for (int i = 0; i < m->nbuffers; i++)
        ddp__buffer_destroy(m->buffers[i]);
    free(m->buffers);
    if (m->def->destroy && m->user)
        m->def->destroy(m->user);
    free(m);
}

void ddp_module_destroy(ddp_module_t *m)
{
    if (m && !m->owned)
        ddp__module_free(m);
}

/* Grows *arr (of *cap pointers) to hold n + 1. */
static int grow(void *arr, int *cap, int n, const char *what)
{
    void **a = *(void ***)arr;
    if (n < *cap)
        return 0;
    int ncap = *cap ? 2 * *cap : 4;
    a = realloc(a, (size_t)ncap * sizeof *a);
    DDP_FAIL_IF(!a, DDP_ERR_NOMEM, "module: out of memory adding %s", what);
    *(void ***)arr = a;
    *cap = ncap;
    return 0;
}

/* A local name is free when no parameter, buffer or child of m has it
 * (PyTorch's register_* rule); it may not contain '.'. */
static int check_local_name(const ddp_module_t *m, const char *name, const char *what)
{
    DDP_FAIL_IF(!name || !*name || strchr(name, '.'), DDP_ERR_INVALID_ARG,
                "module %s: %s name \"%s\" is empty or contains '.'", ddp_module_type(m), what,
                name ? name : "(null)");
    int taken = 0;
    for (int i = 0; i < m->nparams; i++)
        taken |= strcmp(m->params[i]->name, name) == 0;
    for (int i = 0; i < m->nbuffers; i++)
        taken |= strcmp(m->buffers[i]->name, name) == 0;
    for (int i = 0; i < m->nchildren; i++)
        taken |= strcmp(m->child_names[i], name) == 0;
    DDP_FAIL_IF(taken, DDP_ERR_INVALID_ARG,
                "module %s: \"%s\" is already a parameter, buffer or child of this module",
                ddp_module_type(m), name);
    DDP_FAIL_IF(m->owned, DDP_ERR_STATE,
                "module %s: cannot add %s \"%s\" after the module was given to a container "
                "or model", ddp_module_type(m), what, name);
    return 0;
}

int ddp_module_add_param(ddp_module_t *m, const char *name, int ndim, const int64_t *shape,
                         ddp_param **out)
{
    DDP_FAIL_IF(!m || !out, DDP_ERR_INVALID_ARG, "module add param: NULL module or output");
    DDP_TRY(check_local_name(m, name, "parameter"));
    DDP_TRY(grow(&m->params, &m->params_cap, m->nparams, name));
    DDP_TRY(ddp__param_create(name, ndim, shape, &m->params[m->nparams]));
    *out = m->params[m->nparams++];
    return 0;
}

int ddp_module_add_buffer(ddp_module_t *m, const char *name, ddp_dtype dtype, int ndim,
                          const int64_t *shape, ddp_buffer **out)
{
    DDP_FAIL_IF(!m || !out, DDP_ERR_INVALID_ARG, "module add buffer: NULL module or output");
    DDP_TRY(check_local_name(m, name, "buffer"));
    DDP_TRY(grow(&m->buffers, &m->buffers_cap, m->nbuffers, name));
    DDP_TRY(ddp__buffer_create(name, dtype, ndim, shape, &m->buffers[m->nbuffers]));
    *out = m->buffers[m->nbuffers++];
    return 0;
}

/* Is a an ancestor of (or) b?  A module added below itself would loop. */
static int contains(const ddp_module_t *a, const ddp_module_t *b)
{
    if (a == b)
        return 1;
    for (int i = 0; i < a->nchildren; i++)
        if (contains(a->children[i], b))
            return 1;
    return 0;
}

int ddp_module_add_child(ddp_module_t *m, const char *name, ddp_module_t *child)
{
    int rc = 0;
    DDP_FAIL_OUT(!m || !child, DDP_ERR_INVALID_ARG, "module add child: NULL module or child");
    DDP_FAIL_OUT(child->owned, DDP_ERR_INVALID_ARG,
                 "module %s: child \"%s\" already belongs to a container or model",
                 ddp_module_type(m), name ? name : "(null)");
    DDP_FAIL_OUT(contains(child, m), DDP_ERR_INVALID_ARG,
                 "module %s: child \"%s\" is the module itself or one of its ancestors",
                 ddp_module_type(m), name ? name : "(null)");
    DDP_TRY_OUT(check_local_name(m, name, "child"));
    if (m->nchildren == m->children_cap) { /* children and their names grow together */
        int cap = m->children_cap;
        DDP_TRY_OUT(grow(&m->children, &cap, m->nchildren, name));
        char **names = realloc(m->child_names, (size_t)cap * sizeof *names);
        DDP_FAIL_OUT(!names, DDP_ERR_NOMEM, "module: out of memory adding %s", name);
        m->child_names = names;
        m->children_cap = cap;
    }
    char *copy = strdup(name);
    DDP_FAIL_OUT(!copy, DDP_ERR_NOMEM, "module: out of memory adding %s", name);
    m->children[m->nchildren] = child;
    m->child_names[m->nchildren++] = copy;
    child->owned = 1;
    ddp_module_train(child, m->training);
    return 0;
out:
    /* Ownership passes also on failure, except when child holds m (a cycle
     * refused): freeing it would free the caller's own tree. */
    if (child && !child->owned && (!m || !contains(child, m)))
        ddp__module_free(child);
    return rc;
}

/* ==== use ================================================================= */

int ddp_module_forward(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y)
{
    DDP_FAIL_IF(!m || !y, DDP_ERR_INVALID_ARG, "module forward: NULL module or output");
    return m->def->forward(m, tape, x, y, m->user);
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

ddp_buffer *ddp_module_buffer(ddp_module_t *m, const char *name)
{
    if (!m || !name)
        return NULL;
    for (int i = 0; i < m->nbuffers; i++) {
        const char *full = m->buffers[i]->name, *dot = strrchr(full, '.');
        if (strcmp(dot ? dot + 1 : full, name) == 0)
            return m->buffers[i];
    }
    return NULL;
}

ddp_module_t *ddp_module_child(ddp_module_t *m, int i)
{
    return m && i >= 0 && i < m->nchildren ? m->children[i] : NULL;
}

ddp_module_t *ddp_module_child_by_name(ddp_module_t *m, const char *name)
{
    for (int i = 0; m && name && i < m->nchildren; i++)
        if (strcmp(m->child_names[i], name) == 0)
            return m->children[i];
    return NULL;
}

int ddp_module_num_children(const ddp_module_t *m) { return m ? m->nchildren : 0; }

void *ddp_module_user(const ddp_module_t *m) { return m ? m->user : NULL; }

const char *ddp_module_type(const ddp_module_t *m)
{
    return m && m->def->type ? m->def->type : "(module)";
}

int ddp_module_is_training(const ddp_module_t *m) { return m ? m->training : 0; }

uint64_t *ddp_module_rng_state(ddp_module_t *m, int *nwords)
{
    if (nwords)
        *nwords = m && m->rng ? 4 : 0;
    return m && m->rng ? m->rng->s : NULL;
}

void ddp_module_train(ddp_module_t *m, int training)
{
    if (!m)
        return;
    m->training = training ? 1 : 0;
    for (int i = 0; i < m->nchildren; i++)
        ddp_module_train(m->children[i], training);
}

int ddp_module_visit(ddp_module_t *m, const char *prefix, ddp_module_visit_fn fn, void *user)
{
    DDP_FAIL_IF(!m || !fn, DDP_ERR_INVALID_ARG, "module visit: NULL module or function");
    if (!prefix)
        prefix = "";
    int rc = fn(m, prefix, user);
    if (rc < 0)
        return rc;
    char name[DDP_PARAM_NAME_MAX];
    for (int i = 0; i < m->nchildren; i++) {
        int n = snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "",
                         m->child_names[i]);
        DDP_FAIL_IF(n < 0 || (size_t)n >= sizeof name, DDP_ERR_INVALID_ARG,
                    "module name %s.%s is longer than %d bytes", prefix, m->child_names[i],
                    DDP_PARAM_NAME_MAX - 1);
        DDP_TRY(ddp_module_visit(m->children[i], name, fn, user));
    }
    return 0;
}

int ddp__module_reset(ddp_module_t *m, ddp_generator *gen)
{
    if (m->def->reset) {
        int rc = m->def->reset(m, gen, m->user);
        if (rc < 0)
            return ddp__error_context(rc, "reset_parameters of %s", ddp_module_type(m));
    }
    for (int i = 0; i < m->nchildren; i++)
        DDP_TRY(ddp__module_reset(m->children[i], gen));
    return 0;
}
