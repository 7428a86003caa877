/* Tests of training checkpoints: exact round trip of model (parameters and
 * buffers), optimizer state and position (training continues bitwise identically), and every way a
 * load can fail without changing anything. */
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

static char path[64];

static ddp_model_t *model(int hidden)
{
    ddp_module_t *mods[3];
    assert_int_equal(ddp_linear_create(6, hidden, 1, 1, &mods[0]), 0);
    assert_int_equal(ddp_relu_create(&mods[1]), 0);
    assert_int_equal(ddp_linear_create(hidden, 3, 1, 2, &mods[2]), 0);
    ddp_module_t *seq;
    assert_int_equal(ddp_sequential_create(mods, 3, &seq), 0);
    ddp_model_t *m;
    assert_int_equal(ddp_model_from_module(seq, &m), 0);
    return m;
}

static ddp_optim_t *sgd(ddp_model_t *m, double momentum)
{
    ddp_sgd_options o = ddp_sgd_defaults(0.05);
    o.momentum = momentum;
    ddp_optim_t *opt;
    assert_int_equal(ddp_sgd_create(m, &o, &opt), 0);
    return opt;
}

static void train(ddp_model_t *m, ddp_optim_t *opt, int steps, int first)
{
    ddp_tape_t *tape;
    assert_int_equal(ddp_tape_create(&tape), 0);
    float xs[4 * 6];
    int64_t labels[4];
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < 24; i++)
            xs[i] = (float)sin(0.3 * (first + s) + 0.7 * i);
        for (int i = 0; i < 4; i++)
            labels[i] = (first + s + i) % 3;
        ddp_tensor t;
        assert_int_equal(ddp_tensor_wrap(&t, xs, 2, (int64_t[]){4, 6}), 0);
        ddp_var_t *x, *y, *loss;
        ddp_tape_reset(tape);
        assert_int_equal(ddp_tape_input(tape, &t, 0, &x), 0);
        assert_int_equal(ddp_model_forward(m, tape, x, &y), 0);
        assert_int_equal(ddp_op_cross_entropy(tape, y, labels, &loss), 0);
        ddp_optim_zero_grad(opt);
        assert_int_equal(ddp_tape_backward(tape, loss, m), 0);
        assert_int_equal(ddp_optim_step(opt), 0);
    }
    ddp_tape_destroy(tape);
}

static int setup(void **state)
{
    (void)state;
    snprintf(path, sizeof path, "/tmp/ddp-ckpt-%d.safetensors", (int)getpid());
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(path);
    return 0;
}

static void test_round_trip_resumes_exactly(void **state)
{
    (void)state;
    ddp_model_t *a = model(8), *b = model(8);
    ddp_optim_t *oa = sgd(a, 0.9), *ob = sgd(b, 0.9);
    assert_int_equal(ddp_model_reset_parameters(b, 77), 0);
    train(a, oa, 3, 0);
    ddp_train_state st = {.epoch = 2, .step = 17, .global_step = 3, .seed = 1234567890123ULL,
                          .world_size = 4};
    assert_int_equal(ddp_checkpoint_save(path, a, oa, &st), 0);
    ddp_train_state got;
    uint64_t version = ddp_model_param_version(b);
    assert_int_equal(ddp_checkpoint_load(path, b, ob, &got), 0);
    assert_true(ddp_model_param_version(b) != version); /* the parameters were written */
    assert_int_equal(got.epoch, st.epoch);
    assert_int_equal(got.step, st.step);
    assert_int_equal(got.global_step, st.global_step);
    assert_true(got.seed == st.seed);
    assert_int_equal(got.world_size, st.world_size);
    assert_int_equal(ddp_optim_steps(ob), 3);
    /* Both continue: bitwise the same parameters and momentum. */
    train(a, oa, 2, 3);
    train(b, ob, 2, 3);
    size_t n;
    const float *pa = ddp_model_param_block(a, &n), *pb = ddp_model_param_block(b, &n);
    assert_memory_equal(pa, pb, n * sizeof *pa);
    const char *name;
    float *ma, *mb;
    assert_int_equal(ddp_optim_state(oa, 0, &name, &ma, &n), 0);
    assert_int_equal(ddp_optim_state(ob, 0, &name, &mb, &n), 0);
    assert_string_equal(name, "momentum_buffer");
    assert_memory_equal(ma, mb, n * sizeof *ma);
    ddp_optim_destroy(oa);
    ddp_optim_destroy(ob);
    ddp_model_destroy(a);
    ddp_model_destroy(b);
}

static void test_mismatches_change_nothing(void **state)
{
    (void)state;
    ddp_model_t *a = model(8), *wide = model(9);
    ddp_optim_t *plain = sgd(a, 0), *mom = sgd(wide, 0.9);
    ddp_train_state st = {.world_size = 1};
    assert_int_equal(ddp_checkpoint_save(path, a, plain, &st), 0);
    size_t n;
    const float *p = ddp_model_param_block(wide, &n);
    float *before = malloc(n * sizeof *before);
    memcpy(before, p, n * sizeof *before);
    uint64_t version = ddp_model_param_version(wide);
    assert_int_equal(ddp_checkpoint_load(path, wide, NULL, NULL), DDP_ERR_MISMATCH);
    assert_non_null(strstr(ddp_last_error(), "0.weight has shape (8, 6) in the file, (9, 6) here"));
    assert_memory_equal(before, p, n * sizeof *before);
    assert_true(ddp_model_param_version(wide) == version);
    /* Right model, but an optimizer with state the file lacks. */
    ddp_model_t *c = model(8);
    ddp_optim_t *oc = sgd(c, 0.9);
    assert_int_equal(ddp_checkpoint_load(path, c, oc, NULL), DDP_ERR_MISMATCH);
    assert_non_null(strstr(ddp_last_error(), "missing optimizer.momentum_buffer"));
    free(before);
    ddp_optim_destroy(plain);
    ddp_optim_destroy(mom);
    ddp_optim_destroy(oc);
    ddp_model_destroy(a);
    ddp_model_destroy(wide);
    ddp_model_destroy(c);
}

static void test_missing_and_damaged_files(void **state)
{
    (void)state;
    ddp_model_t *a = model(8);
    assert_int_equal(ddp_checkpoint_load("/nonexistent/ckpt", a, NULL, NULL), DDP_ERR_NOT_FOUND);
    assert_non_null(strstr(ddp_last_error(), "/nonexistent/ckpt"));
    ddp_train_state bad = {.epoch = -1, .world_size = 1};
    assert_int_equal(ddp_checkpoint_save(path, a, NULL, &bad), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "position must be >= 0"));
    ddp_train_state st = {.world_size = 1};
    assert_int_equal(ddp_checkpoint_save(path, a, NULL, &st), 0);
    assert_int_equal(truncate(path, 100), 0);
    assert_int_equal(ddp_checkpoint_load(path, a, NULL, NULL), DDP_ERR_FORMAT);
    /* A plain model file (ddp-mnist --save) has no training position. */
    assert_int_equal(ddp_model_save_safetensors(a, path), 0);
    assert_int_equal(ddp_checkpoint_load(path, a, NULL, NULL), DDP_ERR_FORMAT);
    assert_non_null(strstr(ddp_last_error(), "no libddp.epoch in __metadata__"));
    ddp_model_destroy(a);
}

/* Buffers travel with the model: BatchNorm's running statistics and its
 * int64 step count come back, and a checkpoint of a model with other
 * buffers is refused naming the buffer. */
static void test_buffers_round_trip(void **state)
{
    (void)state;
    ddp_module_t *mods[3], *seq;
    ddp_batchnorm_options bo = ddp_batchnorm_defaults(4);
    assert_int_equal(ddp_linear_create(6, 4, 1, 1, &mods[0]), 0);
    assert_int_equal(ddp_batchnorm1d_create(&bo, &mods[1]), 0);
    assert_int_equal(ddp_linear_create(4, 3, 1, 2, &mods[2]), 0);
    assert_int_equal(ddp_sequential_create(mods, 3, &seq), 0);
    ddp_model_t *a, *b;
    assert_int_equal(ddp_model_from_module(seq, &a), 0);
    ddp_optim_t *opt = sgd(a, 0.9);
    train(a, opt, 3, 0);
    ddp_train_state st = {.epoch = 1, .step = 3, .global_step = 3, .seed = 5, .world_size = 1};
    assert_int_equal(ddp_checkpoint_save(path, a, opt, &st), 0);
    assert_int_equal(ddp_linear_create(6, 4, 1, 9, &mods[0]), 0);
    assert_int_equal(ddp_batchnorm1d_create(&bo, &mods[1]), 0);
    assert_int_equal(ddp_linear_create(4, 3, 1, 9, &mods[2]), 0);
    assert_int_equal(ddp_sequential_create(mods, 3, &seq), 0);
    assert_int_equal(ddp_model_from_module(seq, &b), 0);
    assert_int_equal(ddp_checkpoint_load(path, b, NULL, NULL), 0);
    size_t na, nb;
    void *ba = ddp_model_buffer_block(a, &na), *bb = ddp_model_buffer_block(b, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(ba, bb, na);
    assert_int_equal(*(int64_t *)ddp_model_find_buffer(b, "1.num_batches_tracked")->data, 3);
    /* The same parameters, but a BatchNorm without running statistics. */
    bo.track_running_stats = 0;
    assert_int_equal(ddp_linear_create(6, 4, 1, 9, &mods[0]), 0);
    assert_int_equal(ddp_batchnorm1d_create(&bo, &mods[1]), 0);
    assert_int_equal(ddp_linear_create(4, 3, 1, 9, &mods[2]), 0);
    assert_int_equal(ddp_sequential_create(mods, 3, &seq), 0);
    ddp_model_t *untracked;
    assert_int_equal(ddp_model_from_module(seq, &untracked), 0);
    assert_int_equal(ddp_checkpoint_save(path, untracked, NULL, &st), 0);
    assert_int_equal(ddp_checkpoint_load(path, b, NULL, NULL), DDP_ERR_MISMATCH);
    assert_non_null(strstr(ddp_last_error(), "missing 1.running_mean"));
    assert_memory_equal(ba, bb, na); /* nothing changed */
    ddp_model_destroy(untracked);
    ddp_optim_destroy(opt);
    ddp_model_destroy(a);
    ddp_model_destroy(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip_resumes_exactly, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mismatches_change_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_and_damaged_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_buffers_round_trip, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
