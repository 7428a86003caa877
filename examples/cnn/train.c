/* ddp-cnn: the training loop (steps, log lines, throughput, StepLR per
 * epoch, --max-steps), checkpoints and resuming from them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cnn.h"

static int train_step(job *j, const ddp_batch *b, float *loss_value)
{
    ddp_var_t *logp, *loss;
    int rc;
    if ((rc = forward(j, b, &logp)) < 0 ||
        (rc = ddp_op_nll_loss(j->tape, logp, b->y64, &loss)) < 0)
        return rc;
    ddp_optim_zero_grad(j->opt);
    rc = j->dm ? ddp_data_parallel_backward(j->dm, j->tape, loss)
               : ddp_tape_backward(j->tape, loss, j->model);
    if (rc < 0 || (rc = ddp_optim_step(j->opt)) < 0)
        return rc;
    *loss_value = ddp_var_item(loss);
    return 0;
}

/* ==== dropout streams in checkpoints ======================================
 * Each rank draws its own dropout masks (build_model seeds them with the
 * rank): a checkpoint keeps every rank's streams, "libddp.rng.rank<r>.<module>",
 * so that a resumed run draws the masks of the uninterrupted one. */

enum { MAX_STREAMS = 8, MAX_RANKS = 1024 };

typedef struct streams {
    int n;
    uint64_t *state[MAX_STREAMS]; /* (4) each: the modules' own */
    char name[MAX_STREAMS][64];
} streams;

static int add_stream(ddp_module_t *m, const char *name, void *user)
{
    streams *s = user;
    int nwords;
    uint64_t *w = ddp_module_rng_state(m, &nwords);
    if (!w || s->n == MAX_STREAMS)
        return 0;
    s->state[s->n] = w;
    snprintf(s->name[s->n++], sizeof s->name[0], "%s", name);
    return 0;
}

/* This rank's streams (*s) and every rank's words gathered into *all,
 * (world, s->n, 4), when gather; else *all zeroed.  Caller frees *all. */
static int all_streams(job *j, streams *s, int gather, uint64_t **all)
{
    memset(s, 0, sizeof *s);
    int rc = ddp_model_visit_modules(j->model, add_stream, s);
    size_t per = (size_t)s->n * 4;
    uint64_t *mine = malloc(per * sizeof *mine + 1);
    *all = calloc((size_t)j->world * per + 1, sizeof **all);
    if (rc < 0 || !mine || !*all || j->world > MAX_RANKS) {
        free(mine);
        return rc < 0 ? rc : DDP_ERR_NOMEM;
    }
    for (int k = 0; k < s->n; k++)
        memcpy(mine + 4 * k, s->state[k], 4 * sizeof *mine);
    if (gather && j->pg)
        rc = ddp_pg_all_gather(j->pg, mine, *all, per, DDP_INT64);
    else if (gather)
        memcpy(*all, mine, per * sizeof *mine);
    free(mine);
    return rc;
}

/* The checkpoint entries over all (world, s->n, 4); names in names. */
static void stream_entries(const job *j, const streams *s, uint64_t *all,
                           ddp_checkpoint_rng *rngs, char (*names)[96])
{
    for (int r = 0; r < j->world; r++)
        for (int k = 0; k < s->n; k++) {
            int i = r * s->n + k;
            snprintf(names[i], 96, "rank%d.%s", r, s->name[k]);
            rngs[i] = (ddp_checkpoint_rng){names[i], all + 4 * (size_t)i, 4};
        }
}

static int save_checkpoint(job *j, int64_t epoch, int64_t step)
{
    ddp_train_state st = {.epoch = epoch, .step = step, .global_step = j->st.global_step,
                          .seed = j->a->seed, .world_size = j->world};
    streams s;
    uint64_t *all;
    int rc = all_streams(j, &s, 1, &all), n = j->world * s.n;
    ddp_checkpoint_rng *rngs = calloc((size_t)n + 1, sizeof *rngs);
    char (*names)[96] = calloc((size_t)n + 1, sizeof *names);
    if (rc == 0 && (!rngs || !names))
        rc = DDP_ERR_NOMEM;
    if (rc == 0 && j->rank == 0) {
        stream_entries(j, &s, all, rngs, names);
        ddp_checkpoint_options x = {.rngs = rngs, .nrngs = n};
        rc = ddp_checkpoint_save_ex(j->ckpt, j->model, j->opt, &st, &x);
    }
    free(rngs), free(names), free(all);
    return rc;
}

/* Every rank's samples over the slowest rank's time, printed by rank 0. */
static int report_throughput(job *j, size_t samples, double dt)
{
    int64_t n = (int64_t)samples;
    int rc;
    if (j->pg && ((rc = ddp_pg_all_reduce(j->pg, &n, 1, DDP_INT64, DDP_SUM)) < 0 ||
                  (rc = ddp_pg_all_reduce(j->pg, &dt, 1, DDP_FLOAT64, DDP_MAX)) < 0))
        return rc;
    if (j->rank == 0)
        printf("Throughput: %.0f samples/s\n", dt > 0 ? (double)n / dt : 0.0);
    return 0;
}

/* One epoch from batch `skip` on; *stop once --max-steps is reached. */
static int train_epoch(job *j, ddp_loader_t *dl, long epoch, size_t skip, size_t *samples,
                       int *stop)
{
    const args *a = j->a;
    size_t total = ddp_loader_length(dl);
    ddp_batch b;
    int rc = ddp_loader_epoch_begin(dl, (uint64_t)epoch);
    while (rc >= 0 && (rc = ddp_loader_next(dl, &b)) == 1) {
        if (b.index < skip)
            continue;
        if (a->max_steps >= 0 && j->st.global_step >= a->max_steps) {
            *stop = 1;
            return 0;
        }
        float loss;
        if ((rc = train_step(j, &b, &loss)) < 0)
            return rc;
        j->st.global_step++;
        *samples += b.size;
        if (j->rank == 0 && (b.index + 1) % 100 == 0)
            printf("Epoch [%ld/%ld], Step [%zu/%zu], Loss: %.4f\n", epoch + 1, a->epochs,
                   b.index + 1, total, loss);
        if (j->ckpt[0] && j->st.global_step % a->ckpt_every == 0 &&
            (rc = b.index + 1 == total ? save_checkpoint(j, epoch + 1, 0)
                                       : save_checkpoint(j, epoch, (int64_t)b.index + 1)) < 0)
            return rc;
    }
    return rc < 0 ? rc : 0;
}

int train(job *j, ddp_loader_t *dl)
{
    size_t samples = 0;
    int stop = 0, rc = 0;
    double t0 = ddp_time_now();
    for (long epoch = (long)j->st.epoch; epoch < j->a->epochs && !stop; epoch++) {
        size_t skip = epoch == j->st.epoch ? (size_t)j->st.step : 0; /* trained before */
        if ((rc = train_epoch(j, dl, epoch, skip, &samples, &stop)) < 0)
            return rc;
        if (!stop)
            ddp_lr_scheduler_step(j->sched); /* StepLR(step_size=1): once per epoch */
        fflush(stdout);
    }
    return report_throughput(j, samples, ddp_time_now() - t0);
}

/* Rank 0 loads: 1 loaded, 0 nothing to load, < 0 failed (printed). */
static int load_checkpoint(job *j, const streams *s, uint64_t *all)
{
    if (!j->ckpt[0] || !j->a->resume || j->rank != 0)
        return 0;
    int n = j->world * s->n, rc = DDP_ERR_NOMEM;
    ddp_checkpoint_rng *rngs = calloc((size_t)n + 1, sizeof *rngs);
    char (*names)[96] = calloc((size_t)n + 1, sizeof *names);
    if (rngs && names) {
        stream_entries(j, s, all, rngs, names);
        ddp_checkpoint_options x = {.rngs = rngs, .nrngs = n};
        rc = ddp_checkpoint_load_ex(j->ckpt, j->model, j->opt, &j->st, &x);
    }
    free(rngs), free(names);
    if (rc == DDP_ERR_NOT_FOUND) {
        printf("No checkpoint at %s yet: starting from the beginning\n", j->ckpt);
        return 0;
    }
    if (rc == 0 && j->st.world_size != j->world) {
        stop_error("%s was written by %d ranks; resume it with %d, not %d", j->ckpt,
                   j->st.world_size, j->st.world_size, j->world);
        return DDP_ERR_MISMATCH;
    }
    if (rc < 0) {
        stop_error("%s", ddp_last_error());
        return rc;
    }
    printf("Resuming from %s: epoch %lld, step %lld\n", j->ckpt, (long long)j->st.epoch + 1,
           (long long)j->st.step);
    return 1;
}

int resume(job *j)
{
    streams s;
    uint64_t *all;
    int loaded = all_streams(j, &s, 0, &all);
    if (loaded == 0)
        loaded = load_checkpoint(j, &s, all);
    int64_t v[5] = {loaded, j->st.epoch, j->st.step, j->st.global_step, ddp_optim_steps(j->opt)};
    int rc = j->pg ? ddp_pg_broadcast(j->pg, v, 5, DDP_INT64, 0) : 0;
    if (rc == 0 && v[0] < 0) {
        if (j->rank != 0)
            stop_error("rank %d: rank 0 could not load %s", j->rank, j->ckpt);
        free(all);
        return 2;
    }
    if (rc == 0 && v[0] > 0) { /* the parameters follow with DDP's broadcast */
        j->st.epoch = v[1], j->st.step = v[2], j->st.global_step = v[3];
        ddp_optim_set_steps(j->opt, v[4]);
        ddp_lr_scheduler_set_last_epoch(j->sched, j->st.epoch);
        size_t per = (size_t)s.n * 4; /* then each rank its own dropout streams */
        if (j->pg)
            rc = ddp_pg_broadcast(j->pg, all, (size_t)j->world * per, DDP_INT64, 0);
        for (int k = 0; rc == 0 && k < s.n; k++)
            memcpy(s.state[k], all + (size_t)j->rank * per + 4 * (size_t)k, 4 * sizeof *all);
    }
    free(all);
    for (int k = 0; j->pg && rc == 0 && v[0] > 0 && k < ddp_optim_num_states(j->opt); k++) {
        const char *name;
        float *data;
        size_t n;
        if ((rc = ddp_optim_state(j->opt, k, &name, &data, &n)) == 0)
            rc = ddp_pg_broadcast(j->pg, data, n, DDP_FLOAT32, 0);
    }
    if (rc < 0) {
        stop_error("rank %d: sharing the checkpoint %s failed: %s", j->rank, j->ckpt,
                   ddp_last_error());
        return 1;
    }
    return 0;
}
