/* ZeRO stage 2 (include/ddp/zero.h): gradients reduce-scattered bucket by
 * bucket during backward by the reducer's scatter mode (reducer.h), so that
 * each rank keeps only its shard's averaged gradient and a small pool of
 * bucket buffers instead of the full gradients.  The model's grad-write
 * hook (ext.h rule 8) points each parameter's gradient into the pool just
 * before backward writes it, and its grad-ready hook marks it ready, as the
 * reducer's header prescribes; the shard model's gradients view the
 * reducer's shard array for good. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "ddp/ext.h"
#include "ddp/reducer.h"
#include "ddp/reducer_impl.h"
#include "ddp/zero_internal.h"

static int on_write(ddp_param *p, float **grad, void *user)
{
    ddp_zero_t *z = user;
    return ddp_reducer_grad_buffer(z->reducer, p->index, grad);
}

/* The shard optimizer's zero_grad zeroed the shard model's gradients, which
 * view the reducer's shard: its next pass may write instead of add. */
static void on_zero(ddp_model_t *shard, void *user)
{
    (void)shard;
    ddp_zero_t *z = user;
    ddp__scatter_shard_zeroed(z->reducer);
}

static int on_ready(ddp_param *p, int used, void *user)
{
    ddp_zero_t *z = user;
    return used ? ddp_reducer_mark_ready(z->reducer, p->index)
                : ddp_reducer_mark_unused(z->reducer, p->index);
}

int ddp__zero_stage2_init(ddp_zero_t *z)
{
    size_t np = ddp_model_num_params(z->model);
    DDP_FAIL_IF(np > (size_t)INT32_MAX, DDP_ERR_INVALID_ARG, "ZeRO-2: %zu parameters", np);
    ddp_grad_region *regs = calloc(np ? np : 1, sizeof *regs);
    DDP_FAIL_IF(!regs, DDP_ERR_NOMEM, "ZeRO-2: out of memory");
    for (size_t i = 0; i < np; i++) {
        const ddp_param *p = ddp_model_param(z->model, i);
        regs[i] = (ddp_grad_region){p->name, NULL, p->numel};
    }
    ddp_reducer_options o = ddp_reducer_defaults();
    o.mode = DDP_REDUCER_SCATTER;
    if (z->pool_buffers > 0)
        o.pool_buffers = z->pool_buffers;
    /* The pool untouched for now: see the release below. */
    ddp__reducer_words w = {.untouched_pool = 1};
    int rc = ddp__reducer_create(z->pg, regs, (int)np, &o, &w, NULL, NULL, &z->reducer);
    free(regs); /* the create checked that every rank has these regions */
    DDP_TRY(rc);
    float *grad;
    size_t begin, count;
    DDP_TRY(ddp_reducer_shard_grad(z->reducer, &grad, &begin, &count));
    DDP_FAIL_IF(begin != z->begin || begin + count != z->end, DDP_ERR_STATE,
                "ZeRO-2: the reducer's shard [%zu, %zu) is not ZeRO's [%zu, %zu)", begin,
                begin + count, z->begin, z->end);
    z->shard_grad = grad;
    /* Every replica starts from rank 0's parameters, as DDP does (a failure
     * here is the group's: a dead peer, and the job stops). */
    float *block = ddp_model_param_block(z->model, NULL);
    if (z->total)
        DDP_TRY(ddp_pg_broadcast(z->pg, block, z->total, DDP_FLOAT32, 0));
    /* The model's gradients live in the reducer's pool from now on: its
     * own grad block (a whole copy of the parameters' size) is read again
     * only when destroy points the gradients back at it.  Handed back only
     * now, once every check across the ranks passed, so that a failed
     * create (a rank with another model, a bad option) leaves the caller's
     * gradients as they were; and before the shard model's seal (which
     * touches 2/N of the parameters' size for a moment), the pool and the
     * shard are first touched, so that none of them adds up with it into
     * the run's peak.  Only running out of memory for the shard model can
     * still fail after it. */
    size_t n;
    float *own = ddp_model_grad_block(z->model, &n);
    ddp__zero_release(own, n * sizeof(float));
    DDP_TRY(ddp__zero_build_shard(z));
    ddp__scatter_touch(z->reducer);
    for (size_t i = 0; i < z->npieces; i++)
        z->pieces[i].sp->grad = grad + z->pieces[i].sp->offset; /* a view, as in aim_grads */
    ddp_model_set_grad_write_hook(z->model, on_write, z);
    ddp_model_set_grad_ready_hook(z->model, on_ready, z);
    ddp_model_set_zero_grad_hook(z->shard, on_zero, z);
    return 0;
}

void ddp__zero_stage2_destroy(ddp_zero_t *z)
{
    if (!z->reducer)
        return;
    ddp_model_set_grad_write_hook(z->model, NULL, NULL);
    ddp_model_set_grad_ready_hook(z->model, NULL, NULL);
    ddp_model_set_zero_grad_hook(z->shard, NULL, NULL);
    /* The parameters' gradients point into the pool: back to the model's
     * own block before the pool goes (values are not needed). */
    size_t np = ddp_model_num_params(z->model);
    for (size_t i = 0; i < np; i++)
        ddp_param_set_grad(ddp_model_param(z->model, i), NULL);
    ddp_reducer_destroy(z->reducer);
    z->reducer = NULL;
}

int ddp_zero_backward(ddp_zero_t *z, ddp_tape_t *tape, ddp_var_t *loss)
{
    DDP_FAIL_IF(!z || !tape || !loss, DDP_ERR_INVALID_ARG, "ZeRO backward: NULL argument");
    DDP_FAIL_IF(z->stage != 2, DDP_ERR_STATE,
                "ZeRO backward is stage 2's; at stage 1 DDP's backward reduces the gradients");
    int rc = ddp_tape_backward(tape, loss, z->model);
    /* wait also after a failed backward: peers wait for this rank's buckets */
    int wrc = ddp_reducer_wait(z->reducer);
    return rc < 0 ? rc : wrc;
}
