/* DistributedDataParallel: gradient buckets reduced during backward.  This
 * file holds the wrapper's state and construction: options, create and
 * destroy, the bucket layout and its one-time rebuild (the other concerns:
 * wrapper.h).
 *
 * The design follows PyTorch's Reducer (torch/csrc/distributed/c10d/
 * reducer.cpp): buckets in reverse registration order, a small first bucket,
 * one rebuild from the observed ready order, gradients as views into bucket
 * memory, buckets launched strictly in order.  The grad-ready hook of nn/
 * (include/ddp/nn.h) is the only point where nn/ and pg/ meet, with the
 * optional chunk hook (rule 7) for the tail-free overlap of the last bucket.
 *
 * Per synchronised iteration, for a model of P floats in B buckets:
 *   - B all-reduces, P floats in all (4P bytes; 2P with the fp16/bf16
 *     hooks), the first launched as soon as the last layer's gradients are
 *     final, the last one reduced on the caller's thread after backward; with
 *     tail_chunks, the last bucket goes as K pieces (B + K - 1 all-reduces),
 *     launched while its last gradient is computed;
 *   - no copies: the model's p->grad points into the bucket memory.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/env.h"
#include "base/error.h"
#include "base/host.h"
#include "base/log.h"
#include "base/sha256.h"
#include "base/timeline.h"
#include "ddp/buffers.h"
#include "ddp/wrapper.h"
#include "pg/internal.h"

_Static_assert(sizeof(int) == 4, "bucket orders travel as DDP_INT32");

ddp_data_parallel_options ddp_data_parallel_defaults(void)
{
    return (ddp_data_parallel_options){.bucket_cap_mb = 25.0,
                             .first_bucket_cap_mb = 1.0,
                             .find_unused_parameters = 0,
                             .rebuild_buckets = 1,
                             .comm_hook = DDP_HOOK_ALLREDUCE,
                             .tail_chunks = 0,
                             .tail_min_piece_mb = 1.0,
                             .broadcast_buffers = 1};
}

/* ==== buckets ============================================================= */

/* Lays the gradients out as `order` says, moving current gradients along.
 * Collective (the buckets are symmetric memory): every rank calls it at the
 * same point, as create and rebuild_buckets do (all ranks hold the same
 * order before the rebuild, so they decide alike). */
static int apply_layout(ddp_data_parallel_t *dm, const int *order)
{
    ddp__bucket_layout l;
    size_t first = (size_t)(dm->opts.first_bucket_cap_mb * DDP_MIB);
    size_t cap = (size_t)(dm->opts.bucket_cap_mb * DDP_MIB);
    DDP_TRY(ddp__bucket_layout_build(dm->numel, dm->nparams, order, first, cap, sizeof(float),
                                     &l));
    /* The buckets live in the group's symmetric memory: on one host the
     * all-reduce then reads the peers' buckets in place (pg.h). */
    void *block = NULL;
    int rc = ddp_pg_symmetric_alloc(dm->pg, (l.total_numel ? l.total_numel : 1) * sizeof(float),
                                    &block);
    float *grads = block;
    ddp_work_t **works = calloc((size_t)l.nbuckets + 1, sizeof *works);
    unsigned char *launched = calloc((size_t)l.nbuckets + 1, 1);
    ddp__bucket_tracker tr = {0};
    if (rc < 0)
        goto out;
    DDP_FAIL_OUT(!works || !launched, DDP_ERR_NOMEM, "DDP: out of memory for %d buckets",
                 l.nbuckets);
    for (int i = 0; i < dm->nparams; i++)
        DDP_TRY_OUT(ddp_param_set_grad(dm->params[i], grads + l.offset[i]));
    ddp__bucket_layout_free(&dm->layout);
    ddp__bucket_tracker_free(&dm->tracker);
    ddp_pg_symmetric_free(dm->pg, dm->grads);
    free(dm->works);
    free(dm->launched);
    memcpy(dm->order, order, (size_t)dm->nparams * sizeof *order);
    dm->layout = l;
    dm->grads = grads;
    dm->works = works;
    dm->launched = launched;
    grads = NULL;
    works = NULL;
    launched = NULL;
    rc = ddp__bucket_tracker_init(&tr, &dm->layout);
    dm->tracker = tr;
    if (rc == 0)
        rc = ddp__dp_plan_pieces(dm);
    return rc;
out:
    for (int i = 0; i < dm->nparams && dm->grads; i++)
        ddp_param_set_grad(dm->params[i], dm->grads + dm->layout.offset[i]);
    ddp__bucket_layout_free(&l);
    ddp_pg_symmetric_free(dm->pg, grads);
    free(works);
    free(launched);
    return rc;
}

/* PyTorch rebuilds once, and not when unused parameters are searched for
 * (the ready order then changes from one iteration to the next). */
int ddp__dp_rebuild_due(const ddp_data_parallel_t *dm)
{
    return dm->opts.rebuild_buckets && !dm->opts.find_unused_parameters && !dm->rebuilt;
}

/* Rebuilds the buckets once, from the order gradients became ready on rank
 * 0 (used parameters in ready order, then the rest in reverse registration
 * order); every rank adopts rank 0's order. */
int ddp__dp_rebuild_buckets(ddp_data_parallel_t *dm)
{
    int *order = malloc((size_t)dm->nparams * sizeof *order + 1);
    unsigned char *seen = calloc((size_t)dm->nparams + 1, 1);
    int rc = 0, n = 0;
    DDP_FAIL_OUT(!order || !seen, DDP_ERR_NOMEM, "DDP: out of memory");
    uint64_t t0 = ddp__tl_begin();
    for (int i = 0; i < dm->nready; i++)
        if (!seen[dm->ready_order[i]]) {
            seen[dm->ready_order[i]] = 1;
            order[n++] = dm->ready_order[i];
        }
    for (int i = dm->nparams - 1; i >= 0; i--)
        if (!seen[i])
            order[n++] = i;
    DDP_TRY_OUT(ddp_pg_broadcast(dm->pg, order, (size_t)dm->nparams, DDP_INT32, 0));
    if (memcmp(order, dm->order, (size_t)dm->nparams * sizeof *order) != 0)
        DDP_TRY_OUT(apply_layout(dm, order));
    dm->rebuilt = 1;
    ddp__tl_end(t0, "rebuild buckets", "buckets", dm->layout.nbuckets);
out:
    free(order);
    free(seen);
    return rc;
}

/* ==== life cycle ========================================================== */

void ddp_data_parallel_set_no_sync(ddp_data_parallel_t *dm, int no_sync)
{
    if (dm)
        dm->no_sync = no_sync != 0;
}

int ddp_data_parallel_register_comm_hook(ddp_data_parallel_t *dm, const ddp_comm_hook *hook)
{
    DDP_FAIL_IF(!dm, DDP_ERR_INVALID_ARG, "ddp_data_parallel_register_comm_hook: NULL module");
    DDP_FAIL_IF(hook && !hook->launch, DDP_ERR_INVALID_ARG,
                "ddp_data_parallel_register_comm_hook: hook has no launch function");
    dm->has_user_hook = hook != NULL;
    if (hook)
        dm->user_hook = *hook;
    return 0;
}

static int check_options(const ddp_data_parallel_options *o)
{
    DDP_FAIL_IF(!(o->bucket_cap_mb > 0 && o->bucket_cap_mb <= 1e6) ||
                    !(o->first_bucket_cap_mb > 0 && o->first_bucket_cap_mb <= 1e6),
                DDP_ERR_INVALID_ARG,
                "DDP: bucket caps must be > 0 MiB and <= 1e6 MiB (bucket_cap_mb %g, "
                "first_bucket_cap_mb %g)",
                o->bucket_cap_mb, o->first_bucket_cap_mb);
    DDP_FAIL_IF(o->comm_hook < DDP_HOOK_ALLREDUCE || o->comm_hook > DDP_HOOK_BF16,
                DDP_ERR_INVALID_ARG, "DDP: unknown comm_hook %d", (int)o->comm_hook);
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

/* Timeline (base/timeline.h): this rank's clock's offset to rank 0's.
 * Ranks of one host share CLOCK_MONOTONIC: offset 0.  Across hosts it is
 * estimated from the moment each rank leaves a barrier, good to about one
 * network latency.  Collective: with the timeline on, every rank runs it
 * (the agreement check refuses a group where some rank has it off). */
static int timeline_clock(ddp_data_parallel_t *dm)
{
    int size = ddp_pg_size(dm->pg), rc = 0;
    char host[1024];
    uint8_t h[DDP__SHA256_LEN];
    int64_t mine[2], *all = calloc(2 * (size_t)size, sizeof *all);
    DDP_FAIL_OUT(!all, DDP_ERR_NOMEM, "DDP: out of memory");
    DDP_TRY_OUT(ddp__host_id(host, sizeof host));
    ddp__sha256(host, strlen(host), h);
    memcpy(&mine[1], h, sizeof mine[1]);
    DDP_TRY_OUT(ddp_pg_barrier(dm->pg));
    mine[0] = (int64_t)ddp__tl_clock_ns();
    DDP_TRY_OUT(ddp_pg_all_gather(dm->pg, mine, all, 2, DDP_INT64));
    ddp__tl_set_rank(ddp_pg_rank(dm->pg), all[1] == mine[1] ? 0 : mine[0] - all[0]);
out:
    free(all);
    return rc;
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
    int *order = NULL;
    ddp_data_parallel_t *dm = calloc(1, sizeof *dm);
    DDP_FAIL_OUT(!dm, DDP_ERR_NOMEM, "DDP: out of memory");
    dm->model = model;
    dm->pg = pg;
    ddp__pg_retain(pg); /* the group outlives the wrapper, whatever the teardown order */
    dm->opts = o;
    DDP_TRY_OUT(ddp__env_bool("DDP_NO_DEFER", &dm->no_defer));
    dm->nparams = (int)ddp_model_num_params(model);
    size_t np = (size_t)dm->nparams + 1;
    dm->params = calloc(np, sizeof *dm->params);
    dm->numel = calloc(np, sizeof *dm->numel);
    dm->ready_order = calloc(np, sizeof *dm->ready_order);
    dm->order = calloc(np, sizeof *dm->order);
    order = calloc(np, sizeof *order);
    DDP_FAIL_OUT(!dm->params || !dm->numel || !dm->ready_order || !dm->order || !order,
                 DDP_ERR_NOMEM, "DDP: out of memory");
    for (int i = 0; i < dm->nparams; i++) {
        dm->params[i] = ddp_model_param(model, (size_t)i);
        dm->numel[i] = dm->params[i]->numel;
        order[i] = dm->nparams - 1 - i;
    }
    uint64_t t0 = ddp__tl_begin();
    DDP_TRY_OUT(ddp__dp_check_same_params(dm));
    if (t0)
        DDP_TRY_OUT(timeline_clock(dm));
    size_t n;
    float *block = ddp_model_param_block(model, &n);
    DDP_TRY_OUT(ddp_pg_broadcast(pg, block, n, DDP_FLOAT32, 0));
    DDP_TRY_OUT(ddp__check_buffers(pg, model));
    DDP_TRY_OUT(ddp__broadcast_buffers(pg, model));
    DDP_TRY_OUT(apply_layout(dm, order));
    if (o.comm_hook != DDP_HOOK_ALLREDUCE) {
        dm->half = ddp__alloc_aligned((dm->layout.total_numel + 1) * sizeof *dm->half);
        DDP_FAIL_OUT(!dm->half, DDP_ERR_NOMEM, "DDP: out of memory for the compression buffer");
    }
    ddp_model_set_grad_ready_hook(model, ddp__dp_on_grad_ready, dm);
    if (o.tail_chunks > 1)
        ddp_model_set_grad_chunk_hook(
            model, &(ddp_grad_chunk_hook){ddp__dp_on_chunk_plan, ddp__dp_on_chunk, dm});
    ddp__dp_debug_layout(dm);
    ddp__tl_end(t0, "DDP create", "buckets", dm->layout.nbuckets);
    *out = dm;
    dm = NULL;
out:
    free(order);
    ddp_data_parallel_destroy(dm);
    return rc;
}

void ddp_data_parallel_destroy(ddp_data_parallel_t *dm)
{
    if (!dm)
        return;
    if (dm->launched)
        ddp__dp_wait_buckets(dm, 0); /* only waits: nothing is finished twice */
    if (dm->grads) {
        ddp_model_set_grad_block(dm->model, NULL);
        void *user;
        if (ddp_model_grad_ready_hook(dm->model, &user) == ddp__dp_on_grad_ready && user == dm)
            ddp_model_set_grad_ready_hook(dm->model, NULL, NULL);
        const ddp_grad_chunk_hook *ch = ddp_model_grad_chunk_hook(dm->model);
        if (ch && ch->plan == ddp__dp_on_chunk_plan && ch->user == dm)
            ddp_model_set_grad_chunk_hook(dm->model, NULL);
    }
    ddp__bucket_tracker_free(&dm->tracker);
    ddp__bucket_layout_free(&dm->layout);
    ddp_pg_symmetric_free(dm->pg, dm->grads);
    ddp__free_aligned(dm->half);
    free(dm->works);
    free(dm->launched);
    free(dm->piece_end);
    free(dm->piece_works);
    free(dm->params);
    free(dm->numel);
    free(dm->ready_order);
    free(dm->debug_last);
    free(dm->order);
    free(dm->tl_launch);
    ddp__pg_release(dm->pg); /* last: the bucket memory above is the group's */
    free(dm);
    if (ddp_timeline_flush() < 0) /* a training program's natural end; exit writes it again */
        DDP_WARN("%s", ddp_last_error());
}

int ddp_data_parallel_num_buckets(const ddp_data_parallel_t *dm) { return dm ? dm->layout.nbuckets : 0; }

int ddp_data_parallel_bucket_info(const ddp_data_parallel_t *dm, int b, int *nparams, size_t *numel)
{
    DDP_FAIL_IF(!dm || b < 0 || b >= dm->layout.nbuckets, DDP_ERR_INVALID_ARG,
                "ddp_data_parallel_bucket_info: bucket %d out of range", b);
    if (nparams)
        *nparams = dm->layout.bucket_nparams[b];
    if (numel)
        *numel = dm->layout.bucket_numel[b];
    return 0;
}

int ddp_data_parallel_buckets_rebuilt(const ddp_data_parallel_t *dm) { return dm ? dm->rebuilt : 0; }
