/* Backend registry and the transport-backed backends; see backend.h. */
#include "dist/backend.h"

#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "dist/hier.h"
#include "transport/select.h"
#include "transport/shm.h"
#include "transport/tcp.h"

/* ---- transport + generic algorithms ---- */

typedef struct tp_backend {
    ddp__tp *tp;
    ddp__coll_ctx ctx;
    ddp__hier *hier; /* groups spanning hosts: shm per host + tcp leaders */
} tp_backend;

static void tp_destroy(void *impl);

/* Seconds until deadline; a phase that starts late still gets a moment to
 * see that its peers are there (a zero timeout would mean "now or never"). */
static double time_left(double deadline)
{
    double left = deadline - ddp_time_now();
    return left > 0.05 ? left : 0.05;
}

static int tcp_create(ddp_store_t *store, const char *prefix, int rank, int size,
                      double timeout_s, void **impl)
{
    tp_backend *b = calloc(1, sizeof *b);
    DDP_FAIL_IF(!b, DDP_ERR_NOMEM, "out of memory");
    /* Tuning first: a bad DDP_* value fails before anyone connects. */
    int rc = ddp__coll_ctx_init(&b->ctx, rank, size);
    /* Same host everywhere: shared memory (transport/shm.h); several hosts:
     * tcp, plus the two levels of hierarchical collectives when some host
     * holds several ranks (dist/hier.h); DDP_TRANSPORT and DDP_HIERARCHICAL
     * override. */
    ddp__layout lay = {0};
    /* One deadline for the whole setup: each phase gets what is left. */
    const double deadline = ddp_time_now() + timeout_s;
    if (rc == 0)
        rc = ddp__transport_layout(store, prefix, rank, size, time_left(deadline), &lay);
    if (rc == 0)
        rc = lay.kind == DDP__LAYOUT_SHM
                 ? ddp__shm_create(store, prefix, rank, size, time_left(deadline), &b->tp)
                 : ddp__tcp_create(store, prefix, rank, size, time_left(deadline), &b->tp);
    if (rc == 0 && lay.kind == DDP__LAYOUT_HIER)
        rc = ddp__hier_create(store, prefix, rank, size, deadline, &lay, &b->hier);
    ddp__layout_free(&lay);
    b->ctx.tp = b->tp;
    if (rc < 0) {
        tp_destroy(b);
        return rc;
    }
    *impl = b;
    return 0;
}

static int tp_run(void *impl, const ddp__coll_args *op, uint64_t seq, double deadline)
{
    tp_backend *b = impl;
    b->ctx.seq = seq;
    b->ctx.deadline = deadline;
    return b->hier ? ddp__hier_run(b->hier, &b->ctx, op) : ddp__coll_run(&b->ctx, op);
}

static void tp_abort(void *impl, int code, const char *why)
{
    tp_backend *b = impl;
    ddp__tp_abort(b->tp, code, why);
    if (b->hier)
        ddp__hier_abort(b->hier, code, why);
}

static void tp_destroy(void *impl)
{
    tp_backend *b = impl;
    if (!b)
        return;
    ddp__hier_destroy(b->hier);
    ddp__coll_ctx_free(&b->ctx);
    ddp__tp_destroy(b->tp);
    free(b);
}

static int tp_set_option(void *impl, const char *key, const char *value)
{
    tp_backend *b = impl;
    if (strcmp(key, "allreduce_algo") == 0) {
        int algo = ddp__coll_algo_parse(value);
        DDP_FAIL_IF(algo < 0, DDP_ERR_INVALID_ARG,
                    "allreduce_algo '%s': expected auto, ring, rd, direct or shared", value);
        b->ctx.allreduce_algo = algo;
        return 0;
    }
    if (strcmp(key, "chunk_bytes") == 0) {
        long long v = atoll(value);
        DDP_FAIL_IF(v <= 0, DDP_ERR_INVALID_ARG, "chunk_bytes '%s' must be positive", value);
        b->ctx.chunk = (size_t)v;
        return 0;
    }
    return DDP_ERROR(DDP_ERR_UNSUPPORTED, "unknown option '%s'", key);
}

static ddp__tp *tp_transport(void *impl) { return ((tp_backend *)impl)->tp; }

const ddp__hier *ddp__backend_hier(const ddp__backend *be, void *impl)
{
    return be && be->run == tp_run && impl ? ((tp_backend *)impl)->hier : NULL;
}

/* ---- the registry ---- */

static const ddp__backend backends[] = {
    {"tcp", tcp_create, tp_run, tp_abort, tp_destroy, tp_set_option, tp_transport, NULL, NULL},
};
#ifdef DDP_HAVE_MPI
static const char *const backend_names[] = {"tcp", "mpi", NULL};
#else
static const char *const backend_names[] = {"tcp", NULL};
#endif

const ddp__backend *ddp__backend_find(const char *name)
{
    if (!name || !*name)
        name = "tcp";
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
        if (strcmp(backends[i].name, name) == 0)
            return &backends[i];
    if (strcmp(name, "mpi") == 0) {
#ifdef DDP_HAVE_MPI
        return &ddp__backend_mpi;
#else
        DDP_ERROR(DDP_ERR_UNSUPPORTED, "backend 'mpi': libddp was built without MPI "
                                       "(install libopenmpi-dev or libmpich-dev and rebuild)");
        return NULL;
#endif
    }
    DDP_ERROR(DDP_ERR_UNSUPPORTED, "unknown backend '%s' (available: tcp)", name);
    return NULL;
}

const char *const *ddp_backend_names(void) { return backend_names; }
