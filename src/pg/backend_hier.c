/* The two levels of a hierarchical group (coll/hier.h): shared memory among
 * the ranks of each host, tcp among the leaders (each host's lowest rank).
 * The group's flat tcp transport is made by backend.c beside them.  Setup
 * order is the same on every rank, flat first, then the host, then the
 * leaders, so no rank waits for one still busy with an earlier level. */
#include "pg/backend_hier.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/error.h"
#include "base/log.h"
#include "transport/shm.h"
#include "transport/tcp.h"

static int layout_maps(ddp__hier *h, const ddp__layout *lay)
{
    const int n = h->size;
    h->host_of = malloc(sizeof *h->host_of * (size_t)n);
    h->local_index = malloc(sizeof *h->local_index * (size_t)n);
    h->leader_ranks = malloc(sizeof *h->leader_ranks * (size_t)lay->nhosts);
    h->local_ranks = malloc(sizeof *h->local_ranks * (size_t)n);
    h->host_start = calloc((size_t)lay->nhosts + 1, sizeof *h->host_start);
    DDP_FAIL_IF(!h->host_of || !h->local_index || !h->leader_ranks || !h->local_ranks ||
                    !h->host_start,
                DDP_ERR_NOMEM, "out of memory");
    h->nhosts = lay->nhosts;
    h->host = lay->host_of[h->rank];
    int *count = calloc((size_t)lay->nhosts, sizeof *count);
    DDP_FAIL_IF(!count, DDP_ERR_NOMEM, "out of memory");
    int lsize = 0;
    for (int r = 0; r < n; r++) {
        int hh = lay->host_of[r];
        h->host_of[r] = hh;
        if (count[hh] == 0)
            h->leader_ranks[hh] = r;
        h->local_index[r] = count[hh]++;
        if (hh == h->host)
            h->local_ranks[lsize++] = r;
    }
    for (int g = 0; g < lay->nhosts; g++) /* host order: hosts by index */
        h->host_start[g + 1] = h->host_start[g] + count[g];
    free(count);
    return lsize;
}

int ddp__hier_create(ddp_store_t *store, const char *prefix, int rank, int size,
                     double deadline, const ddp__layout *lay, ddp__hier **out)
{
    int rc = 0;
    char sub[300];
    *out = NULL;
    ddp__hier *h = calloc(1, sizeof *h);
    DDP_FAIL_IF(!h, DDP_ERR_NOMEM, "out of memory");
    h->rank = rank;
    h->size = size;
    int lsize;
    DDP_TRY_OUT(lsize = layout_maps(h, lay));
    const int lrank = h->local_index[rank], leader = lrank == 0;
    DDP_TRY_OUT(ddp__coll_ctx_init(&h->local, lrank, lsize));
    DDP_TRY_OUT(ddp__coll_ctx_init(&h->leaders, leader ? h->host : 0, h->nhosts));
    if (lsize > 1) {
        snprintf(sub, sizeof sub, "%.250s/host%d", prefix, h->host);
        rc = ddp__shm_create(store, sub, lrank, lsize, ddp__setup_time_left(deadline),
                             &h->local.tp);
        DDP_TRY_OUT(ddp__hier_error(rc, h->local_ranks, lsize, "hierarchical group, inside host"));
    }
    if (leader) {
        snprintf(sub, sizeof sub, "%.250s/leaders", prefix);
        rc = ddp__tcp_create(store, sub, h->host, h->nhosts, ddp__setup_time_left(deadline),
                             &h->leaders.tp);
        DDP_TRY_OUT(ddp__hier_error(rc, h->leader_ranks, h->nhosts,
                                    "hierarchical group, among host leaders"));
    }
    DDP_DEBUG("rank %d of %d: hierarchical, host %d of %d, local rank %d of %d%s", rank, size,
              h->host, h->nhosts, lrank, lsize, leader ? ", leader" : "");
    *out = h;
    h = NULL;
out:
    ddp__hier_destroy(h);
    return rc;
}

void ddp__hier_abort(ddp__hier *h, int code, const char *why)
{
    if (h->local.tp)
        ddp__tp_abort(h->local.tp, code, why);
    if (h->leaders.tp)
        ddp__tp_abort(h->leaders.tp, code, why);
}

void ddp__hier_destroy(ddp__hier *h)
{
    if (!h)
        return;
    ddp__tp_destroy(h->local.tp);
    ddp__tp_destroy(h->leaders.tp);
    ddp__coll_ctx_free(&h->local);
    ddp__coll_ctx_free(&h->leaders);
    free(h->host_of);
    free(h->local_index);
    free(h->local_ranks);
    free(h->leader_ranks);
    free(h->host_start);
    free(h);
}
