/* SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for authenticating peers
 * with a shared secret (store and transport handshakes).  Not for bulk
 * hashing of tensors: it is a plain portable implementation. */
#ifndef DDP_BASE_SHA256_H
#define DDP_BASE_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define DDP__SHA256_LEN 32

typedef struct ddp__sha256_ctx {
    uint32_t h[8];
    uint64_t bytes;
    uint8_t block[64];
    size_t used;
} ddp__sha256_ctx;

void ddp__sha256_init(ddp__sha256_ctx *c);
void ddp__sha256_update(ddp__sha256_ctx *c, const void *data, size_t len);
void ddp__sha256_final(ddp__sha256_ctx *c, uint8_t out[DDP__SHA256_LEN]);
/* One-shot digest of data. */
void ddp__sha256(const void *data, size_t len, uint8_t out[DDP__SHA256_LEN]);
/* HMAC-SHA256(key, msg). */
void ddp__hmac_sha256(const void *key, size_t klen, const void *msg, size_t mlen,
                      uint8_t out[DDP__SHA256_LEN]);
/* Compares n bytes in time independent of where they differ; 1 if equal. */
int ddp__ct_equal(const void *a, const void *b, size_t n);

#endif
