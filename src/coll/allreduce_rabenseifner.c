/* Rabenseifner's all-reduce (Thakur, Rabenseifner & Gropp 2005; MPICH's
 * MPIR_Allreduce_intra_reduce_scatter_allgather): a reduce-scatter by
 * recursive halving, then an all-gather by recursive doubling.  Each rank
 * sends 2 (p-1)/p of the vector in 2 log2(p) messages: the ring's
 * bandwidth with recursive doubling's message count, which is what many
 * ranks on a latency-heavy network want for medium and large vectors.
 *
 * For n not a power of two, with p the largest power of two <= n, ranks
 * p..n-1 first fold their vector into rank r-p and get the result back at
 * the end (allreduce_rd.c's ddp__fold_in / ddp__fold_out).  The vector is cut into p blocks; at the
 * halving step with mask M (p/2 down to 1) a rank keeps the lower half of
 * its range when its bit M is clear, sends the other half to rank r^M and
 * folds what it receives as (lower rank's partial) op (higher rank's
 * partial), so at the end rank r holds block r reduced in one tree that is
 * the same for every element: for M = p/2 down to 1, v[j] = v[j] op
 * v[j+M] for j < M (docs/algorithms.md).  One rank computes each block, so
 * every rank ends with the same bits.
 *
 * Cost: 2 log2(p) alpha + 2 (p-1)/p B beta + (p-1)/p B gamma, plus
 * 2 (alpha + B beta) + B gamma when n != p. */
#include <string.h>

#include "base/error.h"
#include "coll/coll.h"

#define PHASE_HALVE 1 /* the folds (allreduce_rd.c) use 0 and 15 */
#define PHASE_DOUBLE 2

/* Elements [off, off+len) of blocks [lo, hi). */
static void range_of(const ddp__blocks *bl, int lo, int hi, size_t *off, size_t *len)
{
    *off = bl->off[lo];
    *len = bl->off[hi - 1] + bl->len[hi - 1] - *off;
}

/* Sends sbytes and receives rbytes with partner at once.  An empty side
 * is skipped on both ends (with fewer elements than blocks some are
 * empty): what one rank sends is exactly what its partner expects. */
static int exchange(ddp__coll_ctx *c, int partner, uint64_t tag, const void *send,
                    size_t sbytes, void *recv, size_t rbytes)
{
    ddp__req sr, rr, *reqs[2];
    int n = 0;
    if (rbytes) {
        DDP_TRY(ddp__tp_irecv(c->tp, &rr, partner, tag, recv, rbytes));
        reqs[n++] = &rr;
    }
    if (sbytes) {
        DDP_TRY(ddp__tp_isend(c->tp, &sr, partner, tag, send, sbytes));
        reqs[n++] = &sr;
    }
    return n ? ddp__coll_wait(c, reqs, n) : 0;
}

/* Recursive halving among ranks 0..p-1: rank r ends with block r of the
 * reduction in buf (blocks bl). */
static int halve(ddp__coll_ctx *c, uint8_t *buf, uint8_t *tmp, const ddp__blocks *bl, int p,
                 size_t es, ddp__reduce_fn fn)
{
    const int r = c->rank;
    int lo = 0, hi = p;
    for (int mask = p / 2, step = 0; mask >= 1; mask >>= 1, step++) {
        int partner = r ^ mask, mid = lo + (hi - lo) / 2;
        int keep_lo = (r & mask) ? mid : lo, keep_hi = (r & mask) ? hi : mid;
        int give_lo = (r & mask) ? lo : mid, give_hi = (r & mask) ? mid : hi;
        size_t koff, klen, goff, glen;
        range_of(bl, keep_lo, keep_hi, &koff, &klen);
        range_of(bl, give_lo, give_hi, &goff, &glen);
        DDP_TRY(exchange(c, partner, ddp__tag(c, PHASE_HALVE, (uint64_t)step), buf + goff * es,
                         glen * es, tmp, klen * es));
        uint8_t *mine = buf + koff * es;
        if (r < partner)
            fn(mine, mine, tmp, klen);
        else
            fn(mine, tmp, mine, klen);
        lo = keep_lo;
        hi = keep_hi;
    }
    return 0;
}

/* Recursive doubling of the owned range back to the whole vector. */
static int doubling(ddp__coll_ctx *c, uint8_t *buf, const ddp__blocks *bl, int p, size_t es)
{
    const int r = c->rank;
    for (int mask = 1, step = 0; mask < p; mask <<= 1, step++) {
        int partner = r ^ mask;
        int mine_lo = r & ~(mask - 1), theirs_lo = partner & ~(mask - 1);
        size_t moff, mlen, toff, tlen;
        range_of(bl, mine_lo, mine_lo + mask, &moff, &mlen);
        range_of(bl, theirs_lo, theirs_lo + mask, &toff, &tlen);
        DDP_TRY(exchange(c, partner, ddp__tag(c, PHASE_DOUBLE, (uint64_t)step), buf + moff * es,
                         mlen * es, buf + toff * es, tlen * es));
    }
    return 0;
}

int ddp__allreduce_rabenseifner(ddp__coll_ctx *c, void *buf, size_t count, ddp_dtype dt,
                                ddp_reduce_op op)
{
    const int n = c->size;
    const size_t es = ddp_dtype_size(dt), bytes = count * es;
    const ddp__reduce_fn fn = ddp__reduce_kernel(dt, op);
    int p2 = 1;
    while (p2 * 2 <= n)
        p2 *= 2;
    uint8_t *tmp;
    int sat;
    DDP_TRY(ddp__coll_scratch(c, bytes, (void **)&tmp));
    DDP_TRY(ddp__fold_in(c, buf, tmp, count, dt, fn, p2, &sat));
    if (sat)
        goto done;
    ddp__blocks bl = {0};
    DDP_TRY(ddp__blocks_split(&bl, count, p2));
    int rc = halve(c, buf, tmp, &bl, p2, es, fn);
    if (rc == 0)
        rc = doubling(c, buf, &bl, p2, es);
    ddp__blocks_free(&bl);
    DDP_TRY(rc);
    DDP_TRY(ddp__fold_out(c, buf, bytes, p2));
done:
    if (op == DDP_AVG)
        ddp__reduce_divide(buf, count, dt, n);
    return 0;
}
