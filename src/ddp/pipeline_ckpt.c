/* Checkpoints of a pipelined model (include/ddp/pipeline.h) in the sharded
 * format of ZeRO's (docs/zero.md): ddp_pipeline_split keeps the unsplit
 * Sequential's names and order, so stage s's parameter block is one
 * contiguous range of the whole model's flat block, and a stage is a shard
 * whose range is that block.  Replica 0's stage s writes shard s; rank 0
 * (replica 0's stage 0), which holds only its own stage, learns every
 * stage's tensors by an all-gather and writes the index.  Being that
 * format, such a checkpoint loads into a pipeline cut anywhere else, into
 * ZeRO at any world size, and exports to one file (and ZeRO's load into a
 * pipeline), all through shard_ckpt*.c. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "ddp/pipeline_internal.h"
#include "ddp/shard_ckpt.h"

/* A parameter as rank 0 needs it for the index (int64 fields only: sent as
 * bytes between ranks of one build). */
typedef struct pp_rec {
    char name[DDP_PARAM_NAME_MAX];
    int64_t ndim, numel;
    int64_t shape[DDP_TENSOR_MAX_DIM];
} pp_rec;

/* Every rank's (parameters, buffers) counts, replica 0's stages' records:
 * world x kmax records in all[]. */
typedef struct pp_tables {
    int64_t (*counts)[2];
    int64_t kmax;
    pp_rec *all;
} pp_tables;

static int gather_tables(ddp_pipeline_t *pp, pp_tables *t)
{
    int world = ddp_pg_size(pp->world);
    size_t np = ddp_model_num_params(pp->model);
    int64_t mine[2] = {pp->replica == 0 ? (int64_t)np : 0,
                       (int64_t)ddp_model_num_buffers(pp->model)};
    t->counts = calloc((size_t)world, sizeof *t->counts);
    DDP_FAIL_IF(!t->counts, DDP_ERR_NOMEM, "pipeline checkpoint: out of memory");
    DDP_TRY(ddp_pg_all_gather(pp->world, mine, t->counts, 2, DDP_INT64));
    t->kmax = 1;
    for (int r = 0; r < world; r++)
        t->kmax = t->counts[r][0] > t->kmax ? t->counts[r][0] : t->kmax;
    pp_rec *own = calloc((size_t)t->kmax, sizeof *own);
    t->all = calloc((size_t)world * (size_t)t->kmax, sizeof *t->all);
    int rc = 0;
    DDP_FAIL_OUT(!own || !t->all, DDP_ERR_NOMEM, "pipeline checkpoint: out of memory");
    for (size_t i = 0; i < (size_t)mine[0]; i++) {
        const ddp_param *p = ddp_model_param(pp->model, i);
        snprintf(own[i].name, sizeof own[i].name, "%s", p->name);
        own[i].ndim = p->ndim, own[i].numel = (int64_t)p->numel;
        for (int d = 0; d < p->ndim; d++)
            own[i].shape[d] = p->shape[d];
    }
    rc = ddp_pg_all_gather(pp->world, own, t->all, (size_t)t->kmax * sizeof *own, DDP_UINT8);
out:
    free(own);
    return rc;
}

/* Rank 0: the whole model's tensors in stage order and the stages' flat
 * bounds, from replica 0's stages (world ranks 0 .. S-1). */
static int build_index_tables(ddp_pipeline_t *pp, const pp_tables *t, ddp__ckpt_entry **entries,
                              size_t *n, size_t *bounds)
{
    size_t total = 0;
    *n = 0;
    for (int s = 0; s < pp->S; s++)
        *n += (size_t)t->counts[s][0];
    *entries = calloc(*n ? *n : 1, sizeof **entries);
    DDP_FAIL_IF(!*entries, DDP_ERR_NOMEM, "pipeline checkpoint: out of memory");
    size_t k = 0;
    for (int s = 0; s < pp->S; s++) {
        bounds[s] = total;
        for (int64_t i = 0; i < t->counts[s][0]; i++, k++) {
            const pp_rec *r = &t->all[(size_t)s * (size_t)t->kmax + (size_t)i];
            (*entries)[k] = (ddp__ckpt_entry){r->name, (int)r->ndim, r->shape, total,
                                              (size_t)r->numel};
            total += (size_t)r->numel;
        }
    }
    bounds[pp->S] = total;
    return 0;
}

/* Buffers (BatchNorm's statistics) live on the stages that own them; the
 * format keeps one rank's whole.  Not supported yet: every rank sees the
 * same counts, so every rank refuses alike. */
static int refuse_buffers(ddp_pipeline_t *pp, const pp_tables *t)
{
    for (int r = 0; r < ddp_pg_size(pp->world); r++)
        DDP_FAIL_IF(t->counts[r][1] > 0, DDP_ERR_UNSUPPORTED,
                    "pipeline checkpoint: stage %d (rank %d) has %lld module buffers; "
                    "checkpoints of pipelined models with buffers are not supported yet",
                    r % pp->S, r, (long long)t->counts[r][1]);
    return 0;
}

int ddp_pipeline_checkpoint_save(const char *dir, ddp_pipeline_t *pp, ddp_optim_t *opt,
                                 const ddp_train_state *st)
{
    DDP_FAIL_IF(!dir || !pp || !st, DDP_ERR_INVALID_ARG,
                "pipeline checkpoint save: NULL argument");
    DDP_FAIL_IF(pp->failed, DDP_ERR_STATE,
                "pipeline checkpoint save: a step of this pipeline failed; its stages are out "
                "of step");
    pp_tables t = {0};
    size_t np = ddp_model_num_params(pp->model), nent = 0;
    ddp__ckpt_entry *entries = NULL;
    ddp__ckpt_piece *pieces = calloc(np ? np : 1, sizeof *pieces);
    size_t *bounds = calloc((size_t)pp->S + 1, sizeof *bounds);
    int rc = !pieces || !bounds
                 ? DDP_ERROR(DDP_ERR_NOMEM, "pipeline checkpoint: out of memory")
                 : gather_tables(pp, &t);
    if (rc == 0)
        rc = refuse_buffers(pp, &t);
    if (rc == 0 && pp->rank == 0)
        rc = build_index_tables(pp, &t, &entries, &nent, bounds);
    for (size_t i = 0; rc == 0 && i < np; i++) {
        const ddp_param *p = ddp_model_param(pp->model, i);
        pieces[i] = (ddp__ckpt_piece){p->name, p->numel, p->data, p->offset};
    }
    ddp__ckpt_save s = {.what = "pipeline checkpoint", .pg = pp->world,
                        .shard = pp->replica == 0 ? pp->stage : -1, .nshards = pp->S,
                        .replicas = pp->R, .pieces = pieces, .npieces = np, .opt = opt,
                        .total = bounds ? bounds[pp->S] : 0, .bounds = bounds,
                        .entries = entries, .nentries = nent};
    if (rc == 0)
        rc = ddp__ckpt_save_run(dir, &s, st);
    free(t.counts);
    free(t.all);
    free(entries);
    free(pieces);
    free(bounds);
    return rc;
}

int ddp_pipeline_checkpoint_load(const char *dir, ddp_pipeline_t *pp, ddp_optim_t *opt,
                                 ddp_train_state *st)
{
    DDP_FAIL_IF(!dir || !pp, DDP_ERR_INVALID_ARG, "pipeline checkpoint load: NULL argument");
    return ddp__ckpt_load_part(dir, pp->world, pp->model, opt, st);
}
