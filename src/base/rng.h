/* Seeded pseudo-random numbers: xoshiro256** seeded through splitmix64
 * (Blackman & Vigna).  Fast, small state, reproducible across platforms;
 * each user (init, dropout, shuffling) owns its own generator. */
#ifndef DDP_BASE_RNG_H
#define DDP_BASE_RNG_H

#include <stdint.h>

typedef struct ddp__rng {
    uint64_t s[4];
} ddp__rng;

void ddp__rng_seed(ddp__rng *r, uint64_t seed);
uint64_t ddp__rng_next(ddp__rng *r);
/* Uniform double in [0, 1) with 53 random bits. */
double ddp__rng_uniform(ddp__rng *r);
/* Uniform integer in [0, n) without modulo bias; n > 0. */
uint64_t ddp__rng_below(ddp__rng *r, uint64_t n);

#endif
