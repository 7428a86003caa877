/* ddp-mnist --zero 1|2: the optimizer keeps the state of this rank's shard
 * only (include/ddp/zero.h).  The model, DDP and the data stay as they are;
 * the SGD made in main.c is replaced by the same SGD over the shard model,
 * and each step gathers the updated shards.  --zero 2 goes without DDP:
 * its backward reduce-scatters the gradients bucket by bucket. */
#include <stdio.h>

#include "mnist.h"

int zero_setup(job *j)
{
    if (!j->a->zero || !j->pg) /* one process holds everything anyway */
        return 0;
    ddp_zero_options zo = ddp_zero_defaults();
    zo.stage = (int)j->a->zero;
    int rc = ddp_zero_create(j->model, j->pg, &zo, &j->zero);
    if (rc < 0)
        return rc;
    ddp_sgd_options so = ddp_sgd_defaults(j->a->lr);
    so.momentum = j->a->momentum;
    ddp_optim_destroy(j->opt);
    j->opt = NULL;
    return ddp_sgd_create(ddp_zero_shard_model(j->zero), &so, &j->opt);
}

/* Stage 1: the real gradients (the shard model's are views of a part of
 * them); stage 2: the shard's, which is all there is. */
void zero_grad(job *j)
{
    if (j->zero && j->a->zero == 1)
        ddp_model_zero_grad(j->model);
    else
        ddp_optim_zero_grad(j->opt);
}

int backward(job *j, ddp_var_t *loss)
{
    if (j->zero && j->a->zero == 2)
        return ddp_zero_backward(j->zero, j->tape, loss);
    return j->dm ? ddp_data_parallel_backward(j->dm, j->tape, loss)
                 : ddp_tape_backward(j->tape, loss, j->model);
}

int optimizer_step(job *j)
{
    return j->zero ? ddp_zero_step(j->zero, j->opt) : ddp_optim_step(j->opt);
}

void zero_teardown(job *j)
{
    ddp_optim_destroy(j->opt); /* made over the shard model: before it goes */
    j->opt = NULL;
    ddp_zero_destroy(j->zero);
    j->zero = NULL;
}
