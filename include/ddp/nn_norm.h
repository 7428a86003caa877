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

/* "No padding row" for ddp_op_embedding (PyTorch's padding_idx=None; not
 * -1, which is PyTorch's last row). */
#define DDP_EMBEDDING_NO_PADDING INT64_MIN
/* F.embedding(indices, weight, padding_idx): y (*shape, D) holds row
 * indices[i] of weight (num, D) for each of the prod(shape) indices (copied,
 * each in [0, num)).  The row padding_idx (in [-num, num): a negative one
 * is num + padding_idx, as PyTorch's; or DDP_EMBEDDING_NO_PADDING) gets no
 * gradient.  The weight's gradient is dense (weight's shape). */
DDP_API int ddp_op_embedding(ddp_tape_t *tape, ddp_var_t *weight, int ndim, const int64_t *shape,
                             const int64_t *indices, int64_t padding_idx, ddp_var_t **y);

/* ==== modules =============================================================
 * nn.LayerNorm, nn.GroupNorm and nn.Embedding as modules (user modules of
 * ddp/nn_module.h, usable in a Sequential or a model): parameters under
 * PyTorch's state_dict names and shapes, reset as PyTorch's
 * reset_parameters (ddp_model_reset_parameters draws from its one
 * generator).  The caller owns *out (ddp_module_destroy) until a container
 * or model adopts it. */

/* nn.LayerNorm(normalized_shape, eps, elementwise_affine): normalises the
 * last ndim dimensions of its input, which must equal normalized_shape
 * (copied).  Affine: "weight" (ones) and "bias" (zeros) of normalized_shape.
 * eps > 0 (PyTorch's default 1e-5). */
DDP_API int ddp_layer_norm_create(int ndim, const int64_t *normalized_shape, float eps,
                                  int elementwise_affine, ddp_module_t **out);
/* nn.GroupNorm(num_groups, num_channels, eps, affine): input (N, C, *) with
 * C == num_channels, a multiple of num_groups (checked here).  Affine:
 * "weight" (ones) and "bias" (zeros) of (C). */
DDP_API int ddp_group_norm_create(int num_groups, int num_channels, float eps, int affine,
                                  ddp_module_t **out);
/* nn.Embedding(num_embeddings, embedding_dim, padding_idx): "weight"
 * (num_embeddings, embedding_dim) drawn from N(0, 1), its padding_idx row
 * (or DDP_EMBEDDING_NO_PADDING) zeroed and left without gradient.  Created
 * from a generator seeded with seed, as ddp_linear_create.
 *
 * The input var holds the indices as floats that are exact integers in
 * [0, num_embeddings); the output is (*input shape, embedding_dim).  Why
 * floats: a module's forward takes one var, so this keeps Embedding a plain
 * module (first in a Sequential, ddp_model_forward, DDP) with the indices on
 * the tape beside the data they index, where a setter would be state kept
 * outside the step, easy to leave stale.  A float holds every integer up to
 * 2^24 exactly, so num_embeddings is at most 2^24; a value that is not an
 * integer row index fails the forward ("index out of range in self", as
 * PyTorch), naming the value and its position.  The input gets no gradient. */
DDP_API int ddp_embedding_create(int64_t num_embeddings, int64_t embedding_dim,
                                 int64_t padding_idx, uint64_t seed, ddp_module_t **out);

#ifdef __cplusplus
}
#endif
#endif
