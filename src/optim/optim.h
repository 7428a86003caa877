/* Private: the optimizer object shared by optim.c (creation, steps, state),
 * param_group.c (groups) and lr_scheduler*.c (per-group initial lr). */
#ifndef DDP_OPTIM_OPTIM_H
#define DDP_OPTIM_OPTIM_H

#include "ddp/optim.h"

enum ddp__optim_kind {
    DDP__OPT_SGD,
    DDP__OPT_ADAM,
    DDP__OPT_ADAMW,
    DDP__OPT_ADADELTA,
    DDP__OPT_RMSPROP,
};

/* One kind's options; `kind` says which member is in use. */
typedef union ddp__optim_hyper {
    ddp_sgd_options sgd;
    ddp_adam_options adam;
    ddp_adadelta_options adadelta;
    ddp_rmsprop_options rmsprop;
} ddp__optim_hyper;

typedef struct ddp__optim_group {
    ddp__optim_hyper h; /* the group's options (groups field cleared) */
    double initial_lr;  /* torch's group['initial_lr']: NaN until a scheduler sets it */
} ddp__optim_group;

#define DDP__OPTIM_MAX_STATES 3

struct ddp_optim {
    int kind;           /* enum ddp__optim_kind */
    const char *who;    /* "SGD", "Adam", ... for messages */
    ddp_model_t *model;
    ddp__optim_hyper defaults; /* the options given at creation */
    ddp__optim_group *groups;
    int ngroups, capgroups;
    int *group_of;      /* (num params) each parameter's group, -1: none */
    int grouped;        /* every parameter has been seen in a group */
    int64_t steps;
    int nstates;
    const char *state_names[DDP__OPTIM_MAX_STATES];
    float *states[DDP__OPTIM_MAX_STATES]; /* (numel) each */
    size_t numel;
};

/* The lr field of a kind's options. */
double *ddp__optim_hyper_lr(int kind, ddp__optim_hyper *h);
/* The momentum field of a kind's options (SGD's and RMSprop's momentum,
 * Adam's beta1), NULL for Adadelta. */
double *ddp__optim_hyper_momentum(int kind, ddp__optim_hyper *h);
/* Checks a kind's options, the message naming the optimizer (o->who). */
int ddp__optim_check(int kind, const ddp__optim_hyper *h);
/* Makes one group of every parameter with the optimizer's options
 * (param_group.c). */
int ddp__optim_group_all(ddp_optim_t *o);
/* Allocates the state buffers that the groups now need (optim.c). */
int ddp__optim_ensure_states(ddp_optim_t *o);
/* Group g's initial lr slot (torch's group['initial_lr']); NULL if g does
 * not exist. */
double *ddp__optim_initial_lr(ddp_optim_t *o, int g);

#endif
