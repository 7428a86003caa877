/* Backend registry and the transport-backed backends; see backend.h. */
#include "pg/backend.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "pg/backend_hier.h"
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

static int tcp_create(ddp_store_t *store, const char *prefix, int rank, int size,
                      double timeout_s, void **impl)
{
    tp_backend *b = calloc(1, sizeof *b);
    DDP_FAIL_IF(!b, DDP_ERR_NOMEM, "out of memory");
    /* Tuning first: a bad DDP_* value fails before anyone connects. */
    int rc = ddp__coll_ctx_init(&b->ctx, rank, size);
    /* Same host everywhere: shared memory (transport/shm.h); several hosts:
     * tcp, plus the two levels of hierarchical collectives when some host
     * holds several ranks (pg/backend_hier.h); DDP_TRANSPORT and DDP_HIERARCHICAL
     * override. */
    ddp__layout lay = {0};
    /* One deadline for the whole setup: each phase gets what is left. */
    const double deadline = ddp_time_now() + timeout_s;
    if (rc == 0)
        rc = ddp__transport_layout(store, prefix, rank, size, ddp__setup_time_left(deadline),
                                   &lay);
    double left = ddp__setup_time_left(deadline);
    if (rc == 0)
        rc = lay.kind == DDP__LAYOUT_SHM ? ddp__shm_create(store, prefix, rank, size, left, &b->tp)
                                         : ddp__tcp_create(store, prefix, rank, size, left, &b->tp);
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
                    "allreduce_algo '%s': expected auto, ring, rd, direct, shared, rabenseifner or tree", value);
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

/* One step's outcome, exchanged with the size asked for: *who is the first
 * rank whose step failed, -1 when none did.  < 0 (error set) when the
 * exchange itself failed or the ranks asked for different sizes. */
static int exchange(tp_backend *b, int ok, size_t bytes, uint64_t seq, double deadline, int *who)
{
    int64_t mine = (int64_t)bytes << 1 | (ok != 0), *all = calloc((size_t)b->ctx.size, 8);
    DDP_FAIL_IF(!all, DDP_ERR_NOMEM, "out of memory");
    b->ctx.seq = seq;
    b->ctx.deadline = deadline;
    ddp__coll_args a = {.kind = DDP__ALL_GATHER, .send = &mine, .recv = all, .count = 1,
                        .dtype = DDP_INT64};
    int rc = ddp__coll_run(&b->ctx, &a);
    *who = -1;
    for (int q = 0; rc == 0 && q < b->ctx.size; q++) {
        if (all[q] >> 1 != mine >> 1)
            rc = DDP_ERROR(DDP_ERR_MISMATCH,
                           "rank %d asks for %lld bytes of symmetric memory where rank %d asks "
                           "for %zu (every rank allocates the same sizes in the same order)",
                           q, (long long)(all[q] >> 1), b->ctx.rank, bytes);
        else if (!(all[q] & 1) && *who < 0)
            *who = q;
    }
    free(all);
    return rc;
}

/* Symmetric memory on a shared-memory group: make, exchange, map,
 * exchange, seal (transport/symmetric.h).  A rank that cannot make or map
 * its part (/dev/shm full, say), or that sets DDP_SYMMETRIC_MEMORY=0,
 * makes every rank fall back to private memory rather than fail: the
 * memory is only faster, never required. */
static int tp_sym_alloc(void *impl, size_t bytes, uint64_t seq, double deadline, void **out)
{
    tp_backend *b = impl;
    ddp__tp *tp = b->tp;
    *out = NULL;
    if (b->hier || !tp->vt->sym_make || b->ctx.size < 2)
        return 0;
    void *mine = NULL;
    char why[512] = "";
    int who, ok = tp->vt->sym_make(tp, bytes, &mine) == 0;
    if (!ok)
        snprintf(why, sizeof why, "%s", ddp_last_error());
    int rc = exchange(b, ok, bytes, seq, deadline, &who);
    if (rc == 0 && who < 0) {
        ok = tp->vt->sym_map(tp, mine) == 0;
        if (!ok)
            snprintf(why, sizeof why, "%s", ddp_last_error());
        rc = exchange(b, ok, bytes, seq + 1, deadline, &who);
    }
    if (rc == 0 && who < 0) {
        tp->vt->sym_seal(tp, mine);
        *out = mine;
        return 0;
    }
    if (mine)
        tp->vt->sym_drop(tp, mine);
    if (rc < 0)
        return rc;
    if (!ok)
        DDP_WARN("rank %d: no symmetric memory, using private memory: %s", b->ctx.rank, why);
    else
        DDP_INFO("rank %d: no symmetric memory (rank %d could not share), using private memory",
                 b->ctx.rank, who);
    return 0;
}

static int tp_sym_free(void *impl, void *p)
{
    ddp__tp *tp = ((tp_backend *)impl)->tp;
    return tp->vt->sym_drop ? tp->vt->sym_drop(tp, p) : 0;
}

static ddp__tp *tp_transport(void *impl) { return ((tp_backend *)impl)->tp; }

const ddp__hier *ddp__backend_hier(const ddp__backend *be, void *impl)
{
    return be && be->run == tp_run && impl ? ((tp_backend *)impl)->hier : NULL;
}

/* ---- the registry ---- */

static const ddp__backend tcp_backend = {"tcp", tcp_create, tp_run, tp_abort, tp_destroy,
                                         tp_set_option, tp_transport, NULL, NULL,
                                         tp_sym_alloc, tp_sym_free};

/* Every backend built in. */
static const ddp__backend *const registry[] = {
    &tcp_backend,
#ifdef DDP_HAVE_MPI
    &ddp__backend_mpi,
#endif
};
#define NBACKENDS (sizeof registry / sizeof registry[0])

/* Their names, NULL-terminated, for the public API and messages. */
static const char *backend_names[NBACKENDS + 1];
static pthread_once_t names_once = PTHREAD_ONCE_INIT;

static void fill_names(void)
{
    for (size_t i = 0; i < NBACKENDS; i++)
        backend_names[i] = registry[i]->name;
}

/* Names PyTorch users type for what a backend here does: "gloo" is
 * torch's CPU backend, which is what tcp is (shared memory on one host,
 * TCP across hosts). */
static const struct {
    const char *alias, *name;
} aliases[] = {{"gloo", "tcp"}};

const ddp__backend *ddp__backend_find(const char *name)
{
    if (!name || !*name)
        name = "tcp";
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (strcmp(aliases[i].alias, name) == 0)
            name = aliases[i].name;
    for (size_t i = 0; i < NBACKENDS; i++)
        if (strcmp(registry[i]->name, name) == 0)
            return registry[i];
#ifndef DDP_HAVE_MPI
    if (strcmp(name, "mpi") == 0) {
        DDP_ERROR(DDP_ERR_UNSUPPORTED, "backend 'mpi': libddp was built without MPI "
                                       "(install libopenmpi-dev or libmpich-dev and rebuild)");
        return NULL;
    }
#endif
    char avail[256] = "";
    for (size_t i = 0, off = 0; i < NBACKENDS && off < sizeof avail; i++)
        off += (size_t)snprintf(avail + off, sizeof avail - off, "%s%s", i ? ", " : "",
                                registry[i]->name);
    DDP_ERROR(DDP_ERR_UNSUPPORTED, "unknown backend '%s' (available: %s; gloo means tcp)", name,
              avail);
    return NULL;
}

const char *const *ddp_pg_backend_names(void)
{
    pthread_once(&names_once, fill_names);
    return backend_names;
}

int ddp_pg_backend_check(const char *name)
{
    return ddp__backend_find(name) ? 0 : DDP_ERR_UNSUPPORTED;
}
