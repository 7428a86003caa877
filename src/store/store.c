/* Public store API: argument checks and dispatch through the ops table
 * (store_impl.h).  Every implementation lives in its own file. */
#include "store/store_impl.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"

/* ---- fork detection ----------------------------------------------------
 * A handle must not be used by a fork's child (store_impl.h).  getpid()
 * is a system call (2.4 us on these VMs, more than a HashStore call), so
 * instead every fork bumps a counter in the child, through pthread_atfork,
 * and a handle remembers the count it was made under.  This counter is
 * process state by nature (like the log level), hence the one global of
 * the layer. */
static pthread_once_t fork_hook_once = PTHREAD_ONCE_INIT;
static _Atomic unsigned fork_epoch;

static void on_fork_child(void) { atomic_fetch_add(&fork_epoch, 1); }

static void install_fork_hook(void) { pthread_atfork(NULL, NULL, on_fork_child); }

int ddp__store_foreign(const ddp_store_t *s)
{
    return s->fork_epoch != atomic_load_explicit(&fork_epoch, memory_order_relaxed);
}

void ddp__store_init(ddp_store_t *s, const ddp__store_ops *ops, const char *fmt, ...)
{
    pthread_once(&fork_hook_once, install_fork_hook);
    s->ops = ops;
    s->timeout_s = DDP_STORE_DEFAULT_TIMEOUT_S;
    s->pid = (int)getpid();
    s->fork_epoch = atomic_load(&fork_epoch);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->desc, sizeof s->desc, fmt, ap);
    va_end(ap);
}

/* ---- messages ----------------------------------------------------------- */

int ddp__store_timeout_error(const ddp_store_t *s, const char *const *keys, size_t n,
                             const int *present, double timeout_s)
{
    char missing[512] = "", all[512] = "";
    size_t nm = 0;
    for (size_t i = 0; i < n; i++) {
        if (!present || !present[i]) {
            size_t len = strlen(missing);
            snprintf(missing + len, sizeof missing - len, "%s'%s'", nm ? ", " : "", keys[i]);
            nm++;
        }
        size_t len = strlen(all);
        snprintf(all + len, sizeof all - len, "%s'%s'", i ? ", " : "", keys[i]);
    }
    if (n == 1)
        return DDP_ERROR(DDP_ERR_TIMEOUT, "%s: key %s not set within %.3g s", s->desc, all,
                         timeout_s);
    return DDP_ERROR(DDP_ERR_TIMEOUT, "%s: key%s %s not set within %.3g s (waited for %s)",
                     s->desc, nm == 1 ? "" : "s", missing, timeout_s, all);
}

void ddp__job_words(char *out, size_t len, const char *id, size_t n, int ours)
{
    if (n == 0)
        snprintf(out, len, "%s", ours ? "this job has no id" : "no job id");
    else
        snprintf(out, len, "%s'%.*s'", ours ? "this job's id is " : "id ", (int)n, id);
}

/* ---- argument checks ---------------------------------------------------- */

static int check_store(const ddp_store_t *s, const char *what)
{
    DDP_FAIL_IF(!s, DDP_ERR_INVALID_ARG, "%s: store is NULL", what);
    /* A forked child shares the parent's sockets and file locks: using them
     * from both sides would interleave messages and break the locking. */
    DDP_FAIL_IF(ddp__store_foreign(s), DDP_ERR_STATE,
                "%s: %s: handle created by process %d, used in process %d after fork; "
                "create a new handle in the child",
                what, s->desc, s->pid, (int)getpid());
    return 0;
}

static int check_key(const ddp_store_t *s, const char *key)
{
    DDP_FAIL_IF(!key, DDP_ERR_INVALID_ARG, "%s: key is NULL", s->desc);
    size_t len = strnlen(key, DDP__STORE_MAX_KEY + 1);
    DDP_FAIL_IF(len == 0, DDP_ERR_INVALID_ARG, "%s: empty key", s->desc);
    DDP_FAIL_IF(len > DDP__STORE_MAX_KEY, DDP_ERR_INVALID_ARG,
                "%s: key '%.40s...' longer than %d bytes", s->desc, key, DDP__STORE_MAX_KEY);
    return 0;
}

static int check_value(const ddp_store_t *s, const char *key, const void *value, size_t len)
{
    DDP_FAIL_IF(!value && len, DDP_ERR_INVALID_ARG, "%s: value of key '%s' is NULL", s->desc,
                key);
    DDP_FAIL_IF(len > DDP__STORE_MAX_VALUE, DDP_ERR_INVALID_ARG,
                "%s: value of key '%s' is %zu bytes, more than the limit of %u", s->desc, key,
                len, DDP__STORE_MAX_VALUE);
    return 0;
}

static int check_keys(const ddp_store_t *s, const char *const *keys, size_t n)
{
    DDP_FAIL_IF(n && !keys, DDP_ERR_INVALID_ARG, "%s: key list is NULL", s->desc);
    DDP_FAIL_IF(n > DDP__STORE_MAX_KEYS, DDP_ERR_INVALID_ARG,
                "%s: %zu keys in one call, more than the limit of %d", s->desc, n,
                DDP__STORE_MAX_KEYS);
    for (size_t i = 0; i < n; i++)
        DDP_TRY(check_key(s, keys[i]));
    return 0;
}

/* ---- dispatchers -------------------------------------------------------- */

int ddp_store_set(ddp_store_t *store, const char *key, const void *value, size_t len)
{
    DDP_TRY(check_store(store, "ddp_store_set"));
    DDP_TRY(check_key(store, key));
    DDP_TRY(check_value(store, key, value, len));
    return store->ops->set(store, key, value, len);
}

int ddp_store_get(ddp_store_t *store, const char *key, void **value, size_t *len)
{
    DDP_TRY(check_store(store, "ddp_store_get"));
    DDP_TRY(check_key(store, key));
    DDP_FAIL_IF(!value || !len, DDP_ERR_INVALID_ARG, "%s: get '%s': NULL output", store->desc,
                key);
    *value = NULL;
    *len = 0;
    return store->ops->get(store, key, store->timeout_s, value, len);
}

int ddp_store_add(ddp_store_t *store, const char *key, int64_t delta, int64_t *result)
{
    DDP_TRY(check_store(store, "ddp_store_add"));
    DDP_TRY(check_key(store, key));
    int64_t r = 0;
    DDP_TRY(store->ops->add(store, key, delta, &r));
    if (result)
        *result = r;
    return 0;
}

int ddp_store_compare_set(ddp_store_t *store, const char *key, const void *expected,
                          size_t expected_len, const void *desired, size_t desired_len,
                          void **actual, size_t *actual_len)
{
    DDP_TRY(check_store(store, "ddp_store_compare_set"));
    DDP_TRY(check_key(store, key));
    DDP_TRY(check_value(store, key, expected, expected_len));
    DDP_TRY(check_value(store, key, desired, desired_len));
    DDP_FAIL_IF(actual && !actual_len, DDP_ERR_INVALID_ARG,
                "%s: compare_set '%s': actual_len is NULL", store->desc, key);
    void *a = NULL;
    size_t alen = 0;
    DDP_TRY(store->ops->compare_set(store, key, expected, expected_len, desired, desired_len, &a,
                                    &alen));
    if (actual) {
        *actual = a;
        *actual_len = alen;
    } else {
        free(a);
    }
    return 0;
}

int ddp_store_wait(ddp_store_t *store, const char *const *keys, size_t n, double timeout_s)
{
    DDP_TRY(check_store(store, "ddp_store_wait"));
    DDP_TRY(check_keys(store, keys, n));
    DDP_FAIL_IF(isnan(timeout_s), DDP_ERR_INVALID_ARG, "%s: wait: timeout is NaN", store->desc);
    if (n == 0)
        return 0;
    return store->ops->wait(store, keys, n, timeout_s < 0 ? store->timeout_s : timeout_s);
}

int ddp_store_check(ddp_store_t *store, const char *const *keys, size_t n, int *exists)
{
    DDP_TRY(check_store(store, "ddp_store_check"));
    DDP_TRY(check_keys(store, keys, n));
    DDP_FAIL_IF(!exists, DDP_ERR_INVALID_ARG, "%s: check: exists is NULL", store->desc);
    *exists = 1;
    if (n == 0)
        return 0;
    return store->ops->check(store, keys, n, exists);
}

int ddp_store_delete_key(ddp_store_t *store, const char *key, int *deleted)
{
    DDP_TRY(check_store(store, "ddp_store_delete_key"));
    DDP_TRY(check_key(store, key));
    int d = 0;
    DDP_TRY(store->ops->delete_key(store, key, &d));
    if (deleted)
        *deleted = d;
    return 0;
}

int ddp_store_num_keys(ddp_store_t *store, int64_t *n)
{
    DDP_TRY(check_store(store, "ddp_store_num_keys"));
    DDP_FAIL_IF(!n, DDP_ERR_INVALID_ARG, "%s: num_keys: output is NULL", store->desc);
    return store->ops->num_keys(store, n);
}

void ddp_store_set_timeout(ddp_store_t *store, double timeout_s)
{
    if (store && timeout_s >= 0 && !isnan(timeout_s))
        store->timeout_s = timeout_s;
}

double ddp_store_timeout(const ddp_store_t *store)
{
    return store ? store->timeout_s : DDP_STORE_DEFAULT_TIMEOUT_S;
}

void ddp_store_destroy(ddp_store_t *store)
{
    if (store)
        store->ops->destroy(store);
}
