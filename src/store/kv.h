/* A small string-keyed hash map of byte values: the in-memory state of a
 * store (the FileStore's cache of its log, the TCPStore server's table).
 * Chained buckets, FNV-1a hashing, doubling at load factor 1.  Keys and
 * values are copied in; the map owns them. */
#ifndef DDP_STORE_KV_H
#define DDP_STORE_KV_H

#include <stddef.h>
#include <stdint.h>

typedef struct ddp__kv_entry {
    struct ddp__kv_entry *next;
    uint64_t hash;
    size_t klen, vlen;
    char *key;     /* klen bytes + NUL */
    uint8_t *value; /* vlen bytes (+ NUL, so numbers parse in place) */
} ddp__kv_entry;

typedef struct ddp__kv {
    ddp__kv_entry **buckets;
    size_t nbuckets, count;
    size_t bytes; /* sum of klen + vlen over entries */
} ddp__kv;

void ddp__kv_init(ddp__kv *kv);
void ddp__kv_free(ddp__kv *kv);
ddp__kv_entry *ddp__kv_find(const ddp__kv *kv, const char *key, size_t klen);
/* Copies key and value; returns 0 or DDP_ERR_NOMEM (map unchanged). */
int ddp__kv_set(ddp__kv *kv, const char *key, size_t klen, const void *value, size_t vlen);
/* Returns 1 when the key existed (and is now gone), 0 when absent. */
int ddp__kv_delete(ddp__kv *kv, const char *key, size_t klen);
/* Calls fn on every entry (in no particular order) until fn returns < 0. */
int ddp__kv_foreach(const ddp__kv *kv, int (*fn)(const ddp__kv_entry *e, void *arg), void *arg);

/* Parses a whole decimal int64 value (what add stores); 0 or DDP_ERR_FORMAT. */
int ddp__kv_parse_int(const void *value, size_t vlen, int64_t *out);

/* The stores' shared semantics of add: the value of entry e (NULL: absent,
 * counts as 0) plus delta in *result, and as decimal text in num (*nlen
 * bytes, NUL-terminated).  Fails, leaving a message naming the key, with
 * DDP_ERR_FORMAT when e holds no integer and DDP_ERR_INVALID_ARG on
 * overflow. */
int ddp__kv_add(const ddp__kv_entry *e, const char *key, size_t klen, int64_t delta,
                int64_t *result, char num[32], size_t *nlen);
/* compare_set's rule: 1 when desired replaces entry e, that is when e holds
 * expected, or is absent (NULL) and expected is empty. */
int ddp__kv_cas_matches(const ddp__kv_entry *e, const void *expected, size_t elen);

#endif
