/* Tests of ZeRO (include/ddp/zero.h) with real processes on loopback:
 * stage 1 against plain DDP on the same samples (SGD with momentum, Adam,
 * AdamW; 2, 3 and 4 ranks: the in-place all-gather and, on 3, the short
 * last shard's broadcasts), bitwise; stage 2 (no DDP: the reducer's
 * reduce-scatter) against DDP, bitwise on 2 ranks and within 1e-6 on 3
 * and 4; stage 2 accumulating over backwards without a zero_grad; a failed
 * stage-2 create losing nothing; the state per rank; sharded checkpoints saved on 4 ranks and
 * loaded on 1, 2 and 3 (and on 2 at stage 2) with the optimizer state
 * bitwise the saved one; the consolidated export read back by
 * ddp_model_load_safetensors; missing, damaged, foreign and mismatched
 * files failing every rank with nothing loaded. */
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
#include <unistd.h>

#include "base/error.h"
#include "ddp.h"
#include "ddp/ext.h"
#include "fork_children.h"
#include "scratch_dir.h"

#define IN 12
#define HID 24
#define OUT 5
#define B 6 /* per-rank batch */

enum { OPT_SGD, OPT_ADAM, OPT_ADAMW };

/* Sequential(Linear(12,h), ReLU, Linear(h,5)), seeded. */
static int make_model(int hidden, ddp_model_t **out)
{
    ddp_module_t *mods[3];
    DDP_TRY(ddp_linear_create(IN, hidden, 1, 7, &mods[0]));
    DDP_TRY(ddp_relu_create(&mods[1]));
    DDP_TRY(ddp_linear_create(hidden, OUT, 1, 8, &mods[2]));
    ddp_module_t *seq;
    DDP_TRY(ddp_sequential_create(mods, 3, &seq));
    return ddp_model_from_module(seq, out);
}

static int make_optim(int kind, ddp_model_t *m, ddp_optim_t **out)
{
    if (kind == OPT_SGD) {
        ddp_sgd_options o = ddp_sgd_defaults(0.05);
        o.momentum = 0.9;
        o.weight_decay = 1e-3;
        return ddp_sgd_create(m, &o, out);
    }
    ddp_adam_options o = kind == OPT_ADAM ? ddp_adam_defaults() : ddp_adamw_defaults();
    o.lr = 1e-2;
    return kind == OPT_ADAM ? ddp_adam_create(m, &o, out) : ddp_adamw_create(m, &o, out);
}

/* One step's loss on samples [first, first + n): x_ij = cos(0.29 i - 0.13 j). */
static int loss_of(ddp_data_parallel_t *dm, ddp_model_t *m, ddp_tape_t *tape, int64_t first,
                   ddp_var_t **loss)
{
    static float xs[B * IN];
    static int64_t labels[B];
    for (int i = 0; i < B; i++) {
        for (int j = 0; j < IN; j++)
            xs[i * IN + j] = (float)cos(0.29 * (double)(first + i) - 0.13 * j);
        labels[i] = (first + i) % OUT;
    }
    ddp_tensor t;
    DDP_TRY(ddp_tensor_wrap(&t, xs, 2, (int64_t[]){B, IN}));
    ddp_tape_reset(tape);
    ddp_var_t *x, *y;
    DDP_TRY(ddp_tape_input(tape, &t, 0, &x));
    DDP_TRY(dm ? ddp_data_parallel_forward(dm, tape, x, &y) : ddp_model_forward(m, tape, x, &y));
    return ddp_op_cross_entropy(tape, y, labels, loss);
}

static int save_floats(const char *name, int rank, const float *v, size_t n)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s.%d", dir, name, rank);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(v, sizeof *v, n, f) != n)
        return -1;
    return fclose(f);
}

/* Files name.0 .. name.(world-1) concatenated (the ranks' shards in order),
 * or one file's n floats when world is 0 (rank 0's). */
static float *load_floats(const char *name, int world, size_t n)
{
    float *v = malloc(n * sizeof *v);
    size_t at = 0;
    for (int r = 0; r < (world ? world : 1); r++) {
        char path[256];
        snprintf(path, sizeof path, "%s/%s.%d", dir, name, r);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        at += fread(v + at, sizeof *v, n - at, f);
        fclose(f);
    }
    assert_int_equal(at, n);
    return v;
}

/* The whole file name.rank, NUL-terminated (caller frees). */
static void *load_floats_any(const char *name, int rank)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s.%d", dir, name, rank);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char *buf = calloc(1, 4096);
    assert_true(fread(buf, 1, 4095, f) > 0);
    fclose(f);
    return buf;
}

/* ==== a rank ============================================================== */

typedef struct {
    int world, zero, optim, steps, hidden;
    int pool; /* stage 2: the reducer's pool buffers (0: its default) */
    const char *tag, *out;
    const char *save_dir;   /* save after the steps */
    const char *load_dir;   /* load before the steps */
    const char *expect_err; /* the load must fail with this in its message */
} zcase;

typedef struct {
    ddp_pg_t *pg;
    ddp_model_t *m;
    ddp_tape_t *tape;
    ddp_data_parallel_t *dm;
    ddp_zero_t *z;
    ddp_optim_t *opt;
} kit;

static void kit_close(kit *k)
{
    ddp_optim_destroy(k->opt);
    ddp_zero_destroy(k->z);
    ddp_data_parallel_destroy(k->dm);
    ddp_tape_destroy(k->tape);
    ddp_model_destroy(k->m);
    ddp_destroy_process_group(k->pg);
}

static int kit_open(kit *k, const zcase *c, int rank)
{
    memset(k, 0, sizeof *k);
    char url[256];
    snprintf(url, sizeof url, "file://%s/store-%s", dir, c->tag);
    DDP_TRY(ddp_init_process_group("tcp", url, rank, c->world, 20.0, &k->pg));
    DDP_TRY(make_model(c->hidden ? c->hidden : HID, &k->m));
    DDP_TRY(ddp_tape_create(&k->tape));
    ddp_data_parallel_options o = ddp_data_parallel_defaults();
    o.bucket_cap_mb = o.first_bucket_cap_mb = 1.0 / 1024; /* several buckets */
    if (c->zero != 2) /* stage 2 reduces the gradients itself */
        DDP_TRY(ddp_data_parallel_create(k->m, k->pg, &o, &k->dm));
    if (!c->zero)
        return make_optim(c->optim, k->m, &k->opt);
    ddp_zero_options zo = ddp_zero_defaults();
    zo.stage = c->zero;
    zo.pool_buffers = c->pool;
    DDP_TRY(ddp_zero_create(k->m, k->pg, &zo, &k->z));
    return make_optim(c->optim, ddp_zero_shard_model(k->z), &k->opt);
}

/* This rank's shard of the optimizer state, state after state. */
static int save_state(const char *name, const kit *k, int rank)
{
    int ns = ddp_optim_num_states(k->opt);
    size_t b, e;
    ddp_zero_shard_range(k->z, &b, &e);
    float *all = malloc((size_t)(ns ? ns : 1) * (e - b + 1) * sizeof *all);
    for (int s = 0; s < ns; s++) {
        float *d;
        size_t n;
        if (ddp_optim_state(k->opt, s, NULL, &d, &n) < 0 || n != e - b)
            return -1;
        memcpy(all + (size_t)s * n, d, n * sizeof *d);
    }
    int rc = save_floats(name, rank, all, (size_t)ns * (e - b));
    free(all);
    return rc;
}

static int zero_rank(int rank, void *arg)
{
    const zcase *c = arg;
    kit k;
    CHILD_CHECK(kit_open(&k, c, rank) == 0);
    size_t n;
    float *params = ddp_model_param_block(k.m, &n);
    if (c->load_dir) {
        float *before = malloc(n * sizeof *before);
        memcpy(before, params, n * sizeof *before);
        ddp_train_state st;
        int rc = ddp_zero_checkpoint_load(c->load_dir, k.z, k.opt, &st);
        if (c->expect_err) { /* failed on every rank, nothing changed */
            const char *msg = ddp_last_error();
            CHILD_CHECK(rc < 0);
            CHILD_CHECK(save_floats("err", rank, (const float *)msg, (strlen(msg) + 4) / 4) == 0);
            CHILD_CHECK(memcmp(before, params, n * sizeof *before) == 0);
            CHILD_CHECK(ddp_optim_steps(k.opt) == 0);
            free(before);
            kit_close(&k);
            return 0;
        }
        free(before);
        CHILD_CHECK(rc == 0 && st.global_step == 4 && st.world_size == 4 && st.seed == 11);
        CHILD_CHECK(save_state("loaded-state", &k, rank) == 0);
    }
    for (int s = 0; s < c->steps; s++) {
        ddp_var_t *loss;
        ddp_optim_zero_grad(k.opt);
        if (c->zero == 1) /* the real gradients: the shard model's are views */
            ddp_model_zero_grad(k.m);
        CHILD_CHECK(loss_of(k.dm, k.m, k.tape, ((int64_t)s * c->world + rank) * B, &loss) == 0);
        CHILD_CHECK((k.dm ? ddp_data_parallel_backward(k.dm, k.tape, loss)
                          : ddp_zero_backward(k.z, k.tape, loss)) == 0);
        CHILD_CHECK((c->zero ? ddp_zero_step(k.z, k.opt) : ddp_optim_step(k.opt)) == 0);
    }
    if (c->zero) { /* 1/N of the state, within one shard's rounding */
        size_t b, e, full = (size_t)ddp_optim_num_states(k.opt) * n * sizeof(float);
        ddp_zero_shard_range(k.z, &b, &e);
        CHILD_CHECK(ddp_zero_state_bytes(k.z, k.opt) * (size_t)c->world <= full + 64 * c->world);
    }
    if (c->save_dir) {
        ddp_train_state st = {.epoch = 1, .step = 2, .global_step = c->steps, .seed = 11};
        CHILD_CHECK(ddp_zero_checkpoint_save(c->save_dir, k.z, k.opt, &st) == 0);
        CHILD_CHECK(save_state("saved-state", &k, rank) == 0);
    }
    CHILD_CHECK(save_floats(c->out, rank, params, n) == 0);
    kit_close(&k);
    return 0;
}

static size_t model_numel(int hidden)
{
    return (size_t)(IN * hidden + hidden + hidden * OUT + OUT);
}

/* Runs c; every rank's parameters are bitwise equal; returns rank 0's. */
static float *run_case(zcase *c)
{
    assert_int_equal(run_children(c->world, zero_rank, c, 60), 0);
    size_t n = model_numel(c->hidden ? c->hidden : HID);
    float *p0 = load_floats(c->out, 0, n);
    for (int r = 1; r < c->world; r++) {
        char name[64];
        snprintf(name, sizeof name, "%s", c->out);
        FILE *f;
        char path[256];
        snprintf(path, sizeof path, "%s/%s.%d", dir, name, r);
        assert_non_null(f = fopen(path, "rb"));
        float *pr = malloc(n * sizeof *pr);
        assert_int_equal(fread(pr, sizeof *pr, n, f), n);
        fclose(f);
        assert_memory_equal(p0, pr, n * sizeof *p0);
        free(pr);
    }
    return p0;
}

/* ==== against DDP ========================================================= */

/* max |a - b| / max |a| */
static double rel_diff(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num = fmax(num, fabs((double)a[i] - b[i]));
        den = fmax(den, fabs((double)a[i]));
    }
    return num / (den > 0 ? den : 1);
}

/* Optimizers first..last on 2, 3 and 4 ranks, plain DDP and ZeRO `stage`
 * from the same start on the same samples: bitwise equal when `bitwise`
 * says so for that world size, else within 1e-6. */
static void against_ddp(int stage, int first, int last, int (*bitwise)(int world))
{
    const char *names[] = {"sgd", "adam", "adamw"};
    size_t n = model_numel(HID);
    for (int world = 2; world <= 4; world++) {
        for (int o = first; o <= last; o++) {
            char t1[32], t2[32];
            snprintf(t1, sizeof t1, "ddp%d-%d-%d", stage, world, o);
            snprintf(t2, sizeof t2, "z%d-%d-%d", stage, world, o);
            zcase ref = {.world = world, .optim = o, .steps = 8, .tag = t1, .out = t1};
            zcase z = {.world = world, .zero = stage, .optim = o, .steps = 8, .tag = t2, .out = t2};
            float *a = run_case(&ref), *b = run_case(&z);
            double d = rel_diff(a, b, n);
            print_message("stage %d, %d ranks, %s: relative difference %.3g\n", stage, world,
                          names[o], d);
            if (bitwise(world) ? memcmp(a, b, n * sizeof *a) != 0 : d > 1e-6)
                fail_msg("ZeRO-%d %s on %d ranks differs from DDP by %.3g", stage, names[o], world,
                         d);
            free(a);
            free(b);
        }
    }
}

/* Stage 1: the same all-reduced gradients, the same element-wise update:
 * bitwise (docs/zero.md). */
static int always(int world) { return world > 0; }

static void test_stage1_equals_ddp(void **state)
{
    (void)state;
    against_ddp(1, OPT_SGD, OPT_ADAMW, always);
}

/* Stage 2: the gradients reduced by the reducer's reduce-scatter instead of
 * DDP's all-reduce.  On 2 ranks both add the same two numbers (a + b = b +
 * a) and halve them: bitwise.  On more, the two orders of summation differ
 * in the last bits: within 1e-6. */
static int two_ranks(int world) { return world == 2; }

static void test_stage2_equals_ddp(void **state)
{
    (void)state;
    against_ddp(2, OPT_SGD, OPT_ADAM, two_ranks);
}

/* A one-buffer pool only makes backward wait for each bucket's reduction:
 * the same reductions in the same order, so the same bits as the default
 * pool's. */
static void test_stage2_pool_of_one(void **state)
{
    (void)state;
    size_t n = model_numel(HID);
    zcase two = {.world = 3, .zero = 2, .optim = OPT_ADAM, .steps = 6, .tag = "p2", .out = "p2"};
    zcase one = two;
    one.pool = 1, one.tag = one.out = "p1";
    float *a = run_case(&two), *b = run_case(&one);
    assert_memory_equal(a, b, n * sizeof *a);
    free(a);
    free(b);
}

/* This rank's shard of the averaged gradient (the shard model's gradients,
 * in order) into out. */
static void shard_grads(ddp_zero_t *z, float *out)
{
    ddp_model_t *sm = ddp_zero_shard_model(z);
    size_t off = 0;
    for (size_t i = 0; i < ddp_model_num_params(sm); i++) {
        ddp_param *p = ddp_model_param(sm, i);
        memcpy(out + off, p->grad, p->numel * sizeof(float));
        off += p->numel;
    }
}

/* Stage 2 accumulates as p->grad does: a second backward on the same
 * samples without a zero_grad doubles the shard (the first pass after a
 * zero_grad writes its averages, the second adds them), and after the
 * optimizer's zero_grad the next pass gives the first one's bits again. */
static int accum_rank(int rank, void *arg)
{
    const zcase *c = arg;
    kit k;
    CHILD_CHECK(kit_open(&k, c, rank) == 0);
    size_t b, e;
    ddp_zero_shard_range(k.z, &b, &e);
    size_t n = e - b;
    float *g1 = calloc(n + 1, sizeof *g1), *g = calloc(n + 1, sizeof *g);
    CHILD_CHECK(g1 && g);
    ddp_var_t *loss;
    for (int pass = 0; pass < 3; pass++) {
        if (pass == 2)
            ddp_optim_zero_grad(k.opt);
        CHILD_CHECK(loss_of(NULL, k.m, k.tape, (int64_t)rank * B, &loss) == 0);
        CHILD_CHECK(ddp_zero_backward(k.z, k.tape, loss) == 0);
        shard_grads(k.z, pass == 0 ? g1 : g);
        for (size_t i = 0; pass > 0 && i < n; i++)
            CHILD_CHECK(g[i] == (pass == 1 ? 2.0f * g1[i] : g1[i]));
    }
    size_t nonzero = 0;
    for (size_t i = 0; i < n; i++)
        nonzero += g1[i] != 0.0f;
    CHILD_CHECK(n == 0 || nonzero > 0); /* something was averaged */
    free(g1);
    free(g);
    kit_close(&k);
    return 0;
}

static void test_stage2_accumulates(void **state)
{
    (void)state;
    zcase c = {.world = 3, .zero = 2, .optim = OPT_ADAM, .tag = "acc"};
    assert_int_equal(run_children(3, accum_rank, &c, 60), 0);
}

static void test_bad_use(void **state)
{
    (void)state;
    ddp_pg_t *pg;
    char url[256];
    snprintf(url, sizeof url, "file://%s/store-bad", dir);
    assert_int_equal(ddp_init_process_group("tcp", url, 0, 1, 5.0, &pg), 0);
    ddp_model_t *m;
    assert_int_equal(make_model(HID, &m), 0);
    ddp_zero_t *z;
    ddp_zero_options o = {.stage = 3};
    assert_int_equal(ddp_zero_create(m, pg, &o, &z), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "stage 3 is not 1 or 2"));
    o = (ddp_zero_options){.stage = 2, .pool_buffers = -1};
    assert_int_equal(ddp_zero_create(m, pg, &o, &z), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "pool_buffers -1 is negative"));
    o = (ddp_zero_options){.stage = 2};
    assert_int_equal(ddp_zero_create(m, pg, &o, &z), 0);
    ddp_optim_t *opt;
    assert_int_equal(make_optim(OPT_ADAM, ddp_zero_shard_model(z), &opt), 0);
    ddp_optim_destroy(opt);
    ddp_zero_destroy(z);
    assert_int_equal(ddp_zero_create(m, pg, NULL, &z), 0);
    ddp_tape_t *tape;
    assert_int_equal(ddp_tape_create(&tape), 0);
    assert_int_equal(ddp_zero_backward(z, tape, (ddp_var_t *)tape), DDP_ERR_STATE);
    assert_non_null(strstr(ddp_last_error(), "at stage 1 DDP's backward"));
    ddp_tape_destroy(tape);
    ddp_zero_destroy(z);
    ddp_zero_destroy(NULL);
    ddp_model_destroy(m);
    ddp_destroy_process_group(pg);
}

/* A stage-2 create that fails (here: the ranks hold different models) loses
 * nothing: every rank's gradients and parameters are as they were (the
 * gradient block, handed back to the kernel by a create that succeeds,
 * would read as zeros). */
static int mismatched_rank(int rank, void *arg)
{
    (void)arg;
    char url[256];
    snprintf(url, sizeof url, "file://%s/store-mismatch", dir);
    ddp_pg_t *pg;
    ddp_model_t *m;
    CHILD_CHECK(ddp_init_process_group("tcp", url, rank, 2, 20.0, &pg) == 0);
    CHILD_CHECK(make_model(2000 + rank, &m) == 0); /* gradients over many whole pages */
    size_t n;
    float *g = ddp_model_grad_block(m, &n), *p = ddp_model_param_block(m, NULL);
    float *before = malloc(n * sizeof *before);
    for (size_t i = 0; i < n; i++)
        g[i] = 1.5f + (float)i;
    memcpy(before, p, n * sizeof *p);
    ddp_zero_options o = ddp_zero_defaults();
    o.stage = 2;
    ddp_zero_t *z = NULL;
    CHILD_CHECK(ddp_zero_create(m, pg, &o, &z) == DDP_ERR_MISMATCH && !z);
    CHILD_CHECK(strstr(ddp_last_error(), "rank") != NULL);
    for (size_t i = 0; i < n; i++)
        CHILD_CHECK(g[i] == 1.5f + (float)i);
    CHILD_CHECK(memcmp(before, p, n * sizeof *p) == 0);
    free(before);
    ddp_model_destroy(m);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_stage2_failed_create(void **state)
{
    (void)state;
    assert_int_equal(run_children(2, mismatched_rank, NULL, 60), 0);
}

/* ==== sharded checkpoints ================================================= */

static void save_on_4(const char *sub, int steps)
{
    char path[256], tag[32];
    snprintf(path, sizeof path, "%s/%s", dir, sub);
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(tag, sizeof tag, "save-%s", sub);
    zcase c = {.world = 4, .zero = 1, .optim = OPT_ADAM, .steps = steps, .tag = tag,
               .out = "saved-params", .save_dir = path};
    free(run_case(&c));
}

static void test_reshard(void **state)
{
    (void)state;
    save_on_4("ck", 4);
    char ck[256];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    size_t n = model_numel(HID);
    float *saved_state = load_floats("saved-state", 4, 2 * n); /* exp_avg, exp_avg_sq */
    float *saved_params = load_floats("saved-params", 0, n);
    for (int k = 0; k < 4; k++) { /* 1, 2, 3 ranks at stage 1; 2 at stage 2 */
        int world = k < 3 ? k + 1 : 2, stage = k < 3 ? 1 : 2;
        char tag[32];
        snprintf(tag, sizeof tag, "load-%d-%d", world, stage);
        zcase c = {.world = world, .zero = stage, .optim = OPT_ADAM, .tag = tag, .out = "loaded",
                   .load_dir = ck};
        float *p = run_case(&c);
        assert_memory_equal(p, saved_params, n * sizeof *p);
        /* the ranks' state shards, state after state, back in flat order */
        float *loaded = load_floats("loaded-state", world, 2 * n);
        float *flat = malloc(2 * n * sizeof *flat);
        size_t at = 0;
        for (int r = 0; r < world; r++) {
            size_t S = (n + (size_t)world - 1) / (size_t)world, b = r * S;
            size_t len = b >= n ? 0 : b + S > n ? n - b : S;
            for (int s = 0; s < 2; s++)
                memcpy(flat + (size_t)s * n + b, loaded + at + (size_t)s * len,
                       len * sizeof *flat);
            at += 2 * len;
        }
        float *sflat = malloc(2 * n * sizeof *sflat);
        at = 0;
        for (int r = 0; r < 4; r++) {
            size_t S = (n + 3) / 4, b = r * S, len = b + S > n ? n - b : S;
            for (int s = 0; s < 2; s++)
                memcpy(sflat + (size_t)s * n + b, saved_state + at + (size_t)s * len,
                       len * sizeof *sflat);
            at += 2 * len;
        }
        if (memcmp(flat, sflat, 2 * n * sizeof *flat) != 0)
            fail_msg("the optimizer state loaded on %d ranks (stage %d) differs from the one "
                     "saved on 4", world, stage);
        free(flat);
        free(sflat);
        free(loaded);
        free(p);
    }
    /* the consolidated file: an ordinary model file */
    char out[256];
    snprintf(out, sizeof out, "%s/model.safetensors", dir);
    assert_int_equal(ddp_zero_checkpoint_export(ck, out), 0);
    ddp_model_t *m;
    assert_int_equal(make_model(HID, &m), 0);
    assert_int_equal(ddp_model_load_safetensors(m, out), 0);
    assert_memory_equal(ddp_model_param_block(m, NULL), saved_params, n * sizeof(float));
    ddp_model_destroy(m);
    free(saved_state);
    free(saved_params);
}

/* A load of dir on 2 ranks that must fail on both with nothing changed:
 * a rank that found the problem says msg, the other names that rank. */
static void expect_load_failure(const char *sub, const char *msg, int hidden)
{
    char path[256], tag[64];
    snprintf(path, sizeof path, "%s/%s", dir, sub);
    snprintf(tag, sizeof tag, "bad-%s-%d", sub, hidden);
    zcase c = {.world = 2, .zero = 1, .optim = OPT_ADAM, .tag = tag, .out = "bad",
               .load_dir = path, .expect_err = msg, .hidden = hidden};
    assert_int_equal(run_children(2, zero_rank, &c, 60), 0);
    int found = 0;
    for (int r = 0; r < 2; r++) {
        char *e = (char *)load_floats_any("err", r);
        found |= strstr(e, msg) != NULL;
        if (!strstr(e, msg) && !strstr(e, "failed ("))
            fail_msg("%s: rank %d: unexpected message: %s", sub, r, e);
        free(e);
    }
    if (!found)
        fail_msg("%s: no rank said \"%s\"", sub, msg);
}

#define SHELL(...)                                            \
    do {                                                      \
        char cmd_[1024];                                      \
        snprintf(cmd_, sizeof cmd_, __VA_ARGS__);             \
        assert_int_equal(system(cmd_), 0);                    \
    } while (0)

static void test_bad_checkpoints(void **state)
{
    (void)state;
    save_on_4("a", 4);
    save_on_4("b", 5);
    /* a missing shard: rank 1 (shards 2, 3) names it, rank 0 names rank 1 */
    SHELL("cp -r %s/a %s/missing && rm %s/missing/shard-00002-of-00004.safetensors", dir, dir,
          dir);
    expect_load_failure("missing", "shard 2 of the index", 0);
    /* the index names a shard that is not there */
    SHELL("cp -r %s/a %s/renamed && sed -i 's/shard-00001-of/shard-00009-of/' "
          "%s/renamed/index.json",
          dir, dir, dir);
    expect_load_failure("renamed", "shard 1 of the index", 0);
    /* a damaged shard */
    SHELL("cp -r %s/a %s/cut && truncate -s 100 %s/cut/shard-00000-of-00004.safetensors", dir,
          dir, dir);
    expect_load_failure("cut", "shard 0 of the index", 0);
    /* a shard of another save (step 5) */
    SHELL("cp -r %s/a %s/mixed && cp %s/b/shard-00003-of-00004.safetensors %s/mixed/", dir, dir,
          dir, dir);
    expect_load_failure("mixed", "belongs to another checkpoint", 0);
    /* a model of another shape */
    expect_load_failure("a", "holds 4 tensors of 437 values, the model 4 of", 16);
    /* no index at all */
    SHELL("mkdir %s/empty", dir);
    expect_load_failure("empty", "index.json", 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        IN_SCRATCH(test_stage1_equals_ddp),
        IN_SCRATCH(test_stage2_equals_ddp),
        IN_SCRATCH(test_stage2_pool_of_one),
        IN_SCRATCH(test_stage2_accumulates),
        IN_SCRATCH(test_bad_use),
        IN_SCRATCH(test_stage2_failed_create),
        IN_SCRATCH(test_reshard),
        IN_SCRATCH(test_bad_checkpoints),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
