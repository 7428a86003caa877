/* The weight gradient of a Winograd F(2x2, 3x3) convolution (see
 * conv_winograd.h), itself a minimal filtering F(3x3, 2x2).
 *
 * The forward makes every 2x2 output tile Y = A^T [U . V] A, U = G g G^T,
 * V = B^T d B.  Its gradient against g, summed over tiles, is therefore
 *   dg = G^T [ sum_tiles (A dY A^T) . V ] G
 * and the sum over tiles, for all (output, input) channel pairs at once, is
 * 16 GEMMs  dU_i (o, c) += dM_i (o, t) V_i (c, t)^T,  dM = A dY A^T.
 * For the MNIST network's second layer that is 10.2 MFLOP of GEMM per
 * sample (144 tiles, 156 with the spare ones) against im2col's 21.2, and
 * no cols (288 x 576 floats) written and read per sample.  V is the
 * forward's input transform, recomputed (keeping every sample's would
 * take 320 KiB each from the arena); dM's spare and cut tiles are zero, so
 * whatever V holds there adds nothing. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif

#include "nn/conv_winograd.h"

#include <string.h>

#include "ddp/tensor.h"
#include "tensor/kernels.h"

/* Row i = 4k + l of dM for t tiles from dy's even rows ye and odd rows yo,
 * laid out as the output transform's (tile z: ye[2z], ye[2z + 1], yo[2z],
 * yo[2z + 1]): dM[k][l] = sum_ab A[k][a] A[l][b] dY[a][b], A = [1 0; 1 1;
 * 1 -1; 0 -1], the coefficients c (c[2a + b]) being 0 or +-1 (exact).  One
 * row per call: with all 16 rows stored in one loop gcc vectorised none. */
DDP_KERNEL static void grad_row(float *restrict m, const float *restrict ye,
                                const float *restrict yo, const float c[4], int t)
{
    float c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3];
    for (int z = 0; z < t; z++)
        m[z] = c0 * ye[2 * z] + c1 * ye[2 * z + 1] + c2 * yo[2 * z] + c3 * yo[2 * z + 1];
}

static const float wino_a[4][2] = {{1, 0}, {1, 1}, {1, -1}, {0, -1}};

/* dM's 16 rows (stride ms) for one channel's t tiles. */
static void grad_tiles(float *m, size_t ms, const float *ye, const float *yo, int t)
{
    for (int k = 0; k < 4; k++)
        for (int l = 0; l < 4; l++) {
            float c[4];
            for (int ab = 0; ab < 4; ab++)
                c[ab] = wino_a[k][ab / 2] * wino_a[l][ab % 2];
            grad_row(m + (size_t)(4 * k + l) * ms, ye, yo, c, t);
        }
}

/* dM (16, o, t) of dy (o, oh, ow): one channel's rows split by parity into
 * rows (2 th rows of wp), zero past ow and past oh. */
static void grad_transform(float *m, const float *dy, float *rows, const ddp__wino_plan *p)
{
    size_t ms = (size_t)p->o * (size_t)p->t, wp = (size_t)p->wp, ow = (size_t)p->ow;
    float *ye = rows, *yo = rows + (size_t)p->th * wp;
    for (int oi = 0; oi < p->o; oi++) {
        const float *dyc = dy + (size_t)oi * (size_t)p->oh * ow;
        for (int r = 0; r < 2 * p->th; r++) {
            float *row = (r % 2 ? yo : ye) + (size_t)(r / 2) * wp;
            size_t have = r < p->oh ? ow : 0;
            if (have)
                memcpy(row, dyc + (size_t)r * ow, have * sizeof *row);
            memset(row + have, 0, (wp - have) * sizeof *row);
        }
        grad_tiles(m + (size_t)oi * (size_t)p->t, ms, ye, yo, p->t);
    }
}

void ddp__wino_dw_sample(const ddp__wino_plan *p, float *du, const float *x, const float *dy,
                         int acc, float *scratch)
{
    if (p->m == 4) {
        ddp__wino4_dw_sample(p, du, x, dy, acc, scratch);
        return;
    }
    ddp__wino_scratch s = ddp__wino_scratch_parts(p, scratch);
    size_t vs = (size_t)p->c * (size_t)p->t, ms = (size_t)p->o * (size_t)p->t;
    ddp__wino_input(p, x, &s);
    grad_transform(s.m, dy, s.rows, p);
    for (int i = 0; i < 16; i++) /* dU_i (o, c) += dM_i (o, t) V_i (c, t)^T */
        ddp_sgemm(0, 1, p->o, p->c, p->t, 1.0f, s.m + (size_t)i * ms, p->t,
                  s.v + (size_t)i * vs, p->t, acc ? 1.0f : 0.0f,
                  du + (size_t)i * (size_t)p->o * (size_t)p->c, p->c);
}

/* G^T d G for one 4x4 d (row-major) into the 3x3 g (=|+=), G = [1 0 0;
 * .5 .5 .5; .5 -.5 .5; 0 0 1]: the transpose of filter_transform. */
static void filter_grad(float g[9], const float d[16], int acc)
{
    float r[3][4];
    for (int l = 0; l < 4; l++) {
        float d0 = d[l], d1 = d[4 + l], d2 = d[8 + l], d3 = d[12 + l];
        r[0][l] = d0 + 0.5f * (d1 + d2);
        r[1][l] = 0.5f * (d1 - d2);
        r[2][l] = 0.5f * (d1 + d2) + d3;
    }
    for (int k = 0; k < 3; k++) {
        float s[3] = {r[k][0] + 0.5f * (r[k][1] + r[k][2]), 0.5f * (r[k][1] - r[k][2]),
                      0.5f * (r[k][1] + r[k][2]) + r[k][3]};
        for (int q = 0; q < 3; q++)
            g[3 * k + q] = acc ? g[3 * k + q] + s[q] : s[q];
    }
}

void ddp__wino_filters_grad(float *restrict dw, const float *restrict du, int m, int o, int c,
                            int acc)
{
    size_t oc = (size_t)o * (size_t)c;
    int np = ddp__wino_points(m);
    for (size_t at = 0; at < oc; at++) { /* at = oi * c + ci, as dw's (o, c) */
        float d[36];
        for (int i = 0; i < np; i++)
            d[i] = du[(size_t)i * oc + at];
        if (m == 4)
            ddp__wino4_filter_grad(dw + at * 9, d, acc);
        else
            filter_grad(dw + at * 9, d, acc);
    }
}
