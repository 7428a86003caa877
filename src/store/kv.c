/* String-keyed hash map for the stores' in-memory state (see kv.h). */
#include "store/kv.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

void ddp__kv_init(ddp__kv *kv) { memset(kv, 0, sizeof *kv); }

static void entry_free(ddp__kv_entry *e)
{
    free(e->key);
    free(e->value);
    free(e);
}

void ddp__kv_free(ddp__kv *kv)
{
    for (size_t b = 0; b < kv->nbuckets; b++) {
        ddp__kv_entry *e = kv->buckets[b];
        while (e) {
            ddp__kv_entry *next = e->next;
            entry_free(e);
            e = next;
        }
    }
    free(kv->buckets);
    ddp__kv_init(kv);
}

ddp__kv_entry *ddp__kv_find(const ddp__kv *kv, const char *key, size_t klen)
{
    if (kv->nbuckets == 0)
        return NULL;
    uint64_t h = fnv1a(key, klen);
    for (ddp__kv_entry *e = kv->buckets[h & (kv->nbuckets - 1)]; e; e = e->next)
        if (e->hash == h && e->klen == klen && memcmp(e->key, key, klen) == 0)
            return e;
    return NULL;
}

static int grow(ddp__kv *kv)
{
    size_t n = kv->nbuckets ? 2 * kv->nbuckets : 16;
    ddp__kv_entry **b = calloc(n, sizeof *b);
    if (!b)
        return DDP_ERR_NOMEM;
    for (size_t i = 0; i < kv->nbuckets; i++) {
        ddp__kv_entry *e = kv->buckets[i];
        while (e) {
            ddp__kv_entry *next = e->next;
            e->next = b[e->hash & (n - 1)];
            b[e->hash & (n - 1)] = e;
            e = next;
        }
    }
    free(kv->buckets);
    kv->buckets = b;
    kv->nbuckets = n;
    return 0;
}

/* A copy of len bytes with a NUL after them (malloc(0) avoided). */
static void *dup_bytes(const void *p, size_t len)
{
    uint8_t *q = malloc(len + 1);
    if (!q)
        return NULL;
    if (len)
        memcpy(q, p, len);
    q[len] = 0;
    return q;
}

int ddp__kv_set(ddp__kv *kv, const char *key, size_t klen, const void *value, size_t vlen)
{
    uint8_t *v = dup_bytes(value, vlen);
    if (!v)
        return DDP_ERR_NOMEM;
    ddp__kv_entry *e = ddp__kv_find(kv, key, klen);
    if (e) {
        kv->bytes = kv->bytes - e->vlen + vlen;
        free(e->value);
        e->value = v;
        e->vlen = vlen;
        return 0;
    }
    if (kv->count >= kv->nbuckets && grow(kv) < 0)
        goto fail;
    e = calloc(1, sizeof *e);
    if (!e)
        goto fail;
    e->key = dup_bytes(key, klen);
    if (!e->key) {
        free(e);
        goto fail;
    }
    e->klen = klen;
    e->value = v;
    e->vlen = vlen;
    e->hash = fnv1a(key, klen);
    ddp__kv_entry **head = &kv->buckets[e->hash & (kv->nbuckets - 1)];
    e->next = *head;
    *head = e;
    kv->count++;
    kv->bytes += klen + vlen;
    return 0;
fail:
    free(v);
    return DDP_ERR_NOMEM;
}

int ddp__kv_delete(ddp__kv *kv, const char *key, size_t klen)
{
    if (kv->nbuckets == 0)
        return 0;
    uint64_t h = fnv1a(key, klen);
    for (ddp__kv_entry **p = &kv->buckets[h & (kv->nbuckets - 1)]; *p; p = &(*p)->next) {
        ddp__kv_entry *e = *p;
        if (e->hash == h && e->klen == klen && memcmp(e->key, key, klen) == 0) {
            *p = e->next;
            kv->count--;
            kv->bytes -= e->klen + e->vlen;
            entry_free(e);
            return 1;
        }
    }
    return 0;
}

int ddp__kv_foreach(const ddp__kv *kv, int (*fn)(const ddp__kv_entry *e, void *arg), void *arg)
{
    for (size_t b = 0; b < kv->nbuckets; b++)
        for (ddp__kv_entry *e = kv->buckets[b]; e; e = e->next) {
            int rc = fn(e, arg);
            if (rc < 0)
                return rc;
        }
    return 0;
}

int ddp__kv_parse_int(const void *value, size_t vlen, int64_t *out)
{
    char buf[32];
    if (vlen == 0 || vlen >= sizeof buf)
        return DDP_ERR_FORMAT;
    memcpy(buf, value, vlen);
    buf[vlen] = '\0';
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (errno || *end || end == buf || buf[0] == ' ' || buf[0] == '\t')
        return DDP_ERR_FORMAT;
    *out = (int64_t)v;
    return 0;
}

int ddp__kv_add(const ddp__kv_entry *e, const char *key, size_t klen, int64_t delta,
                int64_t *result, char num[32], size_t *nlen)
{
    int64_t v = 0;
    DDP_FAIL_IF(e && ddp__kv_parse_int(e->value, e->vlen, &v) < 0, DDP_ERR_FORMAT,
                "add to key '%.*s': its value '%.40s' is not an integer", (int)klen, key,
                (const char *)e->value);
    DDP_FAIL_IF(__builtin_add_overflow(v, delta, &v), DDP_ERR_INVALID_ARG,
                "add to key '%.*s' overflows int64", (int)klen, key);
    int n = snprintf(num, 32, "%" PRId64, v);
    *nlen = n < 0 ? 0 : (size_t)n;
    *result = v;
    return 0;
}

int ddp__kv_cas_matches(const ddp__kv_entry *e, const void *expected, size_t elen)
{
    if (!e)
        return elen == 0;
    return e->vlen == elen && (elen == 0 || memcmp(e->value, expected, elen) == 0);
}
