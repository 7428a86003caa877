/* ddp-mnist, the reference program: --pipeline-stages S --micro-batches M.
 * The world's ranks are R = world / S replicas of an S-stage pipeline
 * (rank = replica * S + stage, include/ddp/pipeline.h): the model
 * Sequential(Linear(784,256), ReLU, Linear(256,10)) is cut after the ReLU
 * (S = 2; S = 1 keeps it whole: micro-batches and DDP only), each replica
 * trains on its DistributedSampler share as a plain DDP rank would, and
 * every stage of a replica reads the same batches (stage 0 uses the images,
 * the last stage the labels).  The last stage of replica 0 (world rank
 * S - 1) has the loss and the logits: it prints the step lines and the
 * test accuracy; rank 0 prints the throughput, as without a pipeline.
 * --checkpoint-dir saves sharded checkpoints and resumes from them (below).
 * docs/pipeline.md. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ddp/pipeline.h"
#include "mnist.h"

#define LOG_EVERY 100

/* The module of the full Sequential (3 modules) that starts stage s of S;
 * stage_begin(S, S) = 3 ends the last. */
static int stage_begin(int s, int S)
{
    static const int cuts[2][3] = {{0, 3, 3}, {0, 2, 3}};
    return cuts[S - 1][s];
}

/* This stage's part of the full model, with the full model's values and
 * names (so that replicas and a plain run start alike). */
static int stage_model(ddp_model_t *full, int stage, int S, ddp_model_t **out)
{
    ddp_model_t *m;
    int rc = ddp_model_create(&m);
    for (int i = stage_begin(stage, S); rc == 0 && i < stage_begin(stage + 1, S); i++) {
        ddp_module_t *mod = NULL;
        char name[16];
        snprintf(name, sizeof name, "%d", i);
        rc = i == 1 ? ddp_relu_create(&mod)
                    : ddp_linear_create(i ? HIDDEN : IN, i ? CLASSES : HIDDEN, 1, 0, &mod);
        if (rc == 0)
            rc = ddp_model_add_module(m, name, mod);
    }
    for (size_t k = 0; rc == 0 && k < ddp_model_num_params(m); k++) {
        ddp_param *p = ddp_model_param(m, k), *q = ddp_model_find_param(full, p->name);
        memcpy(p->data, q->data, p->numel * sizeof *p->data);
    }
    if (rc < 0) {
        ddp_model_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* Replica 0 evaluates the test split through its stages, EVAL_BATCH rows
 * at a time; its last stage prints the accuracy. */
static int pipeline_eval(job *j, ddp_pipeline_t *pp, ddp_model_t *m)
{
    if (ddp_pipeline_replica(pp) != 0)
        return 0;
    ddp_dataset_t *test;
    int rc = open_split(j->a->data, 0, &test);
    if (rc < 0)
        return rc;
    ddp_loader_options o = ddp_loader_defaults();
    o.batch_size = EVAL_BATCH;
    ddp_loader_t *dl = NULL;
    size_t correct = 0, n = 0;
    ddp_batch b;
    ddp_model_train(m, 0);
    if ((rc = ddp_loader_create(test, &o, &dl)) == 0)
        rc = ddp_loader_epoch_begin(dl, 0);
    while (rc >= 0 && (rc = ddp_loader_next(dl, &b)) == 1) {
        ddp_tensor x, z;
        rc = ddp_tensor_wrap(&x, b.x, 2, (int64_t[]){(int64_t)b.size, IN});
        if (rc < 0 || (rc = ddp_pipeline_forward(pp, &x, (int64_t)b.size, &z)) < 0)
            break;
        for (size_t i = 0; z.data && i < b.size; i++) { /* the last stage has logits */
            int best = 0;
            for (int c = 1; c < CLASSES; c++)
                if (z.data[i * CLASSES + c] > z.data[i * CLASSES + best])
                    best = c;
            correct += best == b.y64[i];
        }
        n += b.size;
        ddp_tensor_destroy(&z);
    }
    ddp_model_train(m, 1);
    ddp_loader_destroy(dl);
    ddp_dataset_destroy(test);
    if (rc >= 0 && ddp_pipeline_stage(pp) == ddp_pipeline_num_stages(pp) - 1)
        printf("Test accuracy: %.2f %%\n", n ? 100.0 * (double)correct / (double)n : 0.0);
    return rc < 0 ? rc : 0;
}

/* ==== checkpoints ===========================================================
 * --checkpoint-dir DIR: every --checkpoint-every steps the stages save a
 * sharded checkpoint (include/ddp/pipeline.h) into zero.c's folders, and a
 * resume (or a ddprun restart) loads DIR/zero-latest: a pipeline's or a
 * ZeRO run's, of any cut, replicas or world size. */

typedef struct pp_save_args {
    ddp_pipeline_t *pp;
    ddp_optim_t *opt;
    const ddp_train_state *st;
} pp_save_args;

static int pp_save(const char *dir, void *arg)
{
    pp_save_args *s = arg;
    return ddp_pipeline_checkpoint_save(dir, s->pp, s->opt, s->st);
}

/* The position is in batches of one replica (st.world_size: replicas). */
static int pipeline_save(job *j, ddp_pipeline_t *pp, ddp_optim_t *opt, long epoch, int64_t step)
{
    ddp_train_state st = {.epoch = epoch, .step = step, .global_step = j->st.global_step,
                          .seed = j->a->seed, .world_size = ddp_pipeline_num_replicas(pp)};
    pp_save_args s = {pp, opt, &st};
    return sharded_save(j, pp_save, &s);
}

static int pp_load(const char *dir, ddp_train_state *st, void *arg)
{
    pp_save_args *s = arg;
    return ddp_pipeline_checkpoint_load(dir, s->pp, s->opt, st);
}

static int pipeline_resume(job *j, ddp_pipeline_t *pp, ddp_optim_t *opt)
{
    pp_save_args s = {pp, opt, NULL};
    return sharded_resume(j, pp_load, &s, ddp_pipeline_num_replicas(pp), "replicas");
}

static int pipeline_epochs(job *j, ddp_pipeline_t *pp, ddp_optim_t *opt, ddp_loader_t *dl)
{
    const args *a = j->a;
    int last = ddp_pipeline_stage(pp) == ddp_pipeline_num_stages(pp) - 1;
    int printer = last && ddp_pipeline_replica(pp) == 0;
    size_t total = ddp_loader_length(dl);
    int rc = 0;
    for (long epoch = (long)j->st.epoch; epoch < a->epochs && rc >= 0; epoch++) {
        size_t skip = epoch == j->st.epoch ? (size_t)j->st.step : 0; /* trained before */
        ddp_batch b;
        rc = ddp_loader_epoch_begin(dl, (uint64_t)epoch);
        while (rc >= 0 && (rc = ddp_loader_next(dl, &b)) == 1) {
            if (b.index < skip || (long)b.size < a->micro_batches)
                continue; /* or a short last batch with fewer rows than micro-batches */
            ddp_tensor x;
            float loss;
            if ((rc = ddp_tensor_wrap(&x, b.x, 2, (int64_t[]){(int64_t)b.size, IN})) < 0)
                break;
            ddp_optim_zero_grad(opt);
            if ((rc = ddp_pipeline_step(pp, &x, b.y64, (int64_t)b.size, &loss)) < 0 ||
                (rc = ddp_optim_step(opt)) < 0)
                break;
            j->samples += b.size;
            j->st.global_step++;
            maybe_crash(j);
            if (printer && (b.index + 1) % LOG_EVERY == 0)
                printf("Epoch [%ld/%ld], Step [%zu/%zu], Loss: %.4f\n", epoch + 1, a->epochs,
                       b.index + 1, total, loss);
            if (j->ckpt[0] && j->st.global_step % a->ckpt_every == 0)
                rc = b.index + 1 == total ? pipeline_save(j, pp, opt, epoch + 1, 0)
                                          : pipeline_save(j, pp, opt, epoch, (int64_t)b.index + 1);
        }
        fflush(stdout);
    }
    return rc < 0 ? rc : 0;
}

/* The replica's loader: the DistributedSampler share of replica r of R. */
static int replica_loader(job *j, ddp_dataset_t *train_ds, int r, int R, ddp_sampler_t **sampler,
                          ddp_loader_t **dl)
{
    const args *a = j->a;
    ddp_sampler_distributed_options dso = ddp_sampler_distributed_defaults();
    dso.num_replicas = R;
    dso.rank = r;
    dso.shuffle = a->shuffle;
    dso.seed = a->seed;
    int rc = ddp_sampler_distributed_create(ddp_dataset_length(train_ds), &dso, sampler);
    if (rc < 0)
        return rc;
    ddp_loader_options lo = ddp_loader_defaults();
    lo.batch_size = (size_t)a->batch;
    lo.sampler = *sampler;
    lo.num_workers = a->workers < 0 ? 0 : (int)a->workers;
    return ddp_loader_create(train_ds, &lo, dl);
}

int run_pipeline(job *j, ddp_dataset_t *train_ds)
{
    const args *a = j->a;
    int S = (int)a->pipeline_stages;
    ddp_pipeline_options o = ddp_pipeline_defaults(S, (int)a->micro_batches);
    int stage = j->rank % S;
    o.input_ndim = 1;
    o.input_shape[0] = stage_begin(stage, S) == 0 ? IN : HIDDEN;
    ddp_model_t *m = NULL;
    ddp_optim_t *opt = NULL;
    ddp_pipeline_t *pp = NULL;
    ddp_sampler_t *sampler = NULL;
    ddp_loader_t *dl = NULL;
    ddp_sgd_options so = ddp_sgd_defaults(a->lr);
    so.momentum = a->momentum;
    double t0 = ddp_time_now();
    int rc = stage_model(j->model, stage, S, &m);
    if (rc == 0 && (rc = ddp_pipeline_create(j->pg, m, &o, &pp)) == 0 &&
        (rc = ddp_sgd_create(m, &so, &opt)) == 0 && (rc = pipeline_resume(j, pp, opt)) == 0 &&
        train_ds &&
        (rc = replica_loader(j, train_ds, ddp_pipeline_replica(pp),
                             ddp_pipeline_num_replicas(pp), &sampler, &dl)) == 0) {
        t0 = ddp_time_now();
        rc = pipeline_epochs(j, pp, opt, dl);
    }
    /* samples of every replica (stage 0's count) over the slowest rank */
    double dt = ddp_time_now() - t0;
    int64_t n = stage == 0 ? (int64_t)j->samples : 0;
    if (rc == 0 && train_ds && (rc = ddp_pg_all_reduce(j->pg, &n, 1, DDP_INT64, DDP_SUM)) == 0 &&
        (rc = ddp_pg_all_reduce(j->pg, &dt, 1, DDP_FLOAT64, DDP_MAX)) == 0 && j->rank == 0)
        printf("Throughput: %.0f samples/s\n", dt > 0 ? (double)n / dt : 0.0);
    if (rc == 0)
        rc = pipeline_eval(j, pp, m);
    ddp_loader_destroy(dl);
    ddp_sampler_destroy(sampler);
    ddp_pipeline_destroy(pp);
    ddp_optim_destroy(opt);
    ddp_model_destroy(m);
    return rc;
}
