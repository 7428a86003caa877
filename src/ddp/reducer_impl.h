/* Private state of the reducer (include/ddp/reducer.h), the one gradient
 * engine of libddp, shared by its files:
 *   reducer.c          state and construction: options, regions, create and
 *                      destroy, the bucket layout and its one-time rebuild,
 *                      introspection;
 *   reducer_step.c     an iteration: mark ready, each bucket's launch
 *                      (built-in and user comm hooks), the deferred last
 *                      bucket, the tail pieces, the wait;
 *   reducer_scatter.c  reduce-scatter mode (ZeRO-2): shards, the pool of
 *                      bucket buffers, per-owner reduces;
 *   agree.c            the cross-rank agreement check at creation;
 *   join.c             join for uneven inputs;
 *   debug.c            DDP_DEBUG reports.
 * DistributedDataParallel (wrapper.h) creates one through
 * ddp__reducer_create, with its own words and options line.  Design and
 * costs: docs/ddp.md. */
#ifndef DDP_REDUCER_IMPL_H
#define DDP_REDUCER_IMPL_H

#include "ddp/reducer.h"
#include "ddp/bucket.h"

#define DDP_MIB (1024.0 * 1024.0)

/* Called after every layout change (create, rebuild) with the reducer's
 * user: DDP re-points its parameters' gradients and re-plans its pieces. */
typedef int (*ddp__reducer_relayout_fn)(ddp_reducer_t *r, void *user);

/* How the reducer speaks in messages and what it checks: the public
 * reducer says "reducer" and "region", DDP says "DDP" and "parameter" and
 * adds its own options (tail chunks) and shapes to the agreement check. */
typedef struct ddp__reducer_words {
    const char *who;          /* "reducer", "DDP": message prefix */
    const char *noun;         /* "region", "parameter" */
    const char *options_desc; /* the options line every rank must share (copied) */
    const char *const *entry_desc; /* (nregions) "name (shape)" per region, or NULL: "name (count)" */
    const char *unused_hint;  /* appended to the unused-regions error */
    /* Scatter mode: the pool and the shard are allocated at create but not
     * touched (zeroed) until ddp__scatter_touch, so that a caller can hand
     * memory back between the two (ZeRO-2: the model's gradient block only
     * once nothing can fail any more, without the two adding up). */
    int untouched_pool;
} ddp__reducer_words;

/* Scatter mode's per-bucket state. */
enum { DDP__BUF_NONE = 0, DDP__BUF_FILLING, DDP__BUF_INFLIGHT };

struct ddp_reducer {
    ddp_pg_t *pg; /* a reference held (ddp__pg_retain): teardown in any order */
    ddp_reducer_options opts;
    char who[16], noun[16];
    char *options_desc;
    char **entry_desc;            /* (nregions) or NULL */
    char *unused_hint;
    int nregions;
    char **names;                 /* (nregions) */
    size_t *numel;                /* (nregions) */
    float **user_grad;            /* (nregions) caller-owned memory, or NULL */
    int ncopied;                  /* regions with caller-owned memory */
    size_t *flat_offset;          /* (nregions) place in the flat space (region order) */
    size_t total;                 /* floats in the flat space */
    ddp__bucket_layout layout;
    ddp__bucket_tracker tracker;
    float *grads;                 /* (layout.total_numel) the bucket memory (all-reduce mode) */
    uint16_t *half;               /* (layout.total_numel) fp16/bf16 hook scratch */
    ddp_work_t **works;           /* (nbuckets) reductions in flight */
    unsigned char *launched;      /* (nbuckets) launched this iteration, not yet waited */
    int *order;                   /* (nregions) fill order of the current layout */
    int *ready_order;             /* (nregions) used regions in ready order */
    int nready;
    int marked;                   /* something was marked in this iteration */
    int no_sync;
    int rebuilt;
    ddp_comm_hook user_hook;
    int has_user_hook;
    int join_enabled, join_throw;
    int deferred;                 /* [defer_start, +defer_count) waits for wait */
    size_t defer_start, defer_count;
    int no_defer;                 /* DDP_NO_DEFER=1: launch it like the others (to measure) */
    ddp__reducer_relayout_fn relayout;
    void *relayout_user;
    /* Tail pieces (DDP's tail_chunks; the plan is DDP's, tail.c): the last
     * bucket is reduced as npieces consecutive pieces, the same on every
     * rank in every iteration, launched one by one as DDP's chunk hook says
     * (live) or all at once when the bucket completes otherwise. */
    int npieces;                  /* 0: the last bucket is reduced whole */
    size_t *piece_end;            /* (npieces) element offsets in grads */
    ddp_work_t **piece_works;     /* (npieces) */
    int pieces_launched;
    int pieces_live;
    uint64_t *tl_launch;          /* (tl_nlaunch) timeline: each bucket's launch time */
    int tl_nlaunch;
    unsigned long long debug_iter; /* DDP_DEBUG=detail: iterations so far, the last report */
    char *debug_last;
    /* ---- scatter mode (reducer_scatter.c) ---- */
    int nshards, my_shard;
    size_t shard_size, shard_begin, shard_count;
    float *shard_grad;            /* (shard_count) accumulated averages */
    size_t *bucket_flat;          /* (nbuckets) first flat element of each bucket */
    int *bucket_buf;              /* (nbuckets) pool buffer held, -1: none */
    unsigned char *bucket_state;  /* (nbuckets) DDP__BUF_* */
    ddp_work_t ***owner_works;    /* (nbuckets) (nshards) per-owner reduces in flight */
    int nbufs, bufs_cap;          /* buffers made (pool + overflow), their array's size */
    float **bufs;                 /* (nbufs) */
    unsigned char *buf_busy;      /* (nbufs) */
    size_t buf_count;             /* floats per buffer */
    int *inflight;                /* (nbuckets) launched buckets holding buffers, oldest first */
    int ninflight;
    ddp_reducer_stats stats;
    int warned_overflow;
    int untouched;                /* the pool and shard not zeroed yet (ddp__scatter_touch) */
    int shard_clean;              /* the shard is zero and nothing was added since: the
                                   * next pass reduces straight into it */
    unsigned char *bucket_into;   /* (nbuckets) this rank's part reduced into the shard */
    int shard_lost;               /* such a reduce failed or was abandoned: waits fail */
};

/* ---- reducer.c ----------------------------------------------------------- */
/* The create behind ddp_reducer_create and DDP's: words say how to speak
 * and what to check (NULL: the public reducer's). */
int ddp__reducer_create(ddp_pg_t *pg, const ddp_grad_region *regions, int nregions,
                        const ddp_reducer_options *opts, const ddp__reducer_words *words,
                        ddp__reducer_relayout_fn relayout, void *relayout_user,
                        ddp_reducer_t **out);
/* Options' ranges (the message names who). */
int ddp__reducer_check_options(const ddp_reducer_options *o, const char *who);
/* PyTorch rebuilds once, and not when unused regions are searched for. */
int ddp__reducer_rebuild_due(const ddp_reducer_t *r);
/* Rebuilds the buckets from rank 0's ready order (collective). */
int ddp__reducer_rebuild_buckets(ddp_reducer_t *r);

/* ---- reducer_step.c ------------------------------------------------------ */
/* Starts an iteration (wait does it too). */
void ddp__reducer_reset(ddp_reducer_t *r);
int ddp__reducer_launch_bucket(ddp_reducer_t *r, int b);
int ddp__reducer_use_pieces(const ddp_reducer_t *r, int b);
/* Launches pieces [pieces_launched, upto) of the last bucket. */
int ddp__reducer_launch_pieces(ddp_reducer_t *r, int upto);
/* Sets the last bucket's pieces (ends in bucket-memory elements, n >= 2;
 * n 0 clears them). */
int ddp__reducer_set_pieces(ddp_reducer_t *r, const size_t *ends, int n);
int ddp__reducer_reduce_deferred(ddp_reducer_t *r);
/* Waits for every launched bucket and piece (with finish: runs the hooks'
 * finish steps); leaves nothing in flight; the first failure wins. */
int ddp__reducer_wait_buckets(ddp_reducer_t *r, int finish);

/* ---- reducer_scatter.c --------------------------------------------------- */
int ddp__scatter_init(ddp_reducer_t *r);
void ddp__scatter_free(ddp_reducer_t *r);
/* Zeroes (first touch) the pool and the shard of a reducer created with
 * untouched_pool; a no-op otherwise and the second time. */
void ddp__scatter_touch(ddp_reducer_t *r);
/* The shard was just zeroed by someone else (a zero_grad of the model whose
 * gradients view it: ZeRO-2's hook): as after ddp_reducer_zero_grad. */
void ddp__scatter_shard_zeroed(ddp_reducer_t *r);
int ddp__scatter_grad_buffer(ddp_reducer_t *r, int i, float **grad);
int ddp__scatter_launch(ddp_reducer_t *r, int b);
/* Waits for every launched bucket, adds this rank's parts into the shard
 * (those not reduced straight into it), returns the buffers; the first
 * failure wins. */
int ddp__scatter_wait_all(ddp_reducer_t *r);
/* Shadow iteration / unmarked buckets: a bucket that never took a buffer. */
int ddp__scatter_ensure_buffer(ddp_reducer_t *r, int b);

/* ---- agree.c ------------------------------------------------------------- */
/* Every rank checks that all ranks have rank 0's options line and region
 * entries (collective); DDP_ERR_MISMATCH names the first difference. */
int ddp__reducer_check_same(ddp_reducer_t *r);

/* ---- debug.c (DDP_DEBUG) ------------------------------------------------- */
void ddp__reducer_debug_layout(const ddp_reducer_t *r);
void ddp__reducer_debug_iteration(ddp_reducer_t *r);

#endif
