/* The FileStore's members: who holds the file, joining and leaving
 * (split from file_store.c; the log they are written to is
 * file_store_log.c).
 *
 * The header counts the handles open on the file and the handles that have
 * left; the last of world_size members to leave removes the file.  Each
 * handle also logs a JOIN record (who it is: host, pid and start time; its
 * job's id) and a LEAVE record, kept apart from the keys, so that a joiner
 * of a rendezvous (ddp__store_file_open with a job id) can tell a live job
 * of another id, which it refuses, from a file that a failed or killed run
 * left behind, which it empties and reuses. */
#include "store/file_store_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "base/error.h"
#include "base/file.h"
#include "base/host.h"
#include "base/log.h"

typedef struct holders {
    const file_store *fs;
    int live, gone;
    const ddp__kv_entry *stranger; /* a live member of another job */
    char gone_job[DDP__STORE_MAX_JOB_ID + 1];
} holders;

static int look_member(const ddp__kv_entry *e, void *arg)
{
    holders *w = arg;
    /* The key is "<proc id> <handle>": the proc id is what ddp__proc_alive reads. */
    if (!ddp__proc_alive(e->key)) {
        w->gone++;
        snprintf(w->gone_job, sizeof w->gone_job, "%.*s", (int)e->vlen, (const char *)e->value);
        return 0;
    }
    w->live++;
    if (!w->stranger && (e->vlen != strlen(w->fs->job_id) ||
                         memcmp(e->value, w->fs->job_id, e->vlen) != 0))
        w->stranger = e;
    return 0;
}

/* Empties the file for a new job: no records, no members, a new generation
 * (any handle left open on it reloads).  Caller holds the exclusive lock. */
static int reset_file(file_store *fs, header *h)
{
    h->generation = h->generation + 1 >= GEN_SUPERSEDED ? 1 : h->generation + 1;
    h->members = h->finished = 0;
    if (ftruncate(fs->fd, HEADER_SIZE) < 0)
        return DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "%s: truncate", fs->base.desc);
    DDP_TRY(ddp__fs_write_header(fs, h));
    return ddp__fs_refresh(fs);
}

/* A rendezvous joiner's look at who holds the file (caller holds the
 * exclusive lock, the cache fresh): a live member of another job is an
 * error at once, not a rank claimed twice or a wait for the timeout; a file
 * whose members have all left or died (a run that failed, timed out or was
 * killed) is emptied and reused. */
static int admit(file_store *fs, header *h)
{
    if (!fs->check_job)
        return 0;
    holders w = {.fs = fs};
    ddp__kv_foreach(&fs->members, look_member, &w);
    if (w.stranger) {
        char host[256] = "?";
        int pid = 0;
        sscanf(w.stranger->key, "%255s %*s %d", host, &pid);
        char theirs[DDP__STORE_MAX_JOB_ID + 40], mine[DDP__STORE_MAX_JOB_ID + 40];
        ddp__job_words(theirs, sizeof theirs, (const char *)w.stranger->value, w.stranger->vlen,
                       0);
        ddp__job_words(mine, sizeof mine, fs->job_id, strlen(fs->job_id), 1);
        return DDP_ERROR(DDP_ERR_EXISTS,
                         "%s: a different job (%s, pid %d on %s) holds this store (%s): "
                         "not joining it; use another file for this job, or delete %s if that "
                         "job is gone",
                         fs->base.desc, theirs, pid, host, mine, fs->path);
    }
    if (w.live > 0 || (fs->cache.count == 0 && w.gone == 0 && h->finished == 0))
        return 0;
    char what[DDP__STORE_MAX_JOB_ID + 40] = "its members left";
    if (w.gone)
        ddp__job_words(what, sizeof what, w.gone_job, strlen(w.gone_job), 0);
    DDP_WARN("%s: reusing the file of an earlier run that is gone (%s; %d member%s died, %d "
             "left): its keys are dropped",
             fs->base.desc, what, w.gone, w.gone == 1 ? "" : "s", h->finished);
    return reset_file(fs, h);
}

/* Opens the file (creating it when absent or empty) and joins as a member,
 * under the exclusive lock: the header's count, and a JOIN record. */
int ddp__fs_join(file_store *fs)
{
    /* A regular file only: a FIFO there would block the first read. */
    if (ddp__open_regular(fs->path, O_RDWR | O_CREAT, fs->base.desc, &fs->fd, NULL) < 0)
        return DDP_ERR_IO; /* the message says why */
    for (int attempt = 0; attempt < 100; attempt++) {
        DDP_TRY(ddp__fs_lock(fs, LOCK_EX, fs->base.timeout_s));
        struct stat st;
        header h = {1, 0, 0}; /* generation 0 means "nothing read" in a handle */
        int rc = ddp__fs_stat(fs, &st);
        if (rc == 0 && st.st_nlink > 0 && st.st_size == 0)
            rc = ddp__fs_write_header(fs, &h); /* the first member creates the log */
        if (rc == 0)
            rc = st.st_nlink == 0 ? SUPERSEDED : ddp__fs_refresh(fs);
        if (rc == 0)
            rc = ddp__fs_read_header(fs, &h);
        if (rc == 0)
            rc = admit(fs, &h);
        if (rc == 0) {
            h.members++;
            rc = ddp__fs_write_header(fs, &h);
        }
        if (rc == 0)
            rc = ddp__fs_append(fs, REC_JOIN, fs->member, fs->job_id, strlen(fs->job_id));
        ddp__fs_unlock(fs);
        if (rc <= 0)
            return rc;
        /* Removed by the last member of an earlier job, or compacted away
         * between our open and our lock: take what the path names now. */
        DDP_TRY(ddp__fs_reopen(fs, 1));
    }
    return DDP_ERROR(DDP_ERR_IO, "%s: the file keeps being replaced under us", fs->base.desc);
}

/* Leaves the member count; the last of world_size members removes the file. */
void ddp__fs_leave(file_store *fs)
{
    double t = fs->base.timeout_s < 30 ? fs->base.timeout_s : 30;
    if (ddp__fs_lock_fresh(fs, LOCK_EX, t) == 0) {
        header h;
        /* First the LEAVE (which may compact: the header is read after). */
        if (ddp__fs_append(fs, REC_LEAVE, fs->member, NULL, 0) < 0)
            DDP_WARN("%s: leaving: %s", fs->base.desc, ddp_last_error());
        if (ddp__fs_read_header(fs, &h) == 0) {
            h.members = h.members > 0 ? h.members - 1 : 0;
            h.finished++;
            if (ddp__fs_write_header(fs, &h) == 0 && h.members == 0 && fs->world_size > 0 &&
                h.finished >= fs->world_size) {
                /* Unlinked under the lock: a process that opened the path
                 * meanwhile sees st_nlink == 0 once it locks, and reopens. */
                if (unlink(fs->path) < 0 && errno != ENOENT)
                    DDP_WARN("%s: could not remove the file: %s", fs->base.desc,
                             strerror(errno));
            }
        } else {
            DDP_WARN("%s: leaving: %s", fs->base.desc, ddp_last_error());
        }
        ddp__fs_unlock(fs);
    } else {
        DDP_WARN("%s: leaving without the lock: %s", fs->base.desc, ddp_last_error());
    }
}
