/* Direct gather: every rank sends its block straight to the root, which
 * posts all receives at once (linear algorithm, MPICH's
 * MPIR_Gather_intra_linear).  Cost: alpha + (n-1) * B * beta at the root. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "coll/coll.h"

int ddp__gather_direct(ddp__coll_ctx *c, const void *send, void *recv, size_t bytes, int root)
{
    const int n = c->size, r = c->rank;
    ddp__req one;
    if (r != root) {
        DDP_TRY(ddp__tp_isend(c->tp, &one, root, ddp__tag(c, 0, 0), send, bytes));
        return ddp__coll_wait1(c, &one);
    }
    uint8_t *out = recv;
    if (out + (size_t)r * bytes != send)
        memmove(out + (size_t)r * bytes, send, bytes);
    int rc = 0;
    ddp__req *reqs = calloc((size_t)n, sizeof *reqs);
    DDP_FAIL_IF(!reqs, DDP_ERR_NOMEM, "out of memory");
    for (int p = 0; p < n; p++)
        if (p != r)
            DDP_TRY_OUT(ddp__tp_irecv(c->tp, &reqs[p], p, ddp__tag(c, 0, 0),
                                      out + (size_t)p * bytes, bytes));
    DDP_TRY_OUT(ddp__coll_wait_array(c, reqs, (size_t)n));
out:
    free(reqs);
    return rc;
}
