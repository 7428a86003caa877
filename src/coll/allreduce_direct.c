/* Direct all-reduce: every rank sends its whole vector to every other rank
 * and folds all n vectors in rank order 0, 1, ..., n-1 ((x0 op x1) op x2 ...).
 * One step: the latency optimum for 2 ranks (gloo's allreduce_local /
 * "direct" for tiny messages).
 *
 * Cost: alpha + (n-1) * B * beta + (n-1) * B * gamma; each rank sends and
 * receives (n-1) * B bytes, so it is for small B only (scratch n * B). */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "coll/coll.h"

int ddp__allreduce_direct(ddp__coll_ctx *c, void *buf, size_t count, ddp_dtype dt,
                          ddp_reduce_op op)
{
    const int n = c->size, r = c->rank;
    const size_t bytes = count * ddp_dtype_size(dt);
    const ddp__reduce_fn fn = ddp__reduce_kernel(dt, op);
    uint8_t *all;
    DDP_TRY(ddp__coll_scratch(c, (size_t)n * bytes, (void **)&all));
    int rc = 0;
    ddp__req *reqs = calloc(2 * (size_t)n, sizeof *reqs);
    DDP_FAIL_IF(!reqs, DDP_ERR_NOMEM, "out of memory");
    /* Vector of rank p goes to all + p * bytes; ours is copied there so
     * that buf can take the result while sends are still in flight. */
    memcpy(all + (size_t)r * bytes, buf, bytes);
    for (int i = 1; i < n; i++) {
        int p = (r + n - i) % n;
        DDP_TRY_OUT(ddp__tp_irecv(c->tp, &reqs[p], p, ddp__tag(c, 0, 0), all + (size_t)p * bytes,
                                  bytes));
    }
    for (int i = 1; i < n; i++) {
        int p = (r + i) % n; /* staggered: not everyone to rank 0 first */
        DDP_TRY_OUT(ddp__tp_isend(c->tp, &reqs[n + p], p, ddp__tag(c, 0, 0),
                                  all + (size_t)r * bytes, bytes));
    }
    DDP_TRY_OUT(ddp__coll_wait_array(c, reqs, (size_t)n));
    fn(buf, all, all + bytes, count);
    for (int p = 2; p < n; p++)
        fn(buf, buf, all + (size_t)p * bytes, count);
    if (op == DDP_AVG)
        ddp__reduce_divide(buf, count, dt, n);
    DDP_TRY_OUT(ddp__coll_wait_array(c, reqs + n, (size_t)n));
out:
    free(reqs);
    return rc;
}
