/* TCPStore client, and the handle that also owns the server (rank 0), as in
 * torch.distributed's TCPStore: every handle, the server's included, talks
 * to the server over one TCP connection with one request in flight.
 *
 * Blocking requests (get, wait) carry their timeout to the server, which
 * answers at the deadline with which keys were there; the client waits
 * that long plus a grace period, so a dead or stuck server still gives an
 * error.  After any I/O or protocol error the connection is closed and the
 * handle reports the first error on every later call: answers could no
 * longer be matched to requests. */
#include "store/store_impl.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "base/rng.h"
#include "base/secret.h"
#include "base/sha256.h"
#include "base/sock.h"
#include "store/tcp_proto.h"
#include "store/tcp_server.h"

#define ANSWER_GRACE_S 2.0

typedef struct tcp_store {
    ddp_store_t base;
    pthread_mutex_t mu;
    int fd;
    int port;
    int world_size;
    ddp__ts_server *server; /* on the server's handle */
    uint8_t *secret; /* base/secret.h; NULL: none */
    size_t slen;
    int check_job;                          /* refuse a server of another job */
    char job_id[DDP__STORE_MAX_JOB_ID + 1]; /* ours ("" for none) */
    ddp__ts_writer req;
    uint8_t *ans;
    size_t ans_cap;
    char broken[600]; /* why the connection was closed */
} tcp_store;

static const char *op_name(int op)
{
    static const char *names[] = {"?", "hello", "auth", "set", "get", "add", "compare_set",
                                  "wait", "check", "delete_key", "num_keys"};
    return op > 0 && op < DDP__TS_OP_END ? names[op] : "?";
}

/* Closes the connection after an error, keeping the message for later calls. */
static int broken(tcp_store *ts, int rc)
{
    if (ts->fd >= 0) {
        close(ts->fd);
        ts->fd = -1;
        snprintf(ts->broken, sizeof ts->broken, "%s", ddp_last_error());
    }
    return rc;
}

/* Receives one answer to op into ts->ans: header checked, payload whole.
 * The first recv takes the header and a small payload together. */
static int receive(tcp_store *ts, int op, double deadline, ddp__ts_header *h, const char *what)
{
    uint8_t first[4096];
    size_t have = 0, got = 0;
    while (have < DDP__TS_HEADER) {
        DDP_TRY(ddp__sock_recv_some(ts->fd, first + have, sizeof first - have, deadline, what,
                                    &got));
        have += got;
    }
    const char *why;
    uint32_t max = op == DDP__TS_HELLO || op == DDP__TS_AUTH ? DDP__TS_MAX_AUTH_PAYLOAD
                                                             : DDP__TS_MAX_PAYLOAD;
    if (ddp__ts_header_decode(first, max, h, &why) < 0)
        return DDP_ERROR(DDP_ERR_PROTOCOL, "%s: bad answer from the server: %s", what, why);
    DDP_FAIL_IF(h->opcode != op, DDP_ERR_PROTOCOL,
                "%s: the server answered '%s' to '%s'", what, op_name(h->opcode), op_name(op));
    size_t body = have - DDP__TS_HEADER;
    DDP_FAIL_IF(body > h->length, DDP_ERR_PROTOCOL,
                "%s: the server sent more than its answer (%zu bytes over)", what,
                body - h->length);
    if (h->length + 1 > ts->ans_cap) {
        uint8_t *b = realloc(ts->ans, h->length + 1);
        DDP_FAIL_IF(!b, DDP_ERR_NOMEM, "%s: out of memory for a %u-byte answer", what, h->length);
        ts->ans = b;
        ts->ans_cap = h->length + 1;
    }
    memcpy(ts->ans, first + DDP__TS_HEADER, body);
    DDP_TRY(ddp__sock_recv_all(ts->fd, ts->ans + body, h->length - body, deadline, what));
    ts->ans[h->length] = 0;
    return 0;
}

/* Sends the request built in ts->req and receives its answer; answer_wait_s
 * bounds the wait for the answer.  An error answer becomes the return code
 * with the server's message; the TIMEOUT answer of get/wait is left to the
 * caller (returned with h->status set, payload in ts->ans). */
static int rpc(tcp_store *ts, int op, const char *key, double answer_wait_s, ddp__ts_header *h)
{
    char what[400];
    if (key)
        snprintf(what, sizeof what, "%s: %s '%.100s'", ts->base.desc, op_name(op), key);
    else
        snprintf(what, sizeof what, "%s: %s", ts->base.desc, op_name(op));
    DDP_FAIL_IF(ts->fd < 0, DDP_ERR_CONNECTION,
                "%s: connection closed after an earlier error (%.300s)", what, ts->broken);
    int len = ddp__ts_finish(&ts->req, op, 0);
    DDP_FAIL_IF(len < 0, DDP_ERR_NOMEM, "%s: out of memory for the request", what);
    double now = ddp_time_now();
    int rc = ddp__sock_send_all(ts->fd, ts->req.buf, ts->req.len, now + ts->base.timeout_s, what);
    if (rc == 0)
        rc = receive(ts, op, now + answer_wait_s, h, what);
    if (rc < 0)
        return broken(ts, rc);
    if (h->status < 0 && !(h->status == DDP_ERR_TIMEOUT && (op == DDP__TS_GET || op == DDP__TS_WAIT)))
        return DDP_ERROR(h->status, "%s: %.*s", what, (int)h->length, (const char *)ts->ans);
    return 0;
}

static uint64_t timeout_ms(double timeout_s)
{
    double ms = ceil(timeout_s * 1000.0);
    return ms > 4e12 ? (uint64_t)4e12 : (uint64_t)ms;
}

/* Runs the body (which may hold commas) with the handle's lock held and a
 * fresh request buffer. */
#define LOCKED_RPC(ts, ...)                    \
    do {                                       \
        pthread_mutex_lock(&(ts)->mu);         \
        ddp__ts_begin(&(ts)->req);             \
        __VA_ARGS__;                           \
        pthread_mutex_unlock(&(ts)->mu);       \
    } while (0)

/* ---- operations --------------------------------------------------------- */

static int ts_set(ddp_store_t *s, const char *key, const void *value, size_t len)
{
    tcp_store *ts = (tcp_store *)s;
    ddp__ts_header h;
    int rc;
    LOCKED_RPC(ts, {
        ddp__ts_bytes(&ts->req, key, strlen(key));
        ddp__ts_bytes(&ts->req, value, len);
        rc = rpc(ts, DDP__TS_SET, key, ts->base.timeout_s, &h);
    });
    return rc;
}

/* The TIMEOUT answer of get/wait: one byte per key, present or not. */
static int wait_timeout(tcp_store *ts, const char *const *keys, size_t n, double timeout_s,
                        const ddp__ts_header *h)
{
    int *present = calloc(n, sizeof *present);
    for (size_t i = 0; present && i < n && i < h->length; i++)
        present[i] = ts->ans[i] != 0;
    int rc = ddp__store_timeout_error(&ts->base, keys, n, present, timeout_s);
    free(present);
    return rc;
}

static int ts_get(ddp_store_t *s, const char *key, double timeout_s, void **value, size_t *len)
{
    tcp_store *ts = (tcp_store *)s;
    ddp__ts_header h;
    int rc;
    LOCKED_RPC(ts, {
        ddp__ts_u64(&ts->req, timeout_ms(timeout_s));
        ddp__ts_bytes(&ts->req, key, strlen(key));
        rc = rpc(ts, DDP__TS_GET, key, timeout_s + ANSWER_GRACE_S, &h);
        if (rc == 0 && h.status == DDP_ERR_TIMEOUT) {
            rc = wait_timeout(ts, &key, 1, timeout_s, &h);
        } else if (rc == 0) {
            *value = malloc(h.length + 1);
            if (!*value) {
                rc = DDP_ERROR(DDP_ERR_NOMEM, "%s: out of memory for '%s'", s->desc, key);
            } else {
                memcpy(*value, ts->ans, h.length + 1);
                *len = h.length;
            }
        }
    });
    return rc;
}

static int ts_wait(ddp_store_t *s, const char *const *keys, size_t n, double timeout_s)
{
    tcp_store *ts = (tcp_store *)s;
    ddp__ts_header h;
    int rc;
    LOCKED_RPC(ts, {
        ddp__ts_u64(&ts->req, timeout_ms(timeout_s));
        ddp__ts_u32(&ts->req, (uint32_t)n);
        for (size_t i = 0; i < n; i++)
            ddp__ts_bytes(&ts->req, keys[i], strlen(keys[i]));
        rc = rpc(ts, DDP__TS_WAIT, keys[0], timeout_s + ANSWER_GRACE_S, &h);
        if (rc == 0 && h.status == DDP_ERR_TIMEOUT)
            rc = wait_timeout(ts, keys, n, timeout_s, &h);
    });
    return rc;
}

/* An rpc whose answer has a fixed size (a flag or an integer). */
static int rpc_fixed(tcp_store *ts, int op, const char *key, uint32_t size, ddp__ts_header *h)
{
    DDP_TRY(rpc(ts, op, key, ts->base.timeout_s, h));
    if (h->length == size)
        return 0;
    DDP_ERROR(DDP_ERR_PROTOCOL, "%s: %s: answer of %u bytes, expected %u", ts->base.desc,
              op_name(op), h->length, size);
    return broken(ts, DDP_ERR_PROTOCOL);
}

/* The u64 at the start of the answer. */
static uint64_t answer_u64(const tcp_store *ts)
{
    ddp__ts_reader r = {ts->ans, 8, 0, 0};
    return ddp__ts_get_u64(&r);
}

static int ts_add(ddp_store_t *s, const char *key, int64_t delta, int64_t *result)
{
    tcp_store *ts = (tcp_store *)s;
    ddp__ts_header h;
    int rc;
    LOCKED_RPC(ts, {
        ddp__ts_u64(&ts->req, (uint64_t)delta);
        ddp__ts_bytes(&ts->req, key, strlen(key));
        rc = rpc_fixed(ts, DDP__TS_ADD, key, 8, &h);
        if (rc == 0)
            *result = (int64_t)answer_u64(ts);
    });
    return rc;
}

static int ts_compare_set(ddp_store_t *s, const char *key, const void *expected, size_t elen,
                          const void *desired, size_t dlen, void **actual, size_t *alen)
{
    tcp_store *ts = (tcp_store *)s;
    ddp__ts_header h;
    int rc;
    LOCKED_RPC(ts, {
        ddp__ts_bytes(&ts->req, key, strlen(key));
        ddp__ts_bytes(&ts->req, expected, elen);
        ddp__ts_bytes(&ts->req, desired, dlen);
        rc = rpc(ts, DDP__TS_CAS, key, ts->base.timeout_s, &h);
        if (rc == 0 && h.length < 1) {
            DDP_ERROR(DDP_ERR_PROTOCOL, "%s: compare_set: empty answer", s->desc);
            rc = broken(ts, DDP_ERR_PROTOCOL);
        }
        if (rc == 0 && ts->ans[0]) {
            *actual = malloc(h.length);
            if (!*actual) {
                rc = DDP_ERROR(DDP_ERR_NOMEM, "%s: out of memory for '%s'", s->desc, key);
            } else {
                memcpy(*actual, ts->ans + 1, h.length); /* with the NUL after the bytes */
                *alen = h.length - 1;
            }
        }
    });
    return rc;
}

static int ts_check(ddp_store_t *s, const char *const *keys, size_t n, int *exists)
{
    tcp_store *ts = (tcp_store *)s;
    ddp__ts_header h;
    int rc;
    LOCKED_RPC(ts, {
        ddp__ts_u32(&ts->req, (uint32_t)n);
        for (size_t i = 0; i < n; i++)
            ddp__ts_bytes(&ts->req, keys[i], strlen(keys[i]));
        rc = rpc_fixed(ts, DDP__TS_CHECK, keys[0], 1, &h);
        if (rc == 0)
            *exists = ts->ans[0] != 0;
    });
    return rc;
}

static int ts_delete_key(ddp_store_t *s, const char *key, int *deleted)
{
    tcp_store *ts = (tcp_store *)s;
    ddp__ts_header h;
    int rc;
    LOCKED_RPC(ts, {
        ddp__ts_bytes(&ts->req, key, strlen(key));
        rc = rpc_fixed(ts, DDP__TS_DELETE, key, 1, &h);
        if (rc == 0)
            *deleted = ts->ans[0] != 0;
    });
    return rc;
}

static int ts_num_keys(ddp_store_t *s, int64_t *n)
{
    tcp_store *ts = (tcp_store *)s;
    ddp__ts_header h;
    int rc;
    LOCKED_RPC(ts, {
        rc = rpc_fixed(ts, DDP__TS_NUM_KEYS, NULL, 8, &h);
        if (rc == 0)
            *n = (int64_t)answer_u64(ts);
    });
    return rc;
}

static void ts_destroy(ddp_store_t *s)
{
    tcp_store *ts = (tcp_store *)s;
    if (ts->fd >= 0)
        close(ts->fd);
    /* Clients still connected see their connection closed and fail fast.
     * In a forked child the server thread is the parent's: leave it be. */
    if (ddp__store_foreign(s))
        ddp__ts_server_abandon(ts->server);
    else
        ddp__ts_server_stop(ts->server);
    pthread_mutex_destroy(&ts->mu);
    if (ts->secret) {
        memset(ts->secret, 0, ts->slen);
        free(ts->secret);
    }
    free(ts->req.buf);
    free(ts->ans);
    free(ts);
}

static const ddp__store_ops tcp_ops = {
    .set = ts_set,
    .get = ts_get,
    .add = ts_add,
    .compare_set = ts_compare_set,
    .wait = ts_wait,
    .check = ts_check,
    .delete_key = ts_delete_key,
    .num_keys = ts_num_keys,
    .destroy = ts_destroy,
};

/* ---- connecting ------------------------------------------------------------ */

/* A server of another job: this rank must not touch its store (it would
 * claim a rank that is taken, or overwrite a record of the running job),
 * and its user must learn why.  Their id is id[0..n) (NULL: none). */
static int check_job(const tcp_store *ts, const uint8_t *id, size_t n)
{
    if (!id)
        n = 0;
    if (n == strlen(ts->job_id) && (n == 0 || memcmp(id, ts->job_id, n) == 0))
        return 0;
    char a[DDP__STORE_MAX_JOB_ID + 40], b[DDP__STORE_MAX_JOB_ID + 40];
    ddp__job_words(a, sizeof a, (const char *)id, n, 0);
    ddp__job_words(b, sizeof b, ts->job_id, strlen(ts->job_id), 1);
    return DDP_ERROR(DDP_ERR_EXISTS,
                     "%s: address in use by another job (%s; %s): a different job holds this "
                     "store, not joining it; give each job its own port, and every rank of "
                     "one job the same TORCHELASTIC_RUN_ID",
                     ts->base.desc, a, b);
}

/* Without a secret the server counts a connection as a stranger, which a
 * flood of newer connections may push out, until its first whole request:
 * one now (num_keys, one round trip) so this handle is never the one. */
static int first_request(tcp_store *ts, double deadline)
{
    const char *what = ts->base.desc;
    ddp__ts_header h;
    ddp__ts_begin(&ts->req);
    DDP_FAIL_IF(ddp__ts_finish(&ts->req, DDP__TS_NUM_KEYS, 0) < 0, DDP_ERR_NOMEM,
                "%s: out of memory", what);
    DDP_TRY(ddp__sock_send_all(ts->fd, ts->req.buf, ts->req.len, deadline, what));
    DDP_TRY(receive(ts, DDP__TS_NUM_KEYS, deadline, &h, what));
    DDP_FAIL_IF(h.status < 0 || h.length != 8, DDP_ERR_PROTOCOL,
                "%s: bad answer to num_keys from the server", what);
    return 0;
}

/* HELLO from the server (its job), then (when it asks) the
 * challenge-response: each side proves it knows the secret without sending
 * it. */
static int handshake(tcp_store *ts, double deadline)
{
    const char *what = ts->base.desc;
    ddp__ts_header h;
    DDP_TRY(receive(ts, DDP__TS_HELLO, deadline, &h, what));
    ddp__ts_reader r = {ts->ans, h.length, 0, 0};
    int auth = ddp__ts_get_u8(&r);
    const uint8_t *sn = ddp__ts_get_raw(&r, DDP__TS_NONCE);
    size_t idlen = 0;
    const uint8_t *id =
        sn && r.pos < r.len ? ddp__ts_get_bytes(&r, DDP__STORE_MAX_JOB_ID, &idlen) : NULL;
    DDP_FAIL_IF(!sn || r.err || r.pos != r.len, DDP_ERR_PROTOCOL,
                "%s: malformed hello from the server", what);
    if (ts->check_job)
        DDP_TRY(check_job(ts, id, idlen));
    uint8_t snonce[DDP__TS_NONCE];
    memcpy(snonce, sn, sizeof snonce);
    DDP_FAIL_IF(auth && !ts->secret, DDP_ERR_AUTH,
                "%s: the server requires a shared secret: set DDP_SECRET or DDP_SECRET_FILE",
                what);
    DDP_FAIL_IF(!auth && ts->secret, DDP_ERR_AUTH,
                "%s: a shared secret is set here (DDP_SECRET/DDP_SECRET_FILE) but the server "
                "does not ask for one: refusing an unauthenticated server",
                what);
    if (!auth)
        return first_request(ts, deadline);
    uint8_t cnonce[DDP__TS_NONCE], mac[32];
    DDP_TRY(ddp__random_bytes(cnonce, sizeof cnonce));
    ddp__ts_auth_mac(ts->secret, ts->slen, 0, snonce, cnonce, mac);
    ddp__ts_begin(&ts->req);
    ddp__ts_raw(&ts->req, cnonce, sizeof cnonce);
    ddp__ts_raw(&ts->req, mac, sizeof mac);
    DDP_FAIL_IF(ddp__ts_finish(&ts->req, DDP__TS_AUTH, 0) < 0, DDP_ERR_NOMEM, "%s: out of memory",
                what);
    DDP_TRY(ddp__sock_send_all(ts->fd, ts->req.buf, ts->req.len, deadline, what));
    DDP_TRY(receive(ts, DDP__TS_AUTH, deadline, &h, what));
    DDP_FAIL_IF(h.status < 0, DDP_ERR_AUTH, "%s: the server rejected our shared secret (%.*s)",
                what, (int)h.length, (const char *)ts->ans);
    ddp__ts_auth_mac(ts->secret, ts->slen, 1, snonce, cnonce, mac);
    DDP_FAIL_IF(h.length != 32 || !ddp__ct_equal(mac, ts->ans, 32), DDP_ERR_AUTH,
                "%s: the server does not know the shared secret", what);
    return 0;
}

/* Connects and shakes hands.  A connection closed before the handshake is
 * done is retried until the deadline: a server flooded by strangers drops
 * the oldest connections that have not proven themselves
 * (tcp_server_accept.c), and a real client that lost that race comes back
 * as the newest one. */
static int connect_and_handshake(tcp_store *ts, const char *host, double deadline)
{
    for (int attempt = 0;; attempt++) {
        DDP_TRY(ddp__sock_connect(host, ts->port, deadline, ts->base.desc, &ts->fd));
        int rc = handshake(ts, deadline);
        double pause = attempt < 20 ? 0.005 * (attempt + 1) : 0.1;
        if (rc != DDP_ERR_CONNECTION || ddp_time_now() + pause >= deadline)
            return rc;
        DDP_DEBUG("%s: connection closed during the handshake (%s); again", ts->base.desc,
                  ddp_last_error());
        close(ts->fd);
        ts->fd = -1;
        struct timespec t = {0, (long)(pause * 1e9)};
        nanosleep(&t, NULL);
    }
}

int ddp_store_tcp_create(const char *host, int port, int is_server, int world_size,
                         double timeout_s, ddp_store_t **out)
{
    return ddp__store_tcp_open(host, NULL, port, is_server, world_size, timeout_s, NULL, out);
}

/* After the server could not listen on host:port: when a server of another
 * job answers there, that is the cause to report (its id), not the bind
 * error.  Returns rc, with the message replaced in that case. */
static int name_holder(int rc, const char *host, int port, const char *job_id)
{
    if (!job_id || port == 0)
        return rc;
    char why[1024];
    snprintf(why, sizeof why, "%s", ddp_last_error());
    ddp_store_t *probe = NULL;
    int prc = ddp__store_tcp_open(host, NULL, port, 0, 0, 1.0, job_id, &probe);
    ddp_store_destroy(probe);
    if (prc == DDP_ERR_EXISTS)
        return ddp__error_context(prc, "cannot listen");
    ddp__error_restore(why);
    return rc;
}

int ddp__store_tcp_open(const char *host, const char *listen_host, int port, int is_server,
                        int world_size, double timeout_s, const char *job_id,
                        ddp_store_t **out)
{
    DDP_FAIL_IF(!out, DDP_ERR_INVALID_ARG, "ddp_store_tcp_create: out is NULL");
    *out = NULL;
    DDP_FAIL_IF(!host || !*host, DDP_ERR_INVALID_ARG, "tcp store: empty host");
    DDP_FAIL_IF(strlen(host) > 255, DDP_ERR_INVALID_ARG, "tcp store: host name over 255 bytes");
    DDP_FAIL_IF(port < 0 || port > 65535 || (port == 0 && !is_server), DDP_ERR_INVALID_ARG,
                "tcp store %s: port %d out of range (1-65535%s)", host, port,
                is_server ? ", or 0 for any free port" : "");
    DDP_FAIL_IF(world_size < 0, DDP_ERR_INVALID_ARG, "tcp store %s: world size %d is negative",
                host, world_size);
    DDP_FAIL_IF(!(timeout_s >= 0), DDP_ERR_INVALID_ARG, "tcp store %s: timeout %g s", host,
                timeout_s);
    DDP_FAIL_IF(job_id && strlen(job_id) > DDP__STORE_MAX_JOB_ID, DDP_ERR_INVALID_ARG,
                "tcp store %s: job id '%.40s...' longer than %d bytes", host, job_id,
                DDP__STORE_MAX_JOB_ID);
    tcp_store *ts = calloc(1, sizeof *ts);
    DDP_FAIL_IF(!ts, DDP_ERR_NOMEM, "tcp store: out of memory");
    pthread_mutex_init(&ts->mu, NULL);
    ts->fd = -1;
    ts->port = port;
    ts->world_size = world_size;
    ts->check_job = job_id != NULL;
    snprintf(ts->job_id, sizeof ts->job_id, "%s", job_id ? job_id : "");
    char hp[300];
    ddp__sock_hostport(host, port, hp, sizeof hp);
    ddp__store_init(&ts->base, &tcp_ops, "tcp store %s", hp);
    ts->base.timeout_s = timeout_s;
    double deadline = ddp_time_now() + timeout_s;
    int rc = 0;
    DDP_TRY_OUT(ddp__secret_load(&ts->secret, &ts->slen));
    const char *connect_host = host;
    if (is_server) {
        if (!listen_host || !*listen_host)
            listen_host = host;
        rc = ddp__ts_server_start(listen_host, port, ts->secret, ts->slen, job_id, timeout_s,
                                  &ts->server, &ts->port);
        if (rc < 0) {
            rc = name_holder(rc, host, port, job_id);
            goto out;
        }
        /* The server's own handle connects where it listens; listening
         * everywhere, it goes over loopback. */
        connect_host = listen_host;
        if (strcmp(listen_host, "0.0.0.0") == 0)
            connect_host = "127.0.0.1";
        else if (strcmp(listen_host, "::") == 0)
            connect_host = "::1";
        ddp__sock_hostport(host, ts->port, hp, sizeof hp);
        ddp__store_init(&ts->base, &tcp_ops, "tcp store %s", hp);
        ts->base.timeout_s = timeout_s;
    }
    DDP_TRY_OUT(connect_and_handshake(ts, connect_host, deadline));
    *out = &ts->base;
out:
    if (rc < 0)
        ts_destroy(&ts->base);
    return rc;
}

int ddp_store_tcp_port(const ddp_store_t *store)
{
    DDP_FAIL_IF(!store || store->ops != &tcp_ops, DDP_ERR_INVALID_ARG,
                "ddp_store_tcp_port: not a tcp store");
    return ((const tcp_store *)store)->port;
}
