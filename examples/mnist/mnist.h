/* ddp-mnist, the reference program (main.c says what it does): what its
 * files share.  args.c reads the command line, model.c holds the model and
 * the evaluation, train.c the training loop, checkpoint.c checkpoints and
 * resuming, powersgd_state.c every rank's PowerSGD state beside them,
 * main.c joins the job and runs it. */
#ifndef DDP_EXAMPLES_MNIST_H
#define DDP_EXAMPLES_MNIST_H

#include <stddef.h>
#include <stdint.h>

#include "ddp.h"
#include "ddp/powersgd.h"

#define IN 784
#define HIDDEN 256   /* the default --hidden */
#define MAX_HIDDEN 8 /* hidden layers --hidden takes at most */
#define CLASSES 10
#define EVAL_BATCH 1000

typedef struct args {
    const char *data;
    long epochs;
    long batch;
    double lr;
    double momentum;
    unsigned long long seed;
    int shuffle;
    const char *load;
    const char *save;
    long workers;
    const char *backend;
    const char *init_method; /* NULL: env:// when distributed */
    long rank, world_size;   /* -1: from the launcher's environment */
    double timeout;
    const char *ckpt_dir;
    long ckpt_every;
    int resume;
    long crash_at;           /* fault injection for restart tests: -1 off */
    const char *metrics;     /* --metrics FILE, or NULL */
    long eval_every;         /* evaluate every N global steps; 0: at the end only */
    int progress;            /* 0: --no-progress */
    long zero;               /* --zero stage, 0: off */
    long pipeline_stages;    /* --pipeline-stages S; 0: no pipeline */
    long micro_batches;      /* --micro-batches M (with a pipeline) */
    long hidden[MAX_HIDDEN]; /* --hidden LIST: the hidden layers' widths */
    int nhidden;             /* ... how many (default 1: 256) */
    long powersgd;           /* --powersgd RANK; 0: plain all-reduce */
    long powersgd_start;     /* --powersgd-start N (start_powersgd_iter) */
} args;

/* DDP_MNIST_PROFILE=1: where a training step's time goes, per phase,
 * printed by every rank on stderr at the end (bench/ddp_mnist.sh). */
enum { PH_LOAD, PH_FORWARD, PH_BACKWARD, PH_STEP, PH_N };

/* One job: this process's place in it and what it trains. */
typedef struct job {
    const args *a;
    int rank, world, restart;
    int local_world;      /* processes of the job on this host (launcher's word, else 1) */
    ddp_pg_t *pg;         /* NULL when alone */
    ddp_data_parallel_t *dm;        /* NULL when alone */
    ddp_model_t *model;
    ddp_tape_t *tape;
    ddp_optim_t *opt;     /* with --zero: over the shard model */
    ddp_zero_t *zero;     /* --zero on several ranks, else NULL */
    ddp_powersgd_t *psgd; /* --powersgd on several ranks, else NULL */
    ddp_train_state st;   /* where training starts (after a resume) */
    int resumed;          /* every rank: training goes on from a checkpoint */
    char ckpt[4096];      /* checkpoint path, "" without --checkpoint-dir */
    int profile;          /* DDP_MNIST_PROFILE=1 */
    int timestamps;       /* DDP_MNIST_TIMESTAMPS=1 */
    double phase[PH_N];   /* seconds spent in each phase (with profile) */
    /* what rank 0 shows and records (report.c) */
    ddp_progress_t *bar;  /* drawing on rank 0's terminal only */
    ddp_metrics_t *metrics;         /* rank 0 with --metrics, else NULL */
    ddp_dataset_t *test;  /* the test split on rank 0 during training, with --eval-every */
    size_t samples;       /* this rank's samples trained in this run */
    size_t epoch_samples; /* ... in this epoch */
    size_t rec_samples;   /* samples at the last train record */
    double rec_time;      /* ... and its time */
    double loss_sum;      /* rank 0's losses since the last train record */
    size_t loss_n;        /* ... and their number */
} job;

/* args.c: returns 0 to run, 2 on bad flags (message printed), -1 after
 * --help (exit 0). */
int parse_args(int argc, char **argv, args *a);

/* model.c: Sequential(Linear(784, h1), ReLU, ..., Linear(hk, 10)) for
 * a's --hidden widths, initialised from a's --seed. */
int build_model(const args *a, ddp_model_t **model);
int forward(ddp_data_parallel_t *dm, ddp_model_t *model, ddp_tape_t *tape, const ddp_batch *b,
            ddp_var_t **logits);
int open_split(const char *dir, int train, ddp_dataset_t **ds);
int evaluate(ddp_model_t *model, ddp_tape_t *tape, ddp_dataset_t *test, double *loss,
             double *acc);

/* report.c: the log line or progress bar of each step, metrics records,
 * evaluations; each returns 0 or a negative code (message in ddp_last_error) */
int report_begin(job *j);
int report_epoch_begin(job *j, long epoch, size_t total);
int report_step(job *j, long epoch, const ddp_batch *b, size_t total, float loss);
int report_epoch_end(job *j);
/* Rank 0 evaluates on the test split, prints the accuracy when final (the
 * program's last line) and writes the record; others do nothing. */
int report_eval(job *j, long epoch, int final);
void report_end(job *j);
/* The message a rank stops with: "ddp-mnist: " + it on stderr, and in
 * DDP_ERROR_FILE for the launcher's failure report (ddprun). */
__attribute__((format(printf, 1, 2))) void stop_error(const char *fmt, ...);

/* train.c; maybe_crash: --crash-at-step's fault, at the step it names */
int train(job *j, ddp_loader_t *dl);
void maybe_crash(const job *j);

/* zero.c: --zero.  zero_setup makes the optimizer a shard optimizer (after
 * DDP is set up, which --zero 2 goes without); the others are the step's,
 * with or without ZeRO. */
int zero_setup(job *j);
void zero_grad(job *j);
int backward(job *j, ddp_var_t *loss);
int optimizer_step(job *j);
void zero_teardown(job *j);
/* Every rank writes its shard of a sharded checkpoint (collective). */
int zero_checkpoint_save(job *j, const ddp_train_state *st);
/* A sharded checkpoint (ZeRO's or a pipeline's) by save(folder, arg), a
 * collective, into the folder of DIR that DIR/zero-latest does not name,
 * then the link pointed at it; sharded_latest: DIR/zero-latest. */
int sharded_save(job *j, int (*save)(const char *dir, void *arg), void *arg);
void sharded_latest(const job *j, char *dir, size_t cap);
/* --resume (or a ddprun restart): load(DIR/zero-latest, &st, arg) on every
 * rank.  On another data-parallel size than the saving run's the position
 * in the epoch is carried over as the share of the epoch's samples done
 * (st.step batches per replica of st.world_size); rank 0 says where it
 * resumes, "saved by N <unit>".  0 also when there is no checkpoint yet. */
int sharded_resume(job *j, int (*load)(const char *dir, ddp_train_state *st, void *arg),
                   void *arg, int replicas, const char *unit);
/* pipeline.c: training and evaluation with --pipeline-stages; 0 or a
 * negative code (message in ddp_last_error) */
int run_pipeline(job *j, ddp_dataset_t *train_ds);

/* outputs.c: returns 0, or the exit status once this rank said why it stops */
int check_outputs(job *j);

/* checkpoint.c: share_checkpoint returns 0 or an exit status, as check_outputs */
int save_checkpoint(job *j, int64_t epoch, int64_t step);
int load_checkpoint(job *j);
int share_checkpoint(job *j, int loaded);
/* powersgd_state.c: with --powersgd, every rank's state under this step's
 * name, then rank 0's checkpoint, then the older states removed; after a
 * resume, the states of the checkpoint's step (0 or an exit status). */
int powersgd_checkpoint_save(job *j, const ddp_train_state *st);
int resume_powersgd(job *j);

#endif
