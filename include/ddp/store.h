/* libddp rendezvous stores: a small key-value service that the ranks of a
 * job use to find each other (torch.distributed's Store, gloo's rendezvous).
 *
 * Every blocking call waits at most the store's timeout (default 300 s,
 * ddp_store_set_timeout) and fails with DDP_ERR_TIMEOUT naming the keys it
 * waited for.  Keys are NUL-terminated strings; values are byte strings.
 */
#ifndef DDP_STORE_H
#define DDP_STORE_H

#include "ddp/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ddp_store ddp_store_t;

#define DDP_STORE_DEFAULT_TIMEOUT_S 300.0

/* FileStore over PATH (file://PATH): for processes on one host or a shared
 * file system; safe under concurrent access; world_size members, the last one
 * to destroy its handle removes the file (world_size 0: never removed).  A
 * file that is not a FileStore, or is corrupt, is DDP_ERR_FORMAT.  Caller
 * destroys *out. */
DDP_API int ddp_store_file_create(const char *path, int world_size, ddp_store_t **out);

/* TCPStore (tcp://HOST:PORT): the server (is_server, usually rank 0) runs
 * in a thread of this handle and listens on HOST only (use "0.0.0.0" to
 * listen everywhere); port 0 picks a free port (see ddp_store_tcp_port).
 * world_size is informational (the server does not wait for the others).
 * Clients connect with retries until timeout_s passes, which also becomes
 * the handle's timeout.  With a secret in DDP_SECRET (or the file named by
 * DDP_SECRET_FILE) on both sides, the two prove it to each other before any
 * request (HMAC-SHA256 challenge-response); a wrong or missing secret is
 * DDP_ERR_AUTH.  Destroying the server's handle stops the server: calls in
 * progress on other handles fail at once with DDP_ERR_CONNECTION.  Caller
 * destroys *out. */
DDP_API int ddp_store_tcp_create(const char *host, int port, int is_server, int world_size,
                                 double timeout_s, ddp_store_t **out);
/* Port the TCPStore server listens on (after port 0). */
DDP_API int ddp_store_tcp_port(const ddp_store_t *store);

/* HashStore: an in-memory store for the threads of one process (ranks as
 * threads in tests, single-process runs).  Waits sleep on a condition
 * variable.  Caller destroys *out. */
DDP_API int ddp_store_hash_create(ddp_store_t **out);
/* Another handle (with its own timeout) on the same HashStore as store;
 * the table lives until its last handle is destroyed.  Caller destroys
 * *out. */
DDP_API int ddp_store_hash_attach(ddp_store_t *store, ddp_store_t **out);

/* PrefixStore: every key of the view becomes "PREFIX/key" in base.  Borrows
 * base, which must outlive the view.  Caller destroys *out. */
DDP_API int ddp_store_prefix_create(const char *prefix, ddp_store_t *base, ddp_store_t **out);

/* Sets key to value (len bytes), replacing any earlier value. */
DDP_API int ddp_store_set(ddp_store_t *store, const char *key, const void *value, size_t len);
/* Waits until key exists, then returns a malloc'ed copy of its value in
 * *value (caller frees with free()) and its length in *len.  A NUL byte
 * follows the value (not counted in *len), so text can be used as a C
 * string. */
DDP_API int ddp_store_get(ddp_store_t *store, const char *key, void **value, size_t *len);
/* Atomically adds delta to the integer stored at key (0 if absent) and
 * returns the new value in *result (may be NULL).  The value is kept as
 * decimal text ("42"), as torch does; a non-integer value is
 * DDP_ERR_FORMAT. */
DDP_API int ddp_store_add(ddp_store_t *store, const char *key, int64_t delta, int64_t *result);
/* Atomically: if key's value equals expected (or key is absent and
 * expected_len is 0), set it to desired.  Returns the value now stored in
 * *actual (malloc'ed, NUL after the bytes, caller frees), or NULL when the
 * key is absent (unlike torch, which then returns expected).  actual may be
 * NULL to skip. */
DDP_API int ddp_store_compare_set(ddp_store_t *store, const char *key, const void *expected,
                                  size_t expected_len, const void *desired, size_t desired_len,
                                  void **actual, size_t *actual_len);
/* Waits until all n keys exist, at most timeout_s (<0: the store's timeout). */
DDP_API int ddp_store_wait(ddp_store_t *store, const char *const *keys, size_t n, double timeout_s);
/* Non-blocking: *exists = 1 when every key exists. */
DDP_API int ddp_store_check(ddp_store_t *store, const char *const *keys, size_t n, int *exists);
/* Deletes key; *deleted (may be NULL) tells whether it existed. */
DDP_API int ddp_store_delete_key(ddp_store_t *store, const char *key, int *deleted);
/* Number of keys in the store (a prefix view counts its base's keys). */
DDP_API int ddp_store_num_keys(ddp_store_t *store, int64_t *n);
/* Default timeout of blocking calls on this handle, in seconds. */
DDP_API void ddp_store_set_timeout(ddp_store_t *store, double timeout_s);
DDP_API double ddp_store_timeout(const ddp_store_t *store);
/* Closes the handle and frees it; NULL is a no-op.  A handle belongs to
 * the process that created it: in a forked child every call fails with
 * DDP_ERR_STATE, and destroy only releases the child's copy. */
DDP_API void ddp_store_destroy(ddp_store_t *store);

/* ---- init-method URLs (torch.distributed's init_method) ----------------- */

enum ddp_init_kind { DDP_INIT_FILE = 1, DDP_INIT_TCP = 2, DDP_INIT_ENV = 3 };

/* A parsed init-method URL.  rank and world_size are -1 unless the query
 * gives them (?rank=R&world_size=N). */
typedef struct ddp_init_url {
    int kind;         /* enum ddp_init_kind */
    char path[4096];  /* file://: the absolute path, percent-decoded */
    char host[256];   /* tcp://: host name or address (IPv6 without brackets) */
    int port;         /* tcp://: 1..65535 */
    int rank, world_size;
} ddp_init_url;

/* Parses file:///abs/path, tcp://HOST:PORT (IPv4, host name or [IPv6]) and
 * env://, each with an optional ?rank=R&world_size=N query.  Malformed
 * input (no or unknown scheme, empty or relative path, missing host or
 * port, port out of range, unknown or repeated parameters, garbage) fails
 * with DDP_ERR_INVALID_ARG and a message quoting the URL. */
DDP_API int ddp_init_url_parse(const char *url, ddp_init_url *out);

/* What env:// reads: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK.
 * Absent variables are "" / -1; a malformed one is an error naming it. */
typedef struct ddp_init_env {
    char master_addr[256];
    int master_port, rank, world_size, local_rank;
} ddp_init_env;
DDP_API int ddp_init_env_read(ddp_init_env *out);

/* Creates the rendezvous store of an init method: file:// opens a FileStore
 * on PATH for world_size members; tcp://HOST:PORT and env:// (MASTER_ADDR,
 * MASTER_PORT) make rank 0 the TCPStore server, listening on HOST only, and
 * the others its clients (env DDP_STORE_BIND, e.g. "0.0.0.0", makes rank 0
 * listen there instead).  rank and world_size: >= 0 to give them, -1 to take
 * them from the URL query or, for env://, from RANK and WORLD_SIZE; given
 * both ways they must agree.  timeout_s < 0: DDP_STORE_DEFAULT_TIMEOUT_S;
 * it bounds the connection and becomes the store's timeout.  The job's id
 * comes from TORCHELASTIC_RUN_ID (set by ddprun and torchrun; unset: no id):
 * a rank refuses, with DDP_ERR_EXISTS at once, a TCPStore server or a
 * FileStore with a live member of another id, and a FileStore whose members
 * are all gone (a failed run's) is emptied and reused (docs/store.md).  The
 * resolved rank and world size go to *rank_out and *world_size_out (each
 * may be NULL).  Caller destroys *out. */
DDP_API int ddp_store_from_url(const char *url, int rank, int world_size, double timeout_s,
                               ddp_store_t **out, int *rank_out, int *world_size_out);

#ifdef __cplusplus
}
#endif
#endif
