/* Resuming training from a checkpoint with ddp_checkpoint_save_ex/load_ex:
 * the parameter groups' lrs, the lr scheduler's state (SequentialLR warm-up
 * + cosine, and ReduceLROnPlateau with its counters) and a random
 * generator's state come back, so that a run stopped at step K and resumed
 * in fresh objects follows the uninterrupted run bitwise (parameters and
 * every lr).  Missing or damaged extras fail naming the key; and loading
 * weights alone (strict or not) with its report. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ddp.h"

#define STEPS 30
#define N 5

static char path[64];

typedef struct job {
    ddp_model_t *m;
    ddp_param *w, *b;
    ddp_optim_t *o;
    ddp_lr_scheduler_t *s[3];
    int ns, plateau;
    uint64_t rng[2]; /* the caller's data-noise generator (xorshift128+) */
} job;

static uint64_t next(uint64_t *s)
{
    uint64_t a = s[0], b = s[1];
    s[0] = b;
    a ^= a << 23;
    s[1] = a ^ b ^ (a >> 17) ^ (b >> 26);
    return s[1] + b;
}

static void make(job *j, int plateau)
{
    memset(j, 0, sizeof *j);
    j->plateau = plateau;
    assert_int_equal(ddp_model_create(&j->m), 0);
    assert_int_equal(ddp_model_add_param(j->m, "w", 1, (int64_t[]){N}, &j->w), 0);
    assert_int_equal(ddp_model_add_param(j->m, "b", 1, (int64_t[]){1}, &j->b), 0);
    assert_int_equal(ddp_model_seal(j->m), 0);
    for (int i = 0; i < N; i++)
        j->w->data[i] = 0.1f * (float)i;
    static const char *const bias[] = {"b"}, *const weight[] = {"w"};
    ddp_param_group g[2] = {ddp_param_group_defaults(), ddp_param_group_defaults()};
    g[0].names = weight, g[0].nnames = 1;
    g[1].names = bias, g[1].nnames = 1, g[1].lr = 0.05, g[1].weight_decay = 0;
    ddp_sgd_options so = ddp_sgd_defaults(0.2);
    so.momentum = 0.9, so.weight_decay = 0.01, so.groups = g, so.ngroups = 2;
    assert_int_equal(ddp_sgd_create(j->m, &so, &j->o), 0);
    ddp_lr_options o;
    if (plateau) {
        o = ddp_lr_defaults(DDP_LR_PLATEAU);
        o.patience = 1, o.factor = 0.5, o.cooldown = 1, o.threshold = 0.05;
        assert_int_equal(ddp_lr_scheduler_create(j->o, &o, &j->s[0]), 0);
        j->ns = 1;
    } else {
        static const int ms[] = {4};
        o = ddp_lr_defaults(DDP_LR_LINEAR);
        o.start_factor = 0.25, o.total_iters = 4;
        assert_int_equal(ddp_lr_scheduler_create(j->o, &o, &j->s[0]), 0);
        o = ddp_lr_defaults(DDP_LR_COSINE);
        o.t_max = STEPS - 4, o.eta_min = 0.001;
        assert_int_equal(ddp_lr_scheduler_create(j->o, &o, &j->s[1]), 0);
        o = ddp_lr_defaults(DDP_LR_SEQUENTIAL);
        o.schedulers = j->s, o.nschedulers = 2, o.milestones = ms, o.nmilestones = 1;
        assert_int_equal(ddp_lr_scheduler_create(j->o, &o, &j->s[2]), 0);
        j->ns = 3;
    }
    j->rng[0] = 0x9e3779b97f4a7c15ull, j->rng[1] = 12345;
}

static void destroy(job *j)
{
    for (int i = j->ns - 1; i >= 0; i--)
        ddp_lr_scheduler_destroy(j->s[i]);
    ddp_optim_destroy(j->o);
    ddp_model_destroy(j->m);
}

/* One step of a noisy quadratic: loss = sum (w - 1 + noise)^2 / 2 + b^2. */
static void train_step(job *j)
{
    float loss = 0;
    for (int i = 0; i < N; i++) {
        float noise = (float)(next(j->rng) >> 40) / (float)(1 << 24) - 0.5f;
        float r = j->w->data[i] - 1.0f + noise;
        j->w->grad[i] = r;
        loss += 0.5f * r * r;
    }
    j->b->grad[0] = 2 * j->b->data[0] + 0.1f;
    assert_int_equal(ddp_optim_step(j->o), 0);
    ddp_lr_scheduler_t *s = j->s[j->ns - 1];
    if (j->plateau)
        assert_int_equal(ddp_lr_scheduler_step_metric(s, loss), 0);
    else
        ddp_lr_scheduler_step(s);
}

static ddp_checkpoint_options extras(job *j, ddp_checkpoint_rng *r)
{
    *r = (ddp_checkpoint_rng){"noise", j->rng, 2};
    ddp_checkpoint_options x = ddp_checkpoint_defaults();
    x.scheduler = j->s[j->ns - 1], x.rngs = r, x.nrngs = 1;
    return x;
}

static void test_resume_same_sequence(void **state)
{
    (void)state;
    for (int plateau = 0; plateau < 2; plateau++)
        for (int k = 3; k < STEPS; k += 8) {
            job a, b;
            double lr_a[STEPS][2];
            make(&a, plateau);
            float w_ref[N + 1];
            for (int t = 0; t < STEPS; t++) {
                train_step(&a);
                lr_a[t][0] = ddp_optim_group_lr(a.o, 0), lr_a[t][1] = ddp_optim_group_lr(a.o, 1);
            }
            memcpy(w_ref, a.w->data, N * sizeof(float));
            w_ref[N] = a.b->data[0];
            destroy(&a);

            /* the interrupted run: k steps, save, fresh objects, load, the rest */
            make(&a, plateau);
            for (int t = 0; t < k; t++)
                train_step(&a);
            ddp_checkpoint_rng r;
            ddp_checkpoint_options x = extras(&a, &r);
            ddp_train_state st = {.epoch = 0, .step = k, .global_step = k, .world_size = 1};
            assert_int_equal(ddp_checkpoint_save_ex(path, a.m, a.o, &st, &x), 0);
            destroy(&a);
            make(&b, plateau);
            x = extras(&b, &r);
            assert_int_equal(ddp_checkpoint_load_ex(path, b.m, b.o, &st, &x), 0);
            assert_int_equal(st.global_step, k);
            for (int t = k; t < STEPS; t++) {
                train_step(&b);
                for (int g = 0; g < 2; g++)
                    if (ddp_optim_group_lr(b.o, g) != lr_a[t][g])
                        fail_msg("plateau %d resumed at %d: step %d group %d lr %.17g, "
                                 "uninterrupted %.17g", plateau, k, t, g,
                                 ddp_optim_group_lr(b.o, g), lr_a[t][g]);
            }
            assert_memory_equal(b.w->data, w_ref, N * sizeof(float));
            assert_true(b.b->data[0] == w_ref[N]);
            destroy(&b);
        }
}

static void test_missing_extras(void **state)
{
    (void)state;
    job a;
    make(&a, 1);
    train_step(&a);
    ddp_train_state st = {.world_size = 1};
    assert_int_equal(ddp_checkpoint_save(path, a.m, a.o, &st), 0); /* no extras */
    ddp_checkpoint_rng r;
    ddp_checkpoint_options x = extras(&a, &r);
    uint64_t before = a.rng[0];
    assert_int_equal(ddp_checkpoint_load_ex(path, a.m, a.o, NULL, &x), DDP_ERR_FORMAT);
    assert_non_null(strstr(ddp_last_error(), "no libddp.lr_scheduler.last_epoch in "
                                             "__metadata__"));
    x.scheduler = NULL;
    assert_int_equal(ddp_checkpoint_load_ex(path, a.m, a.o, NULL, &x), DDP_ERR_FORMAT);
    assert_non_null(strstr(ddp_last_error(), "no libddp.rng.noise in __metadata__"));
    assert_true(a.rng[0] == before);
    /* the plain load still restores the groups' lrs */
    ddp_optim_set_group_lr(a.o, 1, 7.0);
    assert_int_equal(ddp_checkpoint_load(path, a.m, a.o, NULL), 0);
    assert_true(ddp_optim_group_lr(a.o, 1) == 0.05);
    /* a word count that differs */
    x = extras(&a, &r);
    assert_int_equal(ddp_checkpoint_save_ex(path, a.m, a.o, &st, &x), 0);
    r.nwords = 3;
    assert_int_equal(ddp_checkpoint_load_ex(path, a.m, a.o, NULL, &x), DDP_ERR_FORMAT);
    assert_non_null(strstr(ddp_last_error(), "libddp.rng.noise is '"));
    assert_non_null(strstr(ddp_last_error(), "not 3 comma-separated hex words"));
    destroy(&a);
}

static ddp_model_t *named(const char *const *names, int n, const int64_t *sizes)
{
    ddp_model_t *m;
    ddp_param *p;
    assert_int_equal(ddp_model_create(&m), 0);
    for (int i = 0; i < n; i++)
        assert_int_equal(ddp_model_add_param(m, names[i], 1, &sizes[i], &p), 0);
    assert_int_equal(ddp_model_seal(m), 0);
    return m;
}

static void test_load_weights(void **state)
{
    (void)state;
    job a;
    make(&a, 0);
    for (int t = 0; t < 3; t++)
        train_step(&a);
    ddp_train_state st = {.world_size = 1};
    assert_int_equal(ddp_checkpoint_save(path, a.m, a.o, &st), 0);
    /* strict into the same layout: the optimizer's buffers are not "unexpected" */
    static const char *const same[] = {"w", "b"}, *const other[] = {"w", "c"};
    ddp_model_t *m = named(same, 2, (int64_t[]){N, 1});
    char *report;
    assert_int_equal(ddp_checkpoint_load_weights(path, m, 1, &report), 0);
    assert_string_equal(report, "");
    free(report);
    assert_memory_equal(ddp_model_param(m, 0)->data, a.w->data, N * sizeof(float));
    ddp_model_destroy(m);
    /* another layout: strict fails naming both sides, non-strict reports them */
    m = named(other, 2, (int64_t[]){N, 1});
    ddp_model_param(m, 1)->data[0] = 3.0f;
    assert_int_equal(ddp_checkpoint_load_weights(path, m, 1, &report), DDP_ERR_MISMATCH);
    assert_null(report);
    assert_non_null(strstr(ddp_last_error(), "missing c; unexpected b"));
    assert_true(ddp_model_param(m, 0)->data[0] == 0.0f); /* nothing changed */
    assert_int_equal(ddp_checkpoint_load_weights(path, m, 0, &report), 0);
    assert_string_equal(report, "missing c; unexpected b");
    free(report);
    assert_memory_equal(ddp_model_param(m, 0)->data, a.w->data, N * sizeof(float));
    assert_true(ddp_model_param(m, 1)->data[0] == 3.0f);
    ddp_model_destroy(m);
    /* a shape that differs fails even when not strict */
    m = named(same, 2, (int64_t[]){N + 1, 1});
    assert_int_equal(ddp_checkpoint_load_weights(path, m, 0, NULL), DDP_ERR_MISMATCH);
    assert_non_null(strstr(ddp_last_error(), "w is F32, 1-D, 20 bytes in the file but F32, 1-D, "
                                             "6 elements in the model"));
    ddp_model_destroy(m);
    destroy(&a);
}

static int setup(void **state)
{
    (void)state;
    snprintf(path, sizeof path, "/tmp/ddp_resume_%d.safetensors", (int)getpid());
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(path);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_same_sequence),
        cmocka_unit_test(test_missing_extras),
        cmocka_unit_test(test_load_weights),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
