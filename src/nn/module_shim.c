/* A STAND-IN for the modules helper's user modules (include/ddp/nn_module.h
 * says why): modules defined by a ddp_module_def in their own files, with
 * the same names and signatures as the full API, over the kind-switch of
 * module.c.  Replaced by the modules helper's module.c, layers.c and
 * init.c when the branches meet. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/rng.h"
#include "nn/module.h"

void ddp_generator_seed(ddp_generator *g, uint64_t seed)
{
    ddp__rng r;
    ddp__rng_seed(&r, seed);
    memcpy(g->s, r.s, sizeof g->s);
}

double ddp_generator_uniform(ddp_generator *g)
{
    ddp__rng r;
    memcpy(r.s, g->s, sizeof r.s);
    double u = ddp__rng_uniform(&r);
    memcpy(g->s, r.s, sizeof g->s);
    return u;
}

int ddp_module_create(const ddp_module_def *def, void *user, ddp_module_t **out)
{
    if (!def || !def->forward || !out) {
        if (def && def->destroy)
            def->destroy(user);
        return DDP_ERROR(DDP_ERR_INVALID_ARG, "module: NULL type, forward or out");
    }
    ddp_module_t *m = calloc(1, sizeof *m);
    if (!m) {
        if (def->destroy)
            def->destroy(user);
        return DDP_ERROR(DDP_ERR_NOMEM, "module %s: out of memory", def->type);
    }
    m->kind = DDP_MOD_USER;
    m->training = 1;
    m->def = def;
    m->user = user;
    *out = m;
    return 0;
}

int ddp_module_add_param(ddp_module_t *m, const char *name, int ndim, const int64_t *shape,
                         ddp_param **out)
{
    DDP_FAIL_IF(!m || !out, DDP_ERR_INVALID_ARG, "module: NULL module or out");
    DDP_FAIL_IF(m->nparams == DDP_MODULE_MAX_PARAMS, DDP_ERR_UNSUPPORTED,
                "module %s: more than %d parameters", m->def ? m->def->type : "?",
                DDP_MODULE_MAX_PARAMS);
    DDP_TRY(ddp__param_create(name, ndim, shape, &m->params[m->nparams]));
    *out = m->params[m->nparams++];
    return 0;
}

int ddp_module_is_training(const ddp_module_t *m) { return m ? m->training : 0; }

int ddp_init_uniform(ddp_param *p, double a, double b, ddp_generator *gen)
{
    DDP_FAIL_IF(!p || !gen, DDP_ERR_INVALID_ARG, "init uniform: NULL parameter or generator");
    for (size_t i = 0; i < p->numel; i++) /* PyTorch's uniform_: from + (to - from) * u */
        p->data[i] = (float)(a + (b - a) * ddp_generator_uniform(gen));
    return 0;
}

void ddp__module_user_reset(ddp_module_t *m, ddp__rng *rng)
{
    ddp_generator g;
    memcpy(g.s, rng->s, sizeof g.s);
    (void)m->def->reset(m, &g, m->user);
    memcpy(rng->s, g.s, sizeof rng->s);
}
