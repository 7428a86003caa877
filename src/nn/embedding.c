/* embedding: rows of a weight table picked by int64 indices (copied onto
 * the tape like labels), as F.embedding.  The weight's gradient is dense:
 * each index adds its output row's gradient into its weight row, except the
 * padding row, which PyTorch leaves without gradient. */
#include <string.h>

#include "base/error.h"
#include "nn/ops.h"

typedef struct emb_ctx {
    int64_t n, padding; /* indices (in v->labels), the padding row or NO_PADDING */
} emb_ctx;

static int embedding_backward(ddp_tape_t *tape, ddp_var_t *v);
static const ddp__op_def embedding_def = {"embedding", embedding_backward, 0};

int ddp_op_embedding(ddp_tape_t *tape, ddp_var_t *weight, int ndim, const int64_t *shape,
                     const int64_t *indices, int64_t padding_idx, ddp_var_t **y)
{
    DDP_SHAPE_BUFS;
    DDP_FAIL_IF(!tape || !y || !indices || (ndim > 0 && !shape), DDP_ERR_INVALID_ARG,
                "embedding: NULL tape, indices, shape or output");
    DDP_TRY(ddp__op_check_var(tape, weight, "embedding", "weight"));
    DDP_FAIL_IF(weight->t.ndim != 2, DDP_ERR_INVALID_ARG,
                "embedding: weight must be (num_embeddings, dim), got shape %s",
                DDP_SHAPE(weight, 0));
    int64_t num = weight->t.shape[0], dim = weight->t.shape[1];
    DDP_FAIL_IF(ndim < 0 || ndim + 1 > DDP_TENSOR_MAX_DIM, DDP_ERR_INVALID_ARG,
                "embedding: %d index dimensions (at most %d)", ndim, DDP_TENSOR_MAX_DIM - 1);
    if (padding_idx != DDP_EMBEDDING_NO_PADDING && padding_idx < 0 && padding_idx >= -num)
        padding_idx += num; /* PyTorch's negative padding_idx */
    DDP_FAIL_IF(padding_idx != DDP_EMBEDDING_NO_PADDING && (padding_idx < 0 || padding_idx >= num),
                DDP_ERR_INVALID_ARG, "embedding: padding_idx %lld is out of range for %lld rows",
                (long long)padding_idx, (long long)num);
    int64_t oshape[DDP_TENSOR_MAX_DIM], n = 1;
    for (int i = 0; i < ndim; i++) {
        DDP_FAIL_IF(shape[i] < 1, DDP_ERR_INVALID_ARG, "embedding: index dimension %d is %lld",
                    i, (long long)shape[i]);
        oshape[i] = shape[i];
        n *= shape[i];
    }
    oshape[ndim] = dim;
    for (int64_t i = 0; i < n; i++)
        DDP_FAIL_IF(indices[i] < 0 || indices[i] >= num, DDP_ERR_INVALID_ARG,
                    "embedding: index %lld at position %lld is out of range for %lld rows",
                    (long long)indices[i], (long long)i, (long long)num);
    ddp_var_t *v;
    DDP_TRY(ddp__op_push(tape, &embedding_def, ndim + 1, oshape, 1, weight, NULL, NULL, &v));
    emb_ctx *c = ddp__tape_alloc(tape, sizeof *c);
    v->labels = ddp__tape_alloc(tape, (size_t)n * sizeof *indices);
    if (!c || !v->labels)
        return DDP_ERR_NOMEM;
    *c = (emb_ctx){.n = n, .padding = padding_idx};
    v->ctx = c;
    memcpy(v->labels, indices, (size_t)n * sizeof *indices);
    for (int64_t i = 0; i < n; i++) /* (n, dim) */
        memcpy(v->t.data + i * dim, weight->t.data + indices[i] * dim, (size_t)dim * sizeof(float));
    *y = v;
    return 0;
}

static int embedding_backward(ddp_tape_t *tape, ddp_var_t *v)
{
    ddp_var_t *w = v->in[0];
    const emb_ctx *c = v->ctx;
    int64_t dim = w->t.shape[1];
    int acc;
    DDP_GRAD_TARGET(dw, w); /* (num, dim), dense */
    if (!acc)
        memset(dw, 0, (size_t)w->t.numel * sizeof *dw);
    for (int64_t i = 0; i < c->n; i++) {
        int64_t r = v->labels[i];
        if (r == c->padding)
            continue;
        for (int64_t j = 0; j < dim; j++)
            dw[r * dim + j] += v->grad[i * dim + j];
    }
    return 0;
}
