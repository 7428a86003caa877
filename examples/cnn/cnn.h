/* ddp-cnn: PyTorch's examples/mnist network in C (main.c says what it
 * does).  What its files share: args.c reads the command line, model.c
 * holds the network, its forward and the evaluation, train.c the training
 * loop and checkpoints, main.c joins the job and runs it. */
#ifndef DDP_EXAMPLES_CNN_H
#define DDP_EXAMPLES_CNN_H

#include <stddef.h>
#include <stdint.h>

#include "ddp.h"

#define SIDE 28
#define CLASSES 10
#define EVAL_BATCH 100 /* small: an evaluation's activations stay ~50 MB */

typedef struct args {
    const char *data;
    long epochs;
    long batch;
    double lr, gamma;        /* Adadelta's lr; StepLR(step_size 1, gamma) */
    unsigned long long seed;
    int shuffle;
    int dropout;             /* 0: --no-dropout (p = 0: deterministic steps) */
    long max_steps;          /* stop after this many steps in all; -1: no limit */
    const char *load, *save;
    long workers;
    const char *backend;
    const char *init_method; /* NULL: env:// when distributed */
    long rank, world_size;   /* -1: from the launcher's environment */
    double timeout;
    const char *ckpt_dir;
    long ckpt_every;
    int resume;
} args;

typedef struct job {
    const args *a;
    int rank, world, local_world;
    ddp_pg_t *pg;                   /* NULL when alone */
    ddp_data_parallel_t *dm;        /* NULL when alone */
    ddp_model_t *model;
    ddp_tape_t *tape;
    ddp_optim_t *opt;
    ddp_lr_scheduler_t *sched;
    ddp_train_state st;             /* where training starts (after a resume) */
    char ckpt[4096];                /* checkpoint path, "" without --checkpoint-dir */
} job;

/* args.c: 0 to run, 2 on bad flags (message printed), -1 after --help. */
int parse_args(int argc, char **argv, args *a);

/* model.c */
int build_model(const args *a, int rank, ddp_model_t **model);
int forward(job *j, const ddp_batch *b, ddp_var_t **logp);
int open_split(const char *dir, int train, ddp_dataset_t **ds);
int evaluate(job *j, ddp_dataset_t *test, double *loss, double *acc);

/* train.c */
int train(job *j, ddp_loader_t *dl);
/* Rank 0 loads the checkpoint when resuming and shares it: 0, or the exit
 * status once this rank said why it stops. */
int resume(job *j);

/* "ddp-cnn: " + the message on stderr. */
__attribute__((format(printf, 1, 2))) void stop_error(const char *fmt, ...);

#endif
