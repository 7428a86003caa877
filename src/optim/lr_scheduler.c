/* Learning-rate schedules: torch.optim.lr_scheduler's StepLR, MultiStepLR,
 * ExponentialLR, CosineAnnealingLR, LinearLR, LambdaLR and OneCycleLR
 * through their closed forms (`_get_closed_form_lr`, OneCycleLR's get_lr),
 * which equal PyTorch's chained updates up to float64 rounding, for every
 * parameter group from its own base lr; the scheduler object that
 * lr_plateau.c and lr_sequential.c share.  See include/ddp/optim.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "optim/lr_scheduler.h"
#include "optim/optim.h"

ddp_lr_options ddp_lr_defaults(int kind)
{
    ddp_lr_options o;
    memset(&o, 0, sizeof o);
    o.kind = kind;
    o.gamma = 0.1;
    o.start_factor = 1.0 / 3, o.end_factor = 1.0, o.total_iters = 5;
    o.pct_start = 0.3, o.div_factor = 25, o.final_div_factor = 1e4;
    o.base_momentum = 0.85, o.max_momentum = 0.95;
    o.factor = 0.1, o.patience = 10, o.threshold = 1e-4, o.eps = 1e-8;
    return o;
}

/* ==== closed forms ======================================================== */

/* OneCycleLR's anneal over its phases as torch computes them (phase ends
 * float(pct_start * total_steps) - 1, ...): v = {start, peak, the middle
 * value of three phases, end}, the lr's {initial, max, initial, min} or the
 * momentum's {max, base, max, max}. */
static double onecycle_at(const ddp_lr_options *o, const double v[4], int64_t e)
{
    double total = o->total_steps, pt = o->pct_start * total;
    double end[3], from[3], to[3];
    int n = o->three_phase ? 3 : 2;
    end[0] = pt - 1, from[0] = v[0], to[0] = v[1];
    if (o->three_phase) {
        end[1] = 2 * o->pct_start * total - 2, from[1] = v[1], to[1] = v[2];
        end[2] = total - 1, from[2] = v[2], to[2] = v[3];
    } else {
        end[1] = total - 1, from[1] = v[1], to[1] = v[3];
    }
    double step = (double)(e > o->total_steps ? o->total_steps : e), start = 0;
    for (int i = 0; i < n; i++) {
        if (step <= end[i] || i == n - 1) {
            double pct = (step - start) / (end[i] - start);
            if (o->anneal_linear)
                return (to[i] - from[i]) * pct + from[i];
            return to[i] + (from[i] - to[i]) / 2.0 * (cos(M_PI * pct) + 1);
        }
        start = end[i];
    }
    return v[3]; /* not reached */
}

static double onecycle_lr(const ddp_lr_options *o, double initial, double max, int64_t e)
{
    return onecycle_at(o, (const double[4]){initial, max, initial, initial / o->final_div_factor},
                       e);
}

/* cycle_momentum: every group's momentum (or beta1) for epoch e. */
static void onecycle_momentum(ddp_lr_scheduler_t *s, int64_t e)
{
    const ddp_lr_options *o = &s->o;
    double m = onecycle_at(
        o, (const double[4]){o->max_momentum, o->base_momentum, o->max_momentum, o->max_momentum},
        e);
    for (int g = 0; g < s->ngroups; g++)
        *ddp__optim_hyper_momentum(s->opt->kind, &s->opt->groups[g].h) = m;
}

static double lr_at(const ddp_lr_scheduler_t *s, int64_t e, int g)
{
    const ddp_lr_options *o = &s->o;
    double base = s->base[g];
    switch (o->kind) {
    case DDP_LR_STEP:
        return base * pow(o->gamma, (double)(e / o->step_size));
    case DDP_LR_MULTISTEP: {
        int passed = 0; /* bisect_right(milestones, e) */
        while (passed < o->nmilestones && s->milestones[passed] <= e)
            passed++;
        return base * pow(o->gamma, passed);
    }
    case DDP_LR_EXPONENTIAL:
        return base * pow(o->gamma, (double)e);
    case DDP_LR_COSINE:
        return o->eta_min + (base - o->eta_min) * (1 + cos(M_PI * (double)e / o->t_max)) / 2;
    case DDP_LR_LAMBDA:
        return base * o->lambda(e, g, o->user);
    case DDP_LR_ONECYCLE:
        return onecycle_lr(o, base, s->max_lrs[g], e);
    default: /* DDP_LR_LINEAR */
        return base * (o->start_factor + (o->end_factor - o->start_factor) *
                                             (double)(e < o->total_iters ? e : o->total_iters) /
                                             o->total_iters);
    }
}

/* ==== checks ============================================================== */

static int check_onecycle(const ddp_lr_options *o)
{
    DDP_FAIL_IF(o->total_steps <= 0, DDP_ERR_INVALID_ARG,
                "OneCycleLR: expected positive integer total_steps, but got %d", o->total_steps);
    DDP_FAIL_IF(!(o->pct_start >= 0 && o->pct_start <= 1), DDP_ERR_INVALID_ARG,
                "OneCycleLR: expected float between 0 and 1 pct_start, but got %g",
                o->pct_start);
    DDP_FAIL_IF(!o->max_lrs && !(o->max_lr > 0), DDP_ERR_INVALID_ARG,
                "OneCycleLR: max_lr %g must be > 0", o->max_lr);
    DDP_FAIL_IF(o->cycle_momentum && !(o->base_momentum >= 0 && o->base_momentum <= o->max_momentum &&
                                       o->max_momentum < 1),
                DDP_ERR_INVALID_ARG,
                "OneCycleLR: base_momentum %g and max_momentum %g must satisfy 0 <= base <= max < 1",
                o->base_momentum, o->max_momentum);
    DDP_FAIL_IF(!(o->div_factor > 0) || !(o->final_div_factor > 0), DDP_ERR_INVALID_ARG,
                "OneCycleLR: div_factor %g and final_div_factor %g must be > 0", o->div_factor,
                o->final_div_factor);
    /* a phase of length 0 divides by zero in torch (ZeroDivisionError) */
    double pt = o->pct_start * o->total_steps, t = o->total_steps;
    int empty = o->three_phase ? (pt - 1 == 0 || (2 * o->pct_start * t - 2) - (pt - 1) == 0 ||
                                  (t - 1) - (2 * o->pct_start * t - 2) == 0)
                               : (pt - 1 == 0 || (t - 1) - (pt - 1) == 0);
    DDP_FAIL_IF(empty, DDP_ERR_INVALID_ARG,
                "OneCycleLR: pct_start %g of %d total_steps leaves a phase of length 0",
                o->pct_start, o->total_steps);
    return 0;
}

static int check(ddp_optim_t *opt, const ddp_lr_options *o)
{
    switch (o->kind) {
    case DDP_LR_STEP:
        DDP_FAIL_IF(o->step_size <= 0, DDP_ERR_INVALID_ARG, "StepLR: step_size %d must be > 0",
                    o->step_size);
        return 0;
    case DDP_LR_MULTISTEP:
        DDP_FAIL_IF(o->nmilestones < 0 || (o->nmilestones > 0 && !o->milestones),
                    DDP_ERR_INVALID_ARG, "MultiStepLR: %d milestones from a NULL array",
                    o->nmilestones);
        for (int i = 1; i < o->nmilestones; i++)
            DDP_FAIL_IF(o->milestones[i] <= o->milestones[i - 1], DDP_ERR_INVALID_ARG,
                        "MultiStepLR: milestones must increase (%d after %d)", o->milestones[i],
                        o->milestones[i - 1]);
        return 0;
    case DDP_LR_EXPONENTIAL:
        return 0;
    case DDP_LR_COSINE:
        DDP_FAIL_IF(o->t_max <= 0, DDP_ERR_INVALID_ARG, "CosineAnnealingLR: T_max %d must be > 0",
                    o->t_max);
        return 0;
    case DDP_LR_LINEAR:
        DDP_FAIL_IF(!(o->start_factor > 0 && o->start_factor <= 1), DDP_ERR_INVALID_ARG,
                    "LinearLR: start_factor %g must be in (0, 1]", o->start_factor);
        DDP_FAIL_IF(!(o->end_factor >= 0 && o->end_factor <= 1), DDP_ERR_INVALID_ARG,
                    "LinearLR: end_factor %g must be in [0, 1]", o->end_factor);
        DDP_FAIL_IF(o->total_iters <= 0, DDP_ERR_INVALID_ARG,
                    "LinearLR: total_iters %d must be > 0", o->total_iters);
        return 0;
    case DDP_LR_LAMBDA:
        DDP_FAIL_IF(!o->lambda, DDP_ERR_INVALID_ARG, "LambdaLR: lambda is NULL");
        return 0;
    case DDP_LR_ONECYCLE:
        DDP_FAIL_IF(o->cycle_momentum && opt->kind == DDP__OPT_ADADELTA, DDP_ERR_INVALID_ARG,
                    "OneCycleLR: optimizer must support momentum with `cycle_momentum` option "
                    "enabled (%s has neither momentum nor betas)", opt->who);
        return check_onecycle(o);
    case DDP_LR_SEQUENTIAL:
        return ddp__lr_sequential_check(opt, o);
    case DDP_LR_PLATEAU:
        return ddp__lr_plateau_check(o);
    default:
        return DDP_ERROR(DDP_ERR_INVALID_ARG, "lr scheduler: unknown kind %d", o->kind);
    }
}

/* ==== the object ========================================================== */

/* Copies the options' arrays so that the scheduler owns what it reads. */
static int copy_arrays(ddp_lr_scheduler_t *s, const ddp_lr_options *o)
{
    int nm = o->kind == DDP_LR_MULTISTEP || o->kind == DDP_LR_SEQUENTIAL ? o->nmilestones : 0;
    s->milestones = malloc((size_t)(nm > 0 ? nm : 1) * sizeof *s->milestones);
    s->max_lrs = malloc((size_t)s->ngroups * sizeof *s->max_lrs);
    s->children = malloc((size_t)(o->nschedulers > 0 ? o->nschedulers : 1) * sizeof *s->children);
    s->base = calloc((size_t)s->ngroups, sizeof *s->base);
    s->last = calloc((size_t)s->ngroups, sizeof *s->last);
    DDP_FAIL_IF(!s->milestones || !s->max_lrs || !s->children || !s->base || !s->last,
                DDP_ERR_NOMEM, "lr scheduler: out of memory");
    if (nm > 0)
        memcpy(s->milestones, o->milestones, (size_t)nm * sizeof *s->milestones);
    for (int g = 0; g < s->ngroups; g++)
        s->max_lrs[g] = o->max_lrs ? o->max_lrs[g] : o->max_lr;
    if (o->kind == DDP_LR_SEQUENTIAL)
        memcpy(s->children, o->schedulers, (size_t)o->nschedulers * sizeof *s->children);
    s->o.milestones = s->milestones;
    s->o.max_lrs = NULL;
    s->o.schedulers = s->children;
    return 0;
}

/* torch's group.setdefault('initial_lr', group['lr']), or OneCycleLR's
 * group['initial_lr'] = max_lr / div_factor; base_lrs from them. */
static void set_bases(ddp_lr_scheduler_t *s)
{
    for (int g = 0; g < s->ngroups; g++) {
        double *initial = ddp__optim_initial_lr(s->opt, g);
        if (s->o.kind == DDP_LR_ONECYCLE)
            *initial = s->max_lrs[g] / s->o.div_factor;
        else if (isnan(*initial))
            *initial = ddp_optim_group_lr(s->opt, g);
        s->base[g] = *initial;
        s->last[g] = ddp_optim_group_lr(s->opt, g);
    }
}

int ddp_lr_scheduler_create(ddp_optim_t *opt, const ddp_lr_options *o, ddp_lr_scheduler_t **out)
{
    DDP_FAIL_IF(!opt || !o || !out, DDP_ERR_INVALID_ARG, "lr scheduler: NULL argument");
    DDP_TRY(check(opt, o));
    for (int g = 0; o->kind == DDP_LR_ONECYCLE && o->max_lrs && g < ddp_optim_num_groups(opt); g++)
        DDP_FAIL_IF(!(o->max_lrs[g] > 0), DDP_ERR_INVALID_ARG,
                    "OneCycleLR: max_lrs[%d] %g must be > 0 (one per parameter group)", g,
                    o->max_lrs[g]);
    ddp_lr_scheduler_t *s = calloc(1, sizeof *s);
    DDP_FAIL_IF(!s, DDP_ERR_NOMEM, "lr scheduler: out of memory");
    s->o = *o;
    s->opt = opt;
    s->ngroups = ddp_optim_num_groups(opt);
    int rc = copy_arrays(s, o);
    if (rc < 0) {
        ddp_lr_scheduler_destroy(s);
        return rc;
    }
    set_bases(s);
    if (o->kind == DDP_LR_ONECYCLE && o->cycle_momentum) { /* SGD created without momentum */
        onecycle_momentum(s, 0);
        if ((rc = ddp__optim_ensure_states(opt)) < 0) {
            ddp_lr_scheduler_destroy(s);
            return rc;
        }
    }
    if (o->kind == DDP_LR_PLATEAU)
        ddp__lr_plateau_init(s);
    else if (o->kind == DDP_LR_SEQUENTIAL)
        ddp__lr_sequential_init(s);
    else
        ddp_lr_scheduler_set_last_epoch(s, 0);
    *out = s;
    return 0;
}

void ddp_lr_scheduler_destroy(ddp_lr_scheduler_t *s)
{
    if (!s)
        return;
    free(s->milestones);
    free(s->max_lrs);
    free(s->children);
    free(s->base);
    free(s->last);
    free(s);
}

void ddp__lr_apply(ddp_lr_scheduler_t *s, int g, double lr)
{
    s->last[g] = lr;
    ddp_optim_set_group_lr(s->opt, g, lr);
}

void ddp_lr_scheduler_set_last_epoch(ddp_lr_scheduler_t *s, int64_t epoch)
{
    if (!s || epoch < 0)
        return;
    if (s->o.kind == DDP_LR_SEQUENTIAL) {
        ddp__lr_sequential_set_epoch(s, epoch);
        return;
    }
    s->last_epoch = epoch;
    if (s->o.kind == DDP_LR_PLATEAU)
        return;
    for (int g = 0; g < s->ngroups; g++)
        ddp__lr_apply(s, g, lr_at(s, epoch, g));
    if (s->o.kind == DDP_LR_ONECYCLE && s->o.cycle_momentum)
        onecycle_momentum(s, epoch);
}

double ddp_lr_scheduler_step(ddp_lr_scheduler_t *s)
{
    if (!s)
        return 0.0;
    if (s->o.kind == DDP_LR_SEQUENTIAL)
        ddp__lr_sequential_step(s);
    else if (s->o.kind != DDP_LR_PLATEAU)
        ddp_lr_scheduler_set_last_epoch(s, s->last_epoch + 1);
    return ddp_lr_scheduler_last_lr(s);
}

int ddp_lr_scheduler_step_metric(ddp_lr_scheduler_t *s, double metric)
{
    DDP_FAIL_IF(!s || s->o.kind != DDP_LR_PLATEAU, DDP_ERR_INVALID_ARG,
                "lr scheduler: a metric steps only ReduceLROnPlateau");
    return ddp__lr_plateau_step(s, metric);
}

double ddp_lr_scheduler_last_lr(const ddp_lr_scheduler_t *s)
{
    return ddp_lr_scheduler_group_last_lr(s, 0);
}

double ddp_lr_scheduler_group_last_lr(const ddp_lr_scheduler_t *s, int g)
{
    return s && g >= 0 && g < s->ngroups ? s->last[g] : 0.0;
}

int64_t ddp_lr_scheduler_last_epoch(const ddp_lr_scheduler_t *s) { return s ? s->last_epoch : 0; }

ddp_lr_state ddp_lr_scheduler_state(const ddp_lr_scheduler_t *s)
{
    ddp_lr_state st = {0, 0, 0, 0};
    if (s)
        st = (ddp_lr_state){s->last_epoch, s->best, s->num_bad_epochs,
                                      s->cooldown_counter};
    return st;
}

int ddp_lr_scheduler_set_state(ddp_lr_scheduler_t *s, const ddp_lr_state *st)
{
    DDP_FAIL_IF(!s || !st, DDP_ERR_INVALID_ARG, "lr scheduler set_state: NULL argument");
    DDP_FAIL_IF(st->last_epoch < 0 || st->num_bad_epochs < 0 || st->cooldown_counter < 0,
                DDP_ERR_INVALID_ARG, "lr scheduler set_state: negative count (last_epoch %lld, "
                "num_bad_epochs %lld, cooldown_counter %lld)", (long long)st->last_epoch,
                (long long)st->num_bad_epochs, (long long)st->cooldown_counter);
    ddp_lr_scheduler_set_last_epoch(s, st->last_epoch);
    if (s->o.kind == DDP_LR_PLATEAU) {
        s->best = st->best;
        s->num_bad_epochs = st->num_bad_epochs;
        s->cooldown_counter = st->cooldown_counter;
        for (int g = 0; g < s->ngroups; g++)
            s->last[g] = ddp_optim_group_lr(s->opt, g);
    }
    return 0;
}
