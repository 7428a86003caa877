/* The TCP transport's frames and progress engine (tcp/internal.h; the
 * connections are set up in tcp/mesh.c; the layout of frames is
 * docs/wire-format.md).
 *
 * The receive side of each connection is a small state machine (header,
 * body, held) whose matching runs in the engine (transport/match.h): a
 * header arrives through a 4 KiB staging buffer (so that a small message
 * costs one recv), then the body goes straight into the buffer of the
 * matching posted receive.  A frame that nobody waits for yet is copied
 * into an unexpected buffer when it is small or when a receive posted on
 * the same connection sits behind it; a large one is "held": the engine
 * stops reading that socket (TCP flow control backs the sender up) until a
 * receive for it is posted, so that a fast peer's next ring chunk never
 * costs a copy.
 *
 * Failure: end of stream without a BYE frame, a socket error or a malformed
 * frame marks the peer dead, fails its requests, and (for collectives) fails
 * every wait on the transport at once, naming the rank.  A peer that
 * destroys its group sends BYE first, so that its leaving is no error.  Any
 * error returned to the caller first sends ABORT (with the error's text) to
 * the live peers, so that their errors name the original cause, and drops
 * every request while the memory behind it is still valid. */
#include "transport/tcp/internal.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "base/sock.h"

static void set_events(tcp *t, int fd, uint32_t *cur, uint32_t ev, uint64_t key)
{
    if (fd < 0 || ev == *cur)
        return;
    struct epoll_event e = {.events = ev, .data.u64 = key};
    if (epoll_ctl(t->epfd, EPOLL_CTL_MOD, fd, &e) == 0)
        *cur = ev;
}

/* What each stream of p waits for: stream 0 reads unless its message is
 * held in the kernel or its share of a striped one is in (the other
 * streams bring the rest); a stripe stream reads while its share is due. */
void ddp__tcp_update_events(tcp *t, peer *p)
{
    conn *c0 = &p->conn[0];
    int idle0 = p->m.rx == DDP__RX_HELD || (p->rx_striped && c0->rx_off == c0->rx_hi);
    uint32_t ev = (p->rx_striped && idle0 ? 0u : EPOLLRDHUP) | (!idle0 ? EPOLLIN : 0u) |
                  (c0->want_out ? EPOLLOUT : 0u);
    set_events(t, c0->fd, &c0->ev, ev, ev_key(p->m.rank, 0));
    for (int s = 1; s < t->streams; s++) {
        conn *x = &p->conn[s];
        ev = (ddp__tcp_stripe_ready(p, x) ? EPOLLIN | EPOLLRDHUP : 0u) |
             (x->want_out ? EPOLLOUT : 0u);
        set_events(t, x->fd, &x->ev, ev, ev_key(p->m.rank, s));
    }
}

/* ------------------------------------------------------------------ */
/* Failure (the engine's hooks)                                         */
/* ------------------------------------------------------------------ */

static tcp *tcp_of(ddp__match *m) { return (tcp *)((uint8_t *)m - offsetof(tcp, m)); }

static void close_fd(tcp *t, int *fd)
{
    if (*fd >= 0) {
        epoll_ctl(t->epfd, EPOLL_CTL_DEL, *fd, NULL);
        close(*fd);
        *fd = -1;
    }
}

/* A peer out of service: its sockets are closed. */
static void conn_down(ddp__match *m, ddp__match_peer *mp)
{
    peer *p = (peer *)mp;
    tcp *t = tcp_of(m);
    for (int s = 0; s < t->streams; s++)
        close_fd(t, &p->conn[s].fd);
}

/* Writes all of buf before deadline, without touching the last error (the
 * abort path keeps the caller's message). 0 or -1. */
static int raw_write(int fd, const void *buf, size_t len, double deadline)
{
    size_t off = 0;
    while (off < len) {
        ssize_t n = send(fd, (const char *)buf + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return -1;
        double left = deadline - ddp_time_now();
        if (left <= 0)
            return -1;
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        (void)poll(&pf, 1, ddp__sock_poll_ms(left));
    }
    return 0;
}

/* Tells a live peer why this rank gives up (an ABORT frame), so that its
 * error names the cause rather than just "connection closed".  A frame
 * half-sent is completed with zeros first, to keep the stream in step. */
static void send_abort(peer *p, const char *why)
{
    static const uint8_t zeros[4096];
    double deadline = ddp_time_now() + ABORT_WAIT_S;
    ddp__req *r = p->m.sq_head;
    conn *c0 = &p->conn[0];
    /* (Stream 0's share whole: it is at a frame boundary, stripes or not.) */
    if (r && c0->tx_hdr_off > 0 && (c0->tx_hdr_off < HDR_LEN || c0->tx_off < c0->tx_hi)) {
        size_t left = c0->tx_hi - c0->tx_off;
        if (left > (8u << 20) ||
            raw_write(c0->fd, c0->tx_hdr + c0->tx_hdr_off, HDR_LEN - c0->tx_hdr_off, deadline) < 0)
            return;
        while (left > 0) {
            size_t k = left < sizeof zeros ? left : sizeof zeros;
            if (raw_write(c0->fd, zeros, k, deadline) < 0)
                return;
            left -= k;
        }
    }
    uint8_t frame[HDR_LEN + MAX_ABORT];
    size_t len = strlen(why);
    if (len > MAX_ABORT)
        len = MAX_ABORT;
    build_header(frame, OP_ABORT, 0, len);
    memcpy(frame + HDR_LEN, why, len);
    (void)raw_write(c0->fd, frame, HDR_LEN + len, deadline);
}

/* This rank gives up: every live peer is told why (the engine then
 * disconnects them and drops every request). */
static void give_up(ddp__match *m, const char *why)
{
    tcp *t = tcp_of(m);
    for (int r = 0; r < t->base.size; r++)
        if (r != t->base.rank && t->peers[r].m.state == DDP__PEER_LIVE)
            send_abort(&t->peers[r], why);
}

const ddp__match_ops ddp__tcp_match_ops = {
    .name = "tcp",
    .sep = ": ",
    .reason_max = 200,
    .aborted = "this rank gave up after an error",
    .grow = 1,
    .give_up = give_up,
    .down = conn_down,
};

/* ------------------------------------------------------------------ */
/* Receive side                                                         */
/* ------------------------------------------------------------------ */

static int parse_header(tcp *t, peer *p)
{
    const uint8_t *h = p->stage + p->st_lo;
    uint64_t w = get64(h), tag = get64(h + 8), len = get64(h + 16);
    uint32_t magic = (uint32_t)w;
    unsigned version = (unsigned)(w >> 32) & 0xff, op = (unsigned)(w >> 40) & 0xff;
    unsigned reserved = (unsigned)(w >> 48);
    p->st_lo += HDR_LEN;
    if (magic != FRAME_MAGIC || version != FRAME_VERSION || reserved != 0 ||
        (op != OP_DATA && op != OP_BYE && op != OP_ABORT) || len > MAX_FRAME ||
        (op == OP_BYE && len != 0) || (op == OP_ABORT && len > MAX_ABORT)) {
        ddp__match_down(&t->m, &p->m, DDP__PEER_DEAD,
                        "malformed frame (magic 0x%08x, version %u, opcode %u, length %" PRIu64
                        "); connection dropped",
                        magic, version, op, len);
        return -1;
    }
    if (op == OP_BYE) {
        ddp__match_down(&t->m, &p->m, DDP__PEER_LEFT,
                        "left the group (destroyed its process group)");
        return -1;
    }
    if (op == OP_ABORT) { /* rx_progress staged the whole reason */
        const char *why = (const char *)p->stage + p->st_lo;
        p->st_lo += (size_t)len;
        ddp__match_down(&t->m, &p->m, DDP__PEER_DEAD, "gave up: %.*s", (int)len, why);
        return -1;
    }
    if (ddp__match_arrive(&t->m, &p->m, tag, (size_t)len) < 0)
        return -1;
    if (p->m.rx == DDP__RX_HELD) /* left in the kernel: stop reading */
        ddp__tcp_update_events(t, p);
    else if (t->streams > 1)
        ddp__tcp_rx_setup(t, p);
    return 0;
}

/* Reads into the staging buffer (after moving what is left to its start). */
static ssize_t fill_stage(peer *p)
{
    if (p->st_lo > 0) {
        memmove(p->stage, p->stage + p->st_lo, p->st_hi - p->st_lo);
        p->st_hi -= p->st_lo;
        p->st_lo = 0;
    }
    return recv(p->conn[0].fd, p->stage + p->st_hi, STAGE_LEN - p->st_hi, MSG_DONTWAIT);
}

/* A stream broke while stream 0 was not being read: it waited for the
 * other streams' shares of a striped message, or sat between frames.  A
 * peer that gives up sends its reason (ABORT) on stream 0 before it closes
 * any stream, behind what is left of stream 0's share (which it completes
 * with zeros): look for it there, for at most ABORT_WAIT_S, so that the
 * error names the cause and not the stream that closed.  The share's bytes
 * are dropped (the message fails either way).  1 when the reason was found
 * (the peer is down with it). */
static int reason_on_stream0(tcp *t, peer *p)
{
    conn *c0 = &p->conn[0];
    size_t skip = 0;
    if (p->rx_striped)
        skip = c0->rx_hi - c0->rx_off;
    else if (p->m.rx != DDP__RX_HDR)
        return 0; /* in the middle of a frame: nowhere to look */
    double deadline = ddp_time_now() + ABORT_WAIT_S;
    for (;;) {
        size_t avail = p->st_hi - p->st_lo, k = skip < avail ? skip : avail;
        p->st_lo += k;
        skip -= k;
        avail -= k;
        if (skip == 0 && avail >= HDR_LEN) {
            const uint8_t *h = p->stage + p->st_lo;
            uint64_t w = get64(h), len = get64(h + 16);
            if (((w >> 40) & 0xff) != OP_ABORT || len > MAX_ABORT)
                return 0;
            if (avail >= HDR_LEN + len) {
                (void)parse_header(t, p); /* takes the peer down with the reason */
                return 1;
            }
        }
        ssize_t n = fill_stage(p);
        if (n > 0) {
            p->st_hi += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        double left = deadline - ddp_time_now();
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK) || left <= 0)
            return 0;
        struct pollfd pf = {.fd = c0->fd, .events = POLLIN};
        (void)poll(&pf, 1, ddp__sock_poll_ms(left));
    }
}

/* After a recv on stream (of p) that moved nothing: 1 to retry, 0 to stop
 * (would block or the peer is gone). */
int ddp__tcp_rx_stalled(tcp *t, peer *p, ssize_t n, int stream)
{
    int err = errno;
    if (n < 0 && err == EINTR)
        return 1;
    if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK))
        return 0;
    if ((stream > 0 || p->rx_striped) && reason_on_stream0(t, p))
        return 0;
    /* Which message it broke off in tells a crash from a lying header. */
    char in[128] = "";
    if (p->m.rx == DDP__RX_BODY)
        snprintf(in, sizeof in, ", %zu bytes into a %zu-byte message", p->m.rx_off,
                 p->m.rx_len);
    if (t->streams > 1)
        snprintf(in + strlen(in), sizeof in - strlen(in), " (connection %d of %d)", stream + 1,
                 t->streams);
    if (n == 0)
        ddp__match_down(&t->m, &p->m, DDP__PEER_DEAD,
                        "connection closed without goodbye (process died?)%s", in);
    else
        ddp__match_down(&t->m, &p->m, DDP__PEER_DEAD, "recv: %s%s", strerror(err), in);
    return 0;
}

void ddp__tcp_rx_progress(tcp *t, peer *p)
{
    ddp__match_peer *mp = &p->m;
    while (mp->state == DDP__PEER_LIVE && mp->rx != DDP__RX_HELD) {
        size_t avail = p->st_hi - p->st_lo;
        if (mp->rx == DDP__RX_HDR) {
            if (avail >= HDR_LEN) {
                const uint8_t *h = p->stage + p->st_lo;
                uint64_t w = get64(h), len = get64(h + 16);
                if (((w >> 40) & 0xff) == OP_ABORT && len <= MAX_ABORT && avail < HDR_LEN + len) {
                    ssize_t n = fill_stage(p); /* the reason must be whole */
                    if (n > 0)
                        p->st_hi += (size_t)n;
                    else if (!ddp__tcp_rx_stalled(t, p, n, 0))
                        return;
                    continue;
                }
                if (parse_header(t, p) < 0)
                    return;
                continue;
            }
            ssize_t n = fill_stage(p);
            if (n > 0)
                p->st_hi += (size_t)n;
            else if (!ddp__tcp_rx_stalled(t, p, n, 0))
                return;
            continue;
        }
        /* Stream 0's position: the message's, unless it is striped (then
         * rx_off counts the bytes of every stream). */
        size_t *pos = p->rx_striped ? &p->conn[0].rx_off : &mp->rx_off;
        size_t end = p->rx_striped ? p->conn[0].rx_hi : mp->rx_len;
        size_t cap = mp->rx_cap < end ? mp->rx_cap : end;
        uint8_t *dst = ddp__match_dst(mp);
        size_t need = cap - *pos;
        if (need == 0) {
            if (*pos < end) { /* an unexpected buffer grows with its bytes */
                if (ddp__match_grow(&t->m, mp) < 0)
                    return;
                continue;
            }
            if (mp->rx_off < mp->rx_len) { /* the other streams bring the rest */
                ddp__tcp_update_events(t, p);
                return;
            }
            if (p->rx_striped) {
                p->rx_striped = 0;
                ddp__tcp_update_events(t, p);
            }
            ddp__match_done(&t->m, mp);
            if (p->st_hi == p->st_lo)
                return; /* epoll says when more comes: saves a recv that would fail */
            continue;
        }
        size_t moved = 0;
        if (avail) {
            moved = avail < need ? avail : need;
            memcpy(dst + *pos, p->stage + p->st_lo, moved);
            p->st_lo += moved;
        } else {
            /* Small remainders go through the stage, which also picks up the
             * next header; large ones straight into place. */
            ssize_t n = need < STAGE_LEN / 2 ? fill_stage(p)
                                             : recv(p->conn[0].fd, dst + *pos, need, MSG_DONTWAIT);
            if (n <= 0) {
                if (!ddp__tcp_rx_stalled(t, p, n, 0))
                    return;
                continue;
            }
            if (need < STAGE_LEN / 2)
                p->st_hi += (size_t)n;
            else
                moved = (size_t)n;
        }
        *pos += moved;
        if (p->rx_striped)
            mp->rx_off += moved;
    }
}

/* ------------------------------------------------------------------ */
/* Send side                                                            */
/* ------------------------------------------------------------------ */

/* Sends what is left of hdr (from *hdr_off) and then of buf[*off, hi) on
 * fd, in one sendmsg where the socket takes it: 1 when all is sent, 0 when
 * the socket is full, -1 on an error (errno says which). */
int ddp__tcp_send_part(int fd, const uint8_t *hdr, size_t *hdr_off, const void *buf, size_t *off,
                       size_t hi)
{
    for (;;) {
        struct iovec iov[2];
        int cnt = 0;
        if (*hdr_off < HDR_LEN)
            iov[cnt++] = (struct iovec){(uint8_t *)hdr + *hdr_off, HDR_LEN - *hdr_off};
        if (*off < hi)
            iov[cnt++] = (struct iovec){(uint8_t *)buf + *off, hi - *off};
        if (cnt == 0)
            return 1;
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
        ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
        }
        size_t k = (size_t)n, h = HDR_LEN - *hdr_off;
        if (h > k)
            h = k;
        *hdr_off += h;
        *off += k - h;
    }
}

/* A send failed with err: a peer that gave up sent ABORT (its reason)
 * before closing; read it, so that the error names the cause, not the pipe. */
void ddp__tcp_tx_failed(tcp *t, peer *p, int err)
{
    ddp__tcp_rx_progress(t, p);
    ddp__match_down(&t->m, &p->m, DDP__PEER_DEAD, "send: %s", strerror(err));
}

void ddp__tcp_tx_progress(tcp *t, peer *p)
{
    ddp__match_peer *mp = &p->m;
    while (mp->sq_head && mp->state == DDP__PEER_LIVE) {
        ddp__req *r = mp->sq_head;
        conn *c0 = &p->conn[0];
        int rc = ddp__tcp_send_part(c0->fd, c0->tx_hdr, &c0->tx_hdr_off, r->buf, &c0->tx_off,
                                    c0->tx_hi);
        if (rc < 0) {
            ddp__tcp_tx_failed(t, p, errno);
            return;
        }
        c0->want_out = rc == 0;
        int busy = rc == 0;
        if (t->streams > 1 && ddp__tcp_tx_stripes(t, p, &busy) < 0)
            return;
        r->done = ddp__tcp_tx_done(t, p);
        if (busy) {
            ddp__tcp_update_events(t, p);
            return;
        }
        r->status = 1;
        mp->sq_head = r->next;
        if (!mp->sq_head)
            mp->sq_tail = NULL;
        r->next = NULL;
        if (mp->sq_head)
            ddp__tcp_tx_start(t, p);
    }
    ddp__tcp_update_events(t, p);
}

/* ------------------------------------------------------------------ */
/* The transport vtable                                                 */
/* ------------------------------------------------------------------ */

static int tcp_isend(ddp__tp *tp, ddp__req *r)
{
    tcp *t = (tcp *)tp;
    int first = ddp__match_isend(&t->m, r);
    if (first <= 0)
        return first;
    peer *p = &t->peers[r->peer];
    ddp__tcp_tx_start(t, p);
    ddp__tcp_tx_progress(t, p); /* eager: most small sends finish here */
    if (r->status < 0)
        return ddp__match_fail_all(&t->m, ddp__match_peer_error(&p->m));
    return 0;
}

static int tcp_irecv(ddp__tp *tp, ddp__req *r)
{
    tcp *t = (tcp *)tp;
    int held = r->peer >= 0 && r->peer < t->base.size && t->peers[r->peer].m.rx == DDP__RX_HELD;
    int rc = ddp__match_irecv(&t->m, r);
    if (rc == 0 && held) /* read the held frame now, into r or out of the way */
        ddp__tcp_rx_setup(t, &t->peers[r->peer]);
    return rc;
}

/* The spin pays when the peer runs on another core and answers within
 * microseconds; when it shares our core (or computes), every microsecond
 * spun delays it.  So: a wait that ended while spinning restores the full
 * budget; one that had to sleep anyway halves it, down to zero; at zero,
 * every 64th wait probes with the full budget again. */
static void adapt_spin(tcp *t, int polled_empty, int slept)
{
    if (slept) {
        t->spin_s = t->spin_s < 1e-6 ? 0 : t->spin_s / 2;
    } else if (polled_empty) {
        t->spin_s = t->spin_max;
    }
    if (t->spin_s == 0 && ++t->spin_skips % 64 == 0)
        t->spin_s = t->spin_max;
}

static int tcp_wait(ddp__tp *tp, ddp__req *const *reqs, int n, double deadline, int flags)
{
    tcp *t = (tcp *)tp;
    double start = ddp_time_now();
    int polled_empty = 0, slept = 0;
    struct epoll_event evs[64];
    for (;;) {
        int rc = ddp__match_poll(&t->m, reqs, n, flags);
        if (rc == 0)
            adapt_spin(t, polled_empty, slept);
        if (rc <= 0)
            return rc;
        double now = ddp_time_now();
        if (now >= deadline)
            return ddp__match_timeout(&t->m, reqs, n, now - start);
        /* Spin briefly (a reply often comes within microseconds), then sleep:
         * the compute threads need the cores. */
        int ms = 0;
        if (now - start >= t->spin_s) {
            ms = ddp__sock_poll_ms(deadline - now);
            slept = 1;
        }
        int nev = epoll_wait(t->epfd, evs, 64, ms);
        polled_empty |= nev == 0 && ms == 0;
        if (nev < 0) {
            if (errno == EINTR)
                continue;
            return ddp__match_fail_all(&t->m,
                                       DDP_ERROR_ERRNO(DDP_ERR_SYSTEM, errno, "epoll_wait"));
        }
        for (int i = 0; i < nev; i++) {
            uint64_t key = evs[i].data.u64;
            peer *p = &t->peers[key >> 8];
            int s = (int)(key & 0xff);
            uint32_t ev = evs[i].events;
            if (p->m.state != DDP__PEER_LIVE)
                continue;
            if (s > 0) {
                ddp__tcp_stripe_event(t, p, s, ev);
                continue;
            }
            if (ev & EPOLLOUT)
                ddp__tcp_tx_progress(t, p);
            /* A closed or failed socket with a held frame: read it all now,
             * to learn whether the peer said goodbye. */
            if ((ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) && p->m.rx == DDP__RX_HELD &&
                p->m.state == DDP__PEER_LIVE) {
                if (ddp__match_buffer(&t->m, &p->m) < 0)
                    continue;
                ddp__tcp_rx_setup(t, p);
            }
            /* Stream 0 waits for the stripes, but its socket failed. */
            if ((ev & (EPOLLHUP | EPOLLERR)) && p->rx_striped &&
                p->conn[0].rx_off == p->conn[0].rx_hi) {
                ddp__tcp_idle_broken(t, p, 0);
                continue;
            }
            if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
                ddp__tcp_rx_progress(t, p);
        }
    }
}

static void tcp_abort(ddp__tp *tp, int code, const char *why)
{
    (void)code;
    ddp__match_abort(&((tcp *)tp)->m, why);
}

const ddp__tp_vtable ddp__tcp_vtable = {
    .name = "tcp",
    .isend = tcp_isend,
    .irecv = tcp_irecv,
    .wait = tcp_wait,
    .abort = tcp_abort,
    .destroy = ddp__tcp_destroy,
};

