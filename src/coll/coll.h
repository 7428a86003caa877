/* Collective algorithms over the transport interface (gloo's algorithm
 * files, MPICH's coll/): one algorithm per file, a dispatcher in coll.c
 * that picks one by size, group size and DDP_*_ALGO overrides.  Nothing
 * here knows about sockets (STYLE.md rule 10).
 *
 * Every algorithm runs to completion on the calling thread (the group's
 * executor), waits at most until ctx->deadline, and tags its messages with
 * the collective's sequence number so that consecutive collectives never
 * mix.  Costs and reduction orders: docs/algorithms.md. */
#ifndef DDP_COLL_COLL_H
#define DDP_COLL_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "coll/reduce.h"
#include "ddp/pg.h"
#include "transport/transport.h"

enum ddp__coll_kind {
    DDP__ALL_REDUCE,
    DDP__BROADCAST,
    DDP__REDUCE,
    DDP__ALL_GATHER,
    DDP__GATHER,
    DDP__SCATTER,
    DDP__REDUCE_SCATTER,
    DDP__ALL_TO_ALL,
    DDP__BARRIER,
    DDP__SEND,
    DDP__RECV,
    DDP__NUM_COLL
};

/* all_reduce algorithms (DDP_ALLREDUCE_ALGO) */
enum {
    DDP__AR_AUTO,
    DDP__AR_RING,
    DDP__AR_RD,
    DDP__AR_DIRECT,
    DDP__AR_SHARED,
    DDP__AR_RABENSEIFNER,
    DDP__AR_TREE
};

/* One operation, as the user issued it. */
typedef struct ddp__coll_args {
    int kind;
    const void *send; /* input (== recv for in-place operations) */
    void *recv;       /* output */
    size_t count;     /* elements (per rank block where the call says so) */
    ddp_dtype dtype;
    ddp_reduce_op op;
    int root;         /* broadcast, reduce, gather, scatter */
    int peer;         /* send, recv */
    int tag;          /* send, recv */
} ddp__coll_args;

/* Per-group state of the algorithms. */
typedef struct ddp__coll_ctx {
    ddp__tp *tp;
    int rank, size;
    uint64_t seq;       /* sequence number of the running collective */
    double deadline;    /* of the running operation */
    uint8_t *scratch;   /* grown on demand, kept: pages are touched once */
    size_t scratch_len;
    int allreduce_algo; /* DDP__AR_*: forced, or AUTO */
    size_t chunk;       /* bytes per pipeline unit (ring, tree) */
    size_t ring_window; /* standalone ring reduce-scatter, n > 2: bytes of units
                         * in flight, which bound its scratch (reduce_scatter_ring.c) */
    size_t direct_max;  /* AUTO: direct all-reduce up to this many bytes (2 ranks) */
    size_t rd_max;      /* AUTO: recursive doubling up to this many bytes */
    size_t rab_max;     /* AUTO, n >= 4 a power of two, no shared window: Rabenseifner
                         * up to this many bytes (then the ring) */
    size_t shared_min;  /* AUTO: shared-window all-reduce from this many bytes */
    int cpus;           /* AUTO: ... and for at most this many ranks (online CPUs) */
    size_t shared_chunk; /* bytes per pipeline chunk of the shared-window all-reduce */
    size_t symmetric_min; /* shared-window all-reduce: in place on symmetric memory from here */
} ddp__coll_ctx;

/* Fills tuning from the environment: DDP_ALLREDUCE_ALGO=ring|rd|direct|shared|rabenseifner|tree|auto,
 * DDP_CHUNK_BYTES, DDP_ALLREDUCE_DIRECT_BYTES, DDP_ALLREDUCE_RD_BYTES,
 * DDP_ALLREDUCE_RAB_BYTES,
 * DDP_ALLREDUCE_SHARED_BYTES, DDP_SHARED_CHUNK_BYTES, DDP_RING_WINDOW_BYTES,
 * DDP_ALLREDUCE_SYMMETRIC_BYTES; checks DDP_REDUCE_ISA
 * (reduce.h).  Sets the error on bad values.  The caller sets c->tp
 * afterwards. */
int ddp__coll_ctx_init(ddp__coll_ctx *c, int rank, int size);
/* The DDP__AR_* of an all-reduce algorithm's name ("auto", "ring", "rd",
 * "direct", "shared", "rabenseifner", "tree"); -1 for anything else. */
int ddp__coll_algo_parse(const char *name);
void ddp__coll_ctx_free(ddp__coll_ctx *c);
/* Checks the arguments of an operation (before it is queued). */
int ddp__coll_check(const ddp__coll_args *a, int rank, int size);
/* Runs one operation; ctx->seq and ctx->deadline set by the caller. */
int ddp__coll_run(ddp__coll_ctx *c, const ddp__coll_args *a);
const char *ddp__coll_name(int kind);

/* A scratch buffer of at least bytes (64-byte aligned), reused across calls. */
int ddp__coll_scratch(ddp__coll_ctx *c, size_t bytes, void **out);

/* Message tags: [63:62] kind (0 collective, 1 point-to-point), [61:28] the
 * collective's sequence number, [27:24] phase, [23:0] index in the phase. */
#define DDP__TAG_P2P ((uint64_t)1 << 62)
static inline uint64_t ddp__tag(const ddp__coll_ctx *c, unsigned phase, uint64_t idx)
{
    return ((c->seq & 0x3ffffffffULL) << 28) | ((uint64_t)(phase & 15) << 24) |
           (idx & 0xffffff);
}

/* Waits for all n requests (or one), failing as soon as any peer of the
 * group dies: every rank takes part in a collective. */
static inline int ddp__coll_wait(ddp__coll_ctx *c, ddp__req *const *reqs, int n)
{
    return ddp__tp_wait(c->tp, reqs, n, c->deadline, DDP__WAIT_ANY_PEER);
}
static inline int ddp__coll_wait1(ddp__coll_ctx *c, ddp__req *r)
{
    return ddp__tp_wait(c->tp, &r, 1, c->deadline, DDP__WAIT_ANY_PEER);
}
/* Waits for the requests of an array whose kind is set (posted ones). */
int ddp__coll_wait_array(ddp__coll_ctx *c, ddp__req *reqs, size_t n);

/* Blocks of a vector: block b is elements [off[b], off[b] + len[b]). */
typedef struct ddp__blocks {
    size_t *off, *len;
} ddp__blocks;
/* count split into size near-equal blocks (the first count % size get one
 * more element); or size blocks of count each. */
int ddp__blocks_split(ddp__blocks *b, size_t count, int size);
int ddp__blocks_equal(ddp__blocks *b, size_t count, int size);
void ddp__blocks_free(ddp__blocks *b);
/* Elements of unit k of block b when blocks are cut into units of S. */
static inline size_t ddp__unit_len(const ddp__blocks *bl, size_t b, size_t k, size_t S)
{
    size_t len = bl->len[b], at = k * S;
    return len > at ? (len - at < S ? len - at : S) : 0;
}

/* ---- algorithms (one file each) ---- */
int ddp__allreduce_ring(ddp__coll_ctx *c, void *buf, size_t count, ddp_dtype dt,
                        ddp_reduce_op op);
int ddp__allreduce_rd(ddp__coll_ctx *c, void *buf, size_t count, ddp_dtype dt,
                      ddp_reduce_op op);
int ddp__allreduce_direct(ddp__coll_ctx *c, void *buf, size_t count, ddp_dtype dt,
                          ddp_reduce_op op);
/* Recursive doubling's fold for n not a power of two, p2 the largest power
 * of two <= n (allreduce_rd.c; Rabenseifner's too): ranks >= p2 send their
 * vector to r - p2 and get the result back (*sat_out = 1: done); ranks
 * < n - p2 fold the partner's in (buf = buf op it, tmp as scratch); then
 * fold_out sends those ranks' result back. */
int ddp__fold_in(ddp__coll_ctx *c, void *buf, void *tmp, size_t count, ddp_dtype dt,
                 ddp__reduce_fn fn, int p2, int *sat_out);
int ddp__fold_out(ddp__coll_ctx *c, const void *buf, size_t bytes, int p2);
/* Reduce-scatter by recursive halving + all-gather by recursive doubling. */
int ddp__allreduce_rabenseifner(ddp__coll_ctx *c, void *buf, size_t count, ddp_dtype dt,
                                ddp_reduce_op op);
/* Pipelined double binary tree: reduce up and broadcast down two trees,
 * each carrying half of the vector (allreduce_tree.c). */
int ddp__allreduce_tree(ddp__coll_ctx *c, void *buf, size_t count, ddp_dtype dt,
                        ddp_reduce_op op);
/* Over the transport's shared window (fails without one, or when
 * ddp__allreduce_shared_slot is 0). */
int ddp__allreduce_shared(ddp__coll_ctx *c, void *buf, size_t count, ddp_dtype dt,
                          ddp_reduce_op op);
/* Reduce to root over the shared window: each rank folds its share of
 * send, the root copies the shares out into recv (send itself in place);
 * send is unchanged (at the root too when recv != send), and only the
 * root's recv is written. */
int ddp__reduce_shared(ddp__coll_ctx *c, const void *send, void *recv, size_t count,
                       ddp_dtype dt, ddp_reduce_op op, int root);
/* Bytes per pipeline slot of the shared-window all-reduce on window w: 0
 * when DDP_SHARED_CHUNK_BYTES or the window is too small for the ranks
 * (auto then runs the ring). */
size_t ddp__allreduce_shared_slot(const ddp__coll_ctx *c, const struct ddp__window *w);
/* Ring reduce-scatter: block b of in (blocks bl) is reduced over all ranks
 * in ring order b+1, b+2, ..., b (mod size); rank r's block lands in out.
 * acc: same layout as in, receives the partial results (in place for
 * all-reduce), or NULL to keep partials in scratch.  hook (may be NULL)
 * lets the all-reduce run the first step of its all-gather inside the
 * reduce-scatter's sequence on the wire (reduce_scatter_ring.c). */
typedef struct ddp__ring_hook {
    /* Unit k of this rank's own block is final (at, len elements): the
     * all-reduce sends it to the next rank at once. */
    int (*final)(void *arg, size_t k, void *at, size_t len);
    /* The previous rank's final unit k comes next on the link: post its
     * receive (into place) now. */
    int (*expect)(void *arg, size_t k);
    void *arg;
} ddp__ring_hook;
int ddp__ring_reduce_scatter(ddp__coll_ctx *c, const void *in, void *acc, void *out,
                             const ddp__blocks *bl, ddp_dtype dt, ddp_reduce_op op,
                             unsigned phase, const ddp__ring_hook *hook);
/* Ring all-gather in place: buf holds block r (blocks bl); fills the rest.
 * rreq and sreq (each may be NULL): (n-1) * units requests, some already
 * posted (receives with ddp__ring_all_gather_post, step-0 sends of the own
 * block's units); the rest are posted here. */
int ddp__ring_all_gather(ddp__coll_ctx *c, void *buf, const ddp__blocks *bl, size_t esize,
                         unsigned phase, ddp__req *rreq, ddp__req *sreq);
/* Units per step of a ring over blocks bl (both ring engines agree). */
size_t ddp__ring_units(const ddp__coll_ctx *c, const ddp__blocks *bl, size_t esize);
/* Posts the all-gather's receive of unit u into buf (no-op if empty). */
int ddp__ring_all_gather_post(ddp__coll_ctx *c, void *buf, const ddp__blocks *bl, size_t esize,
                              unsigned phase, ddp__req *rreq, size_t u);
int ddp__broadcast_tree(ddp__coll_ctx *c, void *buf, size_t bytes, int root);
/* The same contract as ddp__reduce_shared, over messages. */
int ddp__reduce_direct(ddp__coll_ctx *c, const void *send, void *recv, size_t count,
                       ddp_dtype dt, ddp_reduce_op op, int root);
int ddp__gather_direct(ddp__coll_ctx *c, const void *send, void *recv, size_t bytes, int root);
int ddp__scatter_direct(ddp__coll_ctx *c, const void *send, void *recv, size_t bytes,
                        int root);
int ddp__alltoall_pairwise(ddp__coll_ctx *c, const void *send, void *recv, size_t bytes);
int ddp__barrier_dissemination(ddp__coll_ctx *c);

#endif
