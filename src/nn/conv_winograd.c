/* Winograd F(2x2, 3x3) for one sample (see conv_winograd.h).
 *
 * Per sample, with t = ceil(oh / 2) * ceil(ow / 2) tiles:
 *   input transform   V (16, c, t) = B^T d B of every tile's 4x4 patch
 *   16 GEMMs          M_i (o, t)   = U_i (o, c) V_i (c, t)
 *   output transform  y (o, oh, ow) = A^T m A of every tile (+ bias)
 * For the MNIST network's second layer (32 -> 64 channels, 26x26 -> 24x24:
 * 144 tiles) that is 9.4 MFLOP of GEMM against im2col's 21.2 MFLOP, V is
 * 288 KiB and M 576 KiB: both stay in the 4 MiB L2 between the transforms
 * and the GEMMs that read them, which is why this runs one sample at a
 * time.  The transforms' loops run along a row of tiles (stride-2 loads)
 * and are built with the vectoriser at full strength. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif

#include "nn/conv_winograd.h"

#include <string.h>

#include "ddp/tensor.h"
#include "tensor/kernels.h"

int ddp__wino_fits(const ddp__conv_geom *g, int og)
{
    return g->kh == 3 && g->kw == 3 && g->sh == 1 && g->sw == 1 && g->dh == 1 && g->dw == 1 &&
           g->ph <= 2 && g->pw <= 2 && g->c >= 8 && og >= 8;
}

void ddp__wino_plan_init(ddp__wino_plan *p, int c, int o, int h, int w, int ph, int pw)
{
    *p = (ddp__wino_plan){.c = c, .o = o, .h = h, .w = w, .ph = ph, .pw = pw,
                          .oh = h + 2 * ph - 2, .ow = w + 2 * pw - 2};
    p->th = (p->oh + 1) / 2, p->tw = (p->ow + 1) / 2, p->t = p->th * p->tw;
    /* the tiles read rows 0 .. 2 th + 1 and columns 0 .. 2 tw + 1 */
    p->direct = ph == 0 && pw == 0 && h == 2 * p->th + 2 && w == 2 * p->tw + 2;
}

static size_t padded_floats(const ddp__wino_plan *p)
{
    return p->direct ? 0 : (size_t)p->c * (size_t)(2 * p->th + 2) * (size_t)(2 * p->tw + 2);
}

static int exact_out(const ddp__wino_plan *p) { return p->oh == 2 * p->th && p->ow == 2 * p->tw; }

size_t ddp__wino_scratch_floats(const ddp__wino_plan *p)
{
    size_t vm = 16 * (size_t)p->t * ((size_t)p->c + (size_t)p->o);
    size_t plane = exact_out(p) ? 0 : (size_t)(2 * p->th) * (size_t)(2 * p->tw);
    return padded_floats(p) + vm + plane;
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

void ddp__wino_filters(float *restrict u, const float *restrict w, int o, int c, int flip)
{
    /* u_i is (rows, cols): (o, c) forward, (c, o) for the input gradient */
    size_t rows = (size_t)(flip ? c : o), cols = (size_t)(flip ? o : c);
    for (int oi = 0; oi < o; oi++)
        for (int ci = 0; ci < c; ci++) {
            const float *g = w + ((size_t)oi * (size_t)c + (size_t)ci) * 9;
            float rot[9], t[16];
            if (flip)
                for (int k = 0; k < 9; k++)
                    rot[k] = g[8 - k];
            filter_transform(t, flip ? rot : g);
            size_t at = flip ? (size_t)ci * cols + (size_t)oi : (size_t)oi * cols + (size_t)ci;
            for (int i = 0; i < 16; i++)
                u[(size_t)i * rows * cols + at] = t[i];
        }
}

/* ==== input transform ===================================================== */

/* One row of tiles of one channel: rows r0..r3 of the (padded) plane, tw
 * tiles; v points at tile 0 of V_0, vs is the stride between V_i. */
DDP_KERNEL static void input_row(float *restrict v, size_t vs, const float *restrict r0,
                                 const float *restrict r1, const float *restrict r2,
                                 const float *restrict r3, int tw)
{
    for (int j = 0; j < tw; j++) {
        float a[4][4]; /* B^T d: rows d0 - d2, d1 + d2, d2 - d1, d1 - d3 */
        for (int l = 0; l < 4; l++) {
            float d0 = r0[2 * j + l], d1 = r1[2 * j + l], d2 = r2[2 * j + l], d3 = r3[2 * j + l];
            a[0][l] = d0 - d2, a[1][l] = d1 + d2, a[2][l] = d2 - d1, a[3][l] = d1 - d3;
        }
        for (int k = 0; k < 4; k++) { /* (B^T d) B: the same on the columns */
            v[(size_t)(4 * k + 0) * vs + (size_t)j] = a[k][0] - a[k][2];
            v[(size_t)(4 * k + 1) * vs + (size_t)j] = a[k][1] + a[k][2];
            v[(size_t)(4 * k + 2) * vs + (size_t)j] = a[k][2] - a[k][1];
            v[(size_t)(4 * k + 3) * vs + (size_t)j] = a[k][1] - a[k][3];
        }
    }
}

/* xp (c, 2 th + 2, 2 tw + 2) = x zero-padded by (ph, pw) and out to the
 * last tile; only the border is zeroed. */
static void pad_input(float *restrict xp, const float *restrict x, const ddp__wino_plan *p)
{
    int hp = 2 * p->th + 2, wp = 2 * p->tw + 2;
    int right = wp - p->pw - p->w; /* >= 0: wp >= ow + 2 = w + 2 pw */
    for (int ci = 0; ci < p->c; ci++)
        for (int r = 0; r < hp; r++) {
            float *row = xp + ((size_t)ci * (size_t)hp + (size_t)r) * (size_t)wp;
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
}

static void input_transform(float *v, const float *xp, int wp, const ddp__wino_plan *p)
{
    size_t vs = (size_t)p->c * (size_t)p->t, plane = (size_t)(2 * p->th + 2) * (size_t)wp;
    for (int ci = 0; ci < p->c; ci++)
        for (int ti = 0; ti < p->th; ti++) {
            const float *r0 = xp + (size_t)ci * plane + (size_t)(2 * ti) * (size_t)wp;
            input_row(v + (size_t)ci * (size_t)p->t + (size_t)ti * (size_t)p->tw, vs, r0,
                      r0 + wp, r0 + 2 * wp, r0 + 3 * wp, p->tw);
        }
}

/* ==== output transform ==================================================== */

/* One row of tiles of one output channel into output rows y0, y1 (width
 * 2 tw): A^T m A + bias, A^T = [1 1 1 0; 0 1 -1 -1]. */
DDP_KERNEL static void output_row(float *restrict y0, float *restrict y1,
                                  const float *restrict m, size_t ms, int tw, float bias,
                                  int acc)
{
    for (int j = 0; j < tw; j++) {
        float s[2][4];
        for (int l = 0; l < 4; l++) {
            float m0 = m[(size_t)l * ms + (size_t)j], m1 = m[(size_t)(4 + l) * ms + (size_t)j];
            float m2 = m[(size_t)(8 + l) * ms + (size_t)j];
            float m3 = m[(size_t)(12 + l) * ms + (size_t)j];
            s[0][l] = m0 + m1 + m2, s[1][l] = m1 - m2 - m3;
        }
        float a = s[0][0] + s[0][1] + s[0][2] + bias, b = s[0][1] - s[0][2] - s[0][3] + bias;
        float c = s[1][0] + s[1][1] + s[1][2] + bias, d = s[1][1] - s[1][2] - s[1][3] + bias;
        if (acc) {
            y0[2 * j] += a, y0[2 * j + 1] += b, y1[2 * j] += c, y1[2 * j + 1] += d;
        } else {
            y0[2 * j] = a, y0[2 * j + 1] = b, y1[2 * j] = c, y1[2 * j + 1] = d;
        }
    }
}

/* y (o, oh, ow) from M (16, o, t); an output of odd size goes through one
 * whole-tile plane and is cut (or added) from there. */
static void output_transform(float *y, const float *m, const float *bias, int acc,
                             float *plane, const ddp__wino_plan *p)
{
    size_t ms = (size_t)p->o * (size_t)p->t, yw = (size_t)(2 * p->tw);
    int exact = exact_out(p);
    for (int oi = 0; oi < p->o; oi++) {
        float *yo = y + (size_t)oi * (size_t)p->oh * (size_t)p->ow, *dst = exact ? yo : plane;
        float b = bias ? bias[oi] : 0.0f;
        for (int ti = 0; ti < p->th; ti++) {
            float *r0 = dst + (size_t)(2 * ti) * yw;
            output_row(r0, r0 + yw, m + (size_t)oi * (size_t)p->t + (size_t)ti * (size_t)p->tw,
                       ms, p->tw, b, exact && acc);
        }
        if (exact)
            continue;
        for (int r = 0; r < p->oh; r++)
            ddp__vec_acc_to(yo + (size_t)r * (size_t)p->ow, plane + (size_t)r * yw,
                            (size_t)p->ow, acc);
    }
}

/* ==== one sample ========================================================== */

void ddp__wino_conv(const ddp__wino_plan *p, float *y, const float *x, const float *u,
                    const float *bias, int acc, float *scratch)
{
    float *xp = scratch, *v = xp + padded_floats(p);
    float *m = v + 16 * (size_t)p->c * (size_t)p->t, *plane = m + 16 * (size_t)p->o * (size_t)p->t;
    int wp = p->direct ? p->w : 2 * p->tw + 2;
    if (!p->direct)
        pad_input(xp, x, p);
    input_transform(v, p->direct ? x : xp, wp, p);
    for (int i = 0; i < 16; i++) /* M_i (o, t) = U_i (o, c) V_i (c, t) */
        ddp_sgemm(0, 0, p->o, p->t, p->c, 1.0f, u + (size_t)i * (size_t)p->o * (size_t)p->c,
                  p->c, v + (size_t)i * (size_t)p->c * (size_t)p->t, p->t, 0.0f,
                  m + (size_t)i * (size_t)p->o * (size_t)p->t, p->t);
    output_transform(y, m, bias, acc, plane, p);
}
