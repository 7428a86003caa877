/* Learning-rate schedules: torch.optim.lr_scheduler's StepLR, MultiStepLR,
 * ExponentialLR, CosineAnnealingLR and LinearLR through their closed forms
 * (`_get_closed_form_lr`), which equal PyTorch's chained updates up to
 * float64 rounding; see include/ddp/optim.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "ddp/optim.h"

struct ddp_lr_scheduler {
    ddp_optim_t *opt;
    ddp_lr_options o;
    int *milestones;
    double base_lr, last_lr;
    int64_t last_epoch;
};

static double lr_at(const ddp_lr_scheduler_t *s, int64_t e)
{
    const ddp_lr_options *o = &s->o;
    double base = s->base_lr;
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
    default: /* DDP_LR_LINEAR */
        return base * (o->start_factor + (o->end_factor - o->start_factor) *
                                             (double)(e < o->total_iters ? e : o->total_iters) /
                                             o->total_iters);
    }
}

static int check(const ddp_lr_options *o)
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
    default:
        return DDP_ERROR(DDP_ERR_INVALID_ARG, "lr scheduler: unknown kind %d", o->kind);
    }
}

int ddp_lr_scheduler_create(ddp_optim_t *opt, const ddp_lr_options *o, ddp_lr_scheduler_t **out)
{
    DDP_FAIL_IF(!opt || !o || !out, DDP_ERR_INVALID_ARG, "lr scheduler: NULL argument");
    DDP_TRY(check(o));
    ddp_lr_scheduler_t *s = calloc(1, sizeof *s);
    DDP_FAIL_IF(!s, DDP_ERR_NOMEM, "lr scheduler: out of memory");
    s->o = *o;
    if (o->kind == DDP_LR_MULTISTEP && o->nmilestones > 0) {
        s->milestones = malloc((size_t)o->nmilestones * sizeof *s->milestones);
        if (!s->milestones) {
            free(s);
            return DDP_ERROR(DDP_ERR_NOMEM, "lr scheduler: out of memory");
        }
        memcpy(s->milestones, o->milestones, (size_t)o->nmilestones * sizeof *s->milestones);
    }
    s->o.milestones = NULL; /* the copy above is the one used */
    s->opt = opt;
    s->base_lr = ddp_optim_lr(opt);
    ddp_lr_scheduler_set_last_epoch(s, 0);
    *out = s;
    return 0;
}

void ddp_lr_scheduler_destroy(ddp_lr_scheduler_t *s)
{
    if (!s)
        return;
    free(s->milestones);
    free(s);
}

void ddp_lr_scheduler_set_last_epoch(ddp_lr_scheduler_t *s, int64_t epoch)
{
    if (!s || epoch < 0)
        return;
    s->last_epoch = epoch;
    s->last_lr = lr_at(s, epoch);
    ddp_optim_set_lr(s->opt, s->last_lr);
}

double ddp_lr_scheduler_step(ddp_lr_scheduler_t *s)
{
    if (!s)
        return 0.0;
    ddp_lr_scheduler_set_last_epoch(s, s->last_epoch + 1);
    return s->last_lr;
}

double ddp_lr_scheduler_last_lr(const ddp_lr_scheduler_t *s) { return s ? s->last_lr : 0.0; }

int64_t ddp_lr_scheduler_last_epoch(const ddp_lr_scheduler_t *s) { return s ? s->last_epoch : 0; }
