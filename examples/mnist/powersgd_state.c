/* ddp-mnist --powersgd with checkpoints: every rank's PowerSGD state (its
 * own error feedback and Q) in a file of its own beside the checkpoint,
 * named after the step it belongs to: "<checkpoint>.powersgd.step<G>.rank<r>".
 *
 * Why the step in the name: the ranks write their states, then rank 0
 * replaces the checkpoint.  A job stopped in between (a rank killed, a
 * node lost) must resume from the old checkpoint with the old states, not
 * with states one save newer that no checkpoint matches.  So a save never
 * overwrites the states the current checkpoint names; once every rank
 * knows the new checkpoint is written, each removes its older files.  A
 * resume reads the file of the checkpoint's own step, and refuses a state
 * whose iteration count is not that step (a file renamed by hand, or
 * written by a version without the step in the name). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mnist.h"

/* Rank r's state of global step g. */
static void state_path(const job *j, int64_t g, char *path, size_t len)
{
    snprintf(path, len, "%s.powersgd.step%lld.rank%d", j->ckpt, (long long)g, j->rank);
}

/* Writes this rank's state of this step (to a temporary name, then
 * renamed, so that a crash mid-write leaves no half file under the name). */
static int save_state(const job *j)
{
    char path[4200], tmp[4300];
    void *blob = NULL;
    size_t len = 0;
    state_path(j, j->st.global_step, path, sizeof path);
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

/* Removes this rank's state files of other steps than the checkpoint's
 * (best effort: a file left over costs only disk, and the next save tries
 * again), and the one file of versions before the step was in the name. */
static void prune_states(const job *j)
{
    char dir[4096], keep[4200], legacy[4200], mine[64];
    const char *slash = strrchr(j->ckpt, '/');
    const char *base = slash ? slash + 1 : j->ckpt;
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else
        snprintf(dir, sizeof dir, "%.*s", slash == j->ckpt ? 1 : (int)(slash - j->ckpt),
                 j->ckpt);
    snprintf(mine, sizeof mine, ".rank%d", j->rank);
    snprintf(keep, sizeof keep, "%s.powersgd.step%lld%s", base, (long long)j->st.global_step,
             mine);
    snprintf(legacy, sizeof legacy, "%s.powersgd%s", j->ckpt, mine);
    unlink(legacy);
    size_t blen = strlen(base), mlen = strlen(mine);
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (n <= blen + mlen || strncmp(e->d_name, base, blen) != 0 ||
            strncmp(e->d_name + blen, ".powersgd.step", 14) != 0 ||
            strcmp(e->d_name + n - mlen, mine) != 0 || strcmp(e->d_name, keep) == 0)
            continue;
        char path[8400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    if (d)
        closedir(d);
}

int powersgd_checkpoint_save(job *j, const ddp_train_state *st)
{
    int rc = save_state(j);
    if (rc == 0 && j->rank == 0)
        rc = ddp_checkpoint_save(j->ckpt, j->model, j->opt, st);
    /* Whether every rank's part is written: only then does the new
     * checkpoint name states that all exist, and the old ones may go. */
    int32_t bad = rc < 0;
    int arc = ddp_pg_all_reduce(j->pg, &bad, 1, DDP_INT32, DDP_MAX);
    if (rc < 0)
        return rc;
    if (arc < 0)
        return arc;
    if (bad) {
        stop_error("rank %d: another rank could not write its part of the checkpoint %s: "
                   "stopping",
                   j->rank, j->ckpt);
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
    FILE *f = fopen(path, "rb");
    if (!f) {
        stop_error("rank %d: the checkpoint %s (step %lld) has no PowerSGD state for this "
                   "rank: %s: %s",
                   j->rank, j->ckpt, (long long)j->st.global_step, path, strerror(errno));
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
