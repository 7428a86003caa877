/* SyncBatchNorm (include/ddp/sync_batchnorm.h): nn's BatchNorm statistics
 * hook (nn/batchnorm.c) filled with the group's all-reduce, so that nn/
 * itself never sees a process group.  Cost per training step and layer of
 * C channels: one all-reduce of 2C + 1 doubles in forward and one of 2C in
 * backward, on the compute thread (as PyTorch's SyncBatchNorm). */
#include "ddp/sync_batchnorm.h"

#include "base/error.h"

static int all_reduce_stats(double *buf, size_t n, void *user)
{
    return ddp_pg_all_reduce(user, buf, n, DDP_FLOAT64, DDP_SUM);
}

typedef struct convert {
    ddp_pg_t *pg;
    int n;
} convert;

static int convert_one(ddp_module_t *m, const char *name, void *user)
{
    (void)name;
    convert *c = user;
    if (!ddp_module_is_batchnorm(m))
        return 0;
    c->n++;
    return ddp_batchnorm_set_stats_hook(m, c->pg ? all_reduce_stats : NULL, c->pg);
}

int ddp_sync_batchnorm_convert(ddp_model_t *model, ddp_pg_t *pg, int *nconverted)
{
    DDP_FAIL_IF(!model, DDP_ERR_INVALID_ARG, "sync_batchnorm_convert: model is NULL");
    convert c = {pg, 0};
    DDP_TRY(ddp_model_visit_modules(model, convert_one, &c));
    if (nconverted)
        *nconverted = c.n;
    return 0;
}
