/* Cutting a module list into pipeline stages (ddp_pipeline_split,
 * include/ddp/pipeline.h): every rank builds the same list with the same
 * seeds and keeps its stage's modules, so the stages start from the values
 * the unsplit model would have, under the unsplit model's names. */
#include <stdio.h>

#include "base/error.h"
#include "ddp/pipeline.h"

static int check_cuts(int n, const int *cuts, int stages, int stage)
{
    DDP_FAIL_IF(n < 1 || stages < 1 || stage < 0 || stage >= stages, DDP_ERR_INVALID_ARG,
                "ddp_pipeline_split: %d modules, stage %d of %d", n, stage, stages);
    DDP_FAIL_IF(cuts[0] != 0 || cuts[stages] != n, DDP_ERR_INVALID_ARG,
                "ddp_pipeline_split: cuts must run from 0 to %d modules (got %d .. %d)", n,
                cuts[0], cuts[stages]);
    for (int s = 0; s < stages; s++)
        DDP_FAIL_IF(cuts[s + 1] <= cuts[s], DDP_ERR_INVALID_ARG,
                    "ddp_pipeline_split: stage %d would hold modules [%d, %d): cuts must "
                    "ascend strictly", s, cuts[s], cuts[s + 1]);
    return 0;
}

int ddp_pipeline_split(ddp_module_t *const *modules, int n, const int *cuts, int stages,
                       int stage, ddp_model_t **out)
{
    DDP_FAIL_IF(!modules, DDP_ERR_INVALID_ARG, "ddp_pipeline_split: NULL modules");
    int rc = !cuts || !out ? DDP_ERROR(DDP_ERR_INVALID_ARG, "ddp_pipeline_split: NULL argument")
                           : check_cuts(n, cuts, stages, stage);
    ddp_model_t *m = NULL;
    if (rc == 0) {
        *out = NULL;
        rc = ddp_model_create(&m);
    }
    /* ownership of every module is taken, also on failure: the model's
     * part goes to it (add_module takes a module even when it fails) */
    int from = rc == 0 ? cuts[stage] : n, to = rc == 0 ? cuts[stage + 1] : n;
    for (int i = 0; i < n; i++)
        if (i < from || i >= to)
            ddp_module_destroy(modules[i]);
    for (int i = from; i < to; i++) {
        char name[16];
        snprintf(name, sizeof name, "%d", i); /* Sequential's "<i>.<name>" */
        if (rc == 0)
            rc = ddp_model_add_module(m, name, modules[i]);
        else
            ddp_module_destroy(modules[i]);
    }
    if (rc == 0)
        rc = ddp_model_seal(m);
    if (rc < 0) {
        ddp_model_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}
