/* Binomial-tree broadcast (MPICH's MPIR_Bcast_intra_binomial), chunked so
 * that an inner node forwards unit k while unit k+1 arrives.
 *
 * Ranks are renumbered relative to the root (v = r - root mod n).  Node v
 * receives from v minus its lowest set bit, then sends to v + 2^j for every
 * 2^j below that bit.  Depth ceil(log2 n); the root sends ceil(log2 n)
 * copies.  Cost: ceil(log2 n) * alpha + (units + depth) * chunk * beta. */
#include <stdlib.h>

#include "base/error.h"
#include "coll/coll.h"

int ddp__broadcast_tree(ddp__coll_ctx *c, void *buf, size_t bytes, int root)
{
    const int n = c->size, v = (c->rank - root + n) % n;
    const size_t S = c->chunk, K = (bytes + S - 1) / S;
    int parent = -1, children[32], nchild = 0, mask = 1;
    while (mask < n) {
        if (v & mask) {
            parent = (v - mask + root) % n;
            break;
        }
        mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1)
        if (v + mask < n)
            children[nchild++] = (v + mask + root) % n;
    int rc = 0;
    uint8_t *b = buf;
    ddp__req *rreq = calloc(K, sizeof *rreq);
    ddp__req *sreq = calloc(K * (size_t)(nchild + 1), sizeof *sreq);
    DDP_FAIL_OUT(!rreq || !sreq, DDP_ERR_NOMEM, "out of memory");
    DDP_FAIL_OUT(K > 0xffffff, DDP_ERR_INVALID_ARG, "message too large for %zu-byte chunks", S);
    if (parent >= 0)
        for (size_t k = 0; k < K; k++)
            DDP_TRY_OUT(ddp__tp_irecv(c->tp, &rreq[k], parent, ddp__tag(c, 0, k), b + k * S,
                                      k + 1 < K ? S : bytes - k * S));
    for (size_t k = 0; k < K; k++) {
        if (parent >= 0)
            DDP_TRY_OUT(ddp__coll_wait1(c, &rreq[k]));
        for (int i = 0; i < nchild; i++)
            DDP_TRY_OUT(ddp__tp_isend(c->tp, &sreq[k * (size_t)nchild + (size_t)i], children[i],
                                      ddp__tag(c, 0, k), b + k * S, k + 1 < K ? S : bytes - k * S));
    }
    DDP_TRY_OUT(ddp__coll_wait_array(c, sreq, K * (size_t)nchild));
out:
    free(rreq);
    free(sreq);
    return rc;
}
