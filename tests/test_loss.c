/* The losses' options against PyTorch 1.13 (tests/fixtures/loss_ref.h,
 * made by loss_ref.py) and against float64 central differences
 * (ddp_gradcheck): cross-entropy with label_smoothing and ignore_index,
 * nll_loss with ignore_index, BCEWithLogits with and without pos_weight
 * (soft targets that require grad, logits of +-40); every row ignored; the
 * options' errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ddp.h"
#include "fixtures/loss_ref.h"

#define TOL 2e-6

static void near(const float *got, const float *want, int n, double tol, const char *what)
{
    for (int i = 0; i < n; i++)
        if (!(fabs((double)got[i] - want[i]) <= tol * (1.0 + fabs((double)want[i]))))
            fail_msg("%s[%d]: %.9g, PyTorch %.9g", what, i, (double)got[i], (double)want[i]);
}

typedef struct {
    const int64_t *labels;
    ddp_cross_entropy_options o;
    int nll;
    int plain; /* through ddp_op_cross_entropy, no options */
} ce_case;

/* Loss and logits gradient of one case on a fresh tape. */
static void run_ce(const ce_case *c, float *loss, float *grad)
{
    ddp_tape_t *tape;
    ddp_tensor t;
    ddp_var_t *x, *y;
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_int_equal(ddp_tensor_wrap(&t, (float *)ce_logits, 2, (int64_t[]){5, 4}), 0);
    assert_int_equal(ddp_tape_input(tape, &t, 1, &x), 0);
    ddp_nll_loss_options no = {c->o.ignore_index};
    int rc = c->plain ? ddp_op_cross_entropy(tape, x, c->labels, &y)
             : c->nll ? ddp_op_nll_loss_opts(tape, x, c->labels, &no, &y)
                      : ddp_op_cross_entropy_opts(tape, x, c->labels, &c->o, &y);
    assert_int_equal(rc, 0);
    assert_int_equal(ddp_tape_backward(tape, y, NULL), 0);
    *loss = ddp_var_item(y);
    memcpy(grad, ddp_var_grad(x), 20 * sizeof(float));
    ddp_tape_destroy(tape);
}

static void test_cross_entropy_against_pytorch(void **state)
{
    (void)state;
    const struct {
        const char *name;
        ce_case c;
        float loss;
        const float *grad;
    } cases[] = {
        {"plain", {ce_labels_plain, {-100, 0.0f}, 0, 0}, ce_plain_loss, ce_plain_grad},
        {"label_smoothing 0.1", {ce_labels_plain, {-100, 0.1f}, 0, 0}, ce_smooth_loss,
         ce_smooth_grad},
        {"label_smoothing 0.2, a row ignored", {ce_labels_ignored, {-100, 0.2f}, 0, 0},
         ce_smooth_ignored_loss, ce_smooth_ignored_grad},
        {"ignore_index 2", {ce_labels_ignore2, {2, 0.0f}, 0, 0}, ce_ignore2_loss, ce_ignore2_grad},
        {"nll ignore_index 2", {ce_labels_ignore2, {2, 0.0f}, 1, 0}, nll_ignore2_loss,
         nll_ignore2_grad},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        float loss, grad[20];
        run_ce(&cases[k].c, &loss, grad);
        if (!(fabs((double)loss - cases[k].loss) <= TOL * (1.0 + fabs((double)cases[k].loss))))
            fail_msg("%s: loss %.9g, PyTorch %.9g", cases[k].name, (double)loss,
                     (double)cases[k].loss);
        near(grad, cases[k].grad, 20, TOL, cases[k].name);
    }
    /* The old calls are the options' defaults, bitwise. */
    float l1, l2, g1[20], g2[20];
    ce_case plain = cases[0].c;
    plain.plain = 1;
    run_ce(&cases[0].c, &l1, g1);
    run_ce(&plain, &l2, g2);
    assert_true(l1 == l2);
    assert_memory_equal(g1, g2, sizeof g1);
}

/* ---- float64 central differences ---- */

static int ce_build(ddp_tape_t *tape, ddp_var_t *const *in, int nin, ddp_var_t **out, int nout,
                    void *user)
{
    (void)nin, (void)nout;
    const ce_case *c = user;
    ddp_nll_loss_options no = {c->o.ignore_index};
    return c->nll ? ddp_op_nll_loss_opts(tape, in[0], c->labels, &no, out)
                  : ddp_op_cross_entropy_opts(tape, in[0], c->labels, &c->o, out);
}

static int ce_ref(const double *const *in, int nin, double *out, void *user)
{
    (void)nin;
    const ce_case *c = user;
    double nll = 0.0, smooth = 0.0, e = c->o.label_smoothing;
    int valid = 0;
    for (int r = 0; r < 5; r++) {
        const double *x = in[0] + r * 4;
        if (c->labels[r] == c->o.ignore_index)
            continue;
        valid++;
        double lse = 0.0;
        for (int j = 0; j < 4; j++)
            lse += c->nll ? 0.0 : exp(x[j]);
        lse = c->nll ? 0.0 : log(lse);
        nll += lse - x[c->labels[r]];
        for (int j = 0; j < 4; j++)
            smooth += lse - x[j];
    }
    out[0] = (1.0 - e) * nll / valid + e / 4.0 * smooth / valid;
    return 0;
}

static void test_cross_entropy_finite_differences(void **state)
{
    (void)state;
    ddp_tensor in;
    assert_int_equal(ddp_tensor_wrap(&in, (float *)ce_logits, 2, (int64_t[]){5, 4}), 0);
    ce_case cases[] = {
        {ce_labels_ignored, {-100, 0.2f}, 0, 0},
        {ce_labels_ignore2, {2, 0.0f}, 0, 0},
        {ce_labels_ignore2, {2, 0.0f}, 1, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
        if (ddp_gradcheck(ce_build, ce_ref, 1, &in, NULL, &cases[k]) != 0)
            fail_msg("case %zu: %s", k, ddp_last_error());
}

static int bce_build(ddp_tape_t *tape, ddp_var_t *const *in, int nin, ddp_var_t **out, int nout,
                     void *user)
{
    (void)nin, (void)nout;
    return ddp_op_bce_with_logits(tape, in[0], in[1], user, out);
}

static int bce_ref(const double *const *in, int nin, double *out, void *user)
{
    (void)nin;
    const float *pw = user;
    double s = 0.0;
    for (int i = 0; i < 12; i++) {
        double x = in[0][i], t = in[1][i], lw = 1.0 + ((pw ? pw[i % 4] : 1.0) - 1.0) * t;
        s += (1.0 - t) * x + lw * (fmax(-x, 0.0) + log1p(exp(-fabs(x))));
    }
    out[0] = s / 12.0;
    return 0;
}

static void test_bce_with_logits(void **state)
{
    (void)state;
    for (int with_pw = 0; with_pw < 2; with_pw++) {
        const float *pw = with_pw ? bce_pw : NULL;
        ddp_tape_t *tape;
        ddp_tensor tx, tt;
        ddp_var_t *x, *t, *y;
        assert_int_equal(ddp_tape_create(&tape), 0);
        assert_int_equal(ddp_tensor_wrap(&tx, (float *)bce_x, 2, (int64_t[]){3, 4}), 0);
        assert_int_equal(ddp_tensor_wrap(&tt, (float *)bce_t, 2, (int64_t[]){3, 4}), 0);
        assert_int_equal(ddp_tape_input(tape, &tx, 1, &x), 0);
        assert_int_equal(ddp_tape_input(tape, &tt, 1, &t), 0);
        assert_int_equal(ddp_op_bce_with_logits(tape, x, t, pw, &y), 0);
        assert_int_equal(ddp_tape_backward(tape, y, NULL), 0);
        float want = with_pw ? bce_pw_loss : bce_loss;
        if (!(fabs((double)ddp_var_item(y) - want) <= TOL * (1.0 + fabs((double)want))))
            fail_msg("pos_weight %d: loss %.9g, PyTorch %.9g", with_pw,
                     (double)ddp_var_item(y), (double)want);
        near(ddp_var_grad(x), with_pw ? bce_pw_gx : bce_gx, 12, TOL, "d input");
        near(ddp_var_grad(t), with_pw ? bce_pw_gt : bce_gt, 12, TOL, "d target");
        ddp_tape_destroy(tape);
        /* float64 central differences, away from the +-40 logits where
         * the reference itself is flat to rounding. */
        ddp_tensor in[2];
        assert_int_equal(ddp_tensor_wrap(&in[0], (float *)bce_x, 2, (int64_t[]){3, 4}), 0);
        assert_int_equal(ddp_tensor_wrap(&in[1], (float *)bce_t, 2, (int64_t[]){3, 4}), 0);
        if (ddp_gradcheck(bce_build, bce_ref, 2, in, NULL, (void *)pw) != 0)
            fail_msg("pos_weight %d: %s", with_pw, ddp_last_error());
    }
}

static void test_every_row_ignored_and_errors(void **state)
{
    (void)state;
    ddp_tape_t *tape;
    ddp_tensor t;
    ddp_var_t *x, *y;
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_int_equal(ddp_tensor_wrap(&t, (float *)ce_logits, 2, (int64_t[]){5, 4}), 0);
    assert_int_equal(ddp_tape_input(tape, &t, 1, &x), 0);
    const int64_t all[5] = {-100, -100, -100, -100, -100}, bad[5] = {1, 2, 4, 0, 0};
    assert_int_equal(ddp_op_cross_entropy(tape, x, all, &y), 0);
    assert_true(isnan(ddp_var_item(y))); /* PyTorch: nan */
    assert_int_equal(ddp_tape_backward(tape, y, NULL), 0);
    for (int i = 0; i < 20; i++)
        assert_true(ddp_var_grad(x)[i] == 0.0f);
    ddp_tape_reset(tape);
    assert_int_equal(ddp_tape_input(tape, &t, 1, &x), 0);
    ddp_cross_entropy_options o = ddp_cross_entropy_defaults();
    assert_int_equal(o.ignore_index, -100);
    o.ignore_index = 4;
    assert_int_equal(ddp_op_cross_entropy_opts(tape, x, bad, &o, &y), 0); /* 4 ignored */
    o.ignore_index = -1;
    assert_int_equal(ddp_op_cross_entropy_opts(tape, x, bad, &o, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(),
                           "cross_entropy: label 4 at index 2 is out of range for 4 classes"));
    o.label_smoothing = 1.5f;
    assert_int_equal(ddp_op_cross_entropy_opts(tape, x, bad, &o, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "label_smoothing 1.5 is not in [0, 1]"));
    assert_int_equal(ddp_op_nll_loss_opts(tape, x, bad, NULL, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "nll_loss: label 4 at index 2"));
    ddp_tensor t2;
    ddp_var_t *x2;
    assert_int_equal(ddp_tensor_wrap(&t2, (float *)ce_logits, 2, (int64_t[]){4, 5}), 0);
    assert_int_equal(ddp_tape_input(tape, &t2, 0, &x2), 0);
    assert_int_equal(ddp_op_bce_with_logits(tape, x, x2, NULL, &y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "binary_cross_entropy_with_logits: input of shape "
                                             "(5, 4) and target of shape (4, 5) differ"));
    ddp_tape_destroy(tape);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cross_entropy_against_pytorch),
        cmocka_unit_test(test_cross_entropy_finite_differences),
        cmocka_unit_test(test_bce_with_logits),
        cmocka_unit_test(test_every_row_ignored_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
