/* ddp-mnist --zero 1|2: the optimizer keeps the state of this rank's shard
 * only (include/ddp/zero.h).  The model, DDP and the data stay as they are;
 * the SGD made in main.c is replaced by the same SGD over the shard model,
 * and each step gathers the updated shards. */
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

/* The real gradients: the shard model's are views of a part of them. */
void zero_grad(job *j)
{
    if (j->zero)
        ddp_model_zero_grad(j->model);
    else
        ddp_optim_zero_grad(j->opt);
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
