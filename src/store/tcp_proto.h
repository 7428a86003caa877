/* TCPStore wire format, shared by the server (tcp_server.c) and the client
 * (tcp_store.c).  docs/store.md describes it for people.
 *
 * Every message is a 16-byte header then `length` payload bytes:
 *     u32 magic "DDPS"  u8 version  u8 opcode  u16 flags (0)
 *     u32 length        i32 status (replies: 0 or a DDP_ERR_* code)
 * All integers little-endian.  Payload fields are u8/u32/u64 integers and
 * byte strings (u32 length, then the bytes).  A reply carries the opcode of
 * its request; an error reply carries a message (or, for a wait timeout,
 * one byte per waited key: present or not). */
#ifndef DDP_STORE_TCP_PROTO_H
#define DDP_STORE_TCP_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "store/store_impl.h"

#define DDP__TS_MAGIC 0x53504444u /* bytes 'D' 'D' 'P' 'S' */
#define DDP__TS_VERSION 1
#define DDP__TS_HEADER 16
#define DDP__TS_NONCE 32
/* Largest payload: compare_set carries a key and two values. */
#define DDP__TS_MAX_PAYLOAD (2u * DDP__STORE_MAX_VALUE + DDP__STORE_MAX_KEY + 64u)
/* Before authentication only HELLO/AUTH, which are small. */
#define DDP__TS_MAX_AUTH_PAYLOAD 256u

enum ddp__ts_op {
    DDP__TS_HELLO = 1, /* server -> client on accept: u8 auth_required, nonce[32],
                        * then (only when the server names its job) bytes job_id */
    DDP__TS_AUTH,      /* client: nonce[32], mac[32]; reply: mac[32] */
    DDP__TS_SET,       /* key, value; reply: empty */
    DDP__TS_GET,       /* u64 timeout_ms, key; reply: value */
    DDP__TS_ADD,       /* u64 delta (two's complement), key; reply: u64 new value */
    DDP__TS_CAS,       /* key, expected, desired; reply: u8 present, value */
    DDP__TS_WAIT,      /* u64 timeout_ms, u32 n, n keys; reply: empty */
    DDP__TS_CHECK,     /* u32 n, n keys; reply: u8 all exist */
    DDP__TS_DELETE,    /* key; reply: u8 deleted */
    DDP__TS_NUM_KEYS,  /* empty; reply: u64 count */
    DDP__TS_OP_END
};

typedef struct ddp__ts_header {
    uint32_t magic;
    uint8_t version, opcode;
    uint16_t flags;
    uint32_t length;
    int32_t status;
} ddp__ts_header;

void ddp__ts_header_encode(uint8_t p[DDP__TS_HEADER], int opcode, uint32_t length,
                           int32_t status);
/* Decodes and checks magic, version, opcode and the length limit (max).
 * Returns 0, or DDP_ERR_PROTOCOL with *why set to a static reason. */
int ddp__ts_header_decode(const uint8_t p[DDP__TS_HEADER], uint32_t max, ddp__ts_header *h,
                          const char **why);

/* Growing message buffer: a header placeholder then payload fields.
 * err is set (DDP_ERR_NOMEM) instead of failing each call. */
typedef struct ddp__ts_writer {
    uint8_t *buf;
    size_t len, cap;
    int err;
} ddp__ts_writer;
void ddp__ts_begin(ddp__ts_writer *w); /* len = 0, reserves the header */
void ddp__ts_u8(ddp__ts_writer *w, uint8_t v);
void ddp__ts_u32(ddp__ts_writer *w, uint32_t v);
void ddp__ts_u64(ddp__ts_writer *w, uint64_t v);
void ddp__ts_raw(ddp__ts_writer *w, const void *p, size_t n);
void ddp__ts_bytes(ddp__ts_writer *w, const void *p, size_t n); /* u32 n, bytes */
/* Fills the header in; returns total length or err. */
int ddp__ts_finish(ddp__ts_writer *w, int opcode, int32_t status);

/* Bounds-checked payload reader: a failed read sets err, later reads fail. */
typedef struct ddp__ts_reader {
    const uint8_t *p;
    size_t len, pos;
    int err;
} ddp__ts_reader;
uint8_t ddp__ts_get_u8(ddp__ts_reader *r);
uint32_t ddp__ts_get_u32(ddp__ts_reader *r);
uint64_t ddp__ts_get_u64(ddp__ts_reader *r);
const uint8_t *ddp__ts_get_raw(ddp__ts_reader *r, size_t n);
/* A byte string of at most max bytes; *n gets its length. */
const uint8_t *ddp__ts_get_bytes(ddp__ts_reader *r, size_t max, size_t *n);

/* Proofs of the secret for the handshake: HMAC-SHA256(secret, label ||
 * server_nonce || client_nonce), label "ddp-store-v1 client" or "... server". */
void ddp__ts_auth_mac(const uint8_t *secret, size_t slen, int from_server,
                      const uint8_t server_nonce[DDP__TS_NONCE],
                      const uint8_t client_nonce[DDP__TS_NONCE], uint8_t mac[32]);

#endif
