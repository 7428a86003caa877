/* Merging the ranks' timeline files into one trace (timeline.h), for
 * ddprun and `ddp-timeline merge`.  Each file is parsed by the one JSON
 * parser (base/json.c), so a truncated or foreign file is refused with the
 * parser's message rather than spliced in; its events are written back
 * unchanged (each keeps its rank's pid: one process per rank in Perfetto).
 * The ranks' clocks were already brought to rank 0's when they wrote
 * (timeline.c), so merging is a concatenation. */
#include "base/timeline.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/env.h"
#include "base/error.h"
#include "base/json.h"

#define MAX_FILE_BYTES ((size_t)1 << 32)

/* Bytes of the valid UTF-8 sequence at p (RFC 3629: no overlong forms, no
 * surrogates, nothing above U+10FFFF), or 0. */
static int utf8_len(const unsigned char *p)
{
    int n = p[0] >= 0xF0 ? 4 : p[0] >= 0xE0 ? 3 : p[0] >= 0xC2 ? 2 : 0;
    if (n == 0 || p[0] > 0xF4)
        return 0;
    unsigned lo = p[0] == 0xE0 ? 0xA0 : p[0] == 0xF0 ? 0x90 : 0x80;
    unsigned hi = p[0] == 0xED ? 0x9F : p[0] == 0xF4 ? 0x8F : 0xBF;
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (int i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF)
            return 0;
    return n;
}

/* A JSON string: quotes, backslashes and control characters escaped, valid
 * UTF-8 kept, any other byte written as '?' (a span name may hold any
 * bytes; the file must stay valid JSON text for Perfetto and base/json.c).
 * pg/trace_dump.c has a twin (put_str) that turns every byte above 127 into
 * '?': one of them should become base/json.c's writer. */
void ddp__tl_put_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int n;
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else if (*p < 0x80)
            fputc(*p, f);
        else if ((n = utf8_len(p)) > 0) {
            fwrite(p, 1, (size_t)n, f);
            p += n - 1;
        } else
            fputc('?', f);
    }
    fputc('"', f);
}

/* The shortest of %.15g and %.17g that reads back as v (JSON has no nan/inf,
 * and the parser admits none). */
static void put_number(FILE *f, const ddp__json *v)
{
    if (v->is_uint) {
        fprintf(f, "%llu", (unsigned long long)v->u64);
        return;
    }
    char buf[40];
    snprintf(buf, sizeof buf, "%.15g", v->num);
    if (strtod(buf, NULL) != v->num)
        snprintf(buf, sizeof buf, "%.17g", v->num);
    fputs(buf, f);
}

static void put_value(FILE *f, const ddp__json *v)
{
    switch (v->type) {
    case DDP_JSON_NULL: fputs("null", f); return;
    case DDP_JSON_FALSE: fputs("false", f); return;
    case DDP_JSON_TRUE: fputs("true", f); return;
    case DDP_JSON_NUMBER: put_number(f, v); return;
    case DDP_JSON_STRING: ddp__tl_put_string(f, v->str); return;
    default: break;
    }
    int obj = v->type == DDP_JSON_OBJECT;
    fputc(obj ? '{' : '[', f);
    for (const ddp__json *c = v->child; c; c = c->next) {
        if (obj) {
            ddp__tl_put_string(f, c->key);
            fputc(':', f);
        }
        put_value(f, c);
        if (c->next)
            fputc(',', f);
    }
    fputc(obj ? '}' : ']', f);
}

/* The whole file, NUL-terminated.  Caller frees *out. */
static int slurp(const char *path, char **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "timeline: cannot open %s", path);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    int rc = 0;
    for (;;) {
        DDP_FAIL_OUT(!buf, DDP_ERR_NOMEM, "timeline: out of memory reading %s", path);
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        DDP_FAIL_OUT(cap >= MAX_FILE_BYTES, DDP_ERR_FORMAT, "timeline: %s is over 4 GiB", path);
        char *bigger = realloc(buf, 2 * cap + 1);
        if (!bigger)
            free(buf);
        buf = bigger;
        cap *= 2;
    }
    DDP_FAIL_OUT(ferror(f), DDP_ERR_IO, "timeline: cannot read %s", path);
    buf[n] = '\0';
    *out = buf;
    *len = n;
    buf = NULL;
out:
    free(buf);
    fclose(f);
    return rc;
}

int ddp__timeline_load(const char *path, ddp__json **out)
{
    char *text = NULL;
    size_t len = 0;
    *out = NULL;
    DDP_TRY(slurp(path, &text, &len));
    int rc = ddp__json_parse(text, len, out);
    free(text);
    if (rc < 0)
        return ddp__error_context(rc, "timeline: %s", path);
    const ddp__json *ev = ddp__json_get(*out, "traceEvents");
    if (!ev || ev->type != DDP_JSON_ARRAY) {
        ddp__json_free(*out);
        *out = NULL;
        return DDP_ERROR(DDP_ERR_FORMAT, "timeline: %s is not a trace (no \"traceEvents\" array)",
                         path);
    }
    return 0;
}

/* Appends path's events to f (a comma before each but the very first),
 * and to meta an entry naming the file, with its otherData. */
static int copy_events(FILE *f, FILE *meta, const char *path, int *first)
{
    ddp__json *tree;
    DDP_TRY(ddp__timeline_load(path, &tree));
    const ddp__json *ev = ddp__json_get(tree, "traceEvents");
    const ddp__json *other = ddp__json_get(tree, "otherData");
    for (const ddp__json *e = ev->child; e; e = e->next) {
        fputs(*first ? "\n" : ",\n", f);
        *first = 0;
        put_value(f, e);
    }
    fputs(ftell(meta) > 0 ? ",{\"file\":" : "{\"file\":", meta);
    ddp__tl_put_string(meta, path);
    if (other) {
        fputs(",\"otherData\":", meta);
        put_value(meta, other);
    }
    fputc('}', meta);
    ddp__json_free(tree);
    return 0;
}

int ddp__timeline_merge(const char *const *paths, int n, const char *out)
{
    char tmp[4200], *mbuf = NULL;
    size_t mlen = 0;
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", out, (int)getpid());
    FILE *meta = open_memstream(&mbuf, &mlen);
    if (!meta)
        return DDP_ERROR(DDP_ERR_NOMEM, "timeline: out of memory");
    FILE *f = fopen(tmp, "w");
    int rc = 0, first = 1;
    DDP_FAIL_OUT(!f, DDP_ERR_IO, "timeline: cannot write %s: %s", tmp, strerror(errno));
    fputs("{\"traceEvents\":[", f);
    for (int i = 0; i < n; i++)
        DDP_TRY_OUT(copy_events(f, meta, paths[i], &first));
    fflush(meta);
    fprintf(f, "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"merged\":[%s]}}\n", mbuf);
    int err = ferror(f) ? EIO : 0;
    if (fclose(f) != 0 && !err)
        err = errno;
    f = NULL;
    DDP_FAIL_OUT(err, DDP_ERR_IO, "timeline: cannot write %s: %s", tmp, strerror(err));
    if (rename(tmp, out) < 0)
        rc = DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "timeline: cannot rename %s to %s", tmp, out);
out:
    if (f)
        fclose(f);
    if (rc < 0)
        unlink(tmp);
    fclose(meta);
    free(mbuf);
    return rc;
}

/* R of "timeline-rank<R>.json", or -1. */
static int rank_of(const char *name)
{
    const char *p = name + strlen("timeline-rank");
    if (strncmp(name, "timeline-rank", strlen("timeline-rank")) != 0 || *p < '0' || *p > '9')
        return -1;
    char *end;
    long r = strtol(p, &end, 10);
    return strcmp(end, ".json") == 0 && r < 1 << 30 ? (int)r : -1;
}

typedef struct {
    int rank;
    char *path;
} rank_file;

static int by_rank(const void *a, const void *b)
{
    return ((const rank_file *)a)->rank - ((const rank_file *)b)->rank;
}

int ddp__timeline_merge_dir(const char *dir, const char *out, int *nranks)
{
    DIR *d = opendir(dir);
    if (!d)
        return DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "timeline: cannot open folder %s", dir);
    rank_file *files = NULL;
    const char **paths = NULL;
    int n = 0, cap = 0, rc = 0;
    char merged[4200];
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int r = rank_of(e->d_name);
        if (r < 0)
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            rank_file *more = realloc(files, (size_t)cap * sizeof *files);
            DDP_FAIL_OUT(!more, DDP_ERR_NOMEM, "timeline: out of memory");
            files = more;
        }
        files[n].rank = r;
        DDP_FAIL_OUT(asprintf(&files[n].path, "%s/%s", dir, e->d_name) < 0, DDP_ERR_NOMEM,
                     "timeline: out of memory");
        n++;
    }
    DDP_FAIL_OUT(n == 0, DDP_ERR_NOT_FOUND, "timeline: no timeline-rank<R>.json in %s", dir);
    qsort(files, (size_t)n, sizeof *files, by_rank);
    paths = malloc((size_t)n * sizeof *paths);
    DDP_FAIL_OUT(!paths, DDP_ERR_NOMEM, "timeline: out of memory");
    for (int i = 0; i < n; i++)
        paths[i] = files[i].path;
    snprintf(merged, sizeof merged, "%s/timeline.json", dir);
    DDP_TRY_OUT(ddp__timeline_merge(paths, n, out ? out : merged));
    if (nranks)
        *nranks = n;
out:
    closedir(d);
    for (int i = 0; i < n; i++)
        free(files[i].path);
    free(files);
    free(paths);
    return rc;
}

int ddp__timeline_merge_env(void)
{
    const char *dir = NULL;
    DDP_TRY(ddp__env_string("DDP_TIMELINE_DIR", &dir));
    return dir ? ddp__timeline_merge_dir(dir, NULL, NULL) : 0;
}
