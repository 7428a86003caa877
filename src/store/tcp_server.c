/* TCPStore server (the rank-0 side of torch.distributed's TCPStore; libuv/
 * redis ae.c style event loop).
 *
 * One thread sleeps in epoll_wait on the listening socket, an eventfd (stop)
 * and every client.  Requests are handled one at a time per connection: a
 * connection's next request is read only after the answer to the previous
 * one is written, so a client that never reads cannot make the server
 * buffer without bound.  GET and WAIT on missing keys park the connection
 * with a deadline; every write to the table answers the parked requests
 * whose keys now all exist, and the loop's epoll timeout is the nearest
 * deadline, at which the request gets a TIMEOUT answer.  No polling.
 *
 * Anything that breaks the protocol (bad magic, unknown opcode, a length
 * over the limit, a malformed payload, a request before authentication)
 * drops that connection with a logged reason; the server keeps serving the
 * others.  Wire format: tcp_proto.h and docs/store.md. */
#include "store/tcp_server.h"

#include <errno.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "base/rng.h"
#include "base/sha256.h"
#include "store/kv.h"
#include "base/sock.h"
#include "store/tcp_proto.h"

#define MAX_CONNS 65536
#define AUTH_TIMEOUT_MAX_S 30.0
#define READ_CHUNK 65536
#define READS_PER_EVENT 64 /* then let other connections have a turn */
#define SHRINK_BYTES (1u << 20) /* buffers larger than this are freed when idle */

typedef struct conn {
    struct conn *prev, *next;
    int fd;
    char peer[64];
    int authed;
    int dead;          /* close after this loop iteration */
    int close_after;   /* close once the pending answer is written */
    int want_out;      /* EPOLLOUT registered */
    double auth_deadline;
    uint8_t nonce[DDP__TS_NONCE];
    uint8_t *in;
    size_t in_len, in_cap;
    ddp__ts_writer out;
    size_t out_off;
    /* A parked GET or WAIT. */
    int parked_op;
    char **keys;
    size_t nkeys;
    double deadline;
} conn;

struct ddp__ts_server {
    int listen_fd, epfd, wake_fd;
    pthread_t thread;
    char where[320];
    uint8_t *secret;
    size_t slen;
    char job_id[DDP__STORE_MAX_JOB_ID + 1]; /* told to every client in HELLO */
    ddp__kv kv;
    conn *conns;
    int nconns;
    int stop;
    double auth_timeout_s;
};

/* Markers for the two non-client fds in epoll. */
static char listen_marker, wake_marker;

/* ---- connections -------------------------------------------------------- */

static void drop(ddp__ts_server *s, conn *c, const char *why)
{
    if (!c->dead)
        DDP_WARN("%s: dropping client %s: %s", s->where, c->peer, why);
    c->dead = 1;
}

static void unpark(conn *c)
{
    for (size_t i = 0; i < c->nkeys; i++)
        free(c->keys[i]);
    free(c->keys);
    c->keys = NULL;
    c->nkeys = 0;
    c->parked_op = 0;
}

static void close_conn(ddp__ts_server *s, conn *c)
{
    epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->nconns--;
    unpark(c);
    free(c->in);
    free(c->out.buf);
    free(c);
}

static void set_want_out(ddp__ts_server *s, conn *c, int want)
{
    if (c->want_out == want)
        return;
    struct epoll_event ev = {.events = EPOLLIN | (want ? EPOLLOUT : 0), .data.ptr = c};
    epoll_ctl(s->epfd, EPOLL_CTL_MOD, c->fd, &ev);
    c->want_out = want;
}

/* Writes what the socket takes now; the rest waits for EPOLLOUT. */
static void flush(ddp__ts_server *s, conn *c)
{
    while (c->out_off < c->out.len) {
        ssize_t n = send(c->fd, c->out.buf + c->out_off, c->out.len - c->out_off, MSG_NOSIGNAL);
        if (n > 0) {
            c->out_off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            set_want_out(s, c, 1);
            return;
        }
        c->dead = 1; /* the client went away: nothing to report to anyone */
        return;
    }
    c->out.len = 0;
    c->out_off = 0;
    if (c->out.cap > SHRINK_BYTES) { /* after a big value: give the memory back */
        free(c->out.buf);
        c->out.buf = NULL;
        c->out.cap = 0;
    }
    set_want_out(s, c, 0);
    if (c->close_after)
        c->dead = 1;
}

static int pending_out(const conn *c) { return c->out.len > 0; }

/* Sends the answer built in c->out. */
static void answer(ddp__ts_server *s, conn *c, int op, int32_t status)
{
    if (ddp__ts_finish(&c->out, op, status) < 0) {
        drop(s, c, "out of memory for an answer");
        return;
    }
    flush(s, c);
}

__attribute__((format(printf, 5, 6)))
static void answer_error(ddp__ts_server *s, conn *c, int op, int32_t status, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ddp__ts_begin(&c->out);
    ddp__ts_raw(&c->out, msg, n < 0 ? 0 : (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
    answer(s, c, op, status);
}

/* ---- parked requests ---------------------------------------------------- */

static int all_present(ddp__ts_server *s, conn *c)
{
    for (size_t i = 0; i < c->nkeys; i++)
        if (!ddp__kv_find(&s->kv, c->keys[i], strlen(c->keys[i])))
            return 0;
    return 1;
}

/* Answers a GET or WAIT whose keys all exist. */
static void answer_ready(ddp__ts_server *s, conn *c, int op)
{
    ddp__ts_begin(&c->out);
    if (op == DDP__TS_GET) {
        ddp__kv_entry *e = ddp__kv_find(&s->kv, c->keys[0], strlen(c->keys[0]));
        ddp__ts_raw(&c->out, e->value, e->vlen);
    }
    answer(s, c, op, 0);
}

static void process(ddp__ts_server *s, conn *c);

/* After a write to the table: answer every parked request now satisfied. */
static void notify(ddp__ts_server *s)
{
    for (conn *c = s->conns; c; c = c->next) {
        if (!c->parked_op || c->dead || !all_present(s, c))
            continue;
        int op = c->parked_op;
        answer_ready(s, c, op);
        unpark(c);
        process(s, c);
    }
}

/* Answers parked requests past their deadline; closes connections that did
 * not authenticate in time.  Returns the epoll timeout in ms (-1: none). */
static int expire(ddp__ts_server *s)
{
    double now = ddp_time_now(), next = -1;
    for (conn *c = s->conns; c; c = c->next) {
        if (c->dead)
            continue;
        if (!c->authed) {
            if (now >= c->auth_deadline) {
                drop(s, c, "did not authenticate in time");
                continue;
            }
            if (next < 0 || c->auth_deadline < next)
                next = c->auth_deadline;
        }
        if (!c->parked_op)
            continue;
        if (now >= c->deadline) {
            /* The answer says which keys are there, so the client can name
             * the missing ones. */
            int op = c->parked_op;
            ddp__ts_begin(&c->out);
            for (size_t i = 0; i < c->nkeys; i++)
                ddp__ts_u8(&c->out, ddp__kv_find(&s->kv, c->keys[i], strlen(c->keys[i])) != NULL);
            unpark(c);
            answer(s, c, op, DDP_ERR_TIMEOUT);
            process(s, c);
        } else if (next < 0 || c->deadline < next) {
            next = c->deadline;
        }
    }
    if (next < 0)
        return -1;
    double ms = (next - now) * 1000.0 + 1.0;
    return ms > 3.6e6 ? 3600000 : (int)ms;
}

/* ---- requests ----------------------------------------------------------- */

/* Reads a key field: 1..MAX_KEY bytes, no NUL (keys are C strings). */
static const char *get_key(ddp__ts_reader *r, size_t *klen)
{
    const uint8_t *k = ddp__ts_get_bytes(r, DDP__STORE_MAX_KEY, klen);
    if (!k || *klen == 0 || memchr(k, 0, *klen)) {
        r->err = DDP_ERR_PROTOCOL;
        return NULL;
    }
    return (const char *)k;
}

static void park(ddp__ts_server *s, conn *c, int op, ddp__ts_reader *r, size_t n,
                 uint64_t timeout_ms)
{
    c->keys = calloc(n, sizeof *c->keys);
    if (!c->keys) {
        drop(s, c, "out of memory for a waiter");
        return;
    }
    c->nkeys = n;
    for (size_t i = 0; i < n; i++) {
        size_t klen;
        const char *k = get_key(r, &klen);
        if (!k) {
            unpark(c);
            drop(s, c, "malformed key in a wait");
            return;
        }
        c->keys[i] = strndup(k, klen);
        if (!c->keys[i]) {
            unpark(c);
            drop(s, c, "out of memory for a waiter");
            return;
        }
    }
    if (r->pos != r->len) {
        unpark(c);
        drop(s, c, "trailing bytes after a wait");
        return;
    }
    c->parked_op = op;
    c->deadline = ddp_time_now() + (double)(timeout_ms > 4000000000000ull ? 4000000000000ull : timeout_ms) / 1000.0;
    if (all_present(s, c)) {
        answer_ready(s, c, op);
        unpark(c);
    }
}

static void handle_auth(ddp__ts_server *s, conn *c, const ddp__ts_header *h, ddp__ts_reader *r)
{
    if (!s->secret || h->opcode != DDP__TS_AUTH) {
        drop(s, c, "request before authentication");
        return;
    }
    const uint8_t *cnonce = ddp__ts_get_raw(r, DDP__TS_NONCE);
    const uint8_t *mac = ddp__ts_get_raw(r, 32);
    if (!cnonce || !mac || r->pos != r->len) {
        drop(s, c, "malformed authentication message");
        return;
    }
    uint8_t want[32];
    ddp__ts_auth_mac(s->secret, s->slen, 0, c->nonce, cnonce, want);
    if (!ddp__ct_equal(want, mac, 32)) {
        DDP_WARN("%s: client %s: wrong secret, rejected", s->where, c->peer);
        c->close_after = 1;
        answer_error(s, c, DDP__TS_AUTH, DDP_ERR_AUTH, "wrong secret");
        return;
    }
    c->authed = 1;
    ddp__ts_auth_mac(s->secret, s->slen, 1, c->nonce, cnonce, want);
    ddp__ts_begin(&c->out);
    ddp__ts_raw(&c->out, want, 32);
    answer(s, c, DDP__TS_AUTH, 0);
}

static void handle(ddp__ts_server *s, conn *c, const ddp__ts_header *h, const uint8_t *payload)
{
    ddp__ts_reader r = {payload, h->length, 0, 0};
    if (!c->authed) {
        handle_auth(s, c, h, &r);
        return;
    }
    size_t klen = 0, vlen = 0, elen = 0;
    const char *key = NULL;
    const uint8_t *v = NULL, *e = NULL;
    ddp__kv_entry *ent;
    switch (h->opcode) {
    case DDP__TS_SET:
        key = get_key(&r, &klen);
        v = ddp__ts_get_bytes(&r, DDP__STORE_MAX_VALUE, &vlen);
        if (r.err || r.pos != r.len)
            break;
        if (ddp__kv_set(&s->kv, key, klen, v, vlen) < 0) {
            answer_error(s, c, h->opcode, DDP_ERR_NOMEM, "server out of memory");
            return;
        }
        ddp__ts_begin(&c->out);
        answer(s, c, h->opcode, 0);
        notify(s);
        return;
    case DDP__TS_GET: {
        uint64_t ms = ddp__ts_get_u64(&r);
        if (r.err)
            break;
        park(s, c, DDP__TS_GET, &r, 1, ms);
        return;
    }
    case DDP__TS_WAIT: {
        uint64_t ms = ddp__ts_get_u64(&r);
        uint32_t n = ddp__ts_get_u32(&r);
        if (r.err || n == 0 || n > DDP__STORE_MAX_KEYS)
            break;
        park(s, c, DDP__TS_WAIT, &r, n, ms);
        return;
    }
    case DDP__TS_ADD: {
        int64_t delta = (int64_t)ddp__ts_get_u64(&r), cur = 0;
        key = get_key(&r, &klen);
        if (r.err || r.pos != r.len)
            break;
        char num[32];
        size_t nlen = 0;
        int rc = ddp__kv_add(ddp__kv_find(&s->kv, key, klen), key, klen, delta, &cur, num, &nlen);
        if (rc < 0) {
            /* The client adds its own location: send the message without ours. */
            const char *msg = strstr(ddp_last_error(), ": ");
            answer_error(s, c, h->opcode, rc, "%s", msg ? msg + 2 : ddp_last_error());
            return;
        }
        if (ddp__kv_set(&s->kv, key, klen, num, nlen) < 0) {
            answer_error(s, c, h->opcode, DDP_ERR_NOMEM, "server out of memory");
            return;
        }
        ddp__ts_begin(&c->out);
        ddp__ts_u64(&c->out, (uint64_t)cur);
        answer(s, c, h->opcode, 0);
        notify(s);
        return;
    }
    case DDP__TS_CAS: {
        key = get_key(&r, &klen);
        e = ddp__ts_get_bytes(&r, DDP__STORE_MAX_VALUE, &elen);
        v = ddp__ts_get_bytes(&r, DDP__STORE_MAX_VALUE, &vlen);
        if (r.err || r.pos != r.len)
            break;
        ent = ddp__kv_find(&s->kv, key, klen);
        int swap = ddp__kv_cas_matches(ent, e, elen);
        if (swap) {
            if (ddp__kv_set(&s->kv, key, klen, v, vlen) < 0) {
                answer_error(s, c, h->opcode, DDP_ERR_NOMEM, "server out of memory");
                return;
            }
            ent = ddp__kv_find(&s->kv, key, klen);
        }
        ddp__ts_begin(&c->out);
        ddp__ts_u8(&c->out, ent != NULL);
        if (ent)
            ddp__ts_raw(&c->out, ent->value, ent->vlen);
        answer(s, c, h->opcode, 0);
        if (swap)
            notify(s);
        return;
    }
    case DDP__TS_CHECK: {
        uint32_t n = ddp__ts_get_u32(&r);
        if (r.err || n == 0 || n > DDP__STORE_MAX_KEYS)
            break;
        int all = 1;
        for (uint32_t i = 0; i < n && !r.err; i++) {
            key = get_key(&r, &klen);
            if (key && !ddp__kv_find(&s->kv, key, klen))
                all = 0;
        }
        if (r.err || r.pos != r.len)
            break;
        ddp__ts_begin(&c->out);
        ddp__ts_u8(&c->out, (uint8_t)all);
        answer(s, c, h->opcode, 0);
        return;
    }
    case DDP__TS_DELETE: {
        key = get_key(&r, &klen);
        if (r.err || r.pos != r.len)
            break;
        ddp__ts_begin(&c->out);
        ddp__ts_u8(&c->out, (uint8_t)ddp__kv_delete(&s->kv, key, klen));
        answer(s, c, h->opcode, 0);
        return;
    }
    case DDP__TS_NUM_KEYS:
        if (r.len != 0)
            break;
        ddp__ts_begin(&c->out);
        ddp__ts_u64(&c->out, s->kv.count);
        answer(s, c, h->opcode, 0);
        return;
    default:
        drop(s, c, "unexpected opcode after authentication");
        return;
    }
    drop(s, c, "malformed request payload");
}

/* Handles the complete requests buffered on c, one at a time. */
static void process(ddp__ts_server *s, conn *c)
{
    size_t pos = 0;
    while (!c->dead && !c->close_after && !c->parked_op && !pending_out(c) &&
           c->in_len - pos >= DDP__TS_HEADER) {
        ddp__ts_header h;
        const char *why;
        uint32_t max = c->authed ? DDP__TS_MAX_PAYLOAD : DDP__TS_MAX_AUTH_PAYLOAD;
        if (ddp__ts_header_decode(c->in + pos, max, &h, &why) < 0) {
            char msg[160];
            snprintf(msg, sizeof msg, "%s (opcode %u, length %u)", why, h.opcode, h.length);
            drop(s, c, msg);
            break;
        }
        if (c->in_len - pos - DDP__TS_HEADER < h.length)
            break; /* the rest of the payload is still on its way */
        handle(s, c, &h, c->in + pos + DDP__TS_HEADER);
        pos += DDP__TS_HEADER + h.length;
    }
    if (pos) {
        memmove(c->in, c->in + pos, c->in_len - pos);
        c->in_len -= pos;
    }
    if (c->in_len == 0 && c->in_cap > SHRINK_BYTES) {
        free(c->in);
        c->in = NULL;
        c->in_cap = 0;
    }
}

static void on_readable(ddp__ts_server *s, conn *c)
{
    uint8_t chunk[READ_CHUNK];
    for (int i = 0; i < READS_PER_EVENT && !c->dead; i++) {
        ssize_t n = recv(c->fd, chunk, sizeof chunk, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n <= 0) {
            if (n < 0)
                DDP_DEBUG("%s: client %s: recv: %s", s->where, c->peer, strerror(errno));
            else
                DDP_DEBUG("%s: client %s closed its connection", s->where, c->peer);
            c->dead = 1;
            break;
        }
        /* One request plus a header of the next is all a client may have
         * in flight; more means it is not waiting for answers. */
        if (c->in_len + (size_t)n > DDP__TS_MAX_PAYLOAD + 2 * DDP__TS_HEADER + READ_CHUNK) {
            drop(s, c, "sent more than one request without reading the answers");
            break;
        }
        if (c->in_len + (size_t)n > c->in_cap) {
            size_t cap = c->in_cap ? c->in_cap : READ_CHUNK;
            while (cap < c->in_len + (size_t)n)
                cap *= 2;
            uint8_t *b = realloc(c->in, cap);
            if (!b) {
                drop(s, c, "out of memory for its request");
                break;
            }
            c->in = b;
            c->in_cap = cap;
        }
        memcpy(c->in + c->in_len, chunk, (size_t)n);
        c->in_len += (size_t)n;
        process(s, c);
        /* A short read drained the socket: skip the recv that would only
         * say EAGAIN (epoll is level-triggered and reports what comes). */
        if ((size_t)n < sizeof chunk)
            break;
    }
}

static void on_accept(ddp__ts_server *s)
{
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(s->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) {
                DDP_WARN("%s: accept: %s", s->where, strerror(errno));
                /* Out of descriptors: pause so level-triggered epoll does
                 * not turn this into a busy loop. */
                struct timespec ts = {0, 10000000};
                nanosleep(&ts, NULL);
            }
            return;
        }
        char peer[64];
        ddp__sock_addr_str((struct sockaddr *)&ss, peer, sizeof peer);
        conn *c = s->nconns < MAX_CONNS ? calloc(1, sizeof *c) : NULL;
        if (!c) {
            DDP_WARN("%s: refusing client %s: %d connections open", s->where, peer, s->nconns);
            close(fd);
            continue;
        }
        c->fd = fd;
        snprintf(c->peer, sizeof c->peer, "%s", peer);
        c->authed = s->secret == NULL;
        c->auth_deadline = ddp_time_now() + s->auth_timeout_s;
        ddp__sock_set_nodelay(fd);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        if (ddp__random_bytes(c->nonce, sizeof c->nonce) < 0 ||
            epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
            DDP_WARN("%s: refusing client %s: %s", s->where, peer, ddp_last_error());
            close(fd);
            free(c);
            continue;
        }
        c->next = s->conns;
        if (s->conns)
            s->conns->prev = c;
        s->conns = c;
        s->nconns++;
        DDP_DEBUG("%s: client %s connected", s->where, peer);
        ddp__ts_begin(&c->out);
        ddp__ts_u8(&c->out, s->secret != NULL);
        ddp__ts_raw(&c->out, c->nonce, sizeof c->nonce);
        if (s->job_id[0]) /* optional: a server of no job sends the short HELLO */
            ddp__ts_bytes(&c->out, s->job_id, strlen(s->job_id));
        answer(s, c, DDP__TS_HELLO, 0);
    }
}

/* Closes the connections marked dead.  Only here, between batches of
 * events: an event later in a batch may name a connection dropped earlier. */
static void reap(ddp__ts_server *s)
{
    for (conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (c->dead)
            close_conn(s, c);
    }
}

static void *server_main(void *arg)
{
    ddp__ts_server *s = arg;
    struct epoll_event events[64];
    while (!s->stop) {
        int timeout_ms = expire(s);
        reap(s); /* expire may have dropped some */
        int n = epoll_wait(s->epfd, events, 64, timeout_ms);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            DDP_WARN("%s: epoll_wait: %s; server stops", s->where, strerror(errno));
            break;
        }
        for (int i = 0; i < n; i++) {
            void *p = events[i].data.ptr;
            if (p == &listen_marker) {
                on_accept(s);
            } else if (p == &wake_marker) {
                s->stop = 1;
            } else {
                conn *c = p;
                if (events[i].events & EPOLLOUT)
                    flush(s, c);
                if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
                    on_readable(s, c);
                if (!c->dead && !pending_out(c))
                    process(s, c); /* requests that waited for the answer to go */
            }
        }
        reap(s);
    }
    while (s->conns)
        close_conn(s, s->conns);
    return NULL;
}

static void free_server(ddp__ts_server *s)
{
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->epfd >= 0)
        close(s->epfd);
    if (s->wake_fd >= 0)
        close(s->wake_fd);
    ddp__kv_free(&s->kv);
    if (s->secret) {
        memset(s->secret, 0, s->slen);
        free(s->secret);
    }
    free(s);
}

int ddp__ts_server_start(const char *host, int port, const uint8_t *secret, size_t slen,
                         const char *job_id, double timeout_s, ddp__ts_server **out,
                         int *port_out)
{
    ddp__ts_server *s = calloc(1, sizeof *s);
    DDP_FAIL_IF(!s, DDP_ERR_NOMEM, "tcp store server: out of memory");
    s->auth_timeout_s = timeout_s < AUTH_TIMEOUT_MAX_S ? timeout_s : AUTH_TIMEOUT_MAX_S;
    s->listen_fd = s->epfd = s->wake_fd = -1;
    ddp__kv_init(&s->kv);
    snprintf(s->job_id, sizeof s->job_id, "%s", job_id ? job_id : "");
    int rc = 0;
    if (secret) {
        s->secret = malloc(slen);
        DDP_FAIL_OUT(!s->secret, DDP_ERR_NOMEM, "tcp store server: out of memory");
        memcpy(s->secret, secret, slen);
        s->slen = slen;
    }
    DDP_TRY_OUT(ddp__sock_listen(host, port, 1024, &s->listen_fd, port_out));
    char hp[300];
    ddp__sock_hostport(host, *port_out, hp, sizeof hp);
    snprintf(s->where, sizeof s->where, "tcp store server %s", hp);
    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    DDP_FAIL_OUT(s->epfd < 0, DDP_ERR_SYSTEM, "%s: epoll_create1: %s", s->where, strerror(errno));
    s->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    DDP_FAIL_OUT(s->wake_fd < 0, DDP_ERR_SYSTEM, "%s: eventfd: %s", s->where, strerror(errno));
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &listen_marker};
    DDP_FAIL_OUT(epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->listen_fd, &ev) < 0, DDP_ERR_SYSTEM,
                 "%s: epoll_ctl: %s", s->where, strerror(errno));
    ev.data.ptr = &wake_marker;
    DDP_FAIL_OUT(epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->wake_fd, &ev) < 0, DDP_ERR_SYSTEM,
                 "%s: epoll_ctl: %s", s->where, strerror(errno));
    int err = pthread_create(&s->thread, NULL, server_main, s);
    DDP_FAIL_OUT(err != 0, DDP_ERR_SYSTEM, "%s: pthread_create: %s", s->where, strerror(err));
    DDP_INFO("%s: listening", s->where);
    *out = s;
out:
    if (rc < 0)
        free_server(s);
    return rc;
}

void ddp__ts_server_abandon(ddp__ts_server *s)
{
    if (!s)
        return;
    while (s->conns) {
        conn *c = s->conns;
        s->conns = c->next;
        close(c->fd); /* our copy only: no EPOLL_CTL_DEL on the shared epoll */
        unpark(c);
        free(c->in);
        free(c->out.buf);
        free(c);
    }
    free_server(s);
}

void ddp__ts_server_stop(ddp__ts_server *s)
{
    if (!s)
        return;
    uint64_t one = 1;
    while (write(s->wake_fd, &one, sizeof one) < 0 && errno == EINTR)
        ;
    pthread_join(s->thread, NULL);
    free_server(s);
}
