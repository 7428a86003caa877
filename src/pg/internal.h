/* Internal hooks of the process-group layer for tests and tools. */
#ifndef DDP_PG_INTERNAL_H
#define DDP_PG_INTERNAL_H

#include "ddp/pg.h"

/* Sets a backend option while the group is idle: "allreduce_algo"
 * (auto|ring|rd|direct), "chunk_bytes".  DDP_ERR_UNSUPPORTED if unknown. */
int ddp__pg_set_option(ddp_pg_t *pg, const char *key, const char *value);
/* DDP_DEBUG of the group: 0 off, 1 info, 2 detail (pg/debug.c). */
int ddp__pg_debug_level(const ddp_pg_t *pg);
/* The transport of a transport-backed group (tests inject bad frames). */
struct ddp__tp *ddp__pg_transport(ddp_pg_t *pg);

/* The hierarchical state of a group (coll/hier.h: layout, per-kind counts
 * of operations run hierarchically), NULL when the group runs flat. */
const struct ddp__hier *ddp__pg_hier(ddp_pg_t *pg);

/* References on a group for the layers that wrap one (DDP): a group stays
 * whole, thread and connections included, until its creator has called
 * ddp_destroy_process_group and every holder has released it, in any
 * order; the last one tears it down.  Thread-safe. */
void ddp__pg_retain(ddp_pg_t *pg);
void ddp__pg_release(ddp_pg_t *pg);

/* Breaks the group on purpose, as a failed operation would: once its
 * queued operations are done (at most the group's timeout), the backend
 * tells the live peers why (their waits on this rank fail with "rank R:
 * why" instead of "left the group"), and later operations fail at once.
 * For a layer that fails on another group and must tell this one's peers
 * the cause (the pipeline's stages).  NULL pg: no-op. */
void ddp__pg_abort(ddp_pg_t *pg, int code, const char *why);

/* Reduce out of place (MPI_Reduce's form): every rank's input is send,
 * left unchanged; the root gets the result in recv (count elements, equal
 * to send or not overlapping it), the other ranks' recv is not used.
 * recv == send is ddp_pg_reduce_async.  For ZeRO-2's owner reductions
 * straight into the owner's shard (ddp/reducer_scatter.c). */
int ddp__pg_reduce_into_async(ddp_pg_t *pg, const void *send, void *recv, size_t count,
                              ddp_dtype dtype, ddp_reduce_op op, int root, ddp_work_t **work);

#endif
