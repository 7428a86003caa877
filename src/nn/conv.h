/* What conv.c, pool.c and conv_modules.c share: argument checks of the
 * NCHW ops. */
#ifndef DDP_NN_CONV_PRIV_H
#define DDP_NN_CONV_PRIV_H

#include "ddp/nn.h"

/* stride >= 1, padding >= 0, dilation >= 1 (pairs), else a message naming op. */
int ddp__conv_check_pairs(const char *op, const int *stride, const int *padding,
                          const int *dilation);
/* x is (N, C, H, W) with at most INT_MAX elements, else a message naming op. */
int ddp__conv_input_4d(const ddp_var_t *x, const char *op);

#endif
