/* layer_norm, group_norm and embedding: outputs and gradients (of sum(y *
 * r)) against PyTorch 1.13 (tests/fixtures/norm_ref.h, made by
 * norm_ref.py), against float64 central differences (ddp_gradcheck), and
 * their argument errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ddp.h"
#include "fixtures/norm_ref.h"

#define TOL 2e-5

static void near(const float *got, const float *want, int n, const char *what)
{
    for (int i = 0; i < n; i++)
        if (!(fabs((double)got[i] - want[i]) <= TOL * (1.0 + fabs((double)want[i]))))
            fail_msg("%s[%d]: %.9g, PyTorch %.9g", what, i, (double)got[i], (double)want[i]);
}

/* One fixture case: which op, its inputs' shapes. */
typedef struct {
    const char *name;
    int op; /* 0 layer_norm, 1 group_norm */
    int nin;
    int xnd;
    int64_t xshape[4];
    int nd;           /* layer_norm: normalized dims; group_norm: groups */
    int64_t nshape[2];
    float eps;
    const float *in[3], *gin[3], *r, *y;
} norm_case;

static const norm_case cases[] = {
    {"ln_affine", 0, 3, 3, {2, 3, 4}, 1, {4}, 1e-5f, {ln_affine_in0, ln_affine_in1, ln_affine_in2},
     {ln_affine_gin0, ln_affine_gin1, ln_affine_gin2}, ln_affine_r, ln_affine_y},
    {"ln_plain", 0, 1, 3, {2, 3, 4}, 2, {3, 4}, 1e-3f, {ln_plain_in0}, {ln_plain_gin0},
     ln_plain_r, ln_plain_y},
    {"gn_affine", 1, 3, 3, {2, 6, 3}, 3, {0}, 1e-5f, {gn_affine_in0, gn_affine_in1, gn_affine_in2},
     {gn_affine_gin0, gn_affine_gin1, gn_affine_gin2}, gn_affine_r, gn_affine_y},
    {"gn_plain", 1, 1, 4, {2, 4, 2, 2}, 2, {0}, 1e-5f, {gn_plain_in0}, {gn_plain_gin0},
     gn_plain_r, gn_plain_y},
};

static int build(ddp_tape_t *tape, ddp_var_t *const *in, int nin, ddp_var_t **out, int nout,
                 void *user)
{
    (void)nout;
    const norm_case *c = user;
    ddp_var_t *w = nin > 1 ? in[1] : NULL, *b = nin > 2 ? in[2] : NULL;
    return c->op == 0 ? ddp_op_layer_norm(tape, in[0], c->nd, c->nshape, w, b, c->eps, out)
                      : ddp_op_group_norm(tape, in[0], c->nd, w, b, c->eps, out);
}

/* The same in float64: K groups of L, channel (k % G) cpg + j / S. */
static int ref(const double *const *in, int nin, double *out, void *user)
{
    const norm_case *c = user;
    int64_t numel = 1;
    for (int i = 0; i < c->xnd; i++)
        numel *= c->xshape[i];
    int64_t L, G, cpg, S;
    if (c->op == 0) {
        L = 1;
        for (int i = 0; i < c->nd; i++)
            L *= c->nshape[i];
        G = 1, cpg = L, S = 1;
    } else {
        G = c->nd, cpg = c->xshape[1] / G, S = numel / (c->xshape[0] * c->xshape[1]);
        L = cpg * S;
    }
    for (int64_t k = 0; k < numel / L; k++) {
        const double *x = in[0] + k * L;
        double m = 0, v = 0;
        for (int64_t j = 0; j < L; j++)
            m += x[j] / (double)L;
        for (int64_t j = 0; j < L; j++)
            v += (x[j] - m) * (x[j] - m) / (double)L;
        for (int64_t j = 0; j < L; j++) {
            int64_t ch = (k % G) * cpg + j / S;
            out[k * L + j] = (x[j] - m) / sqrt(v + c->eps) * (nin > 1 ? in[1][ch] : 1.0) +
                             (nin > 2 ? in[2][ch] : 0.0);
        }
    }
    return 0;
}

static void wrap_inputs(const norm_case *c, ddp_tensor *in)
{
    assert_int_equal(ddp_tensor_wrap(&in[0], (float *)c->in[0], c->xnd, c->xshape), 0);
    int64_t ch = c->op == 0 ? c->xshape[c->xnd - 1] : c->xshape[1];
    const int64_t *ashape = c->op == 0 ? c->nshape : &ch;
    int and = c->op == 0 ? c->nd : 1;
    for (int i = 1; i < c->nin; i++)
        assert_int_equal(ddp_tensor_wrap(&in[i], (float *)c->in[i], and, ashape), 0);
}

static void test_norms_against_pytorch(void **state)
{
    (void)state;
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const norm_case *c = &cases[k];
        ddp_tensor in[3];
        wrap_inputs(c, in);
        ddp_tape_t *tape;
        ddp_var_t *v[3], *y;
        assert_int_equal(ddp_tape_create(&tape), 0);
        for (int i = 0; i < c->nin; i++)
            assert_int_equal(ddp_tape_input(tape, &in[i], 1, &v[i]), 0);
        assert_int_equal(build(tape, v, c->nin, &y, 1, (void *)c), 0);
        const ddp_tensor *yt = ddp_var_tensor(y);
        near(yt->data, c->y, (int)yt->numel, c->name);
        assert_int_equal(ddp_tape_backward_grad(tape, y, c->r, NULL), 0);
        for (int i = 0; i < c->nin; i++) {
            char what[64];
            snprintf(what, sizeof what, "%s d input %d", c->name, i);
            near(ddp_var_grad(v[i]), c->gin[i], (int)in[i].numel, what);
        }
        ddp_tape_destroy(tape);
        if (ddp_gradcheck(build, ref, c->nin, in, NULL, (void *)c) != 0)
            fail_msg("%s: %s", c->name, ddp_last_error());
    }
}

static int emb_build(ddp_tape_t *tape, ddp_var_t *const *in, int nin, ddp_var_t **out, int nout,
                     void *user)
{
    (void)nin, (void)nout;
    return ddp_op_embedding(tape, in[0], 2, (int64_t[]){2, 3}, emb_idx, *(int64_t *)user, out);
}

static int emb_ref(const double *const *in, int nin, double *out, void *user)
{
    (void)nin, (void)user;
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 3; j++)
            out[i * 3 + j] = in[0][emb_idx[i] * 3 + j];
    return 0;
}

static void test_embedding(void **state)
{
    (void)state;
    ddp_tape_t *tape;
    ddp_tensor w;
    ddp_var_t *wv, *y;
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_int_equal(ddp_tensor_wrap(&w, (float *)emb_in0, 2, (int64_t[]){5, 3}), 0);
    assert_int_equal(ddp_tape_input(tape, &w, 1, &wv), 0);
    int64_t idx[6];
    memcpy(idx, emb_idx, sizeof idx);
    assert_int_equal(ddp_op_embedding(tape, wv, 2, (int64_t[]){2, 3}, idx, 1, &y), 0);
    idx[0] = 4; /* copied: changing them now changes nothing */
    const ddp_tensor *yt = ddp_var_tensor(y);
    assert_int_equal(yt->ndim, 3);
    assert_int_equal(yt->shape[2], 3);
    near(yt->data, emb_y, 18, "embedding");
    assert_int_equal(ddp_tape_backward_grad(tape, y, emb_r, NULL), 0);
    near(ddp_var_grad(wv), emb_gin0, 15, "embedding d weight"); /* row 1 (padding): 0 */
    ddp_tape_destroy(tape);
    /* Central differences: without padding every row agrees; with it, the
     * padding row's true gradient is what PyTorch drops. */
    int64_t none = DDP_EMBEDDING_NO_PADDING, one = 1;
    if (ddp_gradcheck(emb_build, emb_ref, 1, &w, NULL, &none) != 0)
        fail_msg("%s", ddp_last_error());
    if (ddp_gradcheck(emb_build, emb_ref, 1, &w, NULL, &one) != DDP_ERR_MISMATCH)
        fail_msg("the padding row should differ from its true gradient");
    assert_non_null(strstr(ddp_last_error(), "gradcheck: input 0 element 3: analytic 0,"));
}

static void test_errors(void **state)
{
    (void)state;
    ddp_tape_t *tape;
    ddp_tensor x, w;
    ddp_var_t *xv, *wv, *y;
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_int_equal(ddp_tensor_wrap(&x, (float *)gn_affine_in0, 3, (int64_t[]){2, 6, 3}), 0);
    assert_int_equal(ddp_tensor_wrap(&w, (float *)gn_affine_in1, 1, (int64_t[]){6}), 0);
    assert_int_equal(ddp_tape_input(tape, &x, 1, &xv), 0);
    assert_int_equal(ddp_tape_input(tape, &w, 1, &wv), 0);
    assert_int_equal(ddp_op_group_norm(tape, xv, 4, NULL, NULL, 1e-5f, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "6 channels are not divisible into 4 groups"));
    assert_int_equal(ddp_op_layer_norm(tape, xv, 1, (int64_t[]){6}, NULL, NULL, 1e-5f, &y),
                     DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(),
                           "input of shape (2, 6, 3) does not end in normalized_shape (6)"));
    assert_int_equal(ddp_op_layer_norm(tape, xv, 1, (int64_t[]){3}, wv, NULL, 1e-5f, &y),
                     DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "layer_norm: weight of shape (6), expected (3)"));
    assert_int_equal(ddp_op_layer_norm(tape, xv, 1, (int64_t[]){3}, NULL, NULL, 0.0f, &y),
                     DDP_ERR_INVALID_ARG);
    assert_int_equal(ddp_op_embedding(tape, xv, 1, (int64_t[]){1}, (int64_t[]){0},
                                      DDP_EMBEDDING_NO_PADDING, &y),
                     DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "weight must be (num_embeddings, dim)"));
    ddp_tensor e;
    ddp_var_t *ev;
    assert_int_equal(ddp_tensor_wrap(&e, (float *)emb_in0, 2, (int64_t[]){5, 3}), 0);
    assert_int_equal(ddp_tape_input(tape, &e, 1, &ev), 0);
    assert_int_equal(ddp_op_embedding(tape, ev, 1, (int64_t[]){2}, (int64_t[]){0, 5},
                                      DDP_EMBEDDING_NO_PADDING, &y),
                     DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "index 5 at position 1 is out of range for 5 rows"));
    assert_int_equal(ddp_op_embedding(tape, ev, 1, (int64_t[]){1}, (int64_t[]){0}, 7, &y),
                     DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "padding_idx 7 is out of range"));
    ddp_tape_destroy(tape);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_norms_against_pytorch),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
