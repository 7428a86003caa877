/* Ring reduce-scatter, chunked and pipelined (Patarasuk & Yuan 2009; the
 * first half of gloo's allreduce_ring_chunked and NCCL's ring).
 *
 * n ranks in a ring (send to r+1, receive from r-1), n-1 steps.  At step s
 * rank r sends block (r-s-1) and receives block (r-s-2), which it reduces
 * with its own contribution and forwards at step s+1.  After the last step
 * rank r holds block r reduced over all ranks, in the order r+1, r+2, ...,
 * r (mod n): partial (a) op local (b) at every hop.
 *
 * Each block is cut into units of at most ctx->chunk bytes; unit k of step
 * s+1 leaves as soon as unit k of step s is reduced, so every link carries
 * data all the time.  Every unit of a step has its receive posted before
 * its data can arrive (into a block-sized scratch region, allocated once
 * per group and reused): the engine never stops reading a socket, so TCP
 * windows never close on data that is merely early.  With acc == NULL the
 * partials live in scratch until sent, in two regions used alternately.
 *
 * Cost: (n-1) * (alpha + B/n * beta + B/n * gamma) for B bytes; each rank
 * sends and receives (n-1)/n * B. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "coll/coll.h"

int ddp__ring_reduce_scatter(ddp__coll_ctx *c, const void *in, void *acc, void *out,
                             const ddp__blocks *bl, ddp_dtype dt, ddp_reduce_op op,
                             unsigned phase, const ddp__ring_hook *hook)
{
    const int n = c->size, r = c->rank, next = (r + 1) % n, prev = (r + n - 1) % n;
    const size_t es = ddp_dtype_size(dt);
    const ddp__reduce_fn fn = ddp__reduce_kernel(dt, op);
    size_t maxlen = 0;
    for (int b = 0; b < n; b++)
        maxlen = bl->len[b] > maxlen ? bl->len[b] : maxlen;
    const size_t S = c->chunk / es ? c->chunk / es : 1; /* elements per unit */
    const size_t K = (maxlen + S - 1) / S;              /* units per step */
    const size_t steps = (size_t)n - 1, U = steps * K;
    const size_t regions = acc ? 1 : 2, region = maxlen * es;
    if (U == 0)
        return 0;
    int rc = 0;
    uint8_t *scratch = NULL;
    ddp__req *sreq = NULL, *rreq = NULL;
    DDP_FAIL_OUT(U > 0xffffff, DDP_ERR_INVALID_ARG, "message too large for %zu-byte chunks",
                 c->chunk);
    DDP_TRY_OUT(ddp__coll_scratch(c, regions * region, (void **)&scratch));
    sreq = calloc(U, sizeof *sreq);
    rreq = calloc(U, sizeof *rreq);
    DDP_FAIL_OUT(!sreq || !rreq, DDP_ERR_NOMEM, "out of memory");

/* Block received (rb) and sent (sb) at step s, unit k's extent, its slot. */
#define RB(s) ((size_t)(((long)r - (long)(s) - 2 + 2L * n) % n))
#define SB(s) ((size_t)(((long)r - (long)(s) - 1 + 2L * n) % n))
#define ULEN(b, k) ddp__unit_len(bl, (b), (k), S)
#define SLOT(u) (scratch + ((u) / K % regions) * region + ((u) % K) * S * es)

    const uint8_t *inb = in;
    uint8_t *accb = acc, *outb = out;
    /* Phase 1: post every receive of step 0, send every unit of step 0. */
    for (size_t k = 0; k < K; k++) {
        size_t b = RB(0), len = ULEN(b, k);
        if (len)
            DDP_TRY_OUT(ddp__tp_irecv(c->tp, &rreq[k], prev, ddp__tag(c, phase, k), SLOT(k),
                                      len * es));
    }
    for (size_t k = 0; k < K; k++) {
        size_t b = SB(0), len = ULEN(b, k);
        if (len)
            DDP_TRY_OUT(ddp__tp_isend(c->tp, &sreq[k], next, ddp__tag(c, phase, k),
                                      inb + (bl->off[b] + k * S) * es, len * es));
    }
    /* Phase 2: reduce each unit as it arrives, pass it on, and post the
     * receive of the same unit of the next step into the freed place. */
    size_t reported = 0; /* units whose completed send the hook has seen */
    for (size_t u = 0; u < U; u++) {
        size_t s = u / K, k = u % K, b = RB(s), len = ULEN(b, k);
        int last = s == steps - 1;
        /* Sends of units below K + u are posted; report the completed ones. */
        while (hook && hook->sent && reported < U && reported < K + u &&
               (!sreq[reported].kind || sreq[reported].status == 1))
            DDP_TRY_OUT(hook->sent(hook->arg, reported++));
        if (len) {
            DDP_TRY_OUT(ddp__coll_wait1(c, &rreq[u]));
            size_t at = (bl->off[b] + k * S) * es;
            uint8_t *dst = last ? outb + k * S * es : accb ? accb + at : SLOT(u);
            fn(dst, SLOT(u), inb + at, len);
            if (last && hook && hook->final)
                DDP_TRY_OUT(hook->final(hook->arg, k, dst, len));
            if (!last)
                DDP_TRY_OUT(ddp__tp_isend(c->tp, &sreq[u + K], next, ddp__tag(c, phase, u + K),
                                          dst, len * es));
        }
        size_t v = u + K;
        if (v < U) {
            size_t lv = ULEN(RB(v / K), k);
            /* Two regions: v's place held the partial sent as unit u. */
            if (!accb && s > 0 && sreq[u].kind)
                DDP_TRY_OUT(ddp__coll_wait1(c, &sreq[u]));
            if (lv)
                DDP_TRY_OUT(ddp__tp_irecv(c->tp, &rreq[v], prev, ddp__tag(c, phase, v), SLOT(v),
                                          lv * es));
        }
    }
    DDP_TRY_OUT(ddp__coll_wait_array(c, sreq, U));
    while (hook && hook->sent && reported < U)
        DDP_TRY_OUT(hook->sent(hook->arg, reported++));
#undef RB
#undef SB
#undef ULEN
#undef SLOT
out:
    free(sreq);
    free(rreq);
    return rc;
}
