/* libFuzzer harness: the TCPStore server's request handling
 * (src/store/tcp_server_requests.c over tcp_proto.c), driven the way the
 * event loop drives it (tcp_server.c: on_readable appends what recv gave
 * and calls ddp__ts_process; requests that waited for an answer to go are
 * processed after it), but without the thread and epoll: three
 * connections, each a socketpair whose far end the harness drains, share
 * one server and one key-value table, so parked GET/WAIT answered by
 * another connection's SET (notify) is reached too.
 *
 * Input: byte 0 picks the server (bit 0: it has a secret, so connections
 * start unauthenticated; bit 1: connection 0 starts authenticated anyway).
 * Then chunks: a byte h, then (h >> 2) + 1 bytes that connection h & 3
 * receives; h & 3 == 3 runs the deadline pass (ddp__ts_expire) instead
 * and takes no bytes.  The server nonce is all zeros and the secret is
 * "fuzz-secret", so that a seed can carry a valid AUTH (tests/fuzz/seeds.py). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"
#include "fuzz_util.h"
#include "store/tcp_server_internal.h"

#define NCONN 3
#define SECRET "fuzz-secret"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

static int peer_fd[NCONN];

static void drain(int fd)
{
    char sink[65536];
    while (recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0) {
    }
}

static conn *open_conn(ddp__ts_server *s, int i, int authed)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
        abort();
    int big = 4 << 20;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    conn *c = calloc(1, sizeof *c);
    if (!c)
        abort();
    c->fd = sv[0];
    peer_fd[i] = sv[1];
    snprintf(c->peer, sizeof c->peer, "fuzz-%d", i);
    c->authed = authed;
    c->auth_deadline = ddp_time_now() + s->auth_timeout_s;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    return c;
}

/* The loop's on_readable for one chunk (minus recv). */
static void receive(ddp__ts_server *s, conn *c, const uint8_t *p, size_t n)
{
    if (c->dead || n == 0)
        return;
    if (c->in_len + n > c->in_cap) {
        size_t cap = c->in_cap ? c->in_cap : 64;
        while (cap < c->in_len + n)
            cap *= 2;
        uint8_t *b = realloc(c->in, cap);
        if (!b)
            abort();
        c->in = b;
        c->in_cap = cap;
    }
    memcpy(c->in + c->in_len, p, n);
    c->in_len += n;
    ddp__ts_process(s, c);
}

/* After every event: drain what the server wrote, then let each live
 * connection process requests that waited for an answer (server_main). */
static void settle(ddp__ts_server *s, conn **cs)
{
    for (int i = 0; i < NCONN; i++)
        drain(peer_fd[i]);
    for (int i = 0; i < NCONN; i++)
        if (!cs[i]->dead && !ddp__ts_pending_out(cs[i]))
            ddp__ts_process(s, cs[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    ddp__ts_server *s = calloc(1, sizeof *s);
    if (!s)
        abort();
    s->listen_fd = s->wake_fd = -1;
    s->epfd = epoll_create1(EPOLL_CLOEXEC); /* set_want_out's epoll_ctl fails harmlessly */
    ddp__kv_init(&s->kv);
    snprintf(s->where, sizeof s->where, "fuzz store server");
    s->auth_timeout_s = 30;
    int with_secret = data[0] & 1;
    if (with_secret) {
        s->slen = strlen(SECRET);
        s->secret = malloc(s->slen);
        memcpy(s->secret, SECRET, s->slen);
    }
    conn *cs[NCONN];
    for (int i = NCONN - 1; i >= 0; i--)
        cs[i] = open_conn(s, i, !with_secret || (i == 0 && (data[0] & 2)));
    size_t pos = 1;
    while (pos < size) {
        unsigned h = data[pos++];
        if ((h & 3) == 3) {
            (void)ddp__ts_expire(s);
        } else {
            size_t n = (h >> 2) + 1;
            if (n > size - pos)
                n = size - pos;
            receive(s, cs[h & 3], data + pos, n);
            pos += n;
        }
        settle(s, cs);
    }
    /* Tear down as close_conn does (the loop's reap). */
    while (s->conns) {
        conn *c = s->conns;
        s->conns = c->next;
        ddp__ts_unpark(c);
        close(c->fd);
        free(c->in);
        free(c->out.buf);
        free(c);
    }
    for (int i = 0; i < NCONN; i++)
        close(peer_fd[i]);
    ddp__kv_free(&s->kv);
    free(s->secret);
    close(s->epfd);
    free(s);
    return 0;
}
