/* HashStore: an in-memory store shared by the threads of one process
 * (torch.distributed's HashStore), for ranks as threads in tests and for
 * single-process runs.  Handles attached to one store share its table
 * (reference-counted: the last handle frees it); each handle has its own
 * timeout.  Waits sleep on a condition variable that every write
 * broadcasts: no polling. */
#include "store/store_impl.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "store/kv.h"

typedef struct hash_table {
    pthread_mutex_t mu;
    pthread_cond_t changed; /* on CLOCK_MONOTONIC */
    ddp__kv kv;
    int refs;
} hash_table;

typedef struct hash_store {
    ddp_store_t base;
    hash_table *t;
} hash_store;

static hash_table *table_of(ddp_store_t *s) { return ((hash_store *)s)->t; }

static int copy_value(const ddp_store_t *s, const ddp__kv_entry *e, void **value, size_t *len)
{
    *value = malloc(e->vlen + 1);
    DDP_FAIL_IF(!*value, DDP_ERR_NOMEM, "%s: out of memory", s->desc);
    memcpy(*value, e->value, e->vlen + 1);
    *len = e->vlen;
    return 0;
}

/* Stores and wakes every waiter; caller holds the mutex. */
static int put(ddp_store_t *s, hash_table *t, const char *key, const void *value, size_t len)
{
    DDP_FAIL_IF(ddp__kv_set(&t->kv, key, strlen(key), value, len) < 0, DDP_ERR_NOMEM,
                "%s: out of memory", s->desc);
    pthread_cond_broadcast(&t->changed);
    return 0;
}

static int hs_set(ddp_store_t *s, const char *key, const void *value, size_t len)
{
    hash_table *t = table_of(s);
    pthread_mutex_lock(&t->mu);
    int rc = put(s, t, key, value, len);
    pthread_mutex_unlock(&t->mu);
    return rc;
}

/* Present flags of keys; returns 1 when all exist.  Caller holds the mutex. */
static int look(hash_table *t, const char *const *keys, size_t n, int *present)
{
    int all = 1;
    for (size_t i = 0; i < n; i++) {
        int p = ddp__kv_find(&t->kv, keys[i], strlen(keys[i])) != NULL;
        if (present)
            present[i] = p;
        all &= p;
    }
    return all;
}

/* Sleeps until all keys exist or the deadline passes (mutex held). */
static int wait_locked(ddp_store_t *s, hash_table *t, const char *const *keys, size_t n,
                       double timeout_s)
{
    struct timespec now, until;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double secs = floor(timeout_s);
    until.tv_sec = now.tv_sec + (time_t)(secs > 1e9 ? 1e9 : secs);
    until.tv_nsec = now.tv_nsec + (long)((timeout_s - secs) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    while (!look(t, keys, n, NULL)) {
        int err = pthread_cond_timedwait(&t->changed, &t->mu, &until);
        if (err == ETIMEDOUT && !look(t, keys, n, NULL)) {
            int *present = calloc(n, sizeof *present);
            if (present)
                look(t, keys, n, present);
            int rc = ddp__store_timeout_error(s, keys, n, present, timeout_s);
            free(present);
            return rc;
        }
    }
    return 0;
}

static int hs_get(ddp_store_t *s, const char *key, double timeout_s, void **value, size_t *len)
{
    hash_table *t = table_of(s);
    pthread_mutex_lock(&t->mu);
    int rc = wait_locked(s, t, &key, 1, timeout_s);
    if (rc == 0)
        rc = copy_value(s, ddp__kv_find(&t->kv, key, strlen(key)), value, len);
    pthread_mutex_unlock(&t->mu);
    return rc;
}

static int hs_wait(ddp_store_t *s, const char *const *keys, size_t n, double timeout_s)
{
    hash_table *t = table_of(s);
    pthread_mutex_lock(&t->mu);
    int rc = wait_locked(s, t, keys, n, timeout_s);
    pthread_mutex_unlock(&t->mu);
    return rc;
}

static int hs_add(ddp_store_t *s, const char *key, int64_t delta, int64_t *result)
{
    hash_table *t = table_of(s);
    size_t klen = strlen(key), n = 0;
    char num[32];
    pthread_mutex_lock(&t->mu);
    int rc = ddp__kv_add(ddp__kv_find(&t->kv, key, klen), key, klen, delta, result, num, &n);
    if (rc == 0)
        rc = put(s, t, key, num, n);
    else
        ddp__error_context(rc, "%s", s->desc);
    pthread_mutex_unlock(&t->mu);
    return rc;
}

static int hs_compare_set(ddp_store_t *s, const char *key, const void *expected, size_t elen,
                          const void *desired, size_t dlen, void **actual, size_t *alen)
{
    hash_table *t = table_of(s);
    size_t klen = strlen(key);
    int rc = 0;
    pthread_mutex_lock(&t->mu);
    ddp__kv_entry *e = ddp__kv_find(&t->kv, key, klen);
    if (ddp__kv_cas_matches(e, expected, elen))
        rc = put(s, t, key, desired, dlen);
    e = ddp__kv_find(&t->kv, key, klen);
    if (rc == 0 && e)
        rc = copy_value(s, e, actual, alen);
    pthread_mutex_unlock(&t->mu);
    return rc;
}

static int hs_check(ddp_store_t *s, const char *const *keys, size_t n, int *exists)
{
    hash_table *t = table_of(s);
    pthread_mutex_lock(&t->mu);
    *exists = look(t, keys, n, NULL);
    pthread_mutex_unlock(&t->mu);
    return 0;
}

static int hs_delete_key(ddp_store_t *s, const char *key, int *deleted)
{
    hash_table *t = table_of(s);
    pthread_mutex_lock(&t->mu);
    *deleted = ddp__kv_delete(&t->kv, key, strlen(key));
    pthread_mutex_unlock(&t->mu);
    return 0;
}

static int hs_num_keys(ddp_store_t *s, int64_t *n)
{
    hash_table *t = table_of(s);
    pthread_mutex_lock(&t->mu);
    *n = (int64_t)t->kv.count;
    pthread_mutex_unlock(&t->mu);
    return 0;
}

static void release(hash_table *t)
{
    pthread_mutex_lock(&t->mu);
    int last = --t->refs == 0;
    pthread_mutex_unlock(&t->mu);
    if (!last)
        return;
    ddp__kv_free(&t->kv);
    pthread_cond_destroy(&t->changed);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

static void hs_destroy(ddp_store_t *s)
{
    hash_store *hs = (hash_store *)s;
    /* In a forked child the table's mutex may have been copied locked by
     * another thread of the parent: leave the child's copy alone. */
    if (!ddp__store_foreign(s))
        release(hs->t);
    free(hs);
}

static const ddp__store_ops hash_ops = {
    .set = hs_set,
    .get = hs_get,
    .add = hs_add,
    .compare_set = hs_compare_set,
    .wait = hs_wait,
    .check = hs_check,
    .delete_key = hs_delete_key,
    .num_keys = hs_num_keys,
    .destroy = hs_destroy,
};

/* A new handle on table t (which gains a reference). */
static int new_handle(hash_table *t, ddp_store_t **out)
{
    hash_store *hs = calloc(1, sizeof *hs);
    DDP_FAIL_IF(!hs, DDP_ERR_NOMEM, "hash store: out of memory");
    hs->t = t;
    ddp__store_init(&hs->base, &hash_ops, "hash store %p", (void *)t);
    pthread_mutex_lock(&t->mu);
    t->refs++;
    pthread_mutex_unlock(&t->mu);
    *out = &hs->base;
    return 0;
}

int ddp_store_hash_create(ddp_store_t **out)
{
    DDP_FAIL_IF(!out, DDP_ERR_INVALID_ARG, "ddp_store_hash_create: out is NULL");
    *out = NULL;
    hash_table *t = calloc(1, sizeof *t);
    DDP_FAIL_IF(!t, DDP_ERR_NOMEM, "hash store: out of memory");
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->changed, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&t->mu, NULL);
    ddp__kv_init(&t->kv);
    int rc = new_handle(t, out);
    if (rc < 0) {
        pthread_cond_destroy(&t->changed);
        pthread_mutex_destroy(&t->mu);
        free(t);
    }
    return rc;
}

int ddp_store_hash_attach(ddp_store_t *store, ddp_store_t **out)
{
    DDP_FAIL_IF(!out, DDP_ERR_INVALID_ARG, "ddp_store_hash_attach: out is NULL");
    *out = NULL;
    DDP_FAIL_IF(!store || store->ops != &hash_ops, DDP_ERR_INVALID_ARG,
                "ddp_store_hash_attach: %s is not a hash store", store ? store->desc : "NULL");
    DDP_FAIL_IF(ddp__store_foreign(store), DDP_ERR_STATE,
                "ddp_store_hash_attach: %s belongs to process %d (inherited through fork)",
                store->desc, store->pid);
    return new_handle(table_of(store), out);
}
