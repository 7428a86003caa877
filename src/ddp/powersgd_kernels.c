/* PowerSGD's passes over a gradient matrix (powersgd.c), each one sweep of
 * its rows: the matrix is as large as the layer (23 MB for the wide MLP's),
 * so the cost is the memory traffic, not the (rows + cols) r arithmetic.
 * PyTorch spends five sweeps and a copy (add the error, copy the input,
 * P = M Q, Q = M^T P, M = P Q^T, error = copy - M) plus GEMM packing;
 * these three keep M in the error buffer instead of a copy:
 *   add_project  E = (E +) G, and P = E Q, row by row (the row stays in L1)
 *   accumulate_q Q^T += P[k] E[k] for each row k (Q^T is r x cols: cache)
 *   reconstruct  G = P Q^T, and E -= G (the new error), row by row
 * Q is passed transposed (r x cols) so that every inner loop is unit
 * stride.  Built with the full vectoriser and AVX-512/AVX2 clones as
 * tensor/kernels.c (its header says why); the sums have 16 fixed lanes, so
 * every clone computes the same bits. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif

#include "ddp/powersgd_impl.h"
#include "tensor/kernels.h"

enum { LANES = 16 };

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

void ddp__psgd_accumulate_q(float *restrict qt, const float *restrict e, const float *restrict p,
                            int64_t rows, int64_t cols, int r)
{
    for (int64_t i = 0; i < (int64_t)r * cols; i++)
        qt[i] = 0;
    for (int64_t k = 0; k < rows; k++)
        for (int j = 0; j < r; j++)
            ddp__vec_axpy(qt + j * cols, p[k * r + j], e + k * cols, (size_t)cols);
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
