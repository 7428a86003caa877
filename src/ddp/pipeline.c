/* Pipeline parallelism: options, the (replicas x stages) layout and its
 * subgroups, create and destroy.  The schedules are in pipeline_schedule.c,
 * the messages between stages in pipeline_comm.c; docs/pipeline.md. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "pg/internal.h"
#include "ddp/pipeline_internal.h"

ddp_pipeline_options ddp_pipeline_defaults(int stages, int micro_batches)
{
    ddp_pipeline_options o;
    memset(&o, 0, sizeof o);
    o.stages = stages;
    o.micro_batches = micro_batches;
    o.schedule = DDP_SCHEDULE_1F1B;
    return o;
}

static int check_options(const ddp_pipeline_options *o, int world_size)
{
    DDP_FAIL_IF(o->stages < 1, DDP_ERR_INVALID_ARG, "pipeline: stages %d (at least 1)", o->stages);
    DDP_FAIL_IF(world_size % o->stages, DDP_ERR_INVALID_ARG,
                "pipeline: world size %d is not a multiple of %d stages", world_size, o->stages);
    DDP_FAIL_IF(o->micro_batches < 1, DDP_ERR_INVALID_ARG,
                "pipeline: micro_batches %d (at least 1)", o->micro_batches);
    DDP_FAIL_IF(o->schedule != DDP_SCHEDULE_GPIPE && o->schedule != DDP_SCHEDULE_1F1B,
                DDP_ERR_INVALID_ARG, "pipeline: unknown schedule %d", (int)o->schedule);
    DDP_FAIL_IF(o->input_ndim < 0 || o->input_ndim > DDP_TENSOR_MAX_DIM - 1, DDP_ERR_INVALID_ARG,
                "pipeline: input_ndim %d (0 to %d)", o->input_ndim, DDP_TENSOR_MAX_DIM - 1);
    for (int i = 0; i < o->input_ndim; i++)
        DDP_FAIL_IF(o->input_shape[i] < 1, DDP_ERR_INVALID_ARG,
                    "pipeline: input_shape[%d] = %lld (must be > 0)", i,
                    (long long)o->input_shape[i]);
    return 0;
}

/* Every rank must run the same schedule: all-gather (stages, micro-batches,
 * schedule) and name the first rank that differs from rank 0. */
static int agree_options(ddp_pg_t *world, const ddp_pipeline_options *o)
{
    int n = ddp_pg_size(world);
    int64_t mine[3] = {o->stages, o->micro_batches, o->schedule};
    int64_t *all = calloc((size_t)n * 3, sizeof *all);
    DDP_FAIL_IF(!all, DDP_ERR_NOMEM, "out of memory");
    int rc = ddp_pg_all_gather(world, mine, all, 3, DDP_INT64);
    static const char *const names[3] = {"stages", "micro_batches", "schedule"};
    for (int r = 1; rc == 0 && r < n; r++)
        for (int k = 0; k < 3 && rc == 0; k++)
            if (all[r * 3 + k] != all[k])
                rc = DDP_ERROR(DDP_ERR_MISMATCH, "pipeline: rank %d has %s %lld, rank 0 has %lld",
                               r, names[k], (long long)all[r * 3 + k], (long long)all[k]);
    free(all);
    if (rc < 0)
        ddp__error_context(rc, "ddp_pipeline_create on rank %d", ddp_pg_rank(world));
    return rc;
}

/* The subgroups, made by every rank in the same order (ddp_pg_new_group's
 * rule): per replica and link, the activation then the gradient group;
 * then, with several replicas, one group per stage. */
static int make_groups(ddp_pipeline_t *pp)
{
    int S = pp->S, R = pp->R;
    for (int r = 0; r < R; r++)
        for (int l = 0; l + 1 < S; l++) {
            int pair[2] = {r * S + l, r * S + l + 1};
            ddp_pg_t *g[2] = {NULL, NULL};
            for (int d = 0; d < 2; d++) {
                int rc = ddp_pg_new_group(pp->world, pair, 2, &g[d]);
                if (rc < 0) { /* the first of the pair is stored nowhere yet */
                    ddp_destroy_process_group(g[0]);
                    return rc;
                }
            }
            if (pp->rank == pair[0]) {
                pp->act_out = g[0];
                pp->grad_in = g[1];
            } else if (pp->rank == pair[1]) {
                pp->act_in = g[0];
                pp->grad_out = g[1];
            }
        }
    if (R < 2)
        return 0;
    int *ranks = calloc((size_t)R, sizeof *ranks);
    DDP_FAIL_IF(!ranks, DDP_ERR_NOMEM, "out of memory");
    int rc = 0;
    for (int s = 0; s < S && rc == 0; s++) {
        for (int r = 0; r < R; r++)
            ranks[r] = r * S + s;
        ddp_pg_t *g = NULL;
        rc = ddp_pg_new_group(pp->world, ranks, R, &g);
        if (g)
            pp->replicas = g;
    }
    free(ranks);
    return rc;
}

/* Tapes: GPipe keeps every micro-batch's graph until the backwards, 1F1B
 * at most S - stage (its warm-up forwards plus the one in steady state). */
static int make_slots(ddp_pipeline_t *pp)
{
    int n = pp->M;
    if (pp->opt.schedule == DDP_SCHEDULE_1F1B && pp->S - pp->stage < n)
        n = pp->S - pp->stage;
    pp->slots = calloc((size_t)n, sizeof *pp->slots);
    DDP_FAIL_IF(!pp->slots, DDP_ERR_NOMEM, "out of memory");
    pp->nslots = n;
    for (int i = 0; i < n; i++) {
        pp->slots[i].mb = -1;
        DDP_TRY(ddp_tape_create(&pp->slots[i].tape));
    }
    return 0;
}

/* DDP's start: every replica of a stage begins from replica 0's values. */
static int broadcast_params(ddp_pipeline_t *pp)
{
    if (!pp->replicas)
        return 0;
    size_t n = 0;
    float *block = ddp_model_param_block(pp->model, &n);
    if (n == 0)
        return 0;
    int rc = ddp_pg_broadcast(pp->replicas, block, n, DDP_FLOAT32, 0);
    if (rc < 0)
        return ddp__error_context(rc, "pipeline stage %d: broadcasting its parameters from "
                                  "replica 0", pp->stage);
    ddp_model_bump_param_version(pp->model);
    return 0;
}

int ddp_pipeline_create(ddp_pg_t *world, ddp_model_t *model, const ddp_pipeline_options *opt,
                        ddp_pipeline_t **out)
{
    DDP_FAIL_IF(!world || !model || !opt || !out, DDP_ERR_INVALID_ARG,
                "ddp_pipeline_create: NULL argument");
    *out = NULL;
    int W = ddp_pg_size(world);
    DDP_TRY(check_options(opt, W));
    ddp_pipeline_t *pp = calloc(1, sizeof *pp);
    DDP_FAIL_IF(!pp, DDP_ERR_NOMEM, "out of memory");
    pp->world = world;
    pp->model = model;
    pp->opt = *opt;
    pp->rank = ddp_pg_rank(world);
    pp->S = opt->stages;
    pp->R = W / opt->stages;
    pp->M = opt->micro_batches;
    pp->stage = pp->rank % pp->S;
    pp->replica = pp->rank / pp->S;
    pp->prev_rank = pp->stage > 0 ? pp->rank - 1 : -1;
    pp->next_rank = pp->stage + 1 < pp->S ? pp->rank + 1 : -1;
    pp->in_numel = 1;
    for (int i = 0; i < opt->input_ndim; i++)
        pp->in_numel *= opt->input_shape[i];
    int rc = 0;
    DDP_FAIL_OUT(pp->stage > 0 && opt->input_ndim == 0, DDP_ERR_INVALID_ARG,
                 "pipeline stage %d: options.input_shape is required on every stage after "
                 "the first (the shape of one sample of the activation it receives)",
                 pp->stage);
    if (opt->input_ndim == 0)
        pp->in_numel = 0;
    DDP_TRY_OUT(ddp_model_seal(model));
    DDP_TRY_OUT(agree_options(world, opt));
    DDP_TRY_OUT(make_groups(pp));
    DDP_TRY_OUT(make_slots(pp));
    DDP_TRY_OUT(broadcast_params(pp));
    *out = pp;
out:
    if (rc < 0) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", ddp_last_error());
        ddp_pipeline_destroy(pp);
        ddp__error_restore(msg);
    }
    return rc;
}

void ddp__pp_abort(ddp_pipeline_t *pp, int rc)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ddp_last_error());
    pp->failed = 1;
    /* The peers of every other subgroup hear the cause, not just that this
     * rank left: a stage two hops from a dead one names it too. */
    ddp_pg_t *groups[5] = {pp->act_in, pp->grad_out, pp->act_out, pp->grad_in, pp->replicas};
    for (int i = 0; i < 5; i++)
        ddp__pg_abort(groups[i], rc, msg);
    ddp__error_restore(msg);
}

void ddp_pipeline_destroy(ddp_pipeline_t *pp)
{
    if (!pp)
        return;
    for (int i = 0; i < pp->nslots; i++) {
        ddp__pp_slot *s = &pp->slots[i];
        (void)ddp__pp_wait_sends(pp, s); /* after a failure: nothing left to report */
        ddp_tape_destroy(s->tape);
        free(s->in_buf);
    }
    free(pp->slots);
    free(pp->dy);
    ddp_destroy_process_group(pp->replicas);
    ddp_destroy_process_group(pp->act_in);
    ddp_destroy_process_group(pp->grad_out);
    ddp_destroy_process_group(pp->act_out);
    ddp_destroy_process_group(pp->grad_in);
    free(pp);
}

int ddp_pipeline_stage(const ddp_pipeline_t *pp) { return pp ? pp->stage : -1; }
int ddp_pipeline_replica(const ddp_pipeline_t *pp) { return pp ? pp->replica : -1; }
int ddp_pipeline_num_stages(const ddp_pipeline_t *pp) { return pp ? pp->S : 0; }
int ddp_pipeline_num_replicas(const ddp_pipeline_t *pp) { return pp ? pp->R : 0; }

void ddp_pipeline_times(const ddp_pipeline_t *pp, double *busy_s, double *idle_s)
{
    if (busy_s)
        *busy_s = pp ? pp->busy_s : 0;
    if (idle_s)
        *idle_s = pp ? pp->idle_s : 0;
}

void ddp_pipeline_reset_times(ddp_pipeline_t *pp)
{
    if (pp)
        pp->busy_s = pp->idle_s = 0;
}
