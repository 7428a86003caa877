/* TCPStore wire format helpers (see tcp_proto.h), the shared-secret loading
 * and the handshake's MAC. */
#include "store/tcp_proto.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/sha256.h"

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void ddp__ts_header_encode(uint8_t p[DDP__TS_HEADER], int opcode, uint32_t length,
                           int32_t status)
{
    put32(p, DDP__TS_MAGIC);
    p[4] = DDP__TS_VERSION;
    p[5] = (uint8_t)opcode;
    p[6] = p[7] = 0;
    put32(p + 8, length);
    put32(p + 12, (uint32_t)status);
}

int ddp__ts_header_decode(const uint8_t p[DDP__TS_HEADER], uint32_t max, ddp__ts_header *h,
                          const char **why)
{
    h->magic = get32(p);
    h->version = p[4];
    h->opcode = p[5];
    h->flags = (uint16_t)(p[6] | p[7] << 8);
    h->length = get32(p + 8);
    h->status = (int32_t)get32(p + 12);
    *why = NULL;
    if (h->magic != DDP__TS_MAGIC)
        *why = "bad magic (not a libddp store peer)";
    else if (h->version != DDP__TS_VERSION)
        *why = "unsupported protocol version";
    else if (h->opcode < DDP__TS_HELLO || h->opcode >= DDP__TS_OP_END)
        *why = "unknown opcode";
    else if (h->flags != 0)
        *why = "unknown flags";
    else if (h->length > max)
        *why = "message length over the limit";
    return *why ? DDP_ERR_PROTOCOL : 0;
}

/* ---- writer ------------------------------------------------------------- */

static uint8_t *grow(ddp__ts_writer *w, size_t n)
{
    if (w->err)
        return NULL;
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + n)
            cap *= 2;
        uint8_t *b = realloc(w->buf, cap);
        if (!b) {
            w->err = DDP_ERR_NOMEM;
            return NULL;
        }
        w->buf = b;
        w->cap = cap;
    }
    uint8_t *p = w->buf + w->len;
    w->len += n;
    return p;
}

void ddp__ts_begin(ddp__ts_writer *w)
{
    w->len = 0;
    w->err = 0;
    grow(w, DDP__TS_HEADER);
}

void ddp__ts_u8(ddp__ts_writer *w, uint8_t v)
{
    uint8_t *p = grow(w, 1);
    if (p)
        *p = v;
}

void ddp__ts_u32(ddp__ts_writer *w, uint32_t v)
{
    uint8_t *p = grow(w, 4);
    if (p)
        put32(p, v);
}

void ddp__ts_u64(ddp__ts_writer *w, uint64_t v)
{
    ddp__ts_u32(w, (uint32_t)v);
    ddp__ts_u32(w, (uint32_t)(v >> 32));
}

void ddp__ts_raw(ddp__ts_writer *w, const void *src, size_t n)
{
    uint8_t *p = grow(w, n);
    if (p && n)
        memcpy(p, src, n);
}

void ddp__ts_bytes(ddp__ts_writer *w, const void *src, size_t n)
{
    ddp__ts_u32(w, (uint32_t)n);
    ddp__ts_raw(w, src, n);
}

int ddp__ts_finish(ddp__ts_writer *w, int opcode, int32_t status)
{
    if (w->err)
        return w->err;
    ddp__ts_header_encode(w->buf, opcode, (uint32_t)(w->len - DDP__TS_HEADER), status);
    return (int)(w->len > 0x7fffffff ? 0x7fffffff : w->len);
}

/* ---- reader ------------------------------------------------------------- */

const uint8_t *ddp__ts_get_raw(ddp__ts_reader *r, size_t n)
{
    if (r->err || r->len - r->pos < n) {
        r->err = DDP_ERR_PROTOCOL;
        return NULL;
    }
    const uint8_t *p = r->p + r->pos;
    r->pos += n;
    return p;
}

uint8_t ddp__ts_get_u8(ddp__ts_reader *r)
{
    const uint8_t *p = ddp__ts_get_raw(r, 1);
    return p ? *p : 0;
}

uint32_t ddp__ts_get_u32(ddp__ts_reader *r)
{
    const uint8_t *p = ddp__ts_get_raw(r, 4);
    return p ? get32(p) : 0;
}

uint64_t ddp__ts_get_u64(ddp__ts_reader *r)
{
    uint64_t lo = ddp__ts_get_u32(r);
    return lo | (uint64_t)ddp__ts_get_u32(r) << 32;
}

const uint8_t *ddp__ts_get_bytes(ddp__ts_reader *r, size_t max, size_t *n)
{
    *n = ddp__ts_get_u32(r);
    if (*n > max) {
        r->err = DDP_ERR_PROTOCOL;
        return NULL;
    }
    return ddp__ts_get_raw(r, *n);
}

/* ---- secret and handshake ----------------------------------------------- */

void ddp__ts_auth_mac(const uint8_t *secret, size_t slen, int from_server,
                      const uint8_t server_nonce[DDP__TS_NONCE],
                      const uint8_t client_nonce[DDP__TS_NONCE], uint8_t mac[32])
{
    uint8_t msg[20 + 2 * DDP__TS_NONCE];
    memcpy(msg, from_server ? "ddp-store-v1 server" : "ddp-store-v1 client", 20);
    memcpy(msg + 20, server_nonce, DDP__TS_NONCE);
    memcpy(msg + 20 + DDP__TS_NONCE, client_nonce, DDP__TS_NONCE);
    ddp__hmac_sha256(secret, slen, msg, sizeof msg, mac);
}
