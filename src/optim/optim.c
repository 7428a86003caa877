/* The optimizer object: SGD, Adam, AdamW, Adadelta and RMSprop over a
 * model's parameters in groups (param_group.c), their flat state blocks and
 * the step that runs each parameter's update kernel (update.c) with its
 * group's options.  State buffers are flat blocks laid out like the model's
 * parameter block. */
#include "ddp/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/timeline.h"
#include "optim/optim.h"
#include "optim/update.h"

ddp_sgd_options ddp_sgd_defaults(double lr)
{
    ddp_sgd_options o;
    memset(&o, 0, sizeof o);
    o.lr = lr;
    return o;
}

ddp_adam_options ddp_adam_defaults(void)
{
    ddp_adam_options o;
    memset(&o, 0, sizeof o);
    o.lr = 1e-3;
    o.beta1 = 0.9;
    o.beta2 = 0.999;
    o.eps = 1e-8;
    return o;
}

ddp_adam_options ddp_adamw_defaults(void)
{
    ddp_adam_options o = ddp_adam_defaults();
    o.weight_decay = 1e-2;
    return o;
}

ddp_adadelta_options ddp_adadelta_defaults(void)
{
    ddp_adadelta_options o;
    memset(&o, 0, sizeof o);
    o.lr = 1.0;
    o.rho = 0.9;
    o.eps = 1e-6;
    return o;
}

ddp_rmsprop_options ddp_rmsprop_defaults(void)
{
    ddp_rmsprop_options o;
    memset(&o, 0, sizeof o);
    o.lr = 1e-2;
    o.alpha = 0.99;
    o.eps = 1e-8;
    return o;
}

/* ==== options ============================================================= */

double *ddp__optim_hyper_lr(int kind, ddp__optim_hyper *h)
{
    switch (kind) {
    case DDP__OPT_SGD:
        return &h->sgd.lr;
    case DDP__OPT_ADADELTA:
        return &h->adadelta.lr;
    case DDP__OPT_RMSPROP:
        return &h->rmsprop.lr;
    default:
        return &h->adam.lr;
    }
}

double *ddp__optim_hyper_momentum(int kind, ddp__optim_hyper *h)
{
    switch (kind) {
    case DDP__OPT_SGD:
        return &h->sgd.momentum;
    case DDP__OPT_ADADELTA:
        return NULL;
    case DDP__OPT_RMSPROP:
        return &h->rmsprop.momentum;
    default:
        return &h->adam.beta1;
    }
}

static int check_sgd(const ddp_sgd_options *opt)
{
    DDP_FAIL_IF(!(opt->lr >= 0), DDP_ERR_INVALID_ARG, "SGD: invalid learning rate %g", opt->lr);
    DDP_FAIL_IF(!(opt->momentum >= 0), DDP_ERR_INVALID_ARG, "SGD: invalid momentum %g",
                opt->momentum);
    DDP_FAIL_IF(!(opt->weight_decay >= 0), DDP_ERR_INVALID_ARG,
                "SGD: invalid weight_decay %g", opt->weight_decay);
    DDP_FAIL_IF(opt->nesterov && (opt->momentum <= 0 || opt->dampening != 0),
                DDP_ERR_INVALID_ARG, "SGD: nesterov momentum requires a momentum and zero "
                "dampening (momentum %g, dampening %g)", opt->momentum, opt->dampening);
    return 0;
}

static int check_adam(const ddp_adam_options *opt, const char *who)
{
    DDP_FAIL_IF(!(opt->lr >= 0), DDP_ERR_INVALID_ARG, "%s: invalid learning rate %g", who,
                opt->lr);
    DDP_FAIL_IF(!(opt->eps >= 0), DDP_ERR_INVALID_ARG, "%s: invalid epsilon %g", who,
                opt->eps);
    DDP_FAIL_IF(!(opt->beta1 >= 0 && opt->beta1 < 1), DDP_ERR_INVALID_ARG,
                "%s: invalid beta parameter at index 0: %g", who, opt->beta1);
    DDP_FAIL_IF(!(opt->beta2 >= 0 && opt->beta2 < 1), DDP_ERR_INVALID_ARG,
                "%s: invalid beta parameter at index 1: %g", who, opt->beta2);
    DDP_FAIL_IF(!(opt->weight_decay >= 0), DDP_ERR_INVALID_ARG,
                "%s: invalid weight_decay value %g", who, opt->weight_decay);
    return 0;
}

/* torch.optim.Adadelta's checks and messages. */
static int check_adadelta(const ddp_adadelta_options *opt)
{
    DDP_FAIL_IF(!(opt->lr >= 0), DDP_ERR_INVALID_ARG, "Adadelta: invalid learning rate %g",
                opt->lr);
    DDP_FAIL_IF(!(opt->rho >= 0 && opt->rho <= 1), DDP_ERR_INVALID_ARG,
                "Adadelta: invalid rho value %g", opt->rho);
    DDP_FAIL_IF(!(opt->eps >= 0), DDP_ERR_INVALID_ARG, "Adadelta: invalid epsilon value %g",
                opt->eps);
    DDP_FAIL_IF(!(opt->weight_decay >= 0), DDP_ERR_INVALID_ARG,
                "Adadelta: invalid weight_decay value %g", opt->weight_decay);
    return 0;
}

/* torch.optim.RMSprop's checks and messages. */
static int check_rmsprop(const ddp_rmsprop_options *opt)
{
    DDP_FAIL_IF(!(opt->lr >= 0), DDP_ERR_INVALID_ARG, "RMSprop: invalid learning rate %g",
                opt->lr);
    DDP_FAIL_IF(!(opt->eps >= 0), DDP_ERR_INVALID_ARG, "RMSprop: invalid epsilon value %g",
                opt->eps);
    DDP_FAIL_IF(!(opt->momentum >= 0), DDP_ERR_INVALID_ARG,
                "RMSprop: invalid momentum value %g", opt->momentum);
    DDP_FAIL_IF(!(opt->weight_decay >= 0), DDP_ERR_INVALID_ARG,
                "RMSprop: invalid weight_decay value %g", opt->weight_decay);
    DDP_FAIL_IF(!(opt->alpha >= 0), DDP_ERR_INVALID_ARG, "RMSprop: invalid alpha value %g",
                opt->alpha);
    return 0;
}

int ddp__optim_check(int kind, const ddp__optim_hyper *h)
{
    switch (kind) {
    case DDP__OPT_SGD:
        return check_sgd(&h->sgd);
    case DDP__OPT_ADAM:
        return check_adam(&h->adam, "Adam");
    case DDP__OPT_ADAMW:
        return check_adam(&h->adam, "AdamW");
    case DDP__OPT_ADADELTA:
        return check_adadelta(&h->adadelta);
    default:
        return check_rmsprop(&h->rmsprop);
    }
}

/* ==== state buffers ======================================================= */

/* The state buffers the kind and its groups need, in their order. */
static int needed_states(const ddp_optim_t *o, const char **names)
{
    int any_mom = 0;
    for (int g = 0; g < o->ngroups; g++)
        any_mom |= o->kind == DDP__OPT_SGD ? o->groups[g].h.sgd.momentum != 0
                   : o->kind == DDP__OPT_RMSPROP ? o->groups[g].h.rmsprop.momentum > 0
                                                 : 0;
    int n = 0;
    switch (o->kind) {
    case DDP__OPT_SGD:
        if (any_mom)
            names[n++] = "momentum_buffer";
        break;
    case DDP__OPT_ADADELTA:
        names[n++] = "square_avg";
        names[n++] = "acc_delta";
        break;
    case DDP__OPT_RMSPROP:
        names[n++] = "square_avg";
        if (any_mom)
            names[n++] = "momentum_buffer";
        if (o->defaults.rmsprop.centered)
            names[n++] = "grad_avg";
        break;
    default:
        names[n++] = "exp_avg";
        names[n++] = "exp_avg_sq";
        if (o->defaults.adam.amsgrad)
            names[n++] = "max_exp_avg_sq";
    }
    return n;
}

static float *state_named(const ddp_optim_t *o, const char *name)
{
    for (int k = 0; k < o->nstates; k++)
        if (strcmp(o->state_names[k], name) == 0)
            return o->states[k];
    return NULL;
}

int ddp__optim_ensure_states(ddp_optim_t *o)
{
    const char *names[DDP__OPTIM_MAX_STATES];
    float *bufs[DDP__OPTIM_MAX_STATES];
    int n = needed_states(o, names);
    for (int k = 0; k < n; k++) {
        bufs[k] = state_named(o, names[k]);
        if (!bufs[k] && !(bufs[k] = ddp__calloc_aligned(o->numel * sizeof(float)))) {
            for (int j = 0; j < k; j++)
                if (!state_named(o, names[j]))
                    ddp__free_aligned(bufs[j]);
            return DDP_ERROR(DDP_ERR_NOMEM, "%s: cannot allocate %s of %zu floats", o->who,
                             names[k], o->numel);
        }
    }
    /* a group is only ever added, so no buffer is dropped */
    for (int k = 0; k < n; k++) {
        o->state_names[k] = names[k];
        o->states[k] = bufs[k];
    }
    o->nstates = n;
    return 0;
}

/* ==== creation ============================================================ */

static int optim_new(ddp_model_t *model, int kind, const char *who, const ddp__optim_hyper *h,
                     const ddp_param_group *groups, int ngroups, ddp_optim_t **out)
{
    DDP_FAIL_IF(!model || !out, DDP_ERR_INVALID_ARG, "%s: NULL model or output", who);
    DDP_FAIL_IF(ngroups < 0 || (ngroups > 0 && !groups), DDP_ERR_INVALID_ARG,
                "%s: %d parameter groups from a NULL array", who, ngroups);
    DDP_TRY(ddp__optim_check(kind, h));
    DDP_TRY(ddp_model_seal(model));
    int rc = 0;
    size_t np = ddp_model_num_params(model);
    ddp_optim_t *o = calloc(1, sizeof *o);
    DDP_FAIL_IF(!o, DDP_ERR_NOMEM, "%s: out of memory", who);
    o->kind = kind;
    o->who = who;
    o->model = model;
    o->defaults = *h;
    ddp_model_param_block(model, &o->numel);
    o->group_of = malloc((np ? np : 1) * sizeof *o->group_of);
    DDP_FAIL_OUT(!o->group_of, DDP_ERR_NOMEM, "%s: out of memory", who);
    for (size_t i = 0; i < np; i++)
        o->group_of[i] = -1;
    if (ngroups == 0)
        DDP_TRY_OUT(ddp__optim_group_all(o));
    for (int g = 0; g < ngroups; g++)
        DDP_TRY_OUT(ddp_optim_add_param_group(o, &groups[g]));
    DDP_TRY_OUT(ddp__optim_ensure_states(o));
    *out = o;
    return 0;
out:
    ddp_optim_destroy(o);
    return rc;
}

void ddp_optim_destroy(ddp_optim_t *o)
{
    if (!o)
        return;
    for (int i = 0; i < o->nstates; i++)
        ddp__free_aligned(o->states[i]);
    free(o->groups);
    free(o->group_of);
    free(o);
}

int ddp_sgd_create(ddp_model_t *model, const ddp_sgd_options *opt, ddp_optim_t **out)
{
    DDP_FAIL_IF(!opt, DDP_ERR_INVALID_ARG, "SGD: options are NULL");
    ddp__optim_hyper h = {.sgd = *opt};
    return optim_new(model, DDP__OPT_SGD, "SGD", &h, opt->groups, opt->ngroups, out);
}

int ddp_adam_create(ddp_model_t *model, const ddp_adam_options *opt, ddp_optim_t **out)
{
    DDP_FAIL_IF(!opt, DDP_ERR_INVALID_ARG, "Adam: options are NULL");
    ddp__optim_hyper h = {.adam = *opt};
    return optim_new(model, DDP__OPT_ADAM, "Adam", &h, opt->groups, opt->ngroups, out);
}

int ddp_adamw_create(ddp_model_t *model, const ddp_adam_options *opt, ddp_optim_t **out)
{
    DDP_FAIL_IF(!opt, DDP_ERR_INVALID_ARG, "AdamW: options are NULL");
    ddp__optim_hyper h = {.adam = *opt};
    return optim_new(model, DDP__OPT_ADAMW, "AdamW", &h, opt->groups, opt->ngroups, out);
}

int ddp_adadelta_create(ddp_model_t *model, const ddp_adadelta_options *opt, ddp_optim_t **out)
{
    DDP_FAIL_IF(!opt, DDP_ERR_INVALID_ARG, "Adadelta: options are NULL");
    ddp__optim_hyper h = {.adadelta = *opt};
    return optim_new(model, DDP__OPT_ADADELTA, "Adadelta", &h, opt->groups, opt->ngroups, out);
}

int ddp_rmsprop_create(ddp_model_t *model, const ddp_rmsprop_options *opt, ddp_optim_t **out)
{
    DDP_FAIL_IF(!opt, DDP_ERR_INVALID_ARG, "RMSprop: options are NULL");
    ddp__optim_hyper h = {.rmsprop = *opt};
    return optim_new(model, DDP__OPT_RMSPROP, "RMSprop", &h, opt->groups, opt->ngroups, out);
}

/* ==== step ================================================================ */

static int check_grouped(ddp_optim_t *o)
{
    size_t np = ddp_model_num_params(o->model);
    for (size_t i = 0; !o->grouped && i < np; i++)
        DDP_FAIL_IF(o->group_of[i] < 0, DDP_ERR_STATE,
                    "%s step: parameter '%s' is in no parameter group (add one with "
                    "ddp_optim_add_param_group)", o->who, ddp_model_param(o->model, i)->name);
    o->grouped = 1;
    return 0;
}

/* One parameter's update with its group's options h; off is its slice. */
static void update_param(ddp_optim_t *o, ddp_param *p, const ddp__optim_hyper *h, int first)
{
    size_t off = p->offset, n = p->numel;
    float *s0 = o->nstates > 0 ? o->states[0] + off : NULL;
    float *s1 = o->nstates > 1 ? o->states[1] + off : NULL;
    switch (o->kind) {
    case DDP__OPT_SGD:
        ddp__sgd_update(p->data, p->grad, s0, n, &h->sgd, first);
        break;
    case DDP__OPT_ADADELTA:
        ddp__adadelta_update(p->data, p->grad, s0, s1, n, &h->adadelta);
        break;
    case DDP__OPT_RMSPROP: {
        float *buf = state_named(o, "momentum_buffer"), *gavg = state_named(o, "grad_avg");
        ddp__rmsprop_update(p->data, p->grad, s0,
                            buf && h->rmsprop.momentum > 0 ? buf + off : NULL,
                            gavg ? gavg + off : NULL, n, &h->rmsprop);
        break;
    }
    default:
        ddp__adam_update(p->data, p->grad, s0, s1, o->nstates > 2 ? o->states[2] + off : NULL,
                         n, &h->adam, o->kind == DDP__OPT_ADAMW, o->steps);
    }
}

int ddp_optim_step(ddp_optim_t *o)
{
    DDP_FAIL_IF(!o, DDP_ERR_INVALID_ARG, "optimizer step: optimizer is NULL");
    DDP_TRY(check_grouped(o));
    uint64_t t0 = ddp__tl_begin();
    size_t np = ddp_model_num_params(o->model);
    int first = o->steps == 0;
    o->steps++;
    ddp_model_bump_param_version(o->model);
    for (size_t i = 0; i < np; i++)
        update_param(o, ddp_model_param(o->model, i), &o->groups[o->group_of[i]].h, first);
    ddp__tl_end(t0, "optimizer step", "step", o->steps);
    return 0;
}

void ddp_optim_zero_grad(ddp_optim_t *o)
{
    if (o)
        ddp_model_zero_grad(o->model);
}

/* ==== accessors =========================================================== */

double ddp_optim_lr(const ddp_optim_t *o) { return ddp_optim_group_lr(o, 0); }

void ddp_optim_set_lr(ddp_optim_t *o, double lr) { ddp_optim_set_group_lr(o, 0, lr); }

int ddp_optim_num_groups(const ddp_optim_t *o) { return o ? o->ngroups : 0; }

int ddp_optim_param_group(const ddp_optim_t *o, size_t i)
{
    return o && i < ddp_model_num_params(o->model) ? o->group_of[i] : -1;
}

double ddp_optim_group_lr(const ddp_optim_t *o, int g)
{
    if (!o || g < 0 || g >= o->ngroups)
        return 0.0;
    return *ddp__optim_hyper_lr(o->kind, &o->groups[g].h);
}

void ddp_optim_set_group_lr(ddp_optim_t *o, int g, double lr)
{
    if (o && g >= 0 && g < o->ngroups)
        *ddp__optim_hyper_lr(o->kind, &o->groups[g].h) = lr;
}

double ddp_optim_group_momentum(const ddp_optim_t *o, int g)
{
    if (!o || g < 0 || g >= o->ngroups)
        return NAN;
    const double *m = ddp__optim_hyper_momentum(o->kind, (ddp__optim_hyper *)&o->groups[g].h);
    return m ? *m : NAN;
}

double *ddp__optim_initial_lr(ddp_optim_t *o, int g)
{
    return o && g >= 0 && g < o->ngroups ? &o->groups[g].initial_lr : NULL;
}

int64_t ddp_optim_steps(const ddp_optim_t *o) { return o ? o->steps : 0; }

void ddp_optim_set_steps(ddp_optim_t *o, int64_t steps)
{
    if (o && steps >= 0)
        o->steps = steps;
}

int ddp_optim_num_states(const ddp_optim_t *o) { return o ? o->nstates : 0; }

int ddp_optim_state(ddp_optim_t *o, int i, const char **name, float **data, size_t *numel)
{
    DDP_FAIL_IF(!o || i < 0 || i >= o->nstates, DDP_ERR_NOT_FOUND,
                "optimizer state %d does not exist (%d buffers)", i, o ? o->nstates : 0);
    if (name)
        *name = o->state_names[i];
    if (data)
        *data = o->states[i];
    if (numel)
        *numel = o->numel;
    return 0;
}
