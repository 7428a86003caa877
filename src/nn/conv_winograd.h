/* Winograd F(2x2, 3x3) and F(4x4, 3x3) convolutions (private to nn/;
 * conv.c picks them): a 3x3, stride-1, undilated correlation of one
 * sample's (c, h, w) input into its (o, oh, ow) output in m x m output
 * tiles (m = 2 or 4), each tile's (m + 2)^2 input patch d and each 3x3
 * filter g transformed so that the tile is
 *   Y = A^T [ (G g G^T) . (B^T d B) ] A
 * (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks",
 * 2015): (m + 2)^2 multiplications per tile and input channel instead of
 * 9 m^2, done as (m + 2)^2 GEMMs (o, c) x (c, tiles).  F(2x2) is
 * conv_winograd.c and conv_winograd_dw.c, F(4x4) conv_winograd4.c; the
 * functions here take either plan.  docs/cnn.md has the cost model. */
#ifndef DDP_NN_CONV_WINOGRAD_H
#define DDP_NN_CONV_WINOGRAD_H

#include <stddef.h>
#include <stdint.h>

#include "tensor/im2col.h"

/* One sample's Winograd convolution in m x m tiles: c -> o channels over
 * an h x w input padded by (ph, pw); tiles th x tw cover the oh x ow
 * output, t counts them with one spare per row (conv_winograd.c says why);
 * wp = m (tw + 1), the padded width the tiles read. */
typedef struct ddp__wino_plan {
    int m, c, o, h, w, ph, pw, oh, ow;
    int th, tw, t, wp;
    int beta0; /* F(4x4): its GEMMs write M with beta 0 (else they add into an M the
                * output transform left zero); plan_init sets it where OpenBLAS's
                * small-matrix kernels make beta 0 free (conv_winograd4.c) */
} ddp__wino_plan;

/* Does conv2d's geometry g (one group of og output channels) take the
 * Winograd path?  3x3, stride 1, dilation 1, padding <= 2 (the input
 * gradient is the same kind of convolution with padding 2 - p), and at
 * least 8 input and output channels: below that the 16 GEMMs' inner
 * dimension is too thin to beat one im2col GEMM. */
int ddp__wino_fits(const ddp__conv_geom *g, int og);
/* The tile size m for such a geometry: DDP_CONV_WINOGRAD's 2 or 4, or by
 * default 4 where the output is at least DDP__WINO4_MIN on both sides
 * (smaller outputs leave F(4x4)'s GEMMs too few columns).  An error for a
 * bad DDP_CONV_WINOGRAD. */
#define DDP__WINO4_MIN 16
int ddp__wino_tile(const ddp__conv_geom *g, int *m);
/* (m + 2)^2: the transformed tile's points, the number of GEMMs. */
static inline int ddp__wino_points(int m) { return (m + 2) * (m + 2); }

/* One 2x2 pool window v (row-major) through a ReLU: the largest value and
 * its place 2 row + column in *at (a float: a byte store kept the callers'
 * loops scalar), the first maximum as MaxPool2d's (no NaN survives the
 * ReLU).  Both tile sizes' fused pools use it. */
static inline float ddp__wino_relu_max4(float v[4], float *at)
{
    for (int k = 0; k < 4; k++)
        v[k] = v[k] > 0.0f ? v[k] : 0.0f;
    float best = v[0], a = 0.0f;
    for (int k = 1; k < 4; k++) {
        int take = v[k] > best;
        best = take ? v[k] : best, a = take ? (float)k : a;
    }
    *at = a;
    return best;
}

/* The fused pool's backward for one sample: its conv output gradient dy
 * (planes, 2 qh, 2 qw) from the pooled gradient g, pooled output y and
 * winners arg (planes, qh, qw): each window's winner gets g where y > 0,
 * everything else 0, the values max pool's and the ReLU's backwards give
 * (their masks, one after the other). */
void ddp__wino_unpool_relu(float *restrict dy, const float *restrict g, const float *restrict y,
                           const uint8_t *restrict arg, size_t planes, int qh, int qw);

void ddp__wino_plan_init(ddp__wino_plan *p, int m, int c, int o, int h, int w, int ph, int pw);
/* Does beta 0 cost the GEMMs nothing under the OpenBLAS kernels this
 * process runs (ddp__cpu_blas_beta0_free), asked once? */
int ddp__wino_beta0_free(void);
/* Scratch floats ddp__wino_conv and ddp__wino_dw_sample need (the split
 * input, V, M, transform rows; F(4x4) also a zero-padded block of rows). */
size_t ddp__wino_scratch_floats(const ddp__wino_plan *p);

/* u (P, o, c) = G w G^T for w (o, c, 3, 3), P = ddp__wino_points(m).  With
 * flip, the input gradient's filters: u (P, c, o) from w (o, c, 3, 3)
 * rotated by 180 degrees, so that dx = conv(dy, u) with padding 2 - p. */
void ddp__wino_filters(float *restrict u, const float *restrict w, int m, int o, int c, int flip);

/* acc of ddp__wino_conv: y = max(conv + bias, 0), a ReLU fused in; or
 * that followed by MaxPool2d(2), each pool window inside one tile (oh, ow
 * even: F(2x2)'s tile is one window, F(4x4)'s four). */
#define DDP__WINO_RELU 2
#define DDP__WINO_RELU_POOL 3

/* y (o, oh, ow) (=|+=) conv(x (c, h, w), u) + bias (o floats, or NULL);
 * acc 1 adds to y, DDP__WINO_RELU writes it through a ReLU,
 * DDP__WINO_RELU_POOL writes y (o, oh / 2, ow / 2) pooled and arg (the
 * same) each window's winner (2 row + column in its window: the first
 * maximum, as MaxPool2d's).  scratch: ddp__wino_scratch_floats(p) floats;
 * fresh 1 the first time it is used, 0 when a previous call with the same
 * plan left it (its M part is then zero, which saves clearing it; F(4x4)
 * with p->beta0 writes M whole and neither needs nor keeps it zero, so a
 * scratch goes on with the beta0 it started with). */
void ddp__wino_conv(const ddp__wino_plan *p, float *y, uint8_t *arg, const float *x,
                    const float *u, const float *bias, int acc, int fresh, float *scratch);

/* F(2x2)'s scratch carved into its parts: x's rows split by parity (e,
 * od), V (16, c, t), M (16, o, t) and one channel's rows. */
typedef struct ddp__wino_scratch {
    float *e, *od, *v, *m, *rows;
} ddp__wino_scratch;
ddp__wino_scratch ddp__wino_scratch_parts(const ddp__wino_plan *p, float *scratch);

/* F(2x2)'s V (16, c, t) = B^T d B of every tile of x (c, h, w) into s->v
 * (through s->e, s->od and s->rows). */
void ddp__wino_input(const ddp__wino_plan *p, const float *x, const ddp__wino_scratch *s);

/* The weight gradient by Winograd F(3x3, m x m), conv_winograd_dw.c: per
 * sample dU_i (o, c) += dM_i (o, t) V_i (c, t)^T, where dM = A dY A^T of
 * every m x m tile of dy (o, oh, ow) and V that of x as in the forward;
 * du (P, o, c) accumulates when acc (the first sample writes: acc 0).
 * scratch: ddp__wino_scratch_floats(p) floats. */
void ddp__wino_dw_sample(const ddp__wino_plan *p, float *du, const float *x, const float *dy,
                         int acc, float *scratch);
/* dw (o, c, 3, 3) (=|+= by acc) G^T dU G for du (P, o, c). */
void ddp__wino_filters_grad(float *restrict dw, const float *restrict du, int m, int o, int c,
                            int acc);

/* F(4x4, 3x3), conv_winograd4.c, behind the functions above. */
size_t ddp__wino4_scratch_floats(const ddp__wino_plan *p);
void ddp__wino4_filter(float u[36], const float g[9]);
void ddp__wino4_filter_grad(float g[9], const float d[36], int acc);
void ddp__wino4_conv(const ddp__wino_plan *p, float *y, uint8_t *arg, const float *x,
                     const float *u, const float *bias, int acc, int fresh, float *scratch);
void ddp__wino4_dw_sample(const ddp__wino_plan *p, float *du, const float *x, const float *dy,
                          int acc, float *scratch);

#endif
