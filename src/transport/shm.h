/* The shared-memory transport: ranks of one host talk through a POSIX
 * shared-memory segment instead of sockets (docs/shm.md).
 *
 * One segment per group, created by rank 0 under a random name published in
 * the store and unlinked as soon as every rank has mapped it: a kill -9 of
 * any rank afterwards leaves nothing in /dev/shm.  Per ordered pair of ranks
 * a single-producer single-consumer byte ring carries framed messages; large
 * messages travel by cross-memory attach (process_vm_readv: the receiver
 * copies straight from the sender's buffer) when the kernel allows it.
 *
 * Waiting spins briefly, then yields, then sleeps on a futex in the segment
 * (a producer wakes a sleeping consumer); peers are watched through pidfds,
 * so a dead rank is reported by name ("rank 1 (pid 1234) died") within
 * milliseconds.
 *
 * Selection (select.h, ddp__transport_layout): every rank publishes its
 * host identity (DDP_HOST_ID, else host name + kernel boot id) and its
 * DDP_TRANSPORT (auto|tcp|shm); the group uses shm when all ranks share a
 * host and none asks for tcp (and shm inside each host of a hierarchical
 * group). */
#ifndef DDP_TRANSPORT_SHM_H
#define DDP_TRANSPORT_SHM_H

#include <stddef.h>

#include "ddp/store.h"
#include "transport/transport.h"

/* Joins rank of size through store (keys under prefix), at most timeout_s.
 * Caller destroys *out with ddp__tp_destroy. */
int ddp__shm_create(ddp_store_t *store, const char *prefix, int rank, int size,
                    double timeout_s, ddp__tp **out);


/* Tests: the name the segment had ("/ddp-<pid>-<hex>"; unlinked once every
 * rank attached), NULL when tp is not a shm transport. */
const char *ddp__shm_debug_name(ddp__tp *tp);

#endif
