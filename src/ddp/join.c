/* DDP's join for uneven inputs (torch.distributed.algorithms.Join): a rank
 * out of data shadows the others' synchronising iterations with zeros until
 * all have joined, then the model of the last rank to train is broadcast. */
#include <string.h>

#include "base/error.h"
#include "base/timeline.h"
#include "ddp/wrapper.h"

/* The join protocol's per-iteration all-reduce: each rank adds 1 if it
 * still trains, plus JOIN_SYNC if this iteration's backward reduces
 * gradients (not no_sync), so that joined ranks shadow exactly the
 * iterations that reduce (PyTorch all-reduces require_backward_grad_sync the
 * same way).  Splits the sum into active and syncing ranks. */
#define JOIN_SYNC (1 << 16)
static int join_flag(ddp_data_parallel_t *dm, int active, int sync, int32_t *nactive,
                     int32_t *nsync)
{
    int32_t total = (active ? 1 : 0) + (active && sync ? JOIN_SYNC : 0);
    uint64_t t0 = ddp__tl_begin(); /* a rank ahead of the others waits here */
    DDP_TRY(ddp_pg_all_reduce(dm->pg, &total, 1, DDP_INT32, DDP_SUM));
    ddp__tl_end(t0, "join allreduce", NULL, 0);
    *nactive = total % JOIN_SYNC;
    *nsync = total / JOIN_SYNC;
    return 0;
}

int ddp__dp_join_forward(ddp_data_parallel_t *dm)
{
    int32_t active, syncing;
    DDP_TRY(join_flag(dm, 1, !dm->no_sync, &active, &syncing));
    DDP_FAIL_IF(dm->join_throw && active < ddp_pg_size(dm->pg), DDP_ERR_STATE,
                "DDP: %d of %d ranks ran out of data (throw_on_early_termination)",
                ddp_pg_size(dm->pg) - active, ddp_pg_size(dm->pg));
    return 0;
}

int ddp_data_parallel_join_enable(ddp_data_parallel_t *dm, int enable,
                                  int throw_on_early_termination)
{
    DDP_FAIL_IF(!dm, DDP_ERR_INVALID_ARG, "ddp_data_parallel_join_enable: NULL module");
    dm->join_enabled = enable != 0;
    dm->join_throw = throw_on_early_termination != 0;
    return 0;
}

/* One shadow iteration: the active ranks' bucket reductions, with zeros. */
static int shadow_iteration(ddp_data_parallel_t *dm)
{
    memset(dm->grads, 0, dm->layout.total_numel * sizeof(float));
    int rc = 0;
    uint64_t t0 = ddp__tl_begin();
    for (int b = 0; b < dm->layout.nbuckets && rc == 0; b++)
        rc = ddp__dp_use_pieces(dm, b) ? ddp__dp_launch_pieces(dm, dm->npieces)
                                       : ddp__dp_launch_bucket(dm, b);
    if (rc == 0)
        rc = ddp__dp_reduce_deferred(dm);
    dm->deferred = 0;
    int wrc = ddp__dp_wait_buckets(dm, 1);
    ddp__tl_end(t0, "join shadow iteration", NULL, 0);
    DDP_TRY(rc);
    DDP_TRY(wrc);
    dm->nready = 0; /* a joined rank's ready order means nothing */
    if (ddp__dp_rebuild_due(dm))
        DDP_TRY(ddp__dp_rebuild_buckets(dm));
    return 0;
}

int ddp_data_parallel_join(ddp_data_parallel_t *dm)
{
    DDP_FAIL_IF(!dm || !dm->join_enabled, DDP_ERR_STATE,
                "ddp_data_parallel_join: join is not enabled (ddp_data_parallel_join_enable on every rank first)");
    int waited = 0; /* others still trained after this rank joined */
    for (;;) {
        int32_t active, syncing;
        DDP_TRY(join_flag(dm, 0, 0, &active, &syncing));
        if (active == 0)
            break;
        DDP_FAIL_IF(dm->join_throw, DDP_ERR_STATE,
                    "DDP: this rank ran out of data while %d ranks still train "
                    "(throw_on_early_termination)",
                    active);
        waited = 1;
        if (syncing == 0) /* the others accumulate locally (no_sync): nothing to shadow */
            continue;
        DDP_TRY(shadow_iteration(dm));
    }
    /* The model of the highest rank that trained to the end goes to all. */
    int32_t src = waited ? -1 : ddp_pg_rank(dm->pg);
    DDP_TRY(ddp_pg_all_reduce(dm->pg, &src, 1, DDP_INT32, DDP_MAX));
    size_t n;
    float *block = ddp_model_param_block(dm->model, &n);
    return ddp_pg_broadcast(dm->pg, block, n, DDP_FLOAT32, src);
}
