/* Shared-window all-reduce: ranks that share memory (the shm transport's
 * window, transport.h) reduce straight out of each other's staged data
 * instead of passing messages.  The idea is that of MPI shared-memory
 * collectives (MPICH's and Open MPI's "sm"/"han" reductions, NCCL's
 * single-node copy engines): stage each rank's data once where everyone
 * can read it, let each rank reduce its 1/n share from there, copy the
 * results out.
 *
 * The vector is cut into chunks of C bytes (cache-sized); chunk j uses
 * window slot (g mod K) of every rank, g = j + the group's running chunk
 * count.  Chunk j is cut into n shares (64-byte aligned); rank r owns share
 * r.  Per chunk, rank r:
 *
 *   copy-in   copies the shares s != r of its buffer into its slot;
 *             posts COPIED = g + 1
 *   reduce    when every rank posted COPIED >= g + 1: folds share r in rank
 *             order x0 op x1 op ... op x(n-1), x_r read from its own buffer,
 *             the others from their slots, into its buffer and share r of
 *             its slot (AVG divides); posts REDUCED = g + 1
 *   copy-out  when every rank posted REDUCED >= g + 1: copies each share
 *             s != r from rank s's slot into its buffer; posts DONE = g + 1
 *
 * and may copy chunk g into slot g mod K only once every rank posted
 * DONE >= g + 1 - K (nobody reads that slot's previous chunk any more).
 * The three steps of different chunks run out of order (oldest ready step
 * first), so a rank that is ahead keeps copying while it waits.  Each rank
 * also posts a descriptor of the call (sequence number, count, dtype, op,
 * chunk size); the first reduction checks the peers', so ranks whose calls
 * differ fail with a message instead of mixing two collectives' data.
 *
 * Cost per rank, B bytes: its buffer is read once and written once (B in,
 * B out of memory: (n-1)/n B by the copies, B/n by the reduction); the slot
 * traffic ((n-1)/n B written, (n-1)/n B read by peers' reductions and
 * copy-outs) stays in the caches.  So about 2B of DRAM traffic per rank
 * where the ring over messages moves about 3-4B, and 3 flag posts per chunk
 * instead of 2(n-1) messages per chunk.  Every rank computes the same bits
 * (one fold in rank order per element: ORDER_RANK of docs/algorithms.md).
 *
 * Symmetric memory (transport/symmetric.h: the buffer lies in memory that
 * every rank maps, at the same offset on every rank, as DDP's buckets do),
 * from DDP_ALLREDUCE_SYMMETRIC_BYTES (32 MiB: smaller vectors are faster
 * staged, see coll.c): the same steps, with the peers' buffers in place of
 * their slots.
 * copy-in copies nothing (it still posts COPIED, after the slot-reuse
 * check, because ranks 2.. fold through their own slot); ranks 0 and 1 fold
 * in place and copy nothing into the slot; copy-out reads the peers'
 * buffers.  Rank r's reduction writes only share r of its buffer, which
 * peers read only after REDUCED; its copy-out writes share q only after
 * rank q posted REDUCED, i.e. after rank q read it.  Before returning, a
 * rank waits until every peer posted DONE for the last chunk: they no
 * longer read its buffer, which is the caller's again.  Per rank this
 * saves the (n-1)/n B of copy-in and the B/n copy into the slot: at 2
 * ranks about 3.5B of reads and writes instead of 5.5B.  The descriptor carries
 * the mode, the allocation and the offset, so ranks that disagree fail
 * instead of mixing.
 *
 * Reduce to a root (ddp__reduce_shared) is the same pipeline with the
 * copy-out left to the root: every rank still folds its share (the fold's
 * work is spread over the ranks, where a reduce over messages folds
 * everything on the root), a rank other than the root folds into its slot
 * (its buffer is the caller's input and stays unchanged), and only the
 * root copies the peers' shares out.  Not in symmetric memory: the peers'
 * results are in their slots.  Of 2 ranks, the root's share is the whole
 * chunk: the other rank stages all of it and folds nothing, the root folds
 * it all and copies nothing out.  Spreading the fold cannot pay there: the
 * other rank's half would cost the root a copy into its slot and a copy
 * back out, 4 passes over that half, where folding it itself costs the
 * other rank's one copy in (ZeRO-2's 2-rank step: 1/4 of the gradient's
 * bytes less memcpy per rank).  From 3 ranks a root folding everything
 * would read n streams alone, which by the byte count is a longer reduce
 * than the spread fold plus copies (not measured).  Out of place (the
 * root's output is not its input, as MPI_Reduce's recv), the root folds
 * straight into its output and copies the shares out there: its input is
 * only read (ZeRO-2's owner writes the average into its gradient shard, no
 * copy in between). */
#include <stdatomic.h>
#include <string.h>

#include "base/error.h"
#include "coll/coll.h"

enum { F_COPIED, F_REDUCED, F_DONE, F_DESC };

/* Bytes folded at a time (a quarter of a 32 KiB L1 data cache): AVG's
 * scaling and the copy to the slot then read the block from L1. */
#define REDUCE_BLOCK 8192

typedef struct shared {
    const ddp__window *w;
    int n, r;
    const uint8_t *buf;     /* (count,) the caller's input */
    uint8_t *out;           /* where the result goes: buf itself (in place), or a
                             * reduce root's own output (MPI_Reduce's recv); NULL
                             * on a reduce's other ranks, which write none */
    uint8_t *const *sym;    /* symmetric memory: sym[q] + sym_off is rank q's buf */
    size_t sym_off;
    unsigned sym_id;        /* the allocation (the same number on every rank) */
    size_t count, es;
    ddp_dtype dt;
    ddp_reduce_op op;
    int root;               /* reduce: the rank that gets the result; -1: all-reduce */
    int whole;              /* a reduce of 2 ranks: the root's share is the whole chunk */
    ddp__reduce_fn fn;
    size_t chunk;           /* elements per chunk, a multiple of n * (64 / es) */
    size_t slot_bytes, nslots;
    size_t nchunks;
    uint64_t base;          /* chunks of earlier collectives on this window */
    size_t copied, reduced, done; /* chunks of this one, per step */
} shared;

/* The first peer whose flag k is below v, or -1. */
static int peers_at_least(const shared *s, int k, uint64_t v)
{
    for (int q = 0; q < s->n; q++)
        if (q != s->r && atomic_load_explicit(&s->w->flag[q][k].v, memory_order_acquire) < v)
            return q;
    return -1;
}

/* Each step's readiness: -1 when it can run now, else the rank it waits
 * for, or this rank's own number when it has nothing to do yet. */
static int can_copy_out(const shared *s)
{
    return s->reduced > s->done ? peers_at_least(s, F_REDUCED, s->base + s->done + 1) : s->r;
}

static int can_reduce(const shared *s)
{
    return s->copied > s->reduced ? peers_at_least(s, F_COPIED, s->base + s->reduced + 1) : s->r;
}

static int can_copy_in(const shared *s)
{
    if (s->copied == s->nchunks || s->copied >= s->done + s->nslots)
        return s->r;
    uint64_t g = s->base + s->copied + 1;
    return g > s->nslots ? peers_at_least(s, F_DONE, g - s->nslots) : -1;
}

/* win_wait's predicate: -1 when some step can run, else the rank that the
 * oldest pending step waits for. */
static int any_ready(void *arg)
{
    const shared *s = arg;
    int a = can_copy_out(s), b = can_reduce(s), c = can_copy_in(s);
    if (a < 0 || b < 0 || c < 0)
        return -1;
    return a != s->r ? a : b != s->r ? b : c;
}

/* win_wait's predicate at the end in symmetric memory: every peer has
 * copied out every chunk. */
static int peers_done(void *arg)
{
    const shared *s = arg;
    return peers_at_least(s, F_DONE, s->base + s->nchunks);
}

/* Chunk j: its first element, its share length S (elements) and its length. */
static size_t chunk_len(const shared *s, size_t j, size_t *first, size_t *share)
{
    size_t at = j * s->chunk, len = s->count - at < s->chunk ? s->count - at : s->chunk;
    size_t line = 64 / s->es, per = (len + (size_t)s->n - 1) / (size_t)s->n;
    *first = at;
    *share = (per + line - 1) / line * line;
    return len;
}

/* Share q of a chunk of len elements cut in shares of S: [*off, *off + ret). */
static size_t share_of(const shared *s, size_t len, size_t S, int q, size_t *off)
{
    if (s->whole) {
        *off = 0;
        return q == s->root ? len : 0;
    }
    size_t a = (size_t)q * S;
    *off = a;
    return a >= len ? 0 : len - a < S ? len - a : S;
}

/* Rank q's slot for chunk j of this collective. */
static uint8_t *slot(const shared *s, int q, size_t j)
{
    return s->w->slot[q] + ((s->base + j) % s->nslots) * s->slot_bytes;
}

/* Where peer q's share of chunk j (first + off) is: its buffer itself in
 * symmetric memory, else its slot. */
static const uint8_t *peer_data(const shared *s, int q, size_t j, size_t first, size_t off)
{
    return s->sym ? s->sym[q] + s->sym_off + (first + off) * s->es
                  : slot(s, q, j) + off * s->es;
}

static void copy_in(shared *s, size_t j)
{
    if (s->sym) /* the peers read the buffer itself */
        return;
    size_t first, S, len = chunk_len(s, j, &first, &S), off, n;
    uint8_t *mine = slot(s, s->r, j);
    for (int q = 0; q < s->n; q++)
        if (q != s->r && (n = share_of(s, len, S, q, &off)) > 0)
            memcpy(mine + off * s->es, s->buf + (first + off) * s->es, n * s->es);
}

/* Elements [off, off + n) of chunk j (in rank r's share): the fold, AVG's
 * scaling and the copy between buffer and slot, on a block small enough
 * that the second and third passes read it from L1. */
static void reduce_block(shared *s, size_t j, size_t first, size_t off, size_t n)
{
    const size_t es = s->es;
    const int keeps = s->root < 0 || s->r == s->root;
    const uint8_t *own = s->buf + (first + off) * es;
    uint8_t *res = keeps ? s->out + (first + off) * es : NULL;
    uint8_t *dst = slot(s, s->r, j) + off * es;
    /* Ranks 0 and 1 fold in place into their buffer (the first fold reads
     * its lines, so the stores hit the cache), then copy the result into
     * the slot for the peers (not in symmetric memory: they read the
     * buffer); the others fold into the slot (their own values are still
     * needed after the first fold) and copy it back.  In a reduce only the
     * root keeps the result (in its output, not its slot); the others
     * fold into their slots, for the root's copy-out.  A root whose output
     * is not its input folds straight into the output, whatever its rank. */
    uint8_t *acc = keeps && (s->r <= 1 || res != own) ? res : dst;
#define X(q) ((q) == s->r ? own : peer_data(s, (q), j, first, off))
    s->fn(acc, X(0), X(1), n);
    for (int q = 2; q < s->n; q++)
        s->fn(acc, acc, X(q), n);
#undef X
    if (s->op == DDP_AVG)
        ddp__reduce_divide(acc, n, s->dt, s->n);
    if (acc != res && keeps)
        memcpy(res, dst, n * es);
    else if (acc == res && !s->sym && s->root < 0)
        memcpy(dst, res, n * es);
}

static void reduce(shared *s, size_t j)
{
    size_t first, S, len = chunk_len(s, j, &first, &S), off;
    size_t n = share_of(s, len, S, s->r, &off), block = REDUCE_BLOCK / s->es;
    for (size_t b = 0; b < n; b += block)
        reduce_block(s, j, first, off + b, n - b < block ? n - b : block);
}

static void copy_out(shared *s, size_t j)
{
    if (s->root >= 0 && s->r != s->root) /* a reduce: the result is the root's only */
        return;
    size_t first, S, len = chunk_len(s, j, &first, &S), off, n;
    for (int q = 0; q < s->n; q++)
        if (q != s->r && (n = share_of(s, len, S, q, &off)) > 0)
            memcpy(s->out + (first + off) * s->es, peer_data(s, q, j, first, off), n * s->es);
}

/* What this collective is, as a nonzero hash: ranks whose chunk numbers
 * meet must be running the same one. */
static uint64_t describe(const ddp__coll_ctx *c, const shared *s)
{
    const uint64_t v[6] = {c->seq, s->count,
                           (uint64_t)(s->root + 1) << 16 | (uint64_t)s->dt << 8 | (uint64_t)s->op,
                           s->slot_bytes, s->sym ? s->sym_off + 1 : 0, s->sym ? s->sym_id : 0};
    uint64_t h = 0x9e3779b97f4a7c15u;
    for (int i = 0; i < 6; i++) { /* splitmix64's finaliser over each word */
        h ^= v[i];
        h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9u;
        h = (h ^ (h >> 27)) * 0x94d049bb133111ebu;
        h ^= h >> 31;
    }
    return h | 1;
}

/* Before the first reduction reads the peers' slots: every peer has
 * staged this collective's first chunk, so its descriptor is posted; a
 * different one means the ranks' calls differ, and the slots hold data of
 * another collective. */
static int check_peers_agree(const shared *s, uint64_t desc)
{
    for (int q = 0; q < s->n; q++)
        DDP_FAIL_IF(q != s->r &&
                        atomic_load_explicit(&s->w->flag[q][F_DESC].v, memory_order_acquire) != desc,
                    DDP_ERR_PROTOCOL,
                    "shared-memory %s: rank %d runs a different collective (do the "
                    "ranks call the same collectives with the same counts, dtypes, ops, "
                    "DDP_SHARED_CHUNK_BYTES, and buffers all in the same symmetric allocation "
                    "at the same offset or all outside symmetric memory?)",
                    s->root < 0 ? "all_reduce" : "reduce", q);
    return 0;
}

size_t ddp__allreduce_shared_slot(const ddp__coll_ctx *c, const ddp__window *w)
{
    /* Slots: K >= 2 of C bytes, C a multiple of n cache lines. */
    size_t unit = (size_t)c->size * 64, want = c->shared_chunk;
    if (want > w->bytes / 2)
        want = w->bytes / 2;
    return want / unit * unit;
}

static int run(ddp__coll_ctx *c, const void *buf, void *out, size_t count, ddp_dtype dt,
               ddp_reduce_op op, int root)
{
    const ddp__window *w = ddp__tp_window(c->tp);
    DDP_FAIL_IF(!w, DDP_ERR_UNSUPPORTED,
                "%s algorithm 'shared' needs a shared window: the shm transport with "
                "DDP_SHM_WINDOW_BYTES > 0 (this group: %s%s)",
                root < 0 ? "all_reduce" : "reduce", c->tp->vt->name,
                c->tp->vt->window ? " without a window" : "");
    shared s = {.w = w, .n = c->size, .r = c->rank, .buf = buf, .out = out, .count = count,
                .es = ddp_dtype_size(dt), .dt = dt, .op = op, .root = root,
                .whole = root >= 0 && c->size == 2,
                .fn = ddp__reduce_kernel(dt, op)};
    s.slot_bytes = ddp__allreduce_shared_slot(c, w);
    DDP_FAIL_IF(s.slot_bytes == 0, DDP_ERR_INVALID_ARG,
                "shared window of %zu bytes (chunk %zu) too small for %d ranks", w->bytes,
                c->shared_chunk, s.n);
    s.nslots = w->bytes / s.slot_bytes;
    s.chunk = s.slot_bytes / s.es;
    s.nchunks = (count + s.chunk - 1) / s.chunk;
    if (root < 0 && count * s.es >= c->symmetric_min)
        s.sym = ddp__tp_sym_find(c->tp, buf, count * s.es, &s.sym_off, &s.sym_id);
    /* Our own flags say how many chunks the window has seen (all equal at
     * rest: every rank runs the same collectives). */
    s.base = atomic_load_explicit(&w->flag[s.r][F_DONE].v, memory_order_relaxed);
    const uint64_t desc = describe(c, &s);
    ddp__tp_win_post(c->tp, F_DESC, desc); /* before the first COPIED */
    while (s.done < s.nchunks) {
        if (can_copy_out(&s) < 0) {
            copy_out(&s, s.done++);
            ddp__tp_win_post(c->tp, F_DONE, s.base + s.done);
        } else if (can_reduce(&s) < 0) {
            if (s.reduced == 0)
                DDP_TRY(check_peers_agree(&s, desc));
            reduce(&s, s.reduced++);
            ddp__tp_win_post(c->tp, F_REDUCED, s.base + s.reduced);
        } else if (can_copy_in(&s) < 0) {
            copy_in(&s, s.copied++);
            ddp__tp_win_post(c->tp, F_COPIED, s.base + s.copied);
        } else {
            DDP_TRY(ddp__tp_win_wait(c->tp, any_ready, &s, c->deadline));
        }
    }
    /* In symmetric memory the peers copy out of this buffer: it is the
     * caller's again only once they are done. */
    if (s.sym)
        DDP_TRY(ddp__tp_win_wait(c->tp, peers_done, &s, c->deadline));
    return 0;
}

int ddp__allreduce_shared(ddp__coll_ctx *c, void *buf, size_t count, ddp_dtype dt,
                          ddp_reduce_op op)
{
    return run(c, buf, buf, count, dt, op, -1);
}

int ddp__reduce_shared(ddp__coll_ctx *c, const void *send, void *recv, size_t count,
                       ddp_dtype dt, ddp_reduce_op op, int root)
{
    /* Only the root's output is written: the others fold into their slots. */
    return run(c, send, c->rank == root ? recv : NULL, count, dt, op, root);
}
