/* libddp nn layer: convolution and pooling (torch.nn's Conv2d, MaxPool2d,
 * AvgPool2d, AdaptiveAvgPool2d, Dropout2d, Identity), as tape ops and as
 * modules.  Included by ddp/nn.h.
 *
 * Tensors are NCHW: (batch, channels, height, width), contiguous.  The
 * convolution is lowered to GEMMs through CBLAS (im2col per sample and
 * group; docs/cnn.md has the cost model); its scratch comes from the tape's
 * arena, so a steady training step allocates nothing.  Output sizes follow
 * PyTorch (floor mode): (in + 2 pad - dil (k - 1) - 1) / stride + 1. */
#ifndef DDP_NN_CONV_H
#define DDP_NN_CONV_H

#include "ddp/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* nn.Conv2d's arguments.  The ops read stride, padding, dilation and groups
 * (channels and kernel come from the weight's shape); the module reads all. */
typedef struct ddp_conv2d_options {
    int in_channels, out_channels;
    int kernel_size[2];     /* (kh, kw) */
    int stride[2];          /* default (1, 1) */
    int padding[2];         /* zero padding on each side, default (0, 0) */
    int dilation[2];        /* default (1, 1) */
    int groups;             /* default 1; divides both channel counts */
    int bias;               /* default 1 */
} ddp_conv2d_options;

/* Conv2d(in_channels, out_channels, kernel_size) with PyTorch's defaults;
 * set the other fields after. */
DDP_API ddp_conv2d_options ddp_conv2d_defaults(int in_channels, int out_channels,
                                               int kernel_size);

/* The pooling layers' arguments (MaxPool2d, AvgPool2d). */
typedef struct ddp_pool2d_options {
    int kernel_size[2];
    int stride[2];          /* default: kernel_size (a 0 entry also means that) */
    int padding[2];         /* at most half the (dilated) kernel, as PyTorch */
    int dilation[2];        /* max pool only, default (1, 1) */
    int count_include_pad;  /* avg pool only: padded zeros count in the mean (default 1) */
} ddp_pool2d_options;

DDP_API ddp_pool2d_options ddp_pool2d_defaults(int kernel_size);

/* ==== ops ================================================================= */

/* y = conv2d(x, w, b), as F.conv2d: x (N, C, H, W), w (O, C / groups, kh,
 * kw), b (O) or NULL; y (N, O, OH, OW).  Backward order: b, w, x. */
DDP_API int ddp_op_conv2d(ddp_tape_t *tape, ddp_var_t *x, ddp_var_t *w, ddp_var_t *b,
                          const ddp_conv2d_options *o, ddp_var_t **y);
/* F.max_pool2d: each output is the largest input of its window (padding
 * never wins); its gradient goes to that input, the first in row-major
 * window order among equal maxima (PyTorch's rule); a NaN wins. */
DDP_API int ddp_op_max_pool2d(ddp_tape_t *tape, ddp_var_t *x, const ddp_pool2d_options *o,
                              ddp_var_t **y);
/* F.avg_pool2d: the mean of each window; with count_include_pad the
 * divisor counts the padding inside the window, else only real inputs. */
DDP_API int ddp_op_avg_pool2d(ddp_tape_t *tape, ddp_var_t *x, const ddp_pool2d_options *o,
                              ddp_var_t **y);
/* F.adaptive_avg_pool2d to (oh, ow): output i averages rows
 * [floor(i H / oh), ceil((i + 1) H / oh)), and likewise for columns. */
DDP_API int ddp_op_adaptive_avg_pool2d(ddp_tape_t *tape, ddp_var_t *x, int oh, int ow,
                                       ddp_var_t **y);
/* F.dropout2d: in training, each channel (n, c) of x (N, C, H, W) is zeroed
 * with probability p and the others scaled by 1 / (1 - p), the mask drawn
 * from a generator seeded with seed; with training 0 or p 0, y is x itself. */
DDP_API int ddp_op_dropout2d(ddp_tape_t *tape, ddp_var_t *x, float p, int training,
                             uint64_t seed, ddp_var_t **y);

/* ==== modules =============================================================
 * As the modules of nn.h: created alone, then owned by a container or model. */

/* nn.Conv2d: weight (out, in / groups, kh, kw) from kaiming_uniform(a =
 * sqrt(5)) and bias (out) from U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in =
 * in / groups * kh * kw (both bounds are 1/sqrt(fan_in)), drawn from a
 * generator seeded with seed (ddp_model_reset_parameters redraws them).
 * Parameters "weight", "bias". */
DDP_API int ddp_conv2d_create(const ddp_conv2d_options *o, uint64_t seed, ddp_module_t **out);
DDP_API int ddp_max_pool2d_create(const ddp_pool2d_options *o, ddp_module_t **out);
DDP_API int ddp_avg_pool2d_create(const ddp_pool2d_options *o, ddp_module_t **out);
DDP_API int ddp_adaptive_avg_pool2d_create(int oh, int ow, ddp_module_t **out);
/* nn.Dropout2d(p): active in training mode only; one seed per forward from
 * a generator seeded with seed. */
DDP_API int ddp_dropout2d_create(float p, uint64_t seed, ddp_module_t **out);
/* nn.Identity: y is x. */
DDP_API int ddp_identity_create(ddp_module_t **out);

#ifdef __cplusplus
}
#endif
#endif
