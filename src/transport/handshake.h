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
    const uint8_t *secret; /* may be NULL (no secret) */
    size_t secret_len;
} ddp__hs_ctx;

/* Client side on a connected socket: proves itself to rank `peer`.
 * what names the peer in messages. */
int ddp__hs_client(int fd, const ddp__hs_ctx *ctx, int peer, double deadline, const char *what);
/* Server side: reads a HELLO and runs the exchange.  On success *peer is the
 * client's rank; a rank whose bit in connected[] is set is refused (joined
 * twice).  Failures return a negative code with the reason in the message. */
int ddp__hs_server(int fd, const ddp__hs_ctx *ctx, const unsigned char *connected,
                   double deadline, const char *what, int *peer);

#endif
