/* ddp-mnist, the reference program: its outputs checked before the first
 * step.  Rank 0 writes every output (--save, --checkpoint-dir, --metrics);
 * an unwritable path used to show only when it was first written, after
 * training.  Rank 0 now tries each one at the start and sends what it found
 * to the group, so that every rank stops together, each saying why. */
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mnist.h"

#define MSG_CAP 1024

/* Can a file be created in dir?  The way writers create theirs (a
 * temporary name beside the target, then rename) needs exactly that.
 * 0, or errno. */
static int dir_writable(const char *dir)
{
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.ddp-mnist-probe-XXXXXX", dir);
    int fd = mkstemp(probe);
    if (fd < 0)
        return errno;
    close(fd);
    unlink(probe);
    return 0;
}

/* A file to be written at path (atomically, through path.tmp): its folder
 * must take new files and path must not be a folder.  "" or why not. */
static void check_file(const char *flag, const char *path, char *msg)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(msg, MSG_CAP, "%s %s: is a directory", flag, path);
        return;
    }
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", path);
    const char *dir = dirname(copy);
    int err = dir_writable(dir);
    if (err)
        snprintf(msg, MSG_CAP, "%s %s: cannot create files in %s: %s", flag, path, dir,
                 strerror(err));
}

/* The checkpoint folder: made when missing, then it must be a folder that
 * takes new files. */
static void check_dir(const char *flag, const char *dir, char *msg)
{
    struct stat st;
    int err = 0;
    if (mkdir(dir, 0755) < 0 && errno != EEXIST)
        err = errno;
    else if (stat(dir, &st) < 0)
        err = errno;
    else if (!S_ISDIR(st.st_mode))
        err = ENOTDIR;
    else
        err = dir_writable(dir);
    if (err)
        snprintf(msg, MSG_CAP, "%s %s: %s", flag, dir, strerror(err));
}

/* Rank 0's findings on its outputs: "" when all are writable. */
static void rank0_checks(job *j, char *msg)
{
    const args *a = j->a;
    msg[0] = '\0';
    if (a->ckpt_dir)
        check_dir("--checkpoint-dir", a->ckpt_dir, msg);
    if (!msg[0] && a->save)
        check_file("--save", a->save, msg);
    /* The metrics file is opened here, for good: appended to when the run
     * resumes, so that its records continue the first attempt's. */
    int resuming = a->ckpt_dir && (a->resume || j->restart > 0);
    if (!msg[0] && a->metrics)
        check_file("--metrics", a->metrics, msg);
    if (!msg[0] && a->metrics && ddp_metrics_create(a->metrics, resuming, &j->metrics) < 0)
        snprintf(msg, MSG_CAP, "--metrics %s: %s", a->metrics, ddp_last_error());
}

int check_outputs(job *j)
{
    const args *a = j->a;
    char msg[MSG_CAP];
    if (a->ckpt_dir)
        snprintf(j->ckpt, sizeof j->ckpt, "%s/checkpoint.safetensors", a->ckpt_dir);
    if (j->rank == 0)
        rank0_checks(j, msg);
    if (j->pg) {
        int rc = ddp_pg_broadcast(j->pg, msg, sizeof msg, DDP_UINT8, 0);
        if (rc < 0) {
            stop_error("rank %d: receiving rank 0's check of its outputs failed: %s", j->rank,
                       ddp_last_error());
            return 1;
        }
        msg[MSG_CAP - 1] = '\0';
    }
    if (!msg[0])
        return 0;
    if (j->rank == 0)
        stop_error("%s", msg);
    else
        stop_error("rank %d: stopping: rank 0 cannot write its output: %s",
                   j->rank, msg);
    /* Every rank has said why before any exits: the launcher stops the
     * others when the first exits, which could cut a slower rank's message
     * (best effort: the job stops either way). */
    if (j->pg)
        (void)ddp_pg_barrier(j->pg);
    return 2;
}
