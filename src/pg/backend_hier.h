/* Setting up and tearing down the transports of a hierarchical group
 * (coll/hier.h runs the collectives on them). */
#ifndef DDP_PG_BACKEND_HIER_H
#define DDP_PG_BACKEND_HIER_H

#include "coll/hier.h"
#include "ddp/store.h"
#include "transport/select.h"

/* Seconds until deadline for one phase of a group's setup (the tcp
 * backend's and the levels here): a phase that starts late still gets a
 * moment to see that its peers are there (a zero timeout would mean "now or
 * never"). */
static inline double ddp__setup_time_left(double deadline)
{
    double left = deadline - ddp_time_now();
    return left > 0.05 ? left : 0.05;
}

/* For rank of size laid out over hosts as lay says: connects this host's
 * ranks over shm (store keys "<prefix>/host<h>") and, on leaders, the
 * leaders over tcp ("<prefix>/leaders"), at most until the absolute
 * deadline (ddp_time_now() seconds).  Caller frees *out with
 * ddp__hier_destroy. */
int ddp__hier_create(ddp_store_t *store, const char *prefix, int rank, int size,
                     double deadline, const ddp__layout *lay, ddp__hier **out);
/* After a failure: aborts both levels (peers on each learn why). */
void ddp__hier_abort(ddp__hier *h, int code, const char *why);
/* Releases both transports and the maps; NULL does nothing. */
void ddp__hier_destroy(ddp__hier *h);

#endif
