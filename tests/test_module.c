/* User modules: a ResNet-like network of user modules nested three deep
 * (Linear + BatchNorm1d) against the same network in PyTorch 1.13
 * (tests/fixtures/module_net.py): state_dict, named_parameters and
 * named_modules names and orders, a safetensors file written for torch's
 * model loads and gives torch's outputs in training and evaluation mode, a
 * save/load round trip, train/eval reaching a grandchild, buffers untouched
 * by an optimizer step; module misuse and its messages; torch.nn.init. */
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

#include "base/error.h"
#include "ddp.h"
#include "fixtures/module_net.h"
#include "nn/safetensors.h"

#define TORCH_FILE "tests/fixtures/module_net.safetensors"
#define NNAMES (sizeof net_names / sizeof net_names[0])

/* ==== the network, as PyTorch's Block and Net ============================== */

static int run_child(ddp_module_t *m, const char *name, ddp_tape_t *tape, ddp_var_t *x,
                     ddp_var_t **y)
{
    return ddp_module_forward(ddp_module_child_by_name(m, name), tape, x, y);
}

/* relu(x + bn2(fc2(relu(bn1(fc1(x)))))) */
static int block_forward(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y,
                         void *user)
{
    (void)user;
    ddp_var_t *h, *s;
    DDP_TRY(run_child(m, "fc1", tape, x, &h));
    DDP_TRY(run_child(m, "bn1", tape, h, &h));
    DDP_TRY(ddp_op_relu(tape, h, &h));
    DDP_TRY(run_child(m, "fc2", tape, h, &h));
    DDP_TRY(run_child(m, "bn2", tape, h, &h));
    DDP_TRY(ddp_op_add(tape, x, h, &s));
    return ddp_op_relu(tape, s, y);
}

/* head(layer1(relu(bn(stem(x))))) */
static int net_forward(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y,
                       void *user)
{
    (void)user;
    ddp_var_t *h;
    DDP_TRY(run_child(m, "stem", tape, x, &h));
    DDP_TRY(run_child(m, "bn", tape, h, &h));
    DDP_TRY(ddp_op_relu(tape, h, &h));
    DDP_TRY(run_child(m, "layer1", tape, h, &h));
    return run_child(m, "head", tape, h, y);
}

static const ddp_module_def block_def = {"Block", block_forward, NULL, NULL};
static const ddp_module_def net_def = {"Net", net_forward, NULL, NULL};

static ddp_module_t *linear(int in, int out)
{
    ddp_module_t *l;
    assert_int_equal(ddp_linear_create(in, out, 1, 0, &l), 0);
    return l;
}

static ddp_module_t *bn1d(int c)
{
    ddp_batchnorm_options o = ddp_batchnorm_defaults(c);
    ddp_module_t *b;
    assert_int_equal(ddp_batchnorm1d_create(&o, &b), 0);
    return b;
}

static ddp_module_t *block(int d)
{
    ddp_module_t *b;
    assert_int_equal(ddp_module_create(&block_def, NULL, &b), 0);
    assert_int_equal(ddp_module_add_child(b, "fc1", linear(d, d)), 0);
    assert_int_equal(ddp_module_add_child(b, "bn1", bn1d(d)), 0);
    assert_int_equal(ddp_module_add_child(b, "fc2", linear(d, d)), 0);
    assert_int_equal(ddp_module_add_child(b, "bn2", bn1d(d)), 0);
    return b;
}

static ddp_model_t *make_net_root(ddp_module_t **root)
{
    ddp_module_t *net, *layer1, *blocks[2] = {block(8), block(8)};
    assert_int_equal(ddp_module_create(&net_def, NULL, &net), 0);
    assert_int_equal(ddp_module_add_child(net, "stem", linear(4, 8)), 0);
    assert_int_equal(ddp_module_add_child(net, "bn", bn1d(8)), 0);
    assert_int_equal(ddp_sequential_create(blocks, 2, &layer1), 0);
    assert_int_equal(ddp_module_add_child(net, "layer1", layer1), 0);
    assert_int_equal(ddp_module_add_child(net, "head", linear(8, 3)), 0);
    ddp_model_t *m;
    assert_int_equal(ddp_model_from_module(net, &m), 0);
    if (root)
        *root = net;
    return m;
}

static ddp_model_t *make_net(void) { return make_net_root(NULL); }

static void forward(ddp_model_t *m, ddp_tape_t *tape, float *out)
{
    ddp_tensor t;
    assert_int_equal(ddp_tensor_wrap(&t, (float *)net_x, 2, (int64_t[]){5, 4}), 0);
    ddp_tape_reset(tape);
    ddp_var_t *x, *y;
    assert_int_equal(ddp_tape_input(tape, &t, 0, &x), 0);
    assert_int_equal(ddp_model_forward(m, tape, x, &y), 0);
    assert_int_equal(ddp_var_tensor(y)->numel, 15);
    memcpy(out, ddp_var_tensor(y)->data, 15 * sizeof(float));
}

static void near(const float *got, const float *want, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (fabs((double)got[i] - want[i]) > 1e-5 * (1 + fabs((double)want[i]))) {
            fprintf(stderr, "%s[%zu]: %.9g, PyTorch %.9g\n", what, i, (double)got[i],
                    (double)want[i]);
            fail();
        }
}

/* ==== names ================================================================ */

typedef struct seen {
    size_t n;
    char names[64][DDP_PARAM_NAME_MAX];
} seen;

static int record(ddp_module_t *m, const char *name, void *user)
{
    (void)m;
    seen *s = user;
    if (s->n < 64)
        snprintf(s->names[s->n], DDP_PARAM_NAME_MAX, "%s", name);
    s->n++;
    return 0;
}

static void test_state_dict_names(void **state)
{
    (void)state;
    ddp_model_t *m = make_net();
    /* named_parameters: the flat blocks' order. */
    size_t np = sizeof net_param_names / sizeof net_param_names[0], off = 0;
    assert_int_equal(ddp_model_num_params(m), np);
    for (size_t i = 0; i < np; i++) {
        ddp_param *p = ddp_model_param(m, i);
        assert_string_equal(p->name, net_param_names[i]);
        assert_int_equal(p->offset, off);
        off += p->numel;
    }
    size_t numel;
    ddp_model_param_block(m, &numel);
    assert_int_equal(numel, off);
    /* named_modules, parents first. */
    seen s = {0};
    assert_int_equal(ddp_model_visit_modules(m, record, &s), 0);
    assert_int_equal(s.n, sizeof net_module_names / sizeof net_module_names[0]);
    for (size_t i = 0; i < s.n; i++)
        assert_string_equal(s.names[i], net_module_names[i]);
    /* state_dict: the order a saved file's header lists. */
    char path[] = "/tmp/ddp-test-module-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(ddp_model_save_safetensors(m, path), 0);
    ddp__st_file f;
    assert_int_equal(ddp__st_read(path, &f), 0);
    assert_int_equal(f.n, NNAMES);
    for (size_t i = 0; i < NNAMES; i++) {
        assert_string_equal(f.entries[i].name, net_names[i]);
        int nbt = strstr(net_names[i], "num_batches_tracked") != NULL;
        assert_string_equal(f.entries[i].dtype, nbt ? "I64" : "F32");
        if (nbt)
            assert_int_equal(f.entries[i].ndim, 0);
    }
    ddp__st_close(&f);
    unlink(path);
    assert_int_equal(ddp_model_num_buffers(m), 15);
    assert_non_null(ddp_model_find_buffer(m, "layer1.1.bn2.num_batches_tracked"));
    assert_null(ddp_model_find_param(m, "layer1.1.bn2.running_mean"));
    ddp_model_destroy(m);
}

/* torch's file loads, and the network computes torch's outputs: a training
 * forward (batch statistics, running statistics updated) then evaluation. */
static void test_torch_file_and_outputs(void **state)
{
    (void)state;
    ddp_model_t *m = make_net();
    assert_int_equal(ddp_model_load_safetensors(m, TORCH_FILE), 0);
    ddp_buffer *nbt = ddp_model_find_buffer(m, "bn.num_batches_tracked");
    assert_int_equal(*(int64_t *)nbt->data, 7);
    ddp_tape_t *tape;
    assert_int_equal(ddp_tape_create(&tape), 0);
    float y[15];
    forward(m, tape, y);
    near(y, net_y_train, 15, "train y");
    assert_int_equal(*(int64_t *)nbt->data, 8);
    near(ddp_model_find_buffer(m, "bn.running_mean")->data, net_bn_running_mean, 8,
         "running_mean");
    ddp_model_train(m, 0);
    forward(m, tape, y);
    near(y, net_y_eval, 15, "eval y");
    assert_int_equal(*(int64_t *)nbt->data, 8); /* evaluation counts nothing */
    ddp_tape_destroy(tape);
    ddp_model_destroy(m);
}

static void test_save_load_round_trip(void **state)
{
    (void)state;
    ddp_model_t *a = make_net(), *b = make_net();
    assert_int_equal(ddp_model_load_safetensors(a, TORCH_FILE), 0);
    assert_int_equal(ddp_model_reset_parameters(b, 3), 0);
    char path[] = "/tmp/ddp-test-module-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(ddp_model_save_safetensors(a, path), 0);
    assert_int_equal(ddp_model_load_safetensors(b, path), 0);
    size_t na, nb, ba, bb;
    float *pa = ddp_model_param_block(a, &na), *pb = ddp_model_param_block(b, &nb);
    void *qa = ddp_model_buffer_block(a, &ba), *qb = ddp_model_buffer_block(b, &bb);
    assert_int_equal(na, nb);
    assert_int_equal(ba, bb);
    assert_memory_equal(pa, pb, na * sizeof(float));
    assert_memory_equal(qa, qb, ba);
    /* A buffer of another dtype or shape is a mismatch that changes nothing. */
    ddp_model_t *c;
    assert_int_equal(ddp_model_create(&c), 0);
    assert_int_equal(ddp_model_add_module(c, "bn", bn1d(4)), 0);
    assert_int_equal(ddp_model_add_module(c, "extra", linear(2, 2)), 0);
    float *before = ddp_model_find_buffer(c, "bn.running_var")->data;
    assert_int_equal(ddp_model_load_safetensors(c, path), DDP_ERR_MISMATCH);
    assert_non_null(strstr(ddp_last_error(), "bn.running_mean: shape (8) in file, (4) in model"));
    assert_non_null(strstr(ddp_last_error(), "missing extra.weight"));
    assert_non_null(strstr(ddp_last_error(), "unexpected stem.weight"));
    assert_true(before[0] == 1.0f); /* nothing loaded */
    ddp_model_destroy(c);
    unlink(path);
    ddp_model_destroy(a);
    ddp_model_destroy(b);
}

static void test_train_eval_reaches_grandchild(void **state)
{
    (void)state;
    ddp_module_t *root;
    ddp_model_t *m = make_net_root(&root);
    ddp_module_t *bn1 = ddp_module_child_by_name(
        ddp_module_child_by_name(ddp_module_child_by_name(root, "layer1"), "0"), "bn1");
    assert_non_null(bn1);
    assert_string_equal(ddp_module_type(bn1), "BatchNorm1d");
    assert_int_equal(ddp_module_is_training(bn1), 1);
    ddp_model_train(m, 0);
    assert_int_equal(ddp_module_is_training(bn1), 0);
    assert_int_equal(ddp_module_is_training(root), 0);
    ddp_model_train(m, 1);
    assert_int_equal(ddp_module_is_training(bn1), 1);
    ddp_model_destroy(m);
}

/* Buffers are not parameters: an optimizer step changes every parameter
 * and no buffer. */
static void test_buffers_not_optimised(void **state)
{
    (void)state;
    ddp_model_t *m = make_net();
    assert_int_equal(ddp_model_load_safetensors(m, TORCH_FILE), 0);
    size_t nbytes, numel;
    void *buf = ddp_model_buffer_block(m, &nbytes);
    float *p = ddp_model_param_block(m, &numel);
    unsigned char *before = malloc(nbytes);
    float *pbefore = malloc(numel * sizeof(float));
    memcpy(before, buf, nbytes);
    memcpy(pbefore, p, numel * sizeof(float));
    float *g = ddp_model_grad_block(m, NULL);
    for (size_t i = 0; i < numel; i++)
        g[i] = 1.0f;
    ddp_sgd_options o = ddp_sgd_defaults(0.1);
    o.momentum = 0.9;
    o.weight_decay = 0.01;
    ddp_optim_t *opt;
    assert_int_equal(ddp_sgd_create(m, &o, &opt), 0);
    assert_int_equal(ddp_optim_step(opt), 0);
    assert_memory_equal(before, buf, nbytes);
    for (size_t i = 0; i < numel; i++)
        assert_true(p[i] != pbefore[i]);
    ddp_optim_destroy(opt);
    free(before);
    free(pbefore);
    ddp_model_destroy(m);
}

/* A user module with its own parameter, its own buffer, a child and a
 * reset: y = lin(x) + shift (shift broadcast over rows), counting its
 * forwards in a buffer.  Names, the parameter's gradient (sum of dy over
 * the rows) and the reset's draws from the model's generator. */
typedef struct shifted {
    ddp_param *shift;
    ddp_buffer *calls;
} shifted;

static int shifted_forward(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y,
                           void *user)
{
    shifted *s = user;
    ddp_var_t *h, *vs;
    DDP_TRY(run_child(m, "lin", tape, x, &h));
    DDP_TRY(ddp_tape_param(tape, s->shift, &vs));
    ((float *)s->calls->data)[0] += 1.0f;
    return ddp_op_add(tape, h, vs, y);
}

static int shifted_reset(ddp_module_t *m, ddp_generator *gen, void *user)
{
    (void)m;
    shifted *s = user;
    return ddp_init_uniform(s->shift, 10.0, 11.0, gen);
}

static const ddp_module_def shifted_def = {"Shifted", shifted_forward, shifted_reset, free};

static void test_user_module_own_state(void **state)
{
    (void)state;
    shifted *s = calloc(1, sizeof *s);
    ddp_module_t *m, *outer;
    assert_int_equal(ddp_module_create(&shifted_def, s, &m), 0);
    assert_int_equal(ddp_module_add_param(m, "shift", 1, (int64_t[]){3}, &s->shift), 0);
    assert_int_equal(ddp_module_add_buffer(m, "calls", DDP_FLOAT32, 1, (int64_t[]){1}, &s->calls),
                     0);
    assert_int_equal(ddp_module_add_child(m, "lin", linear(2, 3)), 0);
    assert_ptr_equal(ddp_module_user(m), s);
    assert_int_equal(ddp_module_create(&net_def, NULL, &outer), 0);
    assert_int_equal(ddp_module_add_child(outer, "block", m), 0);
    ddp_model_t *model;
    assert_int_equal(ddp_model_create(&model), 0);
    assert_int_equal(ddp_model_add_module(model, "enc", outer), 0);
    assert_int_equal(ddp_model_seal(model), 0);
    /* Own parameters before the child's, as named_parameters lists them. */
    assert_string_equal(ddp_model_param(model, 0)->name, "enc.block.shift");
    assert_string_equal(ddp_model_param(model, 1)->name, "enc.block.lin.weight");
    assert_string_equal(ddp_model_buffer(model, 0)->name, "enc.block.calls");
    assert_int_equal(ddp_model_reset_parameters(model, 4), 0);
    for (int i = 0; i < 3; i++)
        assert_true(s->shift->data[i] >= 10.0f && s->shift->data[i] <= 11.0f);
    ddp_tape_t *tape;
    assert_int_equal(ddp_tape_create(&tape), 0);
    float xs[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ddp_tensor t;
    assert_int_equal(ddp_tensor_wrap(&t, xs, 2, (int64_t[]){4, 2}), 0);
    ddp_var_t *x, *y, *loss;
    assert_int_equal(ddp_tape_input(tape, &t, 0, &x), 0);
    assert_int_equal(ddp_module_forward(m, tape, x, &y), 0);
    assert_int_equal(ddp_op_sum(tape, y, &loss), 0);
    ddp_model_zero_grad(model);
    assert_int_equal(ddp_tape_backward(tape, loss, model), 0);
    for (int i = 0; i < 3; i++)
        assert_true(s->shift->grad[i] == 4.0f); /* d sum / d shift = rows */
    assert_true(((float *)s->calls->data)[0] == 1.0f);
    ddp_tape_destroy(tape);
    ddp_model_destroy(model); /* frees s through def->destroy (ASan checks) */
}

/* ==== misuse ============================================================== */

static int destroyed;
static void count_destroy(void *user)
{
    (void)user;
    destroyed++;
}
static const ddp_module_def counted_def = {"Counted", block_forward, NULL, count_destroy};

static void test_module_errors(void **state)
{
    (void)state;
    ddp_module_t *m, *c;
    ddp_param *p;
    ddp_buffer *b;
    destroyed = 0;
    assert_int_equal(ddp_module_create(&counted_def, &destroyed, &m), 0);
    assert_int_equal(ddp_module_add_param(m, "w", 1, (int64_t[]){2}, &p), 0);
    assert_int_equal(ddp_module_add_buffer(m, "w", DDP_FLOAT32, 1, (int64_t[]){2}, &b),
                     DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "\"w\" is already a parameter, buffer or child"));
    assert_int_equal(ddp_module_add_param(m, "a.b", 1, (int64_t[]){2}, &p), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "contains '.'"));
    assert_int_equal(ddp_module_add_buffer(m, "f", DDP_FLOAT64, 1, (int64_t[]){2}, &b),
                     DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "dtype float64 is not float32 or int64"));
    assert_int_equal(ddp_module_add_child(m, "self", m), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "is the module itself or one of its ancestors"));
    { /* an ancestor refused as a child: nothing is freed, the caller keeps it */
        int before = destroyed;
        ddp_module_t *pp, *cc;
        assert_int_equal(ddp_module_create(&counted_def, &before, &pp), 0);
        assert_int_equal(ddp_module_create(&counted_def, &before, &cc), 0);
        assert_int_equal(ddp_module_add_child(pp, "c", cc), 0);
        assert_int_equal(ddp_module_add_child(cc, "p", pp), DDP_ERR_INVALID_ARG);
        assert_non_null(strstr(ddp_last_error(), "is the module itself or one of its ancestors"));
        assert_int_equal(destroyed, before);
        ddp_module_destroy(pp);
        assert_int_equal(destroyed, before + 2);
        destroyed = before; /* the checks below count m's destroy alone */
    }
    assert_int_equal(ddp_relu_create(&c), 0);
    assert_int_equal(ddp_module_add_child(m, "act", c), 0);
    assert_int_equal(ddp_module_add_child(m, "again", c), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "already belongs to a container or model"));
    assert_int_equal(ddp_module_add_param(c, "late", 1, (int64_t[]){2}, &p), DDP_ERR_STATE);
    assert_non_null(strstr(ddp_last_error(), "after the module was given to a container"));
    assert_int_equal(ddp_module_create(&(ddp_module_def){"NoForward", NULL, NULL, count_destroy},
                                       &destroyed, &c),
                     DDP_ERR_INVALID_ARG);
    assert_int_equal(destroyed, 1); /* a failed create frees the state it was given */
    ddp_module_destroy(m);
    assert_int_equal(destroyed, 2);
}

/* ==== torch.nn.init ======================================================= */

static ddp_param *standalone(ddp_model_t **m, int ndim, const int64_t *shape)
{
    ddp_param *p;
    assert_int_equal(ddp_model_create(m), 0);
    assert_int_equal(ddp_model_add_param(*m, "w", ndim, shape, &p), 0);
    assert_int_equal(ddp_model_seal(*m), 0);
    return ddp_model_param(*m, 0);
}

static void moments(const ddp_param *p, double *maxabs, double *std)
{
    double s = 0, s2 = 0;
    *maxabs = 0;
    for (size_t i = 0; i < p->numel; i++) {
        s += p->data[i], s2 += (double)p->data[i] * p->data[i];
        *maxabs = fmax(*maxabs, fabs((double)p->data[i]));
    }
    double mean = s / (double)p->numel;
    *std = sqrt(s2 / (double)p->numel - mean * mean);
}

static void test_init(void **state)
{
    (void)state;
    ddp_model_t *m;
    ddp_param *w = standalone(&m, 4, (int64_t[]){64, 32, 3, 3}); /* a conv weight */
    int64_t fi, fo;
    assert_int_equal(ddp_init_calculate_fan(w, &fi, &fo), 0);
    assert_int_equal(fi, 32 * 9);
    assert_int_equal(fo, 64 * 9);
    double gain, maxabs, std;
    assert_int_equal(ddp_init_calculate_gain("leaky_relu", 0.2, &gain), 0);
    assert_true(fabs(gain - sqrt(2.0 / 1.04)) < 1e-12);
    assert_int_equal(ddp_init_calculate_gain("tanh", 0, &gain), 0);
    assert_true(fabs(gain - 5.0 / 3.0) < 1e-12);
    assert_int_equal(ddp_init_calculate_gain("swish", 0, &gain), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "unsupported nonlinearity \"swish\""));
    ddp_generator g;
    ddp_generator_seed(&g, 1);
    /* kaiming_uniform(relu, fan_in): U(-b, b), b = sqrt(2) sqrt(3 / 288). */
    double bound = sqrt(2.0) * sqrt(3.0 / 288.0);
    assert_int_equal(ddp_init_kaiming_uniform(w, 0, DDP_FAN_IN, "relu", &g), 0);
    moments(w, &maxabs, &std);
    assert_true(maxabs <= bound && maxabs > 0.99 * bound);
    assert_true(fabs(std - bound / sqrt(3.0)) < 0.03 * bound / sqrt(3.0));
    /* kaiming_normal(fan_out): N(0, sqrt(2) / sqrt(576)). */
    assert_int_equal(ddp_init_kaiming_normal(w, 0, DDP_FAN_OUT, "relu", &g), 0);
    moments(w, &maxabs, &std);
    assert_true(fabs(std - sqrt(2.0 / 576.0)) < 0.03 * sqrt(2.0 / 576.0));
    /* xavier: sqrt(2 / (fan_in + fan_out)) times gain. */
    assert_int_equal(ddp_init_xavier_normal(w, 2.0, &g), 0);
    moments(w, &maxabs, &std);
    assert_true(fabs(std - 2.0 * sqrt(2.0 / 864.0)) < 0.03 * 2.0 * sqrt(2.0 / 864.0));
    assert_int_equal(ddp_init_xavier_uniform(w, 1.0, &g), 0);
    moments(w, &maxabs, &std);
    assert_true(maxabs <= sqrt(6.0 / 864.0) && maxabs > 0.99 * sqrt(6.0 / 864.0));
    assert_int_equal(ddp_init_ones(w), 0);
    assert_true(w->data[0] == 1.0f && w->data[w->numel - 1] == 1.0f);
    ddp_model_destroy(m);
    ddp_param *v = standalone(&m, 1, (int64_t[]){5});
    assert_int_equal(ddp_init_kaiming_uniform(v, 0, DDP_FAN_IN, NULL, &g), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "w has 1 dimension; fan in and fan out need"));
    ddp_model_destroy(m);
}

/* Two identical layers made with the same seed are identical; after
 * reset_parameters they draw one after the other from the model's one
 * generator, as torch.manual_seed + construction order does, and differ. */
static void test_reset_streams(void **state)
{
    (void)state;
    ddp_module_t *l[2] = {linear(6, 4), linear(6, 4)}, *seq;
    assert_int_equal(ddp_sequential_create(l, 2, &seq), 0);
    ddp_model_t *m;
    assert_int_equal(ddp_model_from_module(seq, &m), 0);
    ddp_param *w0 = ddp_model_find_param(m, "0.weight"), *w1 = ddp_model_find_param(m, "1.weight");
    assert_memory_equal(w0->data, w1->data, 24 * sizeof(float));
    assert_int_equal(ddp_model_reset_parameters(m, 42), 0);
    assert_memory_not_equal(w0->data, w1->data, 24 * sizeof(float));
    /* The second layer's weight is the stream after the first layer's 28 draws. */
    ddp_generator g;
    ddp_generator_seed(&g, 42);
    for (int i = 0; i < 28; i++)
        ddp_generator_uniform(&g);
    double b = 1.0 / sqrt(6.0);
    for (int i = 0; i < 24; i++)
        assert_true(w1->data[i] == (float)(-b + 2 * b * ddp_generator_uniform(&g)));
    ddp_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state_dict_names),
        cmocka_unit_test(test_torch_file_and_outputs),
        cmocka_unit_test(test_save_load_round_trip),
        cmocka_unit_test(test_train_eval_reaches_grandchild),
        cmocka_unit_test(test_buffers_not_optimised),
        cmocka_unit_test(test_user_module_own_state),
        cmocka_unit_test(test_module_errors),
        cmocka_unit_test(test_init),
        cmocka_unit_test(test_reset_streams),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
