/* Optimizers against torch.optim: SGD (momentum, dampening, nesterov,
 * weight decay, maximize), Adam and AdamW (betas, eps, weight decay,
 * amsgrad, maximize), Adadelta (rho, eps, weight decay, maximize) and
 * RMSprop (alpha, eps, weight decay, momentum, centered, maximize) over
 * four steps with fixed gradients.  The expected
 * parameters were printed by torch.optim 1.13 (float32) with
 * tests/data/optim_reference.py; the first rows are also easy by hand
 * (SGD: 0.5 - 0.1 * 1.0 = 0.4; Adam's first step moves every parameter by
 * lr * sign(g) because m/sqrt(v) = g/|g| after bias correction). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "ddp.h"
#include "ddp/ext.h"

#define N 5
#define STEPS 4

static const float P0[N] = {0.5f, -1.2f, 2.0f, 0.0f, -0.3f};
static const float G[STEPS][N] = {{1.0f, -2.0f, 0.5f, 3.0f, -0.1f},
                                  {0.2f, 0.1f, -0.4f, 0.05f, 0.3f},
                                  {-0.01f, 0.02f, 0.03f, -0.04f, 0.05f},
                                  {0.5f, 0.5f, -0.5f, -0.5f, 0.0f}};

typedef struct expected {
    const char *name;
    float p[STEPS][N];
} expected;

static const expected EXPECT[] = {
    {"sgd plain",
     {{4.000000060e-01f, -1.000000000e+00f, 1.950000048e+00f, -3.000000119e-01f, -2.900000215e-01f},
      {3.799999952e-01f, -1.009999990e+00f, 1.990000010e+00f, -3.050000072e-01f, -3.200000226e-01f},
      {3.809999824e-01f, -1.011999965e+00f, 1.986999989e+00f, -3.009999990e-01f, -3.250000179e-01f},
      {3.309999704e-01f, -1.061999917e+00f, 2.036999941e+00f, -2.509999871e-01f, -3.250000179e-01f}}},
    {"sgd momentum",
     {{4.000000060e-01f, -1.000000000e+00f, 1.950000048e+00f, -3.000000119e-01f, -2.900000215e-01f},
      {2.899999917e-01f, -8.299999833e-01f, 1.945000052e+00f, -5.749999881e-01f, -3.110000193e-01f},
      {1.919999868e-01f, -6.790000200e-01f, 1.937500000e+00f, -8.184999824e-01f, -3.349000216e-01f},
      {5.379998684e-02f, -5.931000113e-01f, 1.980749965e+00f, -9.876499772e-01f, -3.564100266e-01f}}},
    {"sgd dampening wd",
     {{3.995000124e-01f, -9.988000393e-01f, 1.947999954e+00f, -3.000000119e-01f, -2.897000015e-01f},
      {2.947703600e-01f, -8.240208626e-01f, 1.927836299e+00f, -5.732899904e-01f, -3.012272120e-01f},
      {2.010073513e-01f, -6.675428152e-01f, 1.906239629e+00f, -8.160496950e-01f, -3.148908317e-01f},
      {8.147993684e-02f, -5.612452626e-01f, 1.920468211e+00f, -9.989621639e-01f, -3.269676864e-01f}}},
    {"sgd nesterov wd",
     {{3.052500188e-01f, -8.086000681e-01f, 1.886000037e+00f, -5.699999928e-01f, -2.781500220e-01f},
      {1.813251525e-01f, -6.530584097e-01f, 1.895483017e+00f, -8.170849681e-01f, -3.231925964e-01f},
      {8.934381604e-02f, -5.053055286e-01f, 1.852797627e+00f, -1.022164106e+00f, -3.444122672e-01f},
      {-8.937218785e-02f, -4.636663198e-01f, 1.903008819e+00f, -1.109301686e+00f, -3.571924269e-01f}}},
    {"sgd maximize",
     {{5.950000286e-01f, -1.388000011e+00f, 2.029999971e+00f, 3.000000119e-01f, -3.070000112e-01f},
      {6.565500498e-01f, -1.458119988e+00f, 1.984699965e+00f, 4.520000219e-01f, -2.774299979e-01f},
      {6.797595620e-01f, -1.476598740e+00f, 1.945202947e+00f, 5.194800496e-01f, -2.548706830e-01f},
      {7.345666885e-01f, -1.421072125e+00f, 1.856002450e+00f, 4.980252385e-01f, -2.410423309e-01f}}},
    {"adam defaults",
     {{4.900000095e-01f, -1.190000057e+00f, 1.990000010e+00f, -1.000000071e-02f, -2.900000215e-01f},
      {4.819695950e-01f, -1.183679581e+00f, 1.989418745e+00f, -1.682372019e-02f, -2.949419320e-01f},
      {4.758250713e-01f, -1.178857923e+00f, 1.988670707e+00f, -2.201276459e-02f, -2.997133136e-01f},
      {4.687458277e-01f, -1.176436067e+00f, 1.991764903e+00f, -2.524878457e-02f, -3.036217391e-01f}}},
    {"adam wd betas eps",
     {{4.500000477e-01f, -1.150000095e+00f, 1.950000048e+00f, -4.999998584e-02f, -2.500003874e-01f},
      {4.095015526e-01f, -1.117427349e+00f, 1.930442333e+00f, -8.288940787e-02f, -2.717244923e-01f},
      {3.783561289e-01f, -1.091635227e+00f, 1.905868292e+00f, -1.067175269e-01f, -2.904978693e-01f},
      {3.414175510e-01f, -1.078460574e+00f, 1.901723623e+00f, -1.189265326e-01f, -3.018209338e-01f}}},
    {"adam amsgrad",
     {{4.500000179e-01f, -1.150000095e+00f, 1.950000048e+00f, -5.000000075e-02f, -2.500000000e-01f},
      {4.098479748e-01f, -1.118397951e+00f, 1.947093844e+00f, -8.410628140e-02f, -2.747094929e-01f},
      {3.791391850e-01f, -1.094300866e+00f, 1.943353772e+00f, -1.100314707e-01f, -2.985663414e-01f},
      {3.437429667e-01f, -1.082191467e+00f, 1.958824515e+00f, -1.262115687e-01f, -3.180986643e-01f}}},
    {"adam all",
     {{5.500000119e-01f, -1.250000000e+00f, 2.049999952e+00f, 5.000000075e-02f, -3.499999940e-01f},
      {5.870405436e-01f, -1.275598407e+00f, 2.017176151e+00f, 8.398225904e-02f, -3.166076541e-01f},
      {6.109329462e-01f, -1.290311933e+00f, 1.980810642e+00f, 1.096327901e-01f, -2.826072574e-01f},
      {6.401341558e-01f, -1.290221334e+00f, 1.939200878e+00f, 1.253613532e-01f, -2.508644760e-01f}}},
    {"adamw defaults",
     {{4.899500012e-01f, -1.189880013e+00f, 1.989799976e+00f, -1.000000071e-02f, -2.899700105e-01f},
      {4.818705916e-01f, -1.183440566e+00f, 1.989019752e+00f, -1.682271995e-02f, -2.948829234e-01f},
      {4.756778777e-01f, -1.178500533e+00f, 1.988072753e+00f, -2.201008238e-02f, -2.996248007e-01f},
      {4.685510695e-01f, -1.175960779e+00f, 1.990968108e+00f, -2.524390072e-02f, -3.035032451e-01f}}},
    {"adamw wd amsgrad",
     {{4.475000203e-01f, -1.144000053e+00f, 1.940000057e+00f, -5.000000075e-02f, -2.485000044e-01f},
      {4.051104784e-01f, -1.106677890e+00f, 1.927393913e+00f, -8.385627717e-02f, -2.719669938e-01f},
      {3.723761439e-01f, -1.077047467e+00f, 1.914016843e+00f, -1.093621850e-01f, -2.944640219e-01f},
      {3.351180553e-01f, -1.059552789e+00f, 1.919917464e+00f, -1.249954700e-01f, -3.125240207e-01f}}},
    {"adamw maximize",
     {{5.425000191e-01f, -1.231999993e+00f, 2.019999981e+00f, 4.999999702e-02f, -3.455000222e-01f},
      {5.715129375e-01f, -1.240873933e+00f, 1.986442804e+00f, 7.944466919e-02f, -3.103704154e-01f},
      {5.875908732e-01f, -1.240298510e+00f, 1.956332803e+00f, 9.806942195e-02f, -2.795945108e-01f},
      {6.119840145e-01f, -1.224128842e+00f, 1.902469516e+00f, 1.036754549e-01f, -2.569040358e-01f}}},
    {"adadelta defaults",
     {{4.968377352e-01f, -1.196837783e+00f, 1.996837735e+00f, -3.162276000e-03f, -2.968393266e-01f},
      {4.959152043e-01f, -1.197073102e+00f, 1.999720693e+00f, -3.240831196e-03f, -3.011020720e-01f},
      {4.959636331e-01f, -1.197121501e+00f, 1.999454737e+00f, -3.176261438e-03f, -3.021091223e-01f},
      {4.938041270e-01f, -1.198317170e+00f, 2.002830744e+00f, -2.361163730e-03f, -3.021091223e-01f}}},
    {"adadelta rho eps wd",
     {{4.888221920e-01f, -1.188820362e+00f, 1.988825321e+00f, -1.118002832e-02f, -2.889814675e-01f},
      {4.847733974e-01f, -1.188662887e+00f, 1.993656874e+00f, -1.146800630e-02f, -3.033666611e-01f},
      {4.840864241e-01f, -1.187790036e+00f, 1.987936258e+00f, -1.121088583e-02f, -3.049006462e-01f},
      {4.755714834e-01f, -1.191280246e+00f, 1.995466709e+00f, -7.956080139e-03f, -3.024513423e-01f}}},
    {"adadelta maximize",
     {{5.063245296e-01f, -1.206324577e+00f, 2.006324291e+00f, 6.324552000e-03f, -3.063201904e-01f},
      {5.079843402e-01f, -1.205548406e+00f, 1.999198198e+00f, 6.480669137e-03f, -2.976582050e-01f},
      {5.076328516e-01f, -1.205147982e+00f, 1.997884989e+00f, 6.350483745e-03f, -2.951314449e-01f},
      {5.118631124e-01f, -1.202420354e+00f, 1.989943147e+00f, 4.719291348e-03f, -2.945359349e-01f}}},
    {"rmsprop defaults",
     {{4.000000060e-01f, -1.100000024e+00f, 1.899999976e+00f, -1.000000015e-01f, -2.000001073e-01f},
      {3.802934289e-01f, -1.105018854e+00f, 1.962660789e+00f, -1.016748324e-01f, -2.949158847e-01f},
      {3.812836707e-01f, -1.106027603e+00f, 1.957942843e+00f, -1.003283411e-01f, -3.106176555e-01f},
      {3.367331028e-01f, -1.130597115e+00f, 2.019946814e+00f, -8.364936709e-02f, -3.106176555e-01f}}},
    {"rmsprop momentum wd",
     {{4.683773220e-01f, -1.168377280e+00f, 1.968377352e+00f, -3.162274137e-02f, -2.683780193e-01f},
      {4.323108494e-01f, -1.139652133e+00f, 1.949168086e+00f, -6.060355529e-02f, -2.687393427e-01f},
      {3.987722993e-01f, -1.112244010e+00f, 1.921663046e+00f, -8.614697307e-02f, -2.716280818e-01f},
      {3.526365459e-01f, -1.094209433e+00f, 1.910268068e+00f, -1.029787734e-01f, -2.710699439e-01f}}},
    {"rmsprop centered",
     {{2.989924550e-01f, -9.989925027e-01f, 1.798992515e+00f, -2.010075748e-01f, -9.899264574e-02f},
      {2.593055367e-01f, -1.009075165e+00f, 1.924328089e+00f, -2.043745071e-01f, -2.892091870e-01f},
      {2.612994015e-01f, -1.011101484e+00f, 1.914890289e+00f, -2.016681582e-01f, -3.207091689e-01f},
      {1.712116897e-01f, -1.060344696e+00f, 2.039033890e+00f, -1.682009548e-01f, -3.207091689e-01f}}},
    {"rmsprop all",
     {{5.249999762e-01f, -1.225000024e+00f, 2.025000095e+00f, 2.499999851e-02f, -3.249999881e-01f},
      {5.404340029e-01f, -1.232490182e+00f, 2.013248205e+00f, 3.791056946e-02f, -3.131479323e-01f},
      {5.443499088e-01f, -1.232103825e+00f, 1.995372295e+00f, 4.389171302e-02f, -2.988986671e-01f},
      {5.593350530e-01f, -1.220809579e+00f, 1.963777900e+00f, 4.161369801e-02f, -2.868418396e-01f}}},
};

static ddp_optim_t *make(const char *name, ddp_model_t *m)
{
    ddp_optim_t *o = NULL;
    ddp_sgd_options s = ddp_sgd_defaults(0.1);
    ddp_adam_options a = ddp_adam_defaults(), w = ddp_adamw_defaults();
    ddp_adadelta_options d = ddp_adadelta_defaults();
    ddp_rmsprop_options r = ddp_rmsprop_defaults();
    if (strcmp(name, "sgd plain") == 0) {
    } else if (strcmp(name, "sgd momentum") == 0) {
        s.momentum = 0.9;
    } else if (strcmp(name, "sgd dampening wd") == 0) {
        s.momentum = 0.9, s.dampening = 0.3, s.weight_decay = 0.01;
    } else if (strcmp(name, "sgd nesterov wd") == 0) {
        s.momentum = 0.9, s.nesterov = 1, s.weight_decay = 0.05;
    } else if (strcmp(name, "sgd maximize") == 0) {
        s.momentum = 0.5, s.weight_decay = 0.1, s.maximize = 1;
    } else if (strcmp(name, "adam defaults") == 0) {
        a.lr = 0.01;
    } else if (strcmp(name, "adam wd betas eps") == 0) {
        a.lr = 0.05, a.beta1 = 0.8, a.beta2 = 0.9, a.eps = 1e-6, a.weight_decay = 0.1;
    } else if (strcmp(name, "adam amsgrad") == 0) {
        a.lr = 0.05, a.amsgrad = 1;
    } else if (strcmp(name, "adam all") == 0) {
        a.lr = 0.05, a.weight_decay = 0.2, a.amsgrad = 1, a.maximize = 1;
    } else if (strcmp(name, "adamw defaults") == 0) {
        w.lr = 0.01;
    } else if (strcmp(name, "adamw wd amsgrad") == 0) {
        w.lr = 0.05, w.weight_decay = 0.1, w.amsgrad = 1;
    } else if (strcmp(name, "adamw maximize") == 0) {
        w.lr = 0.05, w.beta1 = 0.7, w.beta2 = 0.95, w.weight_decay = 0.3, w.maximize = 1;
    } else if (strcmp(name, "adadelta rho eps wd") == 0) {
        d.lr = 0.5, d.rho = 0.8, d.eps = 1e-4, d.weight_decay = 0.1;
    } else if (strcmp(name, "adadelta maximize") == 0) {
        d.lr = 2.0, d.weight_decay = 0.05, d.maximize = 1;
    } else if (strcmp(name, "rmsprop momentum wd") == 0) {
        r.lr = 0.01, r.alpha = 0.9, r.eps = 1e-6, r.momentum = 0.9, r.weight_decay = 0.1;
    } else if (strcmp(name, "rmsprop centered") == 0) {
        r.lr = 0.02, r.centered = 1;
    } else if (strcmp(name, "rmsprop all") == 0) {
        r.lr = 0.01, r.alpha = 0.8, r.momentum = 0.5, r.centered = 1, r.weight_decay = 0.2;
        r.maximize = 1;
    }
    if (strncmp(name, "adadelta", 8) == 0)
        assert_int_equal(ddp_adadelta_create(m, &d, &o), 0);
    else if (strncmp(name, "rmsprop", 7) == 0)
        assert_int_equal(ddp_rmsprop_create(m, &r, &o), 0);
    else if (strncmp(name, "sgd", 3) == 0)
        assert_int_equal(ddp_sgd_create(m, &s, &o), 0);
    else if (strncmp(name, "adamw", 5) == 0)
        assert_int_equal(ddp_adamw_create(m, &w, &o), 0);
    else
        assert_int_equal(ddp_adam_create(m, &a, &o), 0);
    return o;
}

static ddp_model_t *one_param(ddp_param **p)
{
    ddp_model_t *m;
    assert_int_equal(ddp_model_create(&m), 0);
    assert_int_equal(ddp_model_add_param(m, "p", 1, (int64_t[]){N}, p), 0);
    assert_int_equal(ddp_model_seal(m), 0);
    memcpy((*p)->data, P0, sizeof P0);
    return m;
}

static void test_against_torch(void **state)
{
    (void)state;
    for (size_t c = 0; c < sizeof EXPECT / sizeof EXPECT[0]; c++) {
        ddp_param *p;
        ddp_model_t *m = one_param(&p);
        ddp_optim_t *o = make(EXPECT[c].name, m);
        for (int s = 0; s < STEPS; s++) {
            memcpy(p->grad, G[s], sizeof G[s]);
            assert_int_equal(ddp_optim_step(o), 0);
            for (int i = 0; i < N; i++) {
                float want = EXPECT[c].p[s][i];
                if (fabsf(p->data[i] - want) > 2e-6f * (1.0f + fabsf(want)))
                    fail_msg("%s step %d element %d: %.9g, torch %.9g", EXPECT[c].name, s + 1,
                             i, (double)p->data[i], (double)want);
            }
        }
        assert_int_equal(ddp_optim_steps(o), STEPS);
        ddp_optim_destroy(o);
        ddp_model_destroy(m);
    }
}

/* State buffers are enumerable and hold torch's values: after one step SGD's
 * momentum buffer is the gradient itself (no dampening on the first step);
 * Adam's exp_avg is (1 - beta1) g and exp_avg_sq (1 - beta2) g^2. */
static void test_state_access(void **state)
{
    (void)state;
    ddp_param *p;
    ddp_model_t *m = one_param(&p);
    ddp_optim_t *o = make("sgd dampening wd", m);
    const char *name;
    float *buf;
    size_t n;
    assert_int_equal(ddp_optim_num_states(o), 1);
    memcpy(p->grad, G[0], sizeof G[0]);
    uint64_t version = ddp_model_param_version(m);
    assert_int_equal(ddp_optim_step(o), 0);
    assert_true(ddp_model_param_version(m) != version); /* DDP's no_sync check reads it */
    assert_int_equal(ddp_optim_state(o, 0, &name, &buf, &n), 0);
    assert_string_equal(name, "momentum_buffer");
    assert_int_equal(n, N);
    for (int i = 0; i < N; i++)
        assert_true(fabsf(buf[i] - (G[0][i] + 0.01f * P0[i])) < 1e-7f);
    assert_int_equal(ddp_optim_state(o, 1, &name, &buf, &n), DDP_ERR_NOT_FOUND);
    assert_non_null(strstr(ddp_last_error(), "optimizer state 1 does not exist (1 buffers)"));
    assert_true(ddp_optim_lr(o) == 0.1);
    ddp_optim_set_lr(o, 0.5);
    assert_true(ddp_optim_lr(o) == 0.5);
    ddp_optim_destroy(o);

    memcpy(p->data, P0, sizeof P0);
    o = make("adam all", m);
    assert_int_equal(ddp_optim_num_states(o), 3);
    const char *names[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ddp_optim_state(o, i, &name, &buf, &n), 0);
        assert_string_equal(name, names[i]);
    }
    memcpy(p->grad, G[0], sizeof G[0]);
    assert_int_equal(ddp_optim_step(o), 0);
    float *m1, *v1;
    assert_int_equal(ddp_optim_state(o, 0, NULL, &m1, NULL), 0);
    assert_int_equal(ddp_optim_state(o, 1, NULL, &v1, NULL), 0);
    for (int i = 0; i < N; i++) {
        float g = -G[0][i] + 0.2f * P0[i]; /* maximize, then weight decay */
        assert_true(fabsf(m1[i] - 0.1f * g) <= 1e-6f * fabsf(0.1f * g));
        assert_true(fabsf(v1[i] - 0.001f * g * g) <= 1e-6f * 0.001f * g * g);
    }
    /* restoring the step count from a checkpoint */
    ddp_optim_set_steps(o, 10);
    assert_int_equal(ddp_optim_steps(o), 10);
    ddp_optim_zero_grad(o);
    for (int i = 0; i < N; i++)
        assert_true(p->grad[i] == 0.0f);
    ddp_optim_destroy(o);
    ddp_optim_destroy(NULL);
    ddp_model_destroy(m);
}

/* Adadelta's and RMSprop's buffers carry torch's names; after one step
 * Adadelta's square_avg is (1 - rho) g^2; bad options name themselves. */
static void test_adadelta_rmsprop_state(void **state)
{
    (void)state;
    ddp_param *p;
    ddp_model_t *m = one_param(&p);
    ddp_optim_t *o = make("adadelta defaults", m);
    const char *name;
    float *sq;
    assert_int_equal(ddp_optim_num_states(o), 2);
    assert_int_equal(ddp_optim_state(o, 1, &name, NULL, NULL), 0);
    assert_string_equal(name, "acc_delta");
    memcpy(p->grad, G[0], sizeof G[0]);
    assert_int_equal(ddp_optim_step(o), 0);
    assert_int_equal(ddp_optim_state(o, 0, &name, &sq, NULL), 0);
    assert_string_equal(name, "square_avg");
    for (int i = 0; i < N; i++)
        assert_true(fabsf(sq[i] - 0.1f * G[0][i] * G[0][i]) <= 1e-6f * sq[i]);
    ddp_optim_destroy(o);
    const char *want[][3] = {{"square_avg"}, {"square_avg", "momentum_buffer"},
                             {"square_avg", "grad_avg"},
                             {"square_avg", "momentum_buffer", "grad_avg"}};
    const char *cases[] = {"rmsprop defaults", "rmsprop momentum wd", "rmsprop centered",
                           "rmsprop all"};
    for (int c = 0; c < 4; c++) {
        o = make(cases[c], m);
        int n = c == 3 ? 3 : c == 0 ? 1 : 2;
        assert_int_equal(ddp_optim_num_states(o), n);
        for (int k = 0; k < n; k++) {
            assert_int_equal(ddp_optim_state(o, k, &name, NULL, NULL), 0);
            assert_string_equal(name, want[c][k]);
        }
        ddp_optim_destroy(o);
    }
    ddp_adadelta_options d = ddp_adadelta_defaults();
    assert_true(d.lr == 1.0 && d.rho == 0.9 && d.eps == 1e-6 && d.weight_decay == 0);
    d.rho = 1.5;
    assert_int_equal(ddp_adadelta_create(m, &d, &o), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "Adadelta: invalid rho value 1.5"));
    ddp_rmsprop_options r = ddp_rmsprop_defaults();
    assert_true(r.lr == 1e-2 && r.alpha == 0.99 && r.eps == 1e-8 && r.momentum == 0);
    r.alpha = -0.1;
    assert_int_equal(ddp_rmsprop_create(m, &r, &o), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "RMSprop: invalid alpha value -0.1"));
    r = ddp_rmsprop_defaults();
    r.momentum = -1;
    assert_int_equal(ddp_rmsprop_create(m, &r, &o), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "RMSprop: invalid momentum value -1"));
    ddp_model_destroy(m);
}

/* The optimizer follows p->grad when DDP re-points it. */
static void test_follows_repointed_grad(void **state)
{
    (void)state;
    ddp_param *p;
    ddp_model_t *m = one_param(&p);
    ddp_optim_t *o = make("sgd plain", m);
    float bucket[N];
    assert_int_equal(ddp_param_set_grad(p, bucket), 0);
    memcpy(bucket, G[0], sizeof bucket);
    assert_int_equal(ddp_optim_step(o), 0);
    assert_memory_equal(p->data, EXPECT[0].p[0], sizeof bucket);
    ddp_optim_destroy(o);
    ddp_model_destroy(m);
}

static void test_invalid_options(void **state)
{
    (void)state;
    ddp_param *p;
    ddp_model_t *m = one_param(&p);
    ddp_optim_t *o;
    ddp_sgd_options s = ddp_sgd_defaults(-1);
    assert_int_equal(ddp_sgd_create(m, &s, &o), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "SGD: invalid learning rate -1"));
    s = ddp_sgd_defaults(0.1);
    s.nesterov = 1;
    assert_int_equal(ddp_sgd_create(m, &s, &o), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(),
                           "nesterov momentum requires a momentum and zero dampening"));
    s.momentum = -0.5;
    assert_int_equal(ddp_sgd_create(m, &s, &o), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "SGD: invalid momentum -0.5"));
    ddp_adam_options a = ddp_adam_defaults();
    a.beta2 = 1.0;
    assert_int_equal(ddp_adam_create(m, &a, &o), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "Adam: invalid beta parameter at index 1: 1"));
    a = ddp_adamw_defaults();
    assert_true(a.weight_decay == 0.01 && a.lr == 1e-3 && a.eps == 1e-8);
    a.eps = -1;
    assert_int_equal(ddp_adamw_create(m, &a, &o), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "AdamW: invalid epsilon -1"));
    a.eps = 1e-8;
    a.weight_decay = -0.1;
    assert_int_equal(ddp_adamw_create(m, &a, &o), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "AdamW: invalid weight_decay value -0.1"));
    ddp_model_destroy(m);
}

/* Learning-rate schedules against torch.optim.lr_scheduler (values printed
 * by tests/data/lr_reference.py): base lr 0.1, the lr before the first step
 * and after each of 12 steps. */
typedef struct lr_expected {
    const char *name;
    double lr[13];
} lr_expected;

static const lr_expected LR_EXPECT[] = {
    {"step",
     {0.10000000000000001, 0.10000000000000001, 0.10000000000000001, 0.050000000000000003,
      0.050000000000000003, 0.050000000000000003, 0.025000000000000001, 0.025000000000000001,
      0.025000000000000001, 0.012500000000000001, 0.012500000000000001, 0.012500000000000001,
      0.0062500000000000003}},
    {"multistep",
     {0.10000000000000001, 0.10000000000000001, 0.010000000000000002, 0.010000000000000002,
      0.010000000000000002, 0.0010000000000000002, 0.0010000000000000002, 0.0010000000000000002,
      0.0010000000000000002, 0.00010000000000000003, 0.00010000000000000003, 0.00010000000000000003,
      0.00010000000000000003}},
    {"exponential",
     {0.10000000000000001, 0.090000000000000011, 0.081000000000000016, 0.07290000000000002,
      0.065610000000000016, 0.059049000000000018, 0.05314410000000002, 0.047829690000000022,
      0.043046721000000024, 0.03874204890000002, 0.034867844010000017, 0.031381059609000013,
      0.028242953648100012}},
    {"cosine",
     {0.10000000000000001, 0.090546341221559898, 0.06579634122155989, 0.035203658778440096,
      0.010453658778440105, 0.001, 0.010453658778440102, 0.035203658778440117,
      0.065796341221559931, 0.090546341221559953, 0.10000000000000005, 0.090546341221559981,
      0.065796341221559945}},
    {"linear",
     {0.025000000000000001, 0.043750000000000004, 0.062500000000000014, 0.081250000000000017,
      0.10000000000000002, 0.10000000000000002, 0.10000000000000002, 0.10000000000000002,
      0.10000000000000002, 0.10000000000000002, 0.10000000000000002, 0.10000000000000002,
      0.10000000000000002}},
};

static void test_lr_schedules(void **state)
{
    (void)state;
    static const int milestones[] = {2, 5, 9};
    ddp_lr_options opts[5];
    memset(opts, 0, sizeof opts);
    opts[0] = (ddp_lr_options){.kind = DDP_LR_STEP, .step_size = 3, .gamma = 0.5};
    opts[1] = (ddp_lr_options){.kind = DDP_LR_MULTISTEP, .gamma = 0.1, .milestones = milestones,
                               .nmilestones = 3};
    opts[2] = (ddp_lr_options){.kind = DDP_LR_EXPONENTIAL, .gamma = 0.9};
    opts[3] = (ddp_lr_options){.kind = DDP_LR_COSINE, .t_max = 5, .eta_min = 0.001};
    opts[4] = (ddp_lr_options){.kind = DDP_LR_LINEAR, .start_factor = 0.25, .end_factor = 1.0,
                               .total_iters = 4};
    for (int c = 0; c < 5; c++) {
        ddp_param *p;
        ddp_model_t *m = one_param(&p);
        ddp_optim_t *o = make("sgd plain", m);
        ddp_lr_scheduler_t *s;
        assert_int_equal(ddp_lr_scheduler_create(o, &opts[c], &s), 0);
        for (int e = 0; e <= 12; e++) {
            if (e > 0)
                assert_true(ddp_lr_scheduler_step(s) == ddp_optim_lr(o));
            double want = LR_EXPECT[c].lr[e], got = ddp_optim_lr(o);
            if (fabs(got - want) > 1e-12 * want)
                fail_msg("%s epoch %d: lr %.17g, torch %.17g", LR_EXPECT[c].name, e, got, want);
            assert_true(ddp_lr_scheduler_last_lr(s) == got);
            assert_int_equal(ddp_lr_scheduler_last_epoch(s), e);
        }
        /* restored from a checkpoint at epoch 7 */
        ddp_lr_scheduler_set_last_epoch(s, 7);
        assert_true(fabs(ddp_optim_lr(o) - LR_EXPECT[c].lr[7]) <= 1e-12 * LR_EXPECT[c].lr[7]);
        ddp_lr_scheduler_destroy(s);
        ddp_optim_destroy(o);
        ddp_model_destroy(m);
    }
    /* invalid options */
    ddp_param *p;
    ddp_model_t *m = one_param(&p);
    ddp_optim_t *o = make("sgd plain", m);
    ddp_lr_scheduler_t *s;
    ddp_lr_options bad = {.kind = DDP_LR_STEP};
    assert_int_equal(ddp_lr_scheduler_create(o, &bad, &s), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "StepLR: step_size 0 must be > 0"));
    static const int unsorted[] = {5, 2};
    bad = (ddp_lr_options){.kind = DDP_LR_MULTISTEP, .milestones = unsorted, .nmilestones = 2};
    assert_int_equal(ddp_lr_scheduler_create(o, &bad, &s), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "MultiStepLR: milestones must increase (2 after 5)"));
    bad = (ddp_lr_options){.kind = DDP_LR_LINEAR, .start_factor = 0, .total_iters = 3};
    assert_int_equal(ddp_lr_scheduler_create(o, &bad, &s), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "LinearLR: start_factor 0 must be in (0, 1]"));
    bad = (ddp_lr_options){.kind = DDP_LR_COSINE};
    assert_int_equal(ddp_lr_scheduler_create(o, &bad, &s), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "CosineAnnealingLR: T_max 0 must be > 0"));
    bad = (ddp_lr_options){.kind = 42};
    assert_int_equal(ddp_lr_scheduler_create(o, &bad, &s), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "lr scheduler: unknown kind 42"));
    assert_true(ddp_optim_lr(o) == 0.1); /* untouched by the failures */
    ddp_lr_scheduler_destroy(NULL);
    ddp_optim_destroy(o);
    ddp_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_torch),
        cmocka_unit_test(test_state_access),
        cmocka_unit_test(test_adadelta_rmsprop_state),
        cmocka_unit_test(test_follows_repointed_grad),
        cmocka_unit_test(test_invalid_options),
        cmocka_unit_test(test_lr_schedules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
