/* FileStore: a store in one file, shared by processes on one host or on a
 * shared file system (torch.distributed's FileStore, same idea).
 *
 * The file is a fixed header followed by an append-only log of records
 * (SET key value, DELETE key), each with a CRC-32.  Every operation takes
 * flock() on the file (shared to read, exclusive to append), reads the log
 * from where this handle last stopped into an in-memory map (kv.h), and for
 * writes appends one record.  Atomic add and compare_set are a read and an
 * append under one exclusive lock.  Waits poll with back-off (50 us doubling
 * to 10 ms): no core is spun, and nothing is needed from the other processes.
 *
 * The header counts the handles open on the file and the handles that have
 * left; the last of world_size members to leave removes the file.  Each
 * handle also logs a JOIN record (who it is: host, pid and start time; its
 * job's id) and a LEAVE record, kept apart from the keys, so that a joiner
 * of a rendezvous (ddp__store_file_open with a job id) can tell a live job
 * of another id, which it refuses, from a file that a failed or killed run
 * left behind, which it empties and reuses.  When the
 * log grows past DDP_FILESTORE_COMPACT_BYTES (1 MiB) and is mostly dead
 * records, the writer writes the live records to a new file, renames it
 * over the path and marks the old file superseded; other handles find the
 * mark (or the old file's link count at 0) under the lock and reopen the
 * path.  A crash during compaction leaves at worst a stray PATH.compact.PID
 * file.  The format is in docs/store.md.  A file that breaks the format is
 * reported (FORMAT error naming the path and offset), never trusted. */
#include "store/store_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "base/env.h"
#include "base/error.h"
#include "base/host.h"
#include "base/log.h"
#include "store/kv.h"

#define HEADER_SIZE 32
#define RECORD_HEADER 16
#define FORMAT_VERSION 2
#define REC_SET 1
#define REC_DELETE 2
#define REC_JOIN 3  /* a member: key = who (proc id + handle), value = its job id */
#define REC_LEAVE 4 /* that member left */
#define POLL_MAX_S 0.010
#define LOCK_POLL_MAX_S 0.002
#define GEN_SUPERSEDED UINT64_MAX /* header generation of a file compacted away */
#define SUPERSEDED 1              /* refresh(): reopen the path and retry */

static const char MAGIC[8] = {'D', 'D', 'P', 'F', 'S', 'T', 'O', 'R'};

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

/* ---- little-endian encoding (the file may be shared across hosts) ------- */

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* ---- I/O: pread/pwrite may be partial or interrupted --------------------- */

static int full_pread(file_store *fs, void *buf, size_t len, uint64_t off)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t n = pread(fs->fd, p, len, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "%s: read at offset %llu", fs->base.desc,
                                   (unsigned long long)off);
        if (n == 0)
            return DDP_ERROR(DDP_ERR_FORMAT, "%s: file ends early at offset %llu (truncated)",
                             fs->base.desc, (unsigned long long)off);
        p += n;
        off += (uint64_t)n;
        len -= (size_t)n;
    }
    return 0;
}

static int full_pwrite(file_store *fs, const void *buf, size_t len, uint64_t off)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = pwrite(fs->fd, p, len, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "%s: write at offset %llu", fs->base.desc,
                                   (unsigned long long)off);
        p += n;
        off += (uint64_t)n;
        len -= (size_t)n;
    }
    return 0;
}

static int reserve(file_store *fs, size_t need)
{
    if (need <= fs->cap)
        return 0;
    size_t cap = fs->cap ? fs->cap : 4096;
    while (cap < need)
        cap *= 2;
    uint8_t *b = realloc(fs->buf, cap);
    DDP_FAIL_IF(!b, DDP_ERR_NOMEM, "%s: out of memory for a %zu-byte buffer", fs->base.desc, cap);
    fs->buf = b;
    fs->cap = cap;
    return 0;
}

/* ---- locking ------------------------------------------------------------ */

/* flock with a deadline: LOCK_NB tries with back-off, so that a stuck holder
 * gives a timeout error instead of a hang.  Holders keep it for microseconds. */
static int lock_file(file_store *fs, int op, double timeout_s)
{
    ddp__backoff b;
    ddp__backoff_init(&b, timeout_s, LOCK_POLL_MAX_S);
    for (;;) {
        if (flock(fs->fd, op | LOCK_NB) == 0)
            return 0;
        if (errno == EINTR)
            continue;
        if (errno != EWOULDBLOCK)
            return DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "%s: flock", fs->base.desc);
        if (ddp__backoff_sleep(&b) < 0)
            return DDP_ERROR(DDP_ERR_TIMEOUT, "%s: file lock not acquired within %.3g s",
                             fs->base.desc, timeout_s);
    }
}

static void unlock_file(file_store *fs) { flock(fs->fd, LOCK_UN); }

/* ---- header and log ----------------------------------------------------- */

static int read_header(file_store *fs, header *h)
{
    uint8_t b[HEADER_SIZE];
    DDP_TRY(full_pread(fs, b, sizeof b, 0));
    DDP_FAIL_IF(memcmp(b, MAGIC, sizeof MAGIC) != 0, DDP_ERR_FORMAT,
                "%s: not a libddp FileStore file (bad magic); remove it or use another path",
                fs->base.desc);
    uint32_t version = get32(b + 8), hsize = get32(b + 12);
    DDP_FAIL_IF(version != FORMAT_VERSION || hsize != HEADER_SIZE, DDP_ERR_FORMAT,
                "%s: FileStore format version %u (header %u bytes), expected version %d",
                fs->base.desc, version, hsize, FORMAT_VERSION);
    h->generation = get64(b + 16);
    h->members = (int32_t)get32(b + 24);
    h->finished = (int32_t)get32(b + 28);
    DDP_FAIL_IF(h->members < 0 || h->finished < 0, DDP_ERR_FORMAT,
                "%s: corrupt header (members %d, finished %d)", fs->base.desc, h->members,
                h->finished);
    return 0;
}

static void encode_header(uint8_t b[HEADER_SIZE], const header *h)
{
    memcpy(b, MAGIC, sizeof MAGIC);
    put32(b + 8, FORMAT_VERSION);
    put32(b + 12, HEADER_SIZE);
    put64(b + 16, h->generation);
    put32(b + 24, (uint32_t)h->members);
    put32(b + 28, (uint32_t)h->finished);
}

static int write_header(file_store *fs, const header *h)
{
    uint8_t b[HEADER_SIZE];
    encode_header(b, h);
    return full_pwrite(fs, b, sizeof b, 0);
}

static int stat_fd(file_store *fs, struct stat *st)
{
    if (fstat(fs->fd, st) < 0)
        return DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "%s: fstat", fs->base.desc);
    return 0;
}

static uint32_t record_crc(const uint8_t *rec, size_t len)
{
    /* Everything after the CRC field itself. */
    return (uint32_t)crc32(crc32(0L, Z_NULL, 0), rec + 4, (uInt)(len - 4));
}

/* Parses the records in buf[0..len) (file bytes from fs->offset) into the
 * cache.  Stops at the first bad record with a FORMAT error. */
static int apply_records(file_store *fs, const uint8_t *buf, size_t len)
{
    size_t pos = 0;
    while (pos < len) {
        unsigned long long at = (unsigned long long)(fs->offset + pos);
        DDP_FAIL_IF(len - pos < RECORD_HEADER, DDP_ERR_FORMAT,
                    "%s: corrupt file: truncated record header at offset %llu", fs->base.desc,
                    at);
        const uint8_t *r = buf + pos;
        uint32_t type = r[4], klen = get32(r + 8), vlen = get32(r + 12);
        DDP_FAIL_IF(type < REC_SET || type > REC_LEAVE, DDP_ERR_FORMAT,
                    "%s: corrupt file: unknown record type %u at offset %llu", fs->base.desc,
                    type, at);
        DDP_FAIL_IF(klen == 0 || klen > DDP__STORE_MAX_KEY || vlen > DDP__STORE_MAX_VALUE,
                    DDP_ERR_FORMAT,
                    "%s: corrupt file: record at offset %llu has key length %u, value length %u",
                    fs->base.desc, at, klen, vlen);
        size_t rlen = RECORD_HEADER + (size_t)klen + vlen;
        DDP_FAIL_IF(rlen > len - pos, DDP_ERR_FORMAT,
                    "%s: corrupt file: record at offset %llu runs past the end of the file",
                    fs->base.desc, at);
        DDP_FAIL_IF(record_crc(r, rlen) != get32(r), DDP_ERR_FORMAT,
                    "%s: corrupt file: checksum mismatch in record at offset %llu",
                    fs->base.desc, at);
        const char *key = (const char *)r + RECORD_HEADER;
        DDP_FAIL_IF(memchr(key, 0, klen) != NULL, DDP_ERR_FORMAT,
                    "%s: corrupt file: key with a NUL byte at offset %llu", fs->base.desc, at);
        ddp__kv *map = type == REC_JOIN || type == REC_LEAVE ? &fs->members : &fs->cache;
        if (type == REC_SET || type == REC_JOIN) {
            DDP_FAIL_IF(ddp__kv_set(map, key, klen, r + RECORD_HEADER + klen, vlen) < 0,
                        DDP_ERR_NOMEM, "%s: out of memory", fs->base.desc);
        } else {
            ddp__kv_delete(map, key, klen);
        }
        pos += rlen;
    }
    fs->offset += len;
    return 0;
}

/* Brings the cache up to date with the file.  Caller holds the file lock.
 * Returns SUPERSEDED when a compaction has replaced the file. */
static int refresh(file_store *fs)
{
    struct stat st;
    DDP_TRY(stat_fd(fs, &st));
    if (st.st_nlink == 0)
        return SUPERSEDED; /* renamed over (or removed): the path is the truth */
    uint64_t size = (uint64_t)st.st_size;
    DDP_FAIL_IF(size < HEADER_SIZE, DDP_ERR_FORMAT,
                "%s: file is %llu bytes, shorter than the %d-byte FileStore header "
                "(truncated or not a FileStore)",
                fs->base.desc, (unsigned long long)size, HEADER_SIZE);
    header h;
    DDP_TRY(read_header(fs, &h));
    if (h.generation == GEN_SUPERSEDED)
        return SUPERSEDED; /* marked by the compaction, for file systems
                            * (NFS) where the old file keeps a link */
    if (h.generation != fs->generation) {
        ddp__kv_free(&fs->cache);
        ddp__kv_free(&fs->members);
        fs->generation = h.generation;
        fs->offset = HEADER_SIZE;
    }
    DDP_FAIL_IF(size < fs->offset, DDP_ERR_FORMAT,
                "%s: file shrank from %llu to %llu bytes behind the store's back", fs->base.desc,
                (unsigned long long)fs->offset, (unsigned long long)size);
    if (size == fs->offset)
        return 0;
    size_t len = (size_t)(size - fs->offset);
    DDP_TRY(reserve(fs, len));
    DDP_TRY(full_pread(fs, fs->buf, len, fs->offset));
    return apply_records(fs, fs->buf, len);
}

static size_t encode_record(uint8_t *r, int type, const char *key, size_t klen,
                            const void *value, size_t vlen)
{
    size_t rlen = RECORD_HEADER + klen + vlen;
    memset(r, 0, RECORD_HEADER);
    r[4] = (uint8_t)type;
    put32(r + 8, (uint32_t)klen);
    put32(r + 12, (uint32_t)vlen);
    memcpy(r + RECORD_HEADER, key, klen);
    if (vlen)
        memcpy(r + RECORD_HEADER + klen, value, vlen);
    put32(r, record_crc(r, rlen));
    return rlen;
}

typedef struct fill {
    uint8_t *buf;
    size_t len;
    int type;
} fill;

static int compact_entry(const ddp__kv_entry *e, void *arg)
{
    fill *f = arg;
    f->len += encode_record(f->buf + f->len, f->type, e->key, e->klen, e->value, e->vlen);
    return 0;
}

/* Replaces the log with one SET per live key (and one JOIN per member) when
 * it is mostly dead records: writes PATH.compact.PID, renames it over PATH, marks the old file
 * superseded and moves this handle to the new one.  Caller holds the
 * exclusive lock on the old file and a fresh cache.  Compaction is an
 * optimisation: when it fails the old log stays, with a warning. */
static void maybe_compact(file_store *fs)
{
    size_t live = (fs->cache.count + fs->members.count) * RECORD_HEADER + fs->cache.bytes +
                  fs->members.bytes;
    if (fs->offset < fs->compact_bytes || (fs->offset - HEADER_SIZE) < 4 * live)
        return;
    header h;
    if (reserve(fs, HEADER_SIZE + live) < 0 || read_header(fs, &h) < 0) {
        DDP_WARN("%s: compaction skipped: %s", fs->base.desc, ddp_last_error());
        return;
    }
    uint64_t old_size = fs->offset;
    h.generation++;
    encode_header(fs->buf, &h);
    fill f = {fs->buf, HEADER_SIZE, REC_SET};
    ddp__kv_foreach(&fs->cache, compact_entry, &f);
    f.type = REC_JOIN;
    ddp__kv_foreach(&fs->members, compact_entry, &f);

    size_t plen = strlen(fs->path) + 32;
    char *tmp = malloc(plen);
    if (!tmp)
        return;
    snprintf(tmp, plen, "%s.compact.%d", fs->path, (int)getpid());
    int old_fd = fs->fd;
    /* A file by this name is stale: left by a dead process with our pid
     * (compactions of one store exclude each other through the lock). */
    unlink(tmp);
    fs->fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    int rc = fs->fd < 0 ? DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "%s: open %s", fs->base.desc, tmp)
                        : full_pwrite(fs, fs->buf, f.len, 0);
    if (rc == 0 && rename(tmp, fs->path) < 0)
        rc = DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "%s: rename %s", fs->base.desc, tmp);
    if (rc < 0) {
        /* Try again only when the log has doubled: no warning per append. */
        fs->compact_bytes = 2 * fs->offset;
        DDP_WARN("%s: compaction skipped: %s", fs->base.desc, ddp_last_error());
        if (fs->fd >= 0) {
            close(fs->fd);
            unlink(tmp);
        }
        fs->fd = old_fd;
        free(tmp);
        return;
    }
    free(tmp);
    /* The path names the new file now.  Mark the old one for the handles
     * that have it open, then let go of it (and of its lock). */
    header gone = {GEN_SUPERSEDED, 0, 0};
    uint8_t b[HEADER_SIZE];
    encode_header(b, &gone);
    int new_fd = fs->fd;
    fs->fd = old_fd;
    if (full_pwrite(fs, b, sizeof b, 0) < 0)
        DDP_WARN("%s: compaction: %s", fs->base.desc, ddp_last_error());
    close(old_fd);
    fs->fd = new_fd;
    fs->generation = h.generation;
    fs->offset = f.len;
    DDP_DEBUG("%s: compacted the log from %llu to %zu bytes", fs->base.desc,
              (unsigned long long)old_size, f.len);
}

/* Appends one record at the end of the (fresh) log and applies it.  Caller
 * holds the exclusive lock.  A failed write is cut off again so the log
 * never keeps half a record. */
static int append(file_store *fs, int type, const char *key, const void *value, size_t vlen)
{
    size_t klen = strlen(key);
    DDP_TRY(reserve(fs, RECORD_HEADER + klen + vlen));
    size_t rlen = encode_record(fs->buf, type, key, klen, value, vlen);
    int rc = full_pwrite(fs, fs->buf, rlen, fs->offset);
    if (rc < 0) {
        if (ftruncate(fs->fd, (off_t)fs->offset) < 0)
            DDP_WARN("%s: could not cut a failed append: %s", fs->base.desc, strerror(errno));
        return rc;
    }
    DDP_TRY(apply_records(fs, fs->buf, rlen));
    maybe_compact(fs);
    return 0;
}

/* ---- operations --------------------------------------------------------- */

/* Opens the path again (after a compaction replaced the file); the cache
 * is rebuilt from the new file.  create: for joining, where the file may
 * also have been removed by the last member of an earlier job. */
static int reopen(file_store *fs, int create)
{
    int fd = open(fs->path, O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0600);
    if (fd < 0)
        return DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "%s: reopen", fs->base.desc);
    close(fs->fd);
    fs->fd = fd;
    fs->generation = 0;
    return 0;
}

/* Takes the file lock on the store's current file with a fresh cache. */
static int lock_fresh(file_store *fs, int op, double timeout_s)
{
    for (int attempt = 0; attempt < 100; attempt++) {
        DDP_TRY(lock_file(fs, op, timeout_s));
        int rc = refresh(fs);
        if (rc <= 0) {
            if (rc < 0)
                unlock_file(fs);
            return rc;
        }
        unlock_file(fs);
        DDP_TRY(reopen(fs, 0));
    }
    return DDP_ERROR(DDP_ERR_IO, "%s: the file keeps being replaced under us", fs->base.desc);
}

/* Runs the body (which may hold commas) with the handle mutex and the file
 * lock held and the cache fresh; `rc` carries the result. */
#define LOCKED(fs, op, ...)                                                \
    do {                                                                   \
        pthread_mutex_lock(&(fs)->mu);                                     \
        rc = lock_fresh((fs), (op), (fs)->base.timeout_s);                 \
        if (rc == 0) {                                                     \
            __VA_ARGS__;                                                   \
            unlock_file(fs);                                               \
        }                                                                  \
        pthread_mutex_unlock(&(fs)->mu);                                   \
    } while (0)

static int fs_set(ddp_store_t *s, const char *key, const void *value, size_t len)
{
    file_store *fs = (file_store *)s;
    int rc;
    LOCKED(fs, LOCK_EX, rc = append(fs, REC_SET, key, value, len));
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
            rc = append(fs, REC_SET, key, num, n);
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
            rc = append(fs, REC_SET, key, desired, dlen);
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
            rc = append(fs, REC_DELETE, key, NULL, 0);
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

/* ---- membership --------------------------------------------------------- */

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

/* Leaves the member count; the last of world_size members removes the file. */
static void fs_destroy(ddp_store_t *s)
{
    file_store *fs = (file_store *)s;
    double t = fs->base.timeout_s < 30 ? fs->base.timeout_s : 30;
    if (ddp__store_foreign(s)) {
        free_handle(fs); /* a fork's copy: the parent is still the member */
        return;
    }
    if (lock_fresh(fs, LOCK_EX, t) == 0) {
        header h;
        /* First the LEAVE (which may compact: the header is read after). */
        if (append(fs, REC_LEAVE, fs->member, NULL, 0) < 0)
            DDP_WARN("%s: leaving: %s", fs->base.desc, ddp_last_error());
        if (read_header(fs, &h) == 0) {
            h.members = h.members > 0 ? h.members - 1 : 0;
            h.finished++;
            if (write_header(fs, &h) == 0 && h.members == 0 && fs->world_size > 0 &&
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
        unlock_file(fs);
    } else {
        DDP_WARN("%s: leaving without the lock: %s", fs->base.desc, ddp_last_error());
    }
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

/* ---- who holds the file ------------------------------------------------ */

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
    DDP_TRY(write_header(fs, h));
    return refresh(fs);
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
static int join(file_store *fs)
{
    fs->fd = open(fs->path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fs->fd < 0)
        return DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "%s: open", fs->base.desc);
    for (int attempt = 0; attempt < 100; attempt++) {
        DDP_TRY(lock_file(fs, LOCK_EX, fs->base.timeout_s));
        struct stat st;
        header h = {1, 0, 0}; /* generation 0 means "nothing read" in a handle */
        int rc = stat_fd(fs, &st);
        if (rc == 0 && st.st_nlink > 0 && st.st_size == 0)
            rc = write_header(fs, &h); /* the first member creates the log */
        if (rc == 0)
            rc = st.st_nlink == 0 ? SUPERSEDED : refresh(fs);
        if (rc == 0)
            rc = read_header(fs, &h);
        if (rc == 0)
            rc = admit(fs, &h);
        if (rc == 0) {
            h.members++;
            rc = write_header(fs, &h);
        }
        if (rc == 0)
            rc = append(fs, REC_JOIN, fs->member, fs->job_id, strlen(fs->job_id));
        unlock_file(fs);
        if (rc <= 0)
            return rc;
        /* Removed by the last member of an earlier job, or compacted away
         * between our open and our lock: take what the path names now. */
        DDP_TRY(reopen(fs, 1));
    }
    return DDP_ERROR(DDP_ERR_IO, "%s: the file keeps being replaced under us", fs->base.desc);
}

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
    /* One process may hold several handles: the handle's address tells them apart. */
    snprintf(fs->member, strlen(who) + 32, "%s %p", who, (void *)fs);
    DDP_TRY_OUT(join(fs));
    *out = &fs->base;
out:
    if (rc < 0)
        free_handle(fs);
    return rc;
}
