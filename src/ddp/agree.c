/* The reducer's cross-rank agreement check at creation (DDP's too): every
 * rank describes its options and regions (names, sizes or DDP's shapes, in
 * order) in one string,
 * all-gathers it, and any difference from rank 0 fails every rank with a
 * message naming the first one (PyTorch's _verify_param_shape_across_processes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/timeline.h"
#include "ddp/reducer_impl.h"

/* "timeline t, options|entry;entry;..." (the options line, then one
 * "name (shape)" entry per region in order).  Caller frees. */
static char *describe(const ddp_reducer_t *r, size_t *len)
{
    size_t cap = 64 + strlen(r->options_desc), n = 0;
    for (int i = 0; i < r->nregions; i++)
        cap += (r->entry_desc ? strlen(r->entry_desc[i]) : strlen(r->names[i]) + 24) + 2;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    n += (size_t)snprintf(s, cap, "timeline %d, %s|", ddp__tl_enabled(), r->options_desc);
    for (int i = 0; i < r->nregions; i++) {
        if (r->entry_desc)
            n += (size_t)snprintf(s + n, cap - n, "%s;", r->entry_desc[i]);
        else
            n += (size_t)snprintf(s + n, cap - n, "%s (%zu);", r->names[i], r->numel[i]);
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
static int report_mismatch(const ddp_reducer_t *red, int r, const char *mine0,
                           const char *theirs)
{
    char a[512], b[512];
    size_t oa = strcspn(mine0, "|"), ob = strcspn(theirs, "|");
    if (oa != ob || strncmp(mine0, theirs, oa) != 0)
        return DDP_ERROR(DDP_ERR_MISMATCH,
                         "%s: rank %d differs from rank 0: options %.*s on rank %d but %.*s on "
                         "rank 0",
                         red->who, r, (int)ob, theirs, r, (int)oa, mine0);
    mine0 += oa + (mine0[oa] == '|');
    theirs += ob + (theirs[ob] == '|');
    int n0 = count_entries(mine0), nr = count_entries(theirs);
    for (int i = 0;; i++) {
        const char *e0 = entry(mine0, i, a, sizeof a), *er = entry(theirs, i, b, sizeof b);
        if (e0 && er && strcmp(e0, er) == 0)
            continue;
        if (e0 && er)
            return DDP_ERROR(DDP_ERR_MISMATCH,
                             "%s: rank %d differs from rank 0: %s %d is %s on rank %d but %s "
                             "on rank 0",
                             red->who, r, red->noun, i, er, r, e0);
        return DDP_ERROR(DDP_ERR_MISMATCH,
                         "%s: rank %d has %d %ss, rank 0 has %d (first extra: %s on rank %d)",
                         red->who, r, nr, red->noun, n0, e0 ? e0 : er, e0 ? 0 : r);
    }
}

/* All ranks check that every rank has rank 0's options line and entries. */
int ddp__reducer_check_same(ddp_reducer_t *red)
{
    int size = ddp_pg_size(red->pg), rc = 0;
    size_t len;
    int64_t mylen, *lens = NULL;
    char *desc = describe(red, &len), *mine = NULL, *all = NULL;
    DDP_FAIL_OUT(!desc, DDP_ERR_NOMEM, "%s: out of memory", red->who);
    mylen = (int64_t)len + 1;
    lens = malloc((size_t)size * sizeof *lens);
    DDP_FAIL_OUT(!lens, DDP_ERR_NOMEM, "%s: out of memory", red->who);
    DDP_TRY_OUT(ddp_pg_all_gather(red->pg, &mylen, lens, 1, DDP_INT64));
    int64_t maxlen = 0;
    for (int r = 0; r < size; r++)
        maxlen = lens[r] > maxlen ? lens[r] : maxlen;
    mine = calloc((size_t)maxlen, 1);
    all = calloc((size_t)maxlen * (size_t)size, 1);
    DDP_FAIL_OUT(!mine || !all, DDP_ERR_NOMEM, "%s: out of memory", red->who);
    memcpy(mine, desc, len + 1);
    DDP_TRY_OUT(ddp_pg_all_gather(red->pg, mine, all, (size_t)maxlen, DDP_UINT8));
    for (int r = 1; r < size; r++) {
        char *theirs = all + (size_t)r * (size_t)maxlen;
        theirs[maxlen - 1] = '\0';
        if (strcmp(theirs, all) != 0) {
            rc = report_mismatch(red, r, all, theirs);
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
