/* torch.nn.init for libddp parameters: fans, gains, uniform/normal fills,
 * kaiming and xavier, and the public face of the library's generator.
 * Each function follows torch/nn/init.py (PyTorch 1.13) formula by formula;
 * the random draws are libddp's own stream (xoshiro256**, base/rng.c), so
 * values match PyTorch's distributions, not its bits. */
#include <math.h>
#include <string.h>

#include "base/error.h"
#include "nn/module.h"

/* ==== generators ========================================================== */

void ddp_generator_seed(ddp_generator *g, uint64_t seed)
{
    ddp__rng r;
    ddp__rng_seed(&r, seed);
    ddp__rng_to_gen(&r, g);
}

double ddp_generator_uniform(ddp_generator *g)
{
    ddp__rng r;
    ddp__gen_to_rng(g, &r);
    double u = ddp__rng_uniform(&r);
    ddp__rng_to_gen(&r, g);
    return u;
}

/* ==== fans and gains ====================================================== */

static int check_param(const ddp_param *p, const char *fn)
{
    DDP_FAIL_IF(!p || !p->data, DDP_ERR_INVALID_ARG, "%s: parameter is NULL", fn);
    return 0;
}

int ddp_init_calculate_fan(const ddp_param *p, int64_t *fan_in, int64_t *fan_out)
{
    DDP_TRY(check_param(p, "calculate_fan"));
    DDP_FAIL_IF(p->ndim < 2, DDP_ERR_INVALID_ARG,
                "calculate_fan: %s has %d dimension%s; fan in and fan out need at least 2",
                p->name, p->ndim, p->ndim == 1 ? "" : "s");
    int64_t receptive = 1; /* a conv weight (out, in, k...) */
    for (int d = 2; d < p->ndim; d++)
        receptive *= p->shape[d];
    if (fan_in)
        *fan_in = p->shape[1] * receptive;
    if (fan_out)
        *fan_out = p->shape[0] * receptive;
    return 0;
}

int ddp_init_calculate_gain(const char *nonlinearity, double a, double *gain)
{
    static const char *const one[] = {"linear", "conv1d", "conv2d", "conv3d",
                                      "conv_transpose1d", "conv_transpose2d",
                                      "conv_transpose3d", "sigmoid"};
    DDP_FAIL_IF(!nonlinearity || !gain, DDP_ERR_INVALID_ARG, "calculate_gain: NULL argument");
    for (size_t i = 0; i < sizeof one / sizeof one[0]; i++)
        if (strcmp(nonlinearity, one[i]) == 0)
            return *gain = 1.0, 0;
    if (strcmp(nonlinearity, "tanh") == 0)
        *gain = 5.0 / 3.0;
    else if (strcmp(nonlinearity, "relu") == 0)
        *gain = sqrt(2.0);
    else if (strcmp(nonlinearity, "leaky_relu") == 0)
        *gain = sqrt(2.0 / (1.0 + a * a));
    else if (strcmp(nonlinearity, "selu") == 0)
        *gain = 3.0 / 4.0;
    else
        return DDP_ERROR(DDP_ERR_INVALID_ARG,
                         "calculate_gain: unsupported nonlinearity \"%s\" (linear, conv1d, "
                         "conv2d, conv3d, sigmoid, tanh, relu, leaky_relu, selu)",
                         nonlinearity);
    return 0;
}

/* ==== fills =============================================================== */

int ddp_init_uniform(ddp_param *p, double a, double b, ddp_generator *gen)
{
    DDP_TRY(check_param(p, "init uniform"));
    DDP_FAIL_IF(!gen || !(a <= b), DDP_ERR_INVALID_ARG,
                "init uniform %s: NULL generator or empty range [%g, %g)", p->name, a, b);
    ddp__rng r;
    ddp__gen_to_rng(gen, &r);
    for (size_t i = 0; i < p->numel; i++) /* PyTorch's from + (to - from) * u */
        p->data[i] = (float)(a + (b - a) * ddp__rng_uniform(&r));
    ddp__rng_to_gen(&r, gen);
    return 0;
}

int ddp_init_normal(ddp_param *p, double mean, double std, ddp_generator *gen)
{
    DDP_TRY(check_param(p, "init normal"));
    DDP_FAIL_IF(!gen || !(std >= 0), DDP_ERR_INVALID_ARG,
                "init normal %s: NULL generator or std %g < 0", p->name, std);
    ddp__rng r;
    ddp__gen_to_rng(gen, &r);
    /* Box-Muller, both values of each pair used; 1 - u keeps log's argument
     * in (0, 1]. */
    for (size_t i = 0; i < p->numel; i += 2) {
        double u1 = 1.0 - ddp__rng_uniform(&r), u2 = ddp__rng_uniform(&r);
        double rad = sqrt(-2.0 * log(u1)), th = 2.0 * M_PI * u2;
        p->data[i] = (float)(mean + std * rad * cos(th));
        if (i + 1 < p->numel)
            p->data[i + 1] = (float)(mean + std * rad * sin(th));
    }
    ddp__rng_to_gen(&r, gen);
    return 0;
}

int ddp_init_constant(ddp_param *p, double value)
{
    DDP_TRY(check_param(p, "init constant"));
    for (size_t i = 0; i < p->numel; i++)
        p->data[i] = (float)value;
    return 0;
}

int ddp_init_zeros(ddp_param *p) { return ddp_init_constant(p, 0.0); }

int ddp_init_ones(ddp_param *p) { return ddp_init_constant(p, 1.0); }

/* ==== kaiming and xavier ================================================== */

/* gain / sqrt(fan) for kaiming_*. */
static int kaiming_std(const ddp_param *p, double a, ddp_fan_mode mode,
                       const char *nonlinearity, double *std)
{
    int64_t fan_in, fan_out;
    DDP_TRY(ddp_init_calculate_fan(p, &fan_in, &fan_out));
    DDP_FAIL_IF(mode != DDP_FAN_IN && mode != DDP_FAN_OUT, DDP_ERR_INVALID_ARG,
                "kaiming init %s: mode %d is not DDP_FAN_IN or DDP_FAN_OUT", p->name, (int)mode);
    int64_t fan = mode == DDP_FAN_IN ? fan_in : fan_out;
    DDP_FAIL_IF(fan == 0, DDP_ERR_INVALID_ARG, "kaiming init %s: zero-element tensor", p->name);
    double gain;
    DDP_TRY(ddp_init_calculate_gain(nonlinearity ? nonlinearity : "leaky_relu", a, &gain));
    *std = gain / sqrt((double)fan);
    return 0;
}

int ddp_init_kaiming_uniform(ddp_param *p, double a, ddp_fan_mode mode,
                             const char *nonlinearity, ddp_generator *gen)
{
    double std;
    DDP_TRY(check_param(p, "kaiming_uniform"));
    DDP_TRY(kaiming_std(p, a, mode, nonlinearity, &std));
    double bound = sqrt(3.0) * std;
    return ddp_init_uniform(p, -bound, bound, gen);
}

int ddp_init_kaiming_normal(ddp_param *p, double a, ddp_fan_mode mode,
                            const char *nonlinearity, ddp_generator *gen)
{
    double std;
    DDP_TRY(check_param(p, "kaiming_normal"));
    DDP_TRY(kaiming_std(p, a, mode, nonlinearity, &std));
    return ddp_init_normal(p, 0.0, std, gen);
}

/* gain * sqrt(2 / (fan_in + fan_out)) for xavier_*. */
static int xavier_std(const ddp_param *p, double gain, double *std)
{
    int64_t fan_in, fan_out;
    DDP_TRY(ddp_init_calculate_fan(p, &fan_in, &fan_out));
    DDP_FAIL_IF(fan_in + fan_out == 0, DDP_ERR_INVALID_ARG,
                "xavier init %s: zero-element tensor", p->name);
    *std = gain * sqrt(2.0 / (double)(fan_in + fan_out));
    return 0;
}

int ddp_init_xavier_uniform(ddp_param *p, double gain, ddp_generator *gen)
{
    double std;
    DDP_TRY(check_param(p, "xavier_uniform"));
    DDP_TRY(xavier_std(p, gain, &std));
    double a = sqrt(3.0) * std;
    return ddp_init_uniform(p, -a, a, gen);
}

int ddp_init_xavier_normal(ddp_param *p, double gain, ddp_generator *gen)
{
    double std;
    DDP_TRY(check_param(p, "xavier_normal"));
    DDP_TRY(xavier_std(p, gain, &std));
    return ddp_init_normal(p, 0.0, std, gen);
}
