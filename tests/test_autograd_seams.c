/* The seams that pipelines and ZeRO build on: backward from a non-scalar
 * output with its upstream gradient (ddp_tape_backward_grad), the
 * grad-write hook (ext.h rule 8), the zero-grad hook (rule 9) and parameter
 * values viewed in memory the caller owns (ddp_param_set_data). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "base/error.h"
#include "ddp.h"
#include "ddp/ext.h"

#define B 3
#define IN 4
#define OUT 2

static ddp_model_t *mlp(void)
{
    ddp_module_t *l1, *r, *l2, *seq;
    assert_int_equal(ddp_linear_create(IN, 5, 1, 11, &l1), 0);
    assert_int_equal(ddp_relu_create(&r), 0);
    assert_int_equal(ddp_linear_create(5, OUT, 1, 12, &l2), 0);
    assert_int_equal(ddp_sequential_create((ddp_module_t *[]){l1, r, l2}, 3, &seq), 0);
    ddp_model_t *m;
    assert_int_equal(ddp_model_from_module(seq, &m), 0);
    return m;
}

static const float X[B * IN] = {0.5f, -1.0f, 2.0f, 0.25f, -0.75f, 1.5f, 0.1f, -2.0f,
                                1.0f, 0.3f,  -0.6f, 0.9f};
static const float DY[B * OUT] = {0.2f, -1.3f, 0.7f, 0.05f, -0.4f, 1.1f};

static ddp_var_t *forward(ddp_model_t *m, ddp_tape_t *t, ddp_tensor *xt)
{
    ddp_var_t *x, *y;
    assert_int_equal(ddp_tensor_wrap(xt, (float *)X, 2, (int64_t[]){B, IN}), 0);
    assert_int_equal(ddp_tape_input(t, xt, 0, &x), 0);
    assert_int_equal(ddp_model_forward(m, t, x, &y), 0);
    return y;
}

static void copy_grads(ddp_model_t *m, float *out)
{
    size_t off = 0;
    for (size_t i = 0; i < ddp_model_num_params(m); i++) {
        ddp_param *p = ddp_model_param(m, i);
        memcpy(out + off, p->grad, p->numel * sizeof(float));
        off += p->numel;
    }
}

/* y.backward(dy) equals backward of sum(y * dy) bit for bit: both seed y's
 * gradient with exactly dy. */
static void test_backward_grad(void **state)
{
    (void)state;
    ddp_model_t *m = mlp();
    size_t n;
    ddp_model_param_block(m, &n);
    float ref[64], got[64];
    assert_true(n <= 64);
    ddp_tape_t *t;
    ddp_tensor xt, dt;
    assert_int_equal(ddp_tape_create(&t), 0);

    ddp_model_zero_grad(m);
    ddp_var_t *y = forward(m, t, &xt), *d, *p, *s;
    assert_int_equal(ddp_tensor_wrap(&dt, (float *)DY, 2, (int64_t[]){B, OUT}), 0);
    assert_int_equal(ddp_tape_input(t, &dt, 0, &d), 0);
    assert_int_equal(ddp_op_mul(t, y, d, &p), 0);
    assert_int_equal(ddp_op_sum(t, p, &s), 0);
    assert_int_equal(ddp_tape_backward(t, s, m), 0);
    copy_grads(m, ref);

    ddp_tape_reset(t);
    ddp_model_zero_grad(m);
    y = forward(m, t, &xt);
    assert_int_equal(ddp_tape_backward(t, y, m), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "give its gradient with ddp_tape_backward_grad"));
    assert_int_equal(ddp_tape_backward_grad(t, y, DY, m), 0);
    copy_grads(m, got);
    assert_memory_equal(ref, got, n * sizeof(float));
    /* a second call accumulates, as a second backward does (the GEMM adds
     * into the old gradient with its own rounding: not bitwise 2x) */
    assert_int_equal(ddp_tape_backward_grad(t, y, DY, m), 0);
    copy_grads(m, got);
    for (size_t i = 0; i < n; i++)
        assert_true(fabsf(got[i] - 2.0f * ref[i]) <= 1e-6f * fabsf(ref[i]) + 1e-7f);
    assert_int_equal(ddp_tape_backward_grad(t, y, NULL, m), DDP_ERR_INVALID_ARG);
    ddp_tape_destroy(t);
    ddp_model_destroy(m);
}

typedef struct pool {
    float mem[64];
    size_t used;
    int calls[8];
    int fail_at; /* index of the parameter whose call fails, or -1 */
} pool;

static int write_hook(ddp_param *p, float **grad, void *user)
{
    pool *pl = user;
    assert_ptr_equal(*grad, p->grad);
    pl->calls[p->index]++;
    if (p->index == pl->fail_at)
        return DDP_ERROR(DDP_ERR_STATE, "pool exhausted at %s", p->name);
    *grad = pl->mem + pl->used;
    memset(*grad, 0, p->numel * sizeof(float)); /* backward adds into it */
    pl->used += p->numel;
    return 0;
}

/* Rule 8: one call per used parameter, before its first write; the
 * gradient then lives (and equals the plain one) where the hook put it. */
static void test_grad_write_hook(void **state)
{
    (void)state;
    ddp_model_t *m = mlp();
    size_t n;
    ddp_model_param_block(m, &n);
    float ref[64];
    ddp_tape_t *t;
    ddp_tensor xt;
    assert_int_equal(ddp_tape_create(&t), 0);
    ddp_model_zero_grad(m);
    assert_int_equal(ddp_tape_backward_grad(t, forward(m, t, &xt), DY, m), 0);
    copy_grads(m, ref);
    ddp_model_zero_grad(m); /* gradients must not come from the old memory */

    pool pl = {.fail_at = -1};
    ddp_model_set_grad_write_hook(m, write_hook, &pl);
    ddp_tape_reset(t);
    assert_int_equal(ddp_tape_backward_grad(t, forward(m, t, &xt), DY, m), 0);
    assert_int_equal(pl.used, n);
    for (size_t i = 0; i < ddp_model_num_params(m); i++) {
        ddp_param *p = ddp_model_param(m, i);
        assert_int_equal(pl.calls[i], 1);
        assert_true(p->grad >= pl.mem && p->grad < pl.mem + 64);
    }
    float got[64];
    copy_grads(m, got);
    assert_memory_equal(ref, got, n * sizeof(float));

    /* a failing hook stops backward with its own code and message (0.bias
     * is the second parameter backward writes) */
    pool bad = {.fail_at = 1};
    ddp_model_set_grad_write_hook(m, write_hook, &bad);
    ddp_tape_reset(t);
    assert_int_equal(ddp_tape_backward_grad(t, forward(m, t, &xt), DY, m), DDP_ERR_STATE);
    assert_non_null(strstr(ddp_last_error(), "pool exhausted at 0.bias"));
    ddp_model_set_grad_write_hook(m, NULL, NULL);
    assert_null(ddp_model_grad_write_hook(m, NULL));
    assert_int_equal(ddp_model_set_grad_block(m, NULL), 0);
    ddp_tape_destroy(t);
    ddp_model_destroy(m);
}

/* A shared weight (used twice) gets one call; an unused one gets none. */
static void test_grad_write_hook_shared(void **state)
{
    (void)state;
    ddp_model_t *m;
    ddp_param *w, *unused;
    assert_int_equal(ddp_model_create(&m), 0);
    assert_int_equal(ddp_model_add_param(m, "w", 2, (int64_t[]){IN, IN}, &w), 0);
    assert_int_equal(ddp_model_add_param(m, "unused", 1, (int64_t[]){3}, &unused), 0);
    assert_int_equal(ddp_model_seal(m), 0);
    for (size_t i = 0; i < w->numel; i++)
        w->data[i] = 0.1f * (float)(i % 7) - 0.3f;
    pool pl = {.fail_at = -1};
    ddp_model_set_grad_write_hook(m, write_hook, &pl);
    ddp_tape_t *t;
    ddp_tensor xt;
    ddp_var_t *x, *wv, *h, *y, *s;
    assert_int_equal(ddp_tape_create(&t), 0);
    assert_int_equal(ddp_tensor_wrap(&xt, (float *)X, 2, (int64_t[]){B, IN}), 0);
    assert_int_equal(ddp_tape_input(t, &xt, 0, &x), 0);
    assert_int_equal(ddp_tape_param(t, w, &wv), 0);
    assert_int_equal(ddp_op_linear(t, x, wv, NULL, &h), 0);
    assert_int_equal(ddp_op_linear(t, h, wv, NULL, &y), 0);
    assert_int_equal(ddp_op_sum(t, y, &s), 0);
    assert_int_equal(ddp_tape_backward(t, s, m), 0);
    assert_int_equal(pl.calls[0], 1);
    assert_int_equal(pl.calls[1], 0);
    assert_ptr_equal(w->grad, pl.mem);
    ddp_model_set_grad_write_hook(m, NULL, NULL);
    assert_int_equal(ddp_model_set_grad_block(m, NULL), 0);
    ddp_tape_destroy(t);
    ddp_model_destroy(m);
}

/* ddp_param_set_data: the forward sees the caller's values; NULL copies
 * them back into the model's block. */
static void test_set_data(void **state)
{
    (void)state;
    ddp_model_t *m = mlp();
    ddp_param *w = ddp_model_param(m, 0);
    float *home = w->data;
    float mine[5 * IN];
    for (int i = 0; i < 5 * IN; i++)
        mine[i] = 0.01f * (float)i;
    ddp_tape_t *t;
    ddp_tensor xt;
    assert_int_equal(ddp_tape_create(&t), 0);
    ddp_var_t *y0 = forward(m, t, &xt);
    float before[B * OUT];
    memcpy(before, ddp_var_tensor(y0)->data, sizeof before);

    assert_int_equal(ddp_param_set_data(w, mine), 0);
    assert_ptr_equal(w->data, mine);
    ddp_tape_reset(t);
    ddp_var_t *y1 = forward(m, t, &xt);
    assert_memory_not_equal(before, ddp_var_tensor(y1)->data, sizeof before);

    assert_int_equal(ddp_param_set_data(w, NULL), 0);
    assert_ptr_equal(w->data, home);
    assert_memory_equal(home, mine, sizeof mine);
    assert_int_equal(ddp_param_set_data(NULL, mine), DDP_ERR_INVALID_ARG);
    ddp_tape_destroy(t);
    ddp_model_destroy(m);
}

/* Rule 9: ddp_model_zero_grad calls the hook once, after every gradient is
 * zero (the hook sees zeros), and not once it is removed. */
typedef struct zero_seen {
    ddp_model_t *m;
    int calls, nonzero;
} zero_seen;

static void zero_hook(ddp_model_t *m, void *user)
{
    zero_seen *z = user;
    z->calls += m == z->m;
    for (size_t i = 0; i < ddp_model_num_params(z->m); i++) {
        ddp_param *p = ddp_model_param(z->m, i);
        for (size_t k = 0; k < p->numel; k++)
            z->nonzero += p->grad[k] != 0.0f;
    }
}

static void test_zero_grad_hook(void **state)
{
    (void)state;
    ddp_model_t *m = mlp();
    ddp_tape_t *t;
    ddp_tensor xt;
    assert_int_equal(ddp_tape_create(&t), 0);
    ddp_var_t *y = forward(m, t, &xt);
    assert_int_equal(ddp_tape_backward_grad(t, y, DY, m), 0);
    zero_seen z = {m, 0, 0};
    zero_hook(NULL, &z); /* counts the nonzero gradients, not a call */
    assert_true(z.nonzero > 0); /* something to zero */
    z.nonzero = 0;
    ddp_model_set_zero_grad_hook(m, zero_hook, &z);
    ddp_optim_t *opt;
    assert_int_equal(ddp_sgd_create(m, &(ddp_sgd_options){.lr = 0.1}, &opt), 0);
    ddp_optim_zero_grad(opt); /* the optimizer's zero_grad is the model's */
    assert_int_equal(z.calls, 1);
    assert_int_equal(z.nonzero, 0);
    ddp_model_set_zero_grad_hook(m, NULL, NULL);
    ddp_model_zero_grad(m);
    assert_int_equal(z.calls, 1);
    ddp_optim_destroy(opt);
    ddp_tape_destroy(t);
    ddp_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backward_grad),
        cmocka_unit_test(test_grad_write_hook),
        cmocka_unit_test(test_grad_write_hook_shared),
        cmocka_unit_test(test_set_data),
        cmocka_unit_test(test_zero_grad_hook),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
