/* ddp-mnist, the reference program: checkpoints (--checkpoint-dir, rank 0
 * writes) and resuming from them (rank 0 reads, every rank gets position
 * and optimizer state by broadcast).  --zero's checkpoints are sharded
 * instead (zero.c).  With --powersgd every rank also writes its PowerSGD
 * state (its own error feedback) beside the checkpoint, and reads it back
 * on resume. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mnist.h"

/* Rank r's PowerSGD state: "<checkpoint>.powersgd.rank<r>". */
static void powersgd_path(const job *j, char *path, size_t len)
{
    snprintf(path, len, "%s.powersgd.rank%d", j->ckpt, j->rank);
}

/* Writes this rank's PowerSGD state (to a temporary name, then renamed, so
 * that a crash mid-write leaves the previous one whole). */
static int save_powersgd(const job *j)
{
    char path[4200], tmp[4300];
    void *blob = NULL;
    size_t len = 0;
    powersgd_path(j, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int rc = ddp_powersgd_state_save(j->psgd, &blob, &len);
    if (rc < 0)
        return rc;
    FILE *f = fopen(tmp, "wb");
    int bad = !f || fwrite(blob, 1, len, f) != len;
    bad |= f && fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) { /* said here: the library has no message for it */
        stop_error("rank %d: cannot write %s: %s", j->rank, path, strerror(errno));
        ddp_clear_error();
        rc = DDP_ERR_IO;
    }
    free(blob);
    return rc;
}

int save_checkpoint(job *j, int64_t epoch, int64_t step)
{
    ddp_train_state st = {.epoch = epoch, .step = step, .global_step = j->st.global_step,
                          .seed = j->a->seed, .world_size = j->world};
    if (j->zero) /* every rank writes its shard (zero.c) */
        return zero_checkpoint_save(j, &st);
    if (j->psgd) {
        int rc = save_powersgd(j);
        if (rc < 0)
            return rc;
    }
    return j->rank == 0 ? ddp_checkpoint_save(j->ckpt, j->model, j->opt, &st) : 0;
}

/* This rank's PowerSGD state back from its file: 0, or 2 once this rank
 * has said why it cannot. */
static int load_powersgd(job *j)
{
    char path[4200];
    powersgd_path(j, path, sizeof path);
    FILE *f = fopen(path, "rb");
    if (!f) {
        stop_error("rank %d: the checkpoint %s has no PowerSGD state for this rank: %s: %s",
                   j->rank, j->ckpt, path, strerror(errno));
        return 2;
    }
    size_t cap = 1 << 20, len = 0, n;
    char *blob = malloc(cap);
    while (blob && (n = fread(blob + len, 1, cap - len, f)) > 0) {
        len += n;
        char *more = len == cap ? realloc(blob, cap *= 2) : blob;
        if (!more)
            free(blob);
        blob = more;
    }
    fclose(f);
    int rc = blob ? ddp_powersgd_state_load(j->psgd, blob, len) : DDP_ERR_NOMEM;
    if (rc < 0)
        stop_error("rank %d: %s: %s", j->rank, path, blob ? ddp_last_error() : "out of memory");
    free(blob);
    if (rc < 0)
        return 2;
    return 0;
}

/* After a resume, every rank's PowerSGD state comes back from its file;
 * the ranks agree on the outcome, so that all stop when one cannot (not
 * just the one, leaving the others to fail with "left the group").  0, or
 * the exit status once this rank has said why it stops. */
int resume_powersgd(job *j)
{
    if (!j->psgd || !j->resumed)
        return 0;
    int32_t mine = load_powersgd(j), st = mine;
    int rc = ddp_pg_all_reduce(j->pg, &st, 1, DDP_INT32, DDP_MAX);
    if (rc < 0) {
        stop_error("rank %d: agreeing on the PowerSGD state failed: %s", j->rank,
                   ddp_last_error());
        return 1;
    }
    if (st != 0 && mine == 0)
        stop_error("rank %d: another rank could not load its PowerSGD state: stopping", j->rank);
    return st;
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
