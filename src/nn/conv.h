/* What conv.c, pool.c, conv_modules.c and layers.c share: argument checks
 * of the NCHW ops, and conv2d with a ReLU fused in. */
#ifndef DDP_NN_CONV_PRIV_H
#define DDP_NN_CONV_PRIV_H

#include "ddp/nn.h"

/* stride >= 1, padding >= 0, dilation >= 1 (pairs), else a message naming op. */
int ddp__conv_check_pairs(const char *op, const int *stride, const int *padding,
                          const int *dilation);
/* x is (N, C, H, W) with at most INT_MAX elements, else a message naming op. */
int ddp__conv_input_4d(const ddp_var_t *x, const char *op);

/* What ddp__op_conv2d_fused applies after the convolution. */
enum { DDP__CONV_PLAIN, DDP__CONV_RELU, DDP__CONV_RELU_POOL2 };

/* conv2d with a ReLU (y = max(conv2d(x, w, b), 0)), or a ReLU then
 * MaxPool2d(2), fused in (epilogue): the same values and gradients as
 * ddp_op_conv2d then ddp_op_relu (then ddp_op_max_pool2d), without the
 * tensors between them and their passes.  The pool is fused where
 * Winograd's 2x2 tiles are its windows (conv.c), a separate op elsewhere. */
int ddp__op_conv2d_fused(ddp_tape_t *tape, ddp_var_t *x, ddp_var_t *w, ddp_var_t *b,
                         const ddp_conv2d_options *o, int epilogue, ddp_var_t **y);

/* Whether m is a Conv2d module, and its forward with an epilogue (as
 * ddp__op_conv2d_fused's); whether m is a MaxPool2d(2) (kernel and stride 2,
 * no padding or dilation).  conv_modules.c; Sequential fuses a Conv2d
 * followed by a ReLU, and by a MaxPool2d(2) after that. */
int ddp__conv2d_module_is(const ddp_module_t *m);
int ddp__conv2d_module_forward(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, int epilogue,
                               ddp_var_t **y);
int ddp__max_pool2_module_is(const ddp_module_t *m);

#endif
