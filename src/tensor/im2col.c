/* im2col / col2im for NCHW convolutions; see im2col.h and docs/cnn.md.
 *
 * Both walk cols row by row: row (ci, ki, kj) reads (or writes) one shifted,
 * strided window of channel ci.  For each row the output columns whose input
 * falls inside the image form one interval [lo, hi) (computed once per row,
 * not tested per element), so the inner loop is a plain copy and the
 * padding a fill on either side.  The rows are short (24 floats for the
 * MNIST network's second layer): inline loops, not memcpy/memset calls,
 * whose call overhead cost 20 % of that layer's forward. */
#if defined(__GNUC__) && !defined(__clang__)
/* no-tree-loop-distribute-patterns: keeps the short copy loops loops (gcc
 * would turn them back into memcpy calls). */
#pragma GCC optimize("O3", "no-tree-loop-distribute-patterns")
#endif

#include "tensor/im2col.h"

#include <string.h>

#include "tensor/kernels.h"

int ddp__conv_out_size(int in, int k, int stride, int pad, int dil)
{
    long span = (long)dil * (k - 1) + 1;
    long room = (long)in + 2L * pad - span;
    return room < 0 ? 0 : (int)(room / stride + 1);
}

int ddp__conv_is_pointwise(const ddp__conv_geom *g)
{
    return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0;
}

/* The output columns [*lo, *hi) whose input column o*s - p + off lies in
 * [0, n). */
static void valid_range(int n, int out, int s, int p, int off, int *lo, int *hi)
{
    int shift = p - off; /* input col = o*s - shift */
    int l = shift <= 0 ? 0 : (shift + s - 1) / s;
    int last = n - 1 + shift; /* o*s <= last */
    int h = last < 0 ? 0 : last / s + 1;
    if (h > out)
        h = out;
    if (l > h)
        l = h;
    *lo = l;
    *hi = h;
}

DDP_KERNEL void ddp__im2col(float *restrict cols, const float *restrict x,
                            const ddp__conv_geom *g)
{
    const size_t plane = (size_t)g->h * (size_t)g->w;
    for (int ci = 0; ci < g->c; ci++)
        for (int ki = 0; ki < g->kh; ki++)
            for (int kj = 0; kj < g->kw; kj++) {
                const float *xc = x + (size_t)ci * plane;
                int lo, hi;
                valid_range(g->w, g->ow, g->sw, g->pw, kj * g->dw, &lo, &hi);
                int col0 = lo * g->sw - g->pw + kj * g->dw; /* input column of lo */
                for (int o = 0; o < g->oh; o++, cols += g->ow) {
                    int ih = o * g->sh - g->ph + ki * g->dh;
                    if (ih < 0 || ih >= g->h || lo == hi) {
                        memset(cols, 0, (size_t)g->ow * sizeof *cols);
                        continue;
                    }
                    const float *src = xc + (size_t)ih * (size_t)g->w + col0;
                    for (int k = 0; k < lo; k++)
                        cols[k] = 0.0f;
                    if (g->sw == 1) /* a loop: rows are short, a memcpy call costs more */
                        for (int k = 0; k < hi - lo; k++)
                            cols[lo + k] = src[k];
                    else
                        for (int k = 0; k < hi - lo; k++)
                            cols[lo + k] = src[(size_t)k * (size_t)g->sw];
                    for (int k = hi; k < g->ow; k++)
                        cols[k] = 0.0f;
                }
            }
}

DDP_KERNEL void ddp__col2im(float *restrict x, const float *restrict cols,
                            const ddp__conv_geom *g, int acc)
{
    const size_t plane = (size_t)g->h * (size_t)g->w;
    if (!acc)
        memset(x, 0, (size_t)g->c * plane * sizeof *x);
    for (int ci = 0; ci < g->c; ci++)
        for (int ki = 0; ki < g->kh; ki++)
            for (int kj = 0; kj < g->kw; kj++) {
                float *xc = x + (size_t)ci * plane;
                int lo, hi;
                valid_range(g->w, g->ow, g->sw, g->pw, kj * g->dw, &lo, &hi);
                int col0 = lo * g->sw - g->pw + kj * g->dw;
                for (int o = 0; o < g->oh; o++, cols += g->ow) {
                    int ih = o * g->sh - g->ph + ki * g->dh;
                    if (ih < 0 || ih >= g->h)
                        continue;
                    float *dst = xc + (size_t)ih * (size_t)g->w + col0;
                    const float *src = cols + lo;
                    if (g->sw == 1)
                        for (int k = 0; k < hi - lo; k++)
                            dst[k] += src[k];
                    else
                        for (int k = 0; k < hi - lo; k++)
                            dst[(size_t)k * (size_t)g->sw] += src[k];
                }
            }
}
