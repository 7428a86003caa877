/* ddp-mnist's models and flags, seen from its end-to-end tests
 * (test_mnist_powersgd.c, test_mnist_zero.c, test_netns_cluster.c): the
 * MLP built independently of examples/mnist, a saved model loaded into it,
 * the relative distance of two models, and the check that bad flags are
 * refused with their reason.  Include after cmocka.h and mnist_output.h. */
#ifndef DDP_TESTS_MNIST_MODEL_H
#define DDP_TESTS_MNIST_MODEL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "ddp.h"

/* The MLP 784-hidden[0]-...-10 with ReLUs between (at most 7 hidden). */
static inline ddp_model_t *mnist_mlp(const int *hidden, int nh)
{
    ddp_module_t *mods[16], *seq;
    int n = 0, in = 784;
    assert_true(nh >= 0 && nh <= 7);
    for (int i = 0; i < nh; i++) {
        assert_int_equal(ddp_linear_create(in, hidden[i], 1, 0, &mods[n++]), 0);
        assert_int_equal(ddp_relu_create(&mods[n++]), 0);
        in = hidden[i];
    }
    assert_int_equal(ddp_linear_create(in, 10, 1, 0, &mods[n++]), 0);
    assert_int_equal(ddp_sequential_create(mods, n, &seq), 0);
    ddp_model_t *m;
    assert_int_equal(ddp_model_from_module(seq, &m), 0);
    return m;
}

/* That MLP with the weights ddp-mnist saved as DIR/NAME (--save). */
static inline ddp_model_t *mnist_mlp_load(const char *dir, const int *hidden, int nh,
                                          const char *name)
{
    ddp_model_t *m = mnist_mlp(hidden, nh);
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (ddp_model_load_safetensors(m, path) != 0)
        fail_msg("%s: %s", path, ddp_last_error());
    return m;
}

/* max |a - b| / max |a| over the two models' parameters; INFINITY when a
 * is all zeros (a model that was never trained or saved). */
static inline double mnist_rel_diff(ddp_model_t *ma, ddp_model_t *mb)
{
    size_t n, nb;
    const float *pa = ddp_model_param_block(ma, &n), *pb = ddp_model_param_block(mb, &nb);
    assert_int_equal(n, nb);
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num = fmax(num, fabs((double)pa[i] - pb[i]));
        den = fmax(den, fabs((double)pa[i]));
    }
    return den > 0 ? num / den : INFINITY;
}

/* Each cases[i][0] (flags after `BIN --epochs 0`) exits 2 with a message
 * holding cases[i][1]. */
static inline void mnist_bad_flags(const char *bin, const char *dir, const char *(*cases)[2],
                                   size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char cmd[2048], path[512];
        snprintf(path, sizeof path, "%s/log", dir);
        snprintf(cmd, sizeof cmd, "%s --epochs 0 %s >%s 2>&1", bin, cases[i][0], path);
        int st = system(cmd);
        char *out = slurp(path);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 2 || !strstr(out, cases[i][1]))
            fail_msg("'%s': status %d, output '%s'", cases[i][0], st, out);
        free(out);
    }
}

#endif
