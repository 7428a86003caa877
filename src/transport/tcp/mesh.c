/* The TCP transport's mesh: rendezvous, dial, accept and the handshake
 * (transport/handshake.h) when a group is created; goodbye (BYE) and
 * teardown when it is destroyed.  tcp/loop.c runs the connections. */
#include "transport/tcp/internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "base/rng.h"
#include "base/secret.h"
#include "base/sock.h"
#include "base/sha256.h"
#include "transport/accept.h"
#include "transport/handshake.h"
#include "transport/rendezvous.h"

/* Shuts a stream down for writing, then drains what is unread so that
 * close sends FIN, not RST (an RST could destroy our BYE before the peer
 * reads it). */
static void close_quietly(int fd)
{
    char sink[4096];
    shutdown(fd, SHUT_WR);
    while (recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0) {
    }
    close(fd);
}

void ddp__tcp_destroy(ddp__tp *tp)
{
    tcp *t = (tcp *)tp;
    if (!t)
        return;
    for (int r = 0; t->peers && r < t->base.size; r++) {
        peer *p = &t->peers[r];
        /* Goodbye, unless a frame is half-written (the stream is no longer
         * in step then, and the peer must see a failure). */
        int bye = p->conn[0].fd >= 0 && p->m.state == DDP__PEER_LIVE && !p->m.sq_head;
        if (bye) {
            uint8_t h[HDR_LEN];
            build_header(h, OP_BYE, 0, 0);
            (void)ddp__sock_send_all(p->conn[0].fd, h, HDR_LEN, ddp_time_now() + 1.0,
                                     p->m.what);
        }
        for (int s = 0; s < t->streams; s++) {
            int fd = p->conn[s].fd;
            if (fd >= 0 && bye)
                close_quietly(fd);
            else if (fd >= 0)
                close(fd);
        }
    }
    ddp__match_destroy(&t->m);
    if (t->epfd >= 0)
        close(t->epfd);
    free(t);
}

/* ------------------------------------------------------------------ */
/* Setup: rendezvous, connect, accept                                   */
/* ------------------------------------------------------------------ */

/* A decimal field within [lo, hi], digits only. */
static int field_int(const char *f, long lo, long hi, int *out)
{
    char *end;
    if (*f < '0' || *f > '9')
        return -1;
    long v = strtol(f, &end, 10);
    if (*end != '\0' || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

/* Record: "host port nonce streams" (docs/wire-format.md), exactly those
 * four fields. */
static int parse_record(const ddp__rdzv_rec *rec, int r, char *host, size_t hlen, int *port,
                        int *streams)
{
    char buf[300], tok[300];
    size_t n = rec->len < sizeof buf - 1 ? rec->len : sizeof buf - 1;
    memcpy(buf, rec->data, n);
    buf[n] = '\0';
    memcpy(tok, buf, n + 1);
    char *f[5] = {NULL}, *save = NULL;
    int k = 0;
    for (char *w = strtok_r(tok, " ", &save); w && k < 5; w = strtok_r(NULL, " ", &save))
        f[k++] = w;
    int ok = k == 4 && strlen(f[0]) < hlen && field_int(f[1], 1, 65535, port) == 0 &&
             strlen(f[2]) == 32 && strspn(f[2], "0123456789abcdef") == 32 &&
             field_int(f[3], 1, MAX_STREAMS, streams) == 0;
    DDP_FAIL_IF(!ok, DDP_ERR_FORMAT,
                "malformed address record of rank %d: '%s' (want \"host port nonce "
                "connections\")",
                r, buf);
    snprintf(host, hlen, "%s", f[0]);
    return 0;
}

/* Every rank must open as many connections per pair: a difference is a
 * configuration error, named before anyone dials. */
static int check_streams(const tcp *t, const ddp__rdzv_rec *recs)
{
    for (int r = 0; r < t->base.size; r++) {
        char host[256];
        int port = 0, streams = 0;
        if (r == t->base.rank)
            continue;
        DDP_TRY(parse_record(&recs[r], r, host, sizeof host, &port, &streams));
        DDP_FAIL_IF(streams != t->streams, DDP_ERR_INVALID_ARG,
                    "rank %d has DDP_SOCKET_NUM_STREAMS=%d where rank %d has %d: every rank "
                    "must set the same",
                    r, streams, t->base.rank, t->streams);
    }
    return 0;
}

/* Takes fd as stream s of rank r (the peer is live once every stream is). */
static int add_stream(tcp *t, int r, int s, int fd)
{
    peer *p = &t->peers[r];
    DDP_TRY(ddp__sock_tune(fd, 1));
    uint32_t ev = s == 0 ? EPOLLIN | EPOLLRDHUP : 0; /* a stripe stream reads when due */
    struct epoll_event e = {.events = ev, .data.u64 = ev_key(r, s)};
    if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, fd, &e) < 0)
        return DDP_ERROR_ERRNO(DDP_ERR_SYSTEM, errno, "epoll_ctl(ADD) for %s", p->m.what);
    p->conn[s].fd = fd;
    p->conn[s].ev = ev;
    if (s == t->streams - 1)
        p->m.state = DDP__PEER_LIVE;
    return 0;
}

static int connect_up(tcp *t, const ddp__hs_ctx *hs, const ddp__rdzv_rec *recs, double deadline)
{
    for (int r = t->base.rank + 1; r < t->base.size; r++) {
        char host[256];
        int port = 0, streams = 0;
        DDP_TRY(parse_record(&recs[r], r, host, sizeof host, &port, &streams));
        peer *p = &t->peers[r];
        snprintf(p->m.what, sizeof p->m.what, "rank %d (%s:%d)", r, host, port);
        for (int s = 0; s < t->streams; s++) {
            int fd = -1;
            int rc = ddp__sock_connect(host, port, deadline, p->m.what, &fd);
            if (rc == 0)
                rc = ddp__hs_client(fd, hs, r, s, deadline, p->m.what);
            if (rc == 0)
                rc = add_stream(t, r, s, fd);
            if (rc < 0) {
                if (fd >= 0 && p->conn[s].fd != fd)
                    close(fd);
                return ddp__error_context(rc, "rank %d connecting to rank %d", t->base.rank, r);
            }
        }
    }
    return 0;
}

/* Accepts every lower rank (their handshakes run concurrently, so that
 * strangers on the port delay nobody: transport/accept.c). */
static int accept_down(tcp *t, const ddp__hs_ctx *hs, int lfd, double deadline,
                       double timeout_s)
{
    int rc = 0, rank = t->base.rank, ns = t->streams;
    if (rank == 0)
        return 0;
    int *fds = calloc((size_t)rank * (size_t)ns, sizeof *fds);
    char(*addrs)[DDP__ACCEPT_ADDR] = calloc((size_t)rank, sizeof *addrs);
    DDP_FAIL_OUT(!fds || !addrs, DDP_ERR_NOMEM, "out of memory");
    DDP_TRY_OUT(ddp__hs_accept(lfd, hs, deadline, timeout_s, fds, addrs));
    for (int r = 0; r < rank; r++) {
        snprintf(t->peers[r].m.what, sizeof t->peers[r].m.what, "rank %d (%s)", r, addrs[r]);
        for (int s = 0; s < ns; s++) {
            int fd = fds[r * ns + s];
            if (rc == 0)
                rc = add_stream(t, r, s, fd);
            if (t->peers[r].conn[s].fd != fd)
                close(fd); /* not handed over: add_stream failed here or before */
        }
    }
out:
    free(fds);
    free(addrs);
    return rc;
}

int ddp__tcp_create(ddp_store_t *store, const char *prefix, int rank, int size,
                    double timeout_s, ddp__tp **out)
{
    int rc = 0, lfd = -1;
    tcp *t = NULL;
    uint8_t *secret = NULL;
    size_t secret_len = 0;
    ddp__rdzv_rec *recs = NULL;
    *out = NULL;
    DDP_TRY(ddp__rdzv_check_rank(rank, size));
    double deadline = ddp_time_now() + timeout_s;

    t = calloc(1, sizeof *t);
    DDP_FAIL_OUT(!t, DDP_ERR_NOMEM, "out of memory");
    t->base.vt = &ddp__tcp_vtable;
    t->base.rank = rank;
    t->base.size = size;
    t->epfd = -1;
    double spin_us = 0; /* default 20 us: src/base/env.c */
    DDP_TRY_OUT(ddp__env_usec("DDP_TCP_SPIN_US", &spin_us));
    t->spin_max = spin_us * 1e-6;
    t->spin_s = t->spin_max;
    DDP_TRY_OUT(ddp__env_int("DDP_SOCKET_NUM_STREAMS", &t->streams)); /* 1 to MAX_STREAMS */
    DDP_TRY_OUT(ddp__match_init(&t->m, &ddp__tcp_match_ops, rank, size, sizeof(peer)));
    t->peers = t->m.peers;
    for (int r = 0; r < size; r++) {
        peer *p = &t->peers[r];
        for (int s = 0; s < MAX_STREAMS; s++)
            p->conn[s].fd = -1;
        if (r != rank) { /* until add_peer */
            p->m.state = DDP__PEER_DEAD;
            snprintf(p->m.why, sizeof p->m.why, "rank %d: not connected", r);
        }
    }
    t->epfd = epoll_create1(EPOLL_CLOEXEC);
    DDP_FAIL_OUT(t->epfd < 0, DDP_ERR_SYSTEM, "epoll_create1: %s", strerror(errno));
    DDP_TRY_OUT(ddp__secret_load(&secret, &secret_len));

    /* Phase 1: listen, publish "host port nonce", gather everyone's. */
    char host[256], rec[400];
    int port = 0;
    uint8_t nonce[16];
    DDP_TRY_OUT(ddp__sock_local_host(host, sizeof host));
    if (size > 1)
        DDP_TRY_OUT(ddp__sock_listen(host, 0, SOMAXCONN, &lfd, &port)); /* room for strangers */
    DDP_TRY_OUT(ddp__random_bytes(nonce, sizeof nonce));
    int n = snprintf(rec, sizeof rec, "%s %d ", host, port);
    for (int i = 0; i < 16; i++)
        n += snprintf(rec + n, sizeof rec - (size_t)n, "%02x", nonce[i]);
    n += snprintf(rec + n, sizeof rec - (size_t)n, " %d", t->streams);
    recs = calloc((size_t)size, sizeof *recs);
    DDP_FAIL_OUT(!recs, DDP_ERR_NOMEM, "out of memory");
    DDP_TRY_OUT(ddp__rdzv_exchange(store, prefix, rank, size, rec, (size_t)n, timeout_s, recs));

    /* The group's identity: a digest of every record (each has a fresh
     * nonce), so connections from another job or group never match. */
    DDP_TRY_OUT(check_streams(t, recs));
    ddp__hs_ctx hs = {.rank = rank,
                      .size = size,
                      .streams = t->streams,
                      .secret = secret,
                      .secret_len = secret_len};
    ddp__sha256_ctx sc;
    ddp__sha256_init(&sc);
    ddp__sha256_update(&sc, prefix, strlen(prefix) + 1);
    for (int r = 0; r < size; r++) {
        uint8_t l[8];
        put64(l, recs[r].len);
        ddp__sha256_update(&sc, l, sizeof l);
        ddp__sha256_update(&sc, recs[r].data, recs[r].len);
    }
    ddp__sha256_final(&sc, hs.group_id);

    /* Phase 2: dial every higher rank, then accept every lower one. */
    DDP_TRY_OUT(connect_up(t, &hs, recs, deadline));
    DDP_TRY_OUT(accept_down(t, &hs, lfd, deadline, timeout_s));
    *out = &t->base;
    t = NULL;
out:
    if (lfd >= 0)
        close(lfd);
    if (recs)
        ddp__rdzv_free(recs, size);
    free(recs);
    if (secret) {
        memset(secret, 0, secret_len);
        free(secret);
    }
    ddp__tcp_destroy(t ? &t->base : NULL);
    return rc;
}

int ddp__tcp_debug_stats(ddp__tp *tp, ddp__tcp_stats *out)
{
    if (!tp || tp->vt != &ddp__tcp_vtable)
        return -1;
    *out = ((tcp *)tp)->m.stats;
    return 0;
}

int ddp__tcp_debug_streams(ddp__tp *tp, int *streams, uint64_t *striped_rx)
{
    if (!tp || tp->vt != &ddp__tcp_vtable)
        return -1;
    *streams = ((tcp *)tp)->streams;
    *striped_rx = ((tcp *)tp)->striped_rx;
    return 0;
}

int ddp__tcp_debug_stream_fd(ddp__tp *tp, int rank, int stream)
{
    tcp *t = (tcp *)tp;
    if (!tp || tp->vt != &ddp__tcp_vtable || rank < 0 || rank >= t->base.size || stream < 0 ||
        stream >= t->streams)
        return -1;
    return t->peers[rank].conn[stream].fd;
}

int ddp__tcp_debug_fd(ddp__tp *tp, int rank) { return ddp__tcp_debug_stream_fd(tp, rank, 0); }
