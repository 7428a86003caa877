/* Winograd F(4x4, 3x3) for one sample (see conv_winograd.h): each 4x4
 * output tile from its 6x6 input patch d as
 *   Y = A^T [ (G g G^T) . (B^T d B) ] A
 * with Lavin and Gray's matrices for the points 0, 1, -1, 2, -2 and
 * infinity: 36 multiplications per tile and input channel for 16 outputs
 * (2.25 per output) against F(2x2)'s 16 for 4 (4 per output) and the
 * direct 9.  Per sample, with t = ceil(oh / 4) (ceil(ow / 4) + 1) tiles:
 *   input transform   V (36, c, t) = B^T d B of every tile
 *   36 GEMMs          M_i (o, t)   = U_i (o, c) V_i (c, t)
 *   output transform  y (o, oh, ow) = A^T m A of every tile (+ bias)
 * For the MNIST network's second layer (32 -> 64 channels, 24x24 output:
 * 36 tiles, 42 with the spare ones) that is 6.2 MFLOP of GEMM against
 * F(2x2)'s 10.2 and im2col's 21.2, and V and M take 580 KiB against
 * F(2x2)'s 960 KiB: near a 512 KiB L2 rather than far past it.  The
 * larger points cost accuracy (products scaled by up to 8 and 1/24):
 * relative errors stay near 1e-6 here against F(2x2)'s 1e-7.
 *
 * As in F(2x2), the transforms are vector loops over all of a channel's
 * tiles at once.  The padded input is split into 16 planes by (row mod 4,
 * column mod 4), each (th + 1) rows of tw + 1: tile z = ti (tw + 1) + tj
 * reads its element (r, s) at z + (r / 4) (tw + 1) + s / 4 of plane
 * (r % 4, s % 4), one contiguous stream per (r, s); the price is the spare
 * tile per row (tw + 1 per row), whose outputs are never read. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif

#include "nn/conv_winograd.h"

#include <string.h>

#include "ddp/tensor.h"
#include "tensor/kernels.h"

/* ==== filters ============================================================= */

static const double wino4_g[6][3] = {
    {1.0 / 4, 0, 0},           {-1.0 / 6, -1.0 / 6, -1.0 / 6}, {-1.0 / 6, 1.0 / 6, -1.0 / 6},
    {1.0 / 24, 1.0 / 12, 1.0 / 6}, {1.0 / 24, -1.0 / 12, 1.0 / 6}, {0, 0, 1},
};

/* u = G g G^T (6x6 from 3x3, row-major), in float64: once per step. */
void ddp__wino4_filter(float u[36], const float g[9])
{
    double r[6][3];
    for (int i = 0; i < 6; i++)
        for (int b = 0; b < 3; b++)
            r[i][b] = wino4_g[i][0] * g[b] + wino4_g[i][1] * g[3 + b] + wino4_g[i][2] * g[6 + b];
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 6; j++)
            u[6 * i + j] = (float)(r[i][0] * wino4_g[j][0] + r[i][1] * wino4_g[j][1] +
                                   r[i][2] * wino4_g[j][2]);
}

/* g (=|+= by acc) G^T d G, the transpose of ddp__wino4_filter. */
void ddp__wino4_filter_grad(float g[9], const float d[36], int acc)
{
    double r[3][6];
    for (int a = 0; a < 3; a++)
        for (int j = 0; j < 6; j++) {
            double s = 0;
            for (int i = 0; i < 6; i++)
                s += wino4_g[i][a] * d[6 * i + j];
            r[a][j] = s;
        }
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            double s = 0;
            for (int j = 0; j < 6; j++)
                s += r[a][j] * wino4_g[j][b];
            g[3 * a + b] = acc ? g[3 * a + b] + (float)s : (float)s;
        }
}

/* ==== scratch ============================================================= */

/* One plane of one channel: th + 1 rows of tw + 1, and the float that the
 * last spare tile reads past its end. */
static size_t plane_floats(const ddp__wino_plan *p)
{
    return (size_t)(p->th + 1) * (size_t)(p->tw + 1) + 1;
}

/* planes (c, 16, pf), V (36, c, t), M (36, o, t), and per channel 40 t
 * floats of transform rows and one row of 4 (tw + 1) (a padded input row,
 * an output row). */
typedef struct scratch4 {
    float *planes, *v, *m, *tmp, *row;
} scratch4;

static scratch4 parts(const ddp__wino_plan *p, float *scratch)
{
    size_t t = (size_t)p->t;
    scratch4 s = {.planes = scratch};
    s.v = s.planes + 16 * (size_t)p->c * plane_floats(p);
    s.m = s.v + 36 * (size_t)p->c * t;
    s.tmp = s.m + 36 * (size_t)p->o * t;
    s.row = s.tmp + 40 * t;
    return s;
}

size_t ddp__wino4_scratch_floats(const ddp__wino_plan *p)
{
    size_t t = (size_t)p->t;
    return 16 * (size_t)p->c * plane_floats(p) + 36 * t * ((size_t)p->c + (size_t)p->o) +
           40 * t + 4 * ((size_t)p->tw + 1);
}

/* ==== input transform ===================================================== */

/* Columns 4 j + b of a padded row r into d_b[j], for j < n. */
DDP_KERNEL static void deinterleave4(float *restrict d0, float *restrict d1, float *restrict d2,
                                     float *restrict d3, const float *restrict r, size_t n)
{
    for (size_t j = 0; j < n; j++)
        d0[j] = r[4 * j], d1[j] = r[4 * j + 1], d2[j] = r[4 * j + 2], d3[j] = r[4 * j + 3];
}

/* x (c, h, w), zero-padded by (ph, pw) out to the last tile, into its 16
 * planes per channel (see the top of the file), each padded row built in
 * row (4 (tw + 1) floats) and dealt out four ways. */
static void split_planes(float *restrict pl, const float *restrict x, float *restrict row,
                         const ddp__wino_plan *p)
{
    size_t pf = plane_floats(p), q = (size_t)p->tw + 1, w = (size_t)p->w;
    memset(row, 0, 4 * q * sizeof *row);
    for (int ci = 0; ci < p->c; ci++) {
        float *pc = pl + (size_t)ci * 16 * pf;
        const float *xc = x + (size_t)ci * (size_t)p->h * w;
        for (int r = 0; r < 4 * (p->th + 1); r++) {
            int ir = r - p->ph;
            if (ir >= 0 && ir < p->h)
                memcpy(row + p->pw, xc + (size_t)ir * w, w * sizeof *row);
            else
                memset(row + p->pw, 0, w * sizeof *row);
            float *dst = pc + (size_t)(4 * (r % 4)) * pf + (size_t)(r / 4) * q;
            deinterleave4(dst, dst + pf, dst + 2 * pf, dst + 3 * pf, row, q);
        }
        for (int k = 0; k < 16; k++) /* what the last spare tile reads */
            pc[(size_t)k * pf + pf - 1] = 0.0f;
    }
}

/* B^T's six rows over the streams d0..d5 of n tiles, row l into o + l os:
 * B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0;
 *        0 2 -1 -2 1 0; 0 4 0 -5 0 1]. */
DDP_KERNEL static void bt_rows(float *restrict o, size_t os, const float *restrict d0,
                               const float *restrict d1, const float *restrict d2,
                               const float *restrict d3, const float *restrict d4,
                               const float *restrict d5, int n)
{
    DDP_ROWS_APART
    for (int z = 0; z < n; z++) {
        float a = d0[z], b = d1[z], c = d2[z], d = d3[z], e = d4[z], f = d5[z];
        o[z] = 4.0f * a - 5.0f * c + e;
        o[os + (size_t)z] = e + d - 4.0f * (b + c);
        o[2 * os + (size_t)z] = e - d + 4.0f * (b - c);
        o[3 * os + (size_t)z] = e - c + 2.0f * (d - b);
        o[4 * os + (size_t)z] = e - c + 2.0f * (b - d);
        o[5 * os + (size_t)z] = 4.0f * b - 5.0f * d + f;
    }
}

/* V (36, c, t) from the planes: per channel T (6 k, 6 s, t) = B^T d (the
 * rows k of every tile's column s), then V_{6k + l} = T[k] B. */
static void input_transform(float *v, const float *pl, float *tmp, const ddp__wino_plan *p)
{
    size_t pf = plane_floats(p), q = (size_t)p->tw + 1, t = (size_t)p->t;
    size_t vs = (size_t)p->c * t;
    int n = p->t;
    for (int ci = 0; ci < p->c; ci++) {
        const float *pc = pl + (size_t)ci * 16 * pf;
        for (int s = 0; s < 6; s++) {
            const float *d[6];
            for (int r = 0; r < 6; r++)
                d[r] = pc + (size_t)(4 * (r % 4) + s % 4) * pf + (size_t)(r / 4) * q +
                       (size_t)(s / 4);
            bt_rows(tmp + (size_t)s * t, 6 * t, d[0], d[1], d[2], d[3], d[4], d[5], n);
        }
        for (int k = 0; k < 6; k++) {
            const float *tk = tmp + (size_t)(6 * k) * t;
            bt_rows(v + (size_t)(6 * k) * vs + (size_t)ci * t, vs, tk, tk + t, tk + 2 * t,
                    tk + 3 * t, tk + 4 * t, tk + 5 * t, n);
        }
    }
}

/* ==== output transform ==================================================== */

/* A^T's four rows over the streams d0..d5 of n tiles (+ bias), row a into
 * o + a os: A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1]. */
DDP_KERNEL static void at_rows(float *restrict o, size_t os, const float *restrict d0,
                               const float *restrict d1, const float *restrict d2,
                               const float *restrict d3, const float *restrict d4,
                               const float *restrict d5, int n, float bias)
{
    DDP_ROWS_APART
    for (int z = 0; z < n; z++) {
        float a = d0[z], b = d1[z], c = d2[z], d = d3[z], e = d4[z], f = d5[z];
        float bp = b + c, bm = b - c, dp = d + e, dm = d - e;
        o[z] = a + bp + dp + bias;
        o[os + (size_t)z] = bm + 2.0f * dm + bias;
        o[2 * os + (size_t)z] = bp + 4.0f * dp + bias;
        o[3 * os + (size_t)z] = bm + 8.0f * dm + f + bias;
    }
}

/* One 2x2 pool window (y0 y1 / y2 y3) of n tiles through a ReLU: q[z]
 * its largest value, a[z] where (ddp__wino_relu_max4). */
DDP_KERNEL static void pool_window(float *restrict q, float *restrict a, const float *restrict y0,
                                   const float *restrict y1, const float *restrict y2,
                                   const float *restrict y3, int n)
{
    for (int z = 0; z < n; z++) {
        float v[4] = {y0[z], y1[z], y2[z], y3[z]};
        q[z] = ddp__wino_relu_max4(v, &a[z]);
    }
}

/* One output channel's tiles Y (4 a, 4 b, t) = A^T m A + bias, from its
 * rows of M (stride ms), through S (4 a, 6 l, t); then M's rows cleared
 * for the next sample's GEMMs (see ddp__wino4_conv). */
static void channel_tiles(float *yt, float *st, float *mo, size_t ms, float bias,
                          const ddp__wino_plan *p)
{
    size_t t = (size_t)p->t;
    int n = p->t;
    for (int l = 0; l < 6; l++)
        at_rows(st + (size_t)l * t, 6 * t, mo + (size_t)l * ms, mo + (size_t)(6 + l) * ms,
                mo + (size_t)(12 + l) * ms, mo + (size_t)(18 + l) * ms,
                mo + (size_t)(24 + l) * ms, mo + (size_t)(30 + l) * ms, n, 0.0f);
    for (int a = 0; a < 4; a++) {
        const float *sa = st + (size_t)(6 * a) * t;
        at_rows(yt + (size_t)(4 * a) * t, t, sa, sa + t, sa + 2 * t, sa + 3 * t, sa + 4 * t,
                sa + 5 * t, n, bias);
    }
    for (int i = 0; i < 36; i++)
        memset(mo + (size_t)i * ms, 0, t * sizeof *mo);
}

/* One channel's pooled outputs (oh / 2, ow / 2) and winners from its tiles
 * Y: window (wa, wb) of tile z is pooled (2 ti + wa, 2 tj + wb). */
static void channel_pool(float *y, uint8_t *arg, const float *yt, float *st,
                         const ddp__wino_plan *p)
{
    size_t t = (size_t)p->t, q = (size_t)p->tw + 1;
    float *qv = st, *qa = st + 4 * t;
    for (int w = 0; w < 4; w++) {
        int r0 = 2 * (w / 2), c0 = 2 * (w % 2);
        const float *y0 = yt + (size_t)(4 * r0 + c0) * t, *y2 = yt + (size_t)(4 * r0 + 4 + c0) * t;
        pool_window(qv + (size_t)w * t, qa + (size_t)w * t, y0, y0 + t, y2, y2 + t, p->t);
    }
    int ph = p->oh / 2, pw = p->ow / 2;
    for (int r = 0; r < ph; r++) {
        size_t base = (size_t)(r / 2) * q;
        for (int c = 0; c < pw; c++) {
            size_t at = (size_t)(2 * (r % 2) + c % 2) * t + base + (size_t)(c / 2);
            y[(size_t)r * (size_t)pw + (size_t)c] = qv[at];
            arg[(size_t)r * (size_t)pw + (size_t)c] = (uint8_t)qa[at];
        }
    }
}

/* One channel's outputs (oh, ow) (=|+=, or through a ReLU: acc) from its
 * tiles Y, a row at a time through row. */
static void channel_rows(float *yc, const float *yt, float *row, int acc, const ddp__wino_plan *p)
{
    size_t t = (size_t)p->t, q = (size_t)p->tw + 1, ow = (size_t)p->ow;
    for (int r = 0; r < p->oh; r++) {
        const float *ya = yt + (size_t)(4 * (r % 4)) * t + (size_t)(r / 4) * q;
        for (size_t c = 0; c < ow; c++)
            row[c] = ya[(c % 4) * t + c / 4];
        float *dst = yc + (size_t)r * ow;
        if (acc == DDP__WINO_RELU)
            ddp__vec_relu(dst, row, ow);
        else
            ddp__vec_acc_to(dst, row, ow, acc);
    }
}

/* ==== one sample ========================================================== */

void ddp__wino4_conv(const ddp__wino_plan *p, float *y, uint8_t *arg, const float *x,
                     const float *u, const float *bias, int acc, int fresh, float *scratch)
{
    scratch4 s = parts(p, scratch);
    size_t t = (size_t)p->t, vs = (size_t)p->c * t, ms = (size_t)p->o * t;
    split_planes(s.planes, x, s.row, p);
    input_transform(s.v, s.planes, s.tmp, p);
    /* M_i (o, t) = U_i (o, c) V_i (c, t), added to an M left zero (as in
     * F(2x2): OpenBLAS's beta 0 clears C in a pass of its own) */
    for (int i = 0; i < 36; i++)
        ddp_sgemm(0, 0, p->o, p->t, p->c, 1.0f, u + (size_t)i * (size_t)p->o * (size_t)p->c,
                  p->c, s.v + (size_t)i * vs, p->t, fresh ? 0.0f : 1.0f, s.m + (size_t)i * ms,
                  p->t);
    size_t pooled = (size_t)(p->oh / 2) * (size_t)(p->ow / 2);
    float *yt = s.tmp + 24 * t, *st = s.tmp;
    for (int oi = 0; oi < p->o; oi++) {
        channel_tiles(yt, st, s.m + (size_t)oi * t, ms, bias ? bias[oi] : 0.0f, p);
        if (acc == DDP__WINO_RELU_POOL)
            channel_pool(y + (size_t)oi * pooled, arg + (size_t)oi * pooled, yt, st, p);
        else
            channel_rows(y + (size_t)oi * (size_t)p->oh * (size_t)p->ow, yt, s.row, acc, p);
    }
}

/* ==== weight gradient ===================================================== */

/* A's six rows (A^T's columns) over the streams d0..d3 of n tiles, row k
 * into o + k os. */
DDP_KERNEL static void a_rows(float *restrict o, size_t os, const float *restrict d0,
                              const float *restrict d1, const float *restrict d2,
                              const float *restrict d3, int n)
{
    DDP_ROWS_APART
    for (int z = 0; z < n; z++) {
        float a = d0[z], b = d1[z], c = d2[z], d = d3[z];
        float ap = a + c, bp = b + d;
        o[z] = a;
        o[os + (size_t)z] = ap + bp;
        o[2 * os + (size_t)z] = ap - bp;
        o[3 * os + (size_t)z] = a + 4.0f * c + 2.0f * (b + 4.0f * d);
        o[4 * os + (size_t)z] = a + 4.0f * c - 2.0f * (b + 4.0f * d);
        o[5 * os + (size_t)z] = d;
    }
}

/* dM (36, o, t) = A dY A^T of every tile of dy (o, oh, ow): per channel
 * its tiles dY (4 a, 4 b, t), zero past oh, ow and in the spare tiles
 * (whose V is the next row's data), through R (6 k, 4 b, t). */
static void grad_transform(float *m, const float *dy, float *tmp, const ddp__wino_plan *p)
{
    size_t t = (size_t)p->t, q = (size_t)p->tw + 1, ms = (size_t)p->o * t;
    size_t oh = (size_t)p->oh, ow = (size_t)p->ow;
    float *yt = tmp, *rt = tmp + 16 * t;
    for (int oi = 0; oi < p->o; oi++) {
        const float *dyc = dy + (size_t)oi * oh * ow;
        for (size_t r = 0; r < 4 * (size_t)p->th; r++) {
            const float *src = r < oh ? dyc + r * ow : NULL;
            for (size_t b = 0; b < 4; b++) {
                float *dst = yt + (4 * (r % 4) + b) * t + (r / 4) * q;
                for (size_t j = 0; j < q; j++) {
                    size_t c = 4 * j + b;
                    dst[j] = src && c < ow ? src[c] : 0.0f;
                }
            }
        }
        for (int b = 0; b < 4; b++)
            a_rows(rt + (size_t)b * t, 4 * t, yt + (size_t)b * t, yt + (size_t)(4 + b) * t,
                   yt + (size_t)(8 + b) * t, yt + (size_t)(12 + b) * t, p->t);
        for (int k = 0; k < 6; k++) {
            const float *rk = rt + (size_t)(4 * k) * t;
            a_rows(m + (size_t)(6 * k) * ms + (size_t)oi * t, ms, rk, rk + t, rk + 2 * t,
                   rk + 3 * t, p->t);
        }
    }
}

void ddp__wino4_dw_sample(const ddp__wino_plan *p, float *du, const float *x, const float *dy,
                          int acc, float *scratch)
{
    scratch4 s = parts(p, scratch);
    size_t t = (size_t)p->t, vs = (size_t)p->c * t, ms = (size_t)p->o * t;
    split_planes(s.planes, x, s.row, p);
    input_transform(s.v, s.planes, s.tmp, p);
    grad_transform(s.m, dy, s.tmp, p);
    for (int i = 0; i < 36; i++) /* dU_i (o, c) += dM_i (o, t) V_i (c, t)^T */
        ddp_sgemm(0, 1, p->o, p->c, p->t, 1.0f, s.m + (size_t)i * ms, p->t,
                  s.v + (size_t)i * vs, p->t, acc ? 1.0f : 0.0f,
                  du + (size_t)i * (size_t)p->o * (size_t)p->c, p->c);
}
