/* Element types: the conversions of float16 (IEEE binary16) and bfloat16
 * to and from float32, round to nearest even.  The tables of sizes and names
 * behind ddp_dtype_size/name/parse (include/ddp/base.h) are in dtype.c.
 *
 * The conversions are inline: coll/'s reduction kernels call them once per
 * element and must inline them to vectorise (bfloat16's rounding is
 * branch-free for that reason), and DDP's fp16/bf16 communication hooks
 * (ddp/ddp.c) convert whole buckets with them. */
#ifndef DDP_BASE_DTYPE_H
#define DDP_BASE_DTYPE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ddp/base.h"

static inline uint32_t ddp__f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float ddp__f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float ddp__half_to_float(uint16_t h)
{
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) {
        float f = (float)m * 0x1p-24f; /* zero or subnormal */
        return s ? -f : f;
    }
    if (e == 31)
        return ddp__f32_from_bits(s | 0x7f800000u | m << 13);
    return ddp__f32_from_bits(s | (e + 112) << 23 | m << 13);
}

static inline uint16_t ddp__float_to_half(float f)
{
    uint32_t x = ddp__f32_bits(f), s = (x >> 16) & 0x8000;
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) /* inf, or NaN made quiet keeping its payload's top (as F16C) */
        return (uint16_t)(s | 0x7c00 | (x > 0x7f800000u ? 0x200 | (x & 0x7fffffu) >> 13 : 0));
    if (x >= 0x477ff000u) /* rounds to 65520 or more: overflow */
        return (uint16_t)(s | 0x7c00);
    if (x < 0x38800000u) /* below the smallest normal half: subnormal */
        return (uint16_t)(s | (uint32_t)lrintf(ddp__f32_from_bits(x) * 0x1p24f));
    x += 0xfffu + ((x >> 13) & 1u);
    return (uint16_t)(s | (x - 0x38000000u) >> 13);
}

/* bfloat16: widening is a shift; rounding to nearest even is branch-free
 * (a NaN stays a quiet NaN). */
static inline float ddp__bf16_to_float(uint16_t h) { return ddp__f32_from_bits((uint32_t)h << 16); }

static inline uint16_t ddp__float_to_bf16(float f)
{
    uint32_t x = ddp__f32_bits(f), r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? (x >> 16) | 0x40 : r);
}

#endif
