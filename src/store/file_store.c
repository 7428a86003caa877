/* FileStore: a store in one file, shared by processes on one host or on a
 * shared file system (torch.distributed's FileStore, same idea).
 *
 * This file holds the handle and the store operations.  Every operation
 * takes flock() on the file (shared to read, exclusive to append), reads
 * the log from where this handle last stopped into an in-memory map (kv.h),
 * and for writes appends one record (the log, its format and compaction:
 * file_store_log.c).  Atomic add and compare_set are a read and an append
 * under one exclusive lock.  Waits poll with back-off (50 us doubling to
 * 10 ms): no core is spun, and nothing is needed from the other processes.
 * A handle joins the file as a member when it opens and leaves when it is
 * destroyed; the last member removes the file, and a rendezvous refuses a
 * live job of another id and reuses a stale file (file_store_members.c). */
#include "store/file_store_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "base/env.h"
#include "base/error.h"
#include "base/host.h"
#include "base/log.h"
#include "base/rng.h"

#define POLL_MAX_S 0.010

/* ---- operations --------------------------------------------------------- */

/* Runs the body (which may hold commas) with the handle mutex and the file
 * lock held and the cache fresh; `rc` carries the result. */
#define LOCKED(fs, op, ...)                                                \
    do {                                                                   \
        pthread_mutex_lock(&(fs)->mu);                                     \
        rc = ddp__fs_lock_fresh((fs), (op), (fs)->base.timeout_s);                 \
        if (rc == 0) {                                                     \
            __VA_ARGS__;                                                   \
            ddp__fs_unlock(fs);                                               \
        }                                                                  \
        pthread_mutex_unlock(&(fs)->mu);                                   \
    } while (0)

static int fs_set(ddp_store_t *s, const char *key, const void *value, size_t len)
{
    file_store *fs = (file_store *)s;
    int rc;
    LOCKED(fs, LOCK_EX, rc = ddp__fs_append(fs, REC_SET, key, value, len));
    return rc;
}

/* One non-blocking look: copies the value of key when present (*found). */
static int try_get(file_store *fs, const char *key, int *found, void **value, size_t *len)
{
    int rc;
    LOCKED(fs, LOCK_SH, {
        ddp__kv_entry *e = ddp__kv_find(&fs->cache, key, strlen(key));
        *found = e != NULL;
        if (e) {
            *value = malloc(e->vlen + 1);
            if (!*value) {
                rc = DDP_ERROR(DDP_ERR_NOMEM, "%s: out of memory", fs->base.desc);
            } else {
                memcpy(*value, e->value, e->vlen + 1);
                *len = e->vlen;
            }
        }
    });
    return rc;
}

static int fs_get(ddp_store_t *s, const char *key, double timeout_s, void **value, size_t *len)
{
    file_store *fs = (file_store *)s;
    ddp__backoff b;
    ddp__backoff_init(&b, timeout_s, POLL_MAX_S);
    for (;;) {
        int found = 0;
        DDP_TRY(try_get(fs, key, &found, value, len));
        if (found)
            return 0;
        if (ddp__backoff_sleep(&b) < 0)
            return ddp__store_timeout_error(s, &key, 1, NULL, timeout_s);
    }
}

static int fs_add(ddp_store_t *s, const char *key, int64_t delta, int64_t *result)
{
    file_store *fs = (file_store *)s;
    int rc;
    LOCKED(fs, LOCK_EX, {
        size_t klen = strlen(key), n = 0;
        char num[32];
        rc = ddp__kv_add(ddp__kv_find(&fs->cache, key, klen), key, klen, delta, result, num, &n);
        if (rc == 0)
            rc = ddp__fs_append(fs, REC_SET, key, num, n);
        else
            ddp__error_context(rc, "%s", fs->base.desc);
    });
    return rc;
}

static int fs_compare_set(ddp_store_t *s, const char *key, const void *expected, size_t elen,
                          const void *desired, size_t dlen, void **actual, size_t *alen)
{
    file_store *fs = (file_store *)s;
    int rc;
    LOCKED(fs, LOCK_EX, {
        size_t klen = strlen(key);
        ddp__kv_entry *e = ddp__kv_find(&fs->cache, key, klen);
        if (ddp__kv_cas_matches(e, expected, elen))
            rc = ddp__fs_append(fs, REC_SET, key, desired, dlen);
        e = ddp__kv_find(&fs->cache, key, klen);
        if (rc == 0 && e) {
            *actual = malloc(e->vlen + 1);
            if (!*actual) {
                rc = DDP_ERROR(DDP_ERR_NOMEM, "%s: out of memory", fs->base.desc);
            } else {
                memcpy(*actual, e->value, e->vlen + 1);
                *alen = e->vlen;
            }
        }
    });
    return rc;
}

/* Marks which keys exist; *all = 1 when every one does. */
static int look(file_store *fs, const char *const *keys, size_t n, int *present, int *all)
{
    int rc;
    LOCKED(fs, LOCK_SH, {
        *all = 1;
        for (size_t i = 0; i < n; i++) {
            int p = ddp__kv_find(&fs->cache, keys[i], strlen(keys[i])) != NULL;
            if (present)
                present[i] = p;
            *all &= p;
        }
    });
    return rc;
}

static int fs_wait(ddp_store_t *s, const char *const *keys, size_t n, double timeout_s)
{
    file_store *fs = (file_store *)s;
    int *present = calloc(n, sizeof *present);
    DDP_FAIL_IF(!present, DDP_ERR_NOMEM, "%s: out of memory", fs->base.desc);
    ddp__backoff b;
    ddp__backoff_init(&b, timeout_s, POLL_MAX_S);
    int rc, all = 0;
    for (;;) {
        if ((rc = look(fs, keys, n, present, &all)) < 0 || all)
            break;
        if (ddp__backoff_sleep(&b) < 0) {
            rc = ddp__store_timeout_error(s, keys, n, present, timeout_s);
            break;
        }
    }
    free(present);
    return rc;
}

static int fs_check(ddp_store_t *s, const char *const *keys, size_t n, int *exists)
{
    return look((file_store *)s, keys, n, NULL, exists);
}

static int fs_delete_key(ddp_store_t *s, const char *key, int *deleted)
{
    file_store *fs = (file_store *)s;
    int rc;
    LOCKED(fs, LOCK_EX, {
        *deleted = ddp__kv_find(&fs->cache, key, strlen(key)) != NULL;
        if (*deleted)
            rc = ddp__fs_append(fs, REC_DELETE, key, NULL, 0);
    });
    return rc;
}

static int fs_num_keys(ddp_store_t *s, int64_t *n)
{
    file_store *fs = (file_store *)s;
    int rc;
    LOCKED(fs, LOCK_SH, *n = (int64_t)fs->cache.count);
    return rc;
}
/* ---- handles ------------------------------------------------------------ */

static void free_handle(file_store *fs)
{
    if (fs->fd >= 0)
        close(fs->fd);
    ddp__kv_free(&fs->cache);
    ddp__kv_free(&fs->members);
    pthread_mutex_destroy(&fs->mu);
    free(fs->buf);
    free(fs->member);
    free(fs->path);
    free(fs);
}

/* Leaves the members (the last of world_size removes the file), then frees. */
static void fs_destroy(ddp_store_t *s)
{
    file_store *fs = (file_store *)s;
    if (ddp__store_foreign(s)) {
        free_handle(fs); /* a fork's copy: the parent is still the member */
        return;
    }
    ddp__fs_leave(fs);
    free_handle(fs);
}

static const ddp__store_ops file_ops = {
    .set = fs_set,
    .get = fs_get,
    .add = fs_add,
    .compare_set = fs_compare_set,
    .wait = fs_wait,
    .check = fs_check,
    .delete_key = fs_delete_key,
    .num_keys = fs_num_keys,
    .destroy = fs_destroy,
};

int ddp_store_file_create(const char *path, int world_size, ddp_store_t **out)
{
    return ddp__store_file_open(path, world_size, NULL, out);
}

int ddp__store_file_open(const char *path, int world_size, const char *job_id,
                         ddp_store_t **out)
{
    DDP_FAIL_IF(!out, DDP_ERR_INVALID_ARG, "ddp_store_file_create: out is NULL");
    *out = NULL;
    DDP_FAIL_IF(!path || !*path, DDP_ERR_INVALID_ARG, "file store: empty path");
    DDP_FAIL_IF(world_size < 0, DDP_ERR_INVALID_ARG, "file store %s: world size %d is negative",
                path, world_size);
    file_store *fs = calloc(1, sizeof *fs);
    DDP_FAIL_IF(!fs, DDP_ERR_NOMEM, "file store %s: out of memory", path);
    ddp__store_init(&fs->base, &file_ops, "file store %s", path);
    pthread_mutex_init(&fs->mu, NULL);
    ddp__kv_init(&fs->cache);
    ddp__kv_init(&fs->members);
    fs->fd = -1;
    fs->check_job = job_id != NULL;
    snprintf(fs->job_id, sizeof fs->job_id, "%s", job_id ? job_id : "");
    fs->world_size = world_size;
    int rc = 0;
    size_t compact = 0; /* default 1 MiB: src/base/env.c */
    DDP_TRY_OUT(ddp__env_size("DDP_FILESTORE_COMPACT_BYTES", &compact));
    fs->compact_bytes = compact;
    fs->path = strdup(path);
    DDP_FAIL_OUT(!fs->path, DDP_ERR_NOMEM, "file store %s: out of memory", path);
    char who[512];
    DDP_TRY_OUT(ddp__proc_id(who, sizeof who));
    fs->member = malloc(strlen(who) + 32);
    DDP_FAIL_OUT(!fs->member, DDP_ERR_NOMEM, "file store %s: out of memory", path);
    /* One process may hold several handles, one after another at the same
     * address too (a handle whose LEAVE failed still counts): a random
     * 64-bit tag tells them apart. */
    uint64_t tag = 0;
    DDP_TRY_OUT(ddp__random_bytes(&tag, sizeof tag));
    snprintf(fs->member, strlen(who) + 32, "%s %016llx", who, (unsigned long long)tag);
    DDP_TRY_OUT(ddp__fs_join(fs));
    *out = &fs->base;
out:
    if (rc < 0)
        free_handle(fs);
    return rc;
}
