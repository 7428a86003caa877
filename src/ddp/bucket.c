/* Bucket assignment and readiness tracking; see bucket.h.  The assignment
 * follows PyTorch's Reducer (compute_bucket_assignment_by_size): walk the
 * parameters in fill order, close the bucket once it holds >= its cap. */
#include "ddp/bucket.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"

void ddp__bucket_layout_free(ddp__bucket_layout *l)
{
    if (!l)
        return;
    free(l->bucket_of);
    free(l->offset);
    free(l->bucket_start);
    free(l->bucket_numel);
    free(l->bucket_nparams);
    memset(l, 0, sizeof *l);
}

static int check_order(const int *order, int nparams)
{
    unsigned char *seen = calloc((size_t)nparams + 1, 1);
    DDP_FAIL_IF(!seen, DDP_ERR_NOMEM, "bucket order: out of memory");
    int rc = 0;
    for (int i = 0; i < nparams && rc == 0; i++) {
        if (order[i] < 0 || order[i] >= nparams || seen[order[i]])
            rc = DDP_ERROR(DDP_ERR_INVALID_ARG,
                           "bucket order is not a permutation of %d parameters (entry %d = %d)",
                           nparams, i, order[i]);
        else
            seen[order[i]] = 1;
    }
    free(seen);
    return rc;
}

int ddp__bucket_layout_build(const size_t *numel, int nparams, const int *order,
                             size_t first_cap, size_t cap, size_t elem_size,
                             ddp__bucket_layout *out)
{
    int rc = 0;
    memset(out, 0, sizeof *out);
    DDP_FAIL_IF(nparams < 0 || elem_size == 0, DDP_ERR_INVALID_ARG,
                "bucket layout: bad sizes (%d parameters, element size %zu)", nparams,
                elem_size);
    DDP_TRY(check_order(order, nparams));
    size_t np = (size_t)nparams, nb_max = np ? np : 1;
    out->nparams = nparams;
    out->bucket_of = calloc(nb_max, sizeof *out->bucket_of);
    out->offset = calloc(nb_max, sizeof *out->offset);
    out->bucket_start = calloc(nb_max, sizeof *out->bucket_start);
    out->bucket_numel = calloc(nb_max, sizeof *out->bucket_numel);
    out->bucket_nparams = calloc(nb_max, sizeof *out->bucket_nparams);
    DDP_FAIL_OUT(!out->bucket_of || !out->offset || !out->bucket_start || !out->bucket_numel ||
                     !out->bucket_nparams,
                 DDP_ERR_NOMEM, "bucket layout for %d parameters: out of memory", nparams);
    size_t pos = 0;
    int b = 0;
    for (int i = 0; i < nparams; i++) {
        int p = order[i];
        if (out->bucket_nparams[b] == 0)
            out->bucket_start[b] = pos;
        out->bucket_of[p] = b;
        out->offset[p] = pos;
        out->bucket_numel[b] += numel[p];
        out->bucket_nparams[b]++;
        pos += numel[p];
        size_t limit = b == 0 ? first_cap : cap;
        if (out->bucket_numel[b] * elem_size >= limit && i + 1 < nparams)
            b++;
    }
    out->nbuckets = nparams ? b + 1 : 0;
    out->total_numel = pos;
out:
    if (rc < 0)
        ddp__bucket_layout_free(out);
    return rc;
}

int ddp__bucket_tracker_init(ddp__bucket_tracker *t, const ddp__bucket_layout *l)
{
    memset(t, 0, sizeof *t);
    t->layout = l;
    t->pending = calloc((size_t)l->nbuckets + 1, sizeof *t->pending);
    t->ready = calloc((size_t)l->nparams + 1, 1);
    if (!t->pending || !t->ready) {
        ddp__bucket_tracker_free(t);
        return DDP_ERROR(DDP_ERR_NOMEM, "bucket tracker: out of memory");
    }
    ddp__bucket_tracker_reset(t);
    return 0;
}

void ddp__bucket_tracker_reset(ddp__bucket_tracker *t)
{
    const ddp__bucket_layout *l = t->layout;
    memcpy(t->pending, l->bucket_nparams, (size_t)l->nbuckets * sizeof *t->pending);
    memset(t->ready, 0, (size_t)l->nparams);
    t->next_launch = 0;
}

void ddp__bucket_tracker_free(ddp__bucket_tracker *t)
{
    free(t->pending);
    free(t->ready);
    memset(t, 0, sizeof *t);
}

int ddp__bucket_tracker_mark(ddp__bucket_tracker *t, int p, int *first)
{
    const ddp__bucket_layout *l = t->layout;
    DDP_FAIL_IF(p < 0 || p >= l->nparams, DDP_ERR_INVALID_ARG,
                "parameter index %d out of range (%d parameters)", p, l->nparams);
    DDP_FAIL_IF(t->ready[p], DDP_ERR_STATE,
                "parameter %d was marked ready twice in one iteration", p);
    t->ready[p] = 1;
    t->pending[l->bucket_of[p]]--;
    *first = t->next_launch;
    while (t->next_launch < l->nbuckets && t->pending[t->next_launch] == 0)
        t->next_launch++;
    return t->next_launch - *first;
}
