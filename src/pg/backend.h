/* The backend registry: name -> vtable.  A backend turns a store, a rank
 * and a size into something that runs operations.  "tcp" is the TCP
 * transport with the generic algorithms of coll/; a shared-memory backend
 * would pair its own transport with the same algorithms, and an MPI backend
 * would implement run() with MPI calls. */
#ifndef DDP_PG_BACKEND_H
#define DDP_PG_BACKEND_H

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
    /* Backends whose launcher fixes rank and size (mpi); NULL for the
     * store-based ones.  Checks the caller's rank and size (< 0: take the
     * launcher's) and fills *rank, *size; ddp_init_process_group then makes
     * no store and create() gets store NULL. */
    int (*launcher_world)(int rank, int size, int *out_rank, int *out_size);
    /* A subgroup from the parent's state: this process is ranks[me] of the
     * n parent ranks listed.  NULL: create() over the store, sub-prefix. */
    int (*create_sub)(void *parent, const int *ranks, int n, int me, double timeout_s,
                      void **impl);
    /* Symmetric memory (ddp_pg_symmetric_alloc), run by the executor; may
     * be NULL.  Collective: bytes on every rank, seq and seq + 1 numbering
     * its two exchanges.  *out NULL (and 0) when this group cannot share
     * memory: the caller then allocates private memory. */
    int (*sym_alloc)(void *impl, size_t bytes, uint64_t seq, double deadline, void **out);
    /* Local: frees p when it is this group's symmetric memory (1), else 0. */
    int (*sym_free)(void *impl, void *p);
} ddp__backend;

/* The MPI backend (backend_mpi.c), compiled when the build found MPI
 * (DDP_HAVE_MPI). */
extern const ddp__backend ddp__backend_mpi;

/* The hierarchical state of a group of a transport-backed backend (tests),
 * or NULL for flat groups and other backends. */
struct ddp__hier;
const struct ddp__hier *ddp__backend_hier(const ddp__backend *be, void *impl);

/* The backend called name, or NULL with the error set (listing the known). */
const ddp__backend *ddp__backend_find(const char *name);

#endif
