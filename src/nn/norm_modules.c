/* nn.LayerNorm, nn.GroupNorm and nn.Embedding as user modules
 * (ddp/nn_module.h) over the tape ops of norm.c and embedding.c.  Each owns
 * its parameters under PyTorch's names and shapes and resets them as
 * PyTorch's reset_parameters does; the forward only adds the parameters to
 * the tape and runs the op. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "ddp/nn_module.h"
#include "nn/autograd.h"
#include "nn/ops.h"

/* What LayerNorm and GroupNorm share, first in each one's state so that one
 * setup and one reset serve both: the shape of the affine parameters
 * (LayerNorm's normalized_shape, GroupNorm's (C)) and the parameters. */
typedef struct affine {
    int on; /* elementwise_affine / affine */
    int ndim;
    int64_t shape[DDP_TENSOR_MAX_DIM];
    ddp_param *weight, *bias; /* (shape) each, NULL when off */
} affine;

/* register_parameter("weight"), ("bias") of the affine shape, when on. */
static int affine_setup(ddp_module_t *m, void *u)
{
    affine *a = u;
    if (!a->on)
        return 0;
    DDP_TRY(ddp_module_add_param(m, "weight", a->ndim, a->shape, &a->weight));
    return ddp_module_add_param(m, "bias", a->ndim, a->shape, &a->bias);
}

/* PyTorch's reset_parameters of the affine norms: ones and zeros, no draws. */
static int affine_reset(ddp_module_t *m, ddp_generator *gen, void *u)
{
    (void)m, (void)gen;
    affine *a = u;
    if (!a->on)
        return 0;
    DDP_TRY(ddp_init_ones(a->weight));
    return ddp_init_zeros(a->bias);
}

/* The parameters as tape vars, or NULLs when off. */
static int affine_vars(ddp_tape_t *tape, const affine *a, ddp_var_t **w, ddp_var_t **b)
{
    *w = *b = NULL;
    if (!a->on)
        return 0;
    DDP_TRY(ddp_tape_param(tape, a->weight, w));
    return ddp_tape_param(tape, a->bias, b);
}

/* The module of def over state u (owned), with its parameters made by
 * setup and reset once with gen (NULL for the norms, which draw nothing). */
static int build(const ddp_module_def *def, void *u, int (*setup)(ddp_module_t *, void *),
                 ddp_generator *gen, ddp_module_t **out)
{
    ddp_module_t *m;
    DDP_TRY(ddp_module_create(def, u, &m)); /* frees u on failure */
    int rc = setup(m, u);
    if (rc == 0)
        rc = def->reset(m, gen, u);
    if (rc < 0) {
        ddp_module_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

static int check_eps(const char *type, float eps)
{
    DDP_FAIL_IF(!(eps > 0.0f) || !isfinite(eps), DDP_ERR_INVALID_ARG,
                "%s: eps %g must be finite and > 0", type, (double)eps);
    return 0;
}

/* ==== LayerNorm =========================================================== */

typedef struct layer_norm {
    affine a; /* first: a.ndim, a.shape are normalized_shape, affine or not */
    float eps;
} layer_norm;

static int ln_forward(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y, void *u)
{
    (void)m;
    layer_norm *l = u;
    ddp_var_t *w, *b;
    DDP_TRY(affine_vars(tape, &l->a, &w, &b));
    return ddp_op_layer_norm(tape, x, l->a.ndim, l->a.shape, w, b, l->eps, y);
}

static const ddp_module_def layer_norm_def = {"LayerNorm", ln_forward, affine_reset, free};

int ddp_layer_norm_create(int ndim, const int64_t *normalized_shape, float eps,
                          int elementwise_affine, ddp_module_t **out)
{
    DDP_FAIL_IF(!out || (ndim > 0 && !normalized_shape), DDP_ERR_INVALID_ARG,
                "LayerNorm: NULL normalized_shape or output");
    DDP_FAIL_IF(ndim < 1 || ndim > DDP_TENSOR_MAX_DIM, DDP_ERR_INVALID_ARG,
                "LayerNorm: normalized_shape has %d dimensions (1 to %d)", ndim,
                DDP_TENSOR_MAX_DIM);
    for (int i = 0; i < ndim; i++)
        DDP_FAIL_IF(normalized_shape[i] < 1, DDP_ERR_INVALID_ARG,
                    "LayerNorm: normalized_shape[%d] is %lld (must be >= 1)", i,
                    (long long)normalized_shape[i]);
    DDP_TRY(check_eps("LayerNorm", eps));
    layer_norm *l = calloc(1, sizeof *l);
    DDP_FAIL_IF(!l, DDP_ERR_NOMEM, "LayerNorm: out of memory");
    l->a.on = elementwise_affine != 0;
    l->a.ndim = ndim;
    memcpy(l->a.shape, normalized_shape, (size_t)ndim * sizeof *normalized_shape);
    l->eps = eps;
    return build(&layer_norm_def, l, affine_setup, NULL, out);
}

/* ==== GroupNorm =========================================================== */

typedef struct group_norm {
    affine a; /* first: (C) */
    int groups, channels;
    float eps;
} group_norm;

static int gn_forward(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y, void *u)
{
    (void)m;
    group_norm *g = u;
    DDP_TRY(ddp__op_check_var(tape, x, "GroupNorm", "input"));
    /* Without affine the op would take any C divisible by the groups; the
     * layer was made for one C, so another is the caller's mistake. */
    DDP_FAIL_IF(x->t.ndim < 2 || x->t.shape[1] != g->channels, DDP_ERR_INVALID_ARG,
                "GroupNorm: input of %d dimensions with %lld channels, the layer expects "
                "(N, %d, ...)", x->t.ndim, x->t.ndim < 2 ? 0LL : (long long)x->t.shape[1],
                g->channels);
    ddp_var_t *w, *b;
    DDP_TRY(affine_vars(tape, &g->a, &w, &b));
    return ddp_op_group_norm(tape, x, g->groups, w, b, g->eps, y);
}

static const ddp_module_def group_norm_def = {"GroupNorm", gn_forward, affine_reset, free};

int ddp_group_norm_create(int num_groups, int num_channels, float eps, int affine_on,
                          ddp_module_t **out)
{
    DDP_FAIL_IF(!out, DDP_ERR_INVALID_ARG, "GroupNorm: output is NULL");
    DDP_FAIL_IF(num_groups < 1 || num_channels < 1, DDP_ERR_INVALID_ARG,
                "GroupNorm: num_groups %d and num_channels %d must be >= 1", num_groups,
                num_channels);
    DDP_FAIL_IF(num_channels % num_groups != 0, DDP_ERR_INVALID_ARG,
                "GroupNorm: num_channels must be divisible by num_groups (%d channels, %d "
                "groups)", num_channels, num_groups);
    DDP_TRY(check_eps("GroupNorm", eps));
    group_norm *g = calloc(1, sizeof *g);
    DDP_FAIL_IF(!g, DDP_ERR_NOMEM, "GroupNorm: out of memory");
    *g = (group_norm){.a = {.on = affine_on != 0, .ndim = 1, .shape = {num_channels}},
                      .groups = num_groups, .channels = num_channels, .eps = eps};
    return build(&group_norm_def, g, affine_setup, NULL, out);
}

/* ==== Embedding =========================================================== */

/* The largest table whose every index a float input holds exactly: 2^24. */
#define EMB_MAX_ROWS (INT64_C(1) << 24)

typedef struct embedding {
    int64_t num, dim, padding; /* padding: a row, or DDP_EMBEDDING_NO_PADDING */
    ddp_param *weight;         /* (num, dim) */
} embedding;

/* The input's values as int64 indices on the tape (its arena: no malloc per
 * step); each must be an exact integer in [0, num), PyTorch's "index out of
 * range in self" otherwise.  Checked before the conversion, which would be
 * undefined for a value outside int64. */
static int emb_indices(ddp_tape_t *tape, const ddp_var_t *x, int64_t num, int64_t **out)
{
    size_t n = x->t.numel;
    int64_t *idx = ddp__tape_alloc(tape, (n ? n : 1) * sizeof *idx);
    DDP_FAIL_IF(!idx, DDP_ERR_NOMEM, "Embedding: out of memory for %zu indices", n);
    for (size_t i = 0; i < n; i++) {
        float v = x->t.data[i];
        DDP_FAIL_IF(!(v >= 0.0f && (double)v < (double)num) || v != truncf(v),
                    DDP_ERR_INVALID_ARG,
                    "Embedding: input value %g at position %zu is not a row index in [0, %lld) "
                    "(index out of range in self)", (double)v, i, (long long)num);
        idx[i] = (int64_t)v;
    }
    *out = idx;
    return 0;
}

static int emb_forward(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y, void *u)
{
    (void)m;
    embedding *e = u;
    DDP_TRY(ddp__op_check_var(tape, x, "Embedding", "input"));
    int64_t *idx = NULL;
    ddp_var_t *w;
    DDP_TRY(emb_indices(tape, x, e->num, &idx));
    DDP_TRY(ddp_tape_param(tape, e->weight, &w));
    return ddp_op_embedding(tape, w, x->t.ndim, x->t.shape, idx, e->padding, y);
}

/* nn.Embedding.reset_parameters: normal_(weight), then the padding row 0. */
static int emb_reset(ddp_module_t *m, ddp_generator *gen, void *u)
{
    (void)m;
    embedding *e = u;
    DDP_TRY(ddp_init_normal(e->weight, 0.0, 1.0, gen));
    if (e->padding != DDP_EMBEDDING_NO_PADDING)
        memset(e->weight->data + e->padding * e->dim, 0, (size_t)e->dim * sizeof(float));
    return 0;
}

static int emb_setup(ddp_module_t *m, void *u)
{
    embedding *e = u;
    return ddp_module_add_param(m, "weight", 2, (int64_t[]){e->num, e->dim}, &e->weight);
}

static const ddp_module_def embedding_def = {"Embedding", emb_forward, emb_reset, free};

int ddp_embedding_create(int64_t num_embeddings, int64_t embedding_dim, int64_t padding_idx,
                         uint64_t seed, ddp_module_t **out)
{
    DDP_FAIL_IF(!out, DDP_ERR_INVALID_ARG, "Embedding: output is NULL");
    DDP_FAIL_IF(num_embeddings < 1 || num_embeddings > EMB_MAX_ROWS || embedding_dim < 1,
                DDP_ERR_INVALID_ARG,
                "Embedding: num_embeddings %lld must be in [1, 2^24] (the indices arrive as "
                "floats) and embedding_dim %lld >= 1", (long long)num_embeddings,
                (long long)embedding_dim);
    if (padding_idx != DDP_EMBEDDING_NO_PADDING && padding_idx < 0 &&
        padding_idx >= -num_embeddings)
        padding_idx += num_embeddings; /* PyTorch's negative padding_idx */
    DDP_FAIL_IF(padding_idx != DDP_EMBEDDING_NO_PADDING &&
                    (padding_idx < 0 || padding_idx >= num_embeddings),
                DDP_ERR_INVALID_ARG,
                "Embedding: padding_idx %lld must be in [-%lld, %lld) or "
                "DDP_EMBEDDING_NO_PADDING",
                (long long)padding_idx, (long long)num_embeddings, (long long)num_embeddings);
    embedding *e = calloc(1, sizeof *e);
    DDP_FAIL_IF(!e, DDP_ERR_NOMEM, "Embedding: out of memory");
    *e = (embedding){.num = num_embeddings, .dim = embedding_dim, .padding = padding_idx};
    ddp_generator gen;
    ddp_generator_seed(&gen, seed);
    return build(&embedding_def, e, emb_setup, &gen, out);
}
