/* libddp reducer: DistributedDataParallel's gradient engine for any
 * gradients, for programs with their own forward and backward (llm.c's
 * style) that want DDP's buckets, overlap and agreement checks without
 * libddp's models.  DistributedDataParallel (ddp.h) is a thin layer on it.
 *
 *     ddp_grad_region regs[] = {{"wte", NULL, V * C}, {"fc.w", NULL, C * 4 * C}, ...};
 *     ddp_reducer_t *r;
 *     ddp_reducer_create(pg, regs, n, NULL, &r);         // collective: checks every rank agrees
 *     for each batch:
 *         forward(...);
 *         for each layer, last to first:
 *             float *d; ddp_reducer_grad_buffer(r, i, &d); // where region i's gradient lives
 *             layer_backward(d, ...);                      // d += ... (accumulates)
 *             ddp_reducer_mark_ready(r, i);                // final: its bucket may launch
 *         ddp_reducer_wait(r);                             // every gradient averaged
 *         sgd_step(params, ddp_reducer_grad(r, i), ...);
 *         ddp_reducer_zero_grad(r);
 *     ddp_reducer_destroy(r);
 *
 * Regions.  A region is one named gradient tensor of `count` floats.  Its
 * memory is either the reducer's (grad NULL in ddp_grad_region: it lives in
 * the bucket memory, gradient_as_bucket_view, no copy at all) or the
 * caller's (grad set: the caller writes there, and the reducer COPIES it into
 * the bucket memory when the region is marked ready and copies the average
 * back at wait: one memcpy each way per step; the reducer never re-points
 * memory it does not own; reduce-scatter mode takes reducer-owned regions
 * only).  A reducer-owned region moves once, when the
 * buckets are rebuilt (at the end of the first synchronised wait): ask
 * ddp_reducer_grad / ddp_reducer_grad_buffer again after a wait rather than
 * keeping the pointer across the first one.
 *
 * Buckets, as DDP's (docs/ddp.md): regions in reverse order, a small first
 * bucket (first_bucket_cap_mb) then bucket_cap_mb each; after the first
 * synchronised iteration the buckets are rebuilt once in the order regions
 * became ready on rank 0, every rank adopting that layout.  A bucket's
 * reduction is launched asynchronously on the process group's communication
 * thread the moment it and every bucket before it are complete (the same
 * order on every rank); the last one is reduced on the caller's thread in
 * wait (nothing is left to overlap it with).
 *
 * Iterations.  An iteration starts at create and after every wait; each
 * region is marked ready at most once per iteration.  wait must follow every
 * iteration in which anything was marked (peers wait for this rank's
 * buckets).  Regions not marked by wait: with find_unused they count as ready
 * (their current gradient, normally zero, is averaged); without it the
 * reduction still completes on every rank and wait then fails with
 * DDP_ERR_STATE naming them.  A failed collective (a dead peer, a timeout:
 * at most the group's timeout) fails wait with the group's message; nothing
 * is left in flight.
 *
 * REDUCE-SCATTER MODE (ZeRO-2, opts.mode = DDP_REDUCER_SCATTER).  The
 * regions' flat gradient space [0, total) is the regions one after the other
 * in the order given; it is partitioned as ZeRO's flat partition: shard s is
 * [s*S, min((s+1)*S, total)) with S = ceil(total / world_size)
 * (ddp_reducer_shard_bounds).  Each bucket is a contiguous slice of that
 * space (reverse region order, never rebuilt) and is reduced to the owners
 * of the shards it overlaps the moment it is complete (one reduce per owner,
 * as DeepSpeed's stage 2 average_tensor); after wait this rank holds the
 * AVERAGED gradient of its own shard in a reducer-owned contiguous array
 * (ddp_reducer_shard_grad).  Memory is the point: gradients are written into
 * a pool of `pool_buffers` bucket buffers (ddp_reducer_grad_buffer hands one
 * out when a bucket's first region asks for it, zeroed), and a buffer goes
 * back to the pool once its bucket's reduction is done; when the pool is
 * empty, the oldest launched bucket is waited for (within the group's
 * timeout).  Full-size gradients are never all alive: peak gradient memory
 * is pool_buffers * the largest bucket + the shard.
 *   When it is safe: each region is written only between its
 *   ddp_reducer_grad_buffer and its mark_ready in one iteration, and written
 *   regions become ready in roughly reverse order (a bucket's buffer is held
 *   from its first region's request until its reduction is done).  That is
 *   backward's normal order, and what the grad-write hook of ext.h gives for
 *   a model (each parameter is written once per backward, just before it
 *   starts accumulating, and ready when done).  A region written early and
 *   ready late (a shared weight: its last use in forward is its first
 *   gradient write) keeps its bucket's buffer; if every buffer is held by a
 *   bucket that cannot launch yet, waiting would deadlock, so the reducer
 *   takes one more buffer beyond the pool instead (counted in
 *   ddp_reducer_stats.overflow_buffers, warned once): more memory, never a
 *   wrong gradient.  Asking for a region's buffer after marking it ready
 *   fails with DDP_ERR_STATE (its bucket may be reduced already).
 *   Accumulation: each wait ADDS its averaged shard into the shard array
 *   (as backward adds into p->grad); ddp_reducer_zero_grad clears it.  The
 *   first pass after a zero_grad writes the averages into the shard
 *   instead (the same numbers, one pass over the shard less): write the
 *   shard only through the reducer between a zero_grad and the next wait.
 *   There is no no_sync in this mode (it would need the full gradients
 *   alive; ddp_reducer_set_no_sync fails saying so): every backward reduces, and
 *   the shard accumulates the average of the sums, the same numbers.  Comm
 *   hooks and join are all-reduce-mode only (create / enable fail saying
 *   so).
 *
 *   A region is never split across buckets, so the largest bucket is at
 *   least the largest region: when one region dominates, pool_buffers 1
 *   saves the most (docs/ddp.md has the figures).
 *
 * With a libddp model, DDP does all of this for you:
 * ddp_data_parallel_options.reduce_scatter = 1 (ddp.h) makes its reducer's
 * regions the model's parameters in registration order (so the flat space
 * is the model's parameter block), points each parameter's gradient at its
 * pool buffer from nn's grad-write hook (ext.h rule 8), marks it ready from
 * the grad-ready hook, and hands out the shard (ddp_data_parallel_shard_grad).
 *
 * Threading: a reducer belongs to one thread; the process group's
 * communication thread does the reductions.
 */
#ifndef DDP_REDUCER_H
#define DDP_REDUCER_H

#include "ddp/base.h"
#include "ddp/pg.h"
#include "ddp/ddp.h" /* ddp_comm_hook, ddp_comm_hook_kind */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddp_reducer ddp_reducer_t;

/* One gradient region.  name: copied (used in errors and the agreement
 * check, so give each region a distinct name); grad: count floats of the
 * caller's (borrowed; it must outlive the reducer), or NULL for memory the
 * reducer owns (zeroed at create). */
typedef struct ddp_grad_region {
    const char *name;
    float *grad;
    size_t count;
} ddp_grad_region;

typedef enum ddp_reducer_mode {
    DDP_REDUCER_ALLREDUCE = 0, /* every rank gets every averaged gradient (DDP) */
    DDP_REDUCER_SCATTER = 1,   /* every rank gets the averaged gradient of its shard (ZeRO-2) */
} ddp_reducer_mode;

typedef struct ddp_reducer_options {
    double bucket_cap_mb;       /* 25: cap of every bucket after the first */
    double first_bucket_cap_mb; /* 1: PyTorch's smaller first bucket */
    int find_unused;            /* 0: regions not marked by wait are an error */
    int rebuild_buckets;        /* 1: re-bucket once from rank 0's ready order (all-reduce mode) */
    ddp_comm_hook_kind comm_hook; /* all-reduce mode only */
    ddp_reducer_mode mode;
    int pool_buffers;           /* scatter mode: bucket buffers in the pool (default 2, >= 1) */
} ddp_reducer_options;

/* DDP's defaults (all-reduce mode). */
DDP_API ddp_reducer_options ddp_reducer_defaults(void);

/* Makes a reducer over nregions regions (copied) for the group pg, which
 * it holds a reference on (teardown in either order, as DDP).  Collective:
 * every rank checks that all ranks have the same options and the same
 * regions (count, names, sizes, in order): if not, every rank fails with
 * DDP_ERR_MISMATCH naming the first difference ("reducer: rank 1 differs
 * from rank 0: region 2 is fc.w (4096) on rank 1 but fc.w (8192) on rank
 * 0").  opts NULL: defaults.  Caller destroys. */
DDP_API int ddp_reducer_create(ddp_pg_t *pg, const ddp_grad_region *regions, int nregions,
                               const ddp_reducer_options *opts, ddp_reducer_t **out);
/* Waits for any reduction still in flight (at most the group's timeout),
 * frees the reducer's memory and releases the group.  NULL: no-op. */
DDP_API void ddp_reducer_destroy(ddp_reducer_t *r);

DDP_API int ddp_reducer_num_regions(const ddp_reducer_t *r);
/* Region i's gradient as the reducer sees it now: the caller's memory, or
 * (reducer-owned) its place in the bucket memory, valid until the next
 * wait (the one rebuild moves it).  Scatter mode: the region's slice of its
 * bucket's pool buffer while the bucket holds one, else NULL.  NULL for a
 * bad index. */
DDP_API float *ddp_reducer_grad(ddp_reducer_t *r, int i);
/* Where region i's gradient is to be written in this iteration (before any
 * write to it): ddp_reducer_grad's pointer in all-reduce mode; in scatter
 * mode a slice of a pool buffer (zeroed when its bucket took it; may wait
 * for a buffer, within the group's timeout).  DDP_ERR_STATE after region i
 * was marked ready in this iteration. */
DDP_API int ddp_reducer_grad_buffer(ddp_reducer_t *r, int i, float **grad);
/* Region i's gradient is final for this iteration: its bucket is launched
 * once it and every bucket before it are complete.  A caller-owned region
 * is copied into the bucket memory now (do not write it again before
 * wait).  DDP_ERR_STATE when marked twice in one iteration; inside no_sync,
 * nothing happens. */
DDP_API int ddp_reducer_mark_ready(ddp_reducer_t *r, int i);
/* Region i takes no part in this iteration's backward: with find_unused it
 * counts as ready now (so its bucket need not wait for wait); without, a
 * no-op (wait names it). */
DDP_API int ddp_reducer_mark_unused(ddp_reducer_t *r, int i);
/* Ends the iteration: launches what is left, waits for every bucket, runs
 * the hooks' finish steps, copies caller-owned regions back, rebuilds the
 * buckets once when due (collective), and fails as the top of this file
 * says for unmarked regions or a failed collective.  Inside no_sync: 0,
 * nothing to wait for (the gradients accumulate locally). */
DDP_API int ddp_reducer_wait(ddp_reducer_t *r);
/* Zeroes every region's gradient (scatter mode: the shard array). */
DDP_API void ddp_reducer_zero_grad(ddp_reducer_t *r);

/* PyTorch's no_sync: 1 to accumulate locally without reducing, 0 to resume
 * (the next synchronised wait reduces the sum).  DDP_ERR_INVALID_ARG in
 * scatter mode. */
DDP_API int ddp_reducer_set_no_sync(ddp_reducer_t *r, int no_sync);
/* Replaces the communication hook (ddp.h's ddp_comm_hook; NULL: back to
 * opts.comm_hook).  All-reduce mode only. */
DDP_API int ddp_reducer_register_comm_hook(ddp_reducer_t *r, const ddp_comm_hook *hook);

/* Join for uneven inputs (ddp.h's ddp_data_parallel_join, for regions):
 * with join enabled on every rank, each iteration starts with
 * ddp_reducer_join_step (the "still training" all-reduce; fails every rank
 * with throw_on_early_termination once one ran out).  A rank out of data
 * calls ddp_reducer_join: it shadows the others' synchronised iterations
 * with zero gradients until all have joined, then broadcasts params (n
 * floats, may be NULL with n 0) from the last rank to train, so that every
 * replica ends identical.  All-reduce mode only. */
DDP_API int ddp_reducer_join_enable(ddp_reducer_t *r, int enable, int throw_on_early_termination);
DDP_API int ddp_reducer_join_step(ddp_reducer_t *r);
DDP_API int ddp_reducer_join(ddp_reducer_t *r, float *params, size_t n);

/* Introspection: buckets, bucket b's region count and size in floats,
 * whether the buckets were rebuilt. */
DDP_API int ddp_reducer_num_buckets(const ddp_reducer_t *r);
DDP_API int ddp_reducer_bucket_info(const ddp_reducer_t *r, int b, int *nregions, size_t *count);
DDP_API int ddp_reducer_buckets_rebuilt(const ddp_reducer_t *r);
/* The k-th region of bucket b in the bucket's memory order (0 <= k <
 * its region count): *region its index, *offset where it starts, in floats
 * from the bucket's first element (what a comm hook's data pointer points
 * at; e.g. PowerSGD's layout, powersgd.h).  Valid until the next wait (the
 * rebuild). */
DDP_API int ddp_reducer_bucket_region(const ddp_reducer_t *r, int b, int k, int *region,
                                      size_t *offset);

/* ---- reduce-scatter mode (ZeRO-2) ---------------------------------------- */

/* Region i's place in the flat gradient space: [*offset, *offset + count). */
DDP_API int ddp_reducer_region_offset(const ddp_reducer_t *r, int i, size_t *offset);
/* Total floats of the flat space, and shard s's bounds in it (ZeRO's flat
 * partition, above; a shard may be empty at the end).  Any mode. */
DDP_API size_t ddp_reducer_total_count(const ddp_reducer_t *r);
DDP_API int ddp_reducer_shard_bounds(const ddp_reducer_t *r, int shard, size_t *begin,
                                     size_t *count);
/* Scatter mode: this rank's shard of the averaged gradient (count floats
 * for flat [begin, begin + count), borrowed from the reducer, valid until
 * destroy), accumulated over waits since the last zero_grad.
 * DDP_ERR_INVALID_ARG in all-reduce mode. */
DDP_API int ddp_reducer_shard_grad(ddp_reducer_t *r, float **grad, size_t *begin, size_t *count);

/* The pool's and the buckets' counters (ddp_reducer_pool_stats). */
typedef struct ddp_reducer_stats {
    int pool_buffers;           /* scatter mode: buffers in the pool */
    size_t buffer_count;        /* floats per pool buffer (the largest bucket) */
    int buffers_in_use;         /* now */
    int buffers_in_use_max;     /* the most held at once since create */
    int overflow_buffers;       /* taken beyond the pool (regions written early, above) */
    uint64_t pool_waits;        /* times an empty pool waited for a bucket's reduction */
    uint64_t buckets_reduced;   /* bucket reductions completed since create */
} ddp_reducer_stats;
DDP_API int ddp_reducer_pool_stats(const ddp_reducer_t *r, ddp_reducer_stats *out);

#ifdef __cplusplus
}
#endif
#endif
