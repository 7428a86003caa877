/* Custom ops (ddp_function_apply) and the exported gradient check
 * (ddp_gradcheck): an op with two outputs of different shapes and a
 * parameter input checked against float64 central differences; an unused
 * output's gradient is zero; the grad-ready hook fires for the parameter
 * once its gradient is final, and DDP on 2 real processes averages it with
 * no find_unused_parameters; a deliberately wrong backward, and a reference
 * that is not the op's function, fail the check with messages naming input,
 * element and values; callback errors and bad arguments are reported. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp.h"
#include "ddp/ext.h"
#include "fork_children.h"
#include "mnist_output.h"
#include "pg_util.h"

/* ---- the op: x (B, C), a (C) -> y1 = a * tanh(x) (B, C), y2 = sum_c x^2 (B) ---- */

typedef struct {
    int wrong;      /* 1: backward forgets the factor 2 of dy2 */
    int saw_zero;   /* backward saw an all-zero dout[1] */
    int calls;
} op_state;

static int op_forward(ddp_function_ctx *ctx, int nin, const ddp_tensor *in, int nout,
                      ddp_tensor *out)
{
    (void)nin;
    (void)nout;
    int64_t B = in[0].shape[0], C = in[0].shape[1];
    if (in[1].ndim != 1 || in[1].shape[0] != C)
        return ddp_function_fail(ctx, DDP_ERR_INVALID_ARG, "a must have shape (%lld)",
                                 (long long)C);
    float *th = ddp_function_ctx_alloc(ctx, (size_t)(B * C) * sizeof(float)); /* (B, C) */
    if (!th)
        return DDP_ERR_NOMEM;
    for (int64_t b = 0; b < B; b++) {
        double s = 0.0;
        for (int64_t c = 0; c < C; c++) {
            float x = in[0].data[b * C + c];
            th[b * C + c] = tanhf(x);
            out[0].data[b * C + c] = in[1].data[c] * th[b * C + c];
            s += (double)x * x;
        }
        out[1].data[b] = (float)s;
    }
    ddp_function_ctx_save(ctx, th);
    return 0;
}

static int op_backward(ddp_function_ctx *ctx, int nout, const ddp_tensor *dout, int nin,
                       ddp_tensor *din)
{
    (void)nout;
    (void)nin;
    op_state *st = ddp_function_ctx_user(ctx);
    const ddp_tensor *x = ddp_function_ctx_input(ctx, 0), *a = ddp_function_ctx_input(ctx, 1);
    const float *th = ddp_function_ctx_saved(ctx);
    int64_t B = x->shape[0], C = x->shape[1];
    st->calls++;
    int zero = 1;
    for (int64_t b = 0; b < B; b++)
        zero &= dout[1].data[b] == 0.0f;
    st->saw_zero |= zero;
    float two = st->wrong ? 1.0f : 2.0f;
    for (int64_t b = 0; b < B; b++)
        for (int64_t c = 0; c < C; c++) {
            int64_t i = b * C + c;
            float dy1 = dout[0].data[i], t = th[i];
            if (din[0].data)
                din[0].data[i] = dy1 * a->data[c] * (1.0f - t * t) +
                                 dout[1].data[b] * two * x->data[i];
            if (din[1].data)
                din[1].data[c] += dy1 * t;
        }
    return 0;
}

static op_state state_ok, state_wrong;
static const ddp_function scaled_tanh = {"scaled_tanh", op_forward, op_backward, &state_ok};
static const ddp_function scaled_tanh_wrong = {"scaled_tanh", op_forward, op_backward,
                                               &state_wrong};

static int apply_op(ddp_tape_t *tape, const ddp_function *fn, ddp_var_t *x, ddp_var_t *a,
                    ddp_var_t **y)
{
    const ddp_tensor *xt = ddp_var_tensor(x);
    ddp_shape shapes[2] = {{2, {xt->shape[0], xt->shape[1]}}, {1, {xt->shape[0]}}};
    return ddp_function_apply(fn, tape, 2, (ddp_var_t *[]){x, a}, 2, shapes, y);
}

/* ---- gradcheck's callbacks ---- */

enum { B = 3, C = 4 };

static int build(ddp_tape_t *tape, ddp_var_t *const *in, int nin, ddp_var_t **out, int nout,
                 void *user)
{
    (void)nin;
    (void)nout;
    return apply_op(tape, user, in[0], in[1], out);
}

static int ref(const double *const *in, int nin, double *out, void *user)
{
    (void)nin;
    (void)user;
    for (int b = 0; b < B; b++) {
        double s = 0.0;
        for (int c = 0; c < C; c++) {
            double x = in[0][b * C + c];
            out[b * C + c] = in[1][c] * tanh(x);
            s += x * x;
        }
        out[B * C + b] = s;
    }
    return 0;
}

static int ref_not_the_op(const double *const *in, int nin, double *out, void *user)
{
    ref(in, nin, out, user);
    out[B * C + 1] += 0.01; /* a different function */
    return 0;
}

static float xs[B * C] = {0.3f, -0.7f, 1.1f, 0.05f, -1.4f, 0.9f, 0.2f, -0.3f, 0.6f, 1.7f, -0.8f, 0.4f};
static float as[C] = {0.5f, -1.2f, 2.0f, 0.8f};

static void points(ddp_tensor in[2])
{
    assert_int_equal(ddp_tensor_wrap(&in[0], xs, 2, (int64_t[]){B, C}), 0);
    assert_int_equal(ddp_tensor_wrap(&in[1], as, 1, (int64_t[]){C}), 0);
}

static void test_two_outputs_pass_gradcheck(void **state)
{
    (void)state;
    ddp_tensor in[2];
    points(in);
    ddp_gradcheck_options o = ddp_gradcheck_defaults();
    o.nout = 2;
    state_ok = (op_state){0};
    int rc = ddp_gradcheck(build, ref, 2, in, &o, (void *)&scaled_tanh);
    if (rc != 0)
        fail_msg("%s", ddp_last_error());
    assert_int_equal(state_ok.calls, 2); /* one backward per output */
    assert_true(state_ok.saw_zero);      /* from y1 alone, dout[1] is zero */
}

static void test_wrong_backward_fails_gradcheck(void **state)
{
    (void)state;
    ddp_tensor in[2];
    points(in);
    ddp_gradcheck_options o = ddp_gradcheck_defaults();
    o.nout = 2;
    state_wrong = (op_state){.wrong = 1};
    assert_int_equal(ddp_gradcheck(build, ref, 2, in, &o, (void *)&scaled_tanh_wrong),
                     DDP_ERR_MISMATCH);
    /* x's first element: its dy2 term is half what it should be. */
    const char *msg = ddp_last_error();
    if (!strstr(msg, "gradcheck: input 0 element 0: analytic ") || !strstr(msg, ", numeric ") ||
        !strstr(msg, "(tolerance "))
        fail_msg("message: %s", msg);
    /* The reference of another function is caught at the forward. */
    assert_int_equal(ddp_gradcheck(build, ref_not_the_op, 2, in, &o, (void *)&scaled_tanh),
                     DDP_ERR_MISMATCH);
    assert_non_null(strstr(ddp_last_error(), "gradcheck: output 1 element 1: float32 forward"));
    assert_non_null(strstr(ddp_last_error(), "the reference is not the op's function"));
}

static void test_unused_output_gets_zero_gradient(void **state)
{
    (void)state;
    ddp_tape_t *tape;
    assert_int_equal(ddp_tape_create(&tape), 0);
    ddp_tensor in[2];
    points(in);
    ddp_var_t *x, *a, *y[2], *loss;
    assert_int_equal(ddp_tape_input(tape, &in[0], 1, &x), 0);
    assert_int_equal(ddp_tape_input(tape, &in[1], 0, &a), 0); /* a needs no gradient */
    state_ok = (op_state){0};
    assert_int_equal(apply_op(tape, &scaled_tanh, x, a, y), 0);
    assert_int_equal(ddp_var_tensor(y[1])->ndim, 1);
    assert_int_equal(ddp_op_sum(tape, y[0], &loss), 0);
    assert_int_equal(ddp_tape_backward(tape, loss, NULL), 0);
    assert_int_equal(state_ok.calls, 1);
    assert_true(state_ok.saw_zero);
    const float *gx = ddp_var_grad(x);
    for (int i = 0; i < B * C; i++) {
        double t = tanh((double)xs[i]);
        assert_float_equal(gx[i], as[i % C] * (1.0 - t * t), 1e-6);
    }
    ddp_tape_destroy(tape);
}

/* ---- the parameter input and the grad-ready contract ---- */

typedef struct {
    char names[8][DDP_PARAM_NAME_MAX];
    int used[8], n;
} hook_log;

static int log_hook(ddp_param *p, int used, void *user)
{
    hook_log *h = user;
    if (h->n < 8) {
        snprintf(h->names[h->n], sizeof h->names[0], "%s", p->name);
        h->used[h->n++] = used;
    }
    return 0;
}

/* Model: a free parameter "a" (C) and an unused one "spare"; loss =
 * sum(y1) + sum(y2) of the op on x. */
static void make_model(ddp_model_t **m)
{
    ddp_param *a, *spare;
    assert_int_equal(ddp_model_create(m), 0);
    assert_int_equal(ddp_model_add_param(*m, "a", 1, (int64_t[]){C}, &a), 0);
    assert_int_equal(ddp_model_add_param(*m, "spare", 1, (int64_t[]){2}, &spare), 0);
    assert_int_equal(ddp_model_seal(*m), 0);
    a = ddp_model_find_param(*m, "a");
    memcpy(a->data, as, sizeof as);
}

static int step_loss(ddp_model_t *m, ddp_tape_t *tape, const float *xv, ddp_var_t **loss)
{
    ddp_tensor xt;
    ddp_var_t *x, *a, *y[2], *s1, *s2;
    int rc;
    if ((rc = ddp_tensor_wrap(&xt, (float *)xv, 2, (int64_t[]){B, C})) < 0 ||
        (rc = ddp_tape_input(tape, &xt, 0, &x)) < 0 ||
        (rc = ddp_tape_param(tape, ddp_model_find_param(m, "a"), &a)) < 0 ||
        (rc = apply_op(tape, &scaled_tanh, x, a, y)) < 0 || (rc = ddp_op_sum(tape, y[0], &s1)) < 0 ||
        (rc = ddp_op_sum(tape, y[1], &s2)) < 0)
        return rc;
    return ddp_op_add(tape, s1, s2, loss);
}

static void test_parameter_input_fires_grad_ready(void **state)
{
    (void)state;
    ddp_model_t *m;
    make_model(&m);
    hook_log h = {0};
    ddp_model_set_grad_ready_hook(m, log_hook, &h);
    ddp_tape_t *tape;
    ddp_var_t *loss;
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_int_equal(step_loss(m, tape, xs, &loss), 0);
    assert_int_equal(ddp_tape_backward(tape, loss, m), 0);
    /* spare first (unused, at the start), then a once its gradient is final. */
    assert_int_equal(h.n, 2);
    assert_string_equal(h.names[0], "spare");
    assert_int_equal(h.used[0], 0);
    assert_string_equal(h.names[1], "a");
    assert_int_equal(h.used[1], 1);
    const float *ga = ddp_model_find_param(m, "a")->grad;
    for (int c = 0; c < C; c++) {
        double s = 0.0;
        for (int b = 0; b < B; b++)
            s += tanh((double)xs[b * C + c]);
        assert_float_equal(ga[c], s, 1e-5);
    }
    ddp_tape_destroy(tape);
    ddp_model_destroy(m);
}

/* Each rank's x; rank r uses xs scaled by (1 + r). */
static void rank_x(int rank, float *x)
{
    for (int i = 0; i < B * C; i++)
        x[i] = xs[i] * (float)(1 + rank);
}

typedef struct {
    job j;
    float grad[2][C];
} ddp_case;

static int ddp_rank(int rank, void *arg)
{
    ddp_case *dc = arg;
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", dc->j.url, rank, 2, 20.0, &pg) == 0);
    ddp_model_t *m;
    ddp_param *a, *spare;
    CHILD_CHECK(ddp_model_create(&m) == 0);
    CHILD_CHECK(ddp_model_add_param(m, "a", 1, (int64_t[]){C}, &a) == 0);
    CHILD_CHECK(ddp_model_add_param(m, "spare", 1, (int64_t[]){2}, &spare) == 0);
    CHILD_CHECK(ddp_model_seal(m) == 0);
    memcpy(ddp_model_find_param(m, "a")->data, as, sizeof as);
    ddp_model_find_param(m, "spare")->data[0] = 0; /* used below so that no parameter is unused */
    ddp_data_parallel_t *dm;
    CHILD_CHECK(ddp_data_parallel_create(m, pg, NULL, &dm) == 0);
    ddp_tape_t *tape;
    CHILD_CHECK(ddp_tape_create(&tape) == 0);
    float x[B * C];
    rank_x(rank, x);
    ddp_var_t *loss, *sp, *ss, *total;
    CHILD_CHECK(step_loss(m, tape, x, &loss) == 0);
    CHILD_CHECK(ddp_tape_param(tape, ddp_model_find_param(m, "spare"), &sp) == 0);
    CHILD_CHECK(ddp_op_sum(tape, sp, &ss) == 0);
    CHILD_CHECK(ddp_op_add(tape, loss, ss, &total) == 0);
    CHILD_CHECK(ddp_data_parallel_backward(dm, tape, total) == 0);
    memcpy(dc->grad[rank], ddp_model_find_param(m, "a")->grad, sizeof dc->grad[rank]);
    ddp_tape_destroy(tape);
    ddp_data_parallel_destroy(dm);
    ddp_model_destroy(m);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_ddp_two_processes_average_the_parameter(void **state)
{
    (void)state;
    ddp_case *dc = shared_page(sizeof *dc);
    job_init(&dc->j);
    assert_int_equal(run_children(2, ddp_rank, dc, 60), 0);
    job_cleanup(&dc->j);
    /* Reference: the mean of the two ranks' local gradients, sum_b tanh(x). */
    for (int c = 0; c < C; c++) {
        double s = 0.0;
        for (int r = 0; r < 2; r++) {
            float x[B * C];
            rank_x(r, x);
            for (int b = 0; b < B; b++)
                s += tanh((double)x[b * C + c]) / 2.0;
        }
        assert_float_equal(dc->grad[0][c], s, 1e-5);
        assert_true(dc->grad[0][c] == dc->grad[1][c]);
    }
}

/* ---- many inputs: y = sum_i (i + 1) x_i, 40 inputs of 2 elements ---- */

enum { MANY = 40 };

static int many_forward(ddp_function_ctx *ctx, int nin, const ddp_tensor *in, int nout,
                        ddp_tensor *out)
{
    (void)ctx, (void)nout;
    for (int j = 0; j < 2; j++) {
        out[0].data[j] = 0;
        for (int i = 0; i < nin; i++)
            out[0].data[j] += (float)(i + 1) * in[i].data[j];
    }
    return 0;
}

static int many_backward(ddp_function_ctx *ctx, int nout, const ddp_tensor *dout, int nin,
                         ddp_tensor *din)
{
    (void)ctx, (void)nout;
    for (int i = 0; i < nin; i++)
        for (int j = 0; din[i].data && j < 2; j++)
            din[i].data[j] = (float)(i + 1) * dout[0].data[j];
    return 0;
}

static const ddp_function weighted_sum = {"weighted_sum", many_forward, many_backward, NULL};

static int many_build(ddp_tape_t *tape, ddp_var_t *const *in, int nin, ddp_var_t **out, int nout,
                      void *user)
{
    (void)nout, (void)user;
    return ddp_function_apply(&weighted_sum, tape, nin, in, 1, NULL, out);
}

static int many_ref(const double *const *in, int nin, double *out, void *user)
{
    (void)user;
    for (int j = 0; j < 2; j++) {
        out[j] = 0;
        for (int i = 0; i < nin; i++)
            out[j] += (i + 1) * in[i][j];
    }
    return 0;
}

static void test_many_inputs(void **state)
{
    (void)state;
    static float vals[MANY][2];
    ddp_tensor in[MANY];
    for (int i = 0; i < MANY; i++) {
        vals[i][0] = (float)sin(i), vals[i][1] = (float)cos(i);
        assert_int_equal(ddp_tensor_wrap(&in[i], vals[i], 1, (int64_t[]){2}), 0);
    }
    if (ddp_gradcheck(many_build, many_ref, MANY, in, NULL, NULL) != 0)
        fail_msg("%s", ddp_last_error());
}

/* ---- errors ---- */

static int fwd_fails(ddp_function_ctx *ctx, int nin, const ddp_tensor *in, int nout,
                     ddp_tensor *out)
{
    (void)nin, (void)in, (void)nout, (void)out;
    return ddp_function_fail(ctx, DDP_ERR_INVALID_ARG, "x must be positive, got %g", -1.0);
}

static int fwd_copy(ddp_function_ctx *ctx, int nin, const ddp_tensor *in, int nout,
                    ddp_tensor *out)
{
    (void)ctx, (void)nin, (void)nout;
    memcpy(out[0].data, in[0].data, (size_t)in[0].numel * sizeof(float));
    return 0;
}

static void test_errors(void **state)
{
    (void)state;
    ddp_tape_t *tape, *other;
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_int_equal(ddp_tape_create(&other), 0);
    ddp_tensor in[2];
    points(in);
    ddp_var_t *x, *y[2], *stranger, *loss;
    assert_int_equal(ddp_tape_input(tape, &in[0], 1, &x), 0);
    assert_int_equal(ddp_tape_input(other, &in[0], 1, &stranger), 0);

    const ddp_function fails = {"positive", fwd_fails, NULL, NULL};
    assert_int_equal(ddp_function_apply(&fails, tape, 1, &x, 1, NULL, y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "positive forward: "));
    assert_non_null(strstr(ddp_last_error(), "positive: x must be positive, got -1"));

    const ddp_function copy = {"copy", fwd_copy, NULL, NULL};
    assert_int_equal(ddp_function_apply(&copy, tape, 1, &x, 0, NULL, y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "copy: 0 outputs (1 .. 16)"));
    assert_int_equal(ddp_function_apply(&copy, tape, 0, &x, 1, NULL, y), DDP_ERR_INVALID_ARG);
    assert_int_equal(ddp_function_apply(&copy, tape, 1, &stranger, 1, NULL, y),
                     DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "copy: input 0 is not a var of this tape"));
    const ddp_function nofwd = {"nofwd", NULL, NULL, NULL};
    assert_int_equal(ddp_function_apply(&nofwd, tape, 1, &x, 1, NULL, y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "nofwd: no forward"));
    ddp_shape bad = {2, {3, 0}};
    assert_int_equal(ddp_function_apply(&copy, tape, 1, &x, 1, &bad, y), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "copy: output 0"));

    /* A forward-only op works until backward reaches it. */
    assert_int_equal(ddp_function_apply(&copy, tape, 1, &x, 1, NULL, y), 0);
    assert_memory_equal(ddp_var_tensor(y[0])->data, xs, sizeof xs);
    assert_int_equal(ddp_op_sum(tape, y[0], &loss), 0);
    assert_int_equal(ddp_tape_backward(tape, loss, NULL), DDP_ERR_UNSUPPORTED);
    assert_non_null(strstr(ddp_last_error(), "copy: no backward"));

    ddp_gradcheck_options o = ddp_gradcheck_defaults();
    o.eps = 0;
    assert_int_equal(ddp_gradcheck(build, ref, 2, in, &o, (void *)&scaled_tanh),
                     DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "gradcheck: eps 0 must be > 0"));
    assert_int_equal(ddp_gradcheck(NULL, ref, 2, in, NULL, NULL), DDP_ERR_INVALID_ARG);
    ddp_tape_destroy(other);
    ddp_tape_destroy(tape);
}

/* ---- examples/custom_op.c: gradcheck at start, DDP on 2 ranks ---- */

static void test_custom_op_example_on_two_ranks(void **state)
{
    (void)state;
    const char *build = getenv("DDP_TEST_BUILD");
    build = build ? build : "build";
    job j;
    job_init(&j);
    char cmd[1024], log[128];
    snprintf(log, sizeof log, "%s/log", j.dir);
    snprintf(cmd, sizeof cmd,
             "timeout -k 5 120 %s/bin/ddprun --standalone --nproc-per-node 2 %s/bin/ddp-custom_op "
             "300 >%s 2>&1",
             build, build, log);
    int st = system(cmd);
    char *out = slurp(log);
    unlink(log);
    job_cleanup(&j);
    assert_non_null(out);
    if (st != 0)
        fail_msg("ddp-custom_op: status %d:\n%s", st, out);
    assert_non_null(strstr(out, "gradcheck scaled_tanh: ok"));
    const char *l = strstr(out, "loss: first ");
    double first = 0, last = 0;
    if (!l || sscanf(l, "loss: first %lf last %lf", &first, &last) != 2 || !(last < first / 4))
        fail_msg("the loss did not fall to a quarter:\n%s", out);
    const char *c0 = strstr(out, "rank 0 parameters checksum "), *c1 = strstr(out, "rank 1 parameters checksum ");
    if (!c0 || !c1 || strncmp(c0 + 27, c1 + 27, 16) != 0)
        fail_msg("the ranks' parameters differ:\n%s", out);
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_outputs_pass_gradcheck),
        cmocka_unit_test(test_wrong_backward_fails_gradcheck),
        cmocka_unit_test(test_unused_output_gets_zero_gradient),
        cmocka_unit_test(test_parameter_input_fires_grad_ready),
        cmocka_unit_test(test_ddp_two_processes_average_the_parameter),
        cmocka_unit_test(test_many_inputs),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_custom_op_example_on_two_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
