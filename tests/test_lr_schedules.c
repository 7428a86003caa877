/* LambdaLR, OneCycleLR, SequentialLR and ReduceLROnPlateau against
 * torch.optim.lr_scheduler 1.13: both groups' lrs (bases 0.1 and 0.02)
 * before the first step and after each of 50, exported by
 * tests/data/lr_schedules_reference.py into tests/data/lr_schedules_expected.h.
 * And resuming mid-run from a scheduler's saved state (and the optimizer's
 * lrs) gives the rest of the same sequence; bad options name themselves;
 * OneCycleLR's cycle_momentum against torch (SGD's momentum, Adam's beta1). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "ddp.h"

#include "data/lr_schedules_expected.h"

#define NCASES ((int)(sizeof LR_CASES / sizeof LR_CASES[0]))
#define MAXSCHED 4

typedef struct run {
    ddp_model_t *m;
    ddp_optim_t *o;
    int n;                            /* schedulers made; the last is the one stepped */
    ddp_lr_scheduler_t *s[MAXSCHED];
    const double *metrics;            /* plateau cases */
} run;

static double lambda(int64_t e, int g, void *user)
{
    (void)user;
    return g == 0 ? pow(0.95, (double)e) : 1.0 / (1.0 + (double)e);
}

static void sched(run *r, ddp_lr_options o)
{
    assert_int_equal(ddp_lr_scheduler_create(r->o, &o, &r->s[r->n]), 0);
    r->n++;
}

/* The optimizer of the generator: SGD lr 0.1, momentum, groups 0.1 / 0.02. */
static void make_optim(run *r)
{
    ddp_param *p;
    assert_int_equal(ddp_model_create(&r->m), 0);
    assert_int_equal(ddp_model_add_param(r->m, "p", 1, (int64_t[]){1}, &p), 0);
    assert_int_equal(ddp_model_add_param(r->m, "q", 1, (int64_t[]){1}, &p), 0);
    static const int i0[] = {0}, i1[] = {1};
    ddp_param_group g[2] = {ddp_param_group_defaults(), ddp_param_group_defaults()};
    g[0].indices = i0, g[0].nindices = 1;
    g[1].indices = i1, g[1].nindices = 1, g[1].lr = 0.02;
    ddp_sgd_options s = ddp_sgd_defaults(0.1);
    s.momentum = 0.9, s.groups = g, s.ngroups = 2;
    assert_int_equal(ddp_sgd_create(r->m, &s, &r->o), 0);
}

/* The schedulers of case c, as the generator makes them. */
static void make_scheds(run *r, int c)
{
    const char *name = LR_CASES[c].name;
    r->n = 0;
    r->metrics = NULL;
    ddp_lr_options o;
    if (strcmp(name, "lambda") == 0) {
        o = ddp_lr_defaults(DDP_LR_LAMBDA);
        o.lambda = lambda;
        sched(r, o);
    } else if (strcmp(name, "onecycle cos") == 0) {
        static const double max[] = {1.0, 0.5};
        o = ddp_lr_defaults(DDP_LR_ONECYCLE);
        o.max_lrs = max, o.total_steps = 50;
        sched(r, o);
    } else if (strcmp(name, "onecycle linear three_phase") == 0) {
        o = ddp_lr_defaults(DDP_LR_ONECYCLE);
        o.max_lr = 0.8, o.total_steps = 50, o.pct_start = 0.25, o.anneal_linear = 1;
        o.div_factor = 10, o.final_div_factor = 100, o.three_phase = 1;
        sched(r, o);
    } else if (strcmp(name, "sequential warmup cosine") == 0) {
        static const int ms[] = {5};
        o = ddp_lr_defaults(DDP_LR_LINEAR);
        o.start_factor = 0.1, o.total_iters = 5;
        sched(r, o);
        o = ddp_lr_defaults(DDP_LR_COSINE);
        o.t_max = 45, o.eta_min = 0.001;
        sched(r, o);
        o = ddp_lr_defaults(DDP_LR_SEQUENTIAL);
        o.schedulers = r->s, o.nschedulers = 2, o.milestones = ms, o.nmilestones = 1;
        sched(r, o);
    } else if (strcmp(name, "sequential three") == 0) {
        static const int ms[] = {10, 30}, steps[] = {3, 7};
        o = ddp_lr_defaults(DDP_LR_EXPONENTIAL);
        o.gamma = 0.9;
        sched(r, o);
        o = ddp_lr_defaults(DDP_LR_STEP);
        o.step_size = 10, o.gamma = 0.5;
        sched(r, o);
        o = ddp_lr_defaults(DDP_LR_MULTISTEP);
        o.milestones = steps, o.nmilestones = 2, o.gamma = 0.2;
        sched(r, o);
        o = ddp_lr_defaults(DDP_LR_SEQUENTIAL);
        o.schedulers = r->s, o.nschedulers = 3, o.milestones = ms, o.nmilestones = 2;
        sched(r, o);
    } else if (strcmp(name, "plateau min rel") == 0) {
        o = ddp_lr_defaults(DDP_LR_PLATEAU);
        o.factor = 0.5, o.patience = 3, o.cooldown = 2, o.min_lr = 0.003;
        sched(r, o);
        r->metrics = METRIC_MIN;
    } else {
        o = ddp_lr_defaults(DDP_LR_PLATEAU);
        o.mode_max = 1, o.factor = 0.3, o.patience = 2, o.threshold = 0.01;
        o.threshold_abs = 1, o.min_lr = 1e-3, o.eps = 1e-3;
        sched(r, o);
        r->metrics = METRIC_MAX;
    }
}

static void destroy(run *r)
{
    for (int i = r->n - 1; i >= 0; i--)
        ddp_lr_scheduler_destroy(r->s[i]);
    ddp_optim_destroy(r->o);
    ddp_model_destroy(r->m);
}

static void step(run *r, int e)
{
    ddp_lr_scheduler_t *s = r->s[r->n - 1];
    if (r->metrics)
        assert_int_equal(ddp_lr_scheduler_step_metric(s, r->metrics[e]), 0);
    else
        assert_true(ddp_lr_scheduler_step(s) == ddp_optim_lr(r->o));
}

static void check_epoch(const run *r, int c, int e)
{
    for (int g = 0; g < 2; g++) {
        double want = LR_CASES[c].lr[e][g], got = ddp_optim_group_lr(r->o, g);
        if (!(fabs(got - want) <= 1e-12 * fabs(want)))
            fail_msg("%s epoch %d group %d: lr %.17g, torch %.17g", LR_CASES[c].name, e, g, got,
                     want);
        assert_true(ddp_lr_scheduler_group_last_lr(r->s[r->n - 1], g) == got);
    }
}

static void test_against_torch(void **state)
{
    (void)state;
    for (int c = 0; c < NCASES; c++) {
        run r;
        make_optim(&r);
        make_scheds(&r, c);
        check_epoch(&r, c, 0);
        for (int e = 0; e < LR_EPOCHS; e++) {
            step(&r, e);
            check_epoch(&r, c, e + 1);
            assert_int_equal(ddp_lr_scheduler_last_epoch(r.s[r.n - 1]), e + 1);
        }
        destroy(&r);
    }
}

/* Stop after `at` steps, keep what a checkpoint keeps (the scheduler's state
 * and the optimizer's lrs), build everything again, restore, go on. */
static void test_resume(void **state)
{
    (void)state;
    for (int c = 0; c < NCASES; c++)
        for (int at = 1; at < LR_EPOCHS; at += 7) {
            run r;
            make_optim(&r);
            make_scheds(&r, c);
            for (int e = 0; e < at; e++)
                step(&r, e);
            ddp_lr_state st = ddp_lr_scheduler_state(r.s[r.n - 1]);
            double lr[2] = {ddp_optim_group_lr(r.o, 0), ddp_optim_group_lr(r.o, 1)};
            destroy(&r);

            make_optim(&r);
            make_scheds(&r, c);
            ddp_optim_set_group_lr(r.o, 0, lr[0]);
            ddp_optim_set_group_lr(r.o, 1, lr[1]);
            assert_int_equal(ddp_lr_scheduler_set_state(r.s[r.n - 1], &st), 0);
            check_epoch(&r, c, at);
            for (int e = at; e < LR_EPOCHS; e++) {
                step(&r, e);
                check_epoch(&r, c, e + 1);
            }
            destroy(&r);
        }
}

static void expect_error(run *r, ddp_lr_options o, const char *msg)
{
    ddp_lr_scheduler_t *s = NULL;
    assert_int_equal(ddp_lr_scheduler_create(r->o, &o, &s), DDP_ERR_INVALID_ARG);
    if (!strstr(ddp_last_error(), msg))
        fail_msg("error '%s' does not say '%s'", ddp_last_error(), msg);
    assert_null(s);
}

static void test_errors(void **state)
{
    (void)state;
    run r;
    make_optim(&r);
    r.n = 0;
    ddp_lr_options o = ddp_lr_defaults(DDP_LR_ONECYCLE);
    o.max_lr = 1, o.total_steps = 10, o.pct_start = 1.5;
    expect_error(&r, o, "OneCycleLR: expected float between 0 and 1 pct_start, but got 1.5");
    o.pct_start = 0.1; /* 0.1 * 10 - 1 = 0: torch divides by zero */
    expect_error(&r, o, "OneCycleLR: pct_start 0.1 of 10 total_steps leaves a phase of length 0");
    o.total_steps = 0;
    expect_error(&r, o, "OneCycleLR: expected positive integer total_steps, but got 0");
    o.total_steps = 10, o.pct_start = 0.3, o.max_lrs = (double[]){0.5, -1};
    expect_error(&r, o, "OneCycleLR: max_lrs[1] -1 must be > 0 (one per parameter group)");
    o = ddp_lr_defaults(DDP_LR_LAMBDA);
    expect_error(&r, o, "LambdaLR: lambda is NULL");
    o = ddp_lr_defaults(DDP_LR_PLATEAU);
    o.factor = 1.0;
    expect_error(&r, o, "ReduceLROnPlateau: factor 1 should be < 1.0");
    o = ddp_lr_defaults(DDP_LR_EXPONENTIAL);
    sched(&r, o);
    o = ddp_lr_defaults(DDP_LR_SEQUENTIAL);
    o.schedulers = r.s, o.nschedulers = 1, o.nmilestones = 1, o.milestones = (int[]){3};
    expect_error(&r, o, "number of schedulers 1 and the number of milestones to be equal to 1");
    o = ddp_lr_defaults(DDP_LR_PLATEAU);
    sched(&r, o);
    o = ddp_lr_defaults(DDP_LR_SEQUENTIAL);
    o.schedulers = r.s, o.nschedulers = 2, o.nmilestones = 1, o.milestones = (int[]){3};
    expect_error(&r, o, "SequentialLR: scheduler 1 is a ReduceLROnPlateau, not a closed form");
    o.nschedulers = 1, o.nmilestones = 0;
    ddp_lr_scheduler_t *seq = NULL;
    assert_int_equal(ddp_lr_scheduler_create(r.o, &o, &seq), 0);
    assert_int_equal(ddp_lr_scheduler_step_metric(seq, 1.0), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "a metric steps only ReduceLROnPlateau"));
    ddp_lr_state bad = {.last_epoch = -2};
    assert_int_equal(ddp_lr_scheduler_set_state(seq, &bad), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "negative count (last_epoch -2"));
    ddp_lr_scheduler_destroy(seq);
    /* a plateau is not stepped without its metric */
    double lr = ddp_optim_lr(r.o);
    assert_true(ddp_lr_scheduler_step(r.s[1]) == lr);
    assert_int_equal(ddp_lr_scheduler_last_epoch(r.s[1]), 0);
    destroy(&r);
}

/* OneCycleLR with cycle_momentum (max_lr 1, 10 steps, base/max momentum
 * 0.85/0.95): SGD (momentum 0.9, two phases, cos) and Adam (beta1, three
 * phases) against torch 1.13 (the momentum before each step, and the
 * parameter after 10 steps with gradients 0.5, 0.6, ...: printed by
 * OneCycleLR over SGD([p], lr=0.1, momentum=0.9) / Adam([p], lr=0.1)). */
static void test_onecycle_momentum(void **state)
{
    (void)state;
    static const double sgd_m[10] = {
        0.94999999999999996, 0.89999999999999991, 0.84999999999999998, 0.85495155660487898,
        0.86882550990706331, 0.88887395330218422, 0.91112604669781572, 0.93117449009293662,
        0.94504844339512095, 0.94999999999999996};
    static const double adam_m[10] = {0.95, 0.9, 0.85, 0.9, 0.95, 0.95, 0.95, 0.95, 0.95, 0.95};
    for (int adam = 0; adam < 2; adam++) {
        ddp_model_t *m;
        ddp_param *p;
        ddp_optim_t *o;
        ddp_lr_scheduler_t *s;
        assert_int_equal(ddp_model_create(&m), 0);
        assert_int_equal(ddp_model_add_param(m, "p", 1, (int64_t[]){1}, &p), 0);
        ddp_sgd_options so = ddp_sgd_defaults(0.1);
        ddp_adam_options ao = ddp_adam_defaults();
        so.momentum = 0.9, ao.lr = 0.1;
        assert_int_equal(adam ? ddp_adam_create(m, &ao, &o) : ddp_sgd_create(m, &so, &o), 0);
        ddp_lr_options lo = ddp_lr_defaults(DDP_LR_ONECYCLE);
        lo.max_lr = 1, lo.total_steps = 10, lo.three_phase = adam, lo.cycle_momentum = 1;
        assert_int_equal(ddp_lr_scheduler_create(o, &lo, &s), 0);
        for (int e = 0; e < 10; e++) {
            double want = adam ? adam_m[e] : sgd_m[e];
            if (fabs(ddp_optim_group_momentum(o, 0) - want) > 1e-12)
                fail_msg("%s step %d: momentum %.17g, torch %.17g", adam ? "Adam" : "SGD", e,
                         ddp_optim_group_momentum(o, 0), want);
            p->grad[0] = 0.5f + 0.1f * (float)e;
            assert_int_equal(ddp_optim_step(o), 0);
            if (e < 9)
                ddp_lr_scheduler_step(s);
        }
        double want = adam ? -1.92386806 : -11.5241337;
        if (fabs(p->data[0] - want) > 2e-6 * fabs(want))
            fail_msg("%s: p %.9g after 10 steps, torch %.9g", adam ? "Adam" : "SGD",
                     (double)p->data[0], want);
        ddp_lr_scheduler_destroy(s);
        ddp_optim_destroy(o);
        ddp_model_destroy(m);
    }
    /* Adadelta has no momentum to cycle: torch's ValueError */
    ddp_model_t *m;
    ddp_param *p;
    ddp_optim_t *o;
    ddp_lr_scheduler_t *s = NULL;
    assert_int_equal(ddp_model_create(&m), 0);
    assert_int_equal(ddp_model_add_param(m, "p", 1, (int64_t[]){1}, &p), 0);
    ddp_adadelta_options dd = ddp_adadelta_defaults();
    assert_int_equal(ddp_adadelta_create(m, &dd, &o), 0);
    ddp_lr_options lo = ddp_lr_defaults(DDP_LR_ONECYCLE);
    lo.max_lr = 1, lo.total_steps = 10, lo.cycle_momentum = 1;
    assert_int_equal(ddp_lr_scheduler_create(o, &lo, &s), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "optimizer must support momentum with "
                                             "`cycle_momentum` option enabled"));
    assert_true(isnan(ddp_optim_group_momentum(o, 0)));
    ddp_optim_destroy(o);
    ddp_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_torch),
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_onecycle_momentum),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
