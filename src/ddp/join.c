/* The reducer's join for uneven inputs (torch.distributed.algorithms.Join;
 * DDP's ddp_data_parallel_join is this with the model's parameter block): a
 * rank out of data shadows the others' synchronising iterations with zeros
 * until all have joined, then the parameters of the last rank to train are
 * broadcast. */
#include <string.h>

#include "base/error.h"
#include "base/timeline.h"
#include "ddp/reducer_impl.h"

/* The join protocol's per-iteration all-reduce: each rank adds 1 if it
 * still trains, plus JOIN_SYNC if this iteration's backward reduces
 * gradients (not no_sync), so that joined ranks shadow exactly the
 * iterations that reduce (PyTorch all-reduces require_backward_grad_sync the
 * same way).  Splits the sum into active and syncing ranks. */
#define JOIN_SYNC (1 << 16)
static int join_flag(ddp_reducer_t *r, int active, int sync, int32_t *nactive,
                     int32_t *nsync)
{
    int32_t total = (active ? 1 : 0) + (active && sync ? JOIN_SYNC : 0);
    uint64_t t0 = ddp__tl_begin(); /* a rank ahead of the others waits here */
    DDP_TRY(ddp_pg_all_reduce(r->pg, &total, 1, DDP_INT32, DDP_SUM));
    ddp__tl_end(t0, "join allreduce", NULL, 0);
    *nactive = total % JOIN_SYNC;
    *nsync = total / JOIN_SYNC;
    return 0;
}

int ddp_reducer_join_step(ddp_reducer_t *r)
{
    DDP_FAIL_IF(!r, DDP_ERR_INVALID_ARG, "ddp_reducer_join_step: NULL reducer");
    if (!r->join_enabled)
        return 0;
    int32_t active, syncing;
    DDP_TRY(join_flag(r, 1, !r->no_sync, &active, &syncing));
    DDP_FAIL_IF(r->join_throw && active < ddp_pg_size(r->pg), DDP_ERR_STATE,
                "%s: %d of %d ranks ran out of data (throw_on_early_termination)",
                r->who, ddp_pg_size(r->pg) - active, ddp_pg_size(r->pg));
    return 0;
}

int ddp_reducer_join_enable(ddp_reducer_t *r, int enable, int throw_on_early_termination)
{
    DDP_FAIL_IF(!r, DDP_ERR_INVALID_ARG, "ddp_reducer_join_enable: NULL reducer");
    DDP_FAIL_IF(enable && r->opts.mode == DDP_REDUCER_SCATTER, DDP_ERR_INVALID_ARG,
                "%s: join is for the all-reduce mode", r->who);
    r->join_enabled = enable != 0;
    r->join_throw = throw_on_early_termination != 0;
    return 0;
}

/* One shadow iteration: the active ranks' bucket reductions, with zeros. */
static int shadow_iteration(ddp_reducer_t *r)
{
    memset(r->grads, 0, r->layout.total_numel * sizeof(float));
    int rc = 0;
    uint64_t t0 = ddp__tl_begin();
    for (int b = 0; b < r->layout.nbuckets && rc == 0; b++)
        rc = ddp__reducer_use_pieces(r, b) ? ddp__reducer_launch_pieces(r, r->npieces)
                                            : ddp__reducer_launch_bucket(r, b);
    if (rc == 0)
        rc = ddp__reducer_reduce_deferred(r);
    r->deferred = 0;
    int wrc = ddp__reducer_wait_buckets(r, 1);
    ddp__tl_end(t0, "join shadow iteration", NULL, 0);
    DDP_TRY(rc);
    DDP_TRY(wrc);
    r->nready = 0; /* a joined rank's ready order means nothing */
    if (ddp__reducer_rebuild_due(r))
        DDP_TRY(ddp__reducer_rebuild_buckets(r));
    return 0;
}

int ddp_reducer_join(ddp_reducer_t *r, float *params, size_t n)
{
    DDP_FAIL_IF(!r, DDP_ERR_INVALID_ARG, "ddp_reducer_join: NULL reducer");
    DDP_FAIL_IF(!r->join_enabled, DDP_ERR_STATE,
                "%s: join is not enabled (ddp_data_parallel_join_enable or "
                "ddp_reducer_join_enable on every rank first)",
                r->who);
    int waited = 0; /* others still trained after this rank joined */
    for (;;) {
        int32_t active, syncing;
        DDP_TRY(join_flag(r, 0, 0, &active, &syncing));
        if (active == 0)
            break;
        DDP_FAIL_IF(r->join_throw, DDP_ERR_STATE,
                    "%s: this rank ran out of data while %d ranks still train "
                    "(throw_on_early_termination)",
                    r->who, active);
        waited = 1;
        if (syncing == 0) /* the others accumulate locally (no_sync): nothing to shadow */
            continue;
        DDP_TRY(shadow_iteration(r));
    }
    /* The parameters of the highest rank that trained to the end go to all. */
    int32_t src = waited ? -1 : ddp_pg_rank(r->pg);
    DDP_TRY(ddp_pg_all_reduce(r->pg, &src, 1, DDP_INT32, DDP_MAX));
    return params && n ? ddp_pg_broadcast(r->pg, params, n, DDP_FLOAT32, src) : 0;
}
