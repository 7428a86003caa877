/* Seeded pseudo-random numbers: xoshiro256** seeded through splitmix64
 * (Blackman & Vigna).  Fast, small state, reproducible across platforms;
 * each user (init, dropout, shuffling) owns its own generator.  And the
 * kernel's randomness, for what must not be reproducible (nonces, names). */
#ifndef DDP_BASE_RNG_H
#define DDP_BASE_RNG_H

#include <stddef.h>
#include <stdint.h>

typedef struct ddp__rng {
    uint64_t s[4];
} ddp__rng;

void ddp__rng_seed(ddp__rng *r, uint64_t seed);
uint64_t ddp__rng_next(ddp__rng *r);
/* Uniform double in [0, 1) with 53 random bits. */
double ddp__rng_uniform(ddp__rng *r);
/* Dropout's mask: mask[i] = keep with probability 1 - p (p in [0, 1]),
 * else 0, from one 32-bit half of a draw per element (p to 2^-32). */
void ddp__rng_keep_mask(ddp__rng *r, float *mask, size_t n, double p, float keep);
/* Uniform integer in [0, n) without modulo bias; n > 0. */
uint64_t ddp__rng_below(ddp__rng *r, uint64_t n);

/* Fills buf with n bytes from the kernel's random source (getrandom). */
int ddp__random_bytes(void *buf, size_t n);

#endif
