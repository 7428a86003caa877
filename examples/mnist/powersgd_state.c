/* ddp-mnist --powersgd with checkpoints: every rank's PowerSGD state (its
 * own error feedback and Q) in a file of its own beside the checkpoint,
 * named after the step it belongs to: "<checkpoint>.powersgd.step<G>.rank<r>".
 *
 * Why the step in the name: a save is two phases.  Every rank writes its
 * state (durably: fsync'd), and the ranks agree that all did; only then
 * does rank 0 replace the checkpoint, and only once every rank knows that
 * it did does each remove its older states.  A job stopped at any point
 * (a rank killed, a disk full, a node lost) resumes from whichever
 * checkpoint is in place with that checkpoint's own states: a save never
 * overwrites or removes the states the current checkpoint names.  A
 * resume reads the file of the checkpoint's own step, and refuses a state
 * whose iteration count is not that step (a file renamed by hand, or
 * written by a version without the step in the name). */
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "mnist.h"

/* Rank r's state of global step g. */
static void state_path(const job *j, int64_t g, char *path, size_t len)
{
    snprintf(path, len, "%s.powersgd.step%lld.rank%d", j->ckpt, (long long)g, j->rank);
}

/* The folder of the checkpoint path (".", "/" or its leading part). */
static void ckpt_dir(const job *j, char *dir, size_t len)
{
    const char *slash = strrchr(j->ckpt, '/');
    if (!slash)
        snprintf(dir, len, ".");
    else
        snprintf(dir, len, "%.*s", slash == j->ckpt ? 1 : (int)(slash - j->ckpt), j->ckpt);
}

/* Writes this rank's state of this step durably (ddp_powersgd_state_save_file:
 * a temporary file, fsync'd, renamed, the folder fsync'd), so that neither
 * a crash mid-write nor a power loss after the checkpoint leaves a half or
 * empty file under the name the checkpoint will point at. */
static int save_state(const job *j)
{
    char path[4200];
    state_path(j, j->st.global_step, path, sizeof path);
    int rc = ddp_powersgd_state_save_file(j->psgd, path);
    if (rc < 0) {
        stop_error("rank %d: %s", j->rank, ddp_last_error()); /* names the file */
        ddp_clear_error();
    }
    return rc;
}

/* Removes this rank's state files of other steps than the checkpoint's
 * (best effort: a file left over costs only disk, and the next save tries
 * again), their temporary files left by a crash mid-write, and the one
 * file of versions before the step was in the name. */
static void prune_states(const job *j)
{
    char dir[4096], keep[4200], legacy[4200], mine[64], mine_tmp[64];
    const char *slash = strrchr(j->ckpt, '/');
    const char *base = slash ? slash + 1 : j->ckpt;
    ckpt_dir(j, dir, sizeof dir);
    snprintf(mine, sizeof mine, ".rank%d", j->rank);
    snprintf(mine_tmp, sizeof mine_tmp, ".rank%d.tmp", j->rank);
    snprintf(keep, sizeof keep, "%s.powersgd.step%lld%s", base, (long long)j->st.global_step,
             mine);
    snprintf(legacy, sizeof legacy, "%s.powersgd%s", j->ckpt, mine);
    unlink(legacy);
    size_t blen = strlen(base), mlen = strlen(mine), tlen = strlen(mine_tmp);
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        int ours = (n > blen + mlen && strcmp(e->d_name + n - mlen, mine) == 0) ||
                   (n > blen + tlen && strcmp(e->d_name + n - tlen, mine_tmp) == 0);
        if (!ours || strncmp(e->d_name, base, blen) != 0 ||
            strncmp(e->d_name + blen, ".powersgd.step", 14) != 0 || strcmp(e->d_name, keep) == 0)
            continue;
        char path[8400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d)
        closedir(d);
}

/* Whether every rank's `mine` is 0 (an all-reduce of the failures): 0
 * when all are, DDP_ERR_IO once this rank has said that another one
 * failed, or the all-reduce's error. */
static int all_ok(job *j, int mine)
{
    int32_t bad = mine < 0;
    int rc = ddp_pg_all_reduce(j->pg, &bad, 1, DDP_INT32, DDP_MAX);
    if (rc < 0)
        return rc;
    if (bad && mine == 0) {
        stop_error("rank %d: another rank could not write its part of the checkpoint %s: "
                   "stopping",
                   j->rank, j->ckpt);
        ddp_clear_error();
        return DDP_ERR_IO;
    }
    return bad ? mine : 0;
}

int powersgd_checkpoint_save(job *j, const ddp_train_state *st)
{
    /* Phase 1: every rank's state of this step, and all know all are
     * there before the checkpoint names them. */
    int rc = all_ok(j, save_state(j));
    if (rc < 0)
        return rc;
    /* Phase 2: rank 0's checkpoint, and all know it is in place before the
     * states it no longer names go. */
    rc = j->rank == 0 ? ddp_checkpoint_save(j->ckpt, j->model, j->opt, st) : 0;
    if (rc < 0 && j->rank == 0)
        stop_error("rank 0: %s", ddp_last_error());
    int32_t r0 = rc;
    int brc = ddp_pg_broadcast(j->pg, &r0, 1, DDP_INT32, 0);
    if (brc < 0)
        return brc;
    if (r0 < 0) {
        if (j->rank != 0)
            stop_error("rank %d: rank 0 could not write the checkpoint %s: stopping", j->rank,
                       j->ckpt);
        ddp_clear_error();
        return DDP_ERR_IO;
    }
    prune_states(j);
    return 0;
}

/* This rank's state back from the file of the checkpoint's step: 0, or 2
 * once this rank has said why it cannot. */
static int load_state(job *j)
{
    char path[4200];
    state_path(j, j->st.global_step, path, sizeof path);
    int rc = ddp_powersgd_state_load_file(j->psgd, path);
    if (rc == DDP_ERR_NOT_FOUND) {
        stop_error("rank %d: the checkpoint %s (step %lld) has no PowerSGD state for this "
                   "rank: %s",
                   j->rank, j->ckpt, (long long)j->st.global_step, ddp_last_error());
        return 2;
    }
    if (rc < 0) {
        stop_error("rank %d: %s", j->rank, ddp_last_error());
        return 2;
    }
    /* One PowerSGD iteration per step: a state of another step would pair
     * this checkpoint's weights with another step's error feedback. */
    if (ddp_powersgd_iter(j->psgd) != j->st.global_step) {
        stop_error("rank %d: %s holds PowerSGD's state after step %lld, not the checkpoint's "
                   "step %lld",
                   j->rank, path, (long long)ddp_powersgd_iter(j->psgd),
                   (long long)j->st.global_step);
        return 2;
    }
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
    int32_t mine = load_state(j), st = mine;
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
