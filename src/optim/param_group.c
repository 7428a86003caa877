/* Parameter groups (torch.optim's param_groups): which parameters a group
 * holds (fnmatch patterns over state_dict names, or indices), the
 * hyperparameters it overrides, and the rule that every parameter is in
 * exactly one group. */
#include <fnmatch.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "optim/optim.h"

ddp_param_group ddp_param_group_defaults(void)
{
    ddp_param_group g;
    memset(&g, 0, sizeof g);
    g.lr = g.weight_decay = g.momentum = g.beta1 = g.beta2 = NAN;
    return g;
}

/* The options' own group list, cleared in a stored copy (it was borrowed). */
static void clear_group_list(int kind, ddp__optim_hyper *h)
{
    switch (kind) {
    case DDP__OPT_SGD:
        h->sgd.groups = NULL, h->sgd.ngroups = 0;
        break;
    case DDP__OPT_ADADELTA:
        h->adadelta.groups = NULL, h->adadelta.ngroups = 0;
        break;
    case DDP__OPT_RMSPROP:
        h->rmsprop.groups = NULL, h->rmsprop.ngroups = 0;
        break;
    default:
        h->adam.groups = NULL, h->adam.ngroups = 0;
    }
}

/* h = the optimizer's options with g's overrides, checked. */
static int apply_overrides(const ddp_optim_t *o, const ddp_param_group *g, int k,
                           ddp__optim_hyper *h)
{
    *h = o->defaults;
    clear_group_list(o->kind, h);
    if (!isnan(g->lr))
        *ddp__optim_hyper_lr(o->kind, h) = g->lr;
    int sgd = o->kind == DDP__OPT_SGD, rms = o->kind == DDP__OPT_RMSPROP;
    int adam = o->kind == DDP__OPT_ADAM || o->kind == DDP__OPT_ADAMW;
    if (!isnan(g->weight_decay)) {
        if (sgd)
            h->sgd.weight_decay = g->weight_decay;
        else if (rms)
            h->rmsprop.weight_decay = g->weight_decay;
        else if (adam)
            h->adam.weight_decay = g->weight_decay;
        else
            h->adadelta.weight_decay = g->weight_decay;
    }
    DDP_FAIL_IF(!isnan(g->momentum) && !sgd && !rms, DDP_ERR_INVALID_ARG,
                "%s parameter group %d: %s has no momentum", o->who, k, o->who);
    DDP_FAIL_IF((!isnan(g->beta1) || !isnan(g->beta2)) && !adam, DDP_ERR_INVALID_ARG,
                "%s parameter group %d: %s has no betas", o->who, k, o->who);
    if (!isnan(g->momentum)) {
        if (sgd)
            h->sgd.momentum = g->momentum;
        else
            h->rmsprop.momentum = g->momentum;
    }
    if (!isnan(g->beta1))
        h->adam.beta1 = g->beta1;
    if (!isnan(g->beta2))
        h->adam.beta2 = g->beta2;
    int rc = ddp__optim_check(o->kind, h);
    return rc < 0 ? ddp__error_context(rc, "parameter group %d", k) : 0;
}

/* Marks in `in` (num params) the parameters that g names, k being the
 * index the group will have; every pattern and index must name one. */
static int resolve(const ddp_optim_t *o, const ddp_param_group *g, int k, unsigned char *in)
{
    size_t np = ddp_model_num_params(o->model);
    DDP_FAIL_IF((g->nnames > 0 && !g->names) || (g->nindices > 0 && !g->indices) ||
                    g->nnames < 0 || g->nindices < 0,
                DDP_ERR_INVALID_ARG, "%s parameter group %d: a count without its array",
                o->who, k);
    DDP_FAIL_IF(g->nnames == 0 && g->nindices == 0, DDP_ERR_INVALID_ARG,
                "%s parameter group %d names no parameter", o->who, k);
    for (int j = 0; j < g->nnames; j++) {
        DDP_FAIL_IF(!g->names[j], DDP_ERR_INVALID_ARG, "%s parameter group %d: pattern %d is "
                    "NULL", o->who, k, j);
        int hit = 0;
        for (size_t i = 0; i < np; i++)
            if (fnmatch(g->names[j], ddp_model_param(o->model, i)->name, 0) == 0)
                in[i] = 1, hit = 1;
        DDP_FAIL_IF(!hit, DDP_ERR_INVALID_ARG,
                    "%s parameter group %d: pattern '%s' matches no parameter", o->who, k,
                    g->names[j]);
    }
    for (int j = 0; j < g->nindices; j++) {
        DDP_FAIL_IF(g->indices[j] < 0 || (size_t)g->indices[j] >= np, DDP_ERR_INVALID_ARG,
                    "%s parameter group %d: parameter index %d is out of range (%zu "
                    "parameters)", o->who, k, g->indices[j], np);
        in[g->indices[j]] = 1;
    }
    for (size_t i = 0; i < np; i++)
        DDP_FAIL_IF(in[i] && o->group_of[i] >= 0, DDP_ERR_INVALID_ARG,
                    "%s: parameter '%s' is in parameter groups %d and %d", o->who,
                    ddp_model_param(o->model, i)->name, o->group_of[i], k);
    return 0;
}

/* Appends a group with options h; its index, or a negative error. */
static int append_group(ddp_optim_t *o, const ddp__optim_hyper *h)
{
    if (o->ngroups == o->capgroups) {
        int cap = o->capgroups ? 2 * o->capgroups : 4;
        ddp__optim_group *grown = realloc(o->groups, (size_t)cap * sizeof *grown);
        DDP_FAIL_IF(!grown, DDP_ERR_NOMEM, "%s: out of memory for parameter groups", o->who);
        o->groups = grown;
        o->capgroups = cap;
    }
    o->groups[o->ngroups] = (ddp__optim_group){.h = *h, .initial_lr = NAN};
    return o->ngroups++;
}

int ddp__optim_group_all(ddp_optim_t *o)
{
    ddp__optim_hyper h = o->defaults;
    clear_group_list(o->kind, &h);
    int k = append_group(o, &h);
    DDP_TRY(k);
    for (size_t i = 0; i < ddp_model_num_params(o->model); i++)
        o->group_of[i] = k;
    return 0;
}

int ddp_optim_add_param_group(ddp_optim_t *o, const ddp_param_group *g)
{
    DDP_FAIL_IF(!o || !g, DDP_ERR_INVALID_ARG, "add_param_group: NULL argument");
    int k = o->ngroups, rc = 0;
    size_t np = ddp_model_num_params(o->model);
    ddp__optim_hyper h;
    DDP_TRY(apply_overrides(o, g, k, &h));
    unsigned char *in = calloc(np ? np : 1, 1);
    DDP_FAIL_IF(!in, DDP_ERR_NOMEM, "%s: out of memory", o->who);
    DDP_TRY_OUT(resolve(o, g, k, in));
    DDP_TRY_OUT(append_group(o, &h));
    for (size_t i = 0; i < np; i++)
        if (in[i])
            o->group_of[i] = k;
    rc = ddp__optim_ensure_states(o);
    if (rc < 0) { /* undo, so that the optimizer stays as it was */
        for (size_t i = 0; i < np; i++)
            if (in[i])
                o->group_of[i] = -1;
        o->ngroups--;
    }
out:
    free(in);
    return rc;
}
