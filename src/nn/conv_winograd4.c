/* Winograd F(4x4, 3x3) for one sample (see conv_winograd.h): each 4x4
 * output tile from its 6x6 input patch d as
 *   Y = A^T [ (G g G^T) . (B^T d B) ] A
 * with Lavin and Gray's matrices for the points 0, 1, -1, 2, -2 and
 * infinity: 36 multiplications per tile and input channel for 16 outputs
 * (2.25 per output) against F(2x2)'s 16 for 4 (4 per output) and the
 * direct 9.  Per sample, with t = ceil(oh / 4) (ceil(ow / 4) + 1) tiles:
 *   input transform   V (36, c, t) = B^T d B of every tile (stored with a
 *                     channel stride pf >= t, below)
 *   36 GEMMs          M_i (o, t)   = U_i (o, c) V_i (c, t)
 *   output transform  y (o, oh, ow) = A^T m A of every tile (+ bias)
 * For the MNIST network's second layer (32 -> 64 channels, 24x24 output:
 * 36 tiles, 42 with the spare ones) that is 6.2 MFLOP of GEMM against
 * F(2x2)'s 10.2 and im2col's 21.2, and V and M take 603 KiB against
 * F(2x2)'s 960 KiB: near a 512 KiB-1 MiB L2 rather than far past it.  The
 * larger points cost accuracy (products scaled by up to 8 and 1/24):
 * relative errors of 1e-6 to 6e-6 here against F(2x2)'s 1e-7.
 *
 * The transforms are vector loops over the tiles of CHANNEL_BLOCK
 * channels at once (F(2x2)'s run over one channel's: here one channel has
 * too few tiles to fill the vectors).  The padded input is split into 16 planes by (row mod 4,
 * column mod 4), each (th + 1) rows of tw + 1: tile z = ti (tw + 1) + tj
 * reads its element (r, s) at z + (r / 4) (tw + 1) + s / 4 of plane
 * (r % 4, s % 4), one contiguous stream per (r, s); the price is the spare
 * tile per row (tw + 1 per row), whose outputs are never read.  Each
 * plane holds every channel's, pf = (th + 1) (tw + 1) + 1 floats apart,
 * and V keeps that channel stride, so that one stream runs through the
 * tiles of several channels (and their spare floats, whose results no
 * GEMM reads: the GEMMs take V with ldb = pf). */
/* no-tree-loop-distribute-patterns: keeps the short row copies as loops (gcc
 * would turn them back into memcpy calls, 6 % of ddp-cnn's cycles). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3", "no-tree-loop-distribute-patterns")
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

/* Channels per pass of the transforms: their loops run over the tiles of
 * this many channels at once (one channel's 42-56 tiles leave 16-float
 * vectors mostly in their scalar tails), with the intermediate rows still
 * near L1 (36 CHANNEL_BLOCK pf floats: 55 KiB for conv2 of the MNIST
 * network's forward, 73 KiB for its input gradient). */
#define CHANNEL_BLOCK 8

/* One plane of one channel: th + 1 rows of tw + 1, and the float that the
 * last spare tile reads past its end. */
static size_t plane_floats(const ddp__wino_plan *p)
{
    return (size_t)(p->th + 1) * (size_t)(p->tw + 1) + 1;
}

/* planes (16, c, pf); V (36, c, pf), each channel's t tiles with the
 * planes' stride (the GEMMs read them with ldb pf); M (36, o, t); tmp, the
 * transforms' rows for CHANNEL_BLOCK channels; pad, four blocks of th + 1
 * padded rows of 4 (tw + 1) floats (rows 4 i + a in block a; the weight
 * gradient's dY uses th rows per block). */
typedef struct scratch4 {
    float *planes, *v, *m, *tmp, *pad;
} scratch4;

static size_t tmp_floats(const ddp__wino_plan *p)
{
    size_t in = 36 * CHANNEL_BLOCK * plane_floats(p), t = (size_t)p->t;
    /* S, Y, the pool's values and places, the bias; one channel's rows */
    size_t out = 49 * CHANNEL_BLOCK * t + 16 * t;
    return in > out ? in : out;
}

static size_t pad_floats(const ddp__wino_plan *p)
{
    return 16 * (size_t)(p->th + 1) * (size_t)(p->tw + 1);
}

static scratch4 parts(const ddp__wino_plan *p, float *scratch)
{
    size_t pf = plane_floats(p);
    scratch4 s = {.planes = scratch};
    s.v = s.planes + 16 * (size_t)p->c * pf;
    s.m = s.v + 36 * (size_t)p->c * pf;
    s.tmp = s.m + 36 * (size_t)p->o * (size_t)p->t;
    s.pad = s.tmp + tmp_floats(p);
    return s;
}

size_t ddp__wino4_scratch_floats(const ddp__wino_plan *p)
{
    return 52 * (size_t)p->c * plane_floats(p) + 36 * (size_t)p->o * (size_t)p->t +
           tmp_floats(p) + pad_floats(p);
}

/* ==== splitting by (row mod 4, column mod 4) ============================== */

/* Columns 4 j + b of r into d_b[j], for j < n. */
DDP_KERNEL static void deinterleave4(float *restrict d0, float *restrict d1, float *restrict d2,
                                     float *restrict d3, const float *restrict r, size_t n)
{
    for (size_t j = 0; j < n; j++)
        d0[j] = r[4 * j], d1[j] = r[4 * j + 1], d2[j] = r[4 * j + 2], d3[j] = r[4 * j + 3];
}

/* d = s, n floats: rows here are short (24-32 floats), a memcpy call costs more. */
DDP_KERNEL static void copy_row(float *restrict d, const float *restrict s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = s[i];
}

/* One channel src (sh, sw) placed at (oy, ox) in a zero image of
 * (4 rows) x (4 q) floats and split into 16 planes, plane 4 a + b at d + (4 a +
 * b) ds holding its elements (4 i + a, 4 j + b) as row i of q: each block
 * of pad (rows 4 i + a, ready zero: its pads stay so, since every channel
 * writes the same places) is dealt out four ways in one pass. */
static void split16(float *d, size_t ds, const float *src, int sh, int sw, int oy, int ox,
                    int rows, size_t q, float *pad)
{
    size_t wq = 4 * q, bs = (size_t)rows * wq;
    for (int a = 0; a < 4; a++) {
        float *blk = pad + (size_t)a * bs;
        for (int i = 0; i < rows; i++) {
            int r = 4 * i + a - oy;
            if (r >= 0 && r < sh)
                copy_row(blk + (size_t)i * wq + ox, src + (size_t)r * (size_t)sw, (size_t)sw);
        }
        float *da = d + (size_t)(4 * a) * ds;
        deinterleave4(da, da + ds, da + 2 * ds, da + 3 * ds, blk, (size_t)rows * q);
    }
}

/* x (c, h, w), zero-padded by (ph, pw) out to the last tile, into its
 * planes (16, c, pf) (see the top of the file). */
static void split_planes(float *restrict pl, const float *restrict x, float *restrict pad,
                         const ddp__wino_plan *p)
{
    size_t pf = plane_floats(p), cs = (size_t)p->c * pf, q = (size_t)p->tw + 1;
    memset(pad, 0, pad_floats(p) * sizeof *pad);
    for (int ci = 0; ci < p->c; ci++) {
        float *pc = pl + (size_t)ci * pf;
        split16(pc, cs, x + (size_t)ci * (size_t)p->h * (size_t)p->w, p->h, p->w, p->ph, p->pw,
                p->th + 1, q, pad);
        for (int k = 0; k < 16; k++) /* what the last spare tile reads */
            pc[(size_t)k * cs + pf - 1] = 0.0f;
    }
}

/* ==== input transform ===================================================== */

/* B^T's six rows over the streams d0..d5 of n tiles, row l into o + l os:
 * B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0;
 *        0 2 -1 -2 1 0; 0 4 0 -5 0 1]. */
DDP_KERNEL static void bt_rows(float *restrict o, size_t os, const float *restrict d0,
                               const float *restrict d1, const float *restrict d2,
                               const float *restrict d3, const float *restrict d4,
                               const float *restrict d5, size_t n)
{
    DDP_ROWS_APART
    for (size_t z = 0; z < n; z++) {
        float a = d0[z], b = d1[z], c = d2[z], d = d3[z], e = d4[z], f = d5[z];
        o[z] = 4.0f * a - 5.0f * c + e;
        o[os + z] = e + d - 4.0f * (b + c);
        o[2 * os + z] = e - d + 4.0f * (b - c);
        o[3 * os + z] = e - c + 2.0f * (d - b);
        o[4 * os + z] = e - c + 2.0f * (b - d);
        o[5 * os + z] = 4.0f * b - 5.0f * d + f;
    }
}

/* V (36, c, pf) from the planes, CHANNEL_BLOCK channels at a time: T (6 k,
 * 6 s) = B^T d (the rows k of every tile's column s), then V_{6k + l} =
 * T[k] B.  A block's streams run through its channels' spare floats (t to pf), whose
 * results the GEMMs never read; they stop at the last channel's t. */
static void input_transform(float *v, const float *pl, float *tmp, const ddp__wino_plan *p)
{
    size_t pf = plane_floats(p), q = (size_t)p->tw + 1, t = (size_t)p->t;
    size_t cs = (size_t)p->c * pf, bs = CHANNEL_BLOCK * pf;
    for (int c0 = 0; c0 < p->c; c0 += CHANNEL_BLOCK) {
        int nc = p->c - c0 < CHANNEL_BLOCK ? p->c - c0 : CHANNEL_BLOCK;
        size_t n = (size_t)(nc - 1) * pf + t, at = (size_t)c0 * pf;
        for (int s = 0; s < 6; s++) {
            const float *d[6];
            for (int r = 0; r < 6; r++)
                d[r] = pl + (size_t)(4 * (r % 4) + s % 4) * cs + at + (size_t)(r / 4) * q +
                       (size_t)(s / 4);
            bt_rows(tmp + (size_t)s * bs, 6 * bs, d[0], d[1], d[2], d[3], d[4], d[5], n);
        }
        for (int k = 0; k < 6; k++) {
            const float *tk = tmp + (size_t)(6 * k) * bs;
            bt_rows(v + (size_t)(6 * k) * cs + at, cs, tk, tk + bs, tk + 2 * bs, tk + 3 * bs,
                    tk + 4 * bs, tk + 5 * bs, n);
        }
    }
}

/* ==== output transform ==================================================== */

/* A^T's four rows over the streams d0..d5 of n tiles (+ the bias stream
 * bs where bias), row a into o + a os:
 * A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1]. */
static inline __attribute__((always_inline)) void
at_rows_body(float *restrict o, size_t os, const float *restrict d0, const float *restrict d1,
             const float *restrict d2, const float *restrict d3, const float *restrict d4,
             const float *restrict d5, const float *restrict bs, size_t n, int bias)
{
    DDP_ROWS_APART
    for (size_t z = 0; z < n; z++) {
        float a = d0[z], b = d1[z], c = d2[z], d = d3[z], e = d4[z], f = d5[z];
        float bp = b + c, bm = b - c, dp = d + e, dm = d - e, k = bias ? bs[z] : 0.0f;
        o[z] = a + bp + dp + k;
        o[os + z] = bm + 2.0f * dm + k;
        o[2 * os + z] = bp + 4.0f * dp + k;
        o[3 * os + z] = bm + 8.0f * dm + f + k;
    }
}

DDP_KERNEL static void at_rows(float *restrict o, size_t os, const float *restrict d0,
                               const float *restrict d1, const float *restrict d2,
                               const float *restrict d3, const float *restrict d4,
                               const float *restrict d5, size_t n)
{
    at_rows_body(o, os, d0, d1, d2, d3, d4, d5, NULL, n, 0);
}

DDP_KERNEL static void at_rows_bias(float *restrict o, size_t os, const float *restrict d0,
                                    const float *restrict d1, const float *restrict d2,
                                    const float *restrict d3, const float *restrict d4,
                                    const float *restrict d5, const float *restrict bs, size_t n)
{
    at_rows_body(o, os, d0, d1, d2, d3, d4, d5, bs, n, 1);
}

/* One 2x2 pool window (y0 y1 / y2 y3) of n tiles through a ReLU: q[z]
 * its largest value, a[z] where (ddp__wino_relu_max4). */
DDP_KERNEL static void pool_window(float *restrict q, float *restrict a, const float *restrict y0,
                                   const float *restrict y1, const float *restrict y2,
                                   const float *restrict y3, size_t n)
{
    for (size_t z = 0; z < n; z++) {
        float v[4] = {y0[z], y1[z], y2[z], y3[z]};
        q[z] = ddp__wino_relu_max4(v, &a[z]);
    }
}

/* Pooled row r of one channel from the windows' values q0, q1 (its even
 * and odd columns) and places a0, a1: y[2 j] = q0[j], y[2 j + 1] = q1[j]
 * for the n outputs, the places as bytes. */
DDP_KERNEL static void pool_row(float *restrict y, uint8_t *restrict arg, const float *restrict q0,
                                const float *restrict q1, const float *restrict a0,
                                const float *restrict a1, int n)
{
    for (int j = 0; j < n / 2; j++) {
        y[2 * j] = q0[j], y[2 * j + 1] = q1[j];
        arg[2 * j] = (uint8_t)a0[j], arg[2 * j + 1] = (uint8_t)a1[j];
    }
    if (n % 2)
        y[n - 1] = q0[n / 2], arg[n - 1] = (uint8_t)a0[n / 2];
}

/* One channel's pooled outputs (oh / 2, ow / 2) and winners from the
 * pooled values qv and places qa of its tiles' four windows (window w at
 * w ws): window (wa, wb) of tile z is pooled (2 ti + wa, 2 tj + wb). */
static void channel_pool(float *y, uint8_t *arg, const float *qv, const float *qa, size_t ws,
                         const ddp__wino_plan *p)
{
    size_t q = (size_t)p->tw + 1;
    int ph = p->oh / 2, pw = p->ow / 2;
    for (int r = 0; r < ph; r++) {
        size_t w0 = (size_t)(2 * (r % 2)) * ws + (size_t)(r / 2) * q, w1 = w0 + ws;
        pool_row(y + (size_t)r * (size_t)pw, arg + (size_t)r * (size_t)pw, qv + w0, qv + w1,
                 qa + w0, qa + w1, pw);
    }
}

/* o[4 j + b] = d_b[j] for j < n: deinterleave4 undone. */
DDP_KERNEL static void interleave4(float *restrict o, const float *restrict d0,
                                   const float *restrict d1, const float *restrict d2,
                                   const float *restrict d3, size_t n)
{
    for (size_t j = 0; j < n; j++)
        o[4 * j] = d0[j], o[4 * j + 1] = d1[j], o[4 * j + 2] = d2[j], o[4 * j + 3] = d3[j];
}

/* One channel's outputs (oh, ow) (=|+=, or through a ReLU: acc) from its
 * tiles Y (stream 4 a + b at yt + (4 a + b) ys): per a, the rows 4 i + a
 * of its tiles interleaved into rows (4 t floats per a: th rows of 4 (tw + 1)). */
static void channel_rows(float *yc, const float *yt, size_t ys, float *rows, int acc,
                         const ddp__wino_plan *p)
{
    size_t t = (size_t)p->t, wq = 4 * ((size_t)p->tw + 1), ow = (size_t)p->ow;
    for (int a = 0; a < 4; a++) {
        const float *ya = yt + (size_t)(4 * a) * ys;
        interleave4(rows + (size_t)a * 4 * t, ya, ya + ys, ya + 2 * ys, ya + 3 * ys, t);
    }
    for (int r = 0; r < p->oh; r++) {
        const float *src = rows + (size_t)(r % 4) * 4 * t + (size_t)(r / 4) * wq;
        float *dst = yc + (size_t)r * ow;
        if (acc == DDP__WINO_RELU)
            ddp__vec_relu(dst, src, ow);
        else
            ddp__vec_acc_to(dst, src, ow, acc);
    }
}

/* Output channels o0 .. o0 + no - 1 from their rows of M (36, o, t), through
 * S (4 a, 6 l) and Y (4 a, 4 b) of those channels' tiles (stride no t):
 * Y = A^T m A + bias, then pooled or written as rows (acc); M's rows are
 * cleared behind where clear (the GEMMs add into them). */
static void output_block(float *y, uint8_t *arg, float *m, const float *bias, int acc,
                         int clear, int o0, int no, float *tmp, const ddp__wino_plan *p)
{
    size_t t = (size_t)p->t, ms = (size_t)p->o * t, n = (size_t)no * t;
    float *st = tmp, *yt = st + 24 * n, *qv = yt + 16 * n, *qa = qv + 4 * n, *bs = qa + 4 * n;
    float *rows = bs + n;
    const float *mo = m + (size_t)o0 * t;
    for (int oi = 0; oi < no; oi++)
        for (size_t z = 0; z < t; z++)
            bs[(size_t)oi * t + z] = bias ? bias[o0 + oi] : 0.0f;
    for (int l = 0; l < 6; l++)
        at_rows(st + (size_t)l * n, 6 * n, mo + (size_t)l * ms, mo + (size_t)(6 + l) * ms,
                mo + (size_t)(12 + l) * ms, mo + (size_t)(18 + l) * ms,
                mo + (size_t)(24 + l) * ms, mo + (size_t)(30 + l) * ms, n);
    for (int a = 0; a < 4; a++) {
        const float *sa = st + (size_t)(6 * a) * n;
        at_rows_bias(yt + (size_t)(4 * a) * n, n, sa, sa + n, sa + 2 * n, sa + 3 * n, sa + 4 * n,
                     sa + 5 * n, bs, n);
    }
    for (int i = 0; clear && i < 36; i++)
        memset(m + (size_t)i * ms + (size_t)o0 * t, 0, n * sizeof *m);
    if (acc == DDP__WINO_RELU_POOL) {
        size_t pooled = (size_t)(p->oh / 2) * (size_t)(p->ow / 2);
        for (int w = 0; w < 4; w++) {
            const float *y0 = yt + (size_t)(8 * (w / 2) + 2 * (w % 2)) * n;
            pool_window(qv + (size_t)w * n, qa + (size_t)w * n, y0, y0 + n, y0 + 4 * n,
                        y0 + 5 * n, n);
        }
        for (int oi = 0; oi < no; oi++)
            channel_pool(y + (size_t)(o0 + oi) * pooled, arg + (size_t)(o0 + oi) * pooled,
                         qv + (size_t)oi * t, qa + (size_t)oi * t, n, p);
        return;
    }
    size_t os = (size_t)p->oh * (size_t)p->ow;
    for (int oi = 0; oi < no; oi++)
        channel_rows(y + (size_t)(o0 + oi) * os, yt + (size_t)oi * t, n, rows, acc, p);
}

/* ==== one sample ========================================================== */

void ddp__wino4_conv(const ddp__wino_plan *p, float *y, uint8_t *arg, const float *x,
                     const float *u, const float *bias, int acc, int fresh, float *scratch)
{
    scratch4 s = parts(p, scratch);
    size_t pf = plane_floats(p), vs = (size_t)p->c * pf, ms = (size_t)p->o * (size_t)p->t;
    split_planes(s.planes, x, s.pad, p);
    input_transform(s.v, s.planes, s.tmp, p);
    /* M_i (o, t) = U_i (o, c) V_i (c, t), written (beta 0) where that is
     * free, else added into an M left zero by the last output transform
     * (beta 0 would clear C in a pass of its own) or fresh */
    for (int i = 0; i < 36; i++)
        ddp_sgemm(0, 0, p->o, p->t, p->c, 1.0f, u + (size_t)i * (size_t)p->o * (size_t)p->c,
                  p->c, s.v + (size_t)i * vs, (int)pf, fresh || p->beta0 ? 0.0f : 1.0f,
                  s.m + (size_t)i * ms, p->t);
    for (int o0 = 0; o0 < p->o; o0 += CHANNEL_BLOCK) {
        int no = p->o - o0 < CHANNEL_BLOCK ? p->o - o0 : CHANNEL_BLOCK;
        output_block(y, arg, s.m, bias, acc, !p->beta0, o0, no, s.tmp, p);
    }
}

/* ==== weight gradient ===================================================== */

/* A's six rows (A^T's columns) over the streams d0..d3 of n tiles, row k
 * into o + k os. */
DDP_KERNEL static void a_rows(float *restrict o, size_t os, const float *restrict d0,
                              const float *restrict d1, const float *restrict d2,
                              const float *restrict d3, size_t n)
{
    DDP_ROWS_APART
    for (size_t z = 0; z < n; z++) {
        float a = d0[z], b = d1[z], c = d2[z], d = d3[z];
        float ap = a + c, bp = b + d;
        o[z] = a;
        o[os + z] = ap + bp;
        o[2 * os + z] = ap - bp;
        o[3 * os + z] = a + 4.0f * c + 2.0f * (b + 4.0f * d);
        o[4 * os + z] = a + 4.0f * c - 2.0f * (b + 4.0f * d);
        o[5 * os + z] = d;
    }
}

/* dM (36, o, t) = A dY A^T of every tile of dy (o, oh, ow), CHANNEL_BLOCK
 * channels at a time: their tiles dY (4 a, 4 b) (zero past oh, ow and in the spare
 * tiles, whose V is the next row's data), through R (6 k, 4 b). */
static void grad_transform(float *m, const float *dy, float *tmp, float *pad,
                           const ddp__wino_plan *p)
{
    size_t t = (size_t)p->t, q = (size_t)p->tw + 1, ms = (size_t)p->o * t;
    size_t cs = (size_t)p->oh * (size_t)p->ow;
    memset(pad, 0, pad_floats(p) * sizeof *pad);
    for (int o0 = 0; o0 < p->o; o0 += CHANNEL_BLOCK) {
        int no = p->o - o0 < CHANNEL_BLOCK ? p->o - o0 : CHANNEL_BLOCK;
        size_t n = (size_t)no * t;
        float *yt = tmp, *rt = tmp + 16 * n;
        for (int oi = 0; oi < no; oi++)
            split16(yt + (size_t)oi * t, n, dy + (size_t)(o0 + oi) * cs, p->oh, p->ow, 0, 0,
                    p->th, q, pad);
        for (int b = 0; b < 4; b++)
            a_rows(rt + (size_t)b * n, 4 * n, yt + (size_t)b * n, yt + (size_t)(4 + b) * n,
                   yt + (size_t)(8 + b) * n, yt + (size_t)(12 + b) * n, n);
        for (int k = 0; k < 6; k++) {
            const float *rk = rt + (size_t)(4 * k) * n;
            a_rows(m + (size_t)(6 * k) * ms + (size_t)o0 * t, ms, rk, rk + n, rk + 2 * n,
                   rk + 3 * n, n);
        }
    }
}

void ddp__wino4_dw_sample(const ddp__wino_plan *p, float *du, const float *x, const float *dy,
                          int acc, float *scratch)
{
    scratch4 s = parts(p, scratch);
    size_t pf = plane_floats(p), vs = (size_t)p->c * pf, ms = (size_t)p->o * (size_t)p->t;
    split_planes(s.planes, x, s.pad, p);
    input_transform(s.v, s.planes, s.tmp, p);
    grad_transform(s.m, dy, s.tmp, s.pad, p);
    for (int i = 0; i < 36; i++) /* dU_i (o, c) += dM_i (o, t) V_i (c, t)^T */
        ddp_sgemm(0, 1, p->o, p->c, p->t, 1.0f, s.m + (size_t)i * ms, p->t,
                  s.v + (size_t)i * vs, (int)pf, acc ? 1.0f : 0.0f,
                  du + (size_t)i * (size_t)p->o * (size_t)p->c, p->c);
}
