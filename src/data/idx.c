/* IDX file reader (the format of MNIST, Fashion-MNIST, KMNIST: LeCun's
 * "big-endian magic 0x000008NN, NN big-endian uint32 dimensions, then the
 * bytes").  Files may be raw or gzip'ed; gzip is recognised by its magic
 * bytes (1f 8b), and inflated by zlib straight into the final buffer: one
 * allocation, no per-byte calls.  The buffer is a 2 MiB-aligned mapping with
 * transparent huge pages requested, so that 47 MB of fresh memory costs 23
 * page faults rather than 11500 (about 0.1 s on these machines, DESIGN.md),
 * and a second thread populates those pages while the first inflates.
 *
 * Every way a file can be wrong gives a FORMAT error naming the file: bad
 * magic, a zero dimension, a header larger than the file (truncated), bytes
 * beyond what the header declares (trailing data), a corrupt or cut gzip
 * stream, garbage after the gzip stream.
 *
 * A gzip'ed file, once read and checked, is also kept decompressed in a
 * cache folder that later reads take instead (idx_cache.c); a cache file
 * that fails its checks is removed and the source is read again. */
#include "data/idx_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "base/error.h"
#include "base/file.h"

#define GZ_IN_BYTES (128u << 10)  /* compressed input chunk */
#define READ_CHUNK (1u << 30)     /* largest single read()/inflate output */
#define HUGE_BYTES (2u << 20)     /* a transparent huge page */
#define DEFLATE_MAX_RATIO 1032u   /* deflate cannot expand more than this */

/* ------------------------------------------------------------------ big buffers */

void *ddp__big_alloc(size_t size, size_t *alloc_bytes)
{
    if (size < HUGE_BYTES) {
        *alloc_bytes = size;
        return malloc(size ? size : 1);
    }
    size_t len = (size + 4095) & ~(size_t)4095;
    if (len < size || len + HUGE_BYTES < len)
        return NULL;
    /* Over-map by one huge page and trim, so that the buffer starts on a
     * 2 MiB boundary (the kernel only backs aligned ranges with huge pages). */
    uint8_t *raw = mmap(NULL, len + HUGE_BYTES, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    uintptr_t start = ((uintptr_t)raw + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1);
    size_t head = start - (uintptr_t)raw;
    if (head)
        munmap(raw, head);
    if (HUGE_BYTES - head)
        munmap((uint8_t *)start + len, HUGE_BYTES - head);
#ifdef MADV_HUGEPAGE
    /* Whole huge pages only: the tail stays in 4 KiB pages, so resident
     * memory is not rounded up by as much as 2 MiB.  Advisory: a refusal
     * only costs page faults. */
    madvise((void *)start, len & ~(size_t)(HUGE_BYTES - 1), MADV_HUGEPAGE);
#endif
    *alloc_bytes = len;
    return (void *)start;
}

void ddp__big_free(void *p, size_t alloc_bytes)
{
    if (!p)
        return;
    if (alloc_bytes < HUGE_BYTES)
        free(p);
    else
        munmap(p, alloc_bytes);
}

/* Faulting the pages in: while one thread inflates into a fresh buffer,
 * another asks the kernel to populate it (allocate and zero its huge pages),
 * which otherwise costs the inflating thread about 9 % of its time.
 * MADV_POPULATE_WRITE changes no data, so the two never race on contents. */
typedef struct populate {
    pthread_t thread;
    int started;
    void *p;
    size_t len;
} populate;

static void *populate_main(void *arg)
{
    populate *pp = arg;
#ifdef MADV_POPULATE_WRITE
    madvise(pp->p, pp->len, MADV_POPULATE_WRITE); /* advisory: errors ignored */
#endif
    return NULL;
}

static void populate_start(populate *pp, void *p, size_t len)
{
    pp->started = 0;
#ifdef MADV_POPULATE_WRITE
    pp->p = p;
    pp->len = len & ~(size_t)(HUGE_BYTES - 1); /* the huge-page part */
    if (pp->len >= 4 * (size_t)HUGE_BYTES)
        pp->started = pthread_create(&pp->thread, NULL, populate_main, pp) == 0;
#else
    (void)p;
    (void)len;
#endif
}

static void populate_join(populate *pp)
{
    if (pp->started)
        pthread_join(pp->thread, NULL);
    pp->started = 0;
}

/* ------------------------------------------------------------------ byte source */

/* The file's bytes, decompressed if gzip'ed. */
typedef struct source {
    const char *path;
    int fd;
    uint64_t file_size;
    int gz;
    int z_ready;        /* inflateInit2 done */
    int z_done;         /* the last gzip member ended and the file is exhausted */
    int z_cut;          /* the file ended inside a gzip member */
    z_stream z;
    uint8_t *in;        /* GZ_IN_BYTES of compressed input */
    uint64_t consumed;  /* compressed bytes handed to inflate so far */
} source;

static int source_open(source *s, const char *path)
{
    memset(s, 0, sizeof *s);
    s->path = path;
    struct stat st;
    DDP_TRY(ddp__open_regular(path, O_RDONLY, path, &s->fd, &st));
    s->file_size = (uint64_t)st.st_size;
    uint8_t magic[2];
    if (s->file_size >= 2 && pread(s->fd, magic, 2, 0) == 2 && magic[0] == 0x1f &&
        magic[1] == 0x8b) {
        s->gz = 1;
        s->in = malloc(GZ_IN_BYTES);
        if (!s->in)
            return DDP_ERROR(DDP_ERR_NOMEM, "%s: no memory for the gzip input buffer", path);
        /* 16 + MAX_WBITS: gzip wrapper only, checks the CRC-32 and length. */
        if (inflateInit2(&s->z, 16 + MAX_WBITS) != Z_OK)
            return DDP_ERROR(DDP_ERR_NOMEM, "%s: inflateInit2 failed", path);
        s->z_ready = 1;
    }
    return 0;
}

static void source_close(source *s)
{
    if (s->z_ready)
        inflateEnd(&s->z);
    free(s->in);
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    s->z_ready = 0;
    s->in = NULL;
}

/* read() until n bytes or end of file; EINTR retried. */
static int read_full(source *s, uint8_t *buf, size_t n, size_t *got)
{
    *got = 0;
    while (*got < n) {
        size_t want = n - *got < READ_CHUNK ? n - *got : READ_CHUNK;
        ssize_t r = read(s->fd, buf + *got, want);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "%s: read", s->path);
        if (r == 0)
            break;
        *got += (size_t)r;
    }
    return 0;
}

/* Compressed input for inflate; sets z.avail_in to 0 at end of file. */
static int refill(source *s)
{
    size_t got;
    DDP_TRY(read_full(s, s->in, GZ_IN_BYTES, &got));
    s->z.next_in = s->in;
    s->z.avail_in = (uInt)got;
    s->consumed += got;
    return 0;
}

/* After a gzip member ended: another member, or the end of the file, or
 * garbage (an error: a dataset file has no reason to carry any). */
static int after_member(source *s)
{
    if (s->z.avail_in == 0)
        DDP_TRY(refill(s));
    if (s->z.avail_in == 0) {
        s->z_done = 1;
        return 0;
    }
    if (s->z.avail_in >= 2 && s->z.next_in[0] == 0x1f && s->z.next_in[1] == 0x8b) {
        inflateReset(&s->z); /* concatenated members form one stream (RFC 1952) */
        return 0;
    }
    uint64_t extra = s->file_size - (s->consumed - s->z.avail_in);
    return DDP_ERROR(DDP_ERR_FORMAT, "%s: %llu bytes of garbage after the gzip stream",
                     s->path, (unsigned long long)extra);
}

static int inflate_into(source *s, uint8_t *buf, size_t n, size_t *got)
{
    *got = 0;
    while (*got < n && !s->z_done) {
        if (s->z.avail_in == 0) {
            DDP_TRY(refill(s));
            if (s->z.avail_in == 0) {
                s->z_cut = 1; /* the caller says what was missing */
                break;
            }
        }
        size_t want = n - *got < READ_CHUNK ? n - *got : READ_CHUNK;
        s->z.next_out = buf + *got;
        s->z.avail_out = (uInt)want;
        int zr = inflate(&s->z, Z_NO_FLUSH);
        *got += want - s->z.avail_out;
        if (zr == Z_STREAM_END) {
            DDP_TRY(after_member(s));
        } else if (zr == Z_MEM_ERROR) {
            return DDP_ERROR(DDP_ERR_NOMEM, "%s: inflate: out of memory", s->path);
        } else if (zr != Z_OK && zr != Z_BUF_ERROR) {
            return DDP_ERROR(DDP_ERR_FORMAT, "%s: corrupt gzip data: %s (after %llu "
                             "decompressed bytes)",
                             s->path, s->z.msg ? s->z.msg : zError(zr),
                             (unsigned long long)s->z.total_out);
        }
    }
    return 0;
}

/* Reads up to n bytes of content; *got < n only at the end of the data (or
 * where a gzip stream is cut short: z_cut). */
static int source_read(source *s, uint8_t *buf, size_t n, size_t *got)
{
    if (!s->gz)
        return read_full(s, buf, n, got);
    return inflate_into(s, buf, n, got);
}

/* Counts (and drops) what is left of the content. */
static int source_skip_rest(source *s, uint64_t *extra)
{
    uint8_t scratch[16384];
    size_t got;
    *extra = 0;
    do {
        DDP_TRY(source_read(s, scratch, sizeof scratch, &got));
        *extra += got;
    } while (got == sizeof scratch);
    return 0;
}

/* ------------------------------------------------------------------ IDX */

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static const char *type_name(uint8_t t)
{
    switch (t) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "short";
    case 0x0C: return "int";
    case 0x0D: return "float";
    case 0x0E: return "double";
    }
    return "unknown type";
}

static int check_magic(const char *path, uint32_t magic, uint32_t want)
{
    if (magic == want)
        return 0;
    const char *what = want == DDP_IDX_MAGIC_IMAGES   ? " (IDX images)"
                       : want == DDP_IDX_MAGIC_LABELS ? " (IDX labels)"
                                                      : "";
    if ((magic >> 16) != 0)
        return DDP_ERROR(DDP_ERR_FORMAT, "%s: bad magic 0x%08x, expected 0x%08x%s: not an "
                         "IDX file", path, magic, want, what);
    if (((magic >> 8) & 0xff) != 0x08)
        return DDP_ERROR(DDP_ERR_FORMAT, "%s: bad magic 0x%08x, expected 0x%08x%s: "
                         "elements are %s, only unsigned bytes are supported",
                         path, magic, want, what, type_name((uint8_t)(magic >> 8)));
    return DDP_ERROR(DDP_ERR_FORMAT, "%s: bad magic 0x%08x, expected 0x%08x%s: %u "
                     "dimensions, expected %u", path, magic, want, what,
                     magic & 0xff, want & 0xff);
}

static int truncated(const char *path, size_t count, uint64_t held_bytes, size_t item_bytes)
{
    return DDP_ERROR(DDP_ERR_FORMAT, "%s: truncated: header says %zu items, file holds %llu",
                     path, count, (unsigned long long)(held_bytes / item_bytes));
}

static int trailing(const char *path, uint64_t extra, size_t count)
{
    return DDP_ERROR(DDP_ERR_FORMAT, "%s: trailing data: %llu bytes after the %zu items "
                     "the header declares", path, (unsigned long long)extra, count);
}

static int read_idx_file(const char *path, uint32_t magic, ddp_idx *out, int *was_gz)
{
    int rc = 0;
    source s;
    populate pop = {.started = 0};
    ddp_idx idx;
    memset(&idx, 0, sizeof idx);
    s.fd = -1;
    s.z_ready = 0;
    s.in = NULL;
    DDP_FAIL_OUT(!path || !out, DDP_ERR_INVALID_ARG, "ddp_idx_read: NULL argument");
    memset(out, 0, sizeof *out);
    unsigned want_ndim = magic & 0xff;
    DDP_FAIL_OUT((magic & 0xffffff00u) != 0x00000800u || want_ndim < 1 ||
                     want_ndim > DDP_IDX_MAX_DIM,
                 DDP_ERR_INVALID_ARG, "ddp_idx_read: magic 0x%08x is not an unsigned-byte "
                 "IDX magic with 1..%d dimensions", magic, DDP_IDX_MAX_DIM);
    DDP_TRY_OUT(source_open(&s, path));
    *was_gz = s.gz;

    /* Header: magic, then one big-endian uint32 per dimension. */
    uint8_t hdr[4 + 4 * DDP_IDX_MAX_DIM];
    size_t hdr_bytes = 4 + 4 * (size_t)want_ndim, got;
    DDP_TRY_OUT(source_read(&s, hdr, 4, &got));
    DDP_FAIL_OUT(got == 0, DDP_ERR_FORMAT, "%s: empty file (no IDX header)", path);
    DDP_FAIL_OUT(got < 4, DDP_ERR_FORMAT, "%s: truncated: the file ends inside the IDX "
                 "header (%zu of %zu bytes)", path, got, hdr_bytes);
    DDP_TRY_OUT(check_magic(path, be32(hdr), magic));
    DDP_TRY_OUT(source_read(&s, hdr + 4, hdr_bytes - 4, &got));
    DDP_FAIL_OUT(got < hdr_bytes - 4, DDP_ERR_FORMAT, "%s: truncated: the file ends inside "
                 "the IDX header (%zu of %zu bytes)", path, 4 + got, hdr_bytes);

    idx.ndim = (int)want_ndim;
    idx.item_bytes = 1;
    for (int d = 0; d < idx.ndim; d++) {
        idx.dims[d] = be32(hdr + 4 + 4 * d);
        DDP_FAIL_OUT(idx.dims[d] == 0, DDP_ERR_FORMAT, "%s: dimension %d is 0 in the header",
                     path, d);
        if (d > 0) {
            DDP_FAIL_OUT(idx.item_bytes > SIZE_MAX / idx.dims[d], DDP_ERR_FORMAT,
                         "%s: item size overflows", path);
            idx.item_bytes *= idx.dims[d];
        }
    }
    idx.count = idx.dims[0];
    DDP_FAIL_OUT(idx.count > SIZE_MAX / idx.item_bytes, DDP_ERR_FORMAT,
                 "%s: header declares more bytes than memory can hold", path);
    size_t total = idx.count * idx.item_bytes;

    /* Refuse impossible sizes before allocating: a raw file's size is known,
     * and deflate cannot expand more than 1032 times. */
    uint64_t extra;
    if (!s.gz) {
        uint64_t avail = s.file_size - hdr_bytes;
        if (avail < total)
            DDP_TRY_OUT(truncated(path, idx.count, avail, idx.item_bytes));
        if (avail > total)
            DDP_TRY_OUT(trailing(path, avail - total, idx.count));
    } else if (total / DEFLATE_MAX_RATIO > s.file_size) {
        DDP_TRY_OUT(source_skip_rest(&s, &extra));
        DDP_TRY_OUT(truncated(path, idx.count, extra, idx.item_bytes));
    }

    idx.data = ddp__big_alloc(total, &idx.alloc_bytes_);
    DDP_FAIL_OUT(!idx.data, DDP_ERR_NOMEM, "%s: no memory for %zu bytes of items", path,
                 total);
    populate_start(&pop, idx.data, total);
    rc = source_read(&s, idx.data, total, &got);
    populate_join(&pop);
    DDP_TRY_OUT(rc);
    if (got < total)
        DDP_TRY_OUT(truncated(path, idx.count, got, idx.item_bytes));
    DDP_TRY_OUT(source_skip_rest(&s, &extra));
    if (extra)
        DDP_TRY_OUT(trailing(path, extra, idx.count));
    DDP_FAIL_OUT(s.z_cut, DDP_ERR_FORMAT, "%s: truncated: the gzip stream ends before its "
                 "trailer (the data is complete but its CRC cannot be checked)", path);
    *out = idx;
    idx.data = NULL;
out:
    source_close(&s);
    ddp__big_free(idx.data, idx.alloc_bytes_);
    return rc;
}

int ddp_idx_read(const char *path, uint32_t magic, ddp_idx *out)
{
    ddp__idx_cache c;
    int gz = 0, cached = path && out ? ddp__idx_cache_lookup(path, &c) : 0;
    if (cached < 0) {
        memset(out, 0, sizeof *out);
        return cached;
    }
    if (cached && access(c.path, F_OK) == 0) {
        if (read_idx_file(c.path, magic, out, &gz) == 0 && !gz) {
            ddp__idx_cache_touch(&c);
            return 0;
        }
        ddp_idx_destroy(out);
        unlink(c.path); /* damaged: read the source, and write it again */
    }
    int rc = read_idx_file(path, magic, out, &gz);
    if (rc == 0 && gz && cached)
        ddp__idx_cache_store(&c, magic, out);
    return rc;
}

void ddp_idx_destroy(ddp_idx *idx)
{
    if (!idx)
        return;
    ddp__big_free(idx->data, idx->alloc_bytes_);
    memset(idx, 0, sizeof *idx);
}
