/* PrefixStore: a view of another store where every key becomes
 * "PREFIX/key", so that subgroups (and nested subgroups) get their own key
 * space in one rendezvous store (torch.distributed's PrefixStore).
 * The view borrows its base; timeouts are the view's own. */
#include "store/store_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

typedef struct prefix_store {
    ddp_store_t base;
    ddp_store_t *inner;
    char *prefix;
    size_t prefix_len;
} prefix_store;

/* "prefix/key", malloc'ed. */
static int full_key(prefix_store *ps, const char *key, char **out)
{
    size_t klen = strlen(key), len = ps->prefix_len + 1 + klen;
    DDP_FAIL_IF(len > DDP__STORE_MAX_KEY, DDP_ERR_INVALID_ARG,
                "%s: key '%s/%.40s...' longer than %d bytes", ps->base.desc, ps->prefix, key,
                DDP__STORE_MAX_KEY);
    char *k = malloc(len + 1);
    DDP_FAIL_IF(!k, DDP_ERR_NOMEM, "%s: out of memory", ps->base.desc);
    memcpy(k, ps->prefix, ps->prefix_len);
    k[ps->prefix_len] = '/';
    memcpy(k + ps->prefix_len + 1, key, klen + 1);
    *out = k;
    return 0;
}

static void free_keys(char **keys, size_t n)
{
    for (size_t i = 0; keys && i < n; i++)
        free(keys[i]);
    free(keys);
}

static int full_keys(prefix_store *ps, const char *const *keys, size_t n, char ***out)
{
    char **k = calloc(n, sizeof *k);
    DDP_FAIL_IF(!k, DDP_ERR_NOMEM, "%s: out of memory", ps->base.desc);
    for (size_t i = 0; i < n; i++) {
        int rc = full_key(ps, keys[i], &k[i]);
        if (rc < 0) {
            free_keys(k, n);
            return rc;
        }
    }
    *out = k;
    return 0;
}

/* Calls EXPR with `k` bound to the full key of `key`. */
#define WITH_KEY(ps, key, expr)                 \
    do {                                        \
        char *k = NULL;                         \
        DDP_TRY(full_key((ps), (key), &k));     \
        int rc_ = (expr);                       \
        free(k);                                \
        return rc_;                             \
    } while (0)

static int ps_set(ddp_store_t *s, const char *key, const void *value, size_t len)
{
    prefix_store *ps = (prefix_store *)s;
    WITH_KEY(ps, key, ps->inner->ops->set(ps->inner, k, value, len));
}

static int ps_get(ddp_store_t *s, const char *key, double timeout_s, void **value, size_t *len)
{
    prefix_store *ps = (prefix_store *)s;
    WITH_KEY(ps, key, ps->inner->ops->get(ps->inner, k, timeout_s, value, len));
}

static int ps_add(ddp_store_t *s, const char *key, int64_t delta, int64_t *result)
{
    prefix_store *ps = (prefix_store *)s;
    WITH_KEY(ps, key, ps->inner->ops->add(ps->inner, k, delta, result));
}

static int ps_compare_set(ddp_store_t *s, const char *key, const void *expected, size_t elen,
                          const void *desired, size_t dlen, void **actual, size_t *alen)
{
    prefix_store *ps = (prefix_store *)s;
    WITH_KEY(ps, key,
             ps->inner->ops->compare_set(ps->inner, k, expected, elen, desired, dlen, actual,
                                         alen));
}

static int ps_delete_key(ddp_store_t *s, const char *key, int *deleted)
{
    prefix_store *ps = (prefix_store *)s;
    WITH_KEY(ps, key, ps->inner->ops->delete_key(ps->inner, k, deleted));
}

static int ps_wait(ddp_store_t *s, const char *const *keys, size_t n, double timeout_s)
{
    prefix_store *ps = (prefix_store *)s;
    char **k = NULL;
    DDP_TRY(full_keys(ps, keys, n, &k));
    int rc = ps->inner->ops->wait(ps->inner, (const char *const *)k, n, timeout_s);
    free_keys(k, n);
    return rc;
}

static int ps_check(ddp_store_t *s, const char *const *keys, size_t n, int *exists)
{
    prefix_store *ps = (prefix_store *)s;
    char **k = NULL;
    DDP_TRY(full_keys(ps, keys, n, &k));
    int rc = ps->inner->ops->check(ps->inner, (const char *const *)k, n, exists);
    free_keys(k, n);
    return rc;
}

/* Like torch's PrefixStore: the number of keys in the whole base store. */
static int ps_num_keys(ddp_store_t *s, int64_t *n)
{
    prefix_store *ps = (prefix_store *)s;
    return ps->inner->ops->num_keys(ps->inner, n);
}

static void ps_destroy(ddp_store_t *s)
{
    prefix_store *ps = (prefix_store *)s;
    free(ps->prefix);
    free(ps);
}

static const ddp__store_ops prefix_ops = {
    .set = ps_set,
    .get = ps_get,
    .add = ps_add,
    .compare_set = ps_compare_set,
    .wait = ps_wait,
    .check = ps_check,
    .delete_key = ps_delete_key,
    .num_keys = ps_num_keys,
    .destroy = ps_destroy,
};

int ddp_store_prefix_create(const char *prefix, ddp_store_t *base, ddp_store_t **out)
{
    DDP_FAIL_IF(!out, DDP_ERR_INVALID_ARG, "ddp_store_prefix_create: out is NULL");
    *out = NULL;
    DDP_FAIL_IF(!base, DDP_ERR_INVALID_ARG, "prefix store: base store is NULL");
    DDP_FAIL_IF(!prefix || !*prefix, DDP_ERR_INVALID_ARG, "prefix store over %s: empty prefix",
                base->desc);
    DDP_FAIL_IF(ddp__store_foreign(base), DDP_ERR_STATE,
                "prefix store over %s: the base handle belongs to process %d (inherited "
                "through fork)",
                base->desc, base->pid);
    size_t plen = strnlen(prefix, DDP__STORE_MAX_KEY);
    DDP_FAIL_IF(plen >= DDP__STORE_MAX_KEY - 1, DDP_ERR_INVALID_ARG,
                "prefix store over %s: prefix longer than %d bytes", base->desc,
                DDP__STORE_MAX_KEY - 2);
    prefix_store *ps = calloc(1, sizeof *ps);
    DDP_FAIL_IF(!ps, DDP_ERR_NOMEM, "prefix store: out of memory");
    ps->prefix = strdup(prefix);
    if (!ps->prefix) {
        free(ps);
        return DDP_ERROR(DDP_ERR_NOMEM, "prefix store: out of memory");
    }
    ps->prefix_len = plen;
    ps->inner = base;
    ddp__store_init(&ps->base, &prefix_ops, "%.100s (prefix '%.40s')", base->desc, prefix);
    ps->base.timeout_s = base->timeout_s;
    *out = &ps->base;
    return 0;
}
