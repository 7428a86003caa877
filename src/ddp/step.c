/* The DDP step: forward, backward with nn's grad-ready hook, each bucket's
 * reduction launched the moment its last gradient is final (built-in fp32,
 * fp16 and bf16 hooks, or the user's), the last bucket deferred to the
 * caller's thread, and the wait before the optimizer step (wrapper.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/dtype.h"
#include "base/timeline.h"
#include "ddp/buffers.h"
#include "ddp/wrapper.h"

/* ==== reductions ========================================================== */

static int launch_builtin(ddp_data_parallel_t *dm, int b, float *data, size_t n, ddp_work_t **work)
{
    if (dm->opts.comm_hook == DDP_HOOK_ALLREDUCE)
        return ddp_pg_all_reduce_async(dm->pg, data, n, DDP_FLOAT32, DDP_AVG, work);
    /* Compression hooks divide first (the sum of n halves must not overflow),
     * as PyTorch's fp16_compress_hook does. */
    uint16_t *h = dm->half + dm->layout.bucket_start[b];
    float scale = 1.0f / (float)ddp_pg_size(dm->pg);
    int fp16 = dm->opts.comm_hook == DDP_HOOK_FP16;
    for (size_t i = 0; i < n; i++)
        h[i] = fp16 ? ddp__float_to_half(data[i] * scale) : ddp__float_to_bf16(data[i] * scale);
    return ddp_pg_all_reduce_async(dm->pg, h, n, fp16 ? DDP_FLOAT16 : DDP_BFLOAT16, DDP_SUM, work);
}

static int finish_builtin(ddp_data_parallel_t *dm, int b, float *data, size_t n)
{
    if (dm->opts.comm_hook == DDP_HOOK_ALLREDUCE)
        return 0;
    const uint16_t *h = dm->half + dm->layout.bucket_start[b];
    int fp16 = dm->opts.comm_hook == DDP_HOOK_FP16;
    for (size_t i = 0; i < n; i++)
        data[i] = fp16 ? ddp__half_to_float(h[i]) : ddp__bf16_to_float(h[i]);
    return 0;
}

/* Timeline: the launch's own span, and its time kept for the reduction's
 * span, which ends when the wait sees it complete (the communication
 * thread's own timing is pg/'s to record). */
static void timeline_launched(ddp_data_parallel_t *dm, int b, uint64_t t0)
{
    ddp__tl_record(t0, "bucket launch", "bucket", b);
    if (b >= dm->tl_nlaunch) {
        int n = dm->layout.nbuckets > b ? dm->layout.nbuckets : b + 1;
        uint64_t *more = realloc(dm->tl_launch, (size_t)n * sizeof *more);
        if (!more)
            return; /* the reduction's span is lost, nothing else */
        memset(more + dm->tl_nlaunch, 0, (size_t)(n - dm->tl_nlaunch) * sizeof *more);
        dm->tl_launch = more;
        dm->tl_nlaunch = n;
    }
    dm->tl_launch[b] = t0;
}

static void timeline_completed(ddp_data_parallel_t *dm, int b)
{
    if (b < dm->tl_nlaunch && dm->tl_launch[b]) {
        ddp__tl_record_async(dm->tl_launch[b], "bucket allreduce", "bucket", b);
        dm->tl_launch[b] = 0;
    }
}

int ddp__dp_launch_bucket(ddp_data_parallel_t *dm, int b)
{
    float *data = dm->grads + dm->layout.bucket_start[b];
    size_t n = dm->layout.bucket_numel[b];
    dm->works[b] = NULL;
    uint64_t t0 = ddp__tl_begin();
    int rc = dm->has_user_hook
                 ? dm->user_hook.launch(dm->user_hook.state, dm->pg, b, data, n, &dm->works[b])
                 : launch_builtin(dm, b, data, n, &dm->works[b]);
    dm->launched[b] = rc == 0;
    if (t0)
        timeline_launched(dm, b, t0);
    return rc;
}

/* Waits for every launched bucket, in order, and (with finish) runs the
 * finish steps of those that succeeded.  Leaves no work in flight; returns
 * the first failure, with its message. */
int ddp__dp_wait_buckets(ddp_data_parallel_t *dm, int finish)
{
    int rc = 0;
    char first_msg[1024] = "";
    uint64_t t_all = ddp__tl_begin(), t_pieces = t_all;
    int waited = dm->pieces_launched > 0; /* the timeline shows waits for something only */
    for (int k = 0; k < dm->pieces_launched; k++) { /* the default hook: nothing to finish */
        if (!dm->piece_works[k])
            continue;
        int r = ddp_work_wait(dm->piece_works[k], ddp_pg_timeout(dm->pg));
        ddp_work_destroy(dm->piece_works[k]);
        dm->piece_works[k] = NULL;
        if (r < 0 && rc == 0) {
            rc = r;
            snprintf(first_msg, sizeof first_msg, "%s", ddp_last_error());
        }
    }
    if (dm->pieces_launched)
        ddp__tl_end(t_pieces, "wait tail pieces", "pieces", dm->pieces_launched);
    dm->pieces_launched = 0;
    dm->pieces_live = 0;
    for (int b = 0; b < dm->layout.nbuckets; b++) {
        if (!dm->launched[b])
            continue;
        dm->launched[b] = 0;
        waited = 1;
        int r = 0;
        if (dm->works[b]) {
            uint64_t t0 = ddp__tl_begin();
            r = ddp_work_wait(dm->works[b], ddp_pg_timeout(dm->pg));
            ddp_work_destroy(dm->works[b]);
            dm->works[b] = NULL;
            ddp__tl_end(t0, "wait bucket", "bucket", b);
        }
        if (t_all)
            timeline_completed(dm, b);
        if (r == 0 && rc == 0 && finish) {
            float *data = dm->grads + dm->layout.bucket_start[b];
            size_t n = dm->layout.bucket_numel[b];
            if (dm->has_user_hook)
                r = dm->user_hook.finish
                        ? dm->user_hook.finish(dm->user_hook.state, dm->pg, b, data, n)
                        : 0;
            else
                r = finish_builtin(dm, b, data, n);
        }
        if (r < 0 && rc == 0) {
            rc = r;
            snprintf(first_msg, sizeof first_msg, "%s", ddp_last_error());
        }
    }
    if (waited)
        ddp__tl_end(t_all, "wait buckets", NULL, 0);
    if (rc < 0)
        ddp__error_restore(first_msg);
    return rc;
}

/* The last bucket is normally complete only when backward has nothing left
 * to overlap it with; handing it to the communication thread would cost two
 * thread wake-ups (30-40 us each here) for nothing.  With the default hook it
 * is reduced on the caller's thread right after backward instead. */
int ddp__dp_defer_last(const ddp_data_parallel_t *dm, int b)
{
    return b == dm->layout.nbuckets - 1 && !dm->has_user_hook &&
           dm->opts.comm_hook == DDP_HOOK_ALLREDUCE && !dm->no_defer;
}

static int mark_ready(ddp_data_parallel_t *dm, int p)
{
    int first, n = ddp__bucket_tracker_mark(&dm->tracker, p, &first);
    if (n < 0)
        return n;
    for (int b = first; b < first + n; b++) {
        if (ddp__dp_use_pieces(dm, b)) {
            DDP_TRY(ddp__dp_launch_pieces(dm, dm->npieces)); /* those not launched while computed */
        } else if (ddp__dp_defer_last(dm, b)) {
            dm->deferred = 1;
            dm->defer_start = dm->layout.bucket_start[b];
            dm->defer_count = dm->layout.bucket_numel[b];
        } else {
            DDP_TRY(ddp__dp_launch_bucket(dm, b));
        }
    }
    return 0;
}

/* Reduces the deferred last bucket (or its last piece) on this thread
 * (behind anything still in flight: the group runs operations in issue
 * order). */
int ddp__dp_reduce_deferred(ddp_data_parallel_t *dm)
{
    if (!dm->deferred)
        return 0;
    dm->deferred = 0;
    uint64_t t0 = ddp__tl_begin();
    int rc = ddp_pg_all_reduce(dm->pg, dm->grads + dm->defer_start, dm->defer_count, DDP_FLOAT32,
                               DDP_AVG);
    ddp__tl_end(t0, "allreduce last bucket (this thread)", "bucket", dm->layout.nbuckets - 1);
    return rc;
}

/* nn's grad-ready hook: p's gradient is final (used) or p is not in the graph. */
int ddp__dp_on_grad_ready(ddp_param *p, int used, void *user)
{
    ddp_data_parallel_t *dm = user;
    DDP_FAIL_IF(!dm->in_backward, DDP_ERR_STATE,
                "DDP: call ddp_data_parallel_backward, not ddp_tape_backward, on a model wrapped by DDP (its "
                "gradients would not be averaged)");
    if (dm->no_sync)
        return 0;
    if (!used)
        return dm->opts.find_unused_parameters ? mark_ready(dm, p->index) : 0;
    dm->ready_order[dm->nready++] = p->index;
    return mark_ready(dm, p->index);
}

/* Names of the parameters not ready this iteration, "a, b, c". */
static void missing_names(ddp_data_parallel_t *dm, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < dm->nparams && n < len; i++)
        if (!dm->tracker.ready[i])
            n += (size_t)snprintf(buf + n, len - n, "%s%s", n ? ", " : "", dm->params[i]->name);
}

/* no_sync left on across an optimizer step lets the replicas diverge: that
 * step used this rank's gradients alone.  Caught at the next forward or
 * backward: the parameters changed (their version, nn.h) since a no_sync
 * backward whose gradients no synchronising backward has reduced yet.
 * Reported once. */
static int check_no_sync_step(ddp_data_parallel_t *dm)
{
    if (!dm->unsynced || ddp_model_param_version(dm->model) == dm->unsynced_version)
        return 0;
    dm->unsynced = 0;
    return DDP_ERROR(DDP_ERR_STATE,
                     "DDP: the parameters changed (ddp_optim_step?) after a backward under "
                     "no_sync, before any synchronising backward: that step used this rank's "
                     "gradients alone, never averaged, so the replicas have diverged; turn "
                     "no_sync off (ddp_data_parallel_set_no_sync(dm, 0)) for the last backward "
                     "before each optimizer step (PyTorch: run it outside model.no_sync())");
}

static int backward(ddp_data_parallel_t *dm, ddp_tape_t *tape, ddp_var_t *loss)
{
    DDP_TRY(check_no_sync_step(dm));
    dm->in_backward = 1;
    if (dm->no_sync) {
        int rc = ddp_tape_backward(tape, loss, dm->model);
        dm->in_backward = 0;
        if (rc == 0 && !dm->unsynced) {
            dm->unsynced = 1;
            dm->unsynced_version = ddp_model_param_version(dm->model);
        }
        return rc;
    }
    dm->unsynced = 0; /* this backward reduces what no_sync accumulated */
    ddp__bucket_tracker_reset(&dm->tracker);
    dm->nready = 0;
    int rc = ddp_tape_backward(tape, loss, dm->model);
    dm->in_backward = 0;
    char missing[1024] = "";
    if (rc == 0 && dm->tracker.next_launch < dm->layout.nbuckets) {
        /* Reduce the rest anyway so that no peer waits for this rank. */
        missing_names(dm, missing, sizeof missing);
        for (int i = 0; i < dm->nparams && rc == 0; i++)
            if (!dm->tracker.ready[i])
                rc = mark_ready(dm, i);
    }
    if (rc == 0)
        rc = ddp__dp_reduce_deferred(dm);
    dm->deferred = 0;
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", ddp_last_error());
    int wrc = ddp__dp_wait_buckets(dm, 1);
    if (rc < 0) {
        ddp__error_restore(saved); /* the first failure is the one to report */
        return rc;
    }
    DDP_TRY(wrc);
    ddp__dp_debug_iteration(dm);
    /* The rebuild's broadcast comes first: every rank takes part in it,
     * whether or not it is about to report unused parameters. */
    if (ddp__dp_rebuild_due(dm))
        DDP_TRY(ddp__dp_rebuild_buckets(dm));
    if (missing[0])
        return DDP_ERROR(DDP_ERR_STATE,
                         "DDP: parameters %s received no gradient in this iteration; pass "
                         "find_unused_parameters=1 if the model does not use every parameter "
                         "in every iteration (PyTorch: \"Expected to have finished reduction "
                         "in the prior iteration\")",
                         missing);
    return 0;
}

int ddp_data_parallel_backward(ddp_data_parallel_t *dm, ddp_tape_t *tape, ddp_var_t *loss)
{
    DDP_FAIL_IF(!dm || !tape || !loss, DDP_ERR_INVALID_ARG, "ddp_data_parallel_backward: NULL argument");
    uint64_t t0 = ddp__tl_begin();
    int rc = backward(dm, tape, loss);
    ddp__tl_end(t0, dm->no_sync ? "DDP backward (no_sync)" : "DDP backward", NULL, 0);
    return rc;
}

static int forward(ddp_data_parallel_t *dm, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y)
{
    DDP_TRY(check_no_sync_step(dm));
    if (dm->join_enabled)
        DDP_TRY(ddp__dp_join_forward(dm));
    else if (dm->opts.broadcast_buffers)
        DDP_TRY(ddp__broadcast_buffers(dm->pg, dm->model));
    return ddp_model_forward(dm->model, tape, x, y);
}

int ddp_data_parallel_forward(ddp_data_parallel_t *dm, ddp_tape_t *tape, ddp_var_t *x,
                              ddp_var_t **y)
{
    DDP_FAIL_IF(!dm, DDP_ERR_INVALID_ARG, "ddp_data_parallel_forward: NULL module");
    uint64_t t0 = ddp__tl_begin();
    int rc = forward(dm, tape, x, y);
    ddp__tl_end(t0, "DDP forward", NULL, 0);
    return rc;
}
