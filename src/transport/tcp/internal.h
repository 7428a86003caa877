/* The TCP transport's private parts, shared by its files (tcp/loop.c: the
 * frames and the progress engine; tcp/mesh.c: setting up and tearing down
 * the connections).  The public face is transport/tcp.h; the byte layout
 * of frames is docs/wire-format.md. */
#ifndef DDP_TRANSPORT_TCP_INTERNAL_H
#define DDP_TRANSPORT_TCP_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "transport/match.h"
#include "transport/tcp.h"
#include "transport/transport.h"

/* Every message is a frame: a 24-byte header (magic "DDPF", version,
 * opcode, reserved, tag, length) and `length` payload bytes. */
#define HDR_LEN 24
#define FRAME_MAGIC 0x46504444u /* "DDPF" */
#define FRAME_VERSION 1
enum { OP_DATA = 1, OP_BYE = 2, OP_ABORT = 3 };
#define MAX_ABORT 1024 /* bytes of reason in an ABORT frame */
#define STAGE_LEN 4096
#define MAX_FRAME ((uint64_t)1 << 40)  /* sanity bound on a frame's length */

typedef struct peer {
    ddp__match_peer m; /* first: the engine's part (queues, receive state, failure) */
    int fd;
    uint32_t ev;         /* events registered with epoll */
    int want_out;
    /* send side: the head of m.sq has its header in tx_hdr */
    uint8_t tx_hdr[HDR_LEN];
    size_t tx_hdr_off;
    /* receive side: headers (and small bodies) come through stage */
    uint8_t stage[STAGE_LEN];
    size_t st_lo, st_hi;
} peer;

typedef struct tcp {
    ddp__tp base;
    ddp__match m;
    peer *peers;     /* m's peers */
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

extern const ddp__tp_vtable ddp__tcp_vtable;  /* tcp/loop.c */
extern const ddp__match_ops ddp__tcp_match_ops;
void ddp__tcp_destroy(ddp__tp *tp);           /* tcp/mesh.c */

#endif
