/* A model's state dict in safetensors files: parameters (F32) and buffers
 * (F32, or I64 for num_batches_tracked, as torch writes them) under
 * PyTorch's state_dict names, in PyTorch's order (module.h).  A file that
 * torch's safetensors.torch.save_file(model.state_dict()) wrote for the same
 * module loads here, and the other way round. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "nn/module.h"
#include "nn/safetensors.h"

int ddp__st_state_dict(ddp_model_t *m, ddp__st_out **out, size_t *n)
{
    const ddp__sd_item *sd;
    size_t nsd;
    DDP_TRY(ddp__model_state_dict(m, &sd, &nsd));
    ddp__st_out *t = calloc(nsd + 1, sizeof *t);
    DDP_FAIL_IF(!t, DDP_ERR_NOMEM, "state dict: out of memory");
    for (size_t i = 0; i < nsd; i++) {
        if (sd[i].param)
            t[i] = (ddp__st_out){sd[i].name, sd[i].param->ndim, sd[i].param->shape,
                                 sd[i].param->data, DDP_FLOAT32};
        else
            t[i] = (ddp__st_out){sd[i].name, sd[i].buffer->ndim, sd[i].buffer->shape,
                                 sd[i].buffer->data, sd[i].buffer->dtype};
    }
    *out = t;
    *n = nsd;
    return 0;
}

int ddp__st_entry_fits(const ddp__st_entry *e, ddp_dtype dtype, int ndim, const int64_t *shape,
                       char *why, size_t len)
{
    const char *want = dtype == DDP_INT64 ? "I64" : "F32";
    if (!e) {
        snprintf(why, len, "missing");
        return 0;
    }
    if (strcmp(e->dtype, want) != 0) {
        snprintf(why, len, "dtype %s in file, %s in model", e->dtype, want);
        return 0;
    }
    int same = e->ndim == ndim;
    for (int d = 0; same && d < ndim; d++)
        same = e->shape[d] == shape[d];
    if (!same) {
        char a[DDP_ST_MAX_DIM * 22 + 4], b[DDP_ST_MAX_DIM * 22 + 4];
        ddp__st_shape_str(a, sizeof a, e->ndim, e->shape);
        ddp__st_shape_str(b, sizeof b, ndim, shape);
        snprintf(why, len, "shape %s in file, %s in model", a, b);
        return 0;
    }
    return 1;
}

int ddp_model_save_safetensors(ddp_model_t *m, const char *path)
{
    DDP_FAIL_IF(!m || !path, DDP_ERR_INVALID_ARG, "save: NULL model or path");
    ddp__st_out *t;
    size_t n;
    DDP_TRY(ddp__st_state_dict(m, &t, &n));
    int rc = ddp__st_write(path, t, n, NULL, 0);
    free(t);
    return rc;
}

/* Appends "; "-separated differences to a fixed buffer (cut with "..."). */
typedef struct diffs {
    char s[2048];
    size_t len;
    int n;
} diffs;

__attribute__((format(printf, 2, 3))) static void diff_add(diffs *d, const char *fmt, ...)
{
    char one[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(one, sizeof one, fmt, ap);
    va_end(ap);
    if (d->len < sizeof d->s - 4) {
        int k = snprintf(d->s + d->len, sizeof d->s - d->len, "%s%s", d->n ? "; " : "", one);
        d->len = k < 0 || (size_t)k >= sizeof d->s - d->len ? sizeof d->s - 1 : d->len + (size_t)k;
        if (d->len == sizeof d->s - 1)
            memcpy(d->s + sizeof d->s - 4, "...", 4);
    }
    d->n++;
}

int ddp_model_load_safetensors(ddp_model_t *m, const char *path)
{
    DDP_FAIL_IF(!m || !path, DDP_ERR_INVALID_ARG, "load: NULL model or path");
    ddp__st_out *t;
    size_t n;
    DDP_TRY(ddp__st_state_dict(m, &t, &n));
    ddp__st_file f;
    int rc = ddp__st_read(path, &f);
    if (rc < 0) {
        free(t);
        return rc;
    }
    diffs d = {.len = 0};
    char why[256];
    for (size_t i = 0; i < n; i++)
        if (!ddp__st_entry_fits(ddp__st_find(&f, t[i].name), t[i].dtype, t[i].ndim, t[i].shape,
                                why, sizeof why))
        {
            if (strcmp(why, "missing") == 0)
                diff_add(&d, "missing %s", t[i].name);
            else
                diff_add(&d, "%s: %s", t[i].name, why);
        }
    for (size_t i = 0; i < f.n; i++) {
        int known = 0;
        for (size_t j = 0; j < n && !known; j++)
            known = strcmp(t[j].name, f.entries[i].name) == 0;
        if (!known)
            diff_add(&d, "unexpected %s", f.entries[i].name);
    }
    if (d.n) {
        rc = DDP_ERROR(DDP_ERR_MISMATCH, "load %s: %d difference%s with the model: %s", path, d.n,
                       d.n > 1 ? "s" : "", d.s);
    } else {
        /* Checked above: every entry exists with the model's dtype and size. */
        for (size_t i = 0; i < n; i++) {
            const ddp__st_entry *e = ddp__st_find(&f, t[i].name);
            memcpy((void *)t[i].data, f.data + e->begin, e->end - e->begin); /* the model's */
        }
        ddp_model_bump_param_version(m);
    }
    free(t);
    ddp__st_close(&f);
    return rc;
}
