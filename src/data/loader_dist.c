/* DataLoader(ds, sampler=DistributedSampler(ds)) from a process group in
 * one call: the sampler takes the group's rank and size, the loader owns
 * it.  The front door's (examples/minimal.c) data line. */
#include "base/error.h"
#include "data/loader.h"

int ddp_loader_distributed_create(ddp_dataset_t *ds, ddp_pg_t *pg, const ddp_loader_options *opts,
                                  ddp_loader_t **out)
{
    DDP_FAIL_IF(!ds || !out, DDP_ERR_INVALID_ARG, "loader_distributed_create: NULL argument");
    ddp_loader_options o = opts ? *opts : ddp_loader_defaults();
    DDP_FAIL_IF(o.sampler, DDP_ERR_INVALID_ARG,
                "loader_distributed_create: opts->sampler must be NULL (the loader makes "
                "its own DistributedSampler)");
    ddp_sampler_distributed_options so = ddp_sampler_distributed_defaults();
    so.num_replicas = pg ? ddp_pg_size(pg) : 1;
    so.rank = pg ? ddp_pg_rank(pg) : 0;
    so.shuffle = o.shuffle;
    so.seed = o.seed;
    ddp_sampler_t *s = NULL;
    DDP_TRY(ddp_sampler_distributed_create(ddp_dataset_length(ds), &so, &s));
    o.sampler = s;
    o.shuffle = 0; /* the sampler shuffles */
    int rc = ddp_loader_create(ds, &o, out);
    if (rc < 0) {
        ddp_sampler_destroy(s);
        return rc;
    }
    ddp__loader_adopt_sampler(*out);
    return 0;
}
