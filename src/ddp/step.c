/* The DDP step: forward (the join protocol's flag first), backward through
 * nn's grad-ready hook, each parameter marked ready in the reducer the
 * moment its gradient is final (the reducer launches the buckets and waits
 * for them, reducer_step.c), and an optimizer step taken under no_sync
 * caught (wrapper.h). */
#include <stdio.h>

#include "base/error.h"
#include "base/timeline.h"
#include "ddp/buffers.h"
#include "ddp/wrapper.h"

/* nn's grad-ready hook: p's gradient is final (used) or p is not in the graph. */
int ddp__dp_on_grad_ready(ddp_param *p, int used, void *user)
{
    ddp_data_parallel_t *dm = user;
    DDP_FAIL_IF(!dm->in_backward, DDP_ERR_STATE,
                "DDP: call ddp_data_parallel_backward, not ddp_tape_backward, on a model wrapped "
                "by DDP (its gradients would not be averaged)");
    return used ? ddp_reducer_mark_ready(dm->red, p->index)
                : ddp_reducer_mark_unused(dm->red, p->index);
}

int ddp__dp_on_grad_write(ddp_param *p, float **grad, void *user)
{
    ddp_data_parallel_t *dm = user;
    DDP_FAIL_IF(!dm->in_backward, DDP_ERR_STATE,
                "DDP: call ddp_data_parallel_backward, not ddp_tape_backward, on a model wrapped "
                "by DDP (its gradients would not be averaged)");
    return ddp_reducer_grad_buffer(dm->red, p->index, grad);
}

/* no_sync left on across an optimizer step lets the replicas diverge: that
 * step used this rank's gradients alone.  Caught at the next forward or
 * backward: the parameters changed (their version, nn.h) since a no_sync
 * backward whose gradients no synchronising backward has reduced yet.
 * Reported once. */
static int check_no_sync_step(ddp_data_parallel_t *dm)
{
    DDP_FAIL_IF(dm->no_sync_refused, DDP_ERR_INVALID_ARG,
                "DDP: no_sync was asked for with reduce_scatter, which has none (it would keep "
                "the full gradients alive): every backward reduces into the shard, which "
                "accumulates until ddp_data_parallel_zero_shard_grad");
    if (!dm->unsynced || ddp_model_param_version(dm->model) == dm->unsynced_version)
        return 0;
    dm->unsynced = 0;
    return DDP_ERROR(DDP_ERR_STATE,
                     "DDP: the parameters changed (ddp_optim_step?) after a backward under "
                     "no_sync, before any synchronising backward: that step used this rank's "
                     "gradients alone, never averaged, so the replicas have diverged; turn "
                     "no_sync off (ddp_data_parallel_set_no_sync(dm, 0)) for the last backward "
                     "before each optimizer step (PyTorch: run it outside model.no_sync())");
}

static int backward(ddp_data_parallel_t *dm, ddp_tape_t *tape, ddp_var_t *loss)
{
    DDP_TRY(check_no_sync_step(dm));
    ddp_reducer_t *r = dm->red;
    dm->in_backward = 1;
    if (r->no_sync) {
        int rc = ddp_tape_backward(tape, loss, dm->model);
        dm->in_backward = 0;
        if (rc == 0 && !dm->unsynced) {
            dm->unsynced = 1;
            dm->unsynced_version = ddp_model_param_version(dm->model);
        }
        return rc;
    }
    dm->unsynced = 0; /* this backward reduces what no_sync accumulated */
    ddp__reducer_reset(r);
    int rc = ddp_tape_backward(tape, loss, dm->model);
    dm->in_backward = 0;
    if (rc == 0)
        return ddp_reducer_wait(r);
    /* Backward failed (a hook's error): leave nothing in flight. */
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", ddp_last_error());
    ddp__reducer_wait_buckets(r, 0);
    ddp__reducer_reset(r);
    ddp__error_restore(saved);
    return rc;
}

int ddp_data_parallel_backward(ddp_data_parallel_t *dm, ddp_tape_t *tape, ddp_var_t *loss)
{
    DDP_FAIL_IF(!dm || !tape || !loss, DDP_ERR_INVALID_ARG,
                "ddp_data_parallel_backward: NULL argument");
    uint64_t t0 = ddp__tl_begin();
    int rc = backward(dm, tape, loss);
    ddp__tl_end(t0, dm->red->no_sync ? "DDP backward (no_sync)" : "DDP backward", NULL, 0);
    return rc;
}

static int forward(ddp_data_parallel_t *dm, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y)
{
    DDP_TRY(check_no_sync_step(dm));
    DDP_TRY(ddp_reducer_join_step(dm->red));
    /* PyTorch's broadcast_buffers; not under join (a joined rank could not
     * answer it) */
    if (dm->opts.broadcast_buffers && !dm->red->join_enabled)
        DDP_TRY(ddp__broadcast_buffers(dm->pg, dm->model));
    return ddp_model_forward(dm->model, tape, x, y);
}

int ddp_data_parallel_forward(ddp_data_parallel_t *dm, ddp_tape_t *tape, ddp_var_t *x,
                              ddp_var_t **y)
{
    DDP_FAIL_IF(!dm, DDP_ERR_INVALID_ARG, "ddp_data_parallel_forward: NULL module");
    uint64_t t0 = ddp__tl_begin();
    int rc = forward(dm, tape, x, y);
    ddp__tl_end(t0, "DDP forward", NULL, 0);
    return rc;
}
