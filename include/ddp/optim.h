/* libddp optim layer: SGD, Adam, AdamW, Adadelta and RMSprop with
 * torch.optim's exact update rules, over the parameters of a model
 * (include/ddp/nn.h), in parameter groups (torch.optim's param_groups).
 *
 * An optimizer updates p->data from p->grad for every parameter of its model
 * (wherever p->grad points: DDP may re-point it).  Gradients are never "None"
 * here: a parameter that a step did not use has a zero gradient (after
 * zero_grad) and is updated like PyTorch updates a parameter with a zero
 * gradient (weight decay and momentum still apply).
 *
 * State for checkpoints: every state buffer is one flat float block laid out
 * like the model's parameter block (parameter i's slice starts at
 * p->offset), enumerated with ddp_optim_state(); together with the step
 * count (ddp_optim_steps / ddp_optim_set_steps) it is the whole state.
 */
#ifndef DDP_OPTIM_H
#define DDP_OPTIM_H

#include "ddp/base.h"
#include "ddp/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddp_optim ddp_optim_t;

/* One parameter group (an entry of torch.optim's param_groups): the
 * parameters it holds, named by fnmatch(3) patterns over their state_dict
 * names ("*.bias", "0.weight") and/or by index (ddp_model_param's order),
 * and the hyperparameters it overrides.  A field left NaN (as
 * ddp_param_group_defaults() leaves them all) keeps the optimizer's value;
 * overriding one the optimizer does not have (betas for SGD) is an error. */
typedef struct ddp_param_group {
    const char *const *names; /* nnames patterns (borrowed for the call) */
    int nnames;
    const int *indices;       /* nindices parameter indices (borrowed for the call) */
    int nindices;
    double lr;
    double weight_decay;
    double momentum;          /* SGD, RMSprop */
    double beta1, beta2;      /* Adam, AdamW */
} ddp_param_group;

/* No parameters, every override NaN. */
DDP_API ddp_param_group ddp_param_group_defaults(void);

/* torch.optim.SGD(params, lr, momentum=0, dampening=0, weight_decay=0,
 * nesterov=False, maximize=False). */
typedef struct ddp_sgd_options {
    double lr;
    double momentum;
    double dampening;
    double weight_decay;
    int nesterov;   /* requires momentum > 0 and dampening == 0 */
    int maximize;
    /* Parameter groups (see ddp_param_group; read during the call).  0: one group
     * of every parameter with these options.  Otherwise each group's
     * overrides apply on top of these options, and a parameter that no
     * group names must be added with ddp_optim_add_param_group before the
     * first step. */
    const ddp_param_group *groups;
    int ngroups;
} ddp_sgd_options;

/* torch.optim.Adam / AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
 * weight_decay=0 (Adam) / 1e-2 (AdamW), amsgrad=False, maximize=False). */
typedef struct ddp_adam_options {
    double lr;
    double beta1, beta2;
    double eps;
    double weight_decay;
    int amsgrad;
    int maximize;
    const ddp_param_group *groups; /* as ddp_sgd_options' */
    int ngroups;
} ddp_adam_options;

/* torch.optim.Adadelta(params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0,
 * maximize=False).  State "square_avg", "acc_delta". */
typedef struct ddp_adadelta_options {
    double lr;
    double rho;   /* in [0, 1] */
    double eps;
    double weight_decay;
    int maximize;
    const ddp_param_group *groups; /* as ddp_sgd_options' */
    int ngroups;
} ddp_adadelta_options;

/* torch.optim.RMSprop(params, lr=1e-2, alpha=0.99, eps=1e-8,
 * weight_decay=0, momentum=0, centered=False, maximize=False).  State
 * "square_avg", then "momentum_buffer" when a group has momentum > 0, then
 * "grad_avg" when centered. */
typedef struct ddp_rmsprop_options {
    double lr;
    double alpha;
    double eps;
    double weight_decay;
    double momentum;
    int centered;
    int maximize;
    const ddp_param_group *groups; /* as ddp_sgd_options' */
    int ngroups;
} ddp_rmsprop_options;

/* PyTorch's defaults, with the given learning rate for SGD. */
DDP_API ddp_sgd_options ddp_sgd_defaults(double lr);
DDP_API ddp_adam_options ddp_adam_defaults(void);
DDP_API ddp_adam_options ddp_adamw_defaults(void);
DDP_API ddp_adadelta_options ddp_adadelta_defaults(void);
DDP_API ddp_rmsprop_options ddp_rmsprop_defaults(void);

/* Creates an optimizer over every parameter of model (borrowed: it must
 * outlive the optimizer; sealed by this call).  Options are copied; invalid
 * ones (negative lr, nesterov without momentum, betas outside [0, 1), ...)
 * fail with DDP_ERR_INVALID_ARG naming the option.  Caller destroys. */
DDP_API int ddp_sgd_create(ddp_model_t *model, const ddp_sgd_options *opt, ddp_optim_t **out);
DDP_API int ddp_adam_create(ddp_model_t *model, const ddp_adam_options *opt, ddp_optim_t **out);
/* Adam with decoupled weight decay (p *= 1 - lr * weight_decay first). */
DDP_API int ddp_adamw_create(ddp_model_t *model, const ddp_adam_options *opt, ddp_optim_t **out);
DDP_API int ddp_adadelta_create(ddp_model_t *model, const ddp_adadelta_options *opt,
                                ddp_optim_t **out);
DDP_API int ddp_rmsprop_create(ddp_model_t *model, const ddp_rmsprop_options *opt,
                               ddp_optim_t **out);
/* NULL is a no-op. */
DDP_API void ddp_optim_destroy(ddp_optim_t *o);

/* torch's optimizer.add_param_group: a new group of parameters that no
 * group holds yet (one already in group k fails with DDP_ERR_INVALID_ARG
 * naming it and k; so does a group that names no parameter).  Only before
 * the first step, since every parameter must be in a group by then. */
DDP_API int ddp_optim_add_param_group(ddp_optim_t *o, const ddp_param_group *g);
DDP_API int ddp_optim_num_groups(const ddp_optim_t *o);
/* The group of parameter index i (ddp_model_param's order), -1 if none. */
DDP_API int ddp_optim_param_group(const ddp_optim_t *o, size_t i);
/* Group g's learning rate (0 for a group that does not exist). */
DDP_API double ddp_optim_group_lr(const ddp_optim_t *o, int g);
DDP_API void ddp_optim_set_group_lr(ddp_optim_t *o, int g, double lr);
/* Group g's momentum (SGD, RMSprop) or beta1 (Adam, AdamW), which
 * OneCycleLR's cycle_momentum sets; NaN for Adadelta or a missing group. */
DDP_API double ddp_optim_group_momentum(const ddp_optim_t *o, int g);

/* One update of every parameter from its gradient.  Fails with
 * DDP_ERR_STATE naming a parameter that is in no group. */
DDP_API int ddp_optim_step(ddp_optim_t *o);
/* Zeroes every parameter's gradient (ddp_model_zero_grad). */
DDP_API void ddp_optim_zero_grad(ddp_optim_t *o);

/* Learning rate in force: the first group's (the only one without groups);
 * set_lr sets the first group's. */
DDP_API double ddp_optim_lr(const ddp_optim_t *o);
DDP_API void ddp_optim_set_lr(ddp_optim_t *o, double lr);
/* Steps taken so far (Adam's `step`; SGD's momentum buffers exist once it
 * is > 0).  set_steps restores it from a checkpoint.  SGD's first step sets
 * every momentum buffer to the gradient (torch's clone) when steps is 0,
 * for all parameters at once: a checkpoint with steps > 0 must bring its
 * momentum_buffer (with dampening != 0 a missing one would take the
 * dampened update where torch clones). */
DDP_API int64_t ddp_optim_steps(const ddp_optim_t *o);
DDP_API void ddp_optim_set_steps(ddp_optim_t *o, int64_t steps);

/* Number of state buffers: SGD 1 with momentum ("momentum_buffer") else 0;
 * Adam/AdamW 2 ("exp_avg", "exp_avg_sq") or 3 with amsgrad
 * ("max_exp_avg_sq"); Adadelta 2; RMSprop 1 to 3 (see its options).  A
 * buffer covers every parameter, whatever its group (with momentum in one
 * group only, the others' slices stay zero). */
DDP_API int ddp_optim_num_states(const ddp_optim_t *o);
/* The i-th state buffer: its name, data (borrowed, owned by the optimizer,
 * writable for loading) and length (the model's total numel).  Returns
 * DDP_ERR_NOT_FOUND when i is out of range. */
DDP_API int ddp_optim_state(ddp_optim_t *o, int i, const char **name, float **data,
                            size_t *numel);

/* ==== learning-rate schedules ============================================
 * torch.optim.lr_scheduler's StepLR, MultiStepLR, ExponentialLR,
 * CosineAnnealingLR, LinearLR, LambdaLR and OneCycleLR in their closed
 * forms, SequentialLR over them, and ReduceLROnPlateau.  Every schedule
 * sets every parameter group's lr from that group's own base lr: the
 * group's lr when the first scheduler over the optimizer was created
 * (torch's group['initial_lr'], kept by the optimizer, so that a second
 * scheduler, e.g. SequentialLR's next one, starts from the same base;
 * OneCycleLR sets it to max_lr / div_factor).  Creating a scheduler sets
 * the epoch-0 lr (LinearLR: base * start_factor; ReduceLROnPlateau leaves
 * the lr as it is), and each ddp_lr_scheduler_step() (after the
 * optimizer's step, as in PyTorch) advances last_epoch by one and sets the
 * lrs. */

typedef struct ddp_lr_scheduler ddp_lr_scheduler_t;

enum ddp_lr_kind {
    DDP_LR_STEP,        /* base * gamma^floor(epoch / step_size) */
    DDP_LR_MULTISTEP,   /* base * gamma^(milestones <= epoch) */
    DDP_LR_EXPONENTIAL, /* base * gamma^epoch */
    DDP_LR_COSINE,      /* eta_min + (base - eta_min) (1 + cos(pi epoch / t_max)) / 2 */
    DDP_LR_LINEAR,      /* base * (start + (end - start) min(epoch, total_iters) / total_iters) */
    DDP_LR_LAMBDA,      /* base * lambda(epoch, group, user) */
    DDP_LR_ONECYCLE,    /* warm up to max_lr, anneal to max_lr / div / final_div */
    DDP_LR_SEQUENTIAL,  /* schedulers[i] from milestones[i - 1] on */
    DDP_LR_PLATEAU,     /* lr *= factor after patience epochs without improvement */
};

/* LambdaLR's factor for group g at epoch (epoch 0 at creation). */
typedef double (*ddp_lr_lambda_fn)(int64_t epoch, int group, void *user);

typedef struct ddp_lr_options {
    int kind;                 /* enum ddp_lr_kind */
    int step_size;            /* STEP, > 0 */
    double gamma;             /* STEP, MULTISTEP, EXPONENTIAL */
    const int *milestones;    /* MULTISTEP: increasing epochs; SEQUENTIAL: nschedulers - 1
                               * increasing epochs > 0 (copied) */
    int nmilestones;
    int t_max;                /* COSINE, > 0 */
    double eta_min;           /* COSINE */
    double start_factor;      /* LINEAR, in (0, 1] */
    double end_factor;        /* LINEAR, in [0, 1] */
    int total_iters;          /* LINEAR, > 0 */
    /* LAMBDA: called at creation and at every step (and set_last_epoch) */
    ddp_lr_lambda_fn lambda;
    void *user;
    /* ONECYCLE */
    double max_lr;            /* > 0, for every group unless max_lrs */
    const double *max_lrs;    /* NULL, or one per group (copied) */
    int total_steps;          /* > 0; stepping past it holds the last lr
                               * (torch raises ValueError) */
    double pct_start;         /* in [0, 1], default 0.3 */
    int anneal_linear;        /* 0: 'cos' (default), 1: 'linear' */
    double div_factor;        /* default 25 */
    double final_div_factor;  /* default 1e4 */
    int three_phase;
    int cycle_momentum;       /* 1: momentum (SGD, RMSprop) or beta1 (Adam, AdamW)
                               * cycles inversely, max -> base -> max (default 0,
                               * torch's is True); Adadelta has neither */
    double base_momentum;     /* default 0.85 */
    double max_momentum;      /* default 0.95 */
    /* SEQUENTIAL: closed-form schedulers over the same optimizer (borrowed:
     * they must outlive this one); at milestone k, scheduler k + 1 starts
     * at its epoch 0, as torch's scheduler.step(0) */
    ddp_lr_scheduler_t *const *schedulers;
    int nschedulers;
    /* PLATEAU (stepped with ddp_lr_scheduler_step_metric) */
    int mode_max;             /* 0: 'min' (default), 1: 'max' */
    double factor;            /* in (0, 1), default 0.1 */
    int patience;             /* default 10 */
    double threshold;         /* default 1e-4 */
    int threshold_abs;        /* 0: 'rel' (default), 1: 'abs' */
    int cooldown;             /* default 0 */
    double min_lr;            /* for every group, default 0 */
    double eps;               /* default 1e-8 */
} ddp_lr_options;

/* PyTorch's defaults for that kind (StepLR/MultiStepLR gamma 0.1, LinearLR
 * 1/3 -> 1 over 5, OneCycleLR's and ReduceLROnPlateau's as above). */
DDP_API ddp_lr_options ddp_lr_defaults(int kind);

/* Creates a schedule over opt (borrowed: it must outlive the scheduler) and
 * sets the epoch-0 learning rates.  Invalid options fail with
 * DDP_ERR_INVALID_ARG naming the option.  Caller destroys. */
DDP_API int ddp_lr_scheduler_create(ddp_optim_t *opt, const ddp_lr_options *o,
                                    ddp_lr_scheduler_t **out);
/* NULL is a no-op. */
DDP_API void ddp_lr_scheduler_destroy(ddp_lr_scheduler_t *s);
/* last_epoch += 1; sets the optimizer's new lrs and returns the first
 * group's.  A ReduceLROnPlateau is left as it is (it needs a metric). */
DDP_API double ddp_lr_scheduler_step(ddp_lr_scheduler_t *s);
/* ReduceLROnPlateau.step(metric): DDP_ERR_INVALID_ARG for another kind. */
DDP_API int ddp_lr_scheduler_step_metric(ddp_lr_scheduler_t *s, double metric);
/* The lr the schedule set last for the first group (PyTorch's
 * get_last_lr()[0]); group_last_lr for group g. */
DDP_API double ddp_lr_scheduler_last_lr(const ddp_lr_scheduler_t *s);
DDP_API double ddp_lr_scheduler_group_last_lr(const ddp_lr_scheduler_t *s, int g);
/* Epochs stepped so far; set_last_epoch restores it from a checkpoint and
 * sets the lrs for that epoch (not for ReduceLROnPlateau: see set_state). */
DDP_API int64_t ddp_lr_scheduler_last_epoch(const ddp_lr_scheduler_t *s);
DDP_API void ddp_lr_scheduler_set_last_epoch(ddp_lr_scheduler_t *s, int64_t epoch);

/* A scheduler's whole state, for checkpoints: last_epoch, and
 * ReduceLROnPlateau's counters (zero for the others).  A plateau's lrs are
 * the optimizer's (a checkpoint keeps them with the optimizer). */
typedef struct ddp_lr_state {
    int64_t last_epoch;
    double best;
    int64_t num_bad_epochs;
    int64_t cooldown_counter;
} ddp_lr_state;

DDP_API ddp_lr_state ddp_lr_scheduler_state(const ddp_lr_scheduler_t *s);
/* Restores it: closed forms set their lrs for last_epoch; a plateau takes
 * its counters and the optimizer's current lrs as its last ones.  Negative
 * counts fail with DDP_ERR_INVALID_ARG. */
DDP_API int ddp_lr_scheduler_set_state(ddp_lr_scheduler_t *s, const ddp_lr_state *st);

#ifdef __cplusplus
}
#endif
#endif
