/* TCP transport: mesh setup and the epoll progress engine; see tcp.h and
 * docs/wire-format.md.
 *
 * Every message is a frame: a 24-byte header (magic "DDPF", version, opcode,
 * reserved, tag, length) and `length` payload bytes.  The receive side of
 * each connection is a small state machine (header, body, held): a header
 * arrives through a 4 KiB staging buffer (so that a small message costs one
 * recv), then the body goes straight into the buffer of the matching posted
 * receive.  A frame that nobody waits for yet is copied into a malloc'ed
 * "unexpected" buffer when it is small or when a receive posted on the same
 * connection sits behind it; a large one is "held": the engine stops reading
 * that socket (TCP flow control backs the sender up) until a receive for it
 * is posted, so that a fast peer's next ring chunk never costs a copy.
 *
 * Failure: end of stream without a BYE frame, a socket error or a malformed
 * frame marks the peer dead, fails its requests, and (for collectives) fails
 * every wait on the transport at once, naming the rank.  A peer that
 * destroys its group sends BYE first, so that its leaving is no error.  Any
 * error returned to the caller first sends ABORT (with the error's text) to
 * the live peers, so that their errors name the original cause, and drops
 * every request while the memory behind it is still valid. */
#include "transport/tcp.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "base/rng.h"
#include "base/secret.h"
#include "base/sha256.h"
#include "base/sock.h"
#include "transport/handshake.h"
#include "transport/rendezvous.h"

#define HDR_LEN 24
#define FRAME_MAGIC 0x46504444u /* "DDPF" */
#define FRAME_VERSION 1
enum { OP_DATA = 1, OP_BYE = 2, OP_ABORT = 3 };
#define MAX_ABORT 1024 /* bytes of reason in an ABORT frame */
#define STAGE_LEN 4096
#define EAGER_MAX (64u << 10)          /* unexpected frames up to this are copied at once */
#define MAX_FRAME ((uint64_t)1 << 40)  /* sanity bound on a frame's length */
#define HANDSHAKE_S 2.0                /* per-connection bound while accepting */
#define DEFAULT_SPIN_US 20.0

enum { RX_HDR, RX_BODY, RX_HELD };
enum { P_LIVE, P_LEFT, P_DEAD, P_ABORTED };

typedef struct unexp {
    uint64_t tag;
    size_t len;
    uint8_t *data;
    struct unexp *next;
} unexp;

typedef struct peer {
    int fd;
    int rank;
    int state;
    int err;             /* code of the failure when not live */
    char what[300];      /* "rank 3 (127.0.0.1:40123)" */
    char why[520];       /* failure message */
    uint32_t ev;         /* events registered with epoll */
    int want_out;
    /* send side: FIFO of requests; the head's header is in tx_hdr */
    ddp__req *sq_head, *sq_tail;
    uint8_t tx_hdr[HDR_LEN];
    size_t tx_hdr_off;
    /* receive side */
    ddp__req *pq_head, *pq_tail; /* posted receives */
    unexp *ux_head, *ux_tail;    /* frames that arrived before their receive */
    uint8_t stage[STAGE_LEN];
    size_t st_lo, st_hi;
    int rx;
    uint64_t rx_tag;
    size_t rx_len, rx_off;
    ddp__req *rx_req;
    unexp *rx_ux;
} peer;

typedef struct tcp {
    ddp__tp base;
    peer *peers;
    int epfd;
    int ndead;
    int first_dead; /* the peer that failed first: the cause, usually */
    double spin_max; /* DDP_TCP_SPIN_US */
    double spin_s;   /* current spin budget, adapted (see adapt_spin) */
    unsigned spin_skips;
    ddp__tcp_stats stats;
} tcp;

/* ------------------------------------------------------------------ */
/* Little helpers                                                       */
/* ------------------------------------------------------------------ */

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void build_header(uint8_t *h, int op, uint64_t tag, uint64_t len)
{
    put64(h, FRAME_MAGIC | (uint64_t)FRAME_VERSION << 32 | (uint64_t)op << 40);
    put64(h + 8, tag);
    put64(h + 16, len);
}

static void update_events(tcp *t, peer *p)
{
    if (p->fd < 0)
        return;
    uint32_t ev = EPOLLRDHUP | (p->rx != RX_HELD ? EPOLLIN : 0u) | (p->want_out ? EPOLLOUT : 0u);
    if (ev == p->ev)
        return;
    struct epoll_event e = {.events = ev, .data.ptr = p};
    if (epoll_ctl(t->epfd, EPOLL_CTL_MOD, p->fd, &e) == 0)
        p->ev = ev;
}

static void fail_list(ddp__req *r, int code)
{
    while (r) {
        ddp__req *next = r->next;
        r->status = code;
        r->next = NULL;
        r = next;
    }
}

static void free_unexp(unexp *u)
{
    while (u) {
        unexp *next = u->next;
        free(u->data);
        free(u);
        u = next;
    }
}

/* Takes the peer out of service: closes its socket and fails every request
 * that involves it.  state is P_DEAD (an error) or P_LEFT (it said BYE). */
__attribute__((format(printf, 4, 5)))
static void peer_down(tcp *t, peer *p, int state, const char *fmt, ...)
{
    if (p->state != P_LIVE)
        return;
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(p->why, sizeof p->why, "%s: %s", p->what, msg);
    p->state = state;
    p->err = DDP_ERR_PEER;
    if (state == P_DEAD) {
        t->ndead++;
        if (t->first_dead < 0)
            t->first_dead = p->rank;
        DDP_WARN("tcp rank %d: %s", t->base.rank, p->why);
    } else {
        DDP_DEBUG("tcp rank %d: %s", t->base.rank, p->why);
    }
    if (p->fd >= 0) {
        epoll_ctl(t->epfd, EPOLL_CTL_DEL, p->fd, NULL);
        close(p->fd);
        p->fd = -1;
    }
    fail_list(p->sq_head, p->err);
    fail_list(p->pq_head, p->err);
    if (p->rx_req)
        p->rx_req->status = p->err;
    p->sq_head = p->sq_tail = p->pq_head = p->pq_tail = NULL;
    p->rx_req = NULL;
    if (p->rx_ux) {
        free(p->rx_ux->data);
        free(p->rx_ux);
        p->rx_ux = NULL;
    }
    /* What a departed peer sent before its goodbye is still to be had. */
    if (state != P_LEFT) {
        free_unexp(p->ux_head);
        p->ux_head = p->ux_tail = NULL;
    }
}

static int peer_error(const peer *p)
{
    return DDP_ERROR(p->err, "%s", p->why);
}

static ddp__req *take_posted(peer *p, uint64_t tag)
{
    ddp__req *prev = NULL;
    for (ddp__req *r = p->pq_head; r; prev = r, r = r->next) {
        if (r->tag != tag)
            continue;
        if (prev)
            prev->next = r->next;
        else
            p->pq_head = r->next;
        if (p->pq_tail == r)
            p->pq_tail = prev;
        r->next = NULL;
        return r;
    }
    return NULL;
}

static int len_mismatch(tcp *t, peer *p, uint64_t tag, uint64_t got, size_t want)
{
    char msg[200];
    snprintf(msg, sizeof msg,
             "sent %" PRIu64 " bytes for tag 0x%" PRIx64 " where %zu were expected "
             "(do the ranks call the same collectives with the same sizes?)",
             got, tag, want);
    peer_down(t, p, P_DEAD, "%s", msg);
    return DDP_ERROR(DDP_ERR_PROTOCOL, "%s: %s", p->what, msg);
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
        (void)poll(&pf, 1, (int)(left * 1000) + 1);
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
    ddp__req *r = p->sq_head;
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

/* After any error: every live peer is told why and disconnected, and every
 * request is dropped while its memory is still valid (the algorithm frees
 * it when the error reaches it).  The transport is unusable afterwards.
 * Returns rc; the caller's error message is kept. */
static void abort_all(tcp *t, const char *why)
{
    for (int r = 0; r < t->base.size; r++) {
        peer *p = &t->peers[r];
        if (r == t->base.rank || p->state != P_LIVE)
            continue;
        send_abort(p, why);
        peer_down(t, p, P_ABORTED, "this rank gave up after an error");
    }
    for (int r = 0; r < t->base.size; r++) { /* requests of peers already down */
        peer *p = &t->peers[r];
        fail_list(p->sq_head, p->err);
        fail_list(p->pq_head, p->err);
        p->sq_head = p->sq_tail = p->pq_head = p->pq_tail = NULL;
        p->rx_req = NULL;
    }
}

static int fail_all(tcp *t, int rc)
{
    char why[MAX_ABORT];
    snprintf(why, sizeof why, "rank %d: %s", t->base.rank, ddp_last_error());
    abort_all(t, why);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Receive side                                                         */
/* ------------------------------------------------------------------ */

/* Starts buffering the current frame into a fresh unexpected buffer. */
static int buffer_frame(tcp *t, peer *p)
{
    unexp *u = calloc(1, sizeof *u);
    uint8_t *data = malloc(p->rx_len ? p->rx_len : 1);
    if (!u || !data) {
        free(u);
        free(data);
        peer_down(t, p, P_DEAD, "out of memory buffering a %zu-byte frame", p->rx_len);
        return -1;
    }
    u->tag = p->rx_tag;
    u->len = p->rx_len;
    u->data = data;
    t->stats.copied_frames++;
    t->stats.copied_bytes += p->rx_len;
    p->rx_ux = u;
    p->rx_req = NULL;
    p->rx = RX_BODY;
    update_events(t, p);
    return 0;
}

static int start_body(tcp *t, peer *p, uint64_t tag, uint64_t len)
{
    p->rx_tag = tag;
    p->rx_len = (size_t)len;
    p->rx_off = 0;
    ddp__req *r = take_posted(p, tag);
    if (r) {
        if (r->len != len) {
            r->status = DDP_ERR_PROTOCOL;
            return len_mismatch(t, p, tag, len, r->len);
        }
        p->rx_req = r;
        p->rx = RX_BODY;
        return 0;
    }
    /* Nobody waits for it: copy it if small, or if a receive posted on this
     * connection sits behind it; otherwise leave it in the kernel. */
    if (len <= EAGER_MAX || p->pq_head)
        return buffer_frame(t, p);
    t->stats.held_frames++;
    p->rx = RX_HELD;
    update_events(t, p);
    return 0;
}

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
        peer_down(t, p, P_DEAD,
                  "malformed frame (magic 0x%08x, version %u, opcode %u, length %" PRIu64
                  "); connection dropped",
                  magic, version, op, len);
        return -1;
    }
    if (op == OP_BYE) {
        peer_down(t, p, P_LEFT, "left the group (destroyed its process group)");
        return -1;
    }
    if (op == OP_ABORT) { /* rx_progress staged the whole reason */
        const char *why = (const char *)p->stage + p->st_lo;
        p->st_lo += (size_t)len;
        peer_down(t, p, P_DEAD, "gave up: %.*s", (int)len, why);
        return -1;
    }
    return start_body(t, p, tag, len);
}

static void body_done(tcp *t, peer *p)
{
    if (p->rx_req) {
        p->rx_req->done = p->rx_len;
        p->rx_req->status = 1;
    } else {
        unexp *u = p->rx_ux;
        ddp__req *r = take_posted(p, u->tag); /* posted while the frame arrived */
        if (r) {
            if (r->len != u->len) {
                r->status = DDP_ERR_PROTOCOL;
                len_mismatch(t, p, u->tag, u->len, r->len);
                free(u->data);
                free(u);
                return;
            }
            if (u->len)
                memcpy(r->buf, u->data, u->len);
            r->done = u->len;
            r->status = 1;
            free(u->data);
            free(u);
        } else {
            if (p->ux_tail)
                p->ux_tail->next = u;
            else
                p->ux_head = u;
            p->ux_tail = u;
        }
    }
    p->rx_req = NULL;
    p->rx_ux = NULL;
    p->rx = RX_HDR;
}

/* After a recv that moved nothing: 1 to retry, 0 to stop (would block or
 * the peer is gone). */
static int rx_stalled(tcp *t, peer *p, ssize_t n)
{
    if (n == 0) {
        peer_down(t, p, P_DEAD, "connection closed without goodbye (process died?)");
        return 0;
    }
    if (errno == EINTR)
        return 1;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        return 0;
    peer_down(t, p, P_DEAD, "recv: %s", strerror(errno));
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
    while (p->state == P_LIVE && p->rx != RX_HELD) {
        size_t avail = p->st_hi - p->st_lo;
        if (p->rx == RX_HDR) {
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
        uint8_t *dst = p->rx_req ? (uint8_t *)p->rx_req->buf : p->rx_ux->data;
        size_t need = p->rx_len - p->rx_off;
        if (need == 0) {
            body_done(t, p);
            if (p->st_hi == p->st_lo)
                return; /* epoll says when more comes: saves a recv that would fail */
            continue;
        }
        if (avail) {
            size_t k = avail < need ? avail : need;
            memcpy(dst + p->rx_off, p->stage + p->st_lo, k);
            p->st_lo += k;
            p->rx_off += k;
            continue;
        }
        /* Small remainders go through the stage, which also picks up the
         * next header; large ones straight into place. */
        ssize_t n = need < STAGE_LEN / 2 ? fill_stage(p)
                                         : recv(p->fd, dst + p->rx_off, need, MSG_DONTWAIT);
        if (n > 0) {
            if (need < STAGE_LEN / 2)
                p->st_hi += (size_t)n;
            else
                p->rx_off += (size_t)n;
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
    while (p->sq_head && p->state == P_LIVE) {
        ddp__req *r = p->sq_head;
        struct iovec iov[2];
        int cnt = 0;
        if (p->tx_hdr_off < HDR_LEN)
            iov[cnt++] = (struct iovec){p->tx_hdr + p->tx_hdr_off, HDR_LEN - p->tx_hdr_off};
        if (r->done < r->len)
            iov[cnt++] = (struct iovec){(uint8_t *)r->buf + r->done, r->len - r->done};
        ssize_t n = 0;
        if (cnt > 0) {
            struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
            n = sendmsg(p->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
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
                peer_down(t, p, P_DEAD, "send: %s", strerror(err));
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
            p->sq_head = r->next;
            if (!p->sq_head)
                p->sq_tail = NULL;
            r->next = NULL;
            if (p->sq_head) {
                build_header(p->tx_hdr, OP_DATA, p->sq_head->tag, p->sq_head->len);
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

/* The first peer that failed (the cause), else any one that is down. */
static const peer *failed_peer(const tcp *t)
{
    if (t->first_dead >= 0)
        return &t->peers[t->first_dead];
    for (int r = 0; r < t->base.size; r++)
        if (r != t->base.rank && t->peers[r].state != P_LIVE)
            return &t->peers[r];
    return NULL;
}

static int check_peer(tcp *t, int rank, const char *what)
{
    if (rank < 0 || rank >= t->base.size || rank == t->base.rank)
        return DDP_ERROR(DDP_ERR_INVALID_ARG, "%s: peer rank %d invalid for rank %d of %d", what,
                         rank, t->base.rank, t->base.size);
    if (t->peers[rank].state != P_LIVE)
        return ddp__error_context(peer_error(&t->peers[rank]), "%s", what);
    return 0;
}

static int tcp_isend(ddp__tp *tp, ddp__req *r)
{
    tcp *t = (tcp *)tp;
    int rc = check_peer(t, r->peer, "send");
    if (rc < 0)
        return fail_all(t, rc);
    peer *p = &t->peers[r->peer];
    r->next = NULL;
    if (p->sq_tail) {
        p->sq_tail->next = r;
        p->sq_tail = r;
        return 0;
    }
    p->sq_head = p->sq_tail = r;
    build_header(p->tx_hdr, OP_DATA, r->tag, r->len);
    p->tx_hdr_off = 0;
    tx_progress(t, p); /* eager: most small sends finish here */
    if (r->status < 0)
        return fail_all(t, peer_error(p));
    return 0;
}

static int tcp_irecv(ddp__tp *tp, ddp__req *r)
{
    tcp *t = (tcp *)tp;
    if (r->peer < 0 || r->peer >= t->base.size || r->peer == t->base.rank)
        return fail_all(t, check_peer(t, r->peer, "recv"));
    peer *p = &t->peers[r->peer];
    /* An older buffered frame with this tag comes first (also from a peer
     * that has left since). */
    unexp *prev = NULL;
    for (unexp *u = p->ux_head; u; prev = u, u = u->next) {
        if (u->tag != r->tag)
            continue;
        if (u->len != r->len) {
            r->status = DDP_ERR_PROTOCOL;
            return fail_all(t, len_mismatch(t, p, u->tag, u->len, r->len));
        }
        if (prev)
            prev->next = u->next;
        else
            p->ux_head = u->next;
        if (p->ux_tail == u)
            p->ux_tail = prev;
        if (u->len)
            memcpy(r->buf, u->data, u->len);
        r->done = u->len;
        r->status = 1;
        free(u->data);
        free(u);
        return 0;
    }
    int rc = check_peer(t, r->peer, "recv");
    if (rc < 0)
        return fail_all(t, rc);
    r->next = NULL;
    if (p->rx == RX_HELD) {
        if (p->rx_tag == r->tag) {
            if (p->rx_len != r->len) {
                r->status = DDP_ERR_PROTOCOL;
                return fail_all(t, len_mismatch(t, p, r->tag, p->rx_len, r->len));
            }
            p->rx_req = r;
            p->rx = RX_BODY;
            update_events(t, p);
            return 0;
        }
        /* This receive's frame is behind the held one: copy the held one. */
        if (buffer_frame(t, p) < 0)
            return fail_all(t, peer_error(p));
    }
    if (p->pq_tail)
        p->pq_tail->next = r;
    else
        p->pq_head = r;
    p->pq_tail = r;
    return 0;
}

static int timeout_error(tcp *t, ddp__req *const *reqs, int n, double waited)
{
    for (int i = 0; i < n; i++) {
        if (reqs[i]->status != 0)
            continue;
        const peer *p = &t->peers[reqs[i]->peer];
        return DDP_ERROR(DDP_ERR_TIMEOUT, "timed out after %.1f s %s %s (%zu of %zu bytes)",
                         waited, reqs[i]->kind == DDP__REQ_SEND ? "sending to" : "waiting for",
                         p->what, reqs[i]->done, reqs[i]->len);
    }
    return DDP_ERROR(DDP_ERR_TIMEOUT, "timed out after %.1f s", waited);
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
        int pending = 0;
        for (int i = 0; i < n; i++) {
            if (reqs[i]->status < 0) {
                /* Name the cause for a collective, else this request's peer. */
                const peer *p = (flags & DDP__WAIT_ANY_PEER) && failed_peer(t)
                                    ? failed_peer(t)
                                    : &t->peers[reqs[i]->peer];
                return fail_all(t, peer_error(p));
            }
            pending += reqs[i]->status == 0;
        }
        if (!pending) {
            adapt_spin(t, polled_empty, slept);
            return 0;
        }
        if ((flags & DDP__WAIT_ANY_PEER) && t->ndead)
            return fail_all(t, peer_error(failed_peer(t)));
        double now = ddp_time_now();
        if (now >= deadline)
            return fail_all(t, timeout_error(t, reqs, n, now - start));
        /* Spin briefly (a reply often comes within microseconds), then sleep:
         * the compute threads need the cores. */
        int ms = 0;
        if (now - start >= t->spin_s) {
            double left = (deadline - now) * 1000.0 + 1.0;
            ms = left > 1e9 ? 1000000000 : (int)left;
            slept = 1;
        }
        int nev = epoll_wait(t->epfd, evs, 64, ms);
        polled_empty |= nev == 0 && ms == 0;
        if (nev < 0) {
            if (errno == EINTR)
                continue;
            return fail_all(t, DDP_ERROR_ERRNO(DDP_ERR_SYSTEM, errno, "epoll_wait"));
        }
        for (int i = 0; i < nev; i++) {
            peer *p = evs[i].data.ptr;
            uint32_t ev = evs[i].events;
            if (p->state != P_LIVE)
                continue;
            if (ev & EPOLLOUT)
                tx_progress(t, p);
            /* A closed or failed socket with a held frame: read it all now,
             * to learn whether the peer said goodbye. */
            if ((ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) && p->rx == RX_HELD &&
                p->state == P_LIVE && buffer_frame(t, p) < 0)
                continue;
            if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
                rx_progress(t, p);
        }
    }
}

static void tcp_abort(ddp__tp *tp, int code, const char *why)
{
    (void)code;
    abort_all((tcp *)tp, why);
}

static void tcp_destroy(ddp__tp *tp)
{
    tcp *t = (tcp *)tp;
    if (!t)
        return;
    for (int r = 0; t->peers && r < t->base.size; r++) {
        peer *p = &t->peers[r];
        if (p->fd >= 0) {
            /* Goodbye, unless a frame is half-written (the stream is no
             * longer in step then, and the peer must see a failure). */
            if (p->state == P_LIVE && !p->sq_head) {
                uint8_t h[HDR_LEN];
                build_header(h, OP_BYE, 0, 0);
                (void)ddp__sock_send_all(p->fd, h, HDR_LEN, ddp_time_now() + 1.0, p->what);
                shutdown(p->fd, SHUT_WR);
                /* Drain what is unread so that close sends FIN, not RST
                 * (an RST could destroy our BYE before the peer reads it). */
                char sink[4096];
                while (recv(p->fd, sink, sizeof sink, MSG_DONTWAIT) > 0) {
                }
            }
            close(p->fd);
        }
        if (p->rx_ux) {
            free(p->rx_ux->data);
            free(p->rx_ux);
        }
        free_unexp(p->ux_head);
    }
    if (t->epfd >= 0)
        close(t->epfd);
    free(t->peers);
    free(t);
}

static const ddp__tp_vtable tcp_vtable = {
    .name = "tcp",
    .isend = tcp_isend,
    .irecv = tcp_irecv,
    .wait = tcp_wait,
    .abort = tcp_abort,
    .destroy = tcp_destroy,
};

/* ------------------------------------------------------------------ */
/* Setup: rendezvous, connect, accept                                   */
/* ------------------------------------------------------------------ */

/* Record: "host port nonce" */
static int parse_record(const ddp__rdzv_rec *rec, int r, char *host, size_t hlen, int *port)
{
    char buf[300];
    size_t n = rec->len < sizeof buf - 1 ? rec->len : sizeof buf - 1;
    memcpy(buf, rec->data, n);
    buf[n] = '\0';
    char *sp = strchr(buf, ' ');
    DDP_FAIL_IF(!sp || sp - buf >= (long)hlen, DDP_ERR_FORMAT,
                "malformed address record of rank %d: '%s'", r, buf);
    memcpy(host, buf, (size_t)(sp - buf));
    host[sp - buf] = '\0';
    *port = atoi(sp + 1);
    DDP_FAIL_IF(*port <= 0 || *port > 65535, DDP_ERR_FORMAT,
                "malformed address record of rank %d: '%s'", r, buf);
    return 0;
}

static int add_peer(tcp *t, int r, int fd)
{
    peer *p = &t->peers[r];
    DDP_TRY(ddp__sock_tune(fd, 1));
    p->fd = fd;
    p->ev = EPOLLIN | EPOLLRDHUP;
    struct epoll_event e = {.events = p->ev, .data.ptr = p};
    if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, fd, &e) < 0)
        return DDP_ERROR_ERRNO(DDP_ERR_SYSTEM, errno, "epoll_ctl(ADD) for %s", p->what);
    p->state = P_LIVE;
    return 0;
}

static int connect_up(tcp *t, const ddp__hs_ctx *hs, const ddp__rdzv_rec *recs, double deadline)
{
    for (int r = t->base.rank + 1; r < t->base.size; r++) {
        char host[256];
        int port = 0, fd = -1;
        DDP_TRY(parse_record(&recs[r], r, host, sizeof host, &port));
        peer *p = &t->peers[r];
        snprintf(p->what, sizeof p->what, "rank %d (%s:%d)", r, host, port);
        int rc = ddp__sock_connect(host, port, deadline, p->what, &fd);
        if (rc == 0)
            rc = ddp__hs_client(fd, hs, r, deadline, p->what);
        if (rc == 0)
            rc = add_peer(t, r, fd);
        if (rc < 0) {
            if (fd >= 0 && p->fd != fd)
                close(fd);
            return ddp__error_context(rc, "rank %d connecting to rank %d", t->base.rank, r);
        }
    }
    return 0;
}

static int accept_down(tcp *t, const ddp__hs_ctx *hs, int lfd, double deadline,
                       double timeout_s)
{
    int rc = 0, want = t->base.rank;
    unsigned char *connected = calloc((size_t)t->base.size, 1);
    DDP_FAIL_IF(!connected, DDP_ERR_NOMEM, "out of memory");
    while (want > 0) {
        int fd = -1;
        char addr[80];
        int got = ddp__sock_accept(lfd, deadline, &fd, addr, sizeof addr);
        if (got < 0) {
            rc = got;
            goto out;
        }
        if (got == 0) {
            unsigned char *missing = calloc((size_t)t->base.size, 1);
            DDP_FAIL_OUT(!missing, DDP_ERR_NOMEM, "out of memory");
            for (int r = 0; r < t->base.rank; r++)
                missing[r] = !connected[r];
            char who[200];
            ddp__format_ranks(who, sizeof who, missing, t->base.size);
            free(missing);
            rc = DDP_ERROR(DDP_ERR_TIMEOUT, "%s did not connect to rank %d within %.1f s", who,
                           t->base.rank, timeout_s);
            goto out;
        }
        char what[128];
        snprintf(what, sizeof what, "connection from %s", addr);
        double hs_deadline = ddp_time_now() + HANDSHAKE_S;
        int src = -1;
        int hrc = ddp__hs_server(fd, hs, connected, hs_deadline < deadline ? hs_deadline : deadline,
                                 what, &src);
        if (hrc < 0) {
            /* A stranger or a misconfigured rank: log it and go on waiting. */
            DDP_WARN("tcp rank %d: rejected %s: %s", t->base.rank, what, ddp_last_error());
            close(fd);
            continue;
        }
        snprintf(t->peers[src].what, sizeof t->peers[src].what, "rank %d (%s)", src, addr);
        rc = add_peer(t, src, fd);
        if (rc < 0) {
            close(fd);
            goto out;
        }
        connected[src] = 1;
        want--;
    }
out:
    free(connected);
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
    DDP_FAIL_IF(size < 1, DDP_ERR_INVALID_ARG, "world size %d must be at least 1", size);
    DDP_FAIL_IF(rank < 0 || rank >= size, DDP_ERR_INVALID_ARG,
                "rank %d out of range for world size %d", rank, size);
    double deadline = ddp_time_now() + timeout_s;

    t = calloc(1, sizeof *t);
    DDP_FAIL_OUT(!t, DDP_ERR_NOMEM, "out of memory");
    t->base.vt = &tcp_vtable;
    t->base.rank = rank;
    t->base.size = size;
    t->epfd = -1;
    t->first_dead = -1;
    const char *spin = getenv("DDP_TCP_SPIN_US");
    t->spin_max = (spin && *spin ? atof(spin) : DEFAULT_SPIN_US) * 1e-6;
    t->spin_s = t->spin_max;
    t->peers = calloc((size_t)size, sizeof *t->peers);
    DDP_FAIL_OUT(!t->peers, DDP_ERR_NOMEM, "out of memory");
    for (int r = 0; r < size; r++) {
        t->peers[r].fd = -1;
        t->peers[r].rank = r;
        t->peers[r].state = r == rank ? P_LIVE : P_DEAD;
        t->peers[r].err = DDP_ERR_PEER;
        snprintf(t->peers[r].what, sizeof t->peers[r].what, "rank %d", r);
        snprintf(t->peers[r].why, sizeof t->peers[r].why, "rank %d: not connected", r);
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
        DDP_TRY_OUT(ddp__sock_listen(host, 0, 128, &lfd, &port));
    DDP_TRY_OUT(ddp__random_bytes(nonce, sizeof nonce));
    int n = snprintf(rec, sizeof rec, "%s %d ", host, port);
    for (int i = 0; i < 16; i++)
        n += snprintf(rec + n, sizeof rec - (size_t)n, "%02x", nonce[i]);
    recs = calloc((size_t)size, sizeof *recs);
    DDP_FAIL_OUT(!recs, DDP_ERR_NOMEM, "out of memory");
    DDP_TRY_OUT(ddp__rdzv_exchange(store, prefix, rank, size, rec, (size_t)n, timeout_s, recs));

    /* The group's identity: a digest of every record (each has a fresh
     * nonce), so connections from another job or group never match. */
    ddp__hs_ctx hs = {.rank = rank, .size = size, .secret = secret, .secret_len = secret_len};
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
    tcp_destroy(t ? &t->base : NULL);
    return rc;
}

int ddp__tcp_debug_stats(ddp__tp *tp, ddp__tcp_stats *out)
{
    if (!tp || tp->vt != &tcp_vtable)
        return -1;
    *out = ((tcp *)tp)->stats;
    return 0;
}

int ddp__tcp_debug_fd(ddp__tp *tp, int rank)
{
    tcp *t = (tcp *)tp;
    if (!tp || tp->vt != &tcp_vtable || rank < 0 || rank >= t->base.size)
        return -1;
    return t->peers[rank].fd;
}
