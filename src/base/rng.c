/* xoshiro256** with splitmix64 seeding, and getrandom; see rng.h. */
#include "base/rng.h"

#include <errno.h>
#include <math.h>
#include <sys/random.h>
#include <sys/types.h>

#include "base/error.h"

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void ddp__rng_seed(ddp__rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

uint64_t ddp__rng_next(ddp__rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double ddp__rng_uniform(ddp__rng *r)
{
    return (double)(ddp__rng_next(r) >> 11) * 0x1.0p-53;
}

/* Two elements per draw, compared as integers: a double per element and a
 * call per draw made dropout 5 % of ddp-cnn's step. */
void ddp__rng_keep_mask(ddp__rng *r, float *mask, size_t n, double p, float keep)
{
    double scaled = ceil(p * 0x1.0p32); /* keep iff a 32-bit draw >= this */
    uint64_t cut = !(scaled > 0) ? 0 : scaled >= 0x1.0p32 ? (1ULL << 32) : (uint64_t)scaled;
    size_t i = 0;
    for (; i + 2 <= n; i += 2) {
        uint64_t x = ddp__rng_next(r);
        mask[i] = (x >> 32) >= cut ? keep : 0.0f;
        mask[i + 1] = (x & 0xffffffffULL) >= cut ? keep : 0.0f;
    }
    if (i < n)
        mask[i] = (ddp__rng_next(r) >> 32) >= cut ? keep : 0.0f;
}

uint64_t ddp__rng_below(ddp__rng *r, uint64_t n)
{
    /* Rejection sampling over the largest multiple of n. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do
        x = ddp__rng_next(r);
    while (x >= limit);
    return x % n;
}

int ddp__random_bytes(void *buf, size_t n)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t got = getrandom(p, n, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return DDP_ERROR_ERRNO(DDP_ERR_SYSTEM, errno, "getrandom");
        p += got;
        n -= (size_t)got;
    }
    return 0;
}
