/* PowerSGD's passes over a gradient matrix (powersgd.c), each one sweep of
 * its rows: the matrix is as large as the layer (23 MB for the wide MLP's),
 * so the cost is the memory traffic, not the (rows + cols) r arithmetic.
 * PyTorch spends five sweeps and a copy (add the error, copy the input,
 * P = M Q, Q = M^T P, M = P Q^T, error = copy - M) plus GEMM packing;
 * these three keep M in the error buffer instead of a copy:
 *   add_project  E = (E +) G, and P = E Q
 *   accumulate_q Q^T += P[k] E[k] for each row k
 *   reconstruct  G = P Q^T, and E -= G (the new error)
 * Q is passed transposed (r x cols) so that every inner loop is unit
 * stride.
 *
 * add_project and reconstruct stream their rows at the memory's rate (3.4
 * and 3.2 ms per step for the wide MLP's 23 MB, 20-21 GB/s of reads and
 * writes here).  accumulate_q read each row once per rank r with an axpy
 * and Q^T (r x cols, 32 KB for r = 4 and 2048 columns, the L1's size) from
 * L2 for every row: 2.8 ms for 23 MB read.  It now sums blocks of rows in
 * registers (below): 1.8 ms, the same bits (every sum keeps its row order).
 * Built with the full vectoriser and AVX-512/AVX2 clones as
 * tensor/kernels.c (its header says why); the sums have fixed lanes and
 * orders, so every clone computes the same bits, as long as the build does
 * not contract a * b + c into one FMA (the Makefile's -std=c11 keeps gcc
 * from it; -std=gnu11 in CFLAGS would let the AVX-512 clone do it). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif

#include "ddp/powersgd_impl.h"
#include "tensor/kernels.h"

enum {
    LANES = 16, /* partial sums per dot; accumulate_q's columns at a time */
    ROWS = 8    /* accumulate_q's rows per block (measured here: 4 rows take 1.4x
                 * the time of 8, 16 rows 2x) */
};

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* sum over c of a[c] b[c], in LANES partial sums added in a fixed order. */
static inline float dot(const float *restrict a, const float *restrict b, int64_t n)
{
    float s[LANES] = {0};
    int64_t c = 0;
    for (; c + LANES <= n; c += LANES)
        for (int l = 0; l < LANES; l++)
            s[l] += a[c + l] * b[c + l];
    for (int l = 0; c < n; c++, l++)
        s[l] += a[c] * b[c];
    float t = 0;
    for (int l = 0; l < LANES; l++)
        t += s[l];
    return t;
}

DDP_KERNEL void ddp__psgd_add_project(float *restrict e, const float *restrict g,
                                      const float *restrict qt, float *restrict p, int64_t rows,
                                      int64_t cols, int r, int add)
{
    for (int64_t k = 0; k < rows; k++) {
        float *ek = e + k * cols;
        const float *gk = g + k * cols;
        if (add)
            for (int64_t c = 0; c < cols; c++)
                ek[c] += gk[c];
        else
            for (int64_t c = 0; c < cols; c++)
                ek[c] = gk[c];
        for (int j = 0; j < r; j++)
            p[k * r + j] = dot(ek, qt + j * cols, cols);
    }
}

/* Q^T's row j, 16 columns at a time: their sums over a block of ROWS rows
 * stay in registers, and the block's 64 bytes of each row in L1 while
 * every rank's sums read them; row order within every sum, as one axpy
 * per row would add them. */
DDP_KERNEL void ddp__psgd_accumulate_q(float *restrict qt, const float *restrict e,
                                       const float *restrict p, int64_t rows, int64_t cols, int r)
{
    for (int64_t i = 0; i < (int64_t)r * cols; i++)
        qt[i] = 0;
    const int64_t cols16 = cols - cols % LANES;
    for (int64_t k0 = 0; k0 < rows; k0 += ROWS) {
        const int64_t k1 = min64(k0 + ROWS, rows);
        for (int64_t c = 0; c < cols16; c += LANES)
            for (int j = 0; j < r; j++) {
                float *qj = qt + (int64_t)j * cols + c, acc[LANES];
                for (int l = 0; l < LANES; l++)
                    acc[l] = qj[l];
                for (int64_t k = k0; k < k1; k++) {
                    const float a = p[k * r + j], *ek = e + k * cols + c;
                    for (int l = 0; l < LANES; l++)
                        acc[l] += a * ek[l];
                }
                for (int l = 0; l < LANES; l++)
                    qj[l] = acc[l];
            }
        for (int j = 0; j < r; j++) /* the columns past the last 16 */
            for (int64_t k = k0; k < k1; k++)
                for (int64_t c = cols16; c < cols; c++)
                    qt[(int64_t)j * cols + c] += p[k * r + j] * e[k * cols + c];
    }
}

DDP_KERNEL void ddp__psgd_reconstruct(float *restrict g, float *restrict e,
                                      const float *restrict p, const float *restrict qt,
                                      int64_t rows, int64_t cols, int r, int feedback)
{
    for (int64_t k = 0; k < rows; k++) {
        float *gk = g + k * cols, *ek = e + k * cols;
        const float *pk = p + k * r;
        for (int64_t c = 0; c < cols; c++)
            gk[c] = pk[0] * qt[c];
        for (int j = 1; j < r; j++)
            for (int64_t c = 0; c < cols; c++)
                gk[c] += pk[j] * qt[j * cols + c];
        if (feedback)
            for (int64_t c = 0; c < cols; c++)
                ek[c] -= gk[c];
    }
}
