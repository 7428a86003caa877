/* Pairwise-exchange all-to-all (MPICH's MPIR_Alltoall_intra_pairwise, with
 * every exchange posted at once): rank r sends block j to rank j and
 * receives rank j's block r into block j; the i-th send goes to r+i so that
 * no rank is everyone's first target.  Cost: (n-1) * (alpha + B * beta)
 * with B the block size, all exchanges in flight together. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "coll/coll.h"

int ddp__alltoall_pairwise(ddp__coll_ctx *c, const void *send, void *recv, size_t bytes)
{
    const int n = c->size, r = c->rank;
    const uint8_t *in = send;
    uint8_t *out = recv;
    memcpy(out + (size_t)r * bytes, in + (size_t)r * bytes, bytes);
    if (n == 1)
        return 0;
    int rc = 0;
    ddp__req *reqs = calloc(2 * (size_t)n, sizeof *reqs);
    DDP_FAIL_IF(!reqs, DDP_ERR_NOMEM, "out of memory");
    for (int i = 1; i < n; i++) {
        int src = (r + n - i) % n;
        DDP_TRY_OUT(ddp__tp_irecv(c->tp, &reqs[src], src, ddp__tag(c, 0, 0),
                                  out + (size_t)src * bytes, bytes));
    }
    for (int i = 1; i < n; i++) {
        int dst = (r + i) % n;
        DDP_TRY_OUT(ddp__tp_isend(c->tp, &reqs[n + dst], dst, ddp__tag(c, 0, 0),
                                  in + (size_t)dst * bytes, bytes));
    }
    DDP_TRY_OUT(ddp__coll_wait_array(c, reqs, 2 * (size_t)n));
out:
    free(reqs);
    return rc;
}
