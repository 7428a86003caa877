/* The LayerNorm, GroupNorm and Embedding modules (ddp_layer_norm_create,
 * ...; src/nn/norm_modules.c): inside a Sequential each gives its op's
 * values and gradients bit for bit, its parameters carry PyTorch's
 * state_dict names and shapes, a model reset gives PyTorch's initial values,
 * and bad arguments and inputs fail with their messages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "fixtures/ops_case.h"

/* A model made of Sequential(m) (PyTorch's "0.<name>" names). */
static ddp_model_t *seq_model(ddp_module_t *m)
{
    ddp_module_t *seq;
    ddp_model_t *model;
    assert_int_equal(ddp_sequential_create(&m, 1, &seq), 0);
    assert_int_equal(ddp_model_from_module(seq, &model), 0);
    return model;
}

/* The op the module should run, on the model's own parameters. */
typedef int (*ref_fn)(ddp_tape_t *tape, ddp_model_t *model, ddp_var_t *x, ddp_var_t **y);

/* Deterministic values in about [-2, 2). */
static void fill(float *a, size_t n, unsigned k)
{
    for (size_t i = 0; i < n; i++)
        a[i] = (float)(((i * 37 + k * 11) % 29) - 14) / 7.0f;
}

/* One forward and backward of mse(y, target) through the model, then the
 * same through ref: outputs, every parameter's gradient and (x_grad) the
 * input's gradient agree bit for bit, and every parameter got a gradient. */
static void same_as_op(ddp_model_t *model, ref_fn ref, const float *x0, int ndim,
                       const int64_t *shape, int x_grad)
{
    size_t n = 1, np = ddp_model_num_params(model), ng;
    for (int i = 0; i < ndim; i++)
        n *= (size_t)shape[i];
    float *x = malloc(n * sizeof *x);
    memcpy(x, x0, n * sizeof *x);
    float *grad = ddp_model_grad_block(model, &ng);
    float *grad1 = malloc((ng ? ng : 1) * sizeof *grad1), *y1 = NULL, *target = NULL;
    float *dx1 = malloc(n * sizeof *dx1);
    size_t ny = 0;
    ddp_tape_t *tape;
    assert_int_equal(ddp_tape_create(&tape), 0);
    for (int pass = 0; pass < 2; pass++) {
        ddp_var_t *vx, *y, *vt, *loss;
        ddp_tape_reset(tape);
        assert_non_null(vx = ops_leaf(tape, x, ndim, shape, x_grad));
        if (pass == 0)
            assert_int_equal(ddp_model_forward(model, tape, vx, &y), 0);
        else
            assert_int_equal(ref(tape, model, vx, &y), 0);
        const ddp_tensor *ty = ddp_var_tensor(y);
        if (pass == 0) {
            ny = ty->numel;
            y1 = malloc(ny * sizeof *y1);
            target = malloc(ny * sizeof *target);
            memcpy(y1, ty->data, ny * sizeof *y1);
            fill(target, ny, 5);
        } else {
            assert_int_equal(ty->numel, ny);
            assert_memory_equal(ty->data, y1, ny * sizeof *y1);
        }
        assert_non_null(vt = ops_leaf(tape, target, ty->ndim, ty->shape, 0));
        assert_int_equal(ddp_op_mse_loss(tape, y, vt, &loss), 0);
        ddp_model_zero_grad(model);
        assert_int_equal(ddp_tape_backward(tape, loss, model), 0);
        if (pass == 0) {
            if (ng)
                memcpy(grad1, grad, ng * sizeof *grad);
            if (x_grad)
                memcpy(dx1, ddp_var_grad(vx), n * sizeof *dx1);
        } else {
            if (ng)
                assert_memory_equal(grad, grad1, ng * sizeof *grad);
            if (x_grad)
                assert_memory_equal(ddp_var_grad(vx), dx1, n * sizeof *dx1);
        }
    }
    for (size_t i = 0; i < np; i++) {
        ddp_param *p = ddp_model_param(model, i);
        double s = 0;
        for (size_t j = 0; j < p->numel; j++)
            s += (double)p->grad[j] * p->grad[j];
        assert_true(s > 0);
    }
    ddp_tape_destroy(tape);
    free(x), free(grad1), free(y1), free(target), free(dx1);
}

/* Parameters "0.weight" and "0.bias" when present, with values away from
 * the reset's ones and zeros so that a swapped or dropped one shows. */
static void vars_wb(ddp_tape_t *tape, ddp_model_t *model, ddp_var_t **w, ddp_var_t **b)
{
    ddp_param *pw = ddp_model_find_param(model, "0.weight");
    ddp_param *pb = ddp_model_find_param(model, "0.bias");
    *w = *b = NULL;
    if (pw)
        assert_int_equal(ddp_tape_param(tape, pw, w), 0);
    if (pb)
        assert_int_equal(ddp_tape_param(tape, pb, b), 0);
}

static void perturb(ddp_model_t *model)
{
    for (size_t i = 0; i < ddp_model_num_params(model); i++) {
        ddp_param *p = ddp_model_param(model, i);
        fill(p->data, p->numel, 3 + (unsigned)i);
    }
}

/* ==== LayerNorm =========================================================== */

static int ref_layer_norm(ddp_tape_t *tape, ddp_model_t *model, ddp_var_t *x, ddp_var_t **y)
{
    ddp_var_t *w, *b;
    vars_wb(tape, model, &w, &b);
    return ddp_op_layer_norm(tape, x, 2, (int64_t[]){3, 4}, w, b, 1e-5f, y);
}

static void test_layer_norm_is_its_op(void **state)
{
    (void)state;
    float x[24];
    fill(x, 24, 1);
    for (int affine = 1; affine >= 0; affine--) {
        ddp_module_t *m;
        assert_int_equal(ddp_layer_norm_create(2, (int64_t[]){3, 4}, 1e-5f, affine, &m), 0);
        ddp_model_t *model = seq_model(m);
        assert_int_equal(ddp_model_num_params(model), affine ? 2 : 0);
        perturb(model);
        same_as_op(model, ref_layer_norm, x, 3, (int64_t[]){2, 3, 4}, 1);
        ddp_model_destroy(model);
    }
}

/* ==== GroupNorm =========================================================== */

static int ref_group_norm(ddp_tape_t *tape, ddp_model_t *model, ddp_var_t *x, ddp_var_t **y)
{
    ddp_var_t *w, *b;
    vars_wb(tape, model, &w, &b);
    return ddp_op_group_norm(tape, x, 3, w, b, 1e-3f, y);
}

static void test_group_norm_is_its_op(void **state)
{
    (void)state;
    float x[60];
    fill(x, 60, 2);
    for (int affine = 1; affine >= 0; affine--) {
        ddp_module_t *m;
        assert_int_equal(ddp_group_norm_create(3, 6, 1e-3f, affine, &m), 0);
        ddp_model_t *model = seq_model(m);
        assert_int_equal(ddp_model_num_params(model), affine ? 2 : 0);
        perturb(model);
        same_as_op(model, ref_group_norm, x, 3, (int64_t[]){2, 6, 5}, 1);
        ddp_model_destroy(model);
    }
}

/* ==== Embedding =========================================================== */

static const int64_t IDX[6] = {1, 0, 9, 2, 2, 5};

static int ref_embedding(ddp_tape_t *tape, ddp_model_t *model, ddp_var_t *x, ddp_var_t **y)
{
    (void)x;
    ddp_var_t *w, *b;
    vars_wb(tape, model, &w, &b);
    return ddp_op_embedding(tape, w, 2, (int64_t[]){2, 3}, IDX, 2, y);
}

static void test_embedding_is_its_op(void **state)
{
    (void)state;
    ddp_module_t *m;
    assert_int_equal(ddp_embedding_create(10, 4, 2, 7, &m), 0);
    ddp_model_t *model = seq_model(m);
    float x[6];
    for (int i = 0; i < 6; i++)
        x[i] = (float)IDX[i];
    same_as_op(model, ref_embedding, x, 2, (int64_t[]){2, 3}, 0);
    /* the rows looked up get gradient; the padding row and the rest none */
    const ddp_param *p = ddp_model_find_param(model, "0.weight");
    for (int r = 0; r < 10; r++) {
        double s = 0;
        for (int j = 0; j < 4; j++)
            s += fabs(p->grad[r * 4 + j]);
        int looked_up = r == 0 || r == 1 || r == 5 || r == 9;
        assert_int_equal(s > 0, looked_up);
    }
    ddp_model_destroy(model);
}

/* ==== names, shapes, reset values ========================================== */

/* The model's parameters are exactly names[i] with shapes[i] (what
 * torch.nn.Sequential(layer).state_dict() lists, PyTorch 1.13). */
static void expect_params(ddp_model_t *model, int n, const char *const *names,
                          const int64_t (*shapes)[2], const int *ndims)
{
    assert_int_equal(ddp_model_num_params(model), n);
    for (int i = 0; i < n; i++) {
        const ddp_param *p = ddp_model_param(model, (size_t)i);
        assert_string_equal(p->name, names[i]);
        assert_int_equal(p->ndim, ndims[i]);
        for (int d = 0; d < ndims[i]; d++)
            assert_int_equal(p->shape[d], shapes[i][d]);
    }
}

static void expect_all(const ddp_param *p, float v)
{
    for (size_t j = 0; j < p->numel; j++)
        assert_true(p->data[j] == v);
}

/* LayerNorm([3, 4]) and GroupNorm(2, 6): weight ones, bias zeros, at
 * creation and again after a model reset that follows a perturbation. */
static void test_norm_names_and_reset(void **state)
{
    (void)state;
    static const char *const wb[2] = {"0.weight", "0.bias"};
    ddp_module_t *m;
    assert_int_equal(ddp_layer_norm_create(2, (int64_t[]){3, 4}, 1e-5f, 1, &m), 0);
    ddp_model_t *ln = seq_model(m);
    expect_params(ln, 2, wb, (const int64_t[][2]){{3, 4}, {3, 4}}, (const int[]){2, 2});
    assert_int_equal(ddp_group_norm_create(2, 6, 1e-5f, 1, &m), 0);
    ddp_model_t *gn = seq_model(m);
    expect_params(gn, 2, wb, (const int64_t[][2]){{6}, {6}}, (const int[]){1, 1});
    ddp_model_t *models[2] = {ln, gn};
    for (int k = 0; k < 2; k++) {
        for (int again = 0; again < 2; again++) {
            expect_all(ddp_model_param(models[k], 0), 1.0f);
            expect_all(ddp_model_param(models[k], 1), 0.0f);
            perturb(models[k]);
            assert_int_equal(ddp_model_reset_parameters(models[k], 3), 0);
        }
        ddp_model_destroy(models[k]);
    }
}

/* Row r of p is all zero. */
static int row_zero(const ddp_param *p, int64_t r)
{
    int64_t dim = p->shape[1];
    for (int64_t j = 0; j < dim; j++)
        if (p->data[r * dim + j] != 0.0f)
            return 0;
    return 1;
}

/* Two Embedding(1000, 8, padding_idx=3) in one model: names and shapes as
 * PyTorch's; after a reset from one generator the padding rows are zero, no
 * other row is, the two tables differ, the values look like N(0, 1), and
 * the same seed gives the same tables. */
static void test_embedding_names_and_reset(void **state)
{
    (void)state;
    ddp_module_t *a, *b;
    ddp_model_t *model;
    assert_int_equal(ddp_embedding_create(1000, 8, 3, 11, &a), 0);
    assert_int_equal(ddp_embedding_create(1000, 8, 3, 11, &b), 0);
    assert_int_equal(ddp_model_create(&model), 0);
    assert_int_equal(ddp_model_add_module(model, "a", a), 0);
    assert_int_equal(ddp_model_add_module(model, "b", b), 0);
    assert_int_equal(ddp_model_seal(model), 0);
    expect_params(model, 2, (const char *const[]){"a.weight", "b.weight"},
                  (const int64_t[][2]){{1000, 8}, {1000, 8}}, (const int[]){2, 2});
    const ddp_param *pa = ddp_model_param(model, 0), *pb = ddp_model_param(model, 1);
    assert_true(row_zero(pa, 3)); /* at creation too */
    assert_int_equal(ddp_model_reset_parameters(model, 42), 0);
    float *first = malloc(pa->numel * sizeof *first);
    memcpy(first, pa->data, pa->numel * sizeof *first);
    for (int k = 0; k < 2; k++) {
        const ddp_param *p = k ? pb : pa;
        double s = 0, s2 = 0;
        for (int64_t r = 0; r < 1000; r++)
            assert_int_equal(row_zero(p, r), r == 3);
        for (size_t j = 0; j < p->numel; j++)
            s += p->data[j], s2 += (double)p->data[j] * p->data[j];
        double mean = s / 7992, var = s2 / 7992 - mean * mean; /* 999 rows drawn */
        assert_true(fabs(mean) < 0.05 && fabs(var - 1) < 0.1);
    }
    assert_memory_not_equal(pa->data, pb->data, pa->numel * sizeof *first);
    assert_int_equal(ddp_model_reset_parameters(model, 42), 0);
    assert_memory_equal(pa->data, first, pa->numel * sizeof *first);
    free(first);
    ddp_model_destroy(model);
    /* PyTorch's padding_idx=-1 is the last row */
    ddp_module_t *c;
    ddp_model_t *mc;
    assert_int_equal(ddp_embedding_create(10, 4, -1, 5, &c), 0);
    assert_int_equal(ddp_model_from_module(c, &mc), 0);
    assert_int_equal(ddp_model_reset_parameters(mc, 1), 0);
    for (int64_t r = 0; r < 10; r++)
        assert_int_equal(row_zero(ddp_model_param(mc, 0), r), r == 9);
    ddp_model_destroy(mc);
}

/* ==== errors ============================================================== */

#define EXPECT_FAIL(call, want)                                             \
    do {                                                                    \
        assert_int_equal((call), DDP_ERR_INVALID_ARG);                      \
        if (!strstr(ddp_last_error(), (want)))                              \
            fail_msg("message \"%s\" lacks \"%s\"", ddp_last_error(), (want)); \
    } while (0)

static void test_bad_arguments(void **state)
{
    (void)state;
    ddp_module_t *m = NULL;
    EXPECT_FAIL(ddp_layer_norm_create(0, (int64_t[]){4}, 1e-5f, 1, &m),
                "LayerNorm: normalized_shape has 0 dimensions (1 to 8)");
    EXPECT_FAIL(ddp_layer_norm_create(2, (int64_t[]){4, 0}, 1e-5f, 1, &m),
                "LayerNorm: normalized_shape[1] is 0 (must be >= 1)");
    EXPECT_FAIL(ddp_layer_norm_create(1, (int64_t[]){4}, 0.0f, 1, &m),
                "LayerNorm: eps 0 must be finite and > 0");
    EXPECT_FAIL(ddp_layer_norm_create(1, (int64_t[]){4}, 1e-5f, 1, NULL),
                "LayerNorm: NULL normalized_shape or output");
    EXPECT_FAIL(ddp_group_norm_create(4, 6, 1e-5f, 1, &m),
                "GroupNorm: num_channels must be divisible by num_groups (6 channels, 4 groups)");
    EXPECT_FAIL(ddp_group_norm_create(0, 6, 1e-5f, 1, &m),
                "GroupNorm: num_groups 0 and num_channels 6 must be >= 1");
    EXPECT_FAIL(ddp_group_norm_create(2, 6, NAN, 1, &m), "GroupNorm: eps nan must be finite");
    EXPECT_FAIL(ddp_embedding_create(0, 4, DDP_EMBEDDING_NO_PADDING, 1, &m),
                "Embedding: num_embeddings 0 must be in [1, 2^24]");
    EXPECT_FAIL(ddp_embedding_create((1 << 24) + 1, 4, DDP_EMBEDDING_NO_PADDING, 1, &m),
                "Embedding: num_embeddings 16777217 must be in [1, 2^24]");
    EXPECT_FAIL(ddp_embedding_create(10, 0, DDP_EMBEDDING_NO_PADDING, 1, &m),
                "embedding_dim 0 >= 1");
    EXPECT_FAIL(ddp_embedding_create(10, 4, 10, 1, &m),
                "Embedding: padding_idx 10 must be in [-10, 10) or DDP_EMBEDDING_NO_PADDING");
    EXPECT_FAIL(ddp_embedding_create(10, 4, -11, 1, &m), "padding_idx -11 must be in [-10, 10)");
    assert_null(m);
}

/* Module m refuses input x (shape) at forward with want in the message. */
static void refuses(ddp_module_t *m, float *x, int ndim, const int64_t *shape, const char *want)
{
    ddp_tape_t *tape;
    ddp_var_t *vx, *y;
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_non_null(vx = ops_leaf(tape, x, ndim, shape, 0));
    EXPECT_FAIL(ddp_module_forward(m, tape, vx, &y), want);
    ddp_tape_destroy(tape);
}

static void test_bad_inputs(void **state)
{
    (void)state;
    float x[24] = {0};
    ddp_module_t *ln, *gn, *emb;
    assert_int_equal(ddp_layer_norm_create(2, (int64_t[]){3, 4}, 1e-5f, 1, &ln), 0);
    assert_int_equal(ddp_group_norm_create(2, 6, 1e-5f, 0, &gn), 0);
    assert_int_equal(ddp_embedding_create(10, 4, DDP_EMBEDDING_NO_PADDING, 1, &emb), 0);
    refuses(ln, x, 2, (int64_t[]){4, 3},
            "layer_norm: input of shape (4, 3) does not end in normalized_shape (3, 4)");
    refuses(gn, x, 3, (int64_t[]){2, 4, 3},
            "GroupNorm: input of 3 dimensions with 4 channels, the layer expects (N, 6, ...)");
    refuses(gn, x, 1, (int64_t[]){6}, "GroupNorm: input of 1 dimensions with 0 channels");
    float idx[4] = {1, 10, 2, 3};
    refuses(emb, idx, 1, (int64_t[]){4},
            "Embedding: input value 10 at position 1 is not a row index in [0, 10) (index out "
            "of range in self)");
    idx[1] = 2.5f;
    refuses(emb, idx, 1, (int64_t[]){4}, "input value 2.5 at position 1 is not a row index");
    idx[1] = -1;
    refuses(emb, idx, 1, (int64_t[]){4}, "input value -1 at position 1 is not a row index");
    idx[3] = NAN, idx[1] = 1;
    refuses(emb, idx, 1, (int64_t[]){4}, "input value nan at position 3 is not a row index");
    ddp_module_destroy(ln);
    ddp_module_destroy(gn);
    ddp_module_destroy(emb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layer_norm_is_its_op),
        cmocka_unit_test(test_group_norm_is_its_op),
        cmocka_unit_test(test_embedding_is_its_op),
        cmocka_unit_test(test_norm_names_and_reset),
        cmocka_unit_test(test_embedding_names_and_reset),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_bad_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
