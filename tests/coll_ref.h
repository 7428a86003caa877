/* Reference values for the collective tests: deterministic inputs per
 * (case, rank, element) and element-wise reductions computed independently
 * of the library's kernels (plain scalar C, _Float16 for half where the
 * compiler has it), folded in the order docs/algorithms.md documents. */
#ifndef DDP_TESTS_COLL_REF_H
#define DDP_TESTS_COLL_REF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "ddp/pg.h"

static uint64_t ref_hash(uint64_t a, uint64_t b, uint64_t c)
{
    uint64_t z = a * 0x9e3779b97f4a7c15ULL ^ (b + 0x632be59bd9b4e019ULL) * 0xbf58476d1ce4e5b9ULL ^
                 (c + 1) * 0x94d049bb133111ebULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint32_t ref_f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float ref_u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#ifdef __FLT16_MAX__
static float ref_h2f(uint16_t h)
{
    _Float16 x;
    memcpy(&x, &h, 2);
    return (float)x;
}
static uint16_t ref_f2h(float f)
{
    _Float16 x = (_Float16)f;
    uint16_t h;
    memcpy(&h, &x, 2);
    return h;
}
#else
#include "coll/reduce.h"
static float ref_h2f(uint16_t h) { return ddp__half_to_float(h); }
static uint16_t ref_f2h(float f) { return ddp__float_to_half(f); }
#endif

static float ref_b2f(uint16_t h) { return ref_u2f((uint32_t)h << 16); }
static uint16_t ref_f2b(float f)
{
    uint32_t x = ref_f2u(f);
    uint32_t lsb = (x >> 16) & 1;
    return (uint16_t)((x + 0x7fff + lsb) >> 16); /* finite inputs only */
}

/* Input element i of rank r in case c, written to out (one element). */
static void ref_input(void *out, ddp_dtype dt, ddp_reduce_op op, uint64_t c, int r, size_t i)
{
    uint64_t h = ref_hash(c, (uint64_t)r, i);
    double u = (double)(h >> 11) * 0x1p-53;
    double v = op == DDP_PRODUCT ? 0.5 + u : 2 * u - 1;
    switch (dt) {
    case DDP_FLOAT32: *(float *)out = (float)v; break;
    case DDP_FLOAT64: *(double *)out = v; break;
    case DDP_INT32: *(int32_t *)out = (int32_t)(uint32_t)h; break;
    case DDP_INT64: *(int64_t *)out = (int64_t)h; break;
    case DDP_UINT8: *(uint8_t *)out = (uint8_t)h; break;
    case DDP_FLOAT16: *(uint16_t *)out = ref_f2h((float)v); break;
    case DDP_BFLOAT16: *(uint16_t *)out = ref_f2b((float)v); break;
    }
}

#define REF_MIN(x, y) ((y) < (x) ? (y) : (x))
#define REF_MAX(x, y) ((y) > (x) ? (y) : (x))

#define REF_FLOAT_OP(T)                                  \
    do {                                                 \
        T x = *(T *)acc, y = *(const T *)b;              \
        switch (op) {                                    \
        case DDP_PRODUCT: x = x * y; break;              \
        case DDP_MIN: x = REF_MIN(x, y); break;          \
        case DDP_MAX: x = REF_MAX(x, y); break;          \
        default: x = x + y; break;                       \
        }                                                \
        *(T *)acc = x;                                   \
    } while (0)

#define REF_INT_OP(T, U)                                 \
    do {                                                 \
        T x = *(T *)acc, y = *(const T *)b;              \
        switch (op) {                                    \
        case DDP_PRODUCT: x = (T)((U)x * (U)y); break;   \
        case DDP_MIN: x = REF_MIN(x, y); break;          \
        case DDP_MAX: x = REF_MAX(x, y); break;          \
        case DDP_BAND: x = (T)(x & y); break;            \
        case DDP_BOR: x = (T)(x | y); break;             \
        case DDP_BXOR: x = (T)(x ^ y); break;            \
        default: x = (T)((U)x + (U)y); break;            \
        }                                                \
        *(T *)acc = x;                                   \
    } while (0)

/* acc = acc op b, one element. */
static void ref_combine(void *acc, const void *b, ddp_dtype dt, ddp_reduce_op op)
{
    switch (dt) {
    case DDP_FLOAT32: REF_FLOAT_OP(float); break;
    case DDP_FLOAT64: REF_FLOAT_OP(double); break;
    case DDP_INT32: REF_INT_OP(int32_t, uint32_t); break;
    case DDP_INT64: REF_INT_OP(int64_t, uint64_t); break;
    case DDP_UINT8: REF_INT_OP(uint8_t, unsigned); break;
    default: break; /* 16-bit floats: ref_combine_any */
    }
}
#undef REF_FLOAT_OP
#undef REF_INT_OP

/* acc = acc op b for every dtype: 16-bit floats widen to float, combine,
 * round to nearest even. */
static void ref_combine_any(void *acc, const void *b, ddp_dtype dt, ddp_reduce_op op)
{
    if (dt == DDP_FLOAT16 || dt == DDP_BFLOAT16) {
        float (*to)(uint16_t) = dt == DDP_FLOAT16 ? ref_h2f : ref_b2f;
        uint16_t (*from)(float) = dt == DDP_FLOAT16 ? ref_f2h : ref_f2b;
        float x = to(*(uint16_t *)acc), y = to(*(const uint16_t *)b);
        float z = op == DDP_PRODUCT ? x * y : op == DDP_MIN ? REF_MIN(x, y)
                                          : op == DDP_MAX ? REF_MAX(x, y) : x + y;
        *(uint16_t *)acc = from(z);
        return;
    }
    ref_combine(acc, b, dt, op);
}

static void ref_divide(void *acc, ddp_dtype dt, int n)
{
    switch (dt) {
    case DDP_FLOAT32: *(float *)acc /= (float)n; break;
    case DDP_FLOAT64: *(double *)acc /= n; break;
    case DDP_INT32: *(int32_t *)acc /= n; break;
    case DDP_INT64: *(int64_t *)acc /= n; break;
    case DDP_UINT8: *(uint8_t *)acc = (uint8_t)(*(uint8_t *)acc / n); break;
    case DDP_FLOAT16: *(uint16_t *)acc = ref_f2h(ref_h2f(*(uint16_t *)acc) / (float)n); break;
    case DDP_BFLOAT16: *(uint16_t *)acc = ref_f2b(ref_b2f(*(uint16_t *)acc) / (float)n); break;
    }
}

/* Reduction orders (docs/algorithms.md). */
enum { ORDER_RANK, ORDER_RING, ORDER_RD, ORDER_RAB, ORDER_TREE };

/* The tree all-reduce's order, computed from its definition rather than
 * from the links the library walks: the m values sit at positions 0..m-1
 * (tree 0: rank r at r; tree 1: at m-1-r for even m, at r-1 mod m for odd
 * m); the positions lo..hi form a subtree whose root is the one with the
 * most trailing zeros (0 the most of all), folded as (left interval op
 * root) op right interval. */
static int ref_tree_tz(int p)
{
    int z = 0;
    if (p == 0)
        return 64;
    while (!(p & 1)) {
        p >>= 1;
        z++;
    }
    return z;
}

static int ref_tree_rank(int m, int tree, int pos)
{
    return tree == 0 ? pos : m % 2 == 0 ? m - 1 - pos : (pos + 1) % m;
}

static void ref_tree_fold(uint8_t (*vals)[8], int m, int tree, int lo, int hi, ddp_dtype dt,
                          ddp_reduce_op op, uint8_t *acc)
{
    int top = lo;
    for (int p = lo + 1; p <= hi; p++)
        if (ref_tree_tz(p) > ref_tree_tz(top))
            top = p;
    if (top > lo) {
        ref_tree_fold(vals, m, tree, lo, top - 1, dt, op, acc);
        ref_combine_any(acc, vals[ref_tree_rank(m, tree, top)], dt, op);
    } else {
        memcpy(acc, vals[ref_tree_rank(m, tree, top)], 8);
    }
    if (top < hi) {
        uint8_t right[8];
        ref_tree_fold(vals, m, tree, top + 1, hi, dt, op, right);
        ref_combine_any(acc, right, dt, op);
    }
}

/* The tree (half) of element i of count: tree 0 takes the first
 * count - count/2 elements. */
__attribute__((unused)) static int tree_of(size_t i, size_t count)
{
    return i < count - count / 2 ? 0 : 1;
}

/* Folds the m values vals[] (partials of ranks, or of hosts) in the given
 * order into acc (vals is clobbered).  AVG folds as SUM.  ring_block: the
 * ring block of the element (ORDER_RING) or its tree (ORDER_TREE). */
static void ref_fold(uint8_t (*vals)[8], int m, ddp_dtype dt, ddp_reduce_op op, int order,
                     int ring_block, uint8_t *acc)
{
    if (order == ORDER_RD || order == ORDER_RAB) {
        int p2 = 1;
        while (p2 * 2 <= m)
            p2 *= 2;
        for (int j = 0; j + p2 < m; j++)
            ref_combine_any(vals[j], vals[j + p2], dt, op);
        if (order == ORDER_RD) /* pairs differing in the lowest bit first */
            for (int mask = 1; mask < p2; mask <<= 1)
                for (int j = 0; j < p2; j += 2 * mask)
                    ref_combine_any(vals[j], vals[j + mask], dt, op);
        else /* recursive halving: the highest bit first */
            for (int mask = p2 / 2; mask >= 1; mask >>= 1)
                for (int j = 0; j < mask; j++)
                    ref_combine_any(vals[j], vals[j + mask], dt, op);
        memcpy(acc, vals[0], 8);
        return;
    }
    if (order == ORDER_TREE) {
        ref_tree_fold(vals, m, ring_block, 0, m - 1, dt, op, acc);
        return;
    }
    int first = order == ORDER_RING ? (ring_block + 1) % m : 0;
    memcpy(acc, vals[first], 8);
    for (int k = 1; k < m; k++)
        ref_combine_any(acc, vals[(first + k) % m], dt, op);
}

/* Does op apply to dt?  (Bitwise ops need integers.) */
__attribute__((unused)) static int op_applies(ddp_dtype dt, ddp_reduce_op op)
{
    return dt == DDP_INT32 || dt == DDP_INT64 || dt == DDP_UINT8 || op < DDP_BAND;
}

/* The ring block of element i when count is split into n near-equal
 * blocks (the first count % n one element longer). */
__attribute__((unused)) static size_t ring_block_of(size_t i, size_t count, int n)
{
    size_t base = count / (size_t)n, rem = count % (size_t)n;
    if (i < rem * (base + 1))
        return i / (base + 1);
    return rem + (i - rem * (base + 1)) / base;
}

/* ref_reduce's ring_block argument for element i of count folded over m
 * ranks (or hosts) in order. */
__attribute__((unused)) static int ref_where(int order, size_t i, size_t count, int m)
{
    return order == ORDER_RING   ? (int)ring_block_of(i, count, m)
           : order == ORDER_TREE ? tree_of(i, count)
                                 : 0;
}

/* Element i of the reduction of case c over n ranks, into out.  ring_block
 * is the ring block holding i (ORDER_RING) or its tree (ORDER_TREE:
 * tree_of). */
__attribute__((unused)) static void ref_reduce(void *out, ddp_dtype dt, ddp_reduce_op op,
                                               uint64_t c, int n, size_t i, int order,
                                               int ring_block)
{
    uint8_t acc[8], vals[64][8] = {{0}};
    for (int r = 0; r < n; r++)
        ref_input(vals[r], dt, op, c, r, i);
    ref_fold(vals, n, dt, op, order, ring_block, acc);
    if (op == DDP_AVG)
        ref_divide(acc, dt, n);
    memcpy(out, acc, ddp_dtype_size(dt));
}

/* Element i of a hierarchical all-reduce (docs/hierarchical.md): each
 * host's inputs folded in rank order, then the host partials (hosts numbered
 * by their lowest rank, host_of[r] for rank r) folded in the leaders'
 * order (ORDER_RANK for direct, ORDER_RD, ORDER_RING with the ring block of
 * i over nhosts blocks), AVG dividing by n once at the end. */
__attribute__((unused)) static void ref_reduce_hier(void *out, ddp_dtype dt, ddp_reduce_op op,
                                                    uint64_t c, int n, size_t i,
                                                    const int *host_of, int nhosts, int order,
                                                    int ring_block)
{
    uint8_t y[64][8] = {{0}}, x[8], acc[8];
    int seen[64] = {0};
    for (int r = 0; r < n; r++) {
        int h = host_of[r];
        if (!seen[h]) {
            ref_input(y[h], dt, op, c, r, i);
            seen[h] = 1;
            continue;
        }
        ref_input(x, dt, op, c, r, i);
        ref_combine_any(y[h], x, dt, op);
    }
    ref_fold(y, nhosts, dt, op, order, ring_block, acc);
    if (op == DDP_AVG)
        ref_divide(acc, dt, n);
    memcpy(out, acc, ddp_dtype_size(dt));
}

#endif
