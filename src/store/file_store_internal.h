/* Private to the FileStore (file_store.c, file_store_log.c,
 * file_store_members.c): the handle, the file's header, the record types,
 * and the log calls that the store operations and the membership code both
 * make.  Split so that each file holds one concept: the on-disk log
 * (format, replay, compaction), the members (JOIN/LEAVE, stale files), and
 * the store operations; nothing here is seen outside src/store/. */
#ifndef DDP_STORE_FILE_STORE_INTERNAL_H
#define DDP_STORE_FILE_STORE_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <sys/stat.h>

#include "store/kv.h"
#include "store/store_impl.h"

#define HEADER_SIZE 32
#define REC_SET 1
#define REC_DELETE 2
#define REC_JOIN 3  /* a member: key = who (proc id + handle), value = its job id */
#define REC_LEAVE 4 /* that member left */
#define GEN_SUPERSEDED UINT64_MAX /* header generation of a file compacted away */
#define SUPERSEDED 1              /* ddp__fs_refresh(): reopen the path and retry */

typedef struct file_store {
    ddp_store_t base;
    pthread_mutex_t mu; /* one operation at a time per handle: flock is per open file */
    char *path;
    int fd;
    int world_size;
    int check_job;       /* a rendezvous: refuse another job, reuse a stale file */
    char job_id[DDP__STORE_MAX_JOB_ID + 1];
    char *member;        /* this handle's JOIN key */
    uint64_t generation; /* of the log in cache; 0: nothing read yet */
    uint64_t offset;     /* bytes of the file applied to cache */
    uint64_t compact_bytes;
    ddp__kv cache;
    ddp__kv members; /* JOIN records not followed by a LEAVE */
    uint8_t *buf;
    size_t cap;
} file_store;

typedef struct header {
    uint64_t generation;
    int32_t members, finished;
} header;

/* ---- the log (file_store_log.c) ------------------------------------------ */

/* flock(op) with a deadline (a stuck holder gives a TIMEOUT error). */
int ddp__fs_lock(file_store *fs, int op, double timeout_s);
void ddp__fs_unlock(file_store *fs);
/* The header, checked (magic, version, counts) / written at offset 0. */
int ddp__fs_read_header(file_store *fs, header *h);
int ddp__fs_write_header(file_store *fs, const header *h);
int ddp__fs_stat(file_store *fs, struct stat *st);
/* Brings the cache up to date with the file.  Caller holds the file lock.
 * Returns SUPERSEDED when a compaction has replaced the file. */
int ddp__fs_refresh(file_store *fs);
/* Appends one record at the end of the (fresh) log and applies it (may
 * compact).  Caller holds the exclusive lock. */
int ddp__fs_append(file_store *fs, int type, const char *key, const void *value,
                   size_t vlen);
/* Opens the path again (the file was replaced); create: may also create it. */
int ddp__fs_reopen(file_store *fs, int create);
/* Takes the file lock on the store's current file with a fresh cache. */
int ddp__fs_lock_fresh(file_store *fs, int op, double timeout_s);

/* ---- the members (file_store_members.c) ---------------------------------- */

/* Opens the file (creating it when absent or empty) and joins as a member:
 * the header's count and a JOIN record; for a rendezvous (check_job), a
 * live member of another job is refused and a stale file reused. */
int ddp__fs_join(file_store *fs);
/* Logs the LEAVE and leaves the header's count; the last of world_size
 * members removes the file.  Failures are warnings: a leaver goes anyway. */
void ddp__fs_leave(file_store *fs);

#endif
