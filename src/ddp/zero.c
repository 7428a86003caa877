/* ZeRO stages 1 and 2, the optimizer side (include/ddp/zero.h; costs in
 * docs/zero.md): the flat partition, the shard model whose parameters view
 * this rank's pieces of the real ones, the step over it and the gather that
 * makes every replica whole again.  No change to optim/ is needed: any
 * optimizer over the shard model keeps state for the shard alone. */
#include "ddp/zero.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/error.h"
#include "base/timeline.h"
#include "ddp/ext.h"
#include "ddp/flat_shard.h"
#include "ddp/zero_internal.h"

/* Broadcasts in flight at once in the gather of a short last shard. */
#define GATHER_BATCH 64

ddp_zero_options ddp_zero_defaults(void)
{
    return (ddp_zero_options){.stage = 1, .pool_buffers = 0};
}

void ddp__zero_partition(size_t total, int world, int rank, size_t *begin, size_t *end)
{
    ddp__flat_shard(total, world, rank, begin, end);
}

void ddp__zero_release(void *p, size_t bytes)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t b = ((uintptr_t)p + page - 1) / page * page, e = ((uintptr_t)p + bytes) / page * page;
    if (p && e > b)
        madvise((void *)b, e - b, MADV_DONTNEED); /* advice: a failure only costs memory */
}

/* The shard model: one 1-D parameter per piece of a real parameter in
 * [begin, end), named after it, in flat order, so that the shard model's
 * offset of a piece is its flat position minus begin (stage 2's shard
 * gradient is laid out that way). */
int ddp__zero_build_shard(ddp_zero_t *z)
{
    size_t np = ddp_model_num_params(z->model);
    z->pieces = calloc(np ? np : 1, sizeof *z->pieces);
    DDP_FAIL_IF(!z->pieces, DDP_ERR_NOMEM, "ZeRO: out of memory");
    DDP_TRY(ddp_model_create(&z->shard));
    for (size_t i = 0; i < np; i++) {
        ddp_param *p = ddp_model_param(z->model, i);
        size_t b = p->offset > z->begin ? p->offset : z->begin;
        size_t e = p->offset + p->numel < z->end ? p->offset + p->numel : z->end;
        if (b >= e)
            continue;
        ddp__zero_piece *pc = &z->pieces[z->npieces++];
        pc->real = p;
        pc->local = b - p->offset;
        pc->len = e - b;
        int64_t shape[1] = {(int64_t)pc->len};
        DDP_TRY(ddp_model_add_param(z->shard, p->name, 1, shape, &pc->sp));
    }
    DDP_TRY(ddp_model_seal(z->shard));
    for (size_t i = 0; i < z->npieces; i++) {
        ddp__zero_piece *pc = &z->pieces[i];
        pc->sp = ddp_model_param(z->shard, i); /* sealing moved them */
        DDP_TRY(ddp_param_set_data(pc->sp, pc->real->data + pc->local));
    }
    /* The shard model's own blocks, touched by its seal, now back nothing:
     * its parameters view the real block and its gradients the averaged
     * ones.  Without this they would cost 2/N of the parameters per rank,
     * what stage 1 saves at N = 2. */
    size_t n;
    float *own = ddp_model_param_block(z->shard, &n);
    ddp__zero_release(own, n * sizeof(float));
    own = ddp_model_grad_block(z->shard, &n);
    ddp__zero_release(own, n * sizeof(float));
    return 0;
}

int ddp_zero_create(ddp_model_t *model, ddp_pg_t *pg, const ddp_zero_options *opts,
                    ddp_zero_t **out)
{
    DDP_FAIL_IF(!model || !pg || !out, DDP_ERR_INVALID_ARG, "ZeRO: NULL model, group or output");
    ddp_zero_options o = opts ? *opts : ddp_zero_defaults();
    DDP_FAIL_IF(o.stage != 1 && o.stage != 2, DDP_ERR_INVALID_ARG,
                "ZeRO: stage %d is not 1 or 2", o.stage);
    DDP_FAIL_IF(o.pool_buffers < 0, DDP_ERR_INVALID_ARG, "ZeRO: pool_buffers %d is negative",
                o.pool_buffers);
    DDP_TRY(ddp_model_seal(model));
    ddp_zero_t *z = calloc(1, sizeof *z);
    DDP_FAIL_IF(!z, DDP_ERR_NOMEM, "ZeRO: out of memory");
    z->model = model;
    z->pg = pg;
    z->stage = o.stage;
    z->pool_buffers = o.pool_buffers;
    z->rank = ddp_pg_rank(pg);
    z->world = ddp_pg_size(pg);
    ddp_model_param_block(model, &z->total);
    ddp__zero_partition(z->total, z->world, z->rank, &z->begin, &z->end);
    int rc = z->stage == 2 ? ddp__zero_stage2_init(z) : ddp__zero_build_shard(z);
    if (rc < 0) {
        ddp_zero_destroy(z);
        return rc;
    }
    *out = z;
    return 0;
}

void ddp_zero_destroy(ddp_zero_t *z)
{
    if (!z)
        return;
    ddp__zero_stage2_destroy(z);
    ddp_model_destroy(z->shard);
    free(z->pieces);
    free(z);
}

ddp_model_t *ddp_zero_shard_model(ddp_zero_t *z) { return z ? z->shard : NULL; }

void ddp_zero_shard_range(const ddp_zero_t *z, size_t *begin, size_t *end)
{
    if (begin)
        *begin = z ? z->begin : 0;
    if (end)
        *end = z ? z->end : 0;
}

int ddp_zero_stage(const ddp_zero_t *z) { return z ? z->stage : 0; }

/* Stage 1: aims each piece's gradient at this step's averaged gradient,
 * wherever DDP keeps it now (stage 2's view the reducer's shard array for
 * good).  Assigned, not moved with ddp_param_set_grad: the piece is a pure
 * view, and set_grad would first copy the previous view's contents, memory
 * that DDP may have freed since (its one-time bucket rebuild). */
static void aim_grads(ddp_zero_t *z)
{
    for (size_t i = 0; z->stage == 1 && i < z->npieces; i++)
        z->pieces[i].sp->grad = z->pieces[i].real->grad + z->pieces[i].local;
}

int ddp__zero_gather(ddp_zero_t *z)
{
    if (z->world == 1 || z->total == 0)
        return 0;
    float *block = ddp_model_param_block(z->model, NULL);
    size_t S = ddp__flat_shard_size(z->total, z->world);
    if (S * (size_t)z->world == z->total) /* in place: our shard is the send block */
        return ddp_pg_all_gather(z->pg, block + z->begin, block, S, DDP_FLOAT32);
    /* The last shard is short, and an in-place all-gather needs world * S
     * floats: the block has fewer.  One broadcast per shard instead, from
     * its owner, in place: the same bytes per rank as the ring all-gather
     * ((N-1)/N of the block), all queued at once on the group's thread. */
    int rc = 0;
    for (int r0 = 0; r0 < z->world && rc == 0; r0 += GATHER_BATCH) {
        ddp_work_t *w[GATHER_BATCH];
        int nw = 0;
        for (int r = r0; r < z->world && r < r0 + GATHER_BATCH && rc == 0; r++) {
            size_t b, e;
            ddp__zero_partition(z->total, z->world, r, &b, &e);
            if (e > b && (rc = ddp_pg_broadcast_async(z->pg, block + b, e - b, DDP_FLOAT32, r,
                                                      &w[nw])) == 0)
                nw++;
        }
        for (int i = 0; i < nw; i++) { /* all of them, also after a failed launch */
            int wrc = ddp_work_wait(w[i], ddp_pg_timeout(z->pg));
            rc = rc ? rc : wrc;
            ddp_work_destroy(w[i]);
        }
    }
    return rc;
}

int ddp_zero_step(ddp_zero_t *z, ddp_optim_t *opt)
{
    DDP_FAIL_IF(!z || !opt, DDP_ERR_INVALID_ARG, "ZeRO step: NULL handle or optimizer");
    uint64_t t0 = ddp__tl_begin();
    aim_grads(z);
    DDP_TRY(ddp_optim_step(opt));
    ddp_model_bump_param_version(z->model);
    int rc = ddp__zero_gather(z);
    ddp__tl_end(t0, "zero step", "stage", z->stage);
    return rc;
}

size_t ddp_zero_state_bytes(const ddp_zero_t *z, const ddp_optim_t *opt)
{
    if (!z || !opt)
        return 0;
    return (size_t)ddp_optim_num_states(opt) * (z->end - z->begin) * sizeof(float);
}
