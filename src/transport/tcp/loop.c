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

static void update_events(tcp *t, peer *p)
{
    if (p->fd < 0)
        return;
    uint32_t ev = EPOLLRDHUP | (p->m.rx != DDP__RX_HELD ? EPOLLIN : 0u) |
                  (p->want_out ? EPOLLOUT : 0u);
    if (ev == p->ev)
        return;
    struct epoll_event e = {.events = ev, .data.ptr = p};
    if (epoll_ctl(t->epfd, EPOLL_CTL_MOD, p->fd, &e) == 0)
        p->ev = ev;
}

/* ------------------------------------------------------------------ */
/* Failure (the engine's hooks)                                         */
/* ------------------------------------------------------------------ */

static tcp *tcp_of(ddp__match *m) { return (tcp *)((uint8_t *)m - offsetof(tcp, m)); }

/* A peer out of service: its socket is closed. */
static void conn_down(ddp__match *m, ddp__match_peer *mp)
{
    peer *p = (peer *)mp;
    if (p->fd >= 0) {
        epoll_ctl(tcp_of(m)->epfd, EPOLL_CTL_DEL, p->fd, NULL);
        close(p->fd);
        p->fd = -1;
    }
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
    double deadline = ddp_time_now() + 0.5;
    ddp__req *r = p->m.sq_head;
    if (r && (p->tx_hdr_off > 0 || r->done > 0)) {
        size_t left = r->len - r->done;
        if (left > (8u << 20) ||
            raw_write(p->fd, p->tx_hdr + p->tx_hdr_off, HDR_LEN - p->tx_hdr_off, deadline) < 0)
            return;
        while (left > 0) {
            size_t k = left < sizeof zeros ? left : sizeof zeros;
            if (raw_write(p->fd, zeros, k, deadline) < 0)
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
    (void)raw_write(p->fd, frame, HDR_LEN + len, deadline);
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
        update_events(t, p);
    return 0;
}

/* After a recv that moved nothing: 1 to retry, 0 to stop (would block or
 * the peer is gone). */
static int rx_stalled(tcp *t, peer *p, ssize_t n)
{
    int err = errno;
    if (n < 0 && err == EINTR)
        return 1;
    if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK))
        return 0;
    /* Which message it broke off in tells a crash from a lying header. */
    char in[96] = "";
    if (p->m.rx == DDP__RX_BODY)
        snprintf(in, sizeof in, ", %zu bytes into a %zu-byte message", p->m.rx_off,
                 p->m.rx_len);
    if (n == 0)
        ddp__match_down(&t->m, &p->m, DDP__PEER_DEAD,
                        "connection closed without goodbye (process died?)%s", in);
    else
        ddp__match_down(&t->m, &p->m, DDP__PEER_DEAD, "recv: %s%s", strerror(err), in);
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
    return recv(p->fd, p->stage + p->st_hi, STAGE_LEN - p->st_hi, MSG_DONTWAIT);
}

static void rx_progress(tcp *t, peer *p)
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
                    else if (!rx_stalled(t, p, n))
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
            else if (!rx_stalled(t, p, n))
                return;
            continue;
        }
        uint8_t *dst = ddp__match_dst(mp);
        size_t need = mp->rx_cap - mp->rx_off;
        if (need == 0) {
            if (mp->rx_off < mp->rx_len) { /* an unexpected buffer grows with its bytes */
                if (ddp__match_grow(&t->m, mp) < 0)
                    return;
                continue;
            }
            ddp__match_done(&t->m, mp);
            if (p->st_hi == p->st_lo)
                return; /* epoll says when more comes: saves a recv that would fail */
            continue;
        }
        if (avail) {
            size_t k = avail < need ? avail : need;
            memcpy(dst + mp->rx_off, p->stage + p->st_lo, k);
            p->st_lo += k;
            mp->rx_off += k;
            continue;
        }
        /* Small remainders go through the stage, which also picks up the
         * next header; large ones straight into place. */
        ssize_t n = need < STAGE_LEN / 2 ? fill_stage(p)
                                         : recv(p->fd, dst + mp->rx_off, need, MSG_DONTWAIT);
        if (n > 0) {
            if (need < STAGE_LEN / 2)
                p->st_hi += (size_t)n;
            else
                mp->rx_off += (size_t)n;
        } else if (!rx_stalled(t, p, n)) {
            return;
        }
    }
}

/* ------------------------------------------------------------------ */
/* Send side                                                            */
/* ------------------------------------------------------------------ */

static void tx_progress(tcp *t, peer *p)
{
    ddp__match_peer *mp = &p->m;
    while (mp->sq_head && mp->state == DDP__PEER_LIVE) {
        ddp__req *r = mp->sq_head;
        struct iovec iov[2];
        int cnt = 0;
        if (p->tx_hdr_off < HDR_LEN)
            iov[cnt++] = (struct iovec){p->tx_hdr + p->tx_hdr_off, HDR_LEN - p->tx_hdr_off};
        if (r->done < r->len)
            iov[cnt++] = (struct iovec){(uint8_t *)r->buf + r->done, r->len - r->done};
        ssize_t n = 0;
        if (cnt > 0) {
            struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
            n = sendmsg(p->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n < 0) {
                if (errno == EINTR)
                    continue;
                if (errno == EAGAIN || errno == EWOULDBLOCK) {
                    p->want_out = 1;
                    update_events(t, p);
                    return;
                }
                /* A peer that gave up sent ABORT (its reason) before closing:
                 * read it, so that the error names the cause, not the pipe. */
                int err = errno;
                rx_progress(t, p);
                ddp__match_down(&t->m, mp, DDP__PEER_DEAD, "send: %s", strerror(err));
                return;
            }
        }
        size_t k = (size_t)n, h = HDR_LEN - p->tx_hdr_off;
        if (h > k)
            h = k;
        p->tx_hdr_off += h;
        r->done += k - h;
        if (p->tx_hdr_off == HDR_LEN && r->done == r->len) {
            r->status = 1;
            mp->sq_head = r->next;
            if (!mp->sq_head)
                mp->sq_tail = NULL;
            r->next = NULL;
            if (mp->sq_head) {
                build_header(p->tx_hdr, OP_DATA, mp->sq_head->tag, mp->sq_head->len);
                p->tx_hdr_off = 0;
            }
        }
    }
    if (p->want_out) {
        p->want_out = 0;
        update_events(t, p);
    }
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
    build_header(p->tx_hdr, OP_DATA, r->tag, r->len);
    p->tx_hdr_off = 0;
    tx_progress(t, p); /* eager: most small sends finish here */
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
        update_events(t, &t->peers[r->peer]);
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
            peer *p = evs[i].data.ptr;
            uint32_t ev = evs[i].events;
            if (p->m.state != DDP__PEER_LIVE)
                continue;
            if (ev & EPOLLOUT)
                tx_progress(t, p);
            /* A closed or failed socket with a held frame: read it all now,
             * to learn whether the peer said goodbye. */
            if ((ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) && p->m.rx == DDP__RX_HELD &&
                p->m.state == DDP__PEER_LIVE) {
                if (ddp__match_buffer(&t->m, &p->m) < 0)
                    continue;
                update_events(t, p);
            }
            if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
                rx_progress(t, p);
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

