/* Direct reduce to a root, chunked: every rank sends its vector to the root
 * in units of ctx->chunk bytes; the root folds each unit in rank order
 * 0, 1, ..., n-1, the same order as the direct all-reduce.
 *
 * Cost: the root receives (n-1) * B bytes: alpha + (n-1) * B * (beta +
 * gamma).  Enough for the sizes reduce sees in training (metrics, loss);
 * a ring reduce-scatter + gather would cut the root's traffic to B. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "coll/coll.h"

int ddp__reduce_direct(ddp__coll_ctx *c, const void *send, void *recv, size_t count,
                       ddp_dtype dt, ddp_reduce_op op, int root)
{
    const int n = c->size, r = c->rank;
    const size_t es = ddp_dtype_size(dt), S = c->chunk / es ? c->chunk / es : 1;
    const size_t K = (count + S - 1) / S;
    const ddp__reduce_fn fn = ddp__reduce_kernel(dt, op);
    const uint8_t *in = send;
    uint8_t *out = recv; /* the root's only */
    int rc = 0;
    DDP_FAIL_IF(K > 0xffffff, DDP_ERR_INVALID_ARG, "message too large for %zu-byte chunks",
                c->chunk);
    ddp__req *reqs = calloc(r == root ? (size_t)n : K, sizeof *reqs);
    DDP_FAIL_IF(!reqs, DDP_ERR_NOMEM, "out of memory");
    if (r != root) {
        for (size_t k = 0; k < K; k++) {
            size_t len = k + 1 < K ? S : count - k * S;
            DDP_TRY_OUT(ddp__tp_isend(c->tp, &reqs[k], root, ddp__tag(c, 0, k), in + k * S * es,
                                      len * es));
        }
        DDP_TRY_OUT(ddp__coll_wait_array(c, reqs, K));
        goto out;
    }
    uint8_t *all;
    DDP_TRY_OUT(ddp__coll_scratch(c, (size_t)n * S * es, (void **)&all));
    for (size_t k = 0; k < K; k++) {
        size_t len = k + 1 < K ? S : count - k * S;
        uint8_t *mine = out + k * S * es; /* folded into, after the input is copied */
        memset(reqs, 0, sizeof *reqs * (size_t)n);
        for (int p = 0; p < n; p++)
            if (p != r)
                DDP_TRY_OUT(ddp__tp_irecv(c->tp, &reqs[p], p, ddp__tag(c, 0, k),
                                          all + (size_t)p * S * es, len * es));
        memcpy(all + (size_t)r * S * es, in + k * S * es, len * es);
        DDP_TRY_OUT(ddp__coll_wait_array(c, reqs, (size_t)n));
        fn(mine, all, all + S * es, len);
        for (int p = 2; p < n; p++)
            fn(mine, mine, all + (size_t)p * S * es, len);
        if (op == DDP_AVG)
            ddp__reduce_divide(mine, len, dt, n);
    }
out:
    free(reqs);
    return rc;
}
