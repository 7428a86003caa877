/* SGD, Adam and AdamW following torch.optim's single-tensor code paths
 * (torch/optim/sgd.py `_single_tensor_sgd`, adam.py `_single_tensor_adam`,
 * adamw.py), one fused loop per parameter.  State buffers are flat blocks
 * laid out like the model's parameter block. */
/* Full vectoriser (see tensor/kernels.c).  The Makefile builds this file
 * with -fno-math-errno (a pragma cannot), so Adam's sqrtf vectorises. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif

#include "ddp/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/timeline.h"
#include "tensor/kernels.h"

enum { OPT_SGD, OPT_ADAM, OPT_ADAMW };

#define MAX_STATES 3

struct ddp_optim {
    int kind;
    ddp_model_t *model;
    ddp_sgd_options sgd;
    ddp_adam_options adam;
    int64_t steps;
    int nstates;
    const char *state_names[MAX_STATES];
    float *states[MAX_STATES]; /* (numel) each */
    size_t numel;
};

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

static int optim_new(ddp_model_t *model, int kind, int nstates, const char *const *names,
                     ddp_optim_t **out)
{
    DDP_FAIL_IF(!model || !out, DDP_ERR_INVALID_ARG, "optimizer: NULL model or output");
    DDP_TRY(ddp_model_seal(model));
    ddp_optim_t *o = calloc(1, sizeof *o);
    DDP_FAIL_IF(!o, DDP_ERR_NOMEM, "optimizer: out of memory");
    o->kind = kind;
    o->model = model;
    ddp_model_param_block(model, &o->numel);
    for (int i = 0; i < nstates; i++) {
        o->state_names[i] = names[i];
        o->states[i] = ddp__calloc_aligned(o->numel * sizeof(float));
        if (!o->states[i]) {
            ddp_optim_destroy(o);
            return DDP_ERROR(DDP_ERR_NOMEM, "optimizer: cannot allocate %s of %zu floats",
                             names[i], o->numel);
        }
        o->nstates = i + 1;
    }
    *out = o;
    return 0;
}

void ddp_optim_destroy(ddp_optim_t *o)
{
    if (!o)
        return;
    for (int i = 0; i < o->nstates; i++)
        ddp__free_aligned(o->states[i]);
    free(o);
}

int ddp_sgd_create(ddp_model_t *model, const ddp_sgd_options *opt, ddp_optim_t **out)
{
    DDP_FAIL_IF(!opt, DDP_ERR_INVALID_ARG, "SGD: options are NULL");
    DDP_FAIL_IF(!(opt->lr >= 0), DDP_ERR_INVALID_ARG, "SGD: invalid learning rate %g", opt->lr);
    DDP_FAIL_IF(!(opt->momentum >= 0), DDP_ERR_INVALID_ARG, "SGD: invalid momentum %g",
                opt->momentum);
    DDP_FAIL_IF(!(opt->weight_decay >= 0), DDP_ERR_INVALID_ARG,
                "SGD: invalid weight_decay %g", opt->weight_decay);
    DDP_FAIL_IF(opt->nesterov && (opt->momentum <= 0 || opt->dampening != 0),
                DDP_ERR_INVALID_ARG, "SGD: nesterov momentum requires a momentum and zero "
                "dampening (momentum %g, dampening %g)", opt->momentum, opt->dampening);
    static const char *const names[] = {"momentum_buffer"};
    DDP_TRY(optim_new(model, OPT_SGD, opt->momentum != 0 ? 1 : 0, names, out));
    (*out)->sgd = *opt;
    return 0;
}

static int adam_new(ddp_model_t *model, const ddp_adam_options *opt, int kind,
                    ddp_optim_t **out)
{
    const char *who = kind == OPT_ADAM ? "Adam" : "AdamW";
    DDP_FAIL_IF(!opt, DDP_ERR_INVALID_ARG, "%s: options are NULL", who);
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
    static const char *const names[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    DDP_TRY(optim_new(model, kind, opt->amsgrad ? 3 : 2, names, out));
    (*out)->adam = *opt;
    return 0;
}

int ddp_adam_create(ddp_model_t *model, const ddp_adam_options *opt, ddp_optim_t **out)
{
    return adam_new(model, opt, OPT_ADAM, out);
}

int ddp_adamw_create(ddp_model_t *model, const ddp_adam_options *opt, ddp_optim_t **out)
{
    return adam_new(model, opt, OPT_ADAMW, out);
}

/* ==== updates ============================================================= */

/* _single_tensor_sgd for one parameter: w, g, buf (n). */
DDP_KERNEL static void sgd_update(float *restrict w, const float *restrict g, float *restrict buf,
                                  size_t n, const ddp_sgd_options *o, int first)
{
    const float lr = (float)o->lr, wd = (float)o->weight_decay, mom = (float)o->momentum;
    const float damp = (float)(1.0 - o->dampening), sign = o->maximize ? -1.0f : 1.0f;
    if (mom == 0.0f) {
        for (size_t i = 0; i < n; i++)
            w[i] -= lr * (sign * g[i] + wd * w[i]);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float d = sign * g[i] + wd * w[i];
        float b = first ? d : mom * buf[i] + damp * d; /* first step: buf = clone(d) */
        buf[i] = b;
        w[i] -= lr * (o->nesterov ? d + mom * b : b);
    }
}

/* _single_tensor_adam / adamw for one parameter.  `ams` is a constant at
 * each call site below, so each loop is specialised and branch-free. */
static inline __attribute__((always_inline)) void
adam_loop(float *restrict w, const float *restrict g, float *restrict m, float *restrict v,
          float *restrict vmax, size_t n, const ddp_adam_options *o, int decoupled,
          int64_t step, int ams)
{
    /* 1 - beta in double first, as torch does with its Python scalars */
    const float b1 = (float)o->beta1, b2 = (float)o->beta2;
    const float c1 = (float)(1.0 - o->beta1), c2 = (float)(1.0 - o->beta2);
    const float eps = (float)o->eps, sign = o->maximize ? -1.0f : 1.0f;
    const float wd = decoupled ? 0.0f : (float)o->weight_decay;
    const float shrink = decoupled ? (float)(1.0 - o->lr * o->weight_decay) : 1.0f;
    double bc1 = 1.0 - pow(o->beta1, (double)step), bc2 = 1.0 - pow(o->beta2, (double)step);
    const float step_size = (float)(o->lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    for (size_t i = 0; i < n; i++) {
        float wi = w[i] * shrink;
        float gi = sign * g[i] + wd * wi;
        float mi = m[i] * b1 + c1 * gi;
        float vi = v[i] * b2 + c2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        if (ams) {
            vi = vmax[i] > vi ? vmax[i] : vi;
            vmax[i] = vi;
        }
        float denom = sqrtf(vi) / bc2_sqrt + eps;
        w[i] = wi - step_size * mi / denom;
    }
}

DDP_KERNEL static void adam_update(float *restrict w, const float *restrict g,
                                   float *restrict m, float *restrict v, float *restrict vmax,
                                   size_t n, const ddp_adam_options *o, int decoupled,
                                   int64_t step)
{
    if (vmax)
        adam_loop(w, g, m, v, vmax, n, o, decoupled, step, 1);
    else
        adam_loop(w, g, m, v, NULL, n, o, decoupled, step, 0);
}

int ddp_optim_step(ddp_optim_t *o)
{
    DDP_FAIL_IF(!o, DDP_ERR_INVALID_ARG, "optimizer step: optimizer is NULL");
    uint64_t t0 = ddp__tl_begin();
    size_t np = ddp_model_num_params(o->model);
    int first = o->steps == 0;
    o->steps++;
    ddp_model_bump_param_version(o->model);
    for (size_t i = 0; i < np; i++) {
        ddp_param *p = ddp_model_param(o->model, i);
        size_t off = p->offset;
        if (o->kind == OPT_SGD)
            sgd_update(p->data, p->grad, o->nstates ? o->states[0] + off : NULL, p->numel,
                       &o->sgd, first);
        else
            adam_update(p->data, p->grad, o->states[0] + off, o->states[1] + off,
                        o->nstates > 2 ? o->states[2] + off : NULL, p->numel, &o->adam,
                        o->kind == OPT_ADAMW, o->steps);
    }
    ddp__tl_end(t0, "optimizer step", "step", o->steps);
    return 0;
}

void ddp_optim_zero_grad(ddp_optim_t *o)
{
    if (o)
        ddp_model_zero_grad(o->model);
}

double ddp_optim_lr(const ddp_optim_t *o)
{
    return !o ? 0.0 : o->kind == OPT_SGD ? o->sgd.lr : o->adam.lr;
}

void ddp_optim_set_lr(ddp_optim_t *o, double lr)
{
    if (!o)
        return;
    if (o->kind == OPT_SGD)
        o->sgd.lr = lr;
    else
        o->adam.lr = lr;
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
