/* Dissemination barrier (Hensgen, Finkel & Manber 1988; MPICH's
 * MPIR_Barrier_intra_dissemination): in round k rank r signals r + 2^k and
 * waits for r - 2^k.  After ceil(log2 n) rounds every rank has heard,
 * directly or not, from every other.  Zero-byte messages: ceil(log2 n) *
 * alpha. */
#include "base/error.h"
#include "coll/coll.h"

int ddp__barrier_dissemination(ddp__coll_ctx *c)
{
    const int n = c->size, r = c->rank;
    unsigned round = 0;
    for (int mask = 1; mask < n; mask <<= 1, round++) {
        ddp__req sr, rr;
        DDP_TRY(ddp__tp_irecv(c->tp, &rr, (r - mask + n) % n, ddp__tag(c, 0, round), NULL, 0));
        DDP_TRY(ddp__tp_isend(c->tp, &sr, (r + mask) % n, ddp__tag(c, 0, round), NULL, 0));
        ddp__req *both[2] = {&rr, &sr};
        DDP_TRY(ddp__coll_wait(c, both, 2));
    }
    return 0;
}
