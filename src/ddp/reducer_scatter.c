/* The reducer's reduce-scatter mode (ZeRO-2; include/ddp/reducer.h):
 * gradients are written into a small pool of bucket buffers, each bucket
 * is reduced to the owners of the shards it overlaps the moment it is
 * complete (one reduce per owner, as DeepSpeed stage 2's average_tensor),
 * the owner adds its part into its shard array (or has it written there,
 * below), and the buffer goes back to the pool.
 *
 * Memory: pool_buffers * the largest bucket + the shard (total / world),
 * against DDP's full gradient (total), whatever the model's depth.  Cost per
 * bucket: one reduce per overlapped shard (usually one or two), the same
 * bytes into each owner as an all-reduce's reduce-scatter phase, and no
 * all-gather phase; plus one add of this rank's part into its shard, unless
 * the shard is zero.
 * When the pool is empty the caller waits for the oldest launched bucket:
 * with two buffers, backward computes bucket k+1 while bucket k is reduced.
 *
 * The add is skipped while the shard is known to be zero (after a
 * zero_grad: ddp_reducer_zero_grad, or the zero-grad hook of the model
 * whose gradients view the shard, ext.h rule 9, until the next pass is
 * complete): the owner's reduce then writes the average straight into its
 * shard (an out-of-place reduce, pg/internal.h), so the average is neither
 * written into the bucket nor read back from it.  The same numbers, 0 + x
 * being x; on ZeRO-2's 2-rank benchmark model the add was 12-16 ms of a
 * ~200 ms step per rank, on the critical path after backward.  Such a
 * reduce that fails or times out may leave part of the shard written, or
 * (its work abandoned) still write it later: the reducer then refuses every
 * later wait and pass (shard_lost) instead of handing out that shard.
 */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/log.h"
#include "base/timeline.h"
#include "ddp/flat_shard.h"
#include "ddp/reducer_impl.h"
#include "pg/internal.h"
#include "tensor/kernels.h"

/* ==== the pool ============================================================ */

/* A fresh buffer, touched once now (a first touch costs ~10 us per page
 * here, DESIGN.md: better at create than in the middle of backward), or
 * at ddp__scatter_touch when the create asked for an untouched pool. */
static int add_buffer(ddp_reducer_t *r, int touch)
{
    if (r->nbufs == r->bufs_cap) {
        int cap = r->bufs_cap ? 2 * r->bufs_cap : 4;
        float **b = realloc(r->bufs, (size_t)cap * sizeof *b);
        unsigned char *busy = b ? realloc(r->buf_busy, (size_t)cap) : NULL;
        if (b)
            r->bufs = b;
        DDP_FAIL_IF(!b || !busy, DDP_ERR_NOMEM, "%s: out of memory for the buffer pool", r->who);
        r->buf_busy = busy;
        r->bufs_cap = cap;
    }
    float *buf = ddp__alloc_aligned((r->buf_count + 1) * sizeof *buf);
    DDP_FAIL_IF(!buf, DDP_ERR_NOMEM, "%s: out of memory for a %zu-float bucket buffer", r->who,
                r->buf_count);
    if (touch)
        memset(buf, 0, (r->buf_count + 1) * sizeof *buf);
    r->bufs[r->nbufs] = buf;
    r->buf_busy[r->nbufs] = 0;
    r->nbufs++;
    return 0;
}

int ddp__scatter_init(ddp_reducer_t *r)
{
    const ddp__bucket_layout *l = &r->layout;
    size_t nb = (size_t)l->nbuckets + 1;
    r->nshards = ddp_pg_size(r->pg);
    r->my_shard = ddp_pg_rank(r->pg);
    DDP_TRY(ddp_reducer_shard_bounds(r, r->my_shard, &r->shard_begin, &r->shard_count));
    r->shard_size = ddp__flat_shard_size(r->total, r->nshards);
    r->shard_grad = ddp__alloc_aligned((r->shard_count + 1) * sizeof *r->shard_grad);
    r->bucket_flat = calloc(nb, sizeof *r->bucket_flat);
    r->bucket_buf = malloc(nb * sizeof *r->bucket_buf);
    r->bucket_state = calloc(nb, 1);
    r->owner_works = calloc(nb, sizeof *r->owner_works);
    r->inflight = calloc(nb, sizeof *r->inflight);
    r->bucket_into = calloc(nb, 1);
    DDP_FAIL_IF(!r->shard_grad || !r->bucket_flat || !r->bucket_buf || !r->bucket_state ||
                    !r->owner_works || !r->inflight || !r->bucket_into,
                DDP_ERR_NOMEM, "%s: out of memory", r->who);
    if (!r->untouched) {
        memset(r->shard_grad, 0, (r->shard_count + 1) * sizeof *r->shard_grad);
        r->shard_clean = 1;
    }
    for (int b = 0; b < l->nbuckets; b++) {
        r->bucket_buf[b] = -1;
        r->bucket_flat[b] = r->total;
        r->owner_works[b] = calloc((size_t)r->nshards, sizeof **r->owner_works);
        DDP_FAIL_IF(!r->owner_works[b], DDP_ERR_NOMEM, "%s: out of memory", r->who);
        if (l->bucket_numel[b] > r->buf_count)
            r->buf_count = l->bucket_numel[b];
    }
    /* Fill order is reverse region order and never rebuilt: each bucket is
     * one contiguous slice of the flat space, starting at its lowest region. */
    for (int i = 0; i < r->nregions; i++) {
        int b = l->bucket_of[i];
        if (r->flat_offset[i] < r->bucket_flat[b])
            r->bucket_flat[b] = r->flat_offset[i];
    }
    for (int k = 0; k < r->opts.pool_buffers; k++)
        DDP_TRY(add_buffer(r, !r->untouched));
    r->stats.pool_buffers = r->opts.pool_buffers;
    r->stats.buffer_count = r->buf_count;
    return 0;
}

void ddp__scatter_touch(ddp_reducer_t *r)
{
    if (!r || !r->untouched || !r->shard_grad)
        return;
    memset(r->shard_grad, 0, (r->shard_count + 1) * sizeof *r->shard_grad);
    for (int k = 0; k < r->nbufs; k++)
        memset(r->bufs[k], 0, (r->buf_count + 1) * sizeof *r->bufs[k]);
    r->untouched = 0;
    r->shard_clean = 1;
}

void ddp__scatter_shard_zeroed(ddp_reducer_t *r)
{
    if (r && r->opts.mode == DDP_REDUCER_SCATTER)
        r->shard_clean = 1;
}

void ddp__scatter_free(ddp_reducer_t *r)
{
    if (r->owner_works) {
        ddp__scatter_wait_all(r);
        for (int b = 0; b < r->layout.nbuckets; b++)
            free(r->owner_works[b]);
    }
    for (int k = 0; k < r->nbufs; k++)
        ddp__free_aligned(r->bufs[k]);
    free(r->bufs);
    free(r->buf_busy);
    ddp__free_aligned(r->shard_grad);
    free(r->bucket_flat);
    free(r->bucket_buf);
    free(r->bucket_state);
    free(r->owner_works);
    free(r->inflight);
    free(r->bucket_into);
}

/* ==== one bucket ========================================================== */

/* The flat range [lo, hi) that bucket b shares with shard s (lo == hi:
 * none). */
static void overlap(const ddp_reducer_t *r, int b, int s, size_t *lo, size_t *hi)
{
    size_t b0 = r->bucket_flat[b], b1 = b0 + r->layout.bucket_numel[b];
    size_t s0 = r->shard_size * (size_t)s, s1 = s0 + r->shard_size;
    *lo = b0 > s0 ? b0 : s0;
    *hi = b1 < s1 ? b1 : s1;
    if (*hi < *lo)
        *hi = *lo;
}

/* Waits for bucket b's reduces, adds this rank's part into the shard (when
 * it was not reduced there) and gives its buffer back.  A buffer whose
 * reduce did not complete (a timeout: the communication thread may still
 * write it) is never reused; a shard that such a reduce wrote into is
 * lost. */
static int complete(ddp_reducer_t *r, int b)
{
    int rc = 0, done = 1;
    for (int s = 0; s < r->nshards; s++) {
        ddp_work_t *w = r->owner_works[b][s];
        if (!w)
            continue;
        int x = ddp_work_wait(w, ddp_pg_timeout(r->pg));
        int fin = 0;
        ddp_work_test(w, &fin);
        done &= fin;
        ddp_work_destroy(w);
        r->owner_works[b][s] = NULL;
        if (x < 0 && rc == 0)
            rc = x;
    }
    int k = r->bucket_buf[b];
    if (rc == 0 && !r->bucket_into[b]) {
        size_t lo, hi;
        overlap(r, b, r->my_shard, &lo, &hi);
        ddp__vec_acc_to(r->shard_grad + (lo - r->shard_begin),
                        r->bufs[k] + (lo - r->bucket_flat[b]), hi - lo, 1);
    }
    if (rc == 0)
        r->stats.buckets_reduced++;
    if (r->bucket_into[b] && (rc < 0 || !done))
        r->shard_lost = 1;
    r->bucket_into[b] = 0;
    if (done)
        r->buf_busy[k] = 0;
    r->bucket_buf[b] = -1;
    r->bucket_state[b] = DDP__BUF_NONE;
    r->stats.buffers_in_use--;
    return rc;
}

/* The oldest launched bucket, completed (the pool is empty). */
static int complete_oldest(ddp_reducer_t *r)
{
    int b = r->inflight[0];
    r->ninflight--;
    memmove(r->inflight, r->inflight + 1, (size_t)r->ninflight * sizeof *r->inflight);
    uint64_t t0 = ddp__tl_begin();
    int rc = complete(r, b);
    ddp__tl_end(t0, "pool wait", "bucket", b);
    return rc;
}

static int free_buffer(const ddp_reducer_t *r)
{
    for (int k = 0; k < r->nbufs; k++)
        if (!r->buf_busy[k])
            return k;
    return -1;
}

/* Gives bucket b a zeroed buffer: a free one, else the one the oldest
 * launched bucket frees, else (every buffer held by a bucket that cannot
 * launch yet: waiting would never end) one more beyond the pool. */
static int acquire(ddp_reducer_t *r, int b)
{
    int k;
    while ((k = free_buffer(r)) < 0 && r->ninflight > 0) {
        r->stats.pool_waits++;
        DDP_TRY(complete_oldest(r));
    }
    if (k < 0) {
        DDP_TRY(add_buffer(r, 1));
        k = r->nbufs - 1;
        r->stats.overflow_buffers++;
        if (!r->warned_overflow) {
            r->warned_overflow = 1;
            DDP_WARN("%s: every one of the %d pool buffers is held by a bucket not complete yet "
                     "(a region written long before it is ready, e.g. a shared weight); taking "
                     "one more buffer (%zu floats) instead of waiting",
                     r->who, r->opts.pool_buffers, r->buf_count);
        }
    }
    r->buf_busy[k] = 1;
    r->bucket_buf[b] = k;
    r->bucket_state[b] = DDP__BUF_FILLING;
    memset(r->bufs[k], 0, r->layout.bucket_numel[b] * sizeof(float));
    if (++r->stats.buffers_in_use > r->stats.buffers_in_use_max)
        r->stats.buffers_in_use_max = r->stats.buffers_in_use;
    return 0;
}

/* The refusal once a reduce into the shard failed or was abandoned. */
static int shard_lost_error(const ddp_reducer_t *r)
{
    return DDP_ERROR(DDP_ERR_STATE,
                     "%s: a reduction into this rank's gradient shard failed or did not "
                     "finish (an earlier error or timeout): the shard may be partly "
                     "written, or still be written; destroy the reducer",
                     r->who);
}

int ddp__scatter_ensure_buffer(ddp_reducer_t *r, int b)
{
    if (r->shard_lost) /* no new pass over a shard that may still change */
        return shard_lost_error(r);
    return r->bucket_buf[b] >= 0 ? 0 : acquire(r, b);
}

int ddp__scatter_grad_buffer(ddp_reducer_t *r, int i, float **grad)
{
    int b = r->layout.bucket_of[i];
    DDP_TRY(ddp__scatter_ensure_buffer(r, b));
    *grad = r->bufs[r->bucket_buf[b]] + (r->flat_offset[i] - r->bucket_flat[b]);
    return 0;
}

/* Phase 1 of ZeRO-2's step, per bucket: reduce each overlapped shard's part
 * to its owner, averaged, asynchronously. */
int ddp__scatter_launch(ddp_reducer_t *r, int b)
{
    DDP_TRY(ddp__scatter_ensure_buffer(r, b));
    float *buf = r->bufs[r->bucket_buf[b]];
    uint64_t t0 = ddp__tl_begin();
    r->bucket_state[b] = DDP__BUF_INFLIGHT;
    r->inflight[r->ninflight++] = b;
    for (int s = 0; s < r->nshards; s++) {
        size_t lo, hi;
        overlap(r, b, s, &lo, &hi);
        if (hi == lo)
            continue;
        float *part = buf + (lo - r->bucket_flat[b]);
        /* This rank's own part, into a zero shard: the average goes
         * straight there (a local choice: the others reduce in place). */
        int into = s == r->my_shard && r->shard_clean;
        float *out = into ? r->shard_grad + (lo - r->shard_begin) : part;
        DDP_TRY(ddp__pg_reduce_into_async(r->pg, part, out, hi - lo, DDP_FLOAT32, DDP_AVG, s,
                                          &r->owner_works[b][s]));
        if (into)
            r->bucket_into[b] = 1;
    }
    ddp__tl_end(t0, "bucket reduce-scatter launch", "bucket", b);
    return 0;
}

int ddp__scatter_wait_all(ddp_reducer_t *r)
{
    if (!r->bucket_state)
        return 0; /* a create that failed before the pool was made */
    int rc = 0;
    char first_msg[1024] = "";
    while (r->ninflight > 0) {
        int x = complete_oldest(r);
        if (x < 0 && rc == 0) {
            rc = x;
            snprintf(first_msg, sizeof first_msg, "%s", ddp_last_error());
        }
    }
    r->shard_clean = 0; /* the pass is over: the next one adds, until a zero_grad */
    if (r->shard_lost && rc == 0)
        rc = shard_lost_error(r);
    for (int b = 0; b < r->layout.nbuckets; b++) /* filled but never launched (a failure) */
        if (r->bucket_state[b] == DDP__BUF_FILLING) {
            r->buf_busy[r->bucket_buf[b]] = 0;
            r->bucket_buf[b] = -1;
            r->bucket_state[b] = DDP__BUF_NONE;
            r->stats.buffers_in_use--;
        }
    if (rc < 0)
        ddp__error_restore(first_msg);
    return rc;
}

int ddp_reducer_shard_grad(ddp_reducer_t *r, float **grad, size_t *begin, size_t *count)
{
    DDP_FAIL_IF(!r || !grad, DDP_ERR_INVALID_ARG, "ddp_reducer_shard_grad: NULL argument");
    DDP_FAIL_IF(r->opts.mode != DDP_REDUCER_SCATTER, DDP_ERR_INVALID_ARG,
                "%s: ddp_reducer_shard_grad is for reduce-scatter mode (opts.mode = "
                "DDP_REDUCER_SCATTER); in all-reduce mode every region holds its average",
                r->who);
    *grad = r->shard_grad;
    if (begin)
        *begin = r->shard_begin;
    if (count)
        *count = r->shard_count;
    return 0;
}
