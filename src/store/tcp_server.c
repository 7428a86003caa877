/* TCPStore server (the rank-0 side of torch.distributed's TCPStore; libuv/
 * redis ae.c style event loop): the loop and the connections.  The
 * requests and the key-value semantics are tcp_server_requests.c.
 *
 * One thread sleeps in epoll_wait on the listening socket, an eventfd (stop)
 * and every client.  Requests are handled one at a time per connection: a
 * connection's next request is read only after the answer to the previous
 * one is written, so a client that never reads cannot make the server
 * buffer without bound.  The loop's epoll timeout is the nearest deadline
 * of a parked request or of an authentication (ddp__ts_expire).  No
 * polling.  A connection that breaks the protocol is dropped with a logged
 * reason; the server keeps serving the others.  Wire format: tcp_proto.h
 * and docs/store.md.  Admitting connections, and the cap on those that
 * have not proven themselves, is tcp_server_accept.c. */
#include "store/tcp_server_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "base/sock.h"

#define AUTH_TIMEOUT_MAX_S 30.0
#define READ_CHUNK 65536
#define READS_PER_EVENT 64 /* then let other connections have a turn */

/* Markers for the two non-client fds in epoll. */
static char listen_marker, wake_marker;

/* ---- connections -------------------------------------------------------- */

void ddp__ts_drop(ddp__ts_server *s, conn *c, const char *why)
{
    if (!c->dead)
        DDP_WARN("%s: dropping client %s: %s", s->where, c->peer, why);
    c->dead = 1;
}

static void close_conn(ddp__ts_server *s, conn *c)
{
    if (c->fd >= 0) {
        epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
    }
    ddp__ts_stranger_remove(s, c);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->nconns--;
    ddp__ts_unpark(c);
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

/* Sends the answer built in c->out. */
void ddp__ts_answer(ddp__ts_server *s, conn *c, int op, int32_t status)
{
    if (ddp__ts_finish(&c->out, op, status) < 0) {
        ddp__ts_drop(s, c, "out of memory for an answer");
        return;
    }
    flush(s, c);
}

void ddp__ts_answer_error(ddp__ts_server *s, conn *c, int op, int32_t status, const char *fmt,
                          ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ddp__ts_begin(&c->out);
    ddp__ts_raw(&c->out, msg, n < 0 ? 0 : (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
    ddp__ts_answer(s, c, op, status);
}

/* ---- the loop ----------------------------------------------------------- */

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
            ddp__ts_drop(s, c, "sent more than one request without reading the answers");
            break;
        }
        if (c->in_len + (size_t)n > c->in_cap) {
            size_t cap = c->in_cap ? c->in_cap : READ_CHUNK;
            while (cap < c->in_len + (size_t)n)
                cap *= 2;
            uint8_t *b = realloc(c->in, cap);
            if (!b) {
                ddp__ts_drop(s, c, "out of memory for its request");
                break;
            }
            c->in = b;
            c->in_cap = cap;
        }
        memcpy(c->in + c->in_len, chunk, (size_t)n);
        c->in_len += (size_t)n;
        ddp__ts_process(s, c);
        /* A short read drained the socket: skip the recv that would only
         * say EAGAIN (epoll is level-triggered and reports what comes). */
        if ((size_t)n < sizeof chunk)
            break;
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
        int timeout_ms = ddp__ts_expire(s);
        int resume_ms = ddp__ts_admission_tick(s);
        if (resume_ms >= 0 && (timeout_ms < 0 || resume_ms < timeout_ms))
            timeout_ms = resume_ms;
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
                ddp__ts_accept(s);
            } else if (p == &wake_marker) {
                s->stop = 1;
            } else {
                conn *c = p;
                if (c->dead) /* dropped earlier in this batch */
                    continue;
                if (events[i].events & EPOLLOUT)
                    flush(s, c);
                if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
                    on_readable(s, c);
                if (!c->dead && !ddp__ts_pending_out(c))
                    ddp__ts_process(s, c); /* requests that waited for the answer to go */
            }
        }
        reap(s);
    }
    s->drops_logged_at = 0; /* the last drops are reported now, not a second later */
    ddp__ts_admission_tick(s);
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
    if (s->reserve_fd >= 0)
        close(s->reserve_fd);
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
    s->listen_fd = s->epfd = s->wake_fd = s->reserve_fd = -1;
    s->listen_marker = &listen_marker;
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
    DDP_TRY_OUT(ddp__ts_admission_init(s));
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
        if (c->fd >= 0)
            close(c->fd); /* our copy only: no EPOLL_CTL_DEL on the shared epoll */
        ddp__ts_unpark(c);
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
