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

/* conv2d with a ReLU fused in (y = max(conv2d(x, w, b), 0)): the same
 * values and gradients as ddp_op_conv2d then ddp_op_relu, without the
 * pre-activation tensor and the ReLU's passes over it (conv.c). */
int ddp__op_conv2d_relu(ddp_tape_t *tape, ddp_var_t *x, ddp_var_t *w, ddp_var_t *b,
                        const ddp_conv2d_options *o, ddp_var_t **y);

/* Whether m is a Conv2d module, and its forward, fused with a ReLU when
 * relu is 1 (conv_modules.c; Sequential fuses a Conv2d followed by a ReLU). */
int ddp__conv2d_module_is(const ddp_module_t *m);
int ddp__conv2d_module_forward(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, int relu,
                               ddp_var_t **y);

#endif
