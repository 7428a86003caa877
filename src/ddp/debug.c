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
#include "ddp/wrapper.h"
#include "pg/internal.h"

#define REPORT_LEN 2048

void ddp__dp_debug_layout(const ddp_data_parallel_t *dm)
{
    if (ddp__pg_debug_level(dm->pg) < 1)
        return;
    const ddp__bucket_layout *l = &dm->layout;
    char buf[REPORT_LEN];
    size_t at = 0;
    for (int b = 0; b < l->nbuckets && at < sizeof buf; b++)
        at += (size_t)snprintf(buf + at, sizeof buf - at, "%s%d: %d params, %.2f MiB",
                               b ? "; " : "", b, l->bucket_nparams[b],
                               (double)l->bucket_numel[b] * 4 / DDP_MIB);
    ddp__log(DDP_LOG_INFO, "DDP_DEBUG: DDP rank %d: %d parameters in %d buckets: %s",
             ddp_pg_rank(dm->pg), dm->nparams, l->nbuckets, buf);
}

/* This iteration's report into buf: unused parameters, bucket ready order. */
static void report(const ddp_data_parallel_t *dm, int *pos, int *buckets, char *buf, size_t len)
{
    const ddp__bucket_layout *l = &dm->layout;
    for (int p = 0; p < dm->nparams; p++)
        pos[p] = -1;
    for (int i = 0; i < dm->nready; i++)
        pos[dm->ready_order[i]] = i;
    size_t at = (size_t)snprintf(buf, len, "unused parameters:");
    int unused = 0;
    for (int p = 0; p < dm->nparams && at < len; p++)
        if (pos[p] < 0)
            at += (size_t)snprintf(buf + at, len - at, "%s %s", unused++ ? "," : "",
                                   dm->params[p]->name);
    if (!unused && at < len)
        at += (size_t)snprintf(buf + at, len - at, " none");
    /* A bucket is ready at its last parameter's gradient (unused: at the
     * end of backward); insertion sort by that moment, ties by index. */
    int *when = buckets + l->nbuckets;
    for (int b = 0; b < l->nbuckets; b++)
        when[b] = -1;
    for (int p = 0; p < dm->nparams; p++) {
        int t = pos[p] < 0 ? dm->nparams : pos[p], b = l->bucket_of[p];
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

void ddp__dp_debug_iteration(ddp_data_parallel_t *dm)
{
    if (ddp__pg_debug_level(dm->pg) < 2)
        return;
    dm->debug_iter++;
    int *pos = malloc(((size_t)dm->nparams + 2 * (size_t)dm->layout.nbuckets + 1) * sizeof *pos);
    char *buf = malloc(REPORT_LEN);
    if (!pos || !buf) {
        free(pos);
        free(buf);
        return; /* a report, not worth failing the step for */
    }
    report(dm, pos, pos + dm->nparams, buf, REPORT_LEN);
    if (!dm->debug_last || strcmp(dm->debug_last, buf) != 0) {
        ddp__log(DDP_LOG_INFO, "DDP_DEBUG=detail: DDP rank %d, iteration %llu: %s",
                 ddp_pg_rank(dm->pg), (unsigned long long)dm->debug_iter, buf);
        free(dm->debug_last);
        dm->debug_last = buf;
        buf = NULL;
    }
    free(buf);
    free(pos);
}
