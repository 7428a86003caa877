/* What powersgd.c shares with powersgd_ddp.c and powersgd_kernels.c. */
#ifndef DDP_DDP_POWERSGD_IMPL_H
#define DDP_DDP_POWERSGD_IMPL_H

#include <stdint.h>

#include "ddp/powersgd.h"

/* The state frees its layout's user pointer with free_fn when destroyed. */
void ddp__powersgd_own_user(ddp_powersgd_t *s, void (*free_fn)(void *));

/* powersgd_kernels.c, on one (rows x cols) row-major matrix with Q^T
 * (r x cols) and P (rows x r):
 * e = (add ? e + g : g), p = e Q. */
void ddp__psgd_add_project(float *restrict e, const float *restrict g, const float *restrict qt,
                           float *restrict p, int64_t rows, int64_t cols, int r, int add);
/* qt = (e^T p)^T, i.e. Q = E^T P transposed. */
void ddp__psgd_accumulate_q(float *restrict qt, const float *restrict e, const float *restrict p,
                            int64_t rows, int64_t cols, int r);
/* g = p qt (= P Q^T); with feedback, e -= g. */
void ddp__psgd_reconstruct(float *restrict g, float *restrict e, const float *restrict p,
                           const float *restrict qt, int64_t rows, int64_t cols, int r,
                           int feedback);

#endif
