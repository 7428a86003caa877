/* libddp normalisation and embedding ops: layer_norm, group_norm and
 * embedding as tape ops with their backwards (torch.nn.functional's
 * semantics, PyTorch 1.13).  Statistics are computed in double; variance is
 * the biased one, as PyTorch's. */
#ifndef DDP_NN_NORM_H
#define DDP_NN_NORM_H

#include "ddp/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* F.layer_norm(x, normalized_shape, weight, bias, eps): each slice over the
 * last nd dimensions of x, which must equal normalized_shape[0 .. nd), is
 * normalised to zero mean and unit variance, then scaled by weight and
 * shifted by bias (each of normalized_shape, or NULL).  eps > 0. */
DDP_API int ddp_op_layer_norm(ddp_tape_t *tape, ddp_var_t *x, int nd,
                              const int64_t *normalized_shape, ddp_var_t *weight,
                              ddp_var_t *bias, float eps, ddp_var_t **y);
/* F.group_norm(x, num_groups, weight, bias, eps): x (N, C, *) with C a
 * multiple of num_groups; each sample's C / num_groups channels of a group
 * (with all their positions) are normalised together, then each channel
 * scaled and shifted by weight (C) and bias (C) (each may be NULL). */
DDP_API int ddp_op_group_norm(ddp_tape_t *tape, ddp_var_t *x, int num_groups, ddp_var_t *weight,
                              ddp_var_t *bias, float eps, ddp_var_t **y);

/* "No padding row" for ddp_op_embedding. */
#define DDP_EMBEDDING_NO_PADDING (-1)
/* F.embedding(indices, weight, padding_idx): y (*shape, D) holds row
 * indices[i] of weight (num, D) for each of the prod(shape) indices (copied,
 * each in [0, num)).  The row padding_idx (in [0, num), or
 * DDP_EMBEDDING_NO_PADDING; PyTorch's negative values are num + padding_idx)
 * gets no gradient.  The weight's gradient is dense (weight's shape). */
DDP_API int ddp_op_embedding(ddp_tape_t *tape, ddp_var_t *weight, int ndim, const int64_t *shape,
                             const int64_t *indices, int64_t padding_idx, ddp_var_t **y);

#ifdef __cplusplus
}
#endif
#endif
