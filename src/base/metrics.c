/* The metrics file of include/ddp/progress.h: JSON Lines, one record per
 * line, flushed as written so that a run that dies keeps what it logged
 * and a reader (tools/ddp-plot) can follow a run in progress.  Names are
 * restricted to [A-Za-z0-9_] so that they never need escaping, and values
 * that JSON cannot hold (nan, inf) are written as null: every line is one
 * that base/json.c, a strict parser, accepts. */
#include "ddp/progress.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

#define NAME_MAX_LEN 63

struct ddp_metrics {
    FILE *f;
    double t0;
    char *path;
};

int ddp_metrics_create(const char *path, int append, ddp_metrics_t **out)
{
    DDP_FAIL_IF(!out, DDP_ERR_INVALID_ARG, "metrics: out is NULL");
    *out = NULL;
    DDP_FAIL_IF(!path || !*path, DDP_ERR_INVALID_ARG, "metrics: no file name");
    ddp_metrics_t *m = calloc(1, sizeof *m);
    DDP_FAIL_IF(!m, DDP_ERR_NOMEM, "metrics: out of memory");
    m->path = strdup(path);
    if (!m->path) {
        free(m);
        return DDP_ERROR(DDP_ERR_NOMEM, "metrics: out of memory");
    }
    m->f = fopen(path, append ? "a" : "w");
    if (!m->f) {
        int err = errno;
        free(m->path);
        free(m);
        return DDP_ERROR_ERRNO(DDP_ERR_IO, err, "metrics file %s", path);
    }
    m->t0 = ddp_time_now();
    *out = m;
    return 0;
}

void ddp_metrics_destroy(ddp_metrics_t *m)
{
    if (!m)
        return;
    fclose(m->f);
    free(m->path);
    free(m);
}

static int valid_name(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > NAME_MAX_LEN)
        return 0;
    return strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") == n;
}

/* The record's names: valid, distinct, not one of the two it adds. */
static int check_names(const char *kind, const ddp_metric *fields, size_t n)
{
    DDP_FAIL_IF(!valid_name(kind), DDP_ERR_INVALID_ARG,
                "metrics: kind '%s' is not 1 to %d letters, digits or '_'", kind ? kind : "(null)",
                NAME_MAX_LEN);
    DDP_FAIL_IF(n > 0 && !fields, DDP_ERR_INVALID_ARG, "metrics: %zu fields but NULL", n);
    for (size_t i = 0; i < n; i++) {
        const char *name = fields[i].name;
        DDP_FAIL_IF(!valid_name(name), DDP_ERR_INVALID_ARG,
                    "metrics: field %zu's name '%s' is not 1 to %d letters, digits or '_'", i,
                    name ? name : "(null)", NAME_MAX_LEN);
        DDP_FAIL_IF(!strcmp(name, "kind") || !strcmp(name, "wall_s"), DDP_ERR_INVALID_ARG,
                    "metrics: field name '%s' is the record's own", name);
        for (size_t k = 0; k < i; k++)
            DDP_FAIL_IF(!strcmp(fields[k].name, name), DDP_ERR_INVALID_ARG,
                        "metrics: field '%s' given twice", name);
    }
    return 0;
}

/* Integers exactly (to 2^53), other numbers to 9 significant digits (a
 * float's round trip; a double's wall time to the microsecond over 1000 s). */
static void put_number(FILE *f, double v)
{
    if (!isfinite(v))
        fputs("null", f);
    else if (v == floor(v) && fabs(v) < 9007199254740992.0)
        fprintf(f, "%.0f", v);
    else
        fprintf(f, "%.9g", v);
}

int ddp_metrics_write(ddp_metrics_t *m, const char *kind, const ddp_metric *fields, size_t n)
{
    DDP_FAIL_IF(!m, DDP_ERR_INVALID_ARG, "metrics: NULL file");
    DDP_TRY(check_names(kind, fields, n));
    fprintf(m->f, "{\"kind\":\"%s\",\"wall_s\":", kind);
    put_number(m->f, ddp_time_now() - m->t0);
    for (size_t i = 0; i < n; i++) {
        fprintf(m->f, ",\"%s\":", fields[i].name);
        put_number(m->f, fields[i].value);
    }
    fputs("}\n", m->f);
    if (fflush(m->f) != 0 || ferror(m->f)) {
        int err = errno;
        clearerr(m->f);
        return DDP_ERROR_ERRNO(DDP_ERR_IO, err, "metrics file %s: write", m->path);
    }
    return 0;
}
