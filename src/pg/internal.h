/* Internal hooks of the process-group layer for tests and tools. */
#ifndef DDP_PG_INTERNAL_H
#define DDP_PG_INTERNAL_H

#include "ddp/pg.h"

/* Sets a backend option while the group is idle: "allreduce_algo"
 * (auto|ring|rd|direct), "chunk_bytes".  DDP_ERR_UNSUPPORTED if unknown. */
int ddp__pg_set_option(ddp_pg_t *pg, const char *key, const char *value);
/* The transport of a transport-backed group (tests inject bad frames). */
struct ddp__tp *ddp__pg_transport(ddp_pg_t *pg);

/* The hierarchical state of a group (coll/hier.h: layout, per-kind counts
 * of operations run hierarchically), NULL when the group runs flat. */
const struct ddp__hier *ddp__pg_hier(ddp_pg_t *pg);

#endif
