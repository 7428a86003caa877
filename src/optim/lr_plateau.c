/* ReduceLROnPlateau (torch.optim.lr_scheduler, 1.13): after more than
 * `patience` epochs whose metric did not improve on the best by
 * `threshold` (relative or absolute), every group's lr becomes
 * max(lr * factor, min_lr), unless that changes it by eps or less; then
 * `cooldown` epochs in which bad epochs are not counted. */
#include <math.h>

#include "base/error.h"
#include "optim/lr_scheduler.h"

int ddp__lr_plateau_check(const ddp_lr_options *o)
{
    DDP_FAIL_IF(!(o->factor < 1.0), DDP_ERR_INVALID_ARG,
                "ReduceLROnPlateau: factor %g should be < 1.0", o->factor);
    DDP_FAIL_IF(!(o->factor >= 0), DDP_ERR_INVALID_ARG,
                "ReduceLROnPlateau: factor %g must be >= 0", o->factor);
    DDP_FAIL_IF(o->patience < 0 || o->cooldown < 0, DDP_ERR_INVALID_ARG,
                "ReduceLROnPlateau: patience %d and cooldown %d must be >= 0", o->patience,
                o->cooldown);
    DDP_FAIL_IF(!(o->min_lr >= 0) || !(o->eps >= 0) || !(o->threshold >= 0),
                DDP_ERR_INVALID_ARG, "ReduceLROnPlateau: min_lr %g, eps %g and threshold %g "
                "must be >= 0", o->min_lr, o->eps, o->threshold);
    return 0;
}

void ddp__lr_plateau_init(ddp_lr_scheduler_t *s)
{
    s->best = s->o.mode_max ? -INFINITY : INFINITY; /* mode_worse */
    s->num_bad_epochs = 0;
    s->cooldown_counter = 0;
    s->last_epoch = 0;
}

static int is_better(const ddp_lr_options *o, double a, double best)
{
    if (!o->mode_max)
        return o->threshold_abs ? a < best - o->threshold : a < best * (1.0 - o->threshold);
    return o->threshold_abs ? a > best + o->threshold : a > best * (o->threshold + 1.0);
}

int ddp__lr_plateau_step(ddp_lr_scheduler_t *s, double metric)
{
    const ddp_lr_options *o = &s->o;
    s->last_epoch++;
    if (is_better(o, metric, s->best)) {
        s->best = metric;
        s->num_bad_epochs = 0;
    } else {
        s->num_bad_epochs++;
    }
    if (s->cooldown_counter > 0) {
        s->cooldown_counter--;
        s->num_bad_epochs = 0; /* bad epochs in cooldown are ignored */
    }
    if (s->num_bad_epochs > o->patience) {
        for (int g = 0; g < s->ngroups; g++) {
            double old = ddp_optim_group_lr(s->opt, g), lr = old * o->factor;
            if (lr < o->min_lr)
                lr = o->min_lr;
            if (old - lr > o->eps)
                ddp_optim_set_group_lr(s->opt, g, lr);
        }
        s->cooldown_counter = o->cooldown;
        s->num_bad_epochs = 0;
    }
    for (int g = 0; g < s->ngroups; g++)
        s->last[g] = ddp_optim_group_lr(s->opt, g);
    return 0;
}
