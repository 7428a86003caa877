/* Tests of ZeRO's sharded checkpoints with module buffers (BatchNorm's
 * running_mean, running_var, num_batches_tracked): a model with a
 * BatchNorm1d trained on 2 ranks (stage 1 under DDP, which broadcasts rank
 * 0's buffers), saved, exported to one file and loaded into a fresh model
 * with ddp_model_load_safetensors: parameters and buffers bitwise rank 0's,
 * as its own ddp_model_save_safetensors wrote them; loaded back on 2 ranks
 * at stage 2, every rank gets rank 0's buffers; a model without those
 * buffers, a checkpoint without buffers into a model with them, and a
 * missing, damaged or foreign buffers file, fail every rank with nothing
 * changed, and the export names the damaged file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"
#include "ddp.h"
#include "ddp/ext.h"
#include "ddp/nn_module.h"
#include "fork_children.h"
#include "scratch_dir.h"

#define IN 12
#define HID 16
#define OUT 5
#define B 6     /* per-rank batch */
#define STEPS 3 /* training steps before the save */

/* Sequential(Linear(12,16), BatchNorm1d(16), ReLU, Linear(16,5)), seeded;
 * stats 0: a BatchNorm without running statistics (no buffers). */
static int make_model(int stats, ddp_model_t **out)
{
    ddp_module_t *mods[4], *seq;
    ddp_batchnorm_options bo = ddp_batchnorm_defaults(HID);
    bo.track_running_stats = stats;
    DDP_TRY(ddp_linear_create(IN, HID, 1, 7, &mods[0]));
    DDP_TRY(ddp_batchnorm1d_create(&bo, &mods[1]));
    DDP_TRY(ddp_relu_create(&mods[2]));
    DDP_TRY(ddp_linear_create(HID, OUT, 1, 8, &mods[3]));
    DDP_TRY(ddp_sequential_create(mods, 4, &seq));
    return ddp_model_from_module(seq, out);
}

typedef struct {
    int world, stage, stats, train;
    const char *tag;
    const char *save_dir, *load_dir; /* after training; before it */
    const char *out;                 /* each rank's model afterwards: DIR/out.RANK */
    const char *expect_err;          /* the load must fail with this */
} bcase;

/* One step on this rank's samples [first, first + B). */
static int step(ddp_data_parallel_t *dm, ddp_model_t *m, ddp_zero_t *z, ddp_optim_t *opt,
                ddp_tape_t *tape, int64_t first)
{
    static float xs[B * IN];
    static int64_t labels[B];
    for (int i = 0; i < B; i++) {
        for (int j = 0; j < IN; j++)
            xs[i * IN + j] = (float)cos(0.29 * (double)(first + i) - 0.13 * j) + 0.5f;
        labels[i] = (first + i) % OUT;
    }
    ddp_tensor t;
    DDP_TRY(ddp_tensor_wrap(&t, xs, 2, (int64_t[]){B, IN}));
    ddp_tape_reset(tape);
    ddp_var_t *x, *y, *loss;
    DDP_TRY(ddp_tape_input(tape, &t, 0, &x));
    DDP_TRY(dm ? ddp_data_parallel_forward(dm, tape, x, &y) : ddp_model_forward(m, tape, x, &y));
    DDP_TRY(ddp_op_cross_entropy(tape, y, labels, &loss));
    ddp_optim_zero_grad(opt);
    if (dm)
        ddp_model_zero_grad(m);
    DDP_TRY(dm ? ddp_data_parallel_backward(dm, tape, loss) : ddp_zero_backward(z, tape, loss));
    return ddp_zero_step(z, opt);
}

static int buf_rank(int rank, void *arg)
{
    const bcase *c = arg;
    char url[256], path[256];
    snprintf(url, sizeof url, "file://%s/store-%s", dir, c->tag);
    ddp_pg_t *pg;
    ddp_model_t *m;
    ddp_tape_t *tape;
    ddp_data_parallel_t *dm = NULL;
    ddp_zero_t *z;
    ddp_optim_t *opt;
    CHILD_CHECK(ddp_init_process_group("tcp", url, rank, c->world, 20.0, &pg) == 0);
    CHILD_CHECK(make_model(c->stats, &m) == 0);
    CHILD_CHECK(ddp_tape_create(&tape) == 0);
    if (c->stage == 1)
        CHILD_CHECK(ddp_data_parallel_create(m, pg, NULL, &dm) == 0);
    ddp_zero_options zo = ddp_zero_defaults();
    zo.stage = c->stage;
    CHILD_CHECK(ddp_zero_create(m, pg, &zo, &z) == 0);
    ddp_adam_options ao = ddp_adam_defaults();
    ao.lr = 1e-2;
    CHILD_CHECK(ddp_adam_create(ddp_zero_shard_model(z), &ao, &opt) == 0);
    if (c->load_dir) {
        size_t nb, np;
        void *bufs = ddp_model_buffer_block(m, &nb);
        float *params = ddp_model_param_block(m, &np);
        void *before = malloc(nb + np * sizeof(float) + 1);
        if (nb)
            memcpy(before, bufs, nb);
        memcpy((char *)before + nb, params, np * sizeof(float));
        ddp_train_state st;
        int rc = ddp_zero_checkpoint_load(c->load_dir, z, opt, &st);
        if (c->expect_err) { /* failed on every rank, nothing changed */
            CHILD_CHECK(rc < 0);
            const char *msg = ddp_last_error();
            snprintf(path, sizeof path, "%s/err-%s.%d", dir, c->tag, rank);
            FILE *f = fopen(path, "w");
            CHILD_CHECK(f && fputs(msg, f) >= 0 && fclose(f) == 0);
            CHILD_CHECK(nb == 0 || memcmp(before, bufs, nb) == 0);
            CHILD_CHECK(memcmp((char *)before + nb, params, np * sizeof(float)) == 0);
        } else {
            CHILD_CHECK(rc == 0 && st.global_step == STEPS);
        }
        free(before);
    }
    for (int s = 0; s < c->train; s++)
        CHILD_CHECK(step(dm, m, z, opt, tape, ((int64_t)s * c->world + rank) * B) == 0);
    if (c->save_dir) {
        ddp_train_state st = {.global_step = STEPS};
        CHILD_CHECK(ddp_zero_checkpoint_save(c->save_dir, z, opt, &st) == 0);
    }
    if (c->out) {
        snprintf(path, sizeof path, "%s/%s.%d", dir, c->out, rank);
        CHILD_CHECK(ddp_model_save_safetensors(m, path) == 0);
    }
    ddp_optim_destroy(opt);
    ddp_zero_destroy(z);
    ddp_data_parallel_destroy(dm);
    ddp_tape_destroy(tape);
    ddp_model_destroy(m);
    ddp_destroy_process_group(pg);
    return 0;
}

/* The checkpoint "ck" of STEPS steps on 2 ranks, and rank 0's own file of
 * the same model, "ref.0". */
static void save_ck(void)
{
    char ck[256];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    assert_int_equal(mkdir(ck, 0755), 0);
    bcase c = {.world = 2, .stage = 1, .stats = 1, .train = STEPS, .tag = "save",
               .save_dir = ck, .out = "ref"};
    assert_int_equal(run_children(2, buf_rank, &c, 60), 0);
}

/* A fresh model (with running statistics) loaded from DIR/name. */
static ddp_model_t *load_model(const char *name)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ddp_model_t *m;
    assert_int_equal(make_model(1, &m), 0);
    if (ddp_model_load_safetensors(m, path) != 0)
        fail_msg("%s: %s", path, ddp_last_error());
    return m;
}

/* Parameters and buffers of a and b bitwise equal. */
static void assert_same_model(ddp_model_t *a, ddp_model_t *b, const char *what)
{
    size_t na, nb, ba, bb;
    float *pa = ddp_model_param_block(a, &na), *pb = ddp_model_param_block(b, &nb);
    void *xa = ddp_model_buffer_block(a, &ba), *xb = ddp_model_buffer_block(b, &bb);
    assert_int_equal(na, nb);
    assert_int_equal(ba, bb);
    if (memcmp(pa, pb, na * sizeof *pa) != 0)
        fail_msg("%s: the parameters differ", what);
    if (memcmp(xa, xb, ba) != 0)
        fail_msg("%s: the buffers differ", what);
}

static void test_export_and_load(void **state)
{
    (void)state;
    save_ck();
    ddp_model_t *ref = load_model("ref.0");
    /* the buffers moved: the test would pass on defaults otherwise */
    const ddp_buffer *nbt = ddp_model_find_buffer(ref, "1.num_batches_tracked");
    const ddp_buffer *mean = ddp_model_find_buffer(ref, "1.running_mean");
    assert_non_null(nbt);
    assert_non_null(mean);
    assert_int_equal(*(const int64_t *)nbt->data, STEPS);
    assert_true(fabsf(((const float *)mean->data)[0]) > 1e-3f);
    /* the consolidated file: parameters and buffers, an ordinary model file */
    char ck[256], out[256];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    snprintf(out, sizeof out, "%s/model.safetensors", dir);
    if (ddp_zero_checkpoint_export(ck, out) != 0)
        fail_msg("export: %s", ddp_last_error());
    ddp_model_t *ex = load_model("model.safetensors");
    assert_same_model(ex, ref, "the export against rank 0's model");
    ddp_model_destroy(ex);
    /* loaded on 2 ranks at stage 2 (no DDP): every rank gets rank 0's */
    bcase c = {.world = 2, .stage = 2, .stats = 1, .tag = "load", .load_dir = ck,
               .out = "loaded"};
    assert_int_equal(run_children(2, buf_rank, &c, 60), 0);
    for (int r = 0; r < 2; r++) {
        char name[32];
        snprintf(name, sizeof name, "loaded.%d", r);
        ddp_model_t *l = load_model(name);
        assert_same_model(l, ref, name);
        ddp_model_destroy(l);
    }
    ddp_model_destroy(ref);
}

#define SHELL(...)                                \
    do {                                          \
        char cmd_[1024];                          \
        snprintf(cmd_, sizeof cmd_, __VA_ARGS__); \
        assert_int_equal(system(cmd_), 0);        \
    } while (0)

/* A load of DIR/sub on 2 ranks that fails on both, nothing changed: one
 * rank says msg, the other names it. */
static void expect_failure(const char *sub, int stats, const char *msg)
{
    char path[256], tag[64];
    snprintf(path, sizeof path, "%s/%s", dir, sub);
    snprintf(tag, sizeof tag, "bad-%s-%d", sub, stats);
    bcase c = {.world = 2, .stage = 1, .stats = stats, .tag = tag, .load_dir = path,
               .expect_err = msg};
    assert_int_equal(run_children(2, buf_rank, &c, 60), 0);
    int found = 0;
    for (int r = 0; r < 2; r++) {
        char p[256], e[1024] = "";
        snprintf(p, sizeof p, "%s/err-%s.%d", dir, tag, r);
        FILE *f = fopen(p, "r");
        assert_non_null(f);
        assert_true(fread(e, 1, sizeof e - 1, f) > 0);
        fclose(f);
        found |= strstr(e, msg) != NULL;
        if (!strstr(e, msg) && !strstr(e, "failed ("))
            fail_msg("%s: rank %d: unexpected message: %s", sub, r, e);
    }
    if (!found)
        fail_msg("%s: no rank said \"%s\"", sub, msg);
}

static void test_bad_buffers(void **state)
{
    (void)state;
    save_ck();
    /* a model whose BatchNorm keeps no running statistics */
    expect_failure("ck", 0, "holds 3 buffers, the model has 0");
    /* the other way: an index without buffers (a model without them, or a
     * checkpoint written before libddp saved buffers) into a model with
     * them: refused, not loaded with the buffers left as they were */
    char plain[256];
    snprintf(plain, sizeof plain, "%s/plain", dir);
    assert_int_equal(mkdir(plain, 0755), 0);
    bcase p = {.world = 2, .stage = 1, .stats = 0, .train = STEPS, .tag = "save0",
               .save_dir = plain};
    assert_int_equal(run_children(2, buf_rank, &p, 60), 0);
    SHELL("! grep -q buffers %s/index.json", plain); /* it names none */
    expect_failure("plain", 1, "holds 0 buffers, the model has 3");
    /* the buffers file missing, cut, or of another save */
    SHELL("cp -r %s/ck %s/nobuf && rm %s/nobuf/buffers.safetensors", dir, dir, dir);
    expect_failure("nobuf", 1, "No such file");
    SHELL("cp -r %s/ck %s/cut && truncate -s 60 %s/cut/buffers.safetensors", dir, dir, dir);
    expect_failure("cut", 1, "exceeds the");
    SHELL("mkdir %s/other && cp %s/ck/* %s/other/", dir, dir, dir);
    bcase c = {.world = 2, .stage = 1, .stats = 1, .train = STEPS + 1, .tag = "save2",
               .save_dir = NULL};
    char other[256];
    snprintf(other, sizeof other, "%s/other2", dir);
    assert_int_equal(mkdir(other, 0755), 0);
    c.save_dir = other;
    assert_int_equal(run_children(2, buf_rank, &c, 60), 0);
    SHELL("cp %s/other2/buffers.safetensors %s/other/", dir, dir);
    expect_failure("other", 1, "belongs to another checkpoint");
    /* the export checks the same, and names the file */
    char cut[256], out[256];
    snprintf(cut, sizeof cut, "%s/cut", dir);
    snprintf(out, sizeof out, "%s/bad.safetensors", dir);
    assert_int_equal(ddp_zero_checkpoint_export(cut, out), DDP_ERR_FORMAT);
    assert_non_null(strstr(ddp_last_error(), "the buffers file of the index"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        IN_SCRATCH(test_export_and_load),
        IN_SCRATCH(test_bad_buffers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
