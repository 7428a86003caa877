/* Winograd F(2x2, 3x3) convolutions (private to nn/; conv.c picks them):
 * a 3x3, stride-1, undilated correlation of one sample's (c, h, w) input
 * into its (o, oh, ow) output in 2x2 output tiles, each tile's 4x4 input
 * patch d and each 3x3 filter g transformed so that the tile is
 *   Y = A^T [ (G g G^T) . (B^T d B) ] A
 * (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks",
 * 2015): 16 multiplications per tile and input channel instead of 36, done
 * as 16 GEMMs (o, c) x (c, tiles).  docs/cnn.md has the cost model. */
#ifndef DDP_NN_CONV_WINOGRAD_H
#define DDP_NN_CONV_WINOGRAD_H

#include <stddef.h>
#include <stdint.h>

#include "tensor/im2col.h"

/* One sample's Winograd convolution: c -> o channels over an h x w input
 * padded by (ph, pw); tiles th x tw cover the oh x ow output, t counts them
 * with one spare per row (conv_winograd.c says why); wp = 2 tw + 2. */
typedef struct ddp__wino_plan {
    int c, o, h, w, ph, pw, oh, ow;
    int th, tw, t, wp;
} ddp__wino_plan;

/* Does conv2d's geometry g (one group of og output channels) take the
 * Winograd path?  3x3, stride 1, dilation 1, padding <= 2 (the input
 * gradient is the same kind of convolution with padding 2 - p), and at
 * least 8 input and output channels: below that the 16 GEMMs' inner
 * dimension is too thin to beat one im2col GEMM. */
int ddp__wino_fits(const ddp__conv_geom *g, int og);

void ddp__wino_plan_init(ddp__wino_plan *p, int c, int o, int h, int w, int ph, int pw);
/* Scratch floats ddp__wino_conv needs (split input rows, V, M, output rows). */
size_t ddp__wino_scratch_floats(const ddp__wino_plan *p);

/* u (16, o, c) = G w G^T for w (o, c, 3, 3).  With flip, the input
 * gradient's filters: u (16, c, o) from w (o, c, 3, 3) rotated by 180
 * degrees, so that dx = conv(dy, u) with padding 2 - p. */
void ddp__wino_filters(float *restrict u, const float *restrict w, int o, int c, int flip);

/* acc of ddp__wino_conv: y = max(conv + bias, 0), a ReLU fused in; or
 * that followed by MaxPool2d(2), each 2x2 tile one pool window (oh, ow
 * even). */
#define DDP__WINO_RELU 2
#define DDP__WINO_RELU_POOL 3

/* y (o, oh, ow) (=|+=) conv(x (c, h, w), u) + bias (o floats, or NULL);
 * acc 1 adds to y, DDP__WINO_RELU writes it through a ReLU,
 * DDP__WINO_RELU_POOL writes y (o, th, tw) pooled and arg (o, th, tw) each
 * window's winner (2 row + column in its tile: the first maximum, as
 * MaxPool2d's).  scratch: ddp__wino_scratch_floats(p) floats; fresh 1 the
 * first time it is used, 0 when a previous call left it (its M part is
 * then zero, which saves clearing it). */
void ddp__wino_conv(const ddp__wino_plan *p, float *y, uint8_t *arg, const float *x,
                    const float *u, const float *bias, int acc, int fresh, float *scratch);

/* ddp__wino_conv's scratch carved into its parts: x's rows split by parity
 * (e, od), V (16, c, t), M (16, o, t) and one channel's rows. */
typedef struct ddp__wino_scratch {
    float *e, *od, *v, *m, *rows;
} ddp__wino_scratch;
ddp__wino_scratch ddp__wino_scratch_parts(const ddp__wino_plan *p, float *scratch);

/* V (16, c, t) = B^T d B of every tile of x (c, h, w) into s->v (through
 * s->e, s->od and s->rows). */
void ddp__wino_input(const ddp__wino_plan *p, const float *x, const ddp__wino_scratch *s);

/* The weight gradient by Winograd F(3x3, 2x2), conv_winograd_dw.c: per
 * sample dU_i (o, c) += dM_i (o, t) V_i (c, t)^T, where dM = A dY A^T of
 * every 2x2 tile of dy (o, oh, ow) and V that of x as in the forward;
 * du (16, o, c) accumulates when acc (the first sample writes: acc 0).
 * scratch: ddp__wino_scratch_floats(p) floats. */
void ddp__wino_dw_sample(const ddp__wino_plan *p, float *du, const float *x, const float *dy,
                         int acc, float *scratch);
/* dw (o, c, 3, 3) (=|+= by acc) G^T dU G for du (16, o, c). */
void ddp__wino_filters_grad(float *restrict dw, const float *restrict du, int o, int c, int acc);

#endif
