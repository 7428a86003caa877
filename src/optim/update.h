/* Private: the per-parameter update kernels of optim.c, one fused loop each,
 * following torch.optim's single-tensor code (update.c). */
#ifndef DDP_OPTIM_UPDATE_H
#define DDP_OPTIM_UPDATE_H

#include <stddef.h>
#include <stdint.h>

#include "ddp/optim.h"

/* _single_tensor_sgd: w, g, buf (n); buf NULL without momentum; first: the
 * step that sets buf = d. */
void ddp__sgd_update(float *restrict w, const float *restrict g, float *restrict buf, size_t n,
                     const ddp_sgd_options *o, int first);
/* _single_tensor_adam / adamw (decoupled): m, v, vmax (NULL without
 * amsgrad), step counted from 1. */
void ddp__adam_update(float *restrict w, const float *restrict g, float *restrict m,
                      float *restrict v, float *restrict vmax, size_t n,
                      const ddp_adam_options *o, int decoupled, int64_t step);
/* _single_tensor_adadelta: square_avg sq, acc_delta acc. */
void ddp__adadelta_update(float *restrict w, const float *restrict g, float *restrict sq,
                          float *restrict acc, size_t n, const ddp_adadelta_options *o);
/* _single_tensor_rmsprop: square_avg sq, momentum_buffer buf (NULL: no
 * momentum), grad_avg gavg (NULL: not centered). */
void ddp__rmsprop_update(float *restrict w, const float *restrict g, float *restrict sq,
                         float *restrict buf, float *restrict gavg, size_t n,
                         const ddp_rmsprop_options *o);

#endif
