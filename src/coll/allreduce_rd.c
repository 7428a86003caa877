/* Recursive-doubling all-reduce (Thakur, Rabenseifner & Gropp, "Optimization
 * of collective communication operations in MPICH", 2005), for small
 * messages: log2(n) steps, each exchanging the whole vector with the rank
 * whose number differs in one bit.
 *
 * For n not a power of two, with p the largest power of two <= n, ranks
 * p..n-1 first send their vector to rank r-p (which folds x[r-p] op x[r]),
 * sit out, and get the result back at the end.  At every step both
 * partners compute (lower rank's partial) op (higher rank's partial), so the
 * result is the same balanced tree on every rank:
 * ((y0 op y1) op (y2 op y3)) op ..., with y_j = x_j op x_{j+p} for j < n-p.
 *
 * Cost: (log2(p) + 2[n != p]) * (alpha + B * beta + B * gamma). */
#include <string.h>

#include "base/error.h"
#include "coll/coll.h"

#define PHASE_IN 0
#define PHASE_OUT 15

int ddp__fold_in(ddp__coll_ctx *c, void *buf, void *tmp, size_t count, ddp_dtype dt,
                 ddp__reduce_fn fn, int p2, int *sat_out)
{
    const int r = c->rank, extra = c->size - p2;
    const size_t bytes = count * ddp_dtype_size(dt);
    ddp__req sr, rr;
    *sat_out = r >= p2;
    if (r >= p2) { /* fold in, then wait for the result */
        DDP_TRY(ddp__tp_isend(c->tp, &sr, r - p2, ddp__tag(c, PHASE_IN, 0), buf, bytes));
        DDP_TRY(ddp__coll_wait1(c, &sr));
        DDP_TRY(ddp__tp_irecv(c->tp, &rr, r - p2, ddp__tag(c, PHASE_OUT, 0), buf, bytes));
        return ddp__coll_wait1(c, &rr);
    }
    if (r < extra) {
        DDP_TRY(ddp__tp_irecv(c->tp, &rr, r + p2, ddp__tag(c, PHASE_IN, 0), tmp, bytes));
        DDP_TRY(ddp__coll_wait1(c, &rr));
        fn(buf, buf, tmp, count);
    }
    return 0;
}

int ddp__fold_out(ddp__coll_ctx *c, const void *buf, size_t bytes, int p2)
{
    ddp__req sr;
    if (c->rank >= c->size - p2)
        return 0;
    DDP_TRY(ddp__tp_isend(c->tp, &sr, c->rank + p2, ddp__tag(c, PHASE_OUT, 0), buf, bytes));
    return ddp__coll_wait1(c, &sr);
}

int ddp__allreduce_rd(ddp__coll_ctx *c, void *buf, size_t count, ddp_dtype dt,
                      ddp_reduce_op op)
{
    const int n = c->size, r = c->rank;
    const size_t bytes = count * ddp_dtype_size(dt);
    const ddp__reduce_fn fn = ddp__reduce_kernel(dt, op);
    int p2 = 1;
    while (p2 * 2 <= n)
        p2 *= 2;
    uint8_t *tmp;
    ddp__req sr, rr;
    int sat;
    DDP_TRY(ddp__coll_scratch(c, bytes, (void **)&tmp));
    DDP_TRY(ddp__fold_in(c, buf, tmp, count, dt, fn, p2, &sat));
    if (sat)
        goto done;
    for (int mask = 1, step = 1; mask < p2; mask <<= 1, step++) {
        int partner = r ^ mask;
        DDP_TRY(ddp__tp_irecv(c->tp, &rr, partner, ddp__tag(c, (unsigned)step, 0), tmp, bytes));
        DDP_TRY(ddp__tp_isend(c->tp, &sr, partner, ddp__tag(c, (unsigned)step, 0), buf, bytes));
        ddp__req *both[2] = {&rr, &sr};
        DDP_TRY(ddp__coll_wait(c, both, 2));
        if (r < partner)
            fn(buf, buf, tmp, count);
        else
            fn(buf, tmp, buf, count);
    }
    DDP_TRY(ddp__fold_out(c, buf, bytes, p2));
done:
    if (op == DDP_AVG)
        ddp__reduce_divide(buf, count, dt, n);
    return 0;
}
