/* Connection handshake of the TCP transport (docs/wire-format.md).
 *
 * The connecting (lower) rank sends HELLO: magic, version, group identity,
 * world size, its rank, the rank it wants, a fresh nonce.  The accepting
 * rank answers CHALLENGE: its own nonce and an HMAC proving it knows the
 * shared secret; the client answers AUTH with its own HMAC over both nonces;
 * the server closes with WELCOME (status 0) or a rejection status.  Without
 * a configured secret the HMAC key is empty: the exchange still checks
 * magic, version, group and ranks, but proves nothing. */
#ifndef DDP_TRANSPORT_HANDSHAKE_H
#define DDP_TRANSPORT_HANDSHAKE_H

#include <stddef.h>
#include <stdint.h>

#define DDP__HS_MAGIC 0x48504444u /* "DDPH" on the wire (little-endian) */
#define DDP__HS_VERSION 1
#define DDP__HS_ID_LEN 32

/* What both ends must agree on. */
typedef struct ddp__hs_ctx {
    uint8_t group_id[DDP__HS_ID_LEN]; /* digest of the group's rendezvous records */
    int rank;                         /* this end */
    int size;
    int streams; /* connections per pair (DDP_SOCKET_NUM_STREAMS); 0 reads as 1 */
    const uint8_t *secret; /* may be NULL (no secret) */
    size_t secret_len;
} ddp__hs_ctx;

/* Client side on a connected socket: proves itself to rank `peer`, as the
 * connection number `stream` (< ctx->streams) of the pair.  what names the
 * peer in messages. */
int ddp__hs_client(int fd, const ddp__hs_ctx *ctx, int peer, int stream, double deadline,
                   const char *what);
/* Server side: reads a HELLO and runs the exchange.  On success *peer is the
 * client's rank and *stream its connection number; connected[] has one byte
 * per (rank, stream), at rank * streams + stream, and a set one is refused
 * (joined twice).  Failures return a negative code with the reason in the message.
 * (A blocking loop over ddp__hs_srv_step.) */
int ddp__hs_server(int fd, const ddp__hs_ctx *ctx, const unsigned char *connected,
                   double deadline, const char *what, int *peer, int *stream);

/* The server side as a non-blocking state machine, so that a rank can run
 * many handshakes at once (transport/accept.c) and a silent or slow
 * connection holds up nobody but itself.  The struct is the caller's; its
 * fields are private to handshake.c. */
#define DDP__HS_MSG_MAX 92 /* the longest message (HELLO) */
typedef struct ddp__hs_srv {
    int fd;    /* borrowed: the caller closes it */
    int step;  /* which message is being read or written */
    size_t off; /* bytes of it moved so far */
    size_t got; /* bytes received in all */
    uint8_t hello[DDP__HS_MSG_MAX], msg[DDP__HS_MSG_MAX];
    uint8_t nonce[32]; /* ours, from the CHALLENGE */
    int peer;  /* the client's claimed rank, once its HELLO was checked; -1 before */
    int stream; /* and its connection number */
} ddp__hs_srv;

void ddp__hs_srv_init(ddp__hs_srv *s, int fd);
/* Moves the exchange on as far as the socket allows without waiting:
 * 1 done (s->peer is the client's rank, s->stream its connection), 0 waiting for the socket (poll it
 * for ddp__hs_srv_events), < 0 failed (the client was told why, when it
 * deserves an answer; the message says what was wrong).  connected[] as for
 * ddp__hs_server; it is checked again when the exchange completes. */
int ddp__hs_srv_step(ddp__hs_srv *s, const ddp__hs_ctx *ctx, const unsigned char *connected,
                     const char *what);
short ddp__hs_srv_events(const ddp__hs_srv *s); /* POLLIN or POLLOUT */
/* Sets the error of a handshake that did not finish in time; returns
 * DDP_ERR_TIMEOUT. */
int ddp__hs_srv_timeout(const ddp__hs_srv *s, double waited, const char *what);

#endif
