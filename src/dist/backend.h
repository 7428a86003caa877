/* The backend registry: name -> vtable.  A backend turns a store, a rank
 * and a size into something that runs operations.  "tcp" is the TCP
 * transport with the generic algorithms of coll/; a shared-memory backend
 * would pair its own transport with the same algorithms, and an MPI backend
 * would implement run() with MPI calls. */
#ifndef DDP_DIST_BACKEND_H
#define DDP_DIST_BACKEND_H

#include "coll/coll.h"
#include "ddp/store.h"

typedef struct ddp__backend {
    const char *name;
    /* Joins rank of size through store (keys under prefix), at most
     * timeout_s.  *impl is the backend's state. */
    int (*create)(ddp_store_t *store, const char *prefix, int rank, int size, double timeout_s,
                  void **impl);
    /* Runs one operation to completion on the calling thread.  Called by
     * one thread at a time.  seq numbers collectives; deadline bounds it. */
    int (*run)(void *impl, const ddp__coll_args *op, uint64_t seq, double deadline);
    /* After a failure: drop everything in flight (peers see the failure). */
    void (*abort)(void *impl, int code, const char *why);
    void (*destroy)(void *impl);
    /* Tuning while idle (tests, tools); may be NULL. */
    int (*set_option)(void *impl, const char *key, const char *value);
    /* The transport, for transport-backed backends (tests); may be NULL. */
    struct ddp__tp *(*transport)(void *impl);
} ddp__backend;

/* The backend called name, or NULL with the error set (listing the known). */
const ddp__backend *ddp__backend_find(const char *name);

#endif
