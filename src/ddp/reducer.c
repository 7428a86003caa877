/* The reducer: DDP's gradient engine over named gradient regions
 * (include/ddp/reducer.h).  This file holds its state and construction:
 * options, regions, create and destroy, the bucket layout and its one-time
 * rebuild, introspection (the other concerns: reducer_impl.h).
 *
 * The design follows PyTorch's Reducer (torch/csrc/distributed/c10d/
 * reducer.cpp), which works on a list of gradient tensors and knows nothing
 * of modules: buckets in reverse order, a small first bucket, one rebuild
 * from the observed ready order, gradients as views into bucket memory,
 * buckets launched strictly in order.  DistributedDataParallel (ddp.c) is
 * a thin layer on it: its regions are the model's parameters.
 *
 * Per synchronised iteration, for P floats in B buckets (all-reduce mode):
 *   - B all-reduces, P floats in all (4P bytes; 2P with the fp16/bf16
 *     hooks), the first launched as soon as its last region is ready, the
 *     last reduced on the caller's thread in wait;
 *   - no copies for reducer-owned regions (they live in the bucket memory);
 *     one copy in and one out for each caller-owned float.
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
#include "ddp/flat_shard.h"
#include "ddp/reducer_impl.h"
#include "pg/internal.h"

_Static_assert(sizeof(int) == 4, "bucket orders travel as DDP_INT32");

ddp_reducer_options ddp_reducer_defaults(void)
{
    return (ddp_reducer_options){.bucket_cap_mb = 25.0,
                                 .first_bucket_cap_mb = 1.0,
                                 .find_unused = 0,
                                 .rebuild_buckets = 1,
                                 .comm_hook = DDP_HOOK_ALLREDUCE,
                                 .mode = DDP_REDUCER_ALLREDUCE,
                                 .pool_buffers = 2};
}

int ddp__reducer_check_options(const ddp_reducer_options *o, const char *who)
{
    DDP_FAIL_IF(!(o->bucket_cap_mb > 0 && o->bucket_cap_mb <= 1e6) ||
                    !(o->first_bucket_cap_mb > 0 && o->first_bucket_cap_mb <= 1e6),
                DDP_ERR_INVALID_ARG,
                "%s: bucket caps must be > 0 MiB and <= 1e6 MiB (bucket_cap_mb %g, "
                "first_bucket_cap_mb %g)",
                who, o->bucket_cap_mb, o->first_bucket_cap_mb);
    DDP_FAIL_IF(o->comm_hook < DDP_HOOK_ALLREDUCE || o->comm_hook > DDP_HOOK_BF16,
                DDP_ERR_INVALID_ARG, "%s: unknown comm_hook %d", who, (int)o->comm_hook);
    DDP_FAIL_IF(o->mode != DDP_REDUCER_ALLREDUCE && o->mode != DDP_REDUCER_SCATTER,
                DDP_ERR_INVALID_ARG, "%s: unknown mode %d", who, (int)o->mode);
    DDP_FAIL_IF(o->mode == DDP_REDUCER_SCATTER && o->comm_hook != DDP_HOOK_ALLREDUCE,
                DDP_ERR_INVALID_ARG,
                "%s: comm_hook %d is for the all-reduce mode; reduce-scatter mode averages "
                "in float32",
                who, (int)o->comm_hook);
    DDP_FAIL_IF(o->mode == DDP_REDUCER_SCATTER && (o->pool_buffers < 1 || o->pool_buffers > 64),
                DDP_ERR_INVALID_ARG, "%s: pool_buffers %d out of range (1 to 64)", who,
                o->pool_buffers);
    return 0;
}

/* ==== buckets ============================================================= */

/* Lays the buckets out as `order` says, moving reducer-owned gradients
 * along.  Collective (the buckets are symmetric memory): every rank calls it
 * at the same point, as create and the rebuild do.  Scatter mode keeps no
 * bucket memory (reducer_scatter.c has the pool). */
static int apply_layout(ddp_reducer_t *r, const int *order)
{
    ddp__bucket_layout l;
    size_t first = (size_t)(r->opts.first_bucket_cap_mb * DDP_MIB);
    size_t cap = (size_t)(r->opts.bucket_cap_mb * DDP_MIB);
    DDP_TRY(ddp__bucket_layout_build(r->numel, r->nregions, order, first, cap, sizeof(float), &l));
    int scatter = r->opts.mode == DDP_REDUCER_SCATTER;
    /* The buckets live in the group's symmetric memory: on one host the
     * all-reduce then reads the peers' buckets in place (pg.h). */
    void *block = NULL;
    int rc = scatter ? 0
                     : ddp_pg_symmetric_alloc(r->pg,
                                              (l.total_numel ? l.total_numel : 1) * sizeof(float),
                                              &block);
    float *grads = block;
    ddp_work_t **works = calloc((size_t)l.nbuckets + 1, sizeof *works);
    unsigned char *launched = calloc((size_t)l.nbuckets + 1, 1);
    if (rc < 0)
        goto out;
    DDP_FAIL_OUT(!works || !launched, DDP_ERR_NOMEM, "%s: out of memory for %d buckets", r->who,
                 l.nbuckets);
    for (int i = 0; i < r->nregions && grads; i++) {
        float *to = grads + l.offset[i];
        if (r->grads)
            memcpy(to, r->grads + r->layout.offset[i], r->numel[i] * sizeof *to);
        else
            memset(to, 0, r->numel[i] * sizeof *to);
    }
    /* Swap the new layout in, let the owner re-point its views (reading
     * the old memory, still alive), then free the old. */
    ddp__bucket_layout old_l = r->layout;
    float *old_grads = r->grads;
    ddp__bucket_tracker_free(&r->tracker);
    free(r->works);
    free(r->launched);
    memcpy(r->order, order, (size_t)r->nregions * sizeof *order);
    r->layout = l;
    r->grads = grads;
    r->works = works;
    r->launched = launched;
    rc = ddp__bucket_tracker_init(&r->tracker, &r->layout);
    if (rc == 0 && r->relayout)
        rc = r->relayout(r, r->relayout_user);
    ddp__bucket_layout_free(&old_l);
    ddp_pg_symmetric_free(r->pg, old_grads);
    return rc;
out:
    ddp__bucket_layout_free(&l);
    ddp_pg_symmetric_free(r->pg, grads);
    free(works);
    free(launched);
    return rc;
}

int ddp__reducer_rebuild_due(const ddp_reducer_t *r)
{
    return r->opts.rebuild_buckets && !r->opts.find_unused && !r->rebuilt &&
           r->opts.mode == DDP_REDUCER_ALLREDUCE;
}

/* Rebuilds the buckets once, from the order regions became ready on rank 0
 * (ready ones in ready order, then the rest in reverse order); every rank
 * adopts rank 0's order. */
int ddp__reducer_rebuild_buckets(ddp_reducer_t *r)
{
    int *order = malloc((size_t)r->nregions * sizeof *order + 1);
    unsigned char *seen = calloc((size_t)r->nregions + 1, 1);
    int rc = 0, n = 0;
    DDP_FAIL_OUT(!order || !seen, DDP_ERR_NOMEM, "%s: out of memory", r->who);
    uint64_t t0 = ddp__tl_begin();
    for (int i = 0; i < r->nready; i++)
        if (!seen[r->ready_order[i]]) {
            seen[r->ready_order[i]] = 1;
            order[n++] = r->ready_order[i];
        }
    for (int i = r->nregions - 1; i >= 0; i--)
        if (!seen[i])
            order[n++] = i;
    DDP_TRY_OUT(ddp_pg_broadcast(r->pg, order, (size_t)r->nregions, DDP_INT32, 0));
    if (memcmp(order, r->order, (size_t)r->nregions * sizeof *order) != 0)
        DDP_TRY_OUT(apply_layout(r, order));
    r->rebuilt = 1;
    ddp__tl_end(t0, "rebuild buckets", "buckets", r->layout.nbuckets);
out:
    free(order);
    free(seen);
    return rc;
}

/* ==== life cycle ========================================================== */

/* Timeline (base/timeline.h): this rank's clock's offset to rank 0's.
 * Ranks of one host share CLOCK_MONOTONIC: offset 0.  Across hosts it is
 * estimated from the moment each rank leaves a barrier, good to about one
 * network latency.  Collective: with the timeline on, every rank runs it
 * (the agreement check refuses a group where some rank has it off). */
static int timeline_clock(ddp_reducer_t *r)
{
    int size = ddp_pg_size(r->pg), rc = 0;
    char host[1024];
    uint8_t h[DDP__SHA256_LEN];
    int64_t mine[2], *all = calloc(2 * (size_t)size, sizeof *all);
    DDP_FAIL_OUT(!all, DDP_ERR_NOMEM, "%s: out of memory", r->who);
    DDP_TRY_OUT(ddp__host_id(host, sizeof host));
    ddp__sha256(host, strlen(host), h);
    memcpy(&mine[1], h, sizeof mine[1]);
    DDP_TRY_OUT(ddp_pg_barrier(r->pg));
    mine[0] = (int64_t)ddp__tl_clock_ns();
    DDP_TRY_OUT(ddp_pg_all_gather(r->pg, mine, all, 2, DDP_INT64));
    ddp__tl_set_rank(ddp_pg_rank(r->pg), all[1] == mine[1] ? 0 : mine[0] - all[0]);
out:
    free(all);
    return rc;
}

static char *dup_str(const char *s) { return s ? strdup(s) : NULL; }

/* The public reducer's options line (DDP writes its own). */
static void default_options_desc(const ddp_reducer_options *o, char *buf, size_t len)
{
    snprintf(buf, len,
             "bucket_cap_mb %g, first_bucket_cap_mb %g, find_unused %d, rebuild_buckets %d, "
             "comm_hook %d, mode %d, pool_buffers %d",
             o->bucket_cap_mb, o->first_bucket_cap_mb, o->find_unused, o->rebuild_buckets,
             (int)o->comm_hook, (int)o->mode, o->mode == DDP_REDUCER_SCATTER ? o->pool_buffers : 0);
}

static int copy_regions(ddp_reducer_t *r, const ddp_grad_region *regions,
                        const ddp__reducer_words *w)
{
    size_t np = (size_t)r->nregions + 1;
    r->names = calloc(np, sizeof *r->names);
    r->numel = calloc(np, sizeof *r->numel);
    r->user_grad = calloc(np, sizeof *r->user_grad);
    r->flat_offset = calloc(np, sizeof *r->flat_offset);
    r->ready_order = calloc(np, sizeof *r->ready_order);
    r->order = calloc(np, sizeof *r->order);
    if (w && w->entry_desc)
        r->entry_desc = calloc(np, sizeof *r->entry_desc);
    DDP_FAIL_IF(!r->names || !r->numel || !r->user_grad || !r->flat_offset || !r->ready_order ||
                    !r->order || (w && w->entry_desc && !r->entry_desc),
                DDP_ERR_NOMEM, "%s: out of memory", r->who);
    for (int i = 0; i < r->nregions; i++) {
        const ddp_grad_region *g = &regions[i];
        DDP_FAIL_IF(!g->name || !g->name[0], DDP_ERR_INVALID_ARG, "%s: %s %d has no name",
                    r->who, r->noun, i);
        DDP_FAIL_IF(!(r->names[i] = strdup(g->name)), DDP_ERR_NOMEM, "%s: out of memory",
                    r->who);
        if (r->entry_desc)
            DDP_FAIL_IF(!(r->entry_desc[i] = strdup(w->entry_desc[i])), DDP_ERR_NOMEM,
                        "%s: out of memory", r->who);
        /* The pool hands out its own buffers: memory of the caller's would
         * never be read (a silent zero gradient). */
        DDP_FAIL_IF(g->grad && r->opts.mode == DDP_REDUCER_SCATTER, DDP_ERR_INVALID_ARG,
                    "%s: %s '%s' brings its own gradient memory; reduce-scatter mode writes "
                    "gradients into its pool only (give grad NULL and write through "
                    "ddp_reducer_grad_buffer)",
                    r->who, r->noun, g->name);
        r->numel[i] = g->count;
        r->user_grad[i] = g->grad;
        r->ncopied += g->grad != NULL;
        r->flat_offset[i] = r->total;
        r->total += g->count;
        r->order[i] = r->nregions - 1 - i;
    }
    return 0;
}

int ddp__reducer_create(ddp_pg_t *pg, const ddp_grad_region *regions, int nregions,
                        const ddp_reducer_options *opts, const ddp__reducer_words *w,
                        ddp__reducer_relayout_fn relayout, void *relayout_user,
                        ddp_reducer_t **out)
{
    DDP_FAIL_IF(!pg || !out || nregions < 0 || (nregions && !regions), DDP_ERR_INVALID_ARG,
                "ddp_reducer_create: NULL argument or bad region count %d", nregions);
    *out = NULL;
    ddp_reducer_options o = opts ? *opts : ddp_reducer_defaults();
    const char *who = w && w->who ? w->who : "reducer";
    DDP_TRY(ddp__reducer_check_options(&o, who));
    int rc = 0;
    int *order = NULL;
    ddp_reducer_t *r = calloc(1, sizeof *r);
    DDP_FAIL_OUT(!r, DDP_ERR_NOMEM, "%s: out of memory", who);
    r->pg = pg;
    ddp__pg_retain(pg); /* the group outlives the reducer, whatever the teardown order */
    r->opts = o;
    r->nregions = nregions;
    snprintf(r->who, sizeof r->who, "%s", who);
    snprintf(r->noun, sizeof r->noun, "%s", w && w->noun ? w->noun : "region");
    char line[512];
    default_options_desc(&o, line, sizeof line);
    r->options_desc = dup_str(w && w->options_desc ? w->options_desc : line);
    r->unused_hint = dup_str(w && w->unused_hint ? w->unused_hint
                                                 : "pass find_unused=1 if the program does not "
                                                   "mark every region in every iteration");
    DDP_FAIL_OUT(!r->options_desc || !r->unused_hint, DDP_ERR_NOMEM, "%s: out of memory", who);
    DDP_TRY_OUT(ddp__env_bool("DDP_NO_DEFER", &r->no_defer));
    DDP_TRY_OUT(copy_regions(r, regions, w));
    order = malloc(((size_t)nregions + 1) * sizeof *order);
    DDP_FAIL_OUT(!order, DDP_ERR_NOMEM, "%s: out of memory", who);
    memcpy(order, r->order, (size_t)nregions * sizeof *order);
    uint64_t t0 = ddp__tl_begin();
    DDP_TRY_OUT(ddp__reducer_check_same(r));
    if (t0)
        DDP_TRY_OUT(timeline_clock(r));
    if (o.comm_hook != DDP_HOOK_ALLREDUCE) {
        r->half = ddp__alloc_aligned((r->total + 1) * sizeof *r->half);
        DDP_FAIL_OUT(!r->half, DDP_ERR_NOMEM, "%s: out of memory for the compression buffer",
                     who);
    }
    r->relayout = relayout;
    r->relayout_user = relayout_user;
    r->untouched = w && w->untouched_pool;
    DDP_TRY_OUT(apply_layout(r, order));
    if (o.mode == DDP_REDUCER_SCATTER)
        DDP_TRY_OUT(ddp__scatter_init(r));
    ddp__reducer_debug_layout(r);
    if (!w || !w->who) /* DDP records its own "DDP create" */
        ddp__tl_end(t0, "reducer create", "buckets", r->layout.nbuckets);
    *out = r;
    r = NULL;
out:
    free(order);
    if (r)
        r->relayout = NULL; /* a failed create calls nobody back */
    ddp_reducer_destroy(r);
    return rc;
}

int ddp_reducer_create(ddp_pg_t *pg, const ddp_grad_region *regions, int nregions,
                       const ddp_reducer_options *opts, ddp_reducer_t **out)
{
    return ddp__reducer_create(pg, regions, nregions, opts, NULL, NULL, NULL, out);
}

void ddp_reducer_destroy(ddp_reducer_t *r)
{
    if (!r)
        return;
    if (r->launched)
        ddp__reducer_wait_buckets(r, 0); /* only waits: nothing is finished twice */
    ddp__scatter_free(r);
    ddp__bucket_tracker_free(&r->tracker);
    ddp__bucket_layout_free(&r->layout);
    ddp_pg_symmetric_free(r->pg, r->grads);
    ddp__free_aligned(r->half);
    free(r->works);
    free(r->launched);
    free(r->piece_end);
    free(r->piece_works);
    for (int i = 0; i < r->nregions; i++) {
        free(r->names ? r->names[i] : NULL);
        free(r->entry_desc ? r->entry_desc[i] : NULL);
    }
    free(r->names);
    free(r->entry_desc);
    free(r->numel);
    free(r->user_grad);
    free(r->flat_offset);
    free(r->ready_order);
    free(r->order);
    free(r->options_desc);
    free(r->unused_hint);
    free(r->debug_last);
    free(r->tl_launch);
    ddp__pg_release(r->pg); /* last: the bucket memory above is the group's */
    free(r);
}

/* ==== settings and introspection ========================================= */

int ddp_reducer_set_no_sync(ddp_reducer_t *r, int no_sync)
{
    DDP_FAIL_IF(!r, DDP_ERR_INVALID_ARG, "ddp_reducer_set_no_sync: NULL reducer");
    DDP_FAIL_IF(no_sync && r->opts.mode == DDP_REDUCER_SCATTER, DDP_ERR_INVALID_ARG,
                "%s: no_sync needs the full gradients alive, which reduce-scatter mode does "
                "not keep; every backward reduces there and the shard accumulates "
                "(ddp_reducer_zero_grad after the step)",
                r->who);
    r->no_sync = no_sync != 0;
    return 0;
}

int ddp_reducer_register_comm_hook(ddp_reducer_t *r, const ddp_comm_hook *hook)
{
    DDP_FAIL_IF(!r, DDP_ERR_INVALID_ARG, "ddp_reducer_register_comm_hook: NULL reducer");
    DDP_FAIL_IF(hook && !hook->launch, DDP_ERR_INVALID_ARG,
                "%s: comm hook has no launch function", r->who);
    DDP_FAIL_IF(hook && r->opts.mode == DDP_REDUCER_SCATTER, DDP_ERR_INVALID_ARG,
                "%s: comm hooks are for the all-reduce mode", r->who);
    r->has_user_hook = hook != NULL;
    if (hook)
        r->user_hook = *hook;
    return 0;
}

int ddp_reducer_num_regions(const ddp_reducer_t *r) { return r ? r->nregions : 0; }

float *ddp_reducer_grad(ddp_reducer_t *r, int i)
{
    if (!r || i < 0 || i >= r->nregions)
        return NULL;
    if (r->opts.mode == DDP_REDUCER_SCATTER) {
        int b = r->layout.bucket_of[i];
        if (r->bucket_buf[b] < 0)
            return NULL;
        return r->bufs[r->bucket_buf[b]] + (r->flat_offset[i] - r->bucket_flat[b]);
    }
    return r->user_grad[i] ? r->user_grad[i] : r->grads + r->layout.offset[i];
}

void ddp_reducer_zero_grad(ddp_reducer_t *r)
{
    if (!r)
        return;
    if (r->opts.mode == DDP_REDUCER_SCATTER) {
        if (r->shard_grad)
            memset(r->shard_grad, 0, r->shard_count * sizeof *r->shard_grad);
        ddp__scatter_shard_zeroed(r);
        return;
    }
    for (int i = 0; i < r->nregions; i++)
        memset(ddp_reducer_grad(r, i), 0, r->numel[i] * sizeof(float));
}

int ddp_reducer_num_buckets(const ddp_reducer_t *r) { return r ? r->layout.nbuckets : 0; }

int ddp_reducer_bucket_info(const ddp_reducer_t *r, int b, int *nregions, size_t *count)
{
    DDP_FAIL_IF(!r || b < 0 || b >= r->layout.nbuckets, DDP_ERR_INVALID_ARG,
                "bucket %d out of range", b);
    if (nregions)
        *nregions = r->layout.bucket_nparams[b];
    if (count)
        *count = r->layout.bucket_numel[b];
    return 0;
}

int ddp_reducer_buckets_rebuilt(const ddp_reducer_t *r) { return r ? r->rebuilt : 0; }

/* Buckets take the fill order's regions one after the other: bucket b's
 * are order[first .. first + n), at rising offsets in the bucket memory;
 * a scatter-mode buffer holds them in flat order, the reverse. */
int ddp_reducer_bucket_region(const ddp_reducer_t *r, int b, int k, int *region, size_t *offset)
{
    DDP_FAIL_IF(!r || b < 0 || b >= r->layout.nbuckets, DDP_ERR_INVALID_ARG,
                "ddp_reducer_bucket_region: bucket %d out of range", b);
    int n = r->layout.bucket_nparams[b], first = 0;
    DDP_FAIL_IF(k < 0 || k >= n, DDP_ERR_INVALID_ARG,
                "ddp_reducer_bucket_region: bucket %d has %d regions, not %d", b, n, k + 1);
    for (int c = 0; c < b; c++)
        first += r->layout.bucket_nparams[c];
    int scatter = r->opts.mode == DDP_REDUCER_SCATTER;
    int i = r->order[scatter ? first + n - 1 - k : first + k];
    if (region)
        *region = i;
    if (offset)
        *offset = scatter ? r->flat_offset[i] - r->bucket_flat[b]
                          : r->layout.offset[i] - r->layout.bucket_start[b];
    return 0;
}

int ddp_reducer_region_offset(const ddp_reducer_t *r, int i, size_t *offset)
{
    DDP_FAIL_IF(!r || !offset || i < 0 || i >= r->nregions, DDP_ERR_INVALID_ARG,
                "ddp_reducer_region_offset: region %d out of range", i);
    *offset = r->flat_offset[i];
    return 0;
}

size_t ddp_reducer_total_count(const ddp_reducer_t *r) { return r ? r->total : 0; }

/* ZeRO's flat partition: S = ceil(total / world), shard s = [s*S, (s+1)*S)
 * clipped to total (the last shards may be short or empty). */
int ddp_reducer_shard_bounds(const ddp_reducer_t *r, int shard, size_t *begin, size_t *count)
{
    int world = r ? ddp_pg_size(r->pg) : 0;
    DDP_FAIL_IF(!r || shard < 0 || shard >= world, DDP_ERR_INVALID_ARG,
                "ddp_reducer_shard_bounds: shard %d out of range (%d ranks)", shard, world);
    size_t b, e;
    ddp__flat_shard(r->total, world, shard, &b, &e);
    if (begin)
        *begin = b;
    if (count)
        *count = e - b;
    return 0;
}

int ddp_reducer_pool_stats(const ddp_reducer_t *r, ddp_reducer_stats *out)
{
    DDP_FAIL_IF(!r || !out, DDP_ERR_INVALID_ARG, "ddp_reducer_pool_stats: NULL argument");
    *out = r->stats;
    return 0;
}
