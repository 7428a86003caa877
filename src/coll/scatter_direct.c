/* Direct scatter: the root sends block p of its input straight to rank p
 * (linear algorithm).  Cost: alpha + (n-1) * B * beta at the root. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "coll/coll.h"

int ddp__scatter_direct(ddp__coll_ctx *c, const void *send, void *recv, size_t bytes,
                        int root)
{
    const int n = c->size, r = c->rank;
    ddp__req one;
    if (r != root) {
        DDP_TRY(ddp__tp_irecv(c->tp, &one, root, ddp__tag(c, 0, 0), recv, bytes));
        return ddp__coll_wait1(c, &one);
    }
    const uint8_t *in = send;
    if (recv != in + (size_t)r * bytes)
        memmove(recv, in + (size_t)r * bytes, bytes);
    int rc = 0;
    ddp__req *reqs = calloc((size_t)n, sizeof *reqs);
    DDP_FAIL_IF(!reqs, DDP_ERR_NOMEM, "out of memory");
    for (int i = 1; i < n; i++) {
        int p = (r + i) % n;
        DDP_TRY_OUT(ddp__tp_isend(c->tp, &reqs[p], p, ddp__tag(c, 0, 0), in + (size_t)p * bytes,
                                  bytes));
    }
    DDP_TRY_OUT(ddp__coll_wait_array(c, reqs, (size_t)n));
out:
    free(reqs);
    return rc;
}
