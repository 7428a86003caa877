/* The decompressed cache of gzip'ed IDX files (docs/data.md, "Decompressed
 * cache").  Inflating Fashion-MNIST's 47 MB of training images costs
 * ~0.17 s, most of a training run's start-up, on every rank.  So a gzip'ed
 * file, once read and checked, is also written decompressed to a cache
 * folder (DDP_DATA_CACHE_DIR, else $XDG_CACHE_HOME/libddp, else
 * ~/.cache/libddp; DDP_DATA_CACHE=0 turns it off), under a name made of the
 * source's path, size, modification time and gzip trailer (CRC-32 and
 * length of its content), so any change to the source misses the cache.
 * Later reads take the raw path (~0.01 s).
 *
 * Bounded (without it, every new path or version of a data set added
 * ~55 MB for good): each write is followed by a sweep of the folder that
 * removes the entries of older versions of the same source, entries whose
 * source is gone or changed (each entry has a symlink NAME.src to its
 * source's real path), temporary files older than TMP_MAX_AGE_S (a writer
 * that died), and then the least recently used entries (a hit touches its
 * entry's mtime) until the entries fit DDP_DATA_CACHE_MAX_BYTES (1 GiB by
 * default).  Files whose names are not an entry's are never touched.
 *
 * Several processes (ranks) may use one folder at once: an entry is written
 * to a temporary file of a unique name and renamed into place, so a reader
 * opens a complete file or none; a reader holding an open entry keeps its
 * bytes even if another process removes it; removals of what is already
 * gone are ignored.  Everything here is advisory: a failure only costs the
 * next read a decompression. */
#include "data/idx_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/env.h"
#include "base/error.h"
#include "base/file.h"

#define TMP_MAX_AGE_S (15 * 60)   /* writing an entry takes about a second */
#define WRITE_CHUNK (1u << 30)    /* largest single write() */

/* ------------------------------------------------------------------ entry names */

/* BASE-HASH-SIZE-SEC.NSEC-TRAILER.idx: the parts that say which source
 * version an entry holds (BASE may itself contain dashes). */
typedef struct entry_key {
    char hash[17];         /* FNV-1a of the source's real path, hex */
    unsigned long long size;
    long long sec;
    long nsec;
} entry_key;

static int parse_entry(const char *name, entry_key *k)
{
    size_t n = strlen(name);
    if (n < 5 || strcmp(name + n - 4, ".idx") != 0)
        return 0;
    const char *p = name + n - 4;
    for (int dashes = 0; dashes < 4; dashes++) /* the four separators from the right */
        do {
            if (p == name)
                return 0;
        } while (*--p != '-');
    char tail[17];
    int used = 0;
    if (sscanf(p, "-%16[0-9a-f]-%llu-%lld.%9ld-%16[0-9a-f].idx%n", k->hash, &k->size, &k->sec,
               &k->nsec, tail, &used) != 5 || p[used] != '\0')
        return 0;
    return strlen(k->hash) == 16 && strlen(tail) == 16;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* ------------------------------------------------------------------ lookup */

/* mkdir -p, quietly: a failure shows up when the file is created. */
static void make_dirs(const char *path)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        mkdir(dir, 0755);
        *p = '/';
    }
    mkdir(dir, 0755);
}

int ddp__idx_cache_lookup(const char *path, ddp__idx_cache *c)
{
    int on = 1;
    DDP_TRY(ddp__env_bool("DDP_DATA_CACHE", &on));
    if (!on)
        return 0;
    size_t max = 0;
    DDP_TRY(ddp__env_size("DDP_DATA_CACHE_MAX_BYTES", &max));
    c->max_bytes = max;
    const char *d = NULL, *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    DDP_TRY(ddp__env_string("DDP_DATA_CACHE_DIR", &d));
    if (d)
        snprintf(c->dir, sizeof c->dir, "%s", d);
    else if (x && *x)
        snprintf(c->dir, sizeof c->dir, "%s/libddp", x);
    else if (home && *home)
        snprintf(c->dir, sizeof c->dir, "%s/.cache/libddp", home);
    else
        return 0;
    struct stat st;
    uint8_t tail[8];
    int fd = -1; /* a FIFO is refused here without blocking; the reader says why */
    int ok = ddp__open_regular(path, O_RDONLY, path, &fd, &st) == 0 && st.st_size >= 18 &&
             pread(fd, tail, 8, st.st_size - 8) == 8 && realpath(path, c->source);
    if (fd >= 0)
        close(fd);
    if (!ok)
        return 0;
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a of the real path */
    for (const char *p = c->source; *p; p++)
        h = (h ^ (uint8_t)*p) * 0x100000001b3ULL;
    const char *base = strrchr(c->source, '/');
    base = base ? base + 1 : c->source;
    int n = snprintf(c->name, sizeof c->name,
                     "%.64s-%016llx-%lld-%lld.%09ld-%02x%02x%02x%02x%02x%02x%02x%02x.idx", base,
                     (unsigned long long)h, (long long)st.st_size, (long long)st.st_mtim.tv_sec,
                     (long)st.st_mtim.tv_nsec, tail[0], tail[1], tail[2], tail[3], tail[4],
                     tail[5], tail[6], tail[7]);
    int m = n > 0 ? snprintf(c->path, sizeof c->path, "%s/%s", c->dir, c->name) : -1;
    return n > 0 && (size_t)n < sizeof c->name && m > 0 && (size_t)m < sizeof c->path;
}

void ddp__idx_cache_touch(const ddp__idx_cache *c)
{
    utimensat(AT_FDCWD, c->path, NULL, 0); /* the LRU clock; a read-only cache stays put */
}

/* ------------------------------------------------------------------ sweep */

typedef struct entry {
    char name[DDP__IDX_CACHE_NAME_MAX];
    uint64_t bytes;
    struct timespec used;
} entry;

static int older(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    if (x->used.tv_sec != y->used.tv_sec)
        return x->used.tv_sec < y->used.tv_sec ? -1 : 1;
    if (x->used.tv_nsec != y->used.tv_nsec)
        return x->used.tv_nsec < y->used.tv_nsec ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* name with its .idx replaced by suffix (".src"). */
static void sibling(char *out, size_t len, const char *name, const char *suffix)
{
    snprintf(out, len, "%.*s%s", (int)(strlen(name) - 4), name, suffix);
}

static void remove_entry(int dfd, const char *name)
{
    char link[DDP__IDX_CACHE_NAME_MAX + 8];
    sibling(link, sizeof link, name, ".src");
    unlinkat(dfd, name, 0);
    unlinkat(dfd, link, 0);
}

/* 1 when the entry's source is gone or no longer the version it holds;
 * 0 when it is, or when the entry has no link to tell. */
static int source_gone(int dfd, const char *name, const entry_key *k)
{
    char link[DDP__IDX_CACHE_NAME_MAX + 8];
    struct stat st;
    sibling(link, sizeof link, name, ".src");
    if (fstatat(dfd, link, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISLNK(st.st_mode))
        return 0;
    if (fstatat(dfd, link, &st, 0) != 0)
        return errno == ENOENT || errno == ENOTDIR;
    return (unsigned long long)st.st_size != k->size || (long long)st.st_mtim.tv_sec != k->sec ||
           (long)st.st_mtim.tv_nsec != k->nsec;
}

/* Applies the rules of the file comment, keeping c's own entry. */
static void sweep(const ddp__idx_cache *c)
{
    entry_key mine, k;
    if (!parse_entry(c->name, &mine))
        return;
    DIR *d = opendir(c->dir);
    if (!d)
        return;
    int dfd = dirfd(d);
    entry *list = NULL;
    size_t n = 0, cap = 0;
    uint64_t total = 0;
    time_t now = time(NULL);
    struct dirent *e;
    struct stat st;
    while ((e = readdir(d))) {
        const char *name = e->d_name;
        if (ends_with(name, ".tmp")) { /* ENTRY.XXXXXX.tmp (or ENTRY.PID.tmp) */
            const char *dot = strstr(name, ".idx.");
            char idx[DDP__IDX_CACHE_NAME_MAX];
            if (dot && (size_t)(dot + 4 - name) < sizeof idx) {
                snprintf(idx, sizeof idx, "%.*s", (int)(dot + 4 - name), name);
                if (parse_entry(idx, &k) && fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                    now - st.st_mtim.tv_sec > TMP_MAX_AGE_S)
                    unlinkat(dfd, name, 0); /* its writer died */
            }
            continue;
        }
        if (ends_with(name, ".src")) {
            char idx[DDP__IDX_CACHE_NAME_MAX + 8];
            snprintf(idx, sizeof idx, "%.*s.idx", (int)(strlen(name) - 4), name);
            if (parse_entry(idx, &k) && fstatat(dfd, idx, &st, AT_SYMLINK_NOFOLLOW) != 0 &&
                errno == ENOENT)
                unlinkat(dfd, name, 0); /* its entry is gone */
            continue;
        }
        if (!parse_entry(name, &k) || strlen(name) >= DDP__IDX_CACHE_NAME_MAX ||
            fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (strcmp(name, c->name) == 0) {
            total += (uint64_t)st.st_size;
            continue;
        }
        if (strcmp(k.hash, mine.hash) == 0 || source_gone(dfd, name, &k)) {
            remove_entry(dfd, name); /* an older version of this source, or a stale one */
            continue;
        }
        if (n == cap) {
            size_t ncap = cap ? 2 * cap : 16;
            entry *grown = realloc(list, ncap * sizeof *list);
            if (!grown)
                break; /* the rest waits for the next sweep */
            list = grown;
            cap = ncap;
        }
        snprintf(list[n].name, sizeof list[n].name, "%s", name);
        list[n].bytes = (uint64_t)st.st_size;
        list[n].used = st.st_mtim;
        total += list[n++].bytes;
    }
    if (n)
        qsort(list, n, sizeof *list, older);
    for (size_t i = 0; i < n && total > c->max_bytes; i++) {
        remove_entry(dfd, list[i].name);
        total -= list[i].bytes;
    }
    free(list);
    closedir(d);
}

/* ------------------------------------------------------------------ store */

void ddp__idx_cache_store(const ddp__idx_cache *c, uint32_t magic, const ddp_idx *idx)
{
    uint8_t hdr[4 + 4 * DDP_IDX_MAX_DIM];
    size_t hdr_bytes = 4 + 4 * (size_t)idx->ndim;
    size_t total = idx->count * idx->item_bytes, done = 0;
    if (hdr_bytes + total > c->max_bytes)
        return; /* it would only push everything else out, and then itself */
    make_dirs(c->dir);
    char tmp[DDP__IDX_CACHE_PATH_MAX + 16], link[DDP__IDX_CACHE_PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.XXXXXX.tmp", c->path);
    int fd = mkostemps(tmp, 4, O_CLOEXEC); /* a unique name: ranks write at once */
    if (fd < 0)
        return;
    for (int i = 0; i <= idx->ndim; i++) {
        uint32_t v = i == 0 ? magic : idx->dims[i - 1];
        hdr[4 * i] = (uint8_t)(v >> 24);
        hdr[4 * i + 1] = (uint8_t)(v >> 16);
        hdr[4 * i + 2] = (uint8_t)(v >> 8);
        hdr[4 * i + 3] = (uint8_t)v;
    }
    int ok = fchmod(fd, 0644) == 0 && write(fd, hdr, hdr_bytes) == (ssize_t)hdr_bytes;
    while (ok && done < total) {
        ssize_t w = write(fd, idx->data + done, total - done < WRITE_CHUNK ? total - done : WRITE_CHUNK);
        if (w < 0 && errno == EINTR)
            continue;
        ok = w > 0;
        done += ok ? (size_t)w : 0;
    }
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, c->path) != 0) {
        unlink(tmp);
        return;
    }
    /* After the rename: a link never exists without its entry for long
     * (the sweep removes such links).  EEXIST: the same source's link. */
    sibling(link, sizeof link, c->path, ".src");
    if (symlink(c->source, link) != 0 && errno != EEXIST) {
        /* No link (a file system without them): LRU alone decides. */
    }
    sweep(c);
}
