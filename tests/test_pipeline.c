/* Tests of pipeline parallelism (include/ddp/pipeline.h) with real
 * processes: the pipeline trained 20 steps equals the unsplit model trained
 * on the global batch in one process (2 stages x 1 replica, 2 x 2 with
 * GPipe and with 1F1B on uneven micro-batches, 4 x 1), an activation of
 * the wrong shape named with stage, micro-batch and both shapes, a stage
 * killed with SIGKILL failing every other rank within the timeout with a
 * message naming a stage, and bad options. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "ddp.h"
#include "ddp/pipeline.h"
#include "fork_children.h"
#include "pg_util.h"
#include "pipeline_model.h"

#define STEPS 20
#define MAXP 2048
#define MAXR 8

typedef struct results {
    float ref[MAXP], ref_loss[STEPS];
    float ref_logits[GLOBAL_B * CLASSES], logits[GLOBAL_B * CLASSES]; /* after training */
    float params[2][MAXP];       /* per replica, the full model's layout */
    float loss[2][STEPS];        /* per replica, from its last stage */
    char err[MAXR][768];         /* each rank's failure */
    double fail_at[MAXR];        /* when it failed (ddp_time_now) */
} results;

typedef struct pcase {
    int S, R, M;
    ddp_pipeline_schedule schedule;
    const int *cuts;             /* S + 1 module indices */
    int bad_shape;               /* stage 1 declares one feature less than it gets */
    int kill_rank, kill_step;    /* -1: none */
    double timeout;
    job j;
    results *out;
} pcase;

/* The reference: the unsplit model, one process, the global batch. */
static int reference(int rank, void *arg)
{
    (void)rank;
    results *out = ((pcase *)arg)->out;
    ddp_model_t *m;
    ddp_optim_t *opt;
    ddp_tape_t *tape;
    CHILD_CHECK(build_full(&m) == 0);
    ddp_sgd_options so = sgd();
    CHILD_CHECK(ddp_sgd_create(m, &so, &opt) == 0);
    CHILD_CHECK(ddp_tape_create(&tape) == 0);
    float x[GLOBAL_B * IN];
    int64_t labels[GLOBAL_B], shape[2] = {GLOBAL_B, IN};
    for (int t = 0; t < STEPS; t++) {
        make_batch(t, x, labels);
        ddp_tensor xt;
        ddp_var_t *xv, *y, *loss;
        CHILD_CHECK(ddp_tensor_wrap(&xt, x, 2, shape) == 0);
        ddp_tape_reset(tape);
        CHILD_CHECK(ddp_tape_input(tape, &xt, 0, &xv) == 0);
        CHILD_CHECK(ddp_model_forward(m, tape, xv, &y) == 0);
        CHILD_CHECK(ddp_op_cross_entropy(tape, y, labels, &loss) == 0);
        ddp_optim_zero_grad(opt);
        CHILD_CHECK(ddp_tape_backward(tape, loss, m) == 0);
        CHILD_CHECK(ddp_optim_step(opt) == 0);
        out->ref_loss[t] = ddp_var_item(loss);
    }
    make_batch(STEPS, x, labels); /* evaluation: logits of a batch not trained on */
    ddp_tensor xt;
    ddp_var_t *xv, *y;
    CHILD_CHECK(ddp_tensor_wrap(&xt, x, 2, shape) == 0);
    ddp_tape_reset(tape);
    CHILD_CHECK(ddp_tape_input(tape, &xt, 0, &xv) == 0);
    CHILD_CHECK(ddp_model_forward(m, tape, xv, &y) == 0);
    memcpy(out->ref_logits, ddp_var_tensor(y)->data, sizeof out->ref_logits);
    size_t n;
    float *block = ddp_model_param_block(m, &n);
    CHILD_CHECK(n <= MAXP);
    memcpy(out->ref, block, n * sizeof *block);
    ddp_tape_destroy(tape);
    ddp_optim_destroy(opt);
    ddp_model_destroy(m);
    return 0;
}

static int train(pcase *c, ddp_pg_t *pg, ddp_pipeline_t **ppo, ddp_model_t *m, int rank)
{
    int stage = rank % c->S, replica = rank / c->S, b = GLOBAL_B / c->R;
    ddp_pipeline_options o = ddp_pipeline_defaults(c->S, c->M);
    o.schedule = c->schedule;
    o.input_ndim = 1;
    o.input_shape[0] = dims[c->cuts[stage] / 2] - (c->bad_shape && stage == 1);
    DDP_TRY(ddp_pipeline_create(pg, m, &o, ppo));
    ddp_pipeline_t *pp = *ppo;
    ddp_optim_t *opt;
    ddp_sgd_options so = sgd();
    DDP_TRY(ddp_sgd_create(m, &so, &opt));
    float x[GLOBAL_B * IN];
    int64_t labels[GLOBAL_B], shape[2] = {b, IN};
    int rc = 0;
    for (int t = 0; t < STEPS && rc == 0; t++) {
        if (rank == c->kill_rank && t == c->kill_step)
            raise(SIGKILL);
        make_batch(t, x, labels);
        ddp_tensor xt;
        float loss;
        rc = ddp_tensor_wrap(&xt, x + replica * b * IN, 2, shape);
        ddp_optim_zero_grad(opt);
        if (rc == 0)
            rc = ddp_pipeline_step(pp, &xt, labels + replica * b, b, &loss);
        if (rc == 0)
            rc = ddp_optim_step(opt);
        if (rc == 0 && stage == c->S - 1)
            c->out->loss[replica][t] = loss;
    }
    ddp_optim_destroy(opt);
    if (rc == 0 && replica == 0) { /* evaluation through replica 0's stages */
        ddp_tensor xt, z;
        int64_t gshape[2] = {GLOBAL_B, IN};
        make_batch(STEPS, x, labels);
        rc = ddp_tensor_wrap(&xt, x, 2, gshape);
        if (rc == 0)
            rc = ddp_pipeline_forward(pp, &xt, GLOBAL_B, &z);
        if (rc == 0 && stage == c->S - 1) {
            if (z.numel != GLOBAL_B * CLASSES)
                return DDP_ERROR(DDP_ERR_MISMATCH, "logits of %lld floats", (long long)z.numel);
            memcpy(c->out->logits, z.data, sizeof c->out->logits);
        }
        ddp_tensor_destroy(&z);
    }
    return rc;
}

static int pipeline_rank(int rank, void *arg)
{
    pcase *c = arg;
    ddp_pg_t *pg = NULL;
    ddp_model_t *m = NULL;
    ddp_pipeline_t *pp = NULL;
    int stage = rank % c->S, replica = rank / c->S;
    int rc = ddp_init_process_group("tcp", c->j.url, rank, c->S * c->R, c->timeout, &pg);
    if (rc == 0)
        rc = build_stage(c->cuts, c->S, stage, &m);
    if (rc == 0)
        rc = train(c, pg, &pp, m, rank);
    if (rc == 0) {
        size_t n, off = full_offset(m);
        float *block = ddp_model_param_block(m, &n);
        memcpy(c->out->params[replica] + off, block, n * sizeof *block);
    } else {
        c->out->fail_at[rank] = ddp_time_now();
        snprintf(c->out->err[rank], sizeof c->out->err[rank], "%s", ddp_last_error());
        fprintf(stderr, "rank %d: %s\n", rank, ddp_last_error());
    }
    ddp_pipeline_destroy(pp);
    ddp_model_destroy(m);
    ddp_destroy_process_group(pg);
    return rc < 0;
}

static results *run_case(pcase *c)
{
    c->out = shared_page(sizeof *c->out);
    job_init(&c->j);
    assert_int_equal(run_children(1, reference, c, 60), 0);
    return c->out;
}

static void check_equivalence(int S, int R, int M, ddp_pipeline_schedule sched, const int *cuts)
{
    pcase c;
    memset(&c, 0, sizeof c);
    c.S = S, c.R = R, c.M = M, c.schedule = sched, c.cuts = cuts;
    c.kill_rank = c.kill_step = -1;
    c.timeout = 30.0;
    results *out = run_case(&c);
    assert_int_equal(run_children(S * R, pipeline_rank, &c, 120), 0);
    size_t n = full_numel();
    for (int r = 0; r < R; r++) {
        double d = max_rel_diff(out->params[r], out->ref, n);
        printf("S=%d R=%d M=%d %s: replica %d parameters within %.2g of one process\n", S, R, M,
               sched == DDP_SCHEDULE_GPIPE ? "GPipe" : "1F1B", r, d);
        assert_true(d <= 1e-5);
    }
    float mean_loss[STEPS];
    for (int t = 0; t < STEPS; t++) {
        double s = 0;
        for (int r = 0; r < R; r++)
            s += out->loss[r][t];
        mean_loss[t] = (float)(s / R);
    }
    assert_true(max_rel_diff(mean_loss, out->ref_loss, STEPS) <= 1e-5);
    assert_true(max_rel_diff(out->logits, out->ref_logits, GLOBAL_B * CLASSES) <= 1e-5);
    assert_true(out->ref_loss[STEPS - 1] < out->ref_loss[0]); /* it learned something */
    job_cleanup(&c.j);
    munmap(out, sizeof *out);
}

static void test_2_stages_1_replica(void **state)
{
    (void)state;
    check_equivalence(2, 1, 4, DDP_SCHEDULE_1F1B, cuts2);
}

static void test_2_stages_2_replicas_1f1b_uneven(void **state)
{
    (void)state;
    check_equivalence(2, 2, 5, DDP_SCHEDULE_1F1B, cuts2); /* 12 rows: 3, 3, 2, 2, 2 */
}

static void test_2_stages_2_replicas_gpipe(void **state)
{
    (void)state;
    check_equivalence(2, 2, 4, DDP_SCHEDULE_GPIPE, cuts2);
}

static void test_4_stages_1f1b(void **state)
{
    (void)state;
    check_equivalence(4, 1, 6, DDP_SCHEDULE_1F1B, cuts4);
}

/* Stage 1 declares 15 features where stage 0 sends 16: stage 1 names
 * itself, micro-batch 0 and both shapes; stage 0, waiting for a gradient
 * that never comes, fails too within the timeout. */
static void test_wrong_shape(void **state)
{
    (void)state;
    pcase c;
    memset(&c, 0, sizeof c);
    c.S = 2, c.R = 1, c.M = 4, c.schedule = DDP_SCHEDULE_1F1B, c.cuts = cuts2;
    c.bad_shape = 1, c.kill_rank = c.kill_step = -1, c.timeout = 5.0;
    c.out = shared_page(sizeof *c.out);
    job_init(&c.j);
    double t0 = ddp_time_now();
    assert_int_equal(run_children(2, pipeline_rank, &c, 30), 2);
    printf("stage 1: %s\nstage 0: %s\n", c.out->err[1], c.out->err[0]);
    assert_true(contains(c.out->err[1], "pipeline stage 1 (rank 1): the activation of "
                                        "micro-batch 0 from stage 0 has shape (6, 14); stage 1 "
                                        "expects (6, 13)"));
    assert_true(contains(c.out->err[0], "pipeline stage 0"));
    assert_true(c.out->fail_at[0] - t0 < c.timeout + 3.0);
    job_cleanup(&c.j);
    munmap(c.out, sizeof *c.out);
}

/* 2 x 2: the last stage of replica 1 (rank 3) is killed at step 3; every
 * other rank fails within the timeout naming it: rank 2 waited for it, and
 * the others hear the cause through the aborted subgroups (ddp__pg_abort). */
static void test_dead_stage(void **state)
{
    (void)state;
    pcase c;
    memset(&c, 0, sizeof c);
    c.S = 2, c.R = 2, c.M = 4, c.schedule = DDP_SCHEDULE_1F1B, c.cuts = cuts2;
    c.kill_rank = 3, c.kill_step = 3, c.timeout = 5.0;
    c.out = shared_page(sizeof *c.out);
    job_init(&c.j);
    double t0 = ddp_time_now();
    assert_int_equal(run_children(4, pipeline_rank, &c, 40), 4);
    for (int r = 0; r < 3; r++) {
        printf("rank %d (%.1f s): %s\n", r, c.out->fail_at[r] - t0, c.out->err[r]);
        assert_true(contains(c.out->err[r], "pipeline stage"));
        /* from its link ("from stage 1 (rank 3)") or the replicas' group
         * ("replicas of the stage (world ranks 1, 3)") */
        assert_true(contains(c.out->err[r], "from stage 1 (rank 3)") ||
                    contains(c.out->err[r], "replicas of the stage (world ranks 1, 3)"));
        assert_true(contains(c.out->err[r], "died"));
        assert_true(c.out->fail_at[r] > 0 && c.out->fail_at[r] - t0 < c.timeout + 5.0);
    }
    job_cleanup(&c.j);
    munmap(c.out, sizeof *c.out);
}

static int bad_options_rank(int rank, void *arg)
{
    pcase *c = arg;
    ddp_pg_t *pg = NULL;
    ddp_model_t *m = NULL;
    ddp_pipeline_t *pp = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", c->j.url, rank, 2, 10.0, &pg) == 0);
    CHILD_CHECK(build_stage(c->cuts, 2, rank, &m) == 0);
    /* 3 stages on 2 ranks; no input shape on stage 1; then ranks that
     * disagree on the micro-batches */
    ddp_pipeline_options o = ddp_pipeline_defaults(3, 4);
    CHILD_CHECK(ddp_pipeline_create(pg, m, &o, &pp) == DDP_ERR_INVALID_ARG);
    CHILD_CHECK(contains(ddp_last_error(), "world size 2 is not a multiple of 3 stages"));
    o = ddp_pipeline_defaults(2, 4);
    if (rank == 1) {
        CHILD_CHECK(ddp_pipeline_create(pg, m, &o, &pp) == DDP_ERR_INVALID_ARG);
        CHILD_CHECK(contains(ddp_last_error(), "pipeline stage 1: options.input_shape is "
                                               "required"));
    }
    o.input_ndim = 1;
    o.input_shape[0] = dims[c->cuts[rank] / 2];
    o.micro_batches = 4 + rank;
    CHILD_CHECK(ddp_pipeline_create(pg, m, &o, &pp) == DDP_ERR_MISMATCH);
    CHILD_CHECK(contains(ddp_last_error(), "rank 1 has micro_batches 5, rank 0 has 4"));
    CHILD_CHECK(pp == NULL);
    ddp_model_destroy(m);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_bad_options(void **state)
{
    (void)state;
    pcase c;
    memset(&c, 0, sizeof c);
    c.cuts = cuts2;
    job_init(&c.j);
    assert_int_equal(run_children(2, bad_options_rank, &c, 30), 0);
    job_cleanup(&c.j);
}

/* Bad cuts are refused, naming them; every module is freed either way
 * (the sanitizer build's leak check sees it). */
static void test_split_errors(void **state)
{
    (void)state;
    ddp_module_t *mods[NMOD];
    ddp_model_t *m = NULL;
    assert_int_equal(make_modules(mods), 0);
    assert_int_equal(ddp_pipeline_split(mods, NMOD, (int[]){0, 4, 4, 7}, 3, 0, &m),
                     DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "stage 1 would hold modules [4, 4)"));
    assert_null(m);
    assert_int_equal(make_modules(mods), 0);
    assert_int_equal(ddp_pipeline_split(mods, NMOD, (int[]){0, 4, 6}, 2, 1, &m),
                     DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "cuts must run from 0 to 7 modules (got 0 .. 6)"));
    assert_int_equal(make_modules(mods), 0);
    assert_int_equal(ddp_pipeline_split(mods, NMOD, (int[]){0, 4, 7}, 2, 1, &m), 0);
    assert_int_equal(ddp_model_num_params(m), 4); /* 4.weight, 4.bias, 6.weight, 6.bias */
    assert_string_equal(ddp_model_param(m, 0)->name, "4.weight");
    assert_string_equal(ddp_model_param(m, 3)->name, "6.bias");
    ddp_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_2_stages_1_replica),
        cmocka_unit_test(test_2_stages_2_replicas_1f1b_uneven),
        cmocka_unit_test(test_2_stages_2_replicas_gpipe),
        cmocka_unit_test(test_4_stages_1f1b),
        cmocka_unit_test(test_wrong_shape),
        cmocka_unit_test(test_dead_stage),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_split_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
