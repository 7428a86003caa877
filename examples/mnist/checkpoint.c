/* ddp-mnist, the reference program: checkpoints (--checkpoint-dir, rank 0
 * writes) and resuming from them (rank 0 reads, every rank gets position
 * and optimizer state by broadcast).  --zero's checkpoints are sharded
 * instead (zero.c).  With --powersgd every rank also writes its PowerSGD
 * state (its own error feedback) beside the checkpoint, and reads it back
 * on resume (powersgd_state.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mnist.h"

int save_checkpoint(job *j, int64_t epoch, int64_t step)
{
    ddp_train_state st = {.epoch = epoch, .step = step, .global_step = j->st.global_step,
                          .seed = j->a->seed, .world_size = j->world};
    if (j->zero) /* every rank writes its shard (zero.c) */
        return zero_checkpoint_save(j, &st);
    if (j->psgd) /* with every rank's PowerSGD state (powersgd_state.c) */
        return powersgd_checkpoint_save(j, &st);
    return j->rank == 0 ? ddp_checkpoint_save(j->ckpt, j->model, j->opt, &st) : 0;
}

/* Rank 0 loads the checkpoint when resuming: 1 loaded, 0 none to load, < 0
 * failed (message printed). */
int load_checkpoint(job *j)
{
    if (!j->ckpt[0] || !(j->a->resume || j->restart > 0) || j->rank != 0)
        return 0;
    /* sharded: every rank loads, once ZeRO or the pipeline is set up */
    if ((j->a->zero || j->a->pipeline_stages) && j->pg)
        return 0;
    int rc = ddp_checkpoint_load(j->ckpt, j->model, j->opt, &j->st);
    if (rc == DDP_ERR_NOT_FOUND) {
        printf("No checkpoint at %s yet: starting from the beginning\n", j->ckpt);
        return 0;
    }
    if (rc < 0) {
        stop_error("%s", ddp_last_error());
        return rc;
    }
    if (j->st.world_size != j->world) {
        stop_error("%s was written by %d ranks; resume it with %d, not %d",
                   j->ckpt, j->st.world_size, j->st.world_size, j->world);
        return DDP_ERR_MISMATCH;
    }
    printf("Resuming from %s: epoch %lld, step %lld\n", j->ckpt, (long long)j->st.epoch + 1,
           (long long)j->st.step);
    return 1;
}

/* Rank 0's load result, position and optimizer state go to every rank (the
 * parameters follow with DDP's broadcast), so only rank 0 needs the file.
 * Returns 0, or the exit status once this rank has said why it stops: 2 when
 * rank 0 could not load the checkpoint, 1 when sharing it failed (a peer
 * gone, a timeout). */
int share_checkpoint(job *j, int loaded)
{
    if (!j->pg)
        return loaded < 0 ? 2 : 0;
    int64_t v[5] = {loaded, j->st.epoch, j->st.step, j->st.global_step, ddp_optim_steps(j->opt)};
    int rc = ddp_pg_broadcast(j->pg, v, 5, DDP_INT64, 0);
    if (rc == 0 && v[0] < 0) {
        if (j->rank != 0) /* rank 0 said why already */
            stop_error("rank %d: rank 0 could not load %s", j->rank, j->ckpt);
        return 2;
    }
    if (rc == 0 && v[0] > 0) {
        j->resumed = 1;
        j->st.epoch = v[1];
        j->st.step = v[2];
        j->st.global_step = v[3];
        ddp_optim_set_steps(j->opt, v[4]);
    }
    for (int k = 0; rc == 0 && v[0] > 0 && k < ddp_optim_num_states(j->opt); k++) {
        const char *name;
        float *data;
        size_t n;
        if ((rc = ddp_optim_state(j->opt, k, &name, &data, &n)) == 0)
            rc = ddp_pg_broadcast(j->pg, data, n, DDP_FLOAT32, 0);
    }
    if (rc < 0) {
        stop_error("rank %d: sharing the checkpoint %s from rank 0 failed: %s",
                   j->rank, j->ckpt, ddp_last_error());
        return 1;
    }
    return 0;
}
