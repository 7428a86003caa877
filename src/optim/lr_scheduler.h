/* Private: the scheduler object shared by lr_scheduler.c (closed forms),
 * lr_plateau.c (ReduceLROnPlateau) and lr_sequential.c (SequentialLR). */
#ifndef DDP_OPTIM_LR_SCHEDULER_H
#define DDP_OPTIM_LR_SCHEDULER_H

#include "ddp/optim.h"

struct ddp_lr_scheduler {
    ddp_optim_t *opt;
    ddp_lr_options o;              /* its arrays point at the copies below */
    int *milestones;               /* MULTISTEP, SEQUENTIAL */
    double *max_lrs;               /* ONECYCLE (ngroups) */
    ddp_lr_scheduler_t **children; /* SEQUENTIAL (borrowed) */
    int ngroups;
    double *base;                  /* (ngroups) each group's initial lr */
    double *last;                  /* (ngroups) the lrs set last */
    int64_t last_epoch;
    double best;                   /* PLATEAU */
    int64_t num_bad_epochs, cooldown_counter;
};

/* Sets every group's lr to lr(g) and remembers it as the last one. */
void ddp__lr_apply(ddp_lr_scheduler_t *s, int g, double lr);

int ddp__lr_plateau_check(const ddp_lr_options *o);
void ddp__lr_plateau_init(ddp_lr_scheduler_t *s);
int ddp__lr_plateau_step(ddp_lr_scheduler_t *s, double metric);

int ddp__lr_sequential_check(ddp_optim_t *opt, const ddp_lr_options *o);
/* Resets the lrs to the bases and starts the first scheduler. */
void ddp__lr_sequential_init(ddp_lr_scheduler_t *s);
void ddp__lr_sequential_step(ddp_lr_scheduler_t *s);
void ddp__lr_sequential_set_epoch(ddp_lr_scheduler_t *s, int64_t epoch);

#endif
