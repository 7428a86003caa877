/* DDP's cross-rank agreement check at creation: every rank describes its
 * options and parameters (names, shapes, registration order) in one string,
 * all-gathers it, and any difference from rank 0 fails every rank with a
 * message naming the first one (PyTorch's _verify_param_shape_across_processes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/timeline.h"
#include "ddp/wrapper.h"

/* "options|name (d0, d1);name (d0);..." (options, then parameters in
 * registration order).  Caller frees. */
static char *describe_params(ddp_data_parallel_t *dm, size_t *len)
{
    size_t cap = 256, n = 0;
    for (int i = 0; i < dm->nparams; i++)
        cap += strlen(dm->params[i]->name) + 16 + 24 * DDP_TENSOR_MAX_DIM;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    const ddp_data_parallel_options *o = &dm->opts;
    n += (size_t)snprintf(s, cap,
                          "timeline %d, bucket_cap_mb %g, first_bucket_cap_mb %g, "
                          "find_unused_parameters %d, rebuild_buckets %d, comm_hook %d, "
                          "tail_chunks %d, tail_min_piece_mb %g|",
                          ddp__tl_enabled(), o->bucket_cap_mb, o->first_bucket_cap_mb,
                          o->find_unused_parameters, o->rebuild_buckets, (int)o->comm_hook,
                          o->tail_chunks, o->tail_min_piece_mb);
    for (int i = 0; i < dm->nparams; i++) {
        char shape[128];
        ddp_tensor t = {.ndim = dm->params[i]->ndim};
        memcpy(t.shape, dm->params[i]->shape, sizeof t.shape);
        ddp_tensor_shape_str(&t, shape, sizeof shape);
        n += (size_t)snprintf(s + n, cap - n, "%s %s;", dm->params[i]->name, shape);
    }
    s[n] = '\0';
    *len = n;
    return s;
}

/* The i-th "name (shape)" entry of a description, or NULL past the end. */
static const char *entry(const char *desc, int i, char *buf, size_t len)
{
    for (; i > 0 && desc; i--) {
        desc = strchr(desc, ';');
        desc = desc ? desc + 1 : NULL;
    }
    if (!desc || !*desc)
        return NULL;
    size_t n = strcspn(desc, ";");
    snprintf(buf, len, "%.*s", (int)n, desc);
    return buf;
}

static int count_entries(const char *desc)
{
    int n = 0;
    for (; *desc; desc++)
        n += *desc == ';';
    return n;
}

/* Fails with a readable difference between rank r's description and rank 0's. */
static int report_mismatch(int r, const char *mine0, const char *theirs)
{
    char a[512], b[512];
    size_t oa = strcspn(mine0, "|"), ob = strcspn(theirs, "|");
    if (oa != ob || strncmp(mine0, theirs, oa) != 0)
        return DDP_ERROR(DDP_ERR_MISMATCH,
                         "DDP: rank %d differs from rank 0: options %.*s on rank %d but %.*s on "
                         "rank 0",
                         r, (int)ob, theirs, r, (int)oa, mine0);
    mine0 += oa + (mine0[oa] == '|');
    theirs += ob + (theirs[ob] == '|');
    int n0 = count_entries(mine0), nr = count_entries(theirs);
    for (int i = 0;; i++) {
        const char *e0 = entry(mine0, i, a, sizeof a), *er = entry(theirs, i, b, sizeof b);
        if (e0 && er && strcmp(e0, er) == 0)
            continue;
        if (e0 && er)
            return DDP_ERROR(DDP_ERR_MISMATCH,
                             "DDP: rank %d differs from rank 0: parameter %d is %s on rank %d "
                             "but %s on rank 0",
                             r, i, er, r, e0);
        return DDP_ERROR(DDP_ERR_MISMATCH,
                         "DDP: rank %d has %d parameters, rank 0 has %d (first extra: %s on "
                         "rank %d)",
                         r, nr, n0, e0 ? e0 : er, e0 ? 0 : r);
    }
}

/* All ranks check that every rank has rank 0's parameter names and shapes. */
int ddp__dp_check_same_params(ddp_data_parallel_t *dm)
{
    int size = ddp_pg_size(dm->pg), rc = 0;
    size_t len;
    int64_t mylen, *lens = NULL;
    char *desc = describe_params(dm, &len), *mine = NULL, *all = NULL;
    DDP_FAIL_OUT(!desc, DDP_ERR_NOMEM, "DDP: out of memory");
    mylen = (int64_t)len + 1;
    lens = malloc((size_t)size * sizeof *lens);
    DDP_FAIL_OUT(!lens, DDP_ERR_NOMEM, "DDP: out of memory");
    DDP_TRY_OUT(ddp_pg_all_gather(dm->pg, &mylen, lens, 1, DDP_INT64));
    int64_t maxlen = 0;
    for (int r = 0; r < size; r++)
        maxlen = lens[r] > maxlen ? lens[r] : maxlen;
    mine = calloc((size_t)maxlen, 1);
    all = calloc((size_t)maxlen * (size_t)size, 1);
    DDP_FAIL_OUT(!mine || !all, DDP_ERR_NOMEM, "DDP: out of memory");
    memcpy(mine, desc, len + 1);
    DDP_TRY_OUT(ddp_pg_all_gather(dm->pg, mine, all, (size_t)maxlen, DDP_UINT8));
    for (int r = 1; r < size; r++) {
        char *theirs = all + (size_t)r * (size_t)maxlen;
        theirs[maxlen - 1] = '\0';
        if (strcmp(theirs, all) != 0) {
            rc = report_mismatch(r, all, theirs);
            break;
        }
    }
out:
    free(desc);
    free(lens);
    free(mine);
    free(all);
    return rc;
}
