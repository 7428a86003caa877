/* Hierarchical collectives: for a group spread over several hosts, each
 * host's ranks talk over a local transport (shared memory) and one leader
 * per host (its lowest rank) talks to the other leaders over a second
 * transport (tcp).  Every collective runs in three phases (inside each
 * host, among leaders, inside each host again); point-to-point send and
 * recv run flat, on the group's own transport.  Steps, reduction
 * order and costs: docs/hierarchical.md.  The transports are made by
 * pg/backend_hier.c; this file only uses the transport interface. */
#ifndef DDP_COLL_HIER_H
#define DDP_COLL_HIER_H

#include <stdint.h>

#include "coll/coll.h"

typedef struct ddp__hier {
    int rank, size;          /* in the whole group */
    int nhosts, host;        /* hosts, and this rank's host index */
    ddp__coll_ctx local;     /* this host's ranks; local.tp NULL when alone */
    ddp__coll_ctx leaders;   /* one rank per host; leaders.tp NULL unless a leader */
    int *host_of;            /* [size] host index of each rank */
    int *local_index;        /* [size] index of each rank among its host's ranks */
    int *local_ranks;        /* [local.size] group rank of each local rank */
    int *leader_ranks;       /* [nhosts] group rank of each host's leader */
    int *host_start;         /* [nhosts + 1] first host-order position of each host
                              * (ranks sorted by host, then local index) */
    uint64_t runs[DDP__NUM_COLL]; /* operations run hierarchically, per kind */
} ddp__hier;

/* Runs one operation: every collective hierarchically, send/recv on flat
 * (the transport that connects every rank).
 * seq, deadline, the all-reduce algorithm (the leaders') and the chunk size
 * come from flat.  Errors name ranks by their group rank. */
int ddp__hier_run(ddp__hier *h, ddp__coll_ctx *flat, const ddp__coll_args *a);

/* Rewrites the rank numbers of a sub-transport's message (in ddp_last_error)
 * from its numbering to the group's (map[i] = group rank of its rank i) and
 * prepends what; returns rc.  The reason quoted after "gave up: " is left
 * alone unless it is the sub-transport's own ("rank N: ..."). */
int ddp__hier_error(int rc, const int *map, int n, const char *what);

/* What hier.c and hier_move.c share: the sub-collectives' sequence number
 * and deadline for step 0..2 of an operation, and their errors in group
 * ranks. */
void ddp__hier_step(ddp__hier *h, const ddp__coll_ctx *flat, unsigned step);
int ddp__hier_local_error(ddp__hier *h, int rc);
int ddp__hier_leaders_error(ddp__hier *h, int rc);

/* hier_move.c: B bytes (count elements) per rank block. */
int ddp__hier_all_gather(ddp__hier *h, ddp__coll_ctx *flat, const void *send, void *recv,
                         size_t B);
int ddp__hier_gather(ddp__hier *h, ddp__coll_ctx *flat, const void *send, void *recv, size_t B,
                     int root);
int ddp__hier_scatter(ddp__hier *h, ddp__coll_ctx *flat, const void *send, void *recv, size_t B,
                      int root);
int ddp__hier_all_to_all(ddp__hier *h, ddp__coll_ctx *flat, const void *send, void *recv,
                         size_t B);
int ddp__hier_reduce_scatter(ddp__hier *h, ddp__coll_ctx *flat, const void *send, void *recv,
                             size_t count, ddp_dtype dt, ddp_reduce_op op);

#endif
