/* Parameter groups against torch.optim's param_groups: per-group lr,
 * weight_decay, momentum and betas over five steps of SGD, Adam (one group
 * added with add_param_group), RMSprop (momentum in one group only) and
 * Adadelta; expected values printed by torch.optim 1.13 with
 * tests/data/optim_groups_reference.py.  And the rule that every parameter
 * is in exactly one group, with its messages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "ddp.h"

#define NP 3
#define STEPS 5
static const int SIZES[NP] = {4, 2, 3};
static const char *const NAMES[NP] = {"0.weight", "0.bias", "1.weight"};

typedef struct expected {
    const char *name;
    float p[9];
} expected;

static const expected EXPECT[] = {
    {"sgd no decay on biases", {3.420884907e-01f, -4.119455442e-02f, 3.737696707e-01f, -2.047960758e-01f, 1.847749799e-01f, -5.677001551e-02f, -8.143524081e-02f, -8.748928457e-02f, -6.684581190e-02f}},
    {"adam betas per group", {-3.414819539e-01f, -1.275138371e-02f, 3.818966746e-01f, -1.313794255e-01f, 2.251629978e-01f, -2.211060524e-01f, -4.128617421e-02f, 2.123632729e-01f, -3.420068324e-02f}},
    {"rmsprop momentum in one group", {1.808388531e-01f, -4.231785238e-01f, 5.079931617e-01f, -2.666572332e-01f, -1.534491926e-01f, 1.715670824e-01f, -3.633594513e-02f, 1.789082140e-01f, -1.661820412e-01f}},
    {"adadelta lr per group", {-3.715360463e-01f, 1.704205060e-03f, 3.747663498e-01f, -1.251731813e-01f, 2.502681911e-01f, -2.502120733e-01f, -3.332296619e-04f, 3.691506386e-01f, -1.295487285e-01f}},
};

/* The generator's formulas, exact in float32. */
static float p0(int k, int i) { return (float)((k * 5 + i * 3) % 7 - 3) / 8.0f; }
static float grad(int s, int k, int i) { return (float)((s * 13 + k * 5 + i * 7) % 11 - 5) / 4.0f; }

static ddp_model_t *model3(ddp_param **p)
{
    ddp_model_t *m;
    assert_int_equal(ddp_model_create(&m), 0);
    for (int k = 0; k < NP; k++)
        assert_int_equal(ddp_model_add_param(m, NAMES[k], 1, (int64_t[]){SIZES[k]}, &p[k]), 0);
    assert_int_equal(ddp_model_seal(m), 0);
    for (int k = 0; k < NP; k++)
        for (int i = 0; i < SIZES[k]; i++)
            p[k]->data[i] = p0(k, i);
    return m;
}

static ddp_optim_t *make(int c, ddp_model_t *m)
{
    ddp_optim_t *o = NULL;
    ddp_param_group g[2] = {ddp_param_group_defaults(), ddp_param_group_defaults()};
    static const char *const bias[] = {"*.bias"}, *const weights[] = {"*.weight"};
    static const char *const first[] = {"0.*"}, *const second[] = {"1.*"};
    static const int i0[] = {0}, i1[] = {1}, i2[] = {2}, i02[] = {0, 2};
    if (c == 0) { /* the usual "no weight decay on biases", by pattern */
        g[0].names = bias, g[0].nnames = 1, g[0].weight_decay = 0, g[0].lr = 0.05;
        g[1].names = weights, g[1].nnames = 1;
        ddp_sgd_options s = ddp_sgd_defaults(0.1);
        s.momentum = 0.9, s.weight_decay = 0.01, s.groups = g, s.ngroups = 2;
        assert_int_equal(ddp_sgd_create(m, &s, &o), 0);
    } else if (c == 1) { /* by index, a third group added after creation */
        g[0].indices = i0, g[0].nindices = 1, g[0].beta1 = 0.8;
        g[1].indices = i1, g[1].nindices = 1;
        ddp_adam_options a = ddp_adam_defaults();
        a.lr = 0.01, a.weight_decay = 0.1, a.groups = g, a.ngroups = 2;
        assert_int_equal(ddp_adam_create(m, &a, &o), 0);
        ddp_param_group added = ddp_param_group_defaults();
        added.names = second, added.nnames = 1, added.lr = 0.05, added.beta2 = 0.9;
        assert_int_equal(ddp_optim_add_param_group(o, &added), 0);
    } else if (c == 2) {
        g[0].names = first, g[0].nnames = 1, g[0].momentum = 0.9;
        g[1].indices = i2, g[1].nindices = 1;
        ddp_rmsprop_options r = ddp_rmsprop_defaults();
        r.groups = g, r.ngroups = 2;
        assert_int_equal(ddp_rmsprop_create(m, &r, &o), 0);
    } else {
        g[0].indices = i02, g[0].nindices = 2;
        g[1].names = bias, g[1].nnames = 1, g[1].lr = 0.5, g[1].weight_decay = 0;
        ddp_adadelta_options d = ddp_adadelta_defaults();
        d.weight_decay = 0.1, d.groups = g, d.ngroups = 2;
        assert_int_equal(ddp_adadelta_create(m, &d, &o), 0);
    }
    return o;
}

static void test_against_torch(void **state)
{
    (void)state;
    for (int c = 0; c < (int)(sizeof EXPECT / sizeof EXPECT[0]); c++) {
        ddp_param *p[NP];
        ddp_model_t *m = model3(p);
        ddp_optim_t *o = make(c, m);
        for (int s = 0; s < STEPS; s++) {
            for (int k = 0; k < NP; k++)
                for (int i = 0; i < SIZES[k]; i++)
                    p[k]->grad[i] = grad(s, k, i);
            assert_int_equal(ddp_optim_step(o), 0);
        }
        for (int k = 0, j = 0; k < NP; k++)
            for (int i = 0; i < SIZES[k]; i++, j++) {
                float want = EXPECT[c].p[j];
                if (fabsf(p[k]->data[i] - want) > 2e-6f * (1.0f + fabsf(want)))
                    fail_msg("%s: %s[%d] %.9g, torch %.9g", EXPECT[c].name, NAMES[k], i,
                             (double)p[k]->data[i], (double)want);
            }
        ddp_optim_destroy(o);
        ddp_model_destroy(m);
    }
}

static void test_group_accessors(void **state)
{
    (void)state;
    ddp_param *p[NP];
    ddp_model_t *m = model3(p);
    ddp_optim_t *o = make(0, m);
    assert_int_equal(ddp_optim_num_groups(o), 2);
    assert_int_equal(ddp_optim_param_group(o, 0), 1);
    assert_int_equal(ddp_optim_param_group(o, 1), 0);
    assert_int_equal(ddp_optim_param_group(o, 2), 1);
    assert_int_equal(ddp_optim_param_group(o, 3), -1);
    assert_true(ddp_optim_lr(o) == 0.05); /* the first group's */
    assert_true(ddp_optim_group_lr(o, 1) == 0.1);
    assert_true(ddp_optim_group_lr(o, 2) == 0.0);
    ddp_optim_set_group_lr(o, 1, 0.2);
    assert_true(ddp_optim_group_lr(o, 1) == 0.2 && ddp_optim_lr(o) == 0.05);
    assert_int_equal(ddp_optim_num_states(o), 1); /* one momentum block for both groups */
    ddp_optim_destroy(o);
    /* without groups: one group of everything */
    ddp_sgd_options s = ddp_sgd_defaults(0.3);
    assert_int_equal(ddp_sgd_create(m, &s, &o), 0);
    assert_int_equal(ddp_optim_num_groups(o), 1);
    assert_int_equal(ddp_optim_param_group(o, 2), 0);
    assert_true(ddp_optim_lr(o) == 0.3);
    ddp_optim_destroy(o);
    ddp_model_destroy(m);
}

static void test_group_errors(void **state)
{
    (void)state;
    ddp_param *p[NP];
    ddp_model_t *m = model3(p);
    ddp_optim_t *o = NULL;
    static const char *const all[] = {"*"}, *const bias[] = {"*.bias"}, *const typo[] = {"2.*"};
    static const int i1[] = {1}, i9[] = {9};
    ddp_param_group g[2] = {ddp_param_group_defaults(), ddp_param_group_defaults()};
    ddp_sgd_options s = ddp_sgd_defaults(0.1);
    s.groups = g, s.ngroups = 2;
    /* a parameter in two groups */
    g[0].names = all, g[0].nnames = 1;
    g[1].indices = i1, g[1].nindices = 1;
    assert_int_equal(ddp_sgd_create(m, &s, &o), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "SGD: parameter '0.bias' is in parameter groups 0 "
                                             "and 1"));
    /* a pattern that matches nothing, an index out of range, an empty group */
    g[0].names = typo;
    assert_int_equal(ddp_sgd_create(m, &s, &o), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "SGD parameter group 0: pattern '2.*' matches no "
                                             "parameter"));
    g[0].names = bias, g[1].indices = i9;
    assert_int_equal(ddp_sgd_create(m, &s, &o), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "SGD parameter group 1: parameter index 9 is out "
                                             "of range (3 parameters)"));
    g[1] = ddp_param_group_defaults();
    assert_int_equal(ddp_sgd_create(m, &s, &o), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "SGD parameter group 1 names no parameter"));
    /* overrides: one the optimizer lacks, one out of range */
    g[1].names = all, g[1].nnames = 1, g[1].beta1 = 0.5;
    s.ngroups = 1;
    g[0] = g[1];
    assert_int_equal(ddp_sgd_create(m, &s, &o), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "SGD parameter group 0: SGD has no betas"));
    g[0].beta1 = NAN, g[0].momentum = -1;
    assert_int_equal(ddp_sgd_create(m, &s, &o), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "parameter group 0: "));
    assert_non_null(strstr(ddp_last_error(), "SGD: invalid momentum -1"));
    ddp_adam_options a = ddp_adam_defaults();
    g[0].momentum = 0.9;
    a.groups = g, a.ngroups = 1;
    assert_int_equal(ddp_adam_create(m, &a, &o), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "Adam parameter group 0: Adam has no momentum"));
    /* a parameter in no group: the step says which; add_param_group mends it */
    g[0] = ddp_param_group_defaults();
    g[0].names = bias, g[0].nnames = 1;
    assert_int_equal(ddp_sgd_create(m, &s, &o), 0);
    assert_int_equal(ddp_optim_step(o), DDP_ERR_STATE);
    assert_non_null(strstr(ddp_last_error(), "SGD step: parameter '0.weight' is in no parameter "
                                             "group"));
    assert_int_equal(ddp_optim_add_param_group(o, &g[0]), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "parameter '0.bias' is in parameter groups 0 and "
                                             "1"));
    ddp_param_group rest = ddp_param_group_defaults();
    static const char *const weights[] = {"*.weight"};
    rest.names = weights, rest.nnames = 1, rest.momentum = 0.9;
    assert_int_equal(ddp_optim_num_states(o), 0);
    assert_int_equal(ddp_optim_add_param_group(o, &rest), 0);
    assert_int_equal(ddp_optim_num_states(o), 1); /* momentum came with the group */
    assert_int_equal(ddp_optim_step(o), 0);
    assert_int_equal(ddp_optim_add_param_group(o, &rest), DDP_ERR_INVALID_ARG);
    ddp_optim_destroy(o);
    ddp_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_torch),
        cmocka_unit_test(test_group_accessors),
        cmocka_unit_test(test_group_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
