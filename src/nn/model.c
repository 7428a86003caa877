/* Models: modules and free parameters in registration order, sealed into one
 * flat parameter block and one flat gradient block (STYLE.md rule 8) over
 * the whole module tree, one buffer block, the state dict's order; the
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
    ddp_buffer **buffers;   /* state-dict order, after seal */
    size_t nbuffers;
    unsigned char *bblock;  /* (bbytes) every buffer, 8-byte aligned offsets */
    size_t bbytes;
    ddp__sd_item *sd;       /* the state dict: parameters and buffers, PyTorch's order */
    size_t nsd;
    int sealed, training;
    ddp_grad_ready_fn hook;
    void *hook_user;
    ddp_grad_chunk_hook chunk_hook;
    int has_chunk_hook;
    ddp_grad_write_fn write_hook;
    void *write_user;
    ddp_zero_grad_fn zero_hook;
    void *zero_user;
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
    free(m->buffers);
    free(m->sd);
    ddp__free_aligned(m->pblock);
    ddp__free_aligned(m->gblock);
    ddp__free_aligned(m->bblock);
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

/* The tree walk that seal runs twice: once to count (arrays NULL), once to
 * fill the parameter, buffer and state-dict arrays in PyTorch's orders. */
typedef struct walk {
    ddp_param **params;
    ddp_buffer **buffers;
    ddp__sd_item *sd;
    size_t np, nb, nsd;
} walk;

/* Full name prefix.local into name (which holds a local or stale full name). */
static int full_name(char *name, const char *prefix, const char *what)
{
    const char *dot = strrchr(name, '.');
    const char *local = dot ? dot + 1 : name;
    char full[DDP_PARAM_NAME_MAX + 16];
    int n = snprintf(full, sizeof full, "%s%s%s", prefix, *prefix ? "." : "", local);
    DDP_FAIL_IF(n < 0 || n >= DDP_PARAM_NAME_MAX, DDP_ERR_INVALID_ARG,
                "model: %s name %s is longer than %d bytes", what, full, DDP_PARAM_NAME_MAX - 1);
    memcpy(name, full, (size_t)n + 1);
    return 0;
}

static int collect(walk *w, ddp_module_t *mod, const char *prefix)
{
    for (int i = 0; i < mod->nparams; i++) {
        ddp_param *p = mod->params[i];
        DDP_TRY(full_name(p->name, prefix, "parameter"));
        if (w->params)
            w->params[w->np] = p, w->sd[w->nsd] = (ddp__sd_item){p->name, p, NULL};
        w->np++, w->nsd++;
    }
    for (int i = 0; i < mod->nbuffers; i++) {
        ddp_buffer *b = mod->buffers[i];
        DDP_TRY(full_name(b->name, prefix, "buffer"));
        if (w->buffers)
            w->buffers[w->nb] = b, w->sd[w->nsd] = (ddp__sd_item){b->name, NULL, b};
        w->nb++, w->nsd++;
    }
    char name[DDP_PARAM_NAME_MAX + 16];
    for (int i = 0; i < mod->nchildren; i++) {
        snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "", mod->child_names[i]);
        DDP_TRY(collect(w, mod->children[i], name));
    }
    return 0;
}

static int gather(ddp_model_t *m, walk *w)
{
    w->np = w->nb = w->nsd = 0;
    for (size_t i = 0; i < m->nentries; i++) {
        entry *e = &m->entries[i];
        if (e->module) {
            DDP_TRY(collect(w, e->module, e->name));
        } else {
            if (w->params)
                w->params[w->np] = e->param, w->sd[w->nsd] = (ddp__sd_item){e->param->name,
                                                                            e->param, NULL};
            w->np++, w->nsd++;
        }
    }
    return 0;
}

/* No two state-dict entries share a name. */
static int check_unique(const walk *w)
{
    for (size_t i = 0; i < w->nsd; i++)
        for (size_t j = 0; j < i; j++)
            DDP_FAIL_IF(strcmp(w->sd[i].name, w->sd[j].name) == 0, DDP_ERR_INVALID_ARG,
                        "model: two %s are named \"%s\"",
                        w->sd[i].param && w->sd[j].param     ? "parameters"
                        : !w->sd[i].param && !w->sd[j].param ? "buffers"
                                                             : "entries (a parameter and a buffer)",
                        w->sd[i].name);
    return 0;
}

/* Moves every parameter into the blocks, packed in registration order. */
static void place_params(ddp_model_t *m)
{
    size_t off = 0;
    for (size_t i = 0; i < m->nparams; i++) {
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
}

/* Buffers at 8-byte aligned offsets (int64 ones need it) of one block. */
static size_t buffer_offset(size_t at) { return (at + 7) / 8 * 8; }

static void place_buffers(ddp_model_t *m)
{
    size_t off = 0;
    for (size_t i = 0; i < m->nbuffers; i++) {
        ddp_buffer *b = m->buffers[i];
        off = buffer_offset(off);
        memcpy(m->bblock + off, b->data, b->nbytes);
        ddp__free_aligned(b->data);
        b->priv.owns_storage = 0;
        b->data = m->bblock + off;
        b->offset = off;
        b->index = (int)i;
        off += b->nbytes;
    }
}

int ddp_model_seal(ddp_model_t *m)
{
    DDP_FAIL_IF(!m, DDP_ERR_INVALID_ARG, "model is NULL");
    if (m->sealed)
        return 0;
    int rc = 0;
    walk w = {0};
    DDP_TRY(gather(m, &w));
    w.params = calloc(w.np + 1, sizeof *w.params);
    w.buffers = calloc(w.nb + 1, sizeof *w.buffers);
    w.sd = calloc(w.nsd + 1, sizeof *w.sd);
    DDP_FAIL_OUT(!w.params || !w.buffers || !w.sd, DDP_ERR_NOMEM, "model: out of memory");
    DDP_TRY_OUT(gather(m, &w));
    DDP_TRY_OUT(check_unique(&w));
    size_t numel = 0, nbytes = 0;
    for (size_t i = 0; i < w.np; i++)
        numel += w.params[i]->numel;
    for (size_t i = 0; i < w.nb; i++)
        nbytes = buffer_offset(nbytes) + w.buffers[i]->nbytes;
    m->pblock = ddp__alloc_aligned(numel * sizeof(float));
    m->gblock = ddp__alloc_aligned(numel * sizeof(float));
    m->bblock = nbytes ? ddp__calloc_aligned(nbytes) : NULL;
    DDP_FAIL_OUT(!m->pblock || !m->gblock || (nbytes && !m->bblock), DDP_ERR_NOMEM,
                 "model: cannot allocate %zu parameters and %zu bytes of buffers", numel, nbytes);
    m->params = w.params, m->nparams = w.np, m->numel = numel;
    m->buffers = w.buffers, m->nbuffers = w.nb, m->bbytes = nbytes;
    m->sd = w.sd, m->nsd = w.nsd;
    place_params(m);
    place_buffers(m);
    m->sealed = 1;
    return 0;
out:
    free(w.params);
    free(w.buffers);
    free(w.sd);
    ddp__free_aligned(m->pblock);
    ddp__free_aligned(m->gblock);
    ddp__free_aligned(m->bblock);
    m->pblock = m->gblock = NULL;
    m->bblock = NULL;
    return rc;
}

int ddp__model_state_dict(ddp_model_t *m, const ddp__sd_item **items, size_t *n)
{
    DDP_TRY(ddp_model_seal(m));
    *items = m->sd;
    *n = m->nsd;
    return 0;
}

size_t ddp_model_num_buffers(ddp_model_t *m)
{
    return m && ddp_model_seal(m) == 0 ? m->nbuffers : 0;
}

ddp_buffer *ddp_model_buffer(ddp_model_t *m, size_t i)
{
    return i < ddp_model_num_buffers(m) ? m->buffers[i] : NULL;
}

ddp_buffer *ddp_model_find_buffer(ddp_model_t *m, const char *name)
{
    size_t n = ddp_model_num_buffers(m);
    for (size_t i = 0; name && i < n; i++)
        if (strcmp(m->buffers[i]->name, name) == 0)
            return m->buffers[i];
    return NULL;
}

void *ddp_model_buffer_block(ddp_model_t *m, size_t *nbytes)
{
    size_t n = ddp_model_num_buffers(m);
    if (nbytes)
        *nbytes = n ? m->bbytes : 0;
    return n ? m->bblock : NULL;
}

int ddp_model_visit_modules(ddp_model_t *m, ddp_module_visit_fn fn, void *user)
{
    DDP_FAIL_IF(!m || !fn, DDP_ERR_INVALID_ARG, "model visit: NULL model or function");
    for (size_t i = 0; i < m->nentries; i++)
        if (m->entries[i].module)
            DDP_TRY(ddp_module_visit(m->entries[i].module, m->entries[i].name, fn, user));
    return 0;
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
    if (m && m->zero_hook)
        m->zero_hook(m, m->zero_user);
}

void ddp_model_set_zero_grad_hook(ddp_model_t *m, ddp_zero_grad_fn fn, void *user)
{
    if (!m)
        return;
    m->zero_hook = fn;
    m->zero_user = fn ? user : NULL;
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
    ddp_generator gen;
    ddp_generator_seed(&gen, seed);
    for (size_t i = 0; i < m->nentries; i++)
        if (m->entries[i].module)
            DDP_TRY(ddp__module_reset(m->entries[i].module, &gen));
    return 0;
}
