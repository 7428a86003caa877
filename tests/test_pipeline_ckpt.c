/* Checkpoints of a pipelined model (ddp_pipeline_checkpoint_save/load,
 * include/ddp/pipeline.h) with real processes: 2 stages x 2 replicas save
 * at step 10 of 20; a fresh 2 x 2 that loads it and trains steps 10..19 ends
 * bitwise equal to the run that went on (parameters, momentum and position
 * came back); 4 stages x 1 replica cut elsewhere loads it and ends within
 * 1e-5 of it; the export is the step-10 model bitwise; ZeRO-1 on 2 ranks
 * loads it bitwise.  A damaged shard fails every rank and changes nothing;
 * a model of another shape, and a stage with buffers, are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/error.h"
#include "ddp.h"
#include "ddp/pipeline.h"
#include "ddp/zero.h"
#include "fork_children.h"
#include "pg_util.h"
#include "pipeline_model.h"
#include "scratch_dir.h"

#define STEPS 20
#define SAVE_AT 10
#define MAXP 2048
#define MAXR 4

typedef struct results {
    float at_save[MAXP];          /* replica 0 at step SAVE_AT, the full layout */
    float out[MAXP];              /* replica 0 after the case's last step */
    int64_t st_step[MAXR], st_world[MAXR];
    int unchanged[MAXR];          /* after a failed load: the block as built */
    char err[MAXR][768];
} results;

typedef struct ccase {
    int S, R;
    const int *cuts;
    int save, load;               /* save at SAVE_AT; load before the first step */
    int from;                     /* the first step */
    char ckpt[128];
    job j;
    results *out;
} ccase;

static int step(ccase *c, ddp_pipeline_t *pp, ddp_optim_t *opt, int t, int rank)
{
    int replica = rank / c->S, b = GLOBAL_B / c->R;
    float x[GLOBAL_B * IN], loss;
    int64_t labels[GLOBAL_B], shape[2] = {b, IN};
    ddp_tensor xt;
    make_batch(t, x, labels);
    DDP_TRY(ddp_tensor_wrap(&xt, x + replica * b * IN, 2, shape));
    ddp_optim_zero_grad(opt);
    DDP_TRY(ddp_pipeline_step(pp, &xt, labels + replica * b, b, &loss));
    return ddp_optim_step(opt);
}

/* Replica 0's stages put their block at its place in the full layout. */
static void put_block(ddp_model_t *m, int rank, int S, float *full)
{
    size_t n;
    float *block = ddp_model_param_block(m, &n);
    if (rank / S == 0)
        memcpy(full + full_offset(m), block, n * sizeof *block);
}

static int run_stage(ccase *c, ddp_pg_t *pg, ddp_model_t *m, int rank)
{
    int stage = rank % c->S;
    ddp_pipeline_options o = ddp_pipeline_defaults(c->S, 2);
    o.input_ndim = 1;
    o.input_shape[0] = dims[c->cuts[stage] / 2];
    ddp_pipeline_t *pp = NULL;
    ddp_optim_t *opt = NULL;
    ddp_sgd_options so = sgd();
    int rc = ddp_pipeline_create(pg, m, &o, &pp);
    if (rc == 0)
        rc = ddp_sgd_create(m, &so, &opt);
    if (rc == 0 && c->load) {
        ddp_train_state st;
        rc = ddp_pipeline_checkpoint_load(c->ckpt, pp, opt, &st);
        c->out->st_step[rank] = st.step, c->out->st_world[rank] = st.world_size;
    }
    for (int t = c->from; t < STEPS && rc == 0; t++) {
        if (c->save && t == SAVE_AT) {
            ddp_train_state st = {.epoch = 0, .step = SAVE_AT, .global_step = SAVE_AT,
                                  .seed = 7, .world_size = c->R};
            if ((rc = ddp_pipeline_checkpoint_save(c->ckpt, pp, opt, &st)) < 0)
                break;
            put_block(m, rank, c->S, c->out->at_save);
        }
        rc = step(c, pp, opt, t, rank);
    }
    if (rc == 0)
        put_block(m, rank, c->S, c->out->out);
    ddp_optim_destroy(opt);
    ddp_pipeline_destroy(pp);
    return rc;
}

static int stage_rank(int rank, void *arg)
{
    ccase *c = arg;
    ddp_pg_t *pg = NULL;
    ddp_model_t *m = NULL, *fresh = NULL;
    int rc = ddp_init_process_group("tcp", c->j.url, rank, c->S * c->R, 30.0, &pg);
    if (rc == 0)
        rc = build_stage(c->cuts, c->S, rank % c->S, &m);
    if (rc == 0)
        rc = run_stage(c, pg, m, rank);
    if (rc < 0) {
        snprintf(c->out->err[rank], sizeof c->out->err[rank], "%s", ddp_last_error());
        size_t n;
        float *block = ddp_model_param_block(m, &n);
        c->out->unchanged[rank] = build_stage(c->cuts, c->S, rank % c->S, &fresh) == 0 &&
                                  memcmp(block, ddp_model_param_block(fresh, NULL),
                                         n * sizeof *block) == 0;
    }
    ddp_model_destroy(fresh);
    ddp_model_destroy(m);
    ddp_destroy_process_group(pg);
    return rc < 0;
}

/* Runs S x R ranks over c; 0 when every rank succeeded. */
static int run_case(ccase *c, int S, int R, const int *cuts, int save, int load, int from)
{
    c->S = S, c->R = R, c->cuts = cuts, c->save = save, c->load = load, c->from = from;
    job_init(&c->j);
    memset(c->out->err, 0, sizeof c->out->err);
    int rc = run_children(S * R, stage_rank, c, 120);
    job_cleanup(&c->j);
    return rc;
}

static ccase *saved_case(void)
{
    ccase *c = calloc(1, sizeof *c);
    c->out = shared_page(sizeof *c->out);
    snprintf(c->ckpt, sizeof c->ckpt, "%s/ckpt", dir);
    assert_int_equal(mkdir(c->ckpt, 0777), 0);
    assert_int_equal(run_case(c, 2, 2, cuts2, 1, 0, 0), 0); /* the run that goes on */
    return c;
}

static void free_case(ccase *c)
{
    munmap(c->out, sizeof *c->out);
    free(c);
}

static void test_resume_and_recut(void **state)
{
    (void)state;
    ccase *c = saved_case();
    size_t n = full_numel();
    float straight[MAXP];
    memcpy(straight, c->out->out, n * sizeof *straight);
    assert_true(max_rel_diff(c->out->at_save, straight, n) > 1e-3); /* it trained on */

    assert_int_equal(run_case(c, 2, 2, cuts2, 0, 1, SAVE_AT), 0);
    assert_memory_equal(c->out->out, straight, n * sizeof *straight);
    for (int r = 0; r < 4; r++) {
        assert_int_equal(c->out->st_step[r], SAVE_AT);
        assert_int_equal(c->out->st_world[r], 2); /* the replicas, not the 4 ranks */
    }

    assert_int_equal(run_case(c, 4, 1, cuts4, 0, 1, SAVE_AT), 0);
    double d = max_rel_diff(c->out->out, straight, n);
    printf("4 stages x 1 replica from the 2 x 2 checkpoint: within %.2g of the 2 x 2 run\n", d);
    assert_true(d <= 1e-5);
    free_case(c);
}

/* ZeRO-1 on 2 ranks loads the pipeline's checkpoint: the step-10 model. */
static int zero_rank(int rank, void *arg)
{
    ccase *c = arg;
    ddp_pg_t *pg = NULL;
    ddp_model_t *m = NULL;
    ddp_zero_t *z = NULL;
    ddp_optim_t *opt = NULL;
    ddp_zero_options zo = ddp_zero_defaults();
    ddp_sgd_options so = sgd();
    zo.stage = 1;
    int rc = ddp_init_process_group("tcp", c->j.url, rank, 2, 30.0, &pg);
    if (rc == 0 && (rc = build_full(&m)) == 0 && (rc = ddp_zero_create(m, pg, &zo, &z)) == 0 &&
        (rc = ddp_sgd_create(ddp_zero_shard_model(z), &so, &opt)) == 0)
        rc = ddp_zero_checkpoint_load(c->ckpt, z, opt, NULL);
    if (rc == 0 && rank == 1)
        memcpy(c->out->out, ddp_model_param_block(m, NULL), full_numel() * sizeof(float));
    if (rc < 0)
        fprintf(stderr, "rank %d: %s\n", rank, ddp_last_error());
    ddp_optim_destroy(opt);
    ddp_zero_destroy(z);
    ddp_model_destroy(m);
    ddp_destroy_process_group(pg);
    return rc < 0;
}

static void test_export_and_zero(void **state)
{
    (void)state;
    ccase *c = saved_case();
    size_t n = full_numel();
    char path[192];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(ddp_zero_checkpoint_export(c->ckpt, path), 0);
    ddp_model_t *m;
    assert_int_equal(build_full(&m), 0);
    assert_int_equal(ddp_model_load_safetensors(m, path), 0);
    assert_memory_equal(ddp_model_param_block(m, NULL), c->out->at_save, n * sizeof(float));
    ddp_model_destroy(m);

    memset(c->out->out, 0, sizeof c->out->out);
    job_init(&c->j);
    assert_int_equal(run_children(2, zero_rank, c, 60), 0);
    job_cleanup(&c->j);
    assert_memory_equal(c->out->out, c->out->at_save, n * sizeof(float));
    free_case(c);
}

static void test_damaged_shard(void **state)
{
    (void)state;
    ccase *c = saved_case();
    char path[256];
    snprintf(path, sizeof path, "%s/shard-00001-of-00002.safetensors", c->ckpt);
    assert_int_equal(truncate(path, 100), 0);
    assert_int_not_equal(run_case(c, 2, 2, cuts2, 0, 1, SAVE_AT), 0);
    for (int r = 0; r < 4; r++) {
        printf("rank %d: %s\n", r, c->out->err[r]);
        assert_true(c->out->unchanged[r]);
        /* stage 1's ranks read shard 1 and name it, the others name a rank */
        assert_non_null(strstr(c->out->err[r], r % 2 ? "shard-00001-of-00002" : "rank 1 failed"));
    }
    free_case(c);
}

/* One rank, S = 1: stage model m (owned) loads or saves c->ckpt. */
static int one_stage(ccase *c, ddp_model_t *m, int save)
{
    ddp_pg_t *pg = NULL;
    ddp_pipeline_t *pp = NULL;
    ddp_pipeline_options o = ddp_pipeline_defaults(1, 1);
    ddp_train_state st = {0};
    job_init(&c->j);
    int rc = ddp_init_process_group("tcp", c->j.url, 0, 1, 10.0, &pg);
    if (rc == 0 && (rc = ddp_pipeline_create(pg, m, &o, &pp)) == 0)
        rc = save ? ddp_pipeline_checkpoint_save(c->ckpt, pp, NULL, &st)
                  : ddp_pipeline_checkpoint_load(c->ckpt, pp, NULL, NULL);
    ddp_pipeline_destroy(pp);
    ddp_model_destroy(m);
    ddp_destroy_process_group(pg);
    job_cleanup(&c->j);
    return rc;
}

static void test_mismatch_and_buffers(void **state)
{
    (void)state;
    ccase *c = saved_case();
    ddp_model_t *m;
    ddp_module_t *lin, *bn;
    assert_int_equal(ddp_model_create(&m), 0);
    assert_int_equal(ddp_linear_create(IN, 15, 1, 1, &lin), 0); /* the checkpoint's has 16 */
    assert_int_equal(ddp_model_add_module(m, "0", lin), 0);
    assert_int_equal(ddp_model_seal(m), 0);
    assert_int_equal(one_stage(c, m, 0), DDP_ERR_MISMATCH);
    assert_non_null(strstr(ddp_last_error(), "tensor 0 is 0.weight (320 values), the model's "
                                             "is 0.weight (300 values)"));

    ddp_batchnorm_options bo = ddp_batchnorm_defaults(16);
    assert_int_equal(ddp_model_create(&m), 0);
    assert_int_equal(ddp_linear_create(IN, 16, 1, 1, &lin), 0);
    assert_int_equal(ddp_batchnorm1d_create(&bo, &bn), 0);
    assert_int_equal(ddp_model_add_module(m, "0", lin), 0);
    assert_int_equal(ddp_model_add_module(m, "1", bn), 0);
    assert_int_equal(ddp_model_seal(m), 0);
    assert_int_equal(one_stage(c, m, 1), DDP_ERR_UNSUPPORTED);
    assert_non_null(strstr(ddp_last_error(), "stage 0 (rank 0) has 3 module buffers"));
    free_case(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        IN_SCRATCH(test_resume_and_recut),
        IN_SCRATCH(test_export_and_zero),
        IN_SCRATCH(test_damaged_shard),
        IN_SCRATCH(test_mismatch_and_buffers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
