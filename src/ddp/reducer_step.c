/* The reducer's iteration: regions marked ready, each bucket's reduction
 * launched the moment it and every bucket before it are complete (built-in
 * fp32, fp16 and bf16 hooks, or the user's; the last bucket deferred to the
 * caller's thread; the tail pieces DDP plans), and the wait before the
 * optimizer step (reducer_impl.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/error.h"
#include "base/timeline.h"
#include "ddp/reducer_impl.h"

/* ==== reductions ========================================================== */

static int launch_builtin(ddp_reducer_t *r, int b, float *data, size_t n, ddp_work_t **work)
{
    if (r->opts.comm_hook == DDP_HOOK_ALLREDUCE)
        return ddp_pg_all_reduce_async(r->pg, data, n, DDP_FLOAT32, DDP_AVG, work);
    /* Compression hooks divide first (the sum of n halves must not overflow),
     * as PyTorch's fp16_compress_hook does. */
    uint16_t *h = r->half + r->layout.bucket_start[b];
    float scale = 1.0f / (float)ddp_pg_size(r->pg);
    int fp16 = r->opts.comm_hook == DDP_HOOK_FP16;
    for (size_t i = 0; i < n; i++)
        h[i] = fp16 ? ddp__float_to_half(data[i] * scale) : ddp__float_to_bf16(data[i] * scale);
    return ddp_pg_all_reduce_async(r->pg, h, n, fp16 ? DDP_FLOAT16 : DDP_BFLOAT16, DDP_SUM, work);
}

static int finish_builtin(ddp_reducer_t *r, int b, float *data, size_t n)
{
    if (r->opts.comm_hook == DDP_HOOK_ALLREDUCE)
        return 0;
    const uint16_t *h = r->half + r->layout.bucket_start[b];
    int fp16 = r->opts.comm_hook == DDP_HOOK_FP16;
    for (size_t i = 0; i < n; i++)
        data[i] = fp16 ? ddp__half_to_float(h[i]) : ddp__bf16_to_float(h[i]);
    return 0;
}

/* Timeline: the launch's own span, and its time kept for the reduction's
 * span, which ends when the wait sees it complete (the communication
 * thread's own timing is pg/'s to record). */
static void timeline_launched(ddp_reducer_t *r, int b, uint64_t t0)
{
    ddp__tl_record(t0, "bucket launch", "bucket", b);
    if (b >= r->tl_nlaunch) {
        int n = r->layout.nbuckets > b ? r->layout.nbuckets : b + 1;
        uint64_t *more = realloc(r->tl_launch, (size_t)n * sizeof *more);
        if (!more)
            return; /* the reduction's span is lost, nothing else */
        memset(more + r->tl_nlaunch, 0, (size_t)(n - r->tl_nlaunch) * sizeof *more);
        r->tl_launch = more;
        r->tl_nlaunch = n;
    }
    r->tl_launch[b] = t0;
}

static void timeline_completed(ddp_reducer_t *r, int b)
{
    if (b < r->tl_nlaunch && r->tl_launch[b]) {
        ddp__tl_record_async(r->tl_launch[b], "bucket allreduce", "bucket", b);
        r->tl_launch[b] = 0;
    }
}

int ddp__reducer_launch_bucket(ddp_reducer_t *r, int b)
{
    if (r->opts.mode == DDP_REDUCER_SCATTER)
        return ddp__scatter_launch(r, b);
    float *data = r->grads + r->layout.bucket_start[b];
    size_t n = r->layout.bucket_numel[b];
    r->works[b] = NULL;
    uint64_t t0 = ddp__tl_begin();
    int rc = r->has_user_hook
                 ? r->user_hook.launch(r->user_hook.state, r->pg, b, data, n, &r->works[b])
                 : launch_builtin(r, b, data, n, &r->works[b]);
    r->launched[b] = rc == 0;
    if (t0)
        timeline_launched(r, b, t0);
    return rc;
}

static int wait_pieces(ddp_reducer_t *r, char *first_msg, size_t len)
{
    int rc = 0;
    uint64_t t0 = ddp__tl_begin();
    for (int k = 0; k < r->pieces_launched; k++) { /* the default hook: nothing to finish */
        if (!r->piece_works[k])
            continue;
        int w = ddp_work_wait(r->piece_works[k], ddp_pg_timeout(r->pg));
        ddp_work_destroy(r->piece_works[k]);
        r->piece_works[k] = NULL;
        if (w < 0 && rc == 0) {
            rc = w;
            snprintf(first_msg, len, "%s", ddp_last_error());
        }
    }
    if (r->pieces_launched)
        ddp__tl_end(t0, "wait tail pieces", "pieces", r->pieces_launched);
    r->pieces_launched = 0;
    r->pieces_live = 0;
    return rc;
}

static int finish_bucket(ddp_reducer_t *r, int b)
{
    float *data = r->grads + r->layout.bucket_start[b];
    size_t n = r->layout.bucket_numel[b];
    if (r->has_user_hook)
        return r->user_hook.finish ? r->user_hook.finish(r->user_hook.state, r->pg, b, data, n)
                                   : 0;
    return finish_builtin(r, b, data, n);
}

/* Waits for every launched bucket, in order, and (with finish) runs the
 * finish steps of those that succeeded.  Leaves no work in flight; returns
 * the first failure, with its message. */
int ddp__reducer_wait_buckets(ddp_reducer_t *r, int finish)
{
    if (r->opts.mode == DDP_REDUCER_SCATTER)
        return ddp__scatter_wait_all(r);
    char first_msg[1024] = "";
    uint64_t t_all = ddp__tl_begin();
    int waited = r->pieces_launched > 0; /* the timeline shows waits for something only */
    int rc = wait_pieces(r, first_msg, sizeof first_msg);
    for (int b = 0; b < r->layout.nbuckets; b++) {
        if (!r->launched[b])
            continue;
        r->launched[b] = 0;
        waited = 1;
        int w = 0;
        if (r->works[b]) {
            uint64_t t0 = ddp__tl_begin();
            w = ddp_work_wait(r->works[b], ddp_pg_timeout(r->pg));
            ddp_work_destroy(r->works[b]);
            r->works[b] = NULL;
            ddp__tl_end(t0, "wait bucket", "bucket", b);
        }
        if (t_all)
            timeline_completed(r, b);
        if (w == 0 && rc == 0 && finish)
            w = finish_bucket(r, b);
        if (w == 0)
            r->stats.buckets_reduced++;
        if (w < 0 && rc == 0) {
            rc = w;
            snprintf(first_msg, sizeof first_msg, "%s", ddp_last_error());
        }
    }
    if (waited)
        ddp__tl_end(t_all, "wait buckets", NULL, 0);
    if (rc < 0)
        ddp__error_restore(first_msg);
    return rc;
}

/* ==== tail pieces ========================================================= */

int ddp__reducer_set_pieces(ddp_reducer_t *r, const size_t *ends, int n)
{
    free(r->piece_end);
    free(r->piece_works);
    r->piece_end = NULL;
    r->piece_works = NULL;
    r->npieces = 0;
    if (n < 2)
        return 0;
    r->piece_end = calloc((size_t)n, sizeof *r->piece_end);
    r->piece_works = calloc((size_t)n, sizeof *r->piece_works);
    DDP_FAIL_IF(!r->piece_end || !r->piece_works, DDP_ERR_NOMEM, "%s: out of memory", r->who);
    memcpy(r->piece_end, ends, (size_t)n * sizeof *ends);
    r->npieces = n;
    return 0;
}

/* Are the last bucket's reductions split into pieces this iteration?  Only
 * with the default hook (a user hook sees whole buckets). */
int ddp__reducer_use_pieces(const ddp_reducer_t *r, int b)
{
    return r->npieces && b == r->layout.nbuckets - 1 && !r->has_user_hook;
}

/* The last bucket is normally complete only when backward has nothing left
 * to overlap it with; handing it to the communication thread would cost two
 * thread wake-ups (30-40 us each here) for nothing.  With the default hook it
 * is reduced on the caller's thread right after backward instead. */
static int defer_last(const ddp_reducer_t *r, int b)
{
    return b == r->layout.nbuckets - 1 && !r->has_user_hook &&
           r->opts.comm_hook == DDP_HOOK_ALLREDUCE && !r->no_defer &&
           r->opts.mode == DDP_REDUCER_ALLREDUCE;
}

/* Launches pieces [pieces_launched, upto) of the last bucket, the final one
 * deferred to the caller's thread when the last bucket would be. */
int ddp__reducer_launch_pieces(ddp_reducer_t *r, int upto)
{
    int b = r->layout.nbuckets - 1;
    for (int k = r->pieces_launched; k < upto; k++) {
        size_t start = k ? r->piece_end[k - 1] : r->layout.bucket_start[b];
        size_t n = r->piece_end[k] - start;
        r->piece_works[k] = NULL;
        if (k == r->npieces - 1 && defer_last(r, b)) {
            r->deferred = 1;
            r->defer_start = start;
            r->defer_count = n;
        } else {
            DDP_TRY(ddp_pg_all_reduce_async(r->pg, r->grads + start, n, DDP_FLOAT32, DDP_AVG,
                                            &r->piece_works[k]));
        }
        r->pieces_launched = k + 1;
    }
    return 0;
}

/* Reduces the deferred last bucket (or its last piece) on this thread
 * (behind anything still in flight: the group runs operations in issue
 * order). */
int ddp__reducer_reduce_deferred(ddp_reducer_t *r)
{
    if (!r->deferred)
        return 0;
    r->deferred = 0;
    uint64_t t0 = ddp__tl_begin();
    int rc = ddp_pg_all_reduce(r->pg, r->grads + r->defer_start, r->defer_count, DDP_FLOAT32,
                               DDP_AVG);
    ddp__tl_end(t0, "allreduce last bucket (this thread)", "bucket", r->layout.nbuckets - 1);
    return rc;
}

/* ==== readiness =========================================================== */

void ddp__reducer_reset(ddp_reducer_t *r)
{
    ddp__bucket_tracker_reset(&r->tracker);
    r->nready = 0;
    r->marked = 0;
    r->deferred = 0;
}

static int mark(ddp_reducer_t *r, int i)
{
    int first, n = ddp__bucket_tracker_mark(&r->tracker, i, &first);
    if (n < 0)
        return n;
    r->marked = 1;
    if (r->user_grad[i] && r->opts.mode == DDP_REDUCER_ALLREDUCE)
        memcpy(r->grads + r->layout.offset[i], r->user_grad[i], r->numel[i] * sizeof(float));
    for (int b = first; b < first + n; b++) {
        if (ddp__reducer_use_pieces(r, b)) {
            DDP_TRY(ddp__reducer_launch_pieces(r, r->npieces)); /* those not yet launched */
        } else if (defer_last(r, b)) {
            r->deferred = 1;
            r->defer_start = r->layout.bucket_start[b];
            r->defer_count = r->layout.bucket_numel[b];
        } else {
            DDP_TRY(ddp__reducer_launch_bucket(r, b));
        }
    }
    return 0;
}

static int check_index(const ddp_reducer_t *r, int i, const char *what)
{
    DDP_FAIL_IF(!r, DDP_ERR_INVALID_ARG, "%s: NULL reducer", what);
    DDP_FAIL_IF(i < 0 || i >= r->nregions, DDP_ERR_INVALID_ARG,
                "%s: %s %d out of range (%d %ss)", what, r->noun, i, r->nregions, r->noun);
    return 0;
}

int ddp_reducer_mark_ready(ddp_reducer_t *r, int i)
{
    DDP_TRY(check_index(r, i, "ddp_reducer_mark_ready"));
    if (r->no_sync)
        return 0;
    if (r->tracker.ready[i])
        return DDP_ERROR(DDP_ERR_STATE, "%s: %s %s was marked ready twice in one iteration",
                         r->who, r->noun, r->names[i]);
    r->ready_order[r->nready++] = i;
    return mark(r, i);
}

int ddp_reducer_mark_unused(ddp_reducer_t *r, int i)
{
    DDP_TRY(check_index(r, i, "ddp_reducer_mark_unused"));
    if (r->no_sync || !r->opts.find_unused || r->tracker.ready[i])
        return 0;
    return mark(r, i);
}

int ddp_reducer_grad_buffer(ddp_reducer_t *r, int i, float **grad)
{
    DDP_TRY(check_index(r, i, "ddp_reducer_grad_buffer"));
    DDP_FAIL_IF(!grad, DDP_ERR_INVALID_ARG, "ddp_reducer_grad_buffer: NULL argument");
    DDP_FAIL_IF(r->tracker.ready[i], DDP_ERR_STATE,
                "%s: %s %s asked for its gradient buffer after it was marked ready in this "
                "iteration (its bucket may be reduced already)",
                r->who, r->noun, r->names[i]);
    if (r->opts.mode == DDP_REDUCER_SCATTER)
        return ddp__scatter_grad_buffer(r, i, grad);
    *grad = ddp_reducer_grad(r, i);
    return 0;
}

/* Names of the regions not ready this iteration, "a, b, c". */
static void missing_names(ddp_reducer_t *r, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < r->nregions && n < len; i++)
        if (!r->tracker.ready[i])
            n += (size_t)snprintf(buf + n, len - n, "%s%s", n ? ", " : "", r->names[i]);
}

/* Copies the averaged caller-owned regions back where the caller keeps them. */
static void copy_back(ddp_reducer_t *r)
{
    if (!r->ncopied || r->opts.mode != DDP_REDUCER_ALLREDUCE)
        return;
    for (int i = 0; i < r->nregions; i++)
        if (r->user_grad[i])
            memcpy(r->user_grad[i], r->grads + r->layout.offset[i], r->numel[i] * sizeof(float));
}

static int finish_iteration(ddp_reducer_t *r, const char *missing)
{
    ddp__reducer_debug_iteration(r);
    /* The rebuild's broadcast comes first: every rank takes part in it,
     * whether or not it is about to report unused regions. */
    if (ddp__reducer_rebuild_due(r))
        DDP_TRY(ddp__reducer_rebuild_buckets(r));
    if (missing[0])
        return DDP_ERROR(DDP_ERR_STATE, "%s: %ss %s received no gradient in this iteration; %s",
                         r->who, r->noun, missing, r->unused_hint);
    return 0;
}

int ddp_reducer_wait(ddp_reducer_t *r)
{
    DDP_FAIL_IF(!r, DDP_ERR_INVALID_ARG, "ddp_reducer_wait: NULL reducer");
    if (r->no_sync)
        return 0;
    int rc = 0;
    char missing[1024] = "";
    if (r->tracker.next_launch < r->layout.nbuckets) {
        /* Reduce the rest anyway so that no peer waits for this rank. */
        if (!r->opts.find_unused)
            missing_names(r, missing, sizeof missing);
        for (int i = 0; i < r->nregions && rc == 0; i++)
            if (!r->tracker.ready[i])
                rc = mark(r, i);
    }
    if (rc == 0)
        rc = ddp__reducer_reduce_deferred(r);
    r->deferred = 0;
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", ddp_last_error());
    int wrc = ddp__reducer_wait_buckets(r, 1);
    if (rc < 0) {
        ddp__reducer_reset(r);
        ddp__error_restore(saved); /* the first failure is the one to report */
        return rc;
    }
    if (wrc == 0)
        copy_back(r);
    if (wrc == 0)
        wrc = finish_iteration(r, missing);
    ddp__reducer_reset(r);
    return wrc;
}
