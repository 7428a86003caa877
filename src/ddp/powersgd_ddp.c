/* PowerSGD under DistributedDataParallel (powersgd.h): the hook's layout
 * of bucket b is read from the reducer's current buckets (regions are the
 * model's parameters, in registration order) and each parameter's shape:
 * a matrix of shape[0] rows (1 for a scalar) and the rest as columns, as
 * PyTorch's tensor.view(tensor.shape[0], -1). */
#include <stdlib.h>

#include "base/error.h"
#include "ddp/powersgd.h"
#include "ddp/powersgd_impl.h"
#include "ddp/wrapper.h"

typedef struct glue {
    ddp_data_parallel_t *dm;
    ddp_powersgd_tensor *t;
    int cap;
} glue;

static int layout(void *user, int b, const ddp_powersgd_tensor **tensors, int *n, int *nbuckets)
{
    glue *g = user;
    ddp_reducer_t *r = g->dm->red;
    int nregions = 0;
    size_t count = 0;
    *nbuckets = ddp_reducer_num_buckets(r);
    DDP_TRY(ddp_reducer_bucket_info(r, b, &nregions, &count));
    if (nregions > g->cap) {
        ddp_powersgd_tensor *t = realloc(g->t, (size_t)nregions * sizeof *t);
        DDP_FAIL_IF(!t, DDP_ERR_NOMEM, "powersgd: out of memory");
        g->t = t;
        g->cap = nregions;
    }
    for (int k = 0; k < nregions; k++) {
        int region;
        DDP_TRY(ddp_reducer_bucket_region(r, b, k, &region, &g->t[k].offset));
        const ddp_param *p = ddp_model_param(g->dm->model, (size_t)region);
        DDP_FAIL_IF(!p, DDP_ERR_STATE, "powersgd: bucket %d names parameter %d, not in the model",
                    b, region);
        g->t[k].rows = p->ndim ? p->shape[0] : 1;
        g->t[k].cols = (int64_t)p->numel / g->t[k].rows;
    }
    *tensors = g->t;
    *n = nregions;
    return 0;
}

static void glue_free(void *user)
{
    glue *g = user;
    if (g)
        free(g->t);
    free(g);
}

int ddp_data_parallel_register_powersgd(ddp_data_parallel_t *dm, const ddp_powersgd_options *o,
                                        ddp_powersgd_t **out)
{
    DDP_FAIL_IF(!dm || !o || !out, DDP_ERR_INVALID_ARG, "powersgd: NULL argument");
    glue *g = calloc(1, sizeof *g);
    DDP_FAIL_IF(!g, DDP_ERR_NOMEM, "powersgd: out of memory");
    g->dm = dm;
    ddp_powersgd_t *s = NULL;
    int rc = ddp_powersgd_create(o, layout, g, &s);
    if (rc < 0) {
        glue_free(g);
        return rc;
    }
    ddp__powersgd_own_user(s, glue_free);
    ddp_comm_hook h = ddp_powersgd_hook(s);
    if ((rc = ddp_data_parallel_register_comm_hook(dm, &h)) < 0) {
        ddp_powersgd_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}
