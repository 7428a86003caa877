/* SequentialLR (torch.optim.lr_scheduler, 1.13): scheduler 0 until the
 * first milestone, scheduler k from milestone k - 1 on.  Creating it puts
 * every group's lr back to its initial lr and starts scheduler 0 at epoch
 * 0 (torch "undoes" the steps its schedulers took when they were created);
 * at milestone k - 1 torch calls scheduler k's step(0), which sets the lr
 * of that scheduler's epoch 0 from its closed form (a jump, e.g. from a
 * warm-up's last lr to the cosine's base), and every later step advances
 * it by one.  Here every child is a closed form, so a child at epoch e is
 * simply set to its lr for e. */
#include "base/error.h"
#include "optim/lr_scheduler.h"

int ddp__lr_sequential_check(ddp_optim_t *opt, const ddp_lr_options *o)
{
    DDP_FAIL_IF(o->nschedulers < 1 || !o->schedulers, DDP_ERR_INVALID_ARG,
                "SequentialLR: %d schedulers", o->nschedulers);
    DDP_FAIL_IF(o->nmilestones != o->nschedulers - 1 || (o->nmilestones > 0 && !o->milestones),
                DDP_ERR_INVALID_ARG,
                "SequentialLR: expects number of schedulers provided to be one more than the "
                "number of milestone points, but got number of schedulers %d and the number "
                "of milestones to be equal to %d", o->nschedulers, o->nmilestones);
    for (int i = 0; i < o->nschedulers; i++) {
        const ddp_lr_scheduler_t *c = o->schedulers[i];
        DDP_FAIL_IF(!c, DDP_ERR_INVALID_ARG, "SequentialLR: scheduler %d is NULL", i);
        DDP_FAIL_IF(c->opt != opt, DDP_ERR_INVALID_ARG,
                    "SequentialLR: expects all schedulers to belong to the same optimizer, but "
                    "got schedulers at index %d to be different than the optimizer passed in",
                    i);
        DDP_FAIL_IF(c->o.kind == DDP_LR_PLATEAU || c->o.kind == DDP_LR_SEQUENTIAL,
                    DDP_ERR_INVALID_ARG, "SequentialLR: scheduler %d is a %s, not a closed "
                    "form", i, c->o.kind == DDP_LR_PLATEAU ? "ReduceLROnPlateau" : "SequentialLR");
    }
    for (int i = 0; i < o->nmilestones; i++)
        DDP_FAIL_IF(o->milestones[i] <= (i ? o->milestones[i - 1] : 0), DDP_ERR_INVALID_ARG,
                    "SequentialLR: milestones must be > 0 and increase (%d at index %d)",
                    o->milestones[i], i);
    return 0;
}

/* bisect_right(milestones, epoch): the child in charge at epoch. */
static int child_at(const ddp_lr_scheduler_t *s, int64_t epoch)
{
    int i = 0;
    while (i < s->o.nmilestones && s->milestones[i] <= epoch)
        i++;
    return i;
}

void ddp__lr_sequential_init(ddp_lr_scheduler_t *s)
{
    for (int g = 0; g < s->ngroups; g++)
        ddp_optim_set_group_lr(s->opt, g, s->base[g]);
    ddp__lr_sequential_set_epoch(s, 0);
}

void ddp__lr_sequential_set_epoch(ddp_lr_scheduler_t *s, int64_t epoch)
{
    int k = child_at(s, epoch);
    ddp_lr_scheduler_t *c = s->children[k];
    s->last_epoch = epoch;
    ddp_lr_scheduler_set_last_epoch(c, k > 0 ? epoch - s->milestones[k - 1] : epoch);
    for (int g = 0; g < s->ngroups; g++)
        s->last[g] = ddp_lr_scheduler_group_last_lr(c, g);
}

void ddp__lr_sequential_step(ddp_lr_scheduler_t *s)
{
    ddp__lr_sequential_set_epoch(s, s->last_epoch + 1);
}
