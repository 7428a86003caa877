/* Winograd F(2x2, 3x3) for one sample (see conv_winograd.h), the
 * functions that take either tile size, and the fused ReLU + MaxPool2d(2)'s
 * backward (ddp__wino_unpool_relu).
 *
 * Per sample, with t = ceil(oh / 2) * ceil(ow / 2) tiles:
 *   input transform   V (16, c, t) = B^T d B of every tile's 4x4 patch
 *   16 GEMMs          M_i (o, t)   = U_i (o, c) V_i (c, t)
 *   output transform  y (o, oh, ow) = A^T m A of every tile (+ bias)
 * For the MNIST network's second layer (32 -> 64 channels, 26x26 -> 24x24:
 * 144 tiles) that is 9.4 MFLOP of GEMM against im2col's 21.2 MFLOP, V is
 * 312 KiB and M 624 KiB: both stay in the 4 MiB L2 between the transforms
 * and the GEMMs that read them, which is why this runs one sample at a
 * time.
 *
 * The transforms are vector loops over all of a channel's tiles at once: a
 * loop along one row of tiles (12 here) is shorter than one AVX-512 vector
 * and ran scalar (a fifth of ddp-cnn's step).  For that, the padded input's
 * rows are split by parity (even rows 0, 2, ..., odd rows 1, 3, ..., each
 * (th + 1, wp = 2 tw + 2)): tile z = ti (tw + 1) + tj then starts at
 * element 2z of both, and its rows 2 and 3 at 2z + wp.  The price is one
 * spare tile per row of tiles (tw + 1 per row, t = th (tw + 1)): 8 % more
 * GEMM columns here, whose outputs are never read. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif

#include "nn/conv_winograd.h"

#include <string.h>

#include "base/cpu.h"
#include "base/env.h"
#include "base/error.h"
#include "ddp/tensor.h"
#include "tensor/kernels.h"

int ddp__wino_fits(const ddp__conv_geom *g, int og)
{
    return g->kh == 3 && g->kw == 3 && g->sh == 1 && g->sw == 1 && g->dh == 1 && g->dw == 1 &&
           g->ph <= 2 && g->pw <= 2 && g->c >= 8 && og >= 8;
}

int ddp__wino_tile(const ddp__conv_geom *g, int *m)
{
    int pick;
    DDP_TRY(ddp__env_word("DDP_CONV_WINOGRAD", &pick)); /* auto, 2, 4 */
    *m = pick == 1 ? 2 : pick == 2 ? 4 : g->oh >= DDP__WINO4_MIN && g->ow >= DDP__WINO4_MIN ? 4 : 2;
    return 0;
}

void ddp__wino_plan_init(ddp__wino_plan *p, int m, int c, int o, int h, int w, int ph, int pw)
{
    *p = (ddp__wino_plan){.m = m, .c = c, .o = o, .h = h, .w = w, .ph = ph, .pw = pw,
                          .oh = h + 2 * ph - 2, .ow = w + 2 * pw - 2};
    p->th = (p->oh + m - 1) / m, p->tw = (p->ow + m - 1) / m;
    p->wp = m * (p->tw + 1);
    p->t = p->th * (p->tw + 1); /* one spare tile per row: see the top of the file */
    p->beta0 = m == 4 && ddp__wino_beta0_free();
}

int ddp__wino_beta0_free(void)
{
    static _Atomic int known = -1; /* OpenBLAS's kernels are chosen once, when it loads */
    int k = known;
    if (k < 0) {
        k = ddp__cpu_blas_beta0_free(ddp__blas_corename());
        known = k;
    }
    return k;
}

/* One channel's even or odd padded rows: th + 1 rows of wp, and 2 floats
 * that the spare tile of the last row reads past the end. */
static size_t rows_floats(const ddp__wino_plan *p)
{
    return (size_t)(p->th + 1) * (size_t)p->wp + 2;
}

size_t ddp__wino_scratch_floats(const ddp__wino_plan *p)
{
    if (p->m == 4)
        return ddp__wino4_scratch_floats(p);
    size_t in = 2 * (size_t)p->c * rows_floats(p);
    size_t vm = 16 * (size_t)p->t * ((size_t)p->c + (size_t)p->o);
    size_t rows = 2 * (size_t)p->th * (size_t)p->wp; /* one channel's output rows */
    size_t in_rows = 8 * ((size_t)p->t + 1);         /* or input_transform's */
    return in + vm + (rows > in_rows ? rows : in_rows);
}

/* ==== filters ============================================================= */

/* G g G^T for one 3x3 filter g (row-major), G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1]. */
static void filter_transform(float u[16], const float g[9])
{
    float r[4][3];
    for (int l = 0; l < 3; l++) {
        r[0][l] = g[l];
        r[1][l] = 0.5f * (g[l] + g[3 + l] + g[6 + l]);
        r[2][l] = 0.5f * (g[l] - g[3 + l] + g[6 + l]);
        r[3][l] = g[6 + l];
    }
    for (int k = 0; k < 4; k++) {
        u[4 * k + 0] = r[k][0];
        u[4 * k + 1] = 0.5f * (r[k][0] + r[k][1] + r[k][2]);
        u[4 * k + 2] = 0.5f * (r[k][0] - r[k][1] + r[k][2]);
        u[4 * k + 3] = r[k][2];
    }
}

void ddp__wino_filters(float *restrict u, const float *restrict w, int m, int o, int c, int flip)
{
    int np = ddp__wino_points(m);
    /* u_i is (rows, cols): (o, c) forward, (c, o) for the input gradient */
    size_t rows = (size_t)(flip ? c : o), cols = (size_t)(flip ? o : c);
    for (int oi = 0; oi < o; oi++)
        for (int ci = 0; ci < c; ci++) {
            const float *g = w + ((size_t)oi * (size_t)c + (size_t)ci) * 9;
            float rot[9], t[36];
            if (flip)
                for (int k = 0; k < 9; k++)
                    rot[k] = g[8 - k];
            if (m == 4)
                ddp__wino4_filter(t, flip ? rot : g);
            else
                filter_transform(t, flip ? rot : g);
            size_t at = flip ? (size_t)ci * cols + (size_t)oi : (size_t)oi * cols + (size_t)ci;
            for (int i = 0; i < np; i++)
                u[(size_t)i * rows * cols + at] = t[i];
        }
}

/* ==== input transform ===================================================== */

/* x (c, h, w) zero-padded by (ph, pw) out to the last tile, its rows split
 * by parity: e (c, th + 1, wp) holds padded rows 0, 2, 4, ..., od rows 1,
 * 3, 5, ...  Only the border is zeroed. */
static void split_rows(float *restrict e, float *restrict od, const float *restrict x,
                       const ddp__wino_plan *p)
{
    int wp = p->wp, right = wp - p->pw - p->w; /* >= 0: wp >= ow + 2 = w + 2 pw */
    size_t per = rows_floats(p);
    for (int ci = 0; ci < p->c; ci++)
        for (int r = 0; r < 2 * p->th + 2; r++) {
            float *row = (r % 2 ? od : e) + (size_t)ci * per + (size_t)(r / 2) * (size_t)wp;
            int ir = r - p->ph;
            if (ir < 0 || ir >= p->h) {
                memset(row, 0, (size_t)wp * sizeof *row);
                continue;
            }
            const float *src = x + ((size_t)ci * (size_t)p->h + (size_t)ir) * (size_t)p->w;
            for (int k = 0; k < p->pw; k++)
                row[k] = 0.0f;
            memcpy(row + p->pw, src, (size_t)p->w * sizeof *row);
            for (int k = 0; k < right; k++)
                row[p->pw + p->w + k] = 0.0f;
        }
    for (size_t ci = 0; ci < (size_t)p->c; ci++) /* what the last spare tile reads */
        for (size_t k = per - 2; k < per; k++)
            e[ci * per + k] = od[ci * per + k] = 0.0f;
}

/* Row k of B^T d for one channel's t tiles, split by column parity:
 * ae[z] = a[2z] + sign b[2z], ao[z] = a[2z + 1] + sign b[2z + 1], z = 0..t
 * (sign +-1: exact).  One pair of rows per call: with all four rows in one
 * loop gcc 12 vectorised nothing. */
DDP_KERNEL static void input_rows(float *restrict ae, float *restrict ao,
                                  const float *restrict a, const float *restrict b, float sign,
                                  int t)
{
    for (int z = 0; z <= t; z++) {
        ae[z] = a[2 * z] + sign * b[2 * z];
        ao[z] = a[2 * z + 1] + sign * b[2 * z + 1];
    }
}

/* (B^T d) B for row k of every tile: tile z's columns 0..3 are ae[z],
 * ao[z], ae[z + 1], ao[z + 1]; v points at V_{4k}[tile 0], vs the stride
 * between V_i. */
DDP_KERNEL static void input_cols(float *restrict v, size_t vs, const float *restrict ae,
                                  const float *restrict ao, int t)
{
    for (int z = 0; z < t; z++) {
        v[z] = ae[z] - ae[z + 1];
        v[vs + (size_t)z] = ao[z] + ae[z + 1];
        v[2 * vs + (size_t)z] = ae[z + 1] - ao[z];
        v[3 * vs + (size_t)z] = ao[z] - ao[z + 1];
    }
}

/* V (16, c, t) for every channel; rows: 8 (t + 1) floats of scratch. */
static void input_transform(float *v, const float *e, const float *od, float *rows,
                            const ddp__wino_plan *p)
{
    size_t per = rows_floats(p), wp = (size_t)p->wp, vs = (size_t)p->c * (size_t)p->t;
    size_t n = (size_t)p->t + 1;
    float *ae = rows, *ao = rows + 4 * n;
    for (int ci = 0; ci < p->c; ci++) {
        const float *ec = e + (size_t)ci * per, *oc = od + (size_t)ci * per;
        const float *r0 = ec, *r1 = oc, *r2 = ec + wp, *r3 = oc + wp;
        /* B^T's rows: d0 - d2, d1 + d2, d2 - d1, d1 - d3 */
        input_rows(ae, ao, r0, r2, -1.0f, p->t);
        input_rows(ae + n, ao + n, r1, r2, 1.0f, p->t);
        input_rows(ae + 2 * n, ao + 2 * n, r2, r1, -1.0f, p->t);
        input_rows(ae + 3 * n, ao + 3 * n, r1, r3, -1.0f, p->t);
        for (int k = 0; k < 4; k++)
            input_cols(v + (size_t)(4 * k) * vs + (size_t)ci * (size_t)p->t, vs, ae + k * n,
                       ao + k * n, p->t);
    }
}

/* ==== output transform ==================================================== */

/* Tile z's 2x2 outputs A^T m A + bias from M_i[z] (stride ms between M_i),
 * A^T = [1 1 1 0; 0 1 -1 -1]: v = y00, y01, y10, y11.  Inlined into the
 * tile loops below, which the compiler vectorises over z. */
static inline void tile_out(float v[4], const float *restrict m, size_t ms, int z, float bias)
{
    float s[2][4];
    for (int l = 0; l < 4; l++) {
        float m0 = m[(size_t)l * ms + (size_t)z], m1 = m[(size_t)(4 + l) * ms + (size_t)z];
        float m2 = m[(size_t)(8 + l) * ms + (size_t)z];
        float m3 = m[(size_t)(12 + l) * ms + (size_t)z];
        s[0][l] = m0 + m1 + m2, s[1][l] = m1 - m2 - m3;
    }
    v[0] = s[0][0] + s[0][1] + s[0][2] + bias, v[1] = s[0][1] - s[0][2] - s[0][3] + bias;
    v[2] = s[1][0] + s[1][1] + s[1][2] + bias, v[3] = s[1][1] - s[1][2] - s[1][3] + bias;
}

/* One output channel's t tiles into its even rows ye and odd rows yo ((th,
 * wp) each: tile z's 2x2 outputs are ye[2z], ye[2z + 1], yo[2z], yo[2z +
 * 1]). */
DDP_KERNEL static void output_tiles(float *restrict ye, float *restrict yo,
                                    const float *restrict m, size_t ms, int t, float bias)
{
    for (int z = 0; z < t; z++) {
        float v[4];
        tile_out(v, m, ms, z, bias);
        ye[2 * z] = v[0], ye[2 * z + 1] = v[1], yo[2 * z] = v[2], yo[2 * z + 1] = v[3];
    }
}

/* output_tiles followed by a ReLU and MaxPool2d(2), one pool window per
 * tile: y[z] the largest of the tile's ReLU'd outputs, arg[z] its place 2
 * row + column (as a float: an int or byte store kept the loop scalar).
 * Max pool's rule on the ReLU's values (the first maximum; no NaN survives
 * the ReLU), as the two ops give.  Over all t tiles at once: a loop along
 * one row of tiles (12) ran mostly scalar. */
DDP_KERNEL static void output_tiles_pool(float *restrict y, float *restrict arg,
                                         const float *restrict m, size_t ms, int t, float bias)
{
    for (int z = 0; z < t; z++) {
        float v[4];
        tile_out(v, m, ms, z, bias);
        y[z] = ddp__wino_relu_max4(v, &arg[z]);
    }
}

/* y (o, oh, ow) (=|+=, or through a ReLU: acc) the tiles of M (16, o, t),
 * through one channel's rows at a time (spare tiles and an odd size's extra
 * row or column cut); with arg, acc is DDP__WINO_RELU_POOL and y (o, th,
 * tw) gets the pooled values. */
static void output_transform(float *y, uint8_t *arg, float *m, const float *bias, int acc,
                             float *ye, const ddp__wino_plan *p)
{
    size_t ms = (size_t)p->o * (size_t)p->t, wp = (size_t)p->wp;
    size_t pooled = (size_t)p->th * (size_t)p->tw;
    float *yo = ye + (size_t)p->th * wp;
    for (int oi = 0; oi < p->o; oi++) {
        float *mo = m + (size_t)oi * (size_t)p->t;
        float bo = bias ? bias[oi] : 0.0f;
        if (acc == DDP__WINO_RELU_POOL) /* pooled rows of tw + 1 (the spare tile) */
            output_tiles_pool(ye, yo, mo, ms, p->t, bo);
        else
            output_tiles(ye, yo, mo, ms, p->t, bo);
        /* M left zero for the next sample's GEMMs (ddp__wino_conv); in the
         * tile loop these stores kept gcc from vectorising it */
        for (int i = 0; i < 16; i++)
            memset(mo + (size_t)i * ms, 0, (size_t)p->t * sizeof *mo);
        if (acc == DDP__WINO_RELU_POOL) {
            for (int ti = 0; ti < p->th; ti++) {
                size_t at = (size_t)oi * pooled + (size_t)ti * (size_t)p->tw;
                size_t from = (size_t)ti * ((size_t)p->tw + 1);
                memcpy(y + at, ye + from, (size_t)p->tw * sizeof *y);
                for (int j = 0; j < p->tw; j++)
                    arg[at + (size_t)j] = (uint8_t)yo[from + (size_t)j];
            }
            continue;
        }
        float *yc = y + (size_t)oi * (size_t)p->oh * (size_t)p->ow;
        for (int r = 0; r < p->oh; r++) {
            float *dst = yc + (size_t)r * (size_t)p->ow;
            const float *src = (r % 2 ? yo : ye) + (size_t)(r / 2) * wp;
            if (acc == DDP__WINO_RELU)
                ddp__vec_relu(dst, src, (size_t)p->ow);
            else
                ddp__vec_acc_to(dst, src, (size_t)p->ow, acc);
        }
    }
}

/* ==== the fused pool's backward ========================================== */

/* One pooled row's windows, branch-free so that it vectorises (winners
 * fall at random: a branch per window mispredicts); the place compared as
 * a float, as gcc vectorises a select only between values of one type. */
DDP_KERNEL static void unpool_row(float *restrict r0, float *restrict r1, const float *restrict g,
                                  const float *restrict y, const uint8_t *restrict arg, int qw)
{
    for (int j = 0; j < qw; j++) {
        float gj = g[j], yj = y[j], v = yj > 0.0f ? gj : 0.0f, k = (float)arg[j];
        r0[2 * j] = k == 0.0f ? v : 0.0f, r0[2 * j + 1] = k == 1.0f ? v : 0.0f;
        r1[2 * j] = k == 2.0f ? v : 0.0f, r1[2 * j + 1] = k == 3.0f ? v : 0.0f;
    }
}

void ddp__wino_unpool_relu(float *restrict dy, const float *restrict g, const float *restrict y,
                           const uint8_t *restrict arg, size_t planes, int qh, int qw)
{
    size_t w = 2 * (size_t)qw;
    for (size_t i = 0; i < planes * (size_t)qh; i++) /* pooled rows of every plane */
        unpool_row(dy + 2 * i * w, dy + (2 * i + 1) * w, g + i * (size_t)qw, y + i * (size_t)qw,
                   arg + i * (size_t)qw, qw);
}

/* ==== one sample ========================================================== */

ddp__wino_scratch ddp__wino_scratch_parts(const ddp__wino_plan *p, float *scratch)
{
    size_t per = rows_floats(p), vs = (size_t)p->c * (size_t)p->t;
    ddp__wino_scratch s = {.e = scratch};
    s.od = s.e + (size_t)p->c * per, s.v = s.od + (size_t)p->c * per;
    s.m = s.v + 16 * vs, s.rows = s.m + 16 * (size_t)p->o * (size_t)p->t;
    return s;
}

void ddp__wino_input(const ddp__wino_plan *p, const float *x, const ddp__wino_scratch *s)
{
    split_rows(s->e, s->od, x, p);
    input_transform(s->v, s->e, s->od, s->rows, p);
}

void ddp__wino_conv(const ddp__wino_plan *p, float *y, uint8_t *arg, const float *x,
                    const float *u, const float *bias, int acc, int fresh, float *scratch)
{
    if (p->m == 4) {
        ddp__wino4_conv(p, y, arg, x, u, bias, acc, fresh, scratch);
        return;
    }
    ddp__wino_scratch s = ddp__wino_scratch_parts(p, scratch);
    size_t vs = (size_t)p->c * (size_t)p->t;
    ddp__wino_input(p, x, &s);
    /* M_i (o, t) = U_i (o, c) V_i (c, t).  With beta 0 OpenBLAS clears C in
     * a pass of its own (7 % of a ddp-cnn run's samples); the output transform
     * leaves M zero instead, so every call but a fresh scratch's adds. */
    for (int i = 0; i < 16; i++)
        ddp_sgemm(0, 0, p->o, p->t, p->c, 1.0f, u + (size_t)i * (size_t)p->o * (size_t)p->c,
                  p->c, s.v + (size_t)i * vs, p->t, fresh ? 0.0f : 1.0f,
                  s.m + (size_t)i * (size_t)p->o * (size_t)p->t, p->t);
    output_transform(y, arg, s.m, bias, acc, s.rows, p);
}
