/* ddp-mnist --zero 1|2: the optimizer keeps the state of this rank's shard
 * only (include/ddp/zero.h).  The model, DDP and the data stay as they are;
 * the SGD made in main.c is replaced by the same SGD over the shard model,
 * and each step gathers the updated shards.  --zero 2 goes without DDP:
 * its backward reduce-scatters the gradients bucket by bucket.  Checkpoints
 * are sharded: each rank writes its own part, and a resume may run on
 * another number of ranks. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mnist.h"

/* ==== sharded checkpoints ==================================================
 * With --checkpoint-dir DIR every rank writes its shard (docs/zero.md) into
 * one of two folders used in turn, DIR/zero-a and DIR/zero-b, and rank 0
 * then points the symbolic link DIR/zero-latest at it, replaced atomically
 * (a new link renamed over the old): a crash during a save leaves the link
 * on the previous folder, whole.  Resuming loads DIR/zero-latest into any
 * world size (the load reshards).  --pipeline-stages saves its checkpoints
 * the same way (pipeline.c): the format is the same, so either resumes the
 * other's. */

/* DIR/name */
static void in_dir(const job *j, const char *name, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", j->a->ckpt_dir, name);
}

/* The folder the link does not name.  Every rank reads the link: it changes
 * only after a save that every rank has entered (the save is collective), and
 * the steps between two saves are collectives too, so all read the same. */
static const char *next_folder(const job *j)
{
    char link[4096], target[64];
    in_dir(j, "zero-latest", link, sizeof link);
    ssize_t n = readlink(link, target, sizeof target - 1);
    target[n > 0 ? n : 0] = '\0';
    return strcmp(target, "zero-a") == 0 ? "zero-b" : "zero-a";
}

/* Rank 0: DIR/zero-latest -> folder, through DIR/zero-latest.tmp and rename,
 * then the folder itself synced so that the new name survives a crash. */
static int point_latest(const job *j, const char *folder, char *msg, size_t cap)
{
    char link[4096], tmp[4200];
    in_dir(j, "zero-latest", link, sizeof link);
    snprintf(tmp, sizeof tmp, "%s.tmp", link);
    (void)unlink(tmp); /* a crash's leftover */
    if (symlink(folder, tmp) != 0 || rename(tmp, link) != 0) {
        snprintf(msg, cap, "pointing %s at %s: %s", link, folder, strerror(errno));
        return -1;
    }
    int fd = open(j->a->ckpt_dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        (void)fsync(fd); /* durability only: the checkpoint itself is whole */
        close(fd);
    }
    return 0;
}

int sharded_save(job *j, int (*save)(const char *dir, void *arg), void *arg)
{
    const char *folder = next_folder(j);
    char dir[4096], msg[8448] = "";
    in_dir(j, folder, dir, sizeof dir);
    /* Every rank, so that none waits for another; a failure (other than
     * EEXIST) is the save's to report, naming the folder. */
    (void)mkdir(dir, 0777);
    int rc = save(dir, arg);
    if (rc < 0)
        return rc;
    int32_t r0 = j->rank == 0 ? point_latest(j, folder, msg, sizeof msg) : 0;
    if ((rc = ddp_pg_broadcast(j->pg, &r0, 1, DDP_INT32, 0)) < 0)
        return rc;
    if (r0 < 0) { /* said here: the library has no message for it */
        if (j->rank == 0)
            stop_error("%s", msg);
        ddp_clear_error();
        return DDP_ERR_IO;
    }
    return 0;
}

typedef struct zero_save_args {
    job *j;
    const ddp_train_state *st;
} zero_save_args;

static int zero_save(const char *dir, void *arg)
{
    zero_save_args *a = arg;
    return ddp_zero_checkpoint_save(dir, a->j->zero, a->j->opt, a->st);
}

int zero_checkpoint_save(job *j, const ddp_train_state *st)
{
    zero_save_args a = {j, st};
    return sharded_save(j, zero_save, &a);
}

void sharded_latest(const job *j, char *dir, size_t cap)
{
    in_dir(j, "zero-latest", dir, cap);
}

int sharded_resume(job *j, int (*load)(const char *dir, ddp_train_state *st, void *arg),
                   void *arg, int replicas, const char *unit)
{
    if (!j->ckpt[0] || !(j->a->resume || j->restart > 0))
        return 0;
    char dir[4096];
    sharded_latest(j, dir, sizeof dir);
    ddp_train_state st;
    int rc = load(dir, &st, arg);
    if (rc == DDP_ERR_NOT_FOUND) { /* every rank gets the same outcome */
        if (j->rank == 0)
            printf("No checkpoint at %s yet: starting from the beginning\n", dir);
        return 0;
    }
    if (rc < 0)
        return rc;
    if (st.world_size != replicas && st.world_size > 0)
        st.step = st.step * st.world_size / replicas;
    j->st = st;
    if (j->rank == 0)
        printf("Resuming from %s: epoch %lld, step %lld (saved by %d %s)\n", dir,
               (long long)st.epoch + 1, (long long)st.step, st.world_size, unit);
    return 0;
}

static int zero_load(const char *dir, ddp_train_state *st, void *arg)
{
    job *j = arg;
    return ddp_zero_checkpoint_load(dir, j->zero, j->opt, st);
}

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
    if ((rc = ddp_sgd_create(ddp_zero_shard_model(j->zero), &so, &j->opt)) < 0)
        return rc;
    return sharded_resume(j, zero_load, j, j->world, "ranks");
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
