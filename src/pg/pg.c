/* Process groups: creation (rendezvous through a store or an init-method
 * URL, subgroups), teardown by reference count, options and accessors.
 * The executor, the communication thread, work handles and symmetric
 * memory are work.c; the collectives' entry points collectives.c.  See
 * include/ddp/pg.h. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "pg/internal.h"
#include "pg/pg_impl.h"

#define DEFAULT_TIMEOUT_S 300.0

/* ------------------------------------------------------------------ */
/* Creation and destruction                                             */
/* ------------------------------------------------------------------ */

/* parent, ranks: a subgroup of parent, or NULL for a world group. */
static int pg_create(const char *backend, ddp_store_t *store, int owns_store, const char *prefix,
                     int rank, int size, double timeout_s, ddp_pg_t *parent, const int *ranks,
                     ddp_pg_t **out)
{
    int rc = 0;
    ddp_pg_t *pg = NULL;
    *out = NULL;
    const ddp__backend *be = ddp__backend_find(backend);
    DDP_FAIL_OUT(!be, DDP_ERR_UNSUPPORTED, "%s", ddp_last_error());
    DDP_FAIL_OUT(size < 1, DDP_ERR_INVALID_ARG, "world size %d must be at least 1", size);
    DDP_FAIL_OUT(rank < 0 || rank >= size, DDP_ERR_INVALID_ARG,
                 "rank %d out of range for world size %d", rank, size);
    pg = calloc(1, sizeof *pg);
    DDP_FAIL_OUT(!pg, DDP_ERR_NOMEM, "out of memory");
    atomic_init(&pg->refs, 1);
    pg->be = be;
    pg->rank = rank;
    pg->size = size;
    pg->timeout_s = timeout_s > 0 ? timeout_s : DEFAULT_TIMEOUT_S;
    pg->store = store;
    pg->owns_store = owns_store;
    snprintf(pg->prefix, sizeof pg->prefix, "%s", prefix);
    pthread_mutex_init(&pg->mu, NULL);
    pthread_cond_init(&pg->cv_work, NULL);
    pthread_cond_init(&pg->cv_done, NULL);
    /* The recorder and DDP_DEBUG first: a bad value fails before anyone connects. */
    DDP_TRY_OUT(ddp__trace_init(&pg->trace));
    DDP_TRY_OUT(ddp__debug_init(pg));
    pg->world = parent ? parent->world : pg;
    pg->granks = malloc((size_t)size * sizeof *pg->granks);
    DDP_FAIL_OUT(!pg->granks, DDP_ERR_NOMEM, "out of memory");
    for (int i = 0; i < size; i++)
        pg->granks[i] = parent ? parent->granks[ranks[i]] : i;
    /* Registered before it connects: SIGUSR1 while a rank is missing (the
     * usual hang) dumps the group as setting up rather than killing us. */
    ddp__trace_register(pg);
    void *impl = NULL;
    if (parent && be->create_sub)
        rc = be->create_sub(parent->impl, ranks, size, rank, pg->timeout_s, &impl);
    else
        rc = be->create(store, prefix, rank, size, pg->timeout_s, &impl);
    pthread_mutex_lock(&pg->mu); /* a dump reads impl: "setting up" while NULL */
    pg->impl = impl;
    pthread_mutex_unlock(&pg->mu);
    if (rc < 0)
        goto out;
    DDP_FAIL_OUT(pthread_create(&pg->thread, NULL, ddp__pg_comm_thread, pg) != 0, DDP_ERR_SYSTEM,
                 "cannot start the communication thread");
    pg->thread_started = 1;
    if (pg->debug >= DDP__DEBUG_INFO)
        ddp__log(DDP_LOG_INFO, "DDP_DEBUG: group %s: rank %d of %d (world rank %d), backend %s",
                 pg->prefix, rank, size, pg->granks[rank], be->name);
    *out = pg;
    pg = NULL;
out:
    if (pg) {
        pg->owns_store = 0; /* the caller still owns it on failure */
        ddp_destroy_process_group(pg);
    }
    return rc;
}

int ddp_init_process_group_store(const char *backend, ddp_store_t *store, int rank,
                                 int world_size, double timeout_s, ddp_pg_t **out)
{
    DDP_FAIL_IF(!out, DDP_ERR_INVALID_ARG, "init_process_group: NULL output");
    *out = NULL;
    DDP_FAIL_IF(!store, DDP_ERR_INVALID_ARG, "init_process_group: NULL store");
    return pg_create(backend, store, 0, "ddp/world", rank, world_size, timeout_s, NULL, NULL,
                     out);
}

int ddp_init_process_group(const char *backend, const char *init_method, int rank,
                           int world_size, double timeout_s, ddp_pg_t **out)
{
    DDP_FAIL_IF(!out, DDP_ERR_INVALID_ARG, "init_process_group: NULL output");
    *out = NULL;
    double t = timeout_s > 0 ? timeout_s : DEFAULT_TIMEOUT_S;
    int r = rank, ws = world_size;
    const ddp__backend *be = ddp__backend_find(backend);
    if (!be)
        return DDP_ERR_UNSUPPORTED; /* the message names the backends */
    if (be->launcher_world) { /* mpi: the launcher's rank and size, no store */
        DDP_TRY(be->launcher_world(rank, world_size, &r, &ws));
        return pg_create(backend, NULL, 0, "ddp/world", r, ws, t, NULL, NULL, out);
    }
    DDP_FAIL_IF(!init_method, DDP_ERR_INVALID_ARG, "init_process_group: NULL init method");
    ddp_store_t *store = NULL;
    ddp__trace_install_handler(); /* reaching rank 0's store can wait too */
    DDP_TRY(ddp_store_from_url(init_method, rank, world_size, t, &store, &r, &ws));
    int rc = pg_create(backend, store, 1, "ddp/world", r, ws, t, NULL, NULL, out);
    if (rc < 0)
        ddp_store_destroy(store);
    return rc;
}

/* The teardown proper, once nobody holds the group any more. */
static void pg_free(ddp_pg_t *pg)
{
    if (pg->thread_started) {
        pthread_mutex_lock(&pg->mu);
        pg->stop = 1;
        pthread_cond_broadcast(&pg->cv_work);
        pthread_mutex_unlock(&pg->mu);
        pthread_join(pg->thread, NULL); /* drains the queue: each op is bounded */
        /* every operation done: the statistics and the recorder are final */
        ddp__comm_stats_at_destroy(pg);
        ddp__trace_at_destroy(pg);
    }
    ddp__trace_unregister(pg); /* registered before it connected; none: a no-op */
    if (pg->impl)
        pg->be->destroy(pg->impl);
    if (pg->owns_store)
        ddp_store_destroy(pg->store);
    ddp__trace_free(&pg->trace);
    free(pg->granks);
    pthread_cond_destroy(&pg->cv_done);
    pthread_cond_destroy(&pg->cv_work);
    pthread_mutex_destroy(&pg->mu);
    free(pg);
}

void ddp__pg_retain(ddp_pg_t *pg)
{
    if (pg)
        atomic_fetch_add(&pg->refs, 1);
}

void ddp__pg_release(ddp_pg_t *pg)
{
    if (pg && atomic_fetch_sub(&pg->refs, 1) == 1)
        pg_free(pg);
}

/* Drops the creator's reference: a group that a wrapper still holds (DDP)
 * is torn down when that wrapper lets go (pg.h). */
void ddp_destroy_process_group(ddp_pg_t *pg) { ddp__pg_release(pg); }

int ddp__pg_set_option(ddp_pg_t *pg, const char *key, const char *value)
{
    DDP_FAIL_IF(!pg || !key || !value, DDP_ERR_INVALID_ARG, "set_option: NULL argument");
    DDP_FAIL_IF(!pg->be->set_option, DDP_ERR_UNSUPPORTED, "backend %s has no options",
                pg->be->name);
    pthread_mutex_lock(&pg->mu);
    int idle = !pg->busy && !pg->head;
    pthread_mutex_unlock(&pg->mu);
    DDP_FAIL_IF(!idle, DDP_ERR_STATE, "set_option: operations are pending");
    return pg->be->set_option(pg->impl, key, value);
}

struct ddp__tp *ddp__pg_transport(ddp_pg_t *pg)
{
    return pg && pg->be->transport ? pg->be->transport(pg->impl) : NULL;
}

const struct ddp__hier *ddp__pg_hier(ddp_pg_t *pg)
{
    return pg ? ddp__backend_hier(pg->be, pg->impl) : NULL;
}

int ddp_pg_rank(const ddp_pg_t *pg) { return pg ? pg->rank : -1; }
int ddp_pg_size(const ddp_pg_t *pg) { return pg ? pg->size : -1; }
const char *ddp_pg_backend(const ddp_pg_t *pg) { return pg ? pg->be->name : NULL; }
double ddp_pg_timeout(const ddp_pg_t *pg) { return pg ? pg->timeout_s : 0; }

int ddp_pg_set_label(ddp_pg_t *pg, const char *label)
{
    DDP_FAIL_IF(!pg, DDP_ERR_INVALID_ARG, "set_label: NULL process group");
    pthread_mutex_lock(&pg->mu);
    snprintf(pg->label, sizeof pg->label, "%s", label ? label : "");
    pthread_mutex_unlock(&pg->mu);
    return 0;
}

int ddp_pg_new_group(ddp_pg_t *pg, const int *ranks, int n, ddp_pg_t **out)
{
    DDP_FAIL_IF(!out, DDP_ERR_INVALID_ARG, "new_group: NULL output");
    *out = NULL;
    DDP_FAIL_IF(!pg || !ranks, DDP_ERR_INVALID_ARG, "new_group: NULL argument");
    DDP_FAIL_IF(n < 1 || n > pg->size, DDP_ERR_INVALID_ARG,
                "new_group: %d ranks for a group of %d", n, pg->size);
    int me = -1;
    for (int i = 0; i < n; i++) {
        DDP_FAIL_IF(ranks[i] < 0 || ranks[i] >= pg->size, DDP_ERR_INVALID_ARG,
                    "new_group: rank %d out of range for a group of %d", ranks[i], pg->size);
        for (int j = 0; j < i; j++)
            DDP_FAIL_IF(ranks[j] == ranks[i], DDP_ERR_INVALID_ARG,
                        "new_group: rank %d listed twice", ranks[i]);
        if (ranks[i] == pg->rank)
            me = i;
    }
    int id = ++pg->nsub; /* every rank counts the same calls */
    if (me < 0)
        return 0;
    char prefix[256];
    snprintf(prefix, sizeof prefix, "%.200s/g%d", pg->prefix, id);
    return pg_create(pg->be->name, pg->store, 0, prefix, me, n, pg->timeout_s, pg, ranks, out);
}

