/* DistributedDataParallel: gradient buckets reduced during backward.
 *
 * The design follows PyTorch's Reducer (torch/csrc/distributed/c10d/
 * reducer.cpp): buckets in reverse registration order, a small first bucket,
 * one rebuild from the observed ready order, gradients as views into bucket
 * memory, buckets launched strictly in order.  The grad-ready hook of nn/
 * (include/ddp/nn.h) is the only point where nn/ and dist/ meet, with the
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
#include "ddp/ddp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/dtype.h"
#include "ddp/bucket.h"
#include "ddp/ext.h"

#define MIB (1024.0 * 1024.0)
#define DDP_TAIL_CHUNKS_MAX 1024

_Static_assert(sizeof(int) == 4, "bucket orders travel as DDP_INT32");

struct ddp_data_parallel {
    ddp_model_t *model;           /* borrowed */
    ddp_pg_t *pg;                 /* borrowed */
    ddp_data_parallel_options opts;
    int nparams;
    ddp_param **params;           /* (nparams) registration order */
    size_t *numel;                /* (nparams) */
    ddp__bucket_layout layout;
    ddp__bucket_tracker tracker;
    float *grads;                 /* (layout.total_numel) the bucket memory */
    uint16_t *half;               /* (layout.total_numel) fp16/bf16 hook scratch */
    ddp_work_t **works;           /* (nbuckets) reductions in flight */
    unsigned char *launched;      /* (nbuckets) launched this iteration, not yet waited */
    int *order;                   /* (nparams) fill order of the current layout */
    int *ready_order;             /* (nparams) used parameters in ready order */
    int nready;
    int no_sync;
    int in_backward;              /* inside ddp_data_parallel_backward (hook calls are expected) */
    int rebuilt;
    ddp_comm_hook user_hook;
    int has_user_hook;
    int join_enabled, join_throw;
    int deferred;                 /* [defer_start, +defer_count) waits for the end of backward */
    size_t defer_start, defer_count;
    int no_defer;                 /* DDP_NO_DEFER=1: launch it like the others (to measure) */
    /* Tail-free overlap (opts.tail_chunks): the last bucket is reduced as
     * npieces consecutive pieces, the same on every rank in every
     * iteration; piece k ends where chunk k of the last parameter in fill
     * order (computed last) ends.  The pieces go out one by one while that
     * parameter's gradient is computed in row chunks (live), or all at once
     * when the bucket completes otherwise. */
    int npieces;                  /* 0: the last bucket is reduced whole */
    int piece_param;              /* the chunked parameter */
    size_t *piece_end;            /* (npieces) element offsets in grads */
    ddp_work_t **piece_works;     /* (npieces) */
    int pieces_launched;          /* pieces launched this iteration */
    int pieces_live;              /* launched as the chunks are computed */
};

ddp_data_parallel_options ddp_data_parallel_defaults(void)
{
    return (ddp_data_parallel_options){.bucket_cap_mb = 25.0,
                             .first_bucket_cap_mb = 1.0,
                             .find_unused_parameters = 0,
                             .rebuild_buckets = 1,
                             .comm_hook = DDP_HOOK_ALLREDUCE,
                             .tail_chunks = 0,
                             .tail_min_piece_mb = 1.0};
}

/* ==== parameter agreement ================================================= */

/* "options|name (d0, d1);name (d0);..." (options, then parameters in
 * registration order).  Caller frees. */
static char *describe_params(ddp_data_parallel_t *dm, size_t *len)
{
    size_t cap = 256, n = 0;
    for (int i = 0; i < dm->nparams; i++)
        cap += strlen(dm->params[i]->name) + 16 + 24 * DDP_TENSOR_MAX_DIM;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    const ddp_data_parallel_options *o = &dm->opts;
    n += (size_t)snprintf(s, cap,
                          "bucket_cap_mb %g, first_bucket_cap_mb %g, find_unused_parameters %d, "
                          "rebuild_buckets %d, comm_hook %d, tail_chunks %d, "
                          "tail_min_piece_mb %g|",
                          o->bucket_cap_mb, o->first_bucket_cap_mb, o->find_unused_parameters,
                          o->rebuild_buckets, (int)o->comm_hook, o->tail_chunks,
                          o->tail_min_piece_mb);
    for (int i = 0; i < dm->nparams; i++) {
        char shape[128];
        ddp_tensor t = {.ndim = dm->params[i]->ndim};
        memcpy(t.shape, dm->params[i]->shape, sizeof t.shape);
        ddp_tensor_shape_str(&t, shape, sizeof shape);
        n += (size_t)snprintf(s + n, cap - n, "%s %s;", dm->params[i]->name, shape);
    }
    s[n] = '\0';
    *len = n;
    return s;
}

/* The i-th "name (shape)" entry of a description, or NULL past the end. */
static const char *entry(const char *desc, int i, char *buf, size_t len)
{
    for (; i > 0 && desc; i--) {
        desc = strchr(desc, ';');
        desc = desc ? desc + 1 : NULL;
    }
    if (!desc || !*desc)
        return NULL;
    size_t n = strcspn(desc, ";");
    snprintf(buf, len, "%.*s", (int)n, desc);
    return buf;
}

static int count_entries(const char *desc)
{
    int n = 0;
    for (; *desc; desc++)
        n += *desc == ';';
    return n;
}

/* Fails with a readable difference between rank r's description and rank 0's. */
static int report_mismatch(int r, const char *mine0, const char *theirs)
{
    char a[512], b[512];
    size_t oa = strcspn(mine0, "|"), ob = strcspn(theirs, "|");
    if (oa != ob || strncmp(mine0, theirs, oa) != 0)
        return DDP_ERROR(DDP_ERR_MISMATCH,
                         "DDP: rank %d differs from rank 0: options %.*s on rank %d but %.*s on "
                         "rank 0",
                         r, (int)ob, theirs, r, (int)oa, mine0);
    mine0 += oa + (mine0[oa] == '|');
    theirs += ob + (theirs[ob] == '|');
    int n0 = count_entries(mine0), nr = count_entries(theirs);
    for (int i = 0;; i++) {
        const char *e0 = entry(mine0, i, a, sizeof a), *er = entry(theirs, i, b, sizeof b);
        if (e0 && er && strcmp(e0, er) == 0)
            continue;
        if (e0 && er)
            return DDP_ERROR(DDP_ERR_MISMATCH,
                             "DDP: rank %d differs from rank 0: parameter %d is %s on rank %d "
                             "but %s on rank 0",
                             r, i, er, r, e0);
        return DDP_ERROR(DDP_ERR_MISMATCH,
                         "DDP: rank %d has %d parameters, rank 0 has %d (first extra: %s on "
                         "rank %d)",
                         r, nr, n0, e0 ? e0 : er, e0 ? 0 : r);
    }
}

/* All ranks check that every rank has rank 0's parameter names and shapes. */
static int check_same_params(ddp_data_parallel_t *dm)
{
    int size = ddp_pg_size(dm->pg), rc = 0;
    size_t len;
    int64_t mylen, *lens = NULL;
    char *desc = describe_params(dm, &len), *mine = NULL, *all = NULL;
    DDP_FAIL_OUT(!desc, DDP_ERR_NOMEM, "DDP: out of memory");
    mylen = (int64_t)len + 1;
    lens = malloc((size_t)size * sizeof *lens);
    DDP_FAIL_OUT(!lens, DDP_ERR_NOMEM, "DDP: out of memory");
    DDP_TRY_OUT(ddp_pg_all_gather(dm->pg, &mylen, lens, 1, DDP_INT64));
    int64_t maxlen = 0;
    for (int r = 0; r < size; r++)
        maxlen = lens[r] > maxlen ? lens[r] : maxlen;
    mine = calloc((size_t)maxlen, 1);
    all = calloc((size_t)maxlen * (size_t)size, 1);
    DDP_FAIL_OUT(!mine || !all, DDP_ERR_NOMEM, "DDP: out of memory");
    memcpy(mine, desc, len + 1);
    DDP_TRY_OUT(ddp_pg_all_gather(dm->pg, mine, all, (size_t)maxlen, DDP_UINT8));
    for (int r = 1; r < size; r++) {
        char *theirs = all + (size_t)r * (size_t)maxlen;
        theirs[maxlen - 1] = '\0';
        if (strcmp(theirs, all) != 0) {
            rc = report_mismatch(r, all, theirs);
            break;
        }
    }
out:
    free(desc);
    free(lens);
    free(mine);
    free(all);
    return rc;
}

/* ==== buckets ============================================================= */

/* The pieces of the last bucket for tail-free overlap: chunk boundaries of
 * the parameter last in fill order (the last gradient computed), when it is
 * a matrix (a Linear weight: rows of contiguous floats) that splits. */
static int plan_pieces(ddp_data_parallel_t *dm)
{
    free(dm->piece_end);
    free(dm->piece_works);
    dm->piece_end = NULL;
    dm->piece_works = NULL;
    dm->npieces = 0;
    const ddp__bucket_layout *l = &dm->layout;
    if (dm->opts.tail_chunks < 2 || dm->nparams == 0 || dm->opts.comm_hook != DDP_HOOK_ALLREDUCE)
        return 0;
    int p = dm->order[dm->nparams - 1], b = l->nbuckets - 1;
    const ddp_param *w = dm->params[p];
    if (w->ndim != 2 || w->shape[0] < 2)
        return 0;
    int64_t rows = w->shape[0];
    size_t row_len = w->numel / (size_t)rows;
    int want = dm->opts.tail_chunks < rows ? dm->opts.tail_chunks : (int)rows;
    size_t min_bytes = (size_t)(dm->opts.tail_min_piece_mb * MIB);
    if (min_bytes && l->bucket_numel[b] * sizeof(float) / min_bytes < (size_t)want)
        want = (int)(l->bucket_numel[b] * sizeof(float) / min_bytes);
    if (want < 2)
        return 0;
    int64_t *bounds = calloc((size_t)want + 1, sizeof *bounds);
    DDP_FAIL_IF(!bounds, DDP_ERR_NOMEM, "DDP: out of memory");
    int n = ddp_grad_chunk_bounds(rows, want, bounds);
    dm->piece_end = calloc((size_t)n, sizeof *dm->piece_end);
    dm->piece_works = calloc((size_t)n, sizeof *dm->piece_works);
    if (!dm->piece_end || !dm->piece_works) {
        free(bounds);
        return DDP_ERROR(DDP_ERR_NOMEM, "DDP: out of memory");
    }
    for (int k = 0; k < n; k++)
        dm->piece_end[k] = l->offset[p] + (size_t)bounds[k + 1] * row_len;
    dm->piece_end[n - 1] = l->bucket_start[b] + l->bucket_numel[b]; /* the rest of the bucket */
    free(bounds);
    dm->npieces = n > 1 ? n : 0;
    dm->piece_param = p;
    return 0;
}

/* Lays the gradients out as `order` says, moving current gradients along.
 * Collective (the buckets are symmetric memory): every rank calls it at the
 * same point, as create and rebuild_buckets do (all ranks hold the same
 * order before the rebuild, so they decide alike). */
static int apply_layout(ddp_data_parallel_t *dm, const int *order)
{
    ddp__bucket_layout l;
    size_t first = (size_t)(dm->opts.first_bucket_cap_mb * MIB);
    size_t cap = (size_t)(dm->opts.bucket_cap_mb * MIB);
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
        rc = plan_pieces(dm);
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
static int rebuild_due(const ddp_data_parallel_t *dm)
{
    return dm->opts.rebuild_buckets && !dm->opts.find_unused_parameters && !dm->rebuilt;
}

/* Rebuilds the buckets once, from the order gradients became ready on rank
 * 0 (used parameters in ready order, then the rest in reverse registration
 * order); every rank adopts rank 0's order. */
static int rebuild_buckets(ddp_data_parallel_t *dm)
{
    int *order = malloc((size_t)dm->nparams * sizeof *order + 1);
    unsigned char *seen = calloc((size_t)dm->nparams + 1, 1);
    int rc = 0, n = 0;
    DDP_FAIL_OUT(!order || !seen, DDP_ERR_NOMEM, "DDP: out of memory");
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
out:
    free(order);
    free(seen);
    return rc;
}

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

static int launch_bucket(ddp_data_parallel_t *dm, int b)
{
    float *data = dm->grads + dm->layout.bucket_start[b];
    size_t n = dm->layout.bucket_numel[b];
    dm->works[b] = NULL;
    int rc = dm->has_user_hook
                 ? dm->user_hook.launch(dm->user_hook.state, dm->pg, b, data, n, &dm->works[b])
                 : launch_builtin(dm, b, data, n, &dm->works[b]);
    dm->launched[b] = rc == 0;
    return rc;
}

/* Waits for every launched bucket, in order, and (with finish) runs the
 * finish steps of those that succeeded.  Leaves no work in flight; returns
 * the first failure, with its message. */
static int wait_buckets(ddp_data_parallel_t *dm, int finish)
{
    int rc = 0;
    char first_msg[1024] = "";
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
    dm->pieces_launched = 0;
    dm->pieces_live = 0;
    for (int b = 0; b < dm->layout.nbuckets; b++) {
        if (!dm->launched[b])
            continue;
        dm->launched[b] = 0;
        int r = 0;
        if (dm->works[b]) {
            r = ddp_work_wait(dm->works[b], ddp_pg_timeout(dm->pg));
            ddp_work_destroy(dm->works[b]);
            dm->works[b] = NULL;
        }
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
    if (rc < 0)
        ddp__error_restore(first_msg);
    return rc;
}

/* The last bucket is normally complete only when backward has nothing left
 * to overlap it with; handing it to the communication thread would cost two
 * thread wake-ups (30-40 us each here) for nothing.  With the default hook it
 * is reduced on the caller's thread right after backward instead. */
static int defer_last(const ddp_data_parallel_t *dm, int b)
{
    return b == dm->layout.nbuckets - 1 && !dm->has_user_hook &&
           dm->opts.comm_hook == DDP_HOOK_ALLREDUCE && !dm->no_defer;
}

/* Are the last bucket's reductions split into pieces this iteration?  Only
 * with the default hook (a user hook sees whole buckets). */
static int use_pieces(const ddp_data_parallel_t *dm, int b)
{
    return dm->npieces && b == dm->layout.nbuckets - 1 && !dm->has_user_hook;
}

/* Launches pieces [pieces_launched, upto) of the last bucket, the final one
 * deferred to the caller's thread when the last bucket would be. */
static int launch_pieces(ddp_data_parallel_t *dm, int upto)
{
    int b = dm->layout.nbuckets - 1;
    for (int k = dm->pieces_launched; k < upto; k++) {
        size_t start = k ? dm->piece_end[k - 1] : dm->layout.bucket_start[b];
        size_t n = dm->piece_end[k] - start;
        dm->piece_works[k] = NULL;
        if (k == dm->npieces - 1 && defer_last(dm, b)) {
            dm->deferred = 1;
            dm->defer_start = start;
            dm->defer_count = n;
        } else {
            DDP_TRY(ddp_pg_all_reduce_async(dm->pg, dm->grads + start, n, DDP_FLOAT32, DDP_AVG,
                                         &dm->piece_works[k]));
        }
        dm->pieces_launched = k + 1;
    }
    return 0;
}

static int mark_ready(ddp_data_parallel_t *dm, int p)
{
    int first, n = ddp__bucket_tracker_mark(&dm->tracker, p, &first);
    if (n < 0)
        return n;
    for (int b = first; b < first + n; b++) {
        if (use_pieces(dm, b)) {
            DDP_TRY(launch_pieces(dm, dm->npieces)); /* those not launched while computed */
        } else if (defer_last(dm, b)) {
            dm->deferred = 1;
            dm->defer_start = dm->layout.bucket_start[b];
            dm->defer_count = dm->layout.bucket_numel[b];
        } else {
            DDP_TRY(launch_bucket(dm, b));
        }
    }
    return 0;
}

/* Reduces the deferred last bucket (or its last piece) on this thread
 * (behind anything still in flight: the group runs operations in issue
 * order). */
static int reduce_deferred(ddp_data_parallel_t *dm)
{
    if (!dm->deferred)
        return 0;
    dm->deferred = 0;
    return ddp_pg_all_reduce(dm->pg, dm->grads + dm->defer_start, dm->defer_count, DDP_FLOAT32,
                          DDP_AVG);
}

/* nn's chunk plan (nn.h rule 7): chunk the parameter computed last when its
 * bucket is the next to go and it is the bucket's last missing gradient. */
static int on_chunk_plan(ddp_param *p, int64_t rows, void *user)
{
    ddp_data_parallel_t *dm = user;
    int b = dm->layout.nbuckets - 1;
    (void)rows;
    if (!dm->in_backward || dm->no_sync || !use_pieces(dm, b) || p->index != dm->piece_param ||
        dm->pieces_launched || dm->tracker.next_launch != b || dm->tracker.pending[b] != 1)
        return 0;
    dm->pieces_live = 1;
    return dm->npieces;
}

/* Rows [.., row_end) of the chunked parameter are final: launch the pieces
 * they complete. */
static int on_chunk(ddp_param *p, int64_t row_begin, int64_t row_end, void *user)
{
    ddp_data_parallel_t *dm = user;
    (void)row_begin;
    if (!dm->pieces_live || p->index != dm->piece_param)
        return 0;
    size_t done = dm->layout.offset[p->index] + (size_t)row_end * (p->numel / (size_t)p->shape[0]);
    int upto = dm->pieces_launched;
    while (upto < dm->npieces - 1 && dm->piece_end[upto] <= done)
        upto++;
    if (row_end == p->shape[0])
        upto = dm->npieces;
    return launch_pieces(dm, upto);
}

/* nn's grad-ready hook: p's gradient is final (used) or p is not in the graph. */
static int on_grad_ready(ddp_param *p, int used, void *user)
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

int ddp_data_parallel_backward(ddp_data_parallel_t *dm, ddp_tape_t *tape, ddp_var_t *loss)
{
    DDP_FAIL_IF(!dm || !tape || !loss, DDP_ERR_INVALID_ARG, "ddp_data_parallel_backward: NULL argument");
    dm->in_backward = 1;
    if (dm->no_sync) {
        int rc = ddp_tape_backward(tape, loss, dm->model);
        dm->in_backward = 0;
        return rc;
    }
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
        rc = reduce_deferred(dm);
    dm->deferred = 0;
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", ddp_last_error());
    int wrc = wait_buckets(dm, 1);
    if (rc < 0) {
        ddp__error_restore(saved); /* the first failure is the one to report */
        return rc;
    }
    DDP_TRY(wrc);
    /* The rebuild's broadcast comes first: every rank takes part in it,
     * whether or not it is about to report unused parameters. */
    if (rebuild_due(dm))
        DDP_TRY(rebuild_buckets(dm));
    if (missing[0])
        return DDP_ERROR(DDP_ERR_STATE,
                         "DDP: parameters %s received no gradient in this iteration; pass "
                         "find_unused_parameters=1 if the model does not use every parameter "
                         "in every iteration (PyTorch: \"Expected to have finished reduction "
                         "in the prior iteration\")",
                         missing);
    return 0;
}

/* ==== join ================================================================ */

/* The join protocol's per-iteration all-reduce: each rank adds 1 if it
 * still trains, plus JOIN_SYNC if this iteration's backward reduces
 * gradients (not no_sync), so that joined ranks shadow exactly the
 * iterations that reduce (PyTorch all-reduces require_backward_grad_sync the
 * same way).  Splits the sum into active and syncing ranks. */
#define JOIN_SYNC (1 << 16)
static int join_flag(ddp_data_parallel_t *dm, int active, int sync, int32_t *nactive, int32_t *nsync)
{
    int32_t total = (active ? 1 : 0) + (active && sync ? JOIN_SYNC : 0);
    DDP_TRY(ddp_pg_all_reduce(dm->pg, &total, 1, DDP_INT32, DDP_SUM));
    *nactive = total % JOIN_SYNC;
    *nsync = total / JOIN_SYNC;
    return 0;
}

int ddp_data_parallel_forward(ddp_data_parallel_t *dm, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y)
{
    DDP_FAIL_IF(!dm, DDP_ERR_INVALID_ARG, "ddp_data_parallel_forward: NULL module");
    if (dm->join_enabled) {
        int32_t active, syncing;
        DDP_TRY(join_flag(dm, 1, !dm->no_sync, &active, &syncing));
        DDP_FAIL_IF(dm->join_throw && active < ddp_pg_size(dm->pg), DDP_ERR_STATE,
                    "DDP: %d of %d ranks ran out of data (throw_on_early_termination)",
                    ddp_pg_size(dm->pg) - active, ddp_pg_size(dm->pg));
    }
    return ddp_model_forward(dm->model, tape, x, y);
}

int ddp_data_parallel_join_enable(ddp_data_parallel_t *dm, int enable, int throw_on_early_termination)
{
    DDP_FAIL_IF(!dm, DDP_ERR_INVALID_ARG, "ddp_data_parallel_join_enable: NULL module");
    dm->join_enabled = enable != 0;
    dm->join_throw = throw_on_early_termination != 0;
    return 0;
}

/* One shadow iteration: the active ranks' bucket reductions, with zeros. */
static int shadow_iteration(ddp_data_parallel_t *dm)
{
    memset(dm->grads, 0, dm->layout.total_numel * sizeof(float));
    int rc = 0;
    for (int b = 0; b < dm->layout.nbuckets && rc == 0; b++)
        rc = use_pieces(dm, b) ? launch_pieces(dm, dm->npieces) : launch_bucket(dm, b);
    if (rc == 0)
        rc = reduce_deferred(dm);
    dm->deferred = 0;
    int wrc = wait_buckets(dm, 1);
    DDP_TRY(rc);
    DDP_TRY(wrc);
    dm->nready = 0; /* a joined rank's ready order means nothing */
    if (rebuild_due(dm))
        DDP_TRY(rebuild_buckets(dm));
    return 0;
}

int ddp_data_parallel_join(ddp_data_parallel_t *dm)
{
    DDP_FAIL_IF(!dm || !dm->join_enabled, DDP_ERR_STATE,
                "ddp_data_parallel_join: join is not enabled (ddp_data_parallel_join_enable on every rank first)");
    int waited = 0; /* others still trained after this rank joined */
    for (;;) {
        int32_t active, syncing;
        DDP_TRY(join_flag(dm, 0, 0, &active, &syncing));
        if (active == 0)
            break;
        DDP_FAIL_IF(dm->join_throw, DDP_ERR_STATE,
                    "DDP: this rank ran out of data while %d ranks still train "
                    "(throw_on_early_termination)",
                    active);
        waited = 1;
        if (syncing == 0) /* the others accumulate locally (no_sync): nothing to shadow */
            continue;
        DDP_TRY(shadow_iteration(dm));
    }
    /* The model of the highest rank that trained to the end goes to all. */
    int32_t src = waited ? -1 : ddp_pg_rank(dm->pg);
    DDP_TRY(ddp_pg_all_reduce(dm->pg, &src, 1, DDP_INT32, DDP_MAX));
    size_t n;
    float *block = ddp_model_param_block(dm->model, &n);
    return ddp_pg_broadcast(dm->pg, block, n, DDP_FLOAT32, src);
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

/* DDP_TAIL_CHUNKS, when set, overrides opts.tail_chunks. */
static int tail_chunks_from_env(ddp_data_parallel_options *o)
{
    const char *s = getenv("DDP_TAIL_CHUNKS");
    if (!s || !*s)
        return 0;
    char *end;
    long v = strtol(s, &end, 10);
    DDP_FAIL_IF(*end || v < 0 || v > DDP_TAIL_CHUNKS_MAX, DDP_ERR_INVALID_ARG,
                "DDP_TAIL_CHUNKS='%s': expected a chunk count from 0 (off) to %d", s,
                DDP_TAIL_CHUNKS_MAX);
    o->tail_chunks = (int)v;
    return 0;
}

int ddp_data_parallel_create(ddp_model_t *model, ddp_pg_t *pg, const ddp_data_parallel_options *opts,
                   ddp_data_parallel_t **out)
{
    DDP_FAIL_IF(!model || !pg || !out, DDP_ERR_INVALID_ARG, "ddp_data_parallel_create: NULL argument");
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
    dm->opts = o;
    dm->no_defer = getenv("DDP_NO_DEFER") != NULL;
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
    DDP_TRY_OUT(check_same_params(dm));
    size_t n;
    float *block = ddp_model_param_block(model, &n);
    DDP_TRY_OUT(ddp_pg_broadcast(pg, block, n, DDP_FLOAT32, 0));
    DDP_TRY_OUT(apply_layout(dm, order));
    if (o.comm_hook != DDP_HOOK_ALLREDUCE) {
        dm->half = ddp__alloc_aligned((dm->layout.total_numel + 1) * sizeof *dm->half);
        DDP_FAIL_OUT(!dm->half, DDP_ERR_NOMEM, "DDP: out of memory for the compression buffer");
    }
    ddp_model_set_grad_ready_hook(model, on_grad_ready, dm);
    if (o.tail_chunks > 1)
        ddp_model_set_grad_chunk_hook(model,
                                      &(ddp_grad_chunk_hook){on_chunk_plan, on_chunk, dm});
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
        wait_buckets(dm, 0); /* only waits: nothing is finished twice */
    if (dm->grads) {
        ddp_model_set_grad_block(dm->model, NULL);
        void *user;
        if (ddp_model_grad_ready_hook(dm->model, &user) == on_grad_ready && user == dm)
            ddp_model_set_grad_ready_hook(dm->model, NULL, NULL);
        const ddp_grad_chunk_hook *ch = ddp_model_grad_chunk_hook(dm->model);
        if (ch && ch->plan == on_chunk_plan && ch->user == dm)
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
    free(dm->order);
    free(dm);
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
