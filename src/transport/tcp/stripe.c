/* Several connections per pair (DDP_SOCKET_NUM_STREAMS, gloo's idea):
 * a message of at least STRIPE_MIN bytes is cut into one share per stream
 * (share_of in tcp/internal.h, the same split at both ends).  Stream 0
 * carries the DATA frame's header and the first share, exactly as with one
 * stream, so that the matching engine still sees one ordered stream of
 * messages per peer; stream s carries share s as an OP_STRIPE frame (the
 * message's tag, the share's length: garbage or a stream out of step is
 * recognised).  A pair moves one message at a time: the next one starts
 * when every share of the current one is through, at both ends.
 *
 * Receive side: once the engine has a destination for the message (rx
 * BODY), every stream reads its share straight into place, in parallel,
 * when that destination is a posted receive.  When it is an unexpected
 * buffer, which grows with the bytes that came (match.h), the shares are
 * read one after the other in order, so that the buffer's bytes stay
 * contiguous; the streams not read meanwhile keep their bytes in the
 * kernel, and TCP's flow control backs their sender up.  Small messages
 * (and every message when there is one stream) never come here. */
#include "transport/tcp/internal.h"

#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* ------------------------------------------------------------------ */
/* Send side                                                            */
/* ------------------------------------------------------------------ */

/* The head of p's send queue starts: its header on stream 0 and, when it
 * is striped, a share with its own header on each other stream. */
void ddp__tcp_tx_start(tcp *t, peer *p)
{
    ddp__req *r = p->m.sq_head;
    int n = is_striped(t, r->len) ? t->streams : 1;
    for (int s = 0; s < n; s++) {
        conn *x = &p->conn[s];
        share_of(t, r->len, s, &x->tx_lo, &x->tx_hi);
        x->tx_off = x->tx_lo;
        if (s == 0)
            build_header(x->tx_hdr, OP_DATA, r->tag, r->len);
        else
            build_header(x->tx_hdr, OP_STRIPE, r->tag, x->tx_hi - x->tx_lo);
        x->tx_hdr_off = 0;
        x->tx_busy = s > 0;
    }
}

/* Moves every share in progress as far as its socket takes it; *busy is
 * set when one is left.  0, or -1 with the peer down. */
int ddp__tcp_tx_stripes(tcp *t, peer *p, int *busy)
{
    const void *buf = p->m.sq_head->buf;
    for (int s = 1; s < t->streams; s++) {
        conn *x = &p->conn[s];
        x->want_out = 0;
        if (!x->tx_busy)
            continue;
        int rc = ddp__tcp_send_part(x->fd, x->tx_hdr, &x->tx_hdr_off, buf, &x->tx_off, x->tx_hi);
        if (rc < 0) {
            ddp__tcp_tx_failed(t, p, errno);
            return -1;
        }
        x->tx_busy = x->want_out = rc == 0;
        *busy |= rc == 0;
    }
    return 0;
}

/* Bytes of the send in progress that every stream has sent (the other
 * streams' offsets are those of the last striped send until the next). */
size_t ddp__tcp_tx_done(const tcp *t, const peer *p)
{
    int n = p->m.sq_head && is_striped(t, p->m.sq_head->len) ? t->streams : 1;
    size_t done = 0;
    for (int s = 0; s < n; s++)
        done += p->conn[s].tx_off - p->conn[s].tx_lo;
    return done;
}

/* ------------------------------------------------------------------ */
/* Receive side                                                         */
/* ------------------------------------------------------------------ */

/* The engine gave the message in progress a destination (or took it back
 * into the kernel): when it is striped, every stream's share is due. */
void ddp__tcp_rx_setup(tcp *t, peer *p)
{
    ddp__match_peer *mp = &p->m;
    p->rx_striped = mp->rx == DDP__RX_BODY && is_striped(t, mp->rx_len);
    if (p->rx_striped) {
        t->striped_rx++;
        for (int s = 0; s < t->streams; s++) {
            conn *x = &p->conn[s];
            share_of(t, mp->rx_len, s, &x->rx_lo, &x->rx_hi);
            x->rx_off = x->rx_lo;
            x->rx_hdr_off = 0;
            x->rx_busy = s > 0; /* stream 0's share: ddp__tcp_rx_progress */
        }
    }
    ddp__tcp_update_events(t, p);
}

/* 1 when x's share may be read now: due, and (into an unexpected buffer)
 * every share before it is in. */
int ddp__tcp_stripe_ready(const peer *p, const conn *x)
{
    return p->rx_striped && x->rx_busy && (p->m.rx_req || p->m.rx_off == x->rx_off);
}

/* x's frame header is whole: the share the message's split says, nothing else. */
static int check_stripe_header(tcp *t, peer *p, const conn *x, int s)
{
    uint64_t w = get64(x->rx_hdr), tag = get64(x->rx_hdr + 8), len = get64(x->rx_hdr + 16);
    if ((uint32_t)w == FRAME_MAGIC && ((w >> 32) & 0xff) == FRAME_VERSION &&
        ((w >> 40) & 0xff) == OP_STRIPE && (w >> 48) == 0 && tag == p->m.rx_tag &&
        len == x->rx_hi - x->rx_lo)
        return 0;
    ddp__match_down(&t->m, &p->m, DDP__PEER_DEAD,
                    "malformed share on connection %d of %d (header 0x%016" PRIx64
                    ", tag %" PRIu64 ", length %" PRIu64 " where a share of %zu bytes of tag %"
                    PRIu64 " was due); connection dropped",
                    s + 1, t->streams, w, tag, len, x->rx_hi - x->rx_lo, p->m.rx_tag);
    return -1;
}

/* Reads x's share (stream s) as far as the socket has it. */
static void stripe_rx(tcp *t, peer *p, conn *x, int s)
{
    ddp__match_peer *mp = &p->m;
    while (mp->state == DDP__PEER_LIVE && ddp__tcp_stripe_ready(p, x)) {
        size_t cap = mp->rx_cap < x->rx_hi ? mp->rx_cap : x->rx_hi;
        if (x->rx_hdr_off == HDR_LEN && x->rx_off == cap) {
            if (x->rx_off < x->rx_hi) { /* an unexpected buffer grows with its bytes */
                if (ddp__match_grow(&t->m, mp) < 0)
                    return;
                continue;
            }
            x->rx_busy = 0;
            break;
        }
        struct iovec iov[2];
        int cnt = 0;
        if (x->rx_hdr_off < HDR_LEN)
            iov[cnt++] = (struct iovec){x->rx_hdr + x->rx_hdr_off, HDR_LEN - x->rx_hdr_off};
        if (x->rx_off < cap)
            iov[cnt++] = (struct iovec){ddp__match_dst(mp) + x->rx_off, cap - x->rx_off};
        struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
        ssize_t n = recvmsg(x->fd, &msg, MSG_DONTWAIT);
        if (n <= 0) {
            if (!ddp__tcp_rx_stalled(t, p, n, s))
                return;
            continue;
        }
        size_t k = (size_t)n, h = HDR_LEN - x->rx_hdr_off;
        if (h > k)
            h = k;
        x->rx_hdr_off += h;
        if (h > 0 && x->rx_hdr_off == HDR_LEN && check_stripe_header(t, p, x, s) < 0)
            return;
        x->rx_off += k - h;
        mp->rx_off += k - h;
    }
    /* The last share in: stream 0 completes the message (and reads on). */
    if (mp->state == DDP__PEER_LIVE && p->rx_striped && mp->rx_off == mp->rx_len)
        ddp__tcp_rx_progress(t, p);
    else
        ddp__tcp_update_events(t, p);
}

/* A stream with nothing due reported a hang-up or an error (epoll reports
 * those whatever it was asked): when the socket is at its end, the peer is
 * gone.  Bytes still unread there belong to a later message and stay. */
int ddp__tcp_idle_broken(tcp *t, peer *p, int stream)
{
    char c;
    ssize_t n = recv(p->conn[stream].fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0)
        return 0;
    (void)ddp__tcp_rx_stalled(t, p, n, stream);
    return p->m.state != DDP__PEER_LIVE;
}

/* epoll's events ev on stream s (> 0) of p. */
void ddp__tcp_stripe_event(tcp *t, peer *p, int s, uint32_t ev)
{
    conn *x = &p->conn[s];
    if (ev & EPOLLOUT)
        ddp__tcp_tx_progress(t, p);
    if (p->m.state != DDP__PEER_LIVE || !(ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)))
        return;
    if (ddp__tcp_stripe_ready(p, x))
        stripe_rx(t, p, x, s);
    else if (ev & (EPOLLHUP | EPOLLERR))
        ddp__tcp_idle_broken(t, p, s);
}
