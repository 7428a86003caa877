/* The FileStore's log: the file's format and its replay into the handle's
 * cache, the flock discipline, and compaction (split from file_store.c,
 * which keeps the store operations; the members are file_store_members.c).
 *
 * The file is a fixed header (magic, version, generation, member counts)
 * followed by an append-only log of records (SET key value, DELETE key,
 * JOIN who job, LEAVE who), each with a CRC-32, little-endian throughout
 * since the file may be shared across hosts.  A handle reads the log from
 * where it last stopped into its in-memory maps (kv.h) under flock()
 * (shared to read, exclusive to append).  When the log grows past
 * DDP_FILESTORE_COMPACT_BYTES (1 MiB) and is mostly dead records, the
 * writer writes the live records to a new file, renames it over the path
 * and marks the old file superseded; other handles find the mark (or the
 * old file's link count at 0) under the lock and reopen the path.  A crash
 * during compaction leaves at worst a stray PATH.compact.PID file.  The
 * format is in docs/store.md.  A file that breaks the format is reported
 * (FORMAT error naming the path and offset), never trusted. */
#include "store/file_store_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>
#include <zlib.h>

#include "base/error.h"
#include "base/file.h"
#include "base/log.h"

#define RECORD_HEADER 16
#define FORMAT_VERSION 2
#define LOCK_POLL_MAX_S 0.002

static const char MAGIC[8] = {'D', 'D', 'P', 'F', 'S', 'T', 'O', 'R'};

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
int ddp__fs_lock(file_store *fs, int op, double timeout_s)
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

void ddp__fs_unlock(file_store *fs) { flock(fs->fd, LOCK_UN); }

/* ---- header and log ----------------------------------------------------- */

int ddp__fs_read_header(file_store *fs, header *h)
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

int ddp__fs_write_header(file_store *fs, const header *h)
{
    uint8_t b[HEADER_SIZE];
    encode_header(b, h);
    return full_pwrite(fs, b, sizeof b, 0);
}

int ddp__fs_stat(file_store *fs, struct stat *st)
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
int ddp__fs_refresh(file_store *fs)
{
    struct stat st;
    DDP_TRY(ddp__fs_stat(fs, &st));
    if (st.st_nlink == 0)
        return SUPERSEDED; /* renamed over (or removed): the path is the truth */
    uint64_t size = (uint64_t)st.st_size;
    DDP_FAIL_IF(size < HEADER_SIZE, DDP_ERR_FORMAT,
                "%s: file is %llu bytes, shorter than the %d-byte FileStore header "
                "(truncated or not a FileStore)",
                fs->base.desc, (unsigned long long)size, HEADER_SIZE);
    header h;
    DDP_TRY(ddp__fs_read_header(fs, &h));
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
    if (reserve(fs, HEADER_SIZE + live) < 0 || ddp__fs_read_header(fs, &h) < 0) {
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
int ddp__fs_append(file_store *fs, int type, const char *key, const void *value,
                   size_t vlen)
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

/* Opens the path again (after a compaction replaced the file); the cache
 * is rebuilt from the new file.  create: for joining, where the file may
 * also have been removed by the last member of an earlier job. */
int ddp__fs_reopen(file_store *fs, int create)
{
    int fd;
    if (ddp__open_regular(fs->path, O_RDWR | (create ? O_CREAT : 0), fs->base.desc, &fd, NULL) < 0)
        return DDP_ERR_IO; /* the message says why */
    close(fs->fd);
    fs->fd = fd;
    fs->generation = 0;
    return 0;
}

/* Takes the file lock on the store's current file with a fresh cache. */
int ddp__fs_lock_fresh(file_store *fs, int op, double timeout_s)
{
    for (int attempt = 0; attempt < 100; attempt++) {
        DDP_TRY(ddp__fs_lock(fs, op, timeout_s));
        int rc = ddp__fs_refresh(fs);
        if (rc <= 0) {
            if (rc < 0)
                ddp__fs_unlock(fs);
            return rc;
        }
        ddp__fs_unlock(fs);
        DDP_TRY(ddp__fs_reopen(fs, 0));
    }
    return DDP_ERROR(DDP_ERR_IO, "%s: the file keeps being replaced under us", fs->base.desc);
}
