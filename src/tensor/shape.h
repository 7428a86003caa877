/* Private shape helper shared by tensor/ and nn/. */
#ifndef DDP_TENSOR_SHAPE_H
#define DDP_TENSOR_SHAPE_H

#include "ddp/tensor.h"

/* Sets ndim, shape, numel and row-major strides of t (data untouched);
 * checks 0 <= ndim <= DDP_TENSOR_MAX_DIM and every dimension > 0. */
int ddp__tensor_set_shape(ddp_tensor *t, int ndim, const int64_t *shape);

#endif
