/* Ring all-gather, chunked and pipelined (the second half of the ring
 * all-reduce; gloo's allgather_ring).
 *
 * Rank b starts with block b.  At step s (0..n-2) rank r sends block (r-s)
 * to r+1 and receives block (r-s-1) from r-1 straight into place, which it
 * forwards at step s+1.  Units of ctx->chunk bytes pipeline the steps.
 *
 * Cost: (n-1) * (alpha + B/n * beta); each rank sends and receives
 * (n-1)/n * B bytes of the B-byte result. */
#include <stdlib.h>

#include "base/error.h"
#include "coll/coll.h"

/* Block received at step s, unit k's extent. */
#define RB(s) ((size_t)(((long)c->rank - (long)(s) - 1 + 2L * c->size) % c->size))
#define ULEN(b, k) ddp__unit_len(bl, (b), (k), S)

size_t ddp__ring_units(const ddp__coll_ctx *c, const ddp__blocks *bl, size_t es)
{
    size_t maxlen = 0;
    for (int b = 0; b < c->size; b++)
        maxlen = bl->len[b] > maxlen ? bl->len[b] : maxlen;
    const size_t S = c->chunk / es ? c->chunk / es : 1;
    return (maxlen + S - 1) / S;
}

int ddp__ring_all_gather_post(ddp__coll_ctx *c, void *buf, const ddp__blocks *bl, size_t es,
                              unsigned phase, ddp__req *rreq, size_t u)
{
    const size_t S = c->chunk / es ? c->chunk / es : 1, K = ddp__ring_units(c, bl, es);
    size_t b = RB(u / K), k = u % K, len = ULEN(b, k);
    if (!len || rreq[u].kind)
        return 0;
    return ddp__tp_irecv(c->tp, &rreq[u], (c->rank + c->size - 1) % c->size,
                         ddp__tag(c, phase, u), (uint8_t *)buf + (bl->off[b] + k * S) * es,
                         len * es);
}

int ddp__ring_all_gather(ddp__coll_ctx *c, void *buf, const ddp__blocks *bl, size_t es,
                         unsigned phase, ddp__req *pre, ddp__req *spre)
{
    const int n = c->size, r = c->rank, next = (r + 1) % n;
    const size_t S = c->chunk / es ? c->chunk / es : 1;
    const size_t K = ddp__ring_units(c, bl, es), steps = (size_t)n - 1, U = steps * K;
    if (U == 0)
        return 0;
    int rc = 0;
    uint8_t *base = buf;
    ddp__req *sreq = spre ? spre : calloc(U, sizeof *sreq);
    ddp__req *rreq = pre ? pre : calloc(U, sizeof *rreq);
    DDP_FAIL_OUT(!sreq || !rreq, DDP_ERR_NOMEM, "out of memory");
    DDP_FAIL_OUT(U > 0xffffff, DDP_ERR_INVALID_ARG, "message too large for %zu-byte chunks",
                 c->chunk);
    /* Every receive lands in its own place: post them all at once. */
    for (size_t u = 0; u < U; u++)
        DDP_TRY_OUT(ddp__ring_all_gather_post(c, buf, bl, es, phase, rreq, u));
    for (size_t k = 0; k < K; k++) {
        size_t b = (size_t)r, len = ULEN(b, k);
        if (len && !sreq[k].kind)
            DDP_TRY_OUT(ddp__tp_isend(c->tp, &sreq[k], next, ddp__tag(c, phase, k),
                                      base + (bl->off[b] + k * S) * es, len * es));
    }
    for (size_t u = 0; u + K < U; u++) {
        size_t b = RB(u / K), k = u % K, len = ULEN(b, k);
        if (!len)
            continue;
        DDP_TRY_OUT(ddp__coll_wait1(c, &rreq[u]));
        DDP_TRY_OUT(ddp__tp_isend(c->tp, &sreq[u + K], next, ddp__tag(c, phase, u + K),
                                  base + (bl->off[b] + k * S) * es, len * es));
    }
    DDP_TRY_OUT(ddp__coll_wait_array(c, rreq, U));
    DDP_TRY_OUT(ddp__coll_wait_array(c, sreq, U));
out:
    if (!spre)
        free(sreq);
    if (!pre)
        free(rreq);
    return rc;
}
#undef RB
#undef ULEN
