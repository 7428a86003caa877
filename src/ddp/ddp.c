/* DistributedDataParallel: a thin layer on the reducer (reducer.c), whose
 * regions are the model's parameters in registration order.  This file
 * holds the wrapper's construction: options, the reducer made with DDP's
 * words (its options line and parameter shapes for the agreement check,
 * "parameter" in messages), the model's gradients re-pointed into the
 * bucket memory at every layout (gradient_as_bucket_view), nn's hooks,
 * create and destroy, introspection (the other concerns: wrapper.h).
 *
 * The grad-ready hook of nn/ (include/ddp/ext.h) is the only point where
 * nn/ and pg/ meet, with the optional chunk hook (rule 7) for the tail-free
 * overlap of the last bucket.  What DDP adds to the reducer: the model (the
 * broadcast from rank 0 at create and after join, gradients as views),
 * nn's hooks, and the no_sync-step check on the model's parameter version;
 * per step it costs the reducer's costs and nothing more (no copies).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "base/timeline.h"
#include "ddp/buffers.h"
#include "ddp/wrapper.h"

ddp_data_parallel_options ddp_data_parallel_defaults(void)
{
    return (ddp_data_parallel_options){.bucket_cap_mb = 25.0,
                             .first_bucket_cap_mb = 1.0,
                             .find_unused_parameters = 0,
                             .rebuild_buckets = 1,
                             .comm_hook = DDP_HOOK_ALLREDUCE,
                             .tail_chunks = 0,
                             .tail_min_piece_mb = 1.0,
                             .reduce_scatter = 0,
                             .grad_pool_buffers = 2,
                             .broadcast_buffers = 1};
}

static ddp_reducer_options reducer_options(const ddp_data_parallel_options *o)
{
    ddp_reducer_options ro = ddp_reducer_defaults();
    ro.bucket_cap_mb = o->bucket_cap_mb;
    ro.first_bucket_cap_mb = o->first_bucket_cap_mb;
    ro.find_unused = o->find_unused_parameters;
    ro.rebuild_buckets = o->rebuild_buckets;
    ro.comm_hook = o->comm_hook;
    ro.mode = o->reduce_scatter ? DDP_REDUCER_SCATTER : DDP_REDUCER_ALLREDUCE;
    ro.pool_buffers = o->grad_pool_buffers;
    return ro;
}

static int check_options(const ddp_data_parallel_options *o)
{
    ddp_reducer_options ro = reducer_options(o);
    DDP_TRY(ddp__reducer_check_options(&ro, "DDP"));
    DDP_FAIL_IF(o->tail_chunks < 0 || o->tail_chunks > DDP_TAIL_CHUNKS_MAX, DDP_ERR_INVALID_ARG,
                "DDP: tail_chunks %d out of range (0 = off, at most %d)", o->tail_chunks,
                DDP_TAIL_CHUNKS_MAX);
    DDP_FAIL_IF(!(o->tail_min_piece_mb >= 0 && o->tail_min_piece_mb <= 1e6), DDP_ERR_INVALID_ARG,
                "DDP: tail_min_piece_mb %g out of range (0 to 1e6 MiB)", o->tail_min_piece_mb);
    return 0;
}

/* DDP_TAIL_CHUNKS, when set, overrides opts.tail_chunks (its range, 0 to
 * DDP_TAIL_CHUNKS_MAX, is checked by src/base/env.c's table). */
static int tail_chunks_from_env(ddp_data_parallel_options *o)
{
    int v = -1;
    DDP_TRY(ddp__env_int("DDP_TAIL_CHUNKS", &v));
    if (v >= 0)
        o->tail_chunks = v;
    return 0;
}

/* The reducer's relayout callback (create, rebuild): every parameter's
 * gradient becomes a view into its bucket (current values carried over by
 * ddp_param_set_grad), and the tail pieces follow the new layout. */
static int relayout(ddp_reducer_t *r, void *user)
{
    ddp_data_parallel_t *dm = user;
    if (r->opts.mode == DDP_REDUCER_SCATTER)
        return 0; /* gradients go to the pool, at each write (step.c) */
    for (int i = 0; i < dm->nparams; i++)
        DDP_TRY(ddp_param_set_grad(dm->params[i], ddp_reducer_grad(r, i)));
    return ddp__dp_plan_pieces(dm, r);
}

/* DDP's words for the reducer: its options line (what every rank must
 * share, as before the reducer existed) and "name (shape)" per parameter. */
static int make_reducer(ddp_data_parallel_t *dm, ddp_reducer_t **out)
{
    const ddp_data_parallel_options *o = &dm->opts;
    char line[512];
    snprintf(line, sizeof line,
             "bucket_cap_mb %g, first_bucket_cap_mb %g, find_unused_parameters %d, "
             "rebuild_buckets %d, reduce_scatter %d (pool %d), comm_hook %d, tail_chunks %d, "
             "tail_min_piece_mb %g",
             o->bucket_cap_mb, o->first_bucket_cap_mb, o->find_unused_parameters,
             o->rebuild_buckets, o->reduce_scatter, o->reduce_scatter ? o->grad_pool_buffers : 0,
             (int)o->comm_hook, o->tail_chunks, o->tail_min_piece_mb);
    size_t np = (size_t)dm->nparams + 1;
    ddp_grad_region *regs = calloc(np, sizeof *regs);
    char **entries = calloc(np, sizeof *entries);
    int rc = 0;
    DDP_FAIL_OUT(!regs || !entries, DDP_ERR_NOMEM, "DDP: out of memory");
    for (int i = 0; i < dm->nparams; i++) {
        const ddp_param *p = dm->params[i];
        char shape[128];
        ddp_tensor t = {.ndim = p->ndim};
        memcpy(t.shape, p->shape, sizeof t.shape);
        ddp_tensor_shape_str(&t, shape, sizeof shape);
        size_t len = strlen(p->name) + strlen(shape) + 2;
        entries[i] = malloc(len);
        DDP_FAIL_OUT(!entries[i], DDP_ERR_NOMEM, "DDP: out of memory");
        snprintf(entries[i], len, "%s %s", p->name, shape);
        regs[i] = (ddp_grad_region){.name = p->name, .grad = NULL, .count = p->numel};
    }
    ddp__reducer_words w = {
        .who = "DDP",
        .noun = "parameter",
        .options_desc = line,
        .entry_desc = (const char *const *)entries,
        .unused_hint = "pass find_unused_parameters=1 if the model does not use every "
                       "parameter in every iteration (PyTorch: \"Expected to have finished "
                       "reduction in the prior iteration\")"};
    ddp_reducer_options ro = reducer_options(o);
    rc = ddp__reducer_create(dm->pg, regs, dm->nparams, &ro, &w, relayout, dm, out);
out:
    for (int i = 0; entries && i < dm->nparams; i++)
        free(entries[i]);
    free(entries);
    free(regs);
    return rc;
}

/* reduce_scatter: until backward's write hook points them at their
 * bucket's pool buffer, the parameters' gradients view pool buffer 0 (each
 * at its place in its bucket: aliases, all zero now), so that a zero_grad
 * before the first backward touches no full-size block. */
static int point_grads_at_pool(ddp_data_parallel_t *dm)
{
    ddp_reducer_t *r = dm->red;
    for (int i = 0; i < dm->nparams; i++) {
        int b = r->layout.bucket_of[i];
        DDP_TRY(ddp_param_set_grad(dm->params[i], r->bufs[0] + (r->flat_offset[i] -
                                                                 r->bucket_flat[b])));
    }
    return 0;
}

int ddp_data_parallel_create(ddp_model_t *model, ddp_pg_t *pg,
                             const ddp_data_parallel_options *opts, ddp_data_parallel_t **out)
{
    DDP_FAIL_IF(!model || !pg || !out, DDP_ERR_INVALID_ARG,
                "ddp_data_parallel_create: NULL argument");
    *out = NULL;
    ddp_data_parallel_options o = opts ? *opts : ddp_data_parallel_defaults();
    DDP_TRY(tail_chunks_from_env(&o));
    DDP_TRY(check_options(&o));
    int rc = 0;
    ddp_data_parallel_t *dm = calloc(1, sizeof *dm);
    DDP_FAIL_OUT(!dm, DDP_ERR_NOMEM, "DDP: out of memory");
    dm->model = model;
    dm->pg = pg;
    dm->opts = o;
    dm->piece_param = -1;
    dm->nparams = (int)ddp_model_num_params(model);
    dm->params = calloc((size_t)dm->nparams + 1, sizeof *dm->params);
    DDP_FAIL_OUT(!dm->params, DDP_ERR_NOMEM, "DDP: out of memory");
    for (int i = 0; i < dm->nparams; i++)
        dm->params[i] = ddp_model_param(model, (size_t)i);
    uint64_t t0 = ddp__tl_begin();
    DDP_TRY_OUT(make_reducer(dm, &dm->red)); /* the agreement check, then the buckets */
    size_t n;
    float *block = ddp_model_param_block(model, &n);
    DDP_TRY_OUT(ddp_pg_broadcast(pg, block, n, DDP_FLOAT32, 0));
    DDP_TRY_OUT(ddp__check_buffers(pg, model)); /* modules' buffers: rank 0's everywhere */
    DDP_TRY_OUT(ddp__broadcast_buffers(pg, model));
    ddp_model_set_grad_ready_hook(model, ddp__dp_on_grad_ready, dm);
    if (o.reduce_scatter) {
        DDP_TRY_OUT(point_grads_at_pool(dm));
        ddp_model_set_grad_write_hook(model, ddp__dp_on_grad_write, dm);
    } else if (o.tail_chunks > 1)
        ddp_model_set_grad_chunk_hook(
            model, &(ddp_grad_chunk_hook){ddp__dp_on_chunk_plan, ddp__dp_on_chunk, dm});
    ddp__tl_end(t0, "DDP create", "buckets", ddp_reducer_num_buckets(dm->red));
    *out = dm;
    dm = NULL;
out:
    ddp_data_parallel_destroy(dm);
    return rc;
}

void ddp_data_parallel_destroy(ddp_data_parallel_t *dm)
{
    if (!dm)
        return;
    if (dm->red) {
        ddp__reducer_wait_buckets(dm->red, 0); /* only waits: nothing is finished twice */
        ddp_model_set_grad_block(dm->model, NULL); /* values copied out of the buckets */
        void *user;
        if (ddp_model_grad_ready_hook(dm->model, &user) == ddp__dp_on_grad_ready && user == dm)
            ddp_model_set_grad_ready_hook(dm->model, NULL, NULL);
        if (ddp_model_grad_write_hook(dm->model, &user) == ddp__dp_on_grad_write && user == dm)
            ddp_model_set_grad_write_hook(dm->model, NULL, NULL);
        const ddp_grad_chunk_hook *ch = ddp_model_grad_chunk_hook(dm->model);
        if (ch && ch->plan == ddp__dp_on_chunk_plan && ch->user == dm)
            ddp_model_set_grad_chunk_hook(dm->model, NULL);
    }
    ddp_reducer_destroy(dm->red);
    free(dm->params);
    free(dm);
    if (ddp_timeline_flush() < 0) /* a training program's natural end; exit writes it again */
        DDP_WARN("%s", ddp_last_error());
}

/* ==== settings, passed to the reducer ===================================== */

/* reduce_scatter has no no_sync: the refusal is reported by the next
 * forward or backward (this call returns nothing). */
void ddp_data_parallel_set_no_sync(ddp_data_parallel_t *dm, int no_sync)
{
    if (dm)
        dm->no_sync_refused = ddp_reducer_set_no_sync(dm->red, no_sync) < 0;
}

int ddp_data_parallel_shard_grad(ddp_data_parallel_t *dm, float **grad, size_t *begin,
                                 size_t *count)
{
    DDP_FAIL_IF(!dm, DDP_ERR_INVALID_ARG, "ddp_data_parallel_shard_grad: NULL module");
    return ddp_reducer_shard_grad(dm->red, grad, begin, count);
}

void ddp_data_parallel_zero_shard_grad(ddp_data_parallel_t *dm)
{
    if (dm && dm->opts.reduce_scatter)
        ddp_reducer_zero_grad(dm->red);
}

int ddp_data_parallel_register_comm_hook(ddp_data_parallel_t *dm, const ddp_comm_hook *hook)
{
    DDP_FAIL_IF(!dm, DDP_ERR_INVALID_ARG, "ddp_data_parallel_register_comm_hook: NULL module");
    return ddp_reducer_register_comm_hook(dm->red, hook);
}

int ddp_data_parallel_join_enable(ddp_data_parallel_t *dm, int enable,
                                  int throw_on_early_termination)
{
    DDP_FAIL_IF(!dm, DDP_ERR_INVALID_ARG, "ddp_data_parallel_join_enable: NULL module");
    return ddp_reducer_join_enable(dm->red, enable, throw_on_early_termination);
}

/* The reducer's join, then the model of the last rank to train goes to all. */
int ddp_data_parallel_join(ddp_data_parallel_t *dm)
{
    DDP_FAIL_IF(!dm, DDP_ERR_STATE, "ddp_data_parallel_join: NULL module");
    size_t n;
    float *block = ddp_model_param_block(dm->model, &n);
    return ddp_reducer_join(dm->red, block, n);
}

int ddp_data_parallel_num_buckets(const ddp_data_parallel_t *dm)
{
    return dm ? ddp_reducer_num_buckets(dm->red) : 0;
}

int ddp_data_parallel_bucket_info(const ddp_data_parallel_t *dm, int b, int *nparams, size_t *numel)
{
    DDP_FAIL_IF(!dm, DDP_ERR_INVALID_ARG, "ddp_data_parallel_bucket_info: NULL module");
    return ddp_reducer_bucket_info(dm->red, b, nparams, numel);
}

int ddp_data_parallel_buckets_rebuilt(const ddp_data_parallel_t *dm)
{
    return dm ? ddp_reducer_buckets_rebuilt(dm->red) : 0;
}

ddp_reducer_t *ddp_data_parallel_reducer(ddp_data_parallel_t *dm) { return dm ? dm->red : NULL; }
