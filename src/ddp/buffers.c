/* DDP and module buffers (BatchNorm's running statistics): PyTorch's
 * broadcast_buffers.  Buffers are not gradients: they are never in a
 * bucket and never averaged; rank 0's values are the replicas' values,
 * sent at construction and, with broadcast_buffers (the default), before
 * every forward, as DistributedDataParallel._sync_buffers does.  The model
 * keeps all buffers in one byte block (nn/model.c), so this is one
 * broadcast of that block whatever the number of buffers. */
#include "ddp/buffers.h"

#include <stdlib.h>

#include "base/error.h"
#include "base/timeline.h"

int ddp__broadcast_buffers(ddp_pg_t *pg, ddp_model_t *m)
{
    DDP_FAIL_IF(!pg || !m, DDP_ERR_INVALID_ARG, "broadcast buffers: NULL group or model");
    size_t nbytes;
    void *block = ddp_model_buffer_block(m, &nbytes);
    if (!nbytes)
        return 0;
    uint64_t t0 = ddp__tl_begin();
    int rc = ddp_pg_broadcast(pg, block, nbytes, DDP_UINT8, 0);
    ddp__tl_end(t0, "DDP broadcast buffers", "bytes", (int64_t)nbytes);
    if (rc < 0)
        return ddp__error_context(rc, "DDP: broadcasting %zu bytes of module buffers from "
                                      "rank 0", nbytes);
    return 0;
}

int ddp__check_buffers(ddp_pg_t *pg, ddp_model_t *m)
{
    int n = ddp_pg_size(pg), rc = 0;
    size_t nbytes;
    ddp_model_buffer_block(m, &nbytes);
    int64_t mine[2] = {(int64_t)ddp_model_num_buffers(m), (int64_t)nbytes};
    int64_t *all = calloc((size_t)n * 2, sizeof *all);
    DDP_FAIL_IF(!all, DDP_ERR_NOMEM, "DDP: out of memory");
    DDP_TRY_OUT(ddp_pg_all_gather(pg, mine, all, 2, DDP_INT64));
    for (int r = 1; r < n; r++)
        DDP_FAIL_OUT(all[2 * r] != all[0] || all[2 * r + 1] != all[1], DDP_ERR_MISMATCH,
                     "rank %d differs from rank 0: %lld buffers of %lld bytes on rank %d, %lld "
                     "of %lld bytes on rank 0", r, (long long)all[2 * r],
                     (long long)all[2 * r + 1], r, (long long)all[0], (long long)all[1]);
out:
    free(all);
    return rc;
}
