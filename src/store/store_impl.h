/* The private store interface: a struct of function pointers that every
 * store (file, tcp, prefix) implements, with thin dispatchers in store.c
 * (gloo's rendezvous::Store, libuv's transport vtables).
 *
 * The dispatchers check arguments (NULL handles, key and value sizes) and
 * resolve the default timeout, so implementations see valid input: keys are
 * NUL-terminated, 1..DDP__STORE_MAX_KEY bytes; values at most
 * DDP__STORE_MAX_VALUE bytes; timeouts >= 0; out-pointers non-NULL. */
#ifndef DDP_STORE_IMPL_H
#define DDP_STORE_IMPL_H

#include "base/time.h"
#include "ddp/store.h"

#define DDP__STORE_MAX_KEY 4096
#define DDP__STORE_MAX_VALUE (64u << 20)
#define DDP__STORE_MAX_KEYS 65536 /* keys in one wait/check */
#define DDP__STORE_MAX_JOB_ID 128 /* bytes of a job id (TORCHELASTIC_RUN_ID) */

typedef struct ddp__store_ops {
    int (*set)(ddp_store_t *s, const char *key, const void *value, size_t len);
    /* Waits up to timeout_s; *value is malloc'ed (a NUL follows the bytes). */
    int (*get)(ddp_store_t *s, const char *key, double timeout_s, void **value, size_t *len);
    int (*add)(ddp_store_t *s, const char *key, int64_t delta, int64_t *result);
    /* *actual: malloc'ed current value, or NULL when the key is absent. */
    int (*compare_set)(ddp_store_t *s, const char *key, const void *expected, size_t elen,
                       const void *desired, size_t dlen, void **actual, size_t *alen);
    int (*wait)(ddp_store_t *s, const char *const *keys, size_t n, double timeout_s);
    int (*check)(ddp_store_t *s, const char *const *keys, size_t n, int *exists);
    int (*delete_key)(ddp_store_t *s, const char *key, int *deleted);
    int (*num_keys)(ddp_store_t *s, int64_t *n);
    /* Closes and frees.  In a forked child (ddp__store_foreign), only
     * releases this process's copies: no server stop, no membership change. */
    void (*destroy)(ddp_store_t *s);
} ddp__store_ops;

/* Every store starts with this header. */
struct ddp_store {
    const ddp__store_ops *ops;
    double timeout_s;
    int pid;               /* the process that created the handle (for messages) */
    unsigned fork_epoch;   /* forks seen when it was made: a fork's child may not use it */
    char desc[160]; /* "file store /tmp/x", "tcp store 10.0.0.1:29500": for messages */
};

/* Fills the common header (timeout = DDP_STORE_DEFAULT_TIMEOUT_S). */
void ddp__store_init(ddp_store_t *s, const ddp__store_ops *ops, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* 1 when the handle was inherited through fork (owned by the parent). */
int ddp__store_foreign(const ddp_store_t *s);

/* Formats the timeout message of a wait: "<desc>: waited 1.0 s for key 'a'
 * (of 'a', 'b')", listing the keys still missing.  present[i] (may be NULL)
 * tells which keys were there at the end.  Returns DDP_ERR_TIMEOUT. */
int ddp__store_timeout_error(const ddp_store_t *s, const char *const *keys, size_t n,
                             const int *present, double timeout_s);

/* Names a job in a message: "id 'X'" or "no job id"; as ours, "this job's
 * id is 'X'" or "this job has no id".  id[0..n), not NUL-terminated. */
void ddp__job_words(char *out, size_t len, const char *id, size_t n, int ours);

/* ddp_store_file_create for a rendezvous of the job job_id ("" for none;
 * at most DDP__STORE_MAX_JOB_ID bytes): fails at once (DDP_ERR_EXISTS) when
 * a live member of another job holds the file, and empties a file whose
 * members have all left or died (a warning says so).  NULL: neither. */
int ddp__store_file_open(const char *path, int world_size, const char *job_id,
                         ddp_store_t **out);

/* ddp_store_tcp_create with the server (is_server) listening on
 * listen_host instead of host (NULL: host); clients still use host.
 * job_id (at most DDP__STORE_MAX_JOB_ID bytes; "" for none) names the job:
 * the server tells it to every client, and a client refuses a server of
 * another job (DDP_ERR_EXISTS) without sending it anything.  NULL: the
 * server names no job, the client accepts any. */
int ddp__store_tcp_open(const char *host, const char *listen_host, int port, int is_server,
                        int world_size, double timeout_s, const char *job_id,
                        ddp_store_t **out);

#endif
