/* im2col / col2im: the lowering of a 2-D convolution (NCHW) to a GEMM
 * (private to libddp; nn/conv.c uses them).  docs/cnn.md has the cost model.
 *
 * One sample and one group at a time: x is (c, h, w) contiguous, cols is
 * (c * kh * kw, oh * ow) row-major, row (ci, ki, kj) holding, for every
 * output position (o_h, o_w), the input x[ci][o_h*sh - ph + ki*dh][o_w*sw -
 * pw + kj*dw] (0 outside the image: zero padding).  Then a convolution is
 * y (cout, oh*ow) = W (cout, c*kh*kw) cols, and its input gradient is
 * dx = col2im(W^T dy), col2im adding every column entry back where it came
 * from (the adjoint of im2col). */
#ifndef DDP_TENSOR_IM2COL_H
#define DDP_TENSOR_IM2COL_H

#include <stddef.h>

typedef struct ddp__conv_geom {
    int c, h, w;            /* input channels (of one group), height, width */
    int kh, kw;             /* kernel */
    int sh, sw;             /* stride */
    int ph, pw;             /* zero padding on each side */
    int dh, dw;             /* dilation */
    int oh, ow;             /* output size (ddp__conv_out_size) */
} ddp__conv_geom;

/* PyTorch's output size: (in + 2 pad - dil (k - 1) - 1) / stride + 1, or a
 * value < 1 when the (padded) input is smaller than the dilated kernel. */
int ddp__conv_out_size(int in, int k, int stride, int pad, int dil);

/* Is the lowering the identity (1x1 kernel, stride 1, no padding)?  Then
 * cols is x itself and neither function needs to run. */
int ddp__conv_is_pointwise(const ddp__conv_geom *g);

/* cols (c*kh*kw, oh*ow) = the patches of x (c, h, w). */
void ddp__im2col(float *restrict cols, const float *restrict x, const ddp__conv_geom *g);
/* x (c, h, w) (=|+=) col2im(cols): acc 0 writes (zeros where no patch
 * reaches), 1 adds. */
void ddp__col2im(float *restrict x, const float *restrict cols, const ddp__conv_geom *g,
                 int acc);

#endif
