/* safetensors files: the generic reader/writer (safetensors.h); the
 * model's save/load is in state_dict.c. */
#include "nn/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "base/file.h"
#include "base/json.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define HOST_BIG_ENDIAN 1
#else
#define HOST_BIG_ENDIAN 0
#endif

/* Reverses the bytes of each size-byte element of p (n bytes). */
static void swap_elems(void *p, size_t n, size_t size)
{
    unsigned char *b = p;
    for (size_t i = 0; i + size <= n; i += size)
        for (size_t j = 0; j < size / 2; j++) {
            unsigned char t = b[i + j];
            b[i + j] = b[i + size - 1 - j], b[i + size - 1 - j] = t;
        }
}

/* ==== a growable string =================================================== */

typedef struct sbuf {
    char *s;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->oom = 1;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

__attribute__((format(printf, 2, 3))) static void sb_fmt(sbuf *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        sb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A JSON string literal. */
static void sb_json_str(sbuf *b, const char *s)
{
    sb_str(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            sb_put(b, e, 2);
        } else if (c < 0x20) {
            sb_fmt(b, "\\u%04x", c);
        } else {
            sb_put(b, (const char *)&c, 1);
        }
    }
    sb_str(b, "\"");
}

/* ==== writing ============================================================= */

static int write_all(int fd, const void *buf, size_t n, const char *path)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) /* interrupted before writing: retry */
                continue;
            return DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "write %s", path);
        }
        p += w; /* a partial write: continue with the rest */
        n -= (size_t)w;
    }
    return 0;
}

/* n elements of size bytes (4 or 8), little-endian on the wire. */
static int write_elems(int fd, const void *x, size_t n, size_t size, const char *path)
{
    if (!HOST_BIG_ENDIAN)
        return write_all(fd, x, n * size, path);
    unsigned char tmp[16384];
    size_t per = sizeof tmp / size;
    for (size_t i = 0; i < n; i += per) {
        size_t k = n - i < per ? n - i : per;
        memcpy(tmp, (const unsigned char *)x + i * size, k * size);
        swap_elems(tmp, k * size, size);
        DDP_TRY(write_all(fd, tmp, k * size, path));
    }
    return 0;
}

int ddp__st_write(const char *path, const ddp__st_out *t, size_t n, const char *const *meta,
                  size_t nmeta)
{
    int rc = 0, fd = -1;
    sbuf h = {0};
    char *tmp = NULL;
    DDP_FAIL_IF(!path || (n && !t), DDP_ERR_INVALID_ARG, "safetensors: NULL path or tensors");
    /* Header: tensors in order, back to back from offset 0. */
    uint64_t off = 0;
    sb_str(&h, "{");
    for (size_t i = 0; i < n; i++) {
        uint64_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++)
            numel *= (uint64_t)t[i].shape[d];
        sb_json_str(&h, t[i].name);
        sb_fmt(&h, ":{\"dtype\":\"%s\",\"shape\":[", t[i].dtype == DDP_INT64 ? "I64" : "F32");
        for (int d = 0; d < t[i].ndim; d++)
            sb_fmt(&h, "%s%lld", d ? "," : "", (long long)t[i].shape[d]);
        uint64_t size = t[i].dtype == DDP_INT64 ? 8 : 4;
        sb_fmt(&h, "],\"data_offsets\":[%llu,%llu]},", (unsigned long long)off,
               (unsigned long long)(off + size * numel));
        off += size * numel;
    }
    sb_str(&h, "\"__metadata__\":{\"format\":\"pt\"");
    for (size_t i = 0; i < nmeta; i++) {
        sb_str(&h, ",");
        sb_json_str(&h, meta[2 * i]);
        sb_str(&h, ":");
        sb_json_str(&h, meta[2 * i + 1]);
    }
    sb_str(&h, "}}");
    while (h.len % 8) /* the data buffer starts 8-byte aligned */
        sb_str(&h, " ");
    DDP_FAIL_OUT(h.oom, DDP_ERR_NOMEM, "safetensors %s: out of memory for the header", path);

    size_t plen = strlen(path);
    tmp = malloc(plen + 5);
    DDP_FAIL_OUT(!tmp, DDP_ERR_NOMEM, "safetensors %s: out of memory", path);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    DDP_FAIL_OUT(fd < 0, DDP_ERR_IO, "safetensors: cannot create %s: %s", tmp, strerror(errno));
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
    DDP_TRY_OUT(write_all(fd, len8, 8, tmp));
    DDP_TRY_OUT(write_all(fd, h.s, h.len, tmp));
    for (size_t i = 0; i < n; i++) {
        size_t numel = 1;
        for (int d = 0; d < t[i].ndim; d++)
            numel *= (size_t)t[i].shape[d];
        DDP_TRY_OUT(write_elems(fd, t[i].data, numel, t[i].dtype == DDP_INT64 ? 8 : 4, tmp));
    }
    DDP_FAIL_OUT(fsync(fd) < 0, DDP_ERR_IO, "safetensors: fsync %s: %s", tmp, strerror(errno));
    int cfd = fd;
    fd = -1;
    DDP_FAIL_OUT(close(cfd) < 0, DDP_ERR_IO, "safetensors: close %s: %s", tmp, strerror(errno));
    DDP_FAIL_OUT(rename(tmp, path) < 0, DDP_ERR_IO, "safetensors: rename %s to %s: %s", tmp,
                 path, strerror(errno));
    rc = ddp__file_fsync_parent(path);
out:
    if (fd >= 0)
        close(fd);
    if (rc < 0 && tmp)
        unlink(tmp);
    free(tmp);
    free(h.s);
    return rc;
}

/* ==== reading ============================================================= */

static int read_all(int fd, void *buf, size_t n, const char *path)
{
    char *p = buf;
    while (n > 0) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "safetensors: read %s", path);
        if (r == 0)
            return DDP_ERROR(DDP_ERR_FORMAT, "safetensors %s: file ends early", path);
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static size_t dtype_size(const char *d)
{
    static const struct {
        const char *name;
        size_t size;
    } types[] = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
                 {"I16", 2}, {"I8", 1},  {"U64", 8}, {"U32", 4},  {"U16", 2}, {"U8", 1},
                 {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strcmp(d, types[i].name) == 0)
            return types[i].size;
    return 0;
}

void ddp__st_shape_str(char *buf, size_t len, int ndim, const int64_t *shape)
{
    size_t n = (size_t)snprintf(buf, len, "(");
    for (int d = 0; d < ndim && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (n < len)
        snprintf(buf + n, len - n, ")");
}

/* One header member -> entry, checking its fields. */
static int parse_entry(const char *path, const ddp__json *m, size_t data_len, ddp__st_entry *e)
{
    const char *name = m->key;
    DDP_FAIL_IF(m->type != DDP_JSON_OBJECT, DDP_ERR_FORMAT,
                "safetensors %s: %s: expected an object, found %s", path, name,
                ddp__json_type_name(m->type));
    for (const ddp__json *f = m->child; f; f = f->next)
        DDP_FAIL_IF(strcmp(f->key, "dtype") && strcmp(f->key, "shape") &&
                        strcmp(f->key, "data_offsets"),
                    DDP_ERR_FORMAT, "safetensors %s: %s: unknown field \"%s\"", path, name,
                    f->key);
    const ddp__json *dt = ddp__json_get(m, "dtype"), *sh = ddp__json_get(m, "shape");
    const ddp__json *of = ddp__json_get(m, "data_offsets");
    DDP_FAIL_IF(!dt || dt->type != DDP_JSON_STRING, DDP_ERR_FORMAT,
                "safetensors %s: %s: missing or non-string \"dtype\"", path, name);
    e->elem_size = dtype_size(dt->str);
    DDP_FAIL_IF(!e->elem_size || strlen(dt->str) >= sizeof e->dtype, DDP_ERR_FORMAT,
                "safetensors %s: %s: unknown dtype \"%s\"", path, name, dt->str);
    snprintf(e->dtype, sizeof e->dtype, "%s", dt->str);
    DDP_FAIL_IF(!sh || sh->type != DDP_JSON_ARRAY, DDP_ERR_FORMAT,
                "safetensors %s: %s: missing or non-array \"shape\"", path, name);
    DDP_FAIL_IF(sh->len > DDP_ST_MAX_DIM, DDP_ERR_FORMAT,
                "safetensors %s: %s: shape has %zu dimensions (at most %d)", path, name,
                sh->len, DDP_ST_MAX_DIM);
    int d = 0;
    for (const ddp__json *x = sh->child; x; x = x->next, d++) {
        DDP_FAIL_IF(x->type != DDP_JSON_NUMBER || !x->is_uint || x->u64 > INT64_MAX,
                    DDP_ERR_FORMAT,
                    "safetensors %s: %s: shape entry %d is not a non-negative integer", path,
                    name, d);
        e->shape[d] = (int64_t)x->u64;
    }
    e->ndim = d;
    /* Checked products: [2^32, 2^32] must not wrap to 0 elements and pass
     * as an empty tensor.  Without a wrap, the size must equal the span of
     * data_offsets, which lies inside the file (checked below). */
    uint64_t numel = 1, bytes = 0;
    int wraps = 0;
    for (d = 0; d < e->ndim; d++)
        wraps |= __builtin_mul_overflow(numel, (uint64_t)e->shape[d], &numel);
    wraps |= __builtin_mul_overflow(numel, (uint64_t)e->elem_size, &bytes);
    if (wraps) {
        char shape[DDP_ST_MAX_DIM * 22 + 4];
        ddp__st_shape_str(shape, sizeof shape, e->ndim, e->shape);
        return DDP_ERROR(DDP_ERR_FORMAT,
                         "safetensors %s: %s: shape %s of %s is 2^64 bytes or more (the data "
                         "buffer has %zu)", path, name, shape, e->dtype, data_len);
    }
    DDP_FAIL_IF(!of || of->type != DDP_JSON_ARRAY || of->len != 2 ||
                    of->child->type != DDP_JSON_NUMBER || !of->child->is_uint ||
                    of->child->next->type != DDP_JSON_NUMBER || !of->child->next->is_uint,
                DDP_ERR_FORMAT,
                "safetensors %s: %s: \"data_offsets\" must be two non-negative integers", path,
                name);
    e->begin = of->child->u64;
    e->end = of->child->next->u64;
    DDP_FAIL_IF(e->begin > e->end || e->end > data_len, DDP_ERR_FORMAT,
                "safetensors %s: %s: data_offsets [%llu, %llu] out of range (data buffer of "
                "%zu bytes)", path, name, (unsigned long long)e->begin,
                (unsigned long long)e->end, data_len);
    DDP_FAIL_IF(e->end - e->begin != bytes, DDP_ERR_FORMAT,
                "safetensors %s: %s: data_offsets [%llu, %llu] hold %llu bytes, but %s of %llu "
                "elements needs %llu", path, name, (unsigned long long)e->begin,
                (unsigned long long)e->end, (unsigned long long)(e->end - e->begin), e->dtype,
                (unsigned long long)numel, (unsigned long long)bytes);
    e->name = strdup(name);
    DDP_FAIL_IF(!e->name, DDP_ERR_NOMEM, "safetensors: out of memory");
    return 0;
}

static int cmp_begin(const void *a, const void *b)
{
    const ddp__st_entry *x = *(const ddp__st_entry *const *)a;
    const ddp__st_entry *y = *(const ddp__st_entry *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* Entries must tile [0, data_len): sorted by offset, each starts where the
 * previous ends. */
static int check_tiling(const char *path, ddp__st_file *f)
{
    int rc = 0;
    ddp__st_entry **order = malloc((f->n ? f->n : 1) * sizeof *order);
    DDP_FAIL_IF(!order, DDP_ERR_NOMEM, "safetensors: out of memory");
    for (size_t i = 0; i < f->n; i++)
        order[i] = &f->entries[i];
    qsort(order, f->n, sizeof *order, cmp_begin);
    uint64_t at = 0;
    for (size_t i = 0; i < f->n; i++) {
        ddp__st_entry *e = order[i];
        DDP_FAIL_OUT(e->begin < at, DDP_ERR_FORMAT,
                     "safetensors %s: %s: data_offsets [%llu, %llu] overlap %s", path, e->name,
                     (unsigned long long)e->begin, (unsigned long long)e->end, order[i - 1]->name);
        DDP_FAIL_OUT(e->begin > at, DDP_ERR_FORMAT,
                     "safetensors %s: %s: data_offsets start at %llu, leaving bytes %llu..%llu "
                     "of the data buffer unused", path, e->name, (unsigned long long)e->begin,
                     (unsigned long long)at, (unsigned long long)e->begin);
        at = e->end;
    }
    DDP_FAIL_OUT(at != f->data_len, DDP_ERR_FORMAT,
                 "safetensors %s: tensors cover %llu bytes of a %zu-byte data buffer", path,
                 (unsigned long long)at, f->data_len);
out:
    free(order);
    return rc;
}

/* Copies the string pairs of __metadata__ into f. */
static int read_meta(const char *path, const ddp__json *m, ddp__st_file *f)
{
    size_t n = 0;
    for (const ddp__json *kv = m->child; kv; kv = kv->next) {
        DDP_FAIL_IF(kv->type != DDP_JSON_STRING, DDP_ERR_FORMAT,
                    "safetensors %s: __metadata__ value \"%s\" is not a string", path, kv->key);
        n++;
    }
    f->meta = calloc(2 * n + 2, sizeof *f->meta); /* +2: see ddp__st_close */
    DDP_FAIL_IF(!f->meta, DDP_ERR_NOMEM, "safetensors %s: out of memory", path);
    for (const ddp__json *kv = m->child; kv; kv = kv->next, f->nmeta++) {
        f->meta[2 * f->nmeta] = strdup(kv->key);
        f->meta[2 * f->nmeta + 1] = strdup(kv->str);
        DDP_FAIL_IF(!f->meta[2 * f->nmeta] || !f->meta[2 * f->nmeta + 1], DDP_ERR_NOMEM,
                    "safetensors %s: out of memory", path);
    }
    return 0;
}

int ddp__st_read(const char *path, ddp__st_file *out)
{
    int rc = 0, fd = -1;
    char *header = NULL;
    ddp__json *root = NULL;
    ddp__st_file f = {0};
    DDP_FAIL_IF(!path || !out, DDP_ERR_INVALID_ARG, "safetensors: NULL path or output");
    memset(out, 0, sizeof *out);
    struct stat st;
    char what[4200];
    snprintf(what, sizeof what, "safetensors %s", path);
    DDP_TRY_OUT(ddp__open_regular(path, O_RDONLY, what, &fd, &st));
    uint64_t size = (uint64_t)st.st_size;
    DDP_FAIL_OUT(size < 8, DDP_ERR_FORMAT,
                 "safetensors %s: file of %llu bytes is too short for the 8-byte header length",
                 path, (unsigned long long)size);
    unsigned char len8[8];
    DDP_TRY_OUT(read_all(fd, len8, 8, path));
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | len8[i];
    DDP_FAIL_OUT(hlen > size - 8, DDP_ERR_FORMAT,
                 "safetensors %s: header length %llu exceeds the %llu bytes after it", path,
                 (unsigned long long)hlen, (unsigned long long)(size - 8));
    DDP_FAIL_OUT(hlen > DDP_ST_MAX_HEADER || hlen < 2, DDP_ERR_FORMAT,
                 "safetensors %s: header length %llu is not within [2, %u]", path,
                 (unsigned long long)hlen, DDP_ST_MAX_HEADER);
    header = malloc(hlen);
    DDP_FAIL_OUT(!header, DDP_ERR_NOMEM, "safetensors %s: out of memory for the header", path);
    DDP_TRY_OUT(read_all(fd, header, hlen, path));
    DDP_FAIL_OUT(header[0] != '{', DDP_ERR_FORMAT,
                 "safetensors %s: header does not start with '{'", path);
    if ((rc = ddp__json_parse(header, hlen, &root)) < 0) {
        ddp__error_context(rc, "safetensors %s: bad header", path);
        goto out;
    }
    f.data_len = (size_t)(size - 8 - hlen);
    for (const ddp__json *m = root->child; m; m = m->next)
        f.n += strcmp(m->key, "__metadata__") != 0;
    f.entries = calloc(f.n ? f.n : 1, sizeof *f.entries);
    DDP_FAIL_OUT(!f.entries, DDP_ERR_NOMEM, "safetensors: out of memory");
    size_t i = 0;
    for (const ddp__json *m = root->child; m; m = m->next) {
        if (strcmp(m->key, "__metadata__") == 0) {
            DDP_FAIL_OUT(m->type != DDP_JSON_OBJECT, DDP_ERR_FORMAT,
                         "safetensors %s: __metadata__ must be an object", path);
            DDP_TRY_OUT(read_meta(path, m, &f));
            continue;
        }
        DDP_TRY_OUT(parse_entry(path, m, f.data_len, &f.entries[i++]));
    }
    DDP_TRY_OUT(check_tiling(path, &f));
    f.data = malloc(f.data_len ? f.data_len : 1);
    DDP_FAIL_OUT(!f.data, DDP_ERR_NOMEM, "safetensors %s: cannot allocate %zu bytes", path,
                 f.data_len);
    DDP_TRY_OUT(read_all(fd, f.data, f.data_len, path));
    if (HOST_BIG_ENDIAN)
        for (size_t k = 0; k < f.n; k++)
            if (strcmp(f.entries[k].dtype, "F32") == 0 || strcmp(f.entries[k].dtype, "I64") == 0)
                swap_elems(f.data + f.entries[k].begin, f.entries[k].end - f.entries[k].begin,
                           f.entries[k].elem_size);
    *out = f;
    memset(&f, 0, sizeof f);
out:
    if (fd >= 0)
        close(fd);
    free(header);
    ddp__json_free(root);
    ddp__st_close(&f);
    return rc;
}

void ddp__st_close(ddp__st_file *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->n; i++)
        free(f->entries[i].name);
    free(f->entries);
    for (size_t i = 0; f->meta && i < 2 * f->nmeta + 2; i++)
        free(f->meta[i]);
    free(f->meta);
    free(f->data);
    memset(f, 0, sizeof *f);
}

const ddp__st_entry *ddp__st_find(const ddp__st_file *f, const char *name)
{
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->entries[i].name, name) == 0)
            return &f->entries[i];
    return NULL;
}

const char *ddp__st_meta(const ddp__st_file *f, const char *key)
{
    for (size_t i = 0; i < f->nmeta; i++)
        if (strcmp(f->meta[2 * i], key) == 0)
            return f->meta[2 * i + 1];
    return NULL;
}
