/* Models: modules and free parameters in registration order, sealed into one
 * flat parameter block and one flat gradient block (STYLE.md rule 8), the
 * grad-ready hook, zero_grad, train/eval, gradient re-pointing for DDP. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "nn/module.h"
#include "tensor/kernels.h"
#include "ddp/ext.h"

typedef struct entry {
    char name[DDP_PARAM_NAME_MAX];
    ddp_module_t *module; /* or */
    ddp_param *param;     /* a free parameter */
} entry;

struct ddp_model {
    entry *entries;
    size_t nentries, entries_cap;
    ddp_param **params;   /* registration order, after seal */
    size_t nparams;
    float *pblock, *gblock; /* (numel) each */
    size_t numel;
    int sealed, training;
    ddp_grad_ready_fn hook;
    void *hook_user;
    ddp_grad_chunk_hook chunk_hook;
    int has_chunk_hook;
    ddp_grad_write_fn write_hook;
    void *write_user;
    uint64_t param_version; /* bumped by every in-place writer (nn.h) */
};

int ddp_model_create(ddp_model_t **out)
{
    DDP_FAIL_IF(!out, DDP_ERR_INVALID_ARG, "model: out is NULL");
    ddp_model_t *m = calloc(1, sizeof *m);
    DDP_FAIL_IF(!m, DDP_ERR_NOMEM, "model: out of memory");
    m->training = 1;
    *out = m;
    return 0;
}

static void module_release(ddp_module_t *mod)
{
    if (mod) {
        mod->owned = 0;
        ddp_module_destroy(mod);
    }
}

void ddp_model_destroy(ddp_model_t *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->nentries; i++) {
        module_release(m->entries[i].module);
        ddp__param_destroy(m->entries[i].param);
    }
    free(m->entries);
    free(m->params);
    ddp__free_aligned(m->pblock);
    ddp__free_aligned(m->gblock);
    free(m);
}

static int add_entry(ddp_model_t *m, const char *name, entry **out)
{
    DDP_FAIL_IF(m->sealed, DDP_ERR_STATE,
                "model: cannot add \"%s\": the model is sealed (it has been used)", name);
    DDP_FAIL_IF(strlen(name) >= DDP_PARAM_NAME_MAX, DDP_ERR_INVALID_ARG,
                "model: name \"%s\" is longer than %d bytes", name, DDP_PARAM_NAME_MAX - 1);
    if (m->nentries == m->entries_cap) {
        size_t ncap = m->entries_cap ? 2 * m->entries_cap : 8;
        entry *e = realloc(m->entries, ncap * sizeof *e);
        DDP_FAIL_IF(!e, DDP_ERR_NOMEM, "model: out of memory");
        m->entries = e;
        m->entries_cap = ncap;
    }
    entry *e = &m->entries[m->nentries];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    *out = e;
    return 0;
}

int ddp_model_add_module(ddp_model_t *m, const char *name, ddp_module_t *module)
{
    int rc = 0;
    entry *e;
    DDP_FAIL_OUT(!m || !name || !module, DDP_ERR_INVALID_ARG,
                 "model add module: NULL model, name or module");
    DDP_FAIL_OUT(module->owned, DDP_ERR_INVALID_ARG,
                 "model add module \"%s\": the module already belongs to a container or model",
                 name);
    DDP_TRY_OUT(add_entry(m, name, &e));
    e->module = module;
    module->owned = 1;
    ddp_module_train(module, m->training);
    m->nentries++;
    return 0;
out:
    if (module && !module->owned)
        ddp_module_destroy(module);
    return rc;
}

int ddp_model_add_param(ddp_model_t *m, const char *name, int ndim, const int64_t *shape,
                        ddp_param **out)
{
    DDP_FAIL_IF(!m || !name || !*name || !out, DDP_ERR_INVALID_ARG,
                "model add param: NULL or empty argument");
    entry *e;
    DDP_TRY(add_entry(m, name, &e));
    DDP_TRY(ddp__param_create(name, ndim, shape, &e->param));
    m->nentries++;
    *out = e->param;
    return 0;
}

int ddp_model_from_module(ddp_module_t *module, ddp_model_t **out)
{
    ddp_model_t *m;
    int rc = ddp_model_create(&m);
    if (rc < 0) {
        ddp_module_destroy(module);
        return rc;
    }
    if ((rc = ddp_model_add_module(m, "", module)) < 0 || (rc = ddp_model_seal(m)) < 0) {
        ddp_model_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* ==== sealing ============================================================= */

static int collect(ddp_model_t *m, ddp_module_t *mod, const char *prefix, size_t *n)
{
    char name[DDP_PARAM_NAME_MAX + 16];
    for (int i = 0; i < mod->nparams; i++) {
        ddp_param *p = mod->params[i];
        const char *dot = strrchr(p->name, '.');
        const char *local = dot ? dot + 1 : p->name;
        snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "", local);
        DDP_FAIL_IF(strlen(name) >= DDP_PARAM_NAME_MAX, DDP_ERR_INVALID_ARG,
                    "model: parameter name %s is longer than %d bytes", name,
                    DDP_PARAM_NAME_MAX - 1);
        memcpy(p->name, name, strlen(name) + 1); /* length checked above */
        if (m->params)
            m->params[*n] = p;
        (*n)++;
    }
    for (int i = 0; i < mod->nchildren; i++) {
        snprintf(name, sizeof name, "%s%s%d", prefix, *prefix ? "." : "", i);
        DDP_TRY(collect(m, mod->children[i], name, n));
    }
    return 0;
}

static int gather(ddp_model_t *m, size_t *n)
{
    *n = 0;
    for (size_t i = 0; i < m->nentries; i++) {
        entry *e = &m->entries[i];
        if (e->module) {
            DDP_TRY(collect(m, e->module, e->name, n));
        } else {
            if (m->params)
                m->params[*n] = e->param;
            (*n)++;
        }
    }
    return 0;
}

int ddp_model_seal(ddp_model_t *m)
{
    DDP_FAIL_IF(!m, DDP_ERR_INVALID_ARG, "model is NULL");
    if (m->sealed)
        return 0;
    int rc = 0;
    size_t n;
    DDP_TRY(gather(m, &n));
    m->params = calloc(n ? n : 1, sizeof *m->params);
    DDP_FAIL_IF(!m->params, DDP_ERR_NOMEM, "model: out of memory");
    DDP_TRY_OUT(gather(m, &n));
    size_t numel = 0;
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < i; j++)
            DDP_FAIL_OUT(strcmp(m->params[i]->name, m->params[j]->name) == 0,
                         DDP_ERR_INVALID_ARG, "model: two parameters are named \"%s\"",
                         m->params[i]->name);
        numel += m->params[i]->numel;
    }
    m->pblock = ddp__alloc_aligned(numel * sizeof(float));
    m->gblock = ddp__alloc_aligned(numel * sizeof(float));
    DDP_FAIL_OUT(!m->pblock || !m->gblock, DDP_ERR_NOMEM,
                 "model: cannot allocate %zu parameters", numel);
    /* Move every parameter into the blocks, packed in registration order. */
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        ddp_param *p = m->params[i];
        memcpy(m->pblock + off, p->data, p->numel * sizeof(float));
        memcpy(m->gblock + off, p->grad, p->numel * sizeof(float));
        ddp__free_aligned(p->data);
        ddp__free_aligned(p->priv.home_grad);
        p->priv.owns_storage = 0;
        p->data = p->priv.home_data = m->pblock + off;
        p->grad = p->priv.home_grad = m->gblock + off;
        p->offset = off;
        p->index = (int)i;
        p->priv.model = m;
        p->priv.var = NULL;
        p->priv.tape = NULL;
        off += p->numel;
    }
    m->nparams = n;
    m->numel = numel;
    m->sealed = 1;
    return 0;
out:
    free(m->params);
    m->params = NULL;
    ddp__free_aligned(m->pblock);
    ddp__free_aligned(m->gblock);
    m->pblock = m->gblock = NULL;
    return rc;
}

/* ==== use ================================================================= */

int ddp_model_forward(ddp_model_t *m, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y)
{
    DDP_FAIL_IF(!m || !y, DDP_ERR_INVALID_ARG, "model forward: NULL model or output");
    DDP_TRY(ddp_model_seal(m));
    int any = 0;
    for (size_t i = 0; i < m->nentries; i++) {
        if (!m->entries[i].module)
            continue;
        int rc = ddp_module_forward(m->entries[i].module, tape, x, &x);
        if (rc < 0)
            return *m->entries[i].name
                       ? ddp__error_context(rc, "model module \"%s\"", m->entries[i].name)
                       : rc;
        any = 1;
    }
    DDP_FAIL_IF(!any, DDP_ERR_STATE,
                "model forward: the model has no modules (write the forward with ddp_op_*)");
    *y = x;
    return 0;
}

void ddp_model_train(ddp_model_t *m, int training)
{
    if (!m)
        return;
    m->training = training ? 1 : 0;
    for (size_t i = 0; i < m->nentries; i++)
        ddp_module_train(m->entries[i].module, training);
}

int ddp_model_is_training(const ddp_model_t *m) { return m ? m->training : 0; }

size_t ddp_model_num_params(ddp_model_t *m)
{
    return m && ddp_model_seal(m) == 0 ? m->nparams : 0;
}

ddp_param *ddp_model_param(ddp_model_t *m, size_t i)
{
    return i < ddp_model_num_params(m) ? m->params[i] : NULL;
}

ddp_param *ddp_model_find_param(ddp_model_t *m, const char *name)
{
    size_t n = ddp_model_num_params(m);
    for (size_t i = 0; name && i < n; i++)
        if (strcmp(m->params[i]->name, name) == 0)
            return m->params[i];
    return NULL;
}

float *ddp_model_param_block(ddp_model_t *m, size_t *numel)
{
    size_t n = ddp_model_num_params(m);
    (void)n;
    if (numel)
        *numel = m && m->sealed ? m->numel : 0;
    return m && m->sealed ? m->pblock : NULL;
}

float *ddp_model_grad_block(ddp_model_t *m, size_t *numel)
{
    size_t n = ddp_model_num_params(m);
    (void)n;
    if (numel)
        *numel = m && m->sealed ? m->numel : 0;
    return m && m->sealed ? m->gblock : NULL;
}

int ddp_param_set_grad(ddp_param *p, float *ptr)
{
    DDP_FAIL_IF(!p || !p->priv.model, DDP_ERR_INVALID_ARG,
                "set grad: the parameter is NULL or not in a sealed model");
    float *dst = ptr ? ptr : p->priv.home_grad;
    if (dst != p->grad)
        memmove(dst, p->grad, p->numel * sizeof(float));
    p->grad = dst;
    return 0;
}

int ddp_param_set_data(ddp_param *p, float *ptr)
{
    DDP_FAIL_IF(!p || !p->priv.model, DDP_ERR_INVALID_ARG,
                "set data: the parameter is NULL or not in a sealed model");
    float *dst = ptr ? ptr : p->priv.home_data;
    if (!ptr && dst != p->data)
        memmove(dst, p->data, p->numel * sizeof(float));
    p->data = dst;
    p->priv.var = NULL; /* a cached leaf var would still see the old memory */
    p->priv.tape = NULL;
    return 0;
}

int ddp_model_set_grad_block(ddp_model_t *m, float *block)
{
    DDP_FAIL_IF(!m, DDP_ERR_INVALID_ARG, "set grad block: model is NULL");
    DDP_TRY(ddp_model_seal(m));
    for (size_t i = 0; i < m->nparams; i++)
        DDP_TRY(ddp_param_set_grad(m->params[i], block ? block + m->params[i]->offset : NULL));
    return 0;
}

void ddp_model_zero_grad(ddp_model_t *m)
{
    size_t n = ddp_model_num_params(m);
    for (size_t i = 0; i < n; i++)
        memset(m->params[i]->grad, 0, m->params[i]->numel * sizeof(float));
}

int ddp_model_clip_grad_norm(ddp_model_t *m, double max_norm, double norm_type,
                             double *total_norm)
{
    DDP_FAIL_IF(!m, DDP_ERR_INVALID_ARG, "clip_grad_norm: model is NULL");
    DDP_FAIL_IF(!(norm_type > 0), DDP_ERR_INVALID_ARG,
                "clip_grad_norm: norm_type %g must be > 0 (or INFINITY)", norm_type);
    DDP_FAIL_IF(!(max_norm >= 0), DDP_ERR_INVALID_ARG,
                "clip_grad_norm: max_norm %g must be >= 0", max_norm);
    size_t n = ddp_model_num_params(m);
    double acc = 0.0;
    for (size_t i = 0; i < n; i++) {
        const float *g = m->params[i]->grad;
        for (size_t j = 0; j < m->params[i]->numel; j++) {
            double a = fabs((double)g[j]);
            if (isinf(norm_type))
                acc = a > acc ? a : acc;
            else
                acc += norm_type == 2.0 ? a * a : pow(a, norm_type);
        }
    }
    double norm = isinf(norm_type) ? acc : norm_type == 2.0 ? sqrt(acc) : pow(acc, 1 / norm_type);
    if (total_norm)
        *total_norm = norm;
    double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0) /* torch multiplies by min(coef, 1): a no-op above 1 */
        for (size_t i = 0; i < n; i++)
            ddp__vec_scale_inplace(m->params[i]->grad, (float)coef, m->params[i]->numel);
    return 0;
}

void ddp_model_set_grad_ready_hook(ddp_model_t *m, ddp_grad_ready_fn fn, void *user)
{
    if (!m)
        return;
    m->hook = fn;
    m->hook_user = user;
}

ddp_grad_ready_fn ddp_model_grad_ready_hook(const ddp_model_t *m, void **user)
{
    if (user)
        *user = m ? m->hook_user : NULL;
    return m ? m->hook : NULL;
}

void ddp_model_set_grad_chunk_hook(ddp_model_t *m, const ddp_grad_chunk_hook *hook)
{
    if (!m)
        return;
    m->has_chunk_hook = hook && hook->plan && hook->chunk;
    if (m->has_chunk_hook)
        m->chunk_hook = *hook;
}

const ddp_grad_chunk_hook *ddp_model_grad_chunk_hook(const ddp_model_t *m)
{
    return m && m->has_chunk_hook ? &m->chunk_hook : NULL;
}

void ddp_model_set_grad_write_hook(ddp_model_t *m, ddp_grad_write_fn fn, void *user)
{
    if (!m)
        return;
    m->write_hook = fn;
    m->write_user = user;
}

ddp_grad_write_fn ddp_model_grad_write_hook(const ddp_model_t *m, void **user)
{
    if (user)
        *user = m ? m->write_user : NULL;
    return m ? m->write_hook : NULL;
}

static void reset_module(ddp_module_t *mod, ddp__rng *rng)
{
    if (mod->kind == DDP_MOD_LINEAR)
        ddp__linear_reset(mod, rng);
    if (mod->kind == DDP_MOD_USER && mod->def->reset)
        ddp__module_user_reset(mod, rng);
    for (int i = 0; i < mod->nchildren; i++)
        reset_module(mod->children[i], rng);
}

uint64_t ddp_model_param_version(const ddp_model_t *m) { return m ? m->param_version : 0; }

void ddp_model_bump_param_version(ddp_model_t *m)
{
    if (m)
        m->param_version++;
}

int ddp_model_reset_parameters(ddp_model_t *m, uint64_t seed)
{
    DDP_FAIL_IF(!m, DDP_ERR_INVALID_ARG, "reset parameters: model is NULL");
    m->param_version++;
    ddp__rng rng;
    ddp__rng_seed(&rng, seed);
    for (size_t i = 0; i < m->nentries; i++)
        if (m->entries[i].module)
            reset_module(m->entries[i].module, &rng);
    return 0;
}
