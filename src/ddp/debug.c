/* DDP under DDP_DEBUG (src/pg/debug.c has the levels): at info, the bucket
 * layout once the wrapper is made; at detail, after each synchronising
 * backward, this rank's parameters that received no gradient and the order
 * in which its buckets became ready (PyTorch's TORCH_DISTRIBUTED_DEBUG=
 * DETAIL reports the same), logged whenever they differ from the previous
 * iteration's, so that a model whose graph changes from step to step shows
 * it, and one that does not prints once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "ddp/reducer_impl.h"
#include "pg/internal.h"

#define REPORT_LEN 2048

void ddp__reducer_debug_layout(const ddp_reducer_t *r)
{
    if (ddp__pg_debug_level(r->pg) < 1)
        return;
    const ddp__bucket_layout *l = &r->layout;
    char buf[REPORT_LEN];
    size_t at = 0;
    for (int b = 0; b < l->nbuckets && at < sizeof buf; b++)
        at += (size_t)snprintf(buf + at, sizeof buf - at, "%s%d: %d params, %.2f MiB",
                               b ? "; " : "", b, l->bucket_nparams[b],
                               (double)l->bucket_numel[b] * 4 / DDP_MIB);
    ddp__log(DDP_LOG_INFO, "DDP_DEBUG: %s rank %d: %d %ss in %d buckets: %s", r->who,
             ddp_pg_rank(r->pg), r->nregions, r->noun, l->nbuckets, buf);
}

/* This iteration's report into buf: unused parameters, bucket ready order. */
static void report(const ddp_reducer_t *r, int *pos, int *buckets, char *buf, size_t len)
{
    const ddp__bucket_layout *l = &r->layout;
    for (int p = 0; p < r->nregions; p++)
        pos[p] = -1;
    for (int i = 0; i < r->nready; i++)
        pos[r->ready_order[i]] = i;
    size_t at = (size_t)snprintf(buf, len, "unused %ss:", r->noun);
    int unused = 0;
    for (int p = 0; p < r->nregions && at < len; p++)
        if (pos[p] < 0)
            at += (size_t)snprintf(buf + at, len - at, "%s %s", unused++ ? "," : "",
                                   r->names[p]);
    if (!unused && at < len)
        at += (size_t)snprintf(buf + at, len - at, " none");
    /* A bucket is ready at its last parameter's gradient (unused: at the
     * end of backward); insertion sort by that moment, ties by index. */
    int *when = buckets + l->nbuckets;
    for (int b = 0; b < l->nbuckets; b++)
        when[b] = -1;
    for (int p = 0; p < r->nregions; p++) {
        int t = pos[p] < 0 ? r->nregions : pos[p], b = l->bucket_of[p];
        when[b] = t > when[b] ? t : when[b];
    }
    for (int b = 0; b < l->nbuckets; b++) {
        int j = b;
        for (; j > 0 && when[buckets[j - 1]] > when[b]; j--)
            buckets[j] = buckets[j - 1];
        buckets[j] = b;
    }
    if (at < len)
        at += (size_t)snprintf(buf + at, len - at, "; buckets ready in order");
    for (int i = 0; i < l->nbuckets && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s %d", i ? "," : "", buckets[i]);
}

void ddp__reducer_debug_iteration(ddp_reducer_t *r)
{
    if (ddp__pg_debug_level(r->pg) < 2)
        return;
    r->debug_iter++;
    int *pos = malloc(((size_t)r->nregions + 2 * (size_t)r->layout.nbuckets + 1) * sizeof *pos);
    char *buf = malloc(REPORT_LEN);
    if (!pos || !buf) {
        free(pos);
        free(buf);
        return; /* a report, not worth failing the step for */
    }
    report(r, pos, pos + r->nregions, buf, REPORT_LEN);
    if (!r->debug_last || strcmp(r->debug_last, buf) != 0) {
        ddp__log(DDP_LOG_INFO, "DDP_DEBUG=detail: %s rank %d, iteration %llu: %s", r->who,
                 ddp_pg_rank(r->pg), (unsigned long long)r->debug_iter, buf);
        free(r->debug_last);
        r->debug_last = buf;
        buf = NULL;
    }
    free(buf);
    free(pos);
}
