/* The TCP transport's private parts, shared by its files (tcp/loop.c: the
 * frames and the progress engine; tcp/stripe.c: large messages striped
 * across several connections per pair; tcp/mesh.c: setting up and tearing
 * down the connections).  The public face is transport/tcp.h; the byte layout
 * of frames is docs/wire-format.md. */
#ifndef DDP_TRANSPORT_TCP_INTERNAL_H
#define DDP_TRANSPORT_TCP_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "transport/match.h"
#include "transport/tcp.h"
#include "transport/transport.h"

/* Every message is a frame: a 24-byte header (magic "DDPF", version,
 * opcode, reserved, tag, length) and `length` payload bytes. */
#define HDR_LEN 24
#define FRAME_MAGIC 0x46504444u /* "DDPF" */
#define FRAME_VERSION 1
enum { OP_DATA = 1, OP_BYE = 2, OP_ABORT = 3, OP_STRIPE = 4 };
#define MAX_ABORT 1024 /* bytes of reason in an ABORT frame */
#define ABORT_WAIT_S 0.5 /* how long a giver-up sends its ABORT, and a peer looks for one */
#define STAGE_LEN 4096
#define MAX_FRAME ((uint64_t)1 << 40)  /* sanity bound on a frame's length */
#define MAX_STREAMS 8                  /* DDP_SOCKET_NUM_STREAMS's upper bound (base/env.c) */
#define STRIPE_MIN (256u << 10)        /* with several streams, messages from this size are striped */

/* One connection of a pair (DDP_SOCKET_NUM_STREAMS of them; tcp/stripe.c).
 * Stream 0 carries every frame's header and, of a striped message, the
 * first share; stream s > 0 carries share s as a frame of its own
 * (OP_STRIPE, the message's tag, the share's length), so that the matching
 * engine still sees one ordered stream of messages per peer.  Without
 * striping stream 0's share is the whole message. */
typedef struct conn {
    int fd;
    uint32_t ev;   /* events registered with epoll */
    int want_out;
    /* send side: the share [tx_lo, tx_hi) of m.sq_head, up to tx_off sent,
     * after the frame's header (tx_hdr, tx_hdr_off of it sent) */
    int tx_busy;   /* streams > 0: a share is in progress */
    uint8_t tx_hdr[HDR_LEN];
    size_t tx_hdr_off, tx_lo, tx_off, tx_hi;
    /* receive side of a striped message: the share [rx_lo, rx_hi), up to
     * rx_off in; streams > 0 read their frame's header into rx_hdr (stream
     * 0's headers come through the peer's stage) */
    int rx_busy;
    uint8_t rx_hdr[HDR_LEN];
    size_t rx_hdr_off, rx_lo, rx_off, rx_hi;
} conn;

typedef struct peer {
    ddp__match_peer m; /* first: the engine's part (queues, receive state, failure) */
    conn conn[MAX_STREAMS]; /* the pair's streams, 0 .. streams - 1 */
    int rx_striped;         /* the message in progress comes in shares */
    /* receive side: stream 0's headers (and small bodies) come through stage */
    uint8_t stage[STAGE_LEN];
    size_t st_lo, st_hi;
} peer;

typedef struct tcp {
    ddp__tp base;
    ddp__match m;
    peer *peers;     /* m's peers */
    int streams;     /* connections per pair (DDP_SOCKET_NUM_STREAMS) */
    uint64_t striped_rx; /* striped messages received (tests: ddp__tcp_debug_streams) */
    int epfd;
    double spin_max; /* DDP_TCP_SPIN_US */
    double spin_s;   /* current spin budget, adapted (see adapt_spin) */
    unsigned spin_skips;
} tcp;

static inline void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static inline void build_header(uint8_t *h, int op, uint64_t tag, uint64_t len)
{
    put64(h, FRAME_MAGIC | (uint64_t)FRAME_VERSION << 32 | (uint64_t)op << 40);
    put64(h + 8, tag);
    put64(h + 16, len);
}

/* epoll's word for stream s of peer r */
static inline uint64_t ev_key(int r, int s) { return (uint64_t)r << 8 | (uint64_t)s; }

/* Stream s's share [*lo, *hi) of a len-byte message (s = 0: all of it when
 * the message is not striped).  Both ends compute the same split. */
static inline int is_striped(const tcp *t, size_t len)
{
    return t->streams > 1 && len >= STRIPE_MIN;
}
static inline void share_of(const tcp *t, size_t len, int s, size_t *lo, size_t *hi)
{
    size_t n = is_striped(t, len) ? (size_t)t->streams : 1;
    size_t piece = len / n & ~(size_t)4095;
    *lo = piece * (size_t)s;
    *hi = (size_t)s + 1 == n ? len : piece * ((size_t)s + 1);
}

extern const ddp__tp_vtable ddp__tcp_vtable;  /* tcp/loop.c */
void ddp__tcp_update_events(tcp *t, peer *p);
void ddp__tcp_rx_progress(tcp *t, peer *p);
void ddp__tcp_tx_progress(tcp *t, peer *p);
int ddp__tcp_rx_stalled(tcp *t, peer *p, ssize_t n, int stream);
int ddp__tcp_send_part(int fd, const uint8_t *hdr, size_t *hdr_off, const void *buf, size_t *off,
                       size_t hi);
void ddp__tcp_tx_failed(tcp *t, peer *p, int err);
/* tcp/stripe.c */
void ddp__tcp_tx_start(tcp *t, peer *p);
int ddp__tcp_tx_stripes(tcp *t, peer *p, int *busy);
size_t ddp__tcp_tx_done(const tcp *t, const peer *p);
void ddp__tcp_rx_setup(tcp *t, peer *p);
int ddp__tcp_stripe_ready(const peer *p, const conn *x);
void ddp__tcp_stripe_event(tcp *t, peer *p, int s, uint32_t ev);
int ddp__tcp_idle_broken(tcp *t, peer *p, int stream);
extern const ddp__match_ops ddp__tcp_match_ops;
void ddp__tcp_destroy(ddp__tp *tp);           /* tcp/mesh.c */

#endif
