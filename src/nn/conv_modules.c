/* The convolution and pooling layers as modules (torch.nn's Conv2d,
 * MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, Dropout2d, Identity): each a
 * ddp_module_def whose forward appends one op of conv.c or pool.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/rng.h"
#include "nn/conv.h"
#include "nn/module.h"

/* ==== Conv2d ============================================================== */

typedef struct conv2d {
    ddp_conv2d_options o;
    ddp_param *weight, *bias; /* bias NULL without one */
} conv2d;

static int conv2d_run(conv2d *c, ddp_tape_t *tape, ddp_var_t *x, int epilogue, ddp_var_t **y)
{
    ddp_var_t *w, *b = NULL;
    DDP_TRY(ddp_tape_param(tape, c->weight, &w));
    if (c->bias)
        DDP_TRY(ddp_tape_param(tape, c->bias, &b));
    return ddp__op_conv2d_fused(tape, x, w, b, &c->o, epilogue, y);
}

static int conv2d_forward(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y,
                          void *user)
{
    (void)m;
    return conv2d_run(user, tape, x, DDP__CONV_PLAIN, y);
}

static int conv2d_reset(ddp_module_t *m, ddp_generator *gen, void *user)
{
    (void)m;
    conv2d *c = user;
    /* kaiming_uniform_(a=sqrt(5)): bound = gain * sqrt(3 / fan_in) with gain
     * = sqrt(2 / (1 + 5)), that is 1/sqrt(fan_in); the bias's bound is
     * 1/sqrt(fan_in) too.  Weight first, then bias, as PyTorch draws. */
    double fan_in = (double)(c->o.in_channels / c->o.groups) * c->o.kernel_size[0] *
                    c->o.kernel_size[1];
    double bound = 1.0 / sqrt(fan_in);
    DDP_TRY(ddp_init_uniform(c->weight, -bound, bound, gen));
    return c->bias ? ddp_init_uniform(c->bias, -bound, bound, gen) : 0;
}

static const ddp_module_def conv2d_def = {"Conv2d", conv2d_forward, conv2d_reset, free};

int ddp__conv2d_module_is(const ddp_module_t *m) { return m && m->def == &conv2d_def; }

int ddp__conv2d_module_forward(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, int epilogue,
                               ddp_var_t **y)
{
    DDP_FAIL_IF(!ddp__conv2d_module_is(m) || !y, DDP_ERR_INVALID_ARG,
                "conv2d forward: not a Conv2d module, or a NULL output");
    return conv2d_run(m->user, tape, x, epilogue, y);
}

static int conv2d_check(const ddp_conv2d_options *o)
{
    DDP_FAIL_IF(!o, DDP_ERR_INVALID_ARG, "conv2d: options are NULL");
    DDP_FAIL_IF(o->in_channels <= 0 || o->out_channels <= 0, DDP_ERR_INVALID_ARG,
                "conv2d: in_channels %d and out_channels %d must be > 0", o->in_channels,
                o->out_channels);
    DDP_FAIL_IF(o->kernel_size[0] < 1 || o->kernel_size[1] < 1, DDP_ERR_INVALID_ARG,
                "conv2d: kernel size (%d, %d) must be >= 1", o->kernel_size[0],
                o->kernel_size[1]);
    DDP_FAIL_IF(o->groups < 1 || o->in_channels % o->groups || o->out_channels % o->groups,
                DDP_ERR_INVALID_ARG,
                "conv2d: groups %d must divide in_channels %d and out_channels %d", o->groups,
                o->in_channels, o->out_channels);
    return ddp__conv_check_pairs("conv2d", o->stride, o->padding, o->dilation);
}

int ddp_conv2d_create(const ddp_conv2d_options *o, uint64_t seed, ddp_module_t **out)
{
    DDP_TRY(conv2d_check(o));
    conv2d *c = calloc(1, sizeof *c);
    DDP_FAIL_IF(!c, DDP_ERR_NOMEM, "conv2d: out of memory");
    c->o = *o;
    ddp_module_t *m;
    DDP_TRY(ddp_module_create(&conv2d_def, c, &m));
    int rc = ddp_module_add_param(m, "weight", 4,
                                  (int64_t[]){o->out_channels, o->in_channels / o->groups,
                                              o->kernel_size[0], o->kernel_size[1]},
                                  &c->weight);
    if (rc == 0 && o->bias)
        rc = ddp_module_add_param(m, "bias", 1, (int64_t[]){o->out_channels}, &c->bias);
    ddp_generator gen;
    ddp_generator_seed(&gen, seed);
    if (rc == 0)
        rc = conv2d_reset(m, &gen, c);
    if (rc < 0) {
        ddp_module_destroy(m);
        return rc;
    }
    *out = m;
    return 0;
}

/* ==== pools =============================================================== */

typedef struct pool2d {
    ddp_pool2d_options o;
    int oh, ow; /* adaptive */
} pool2d;

static int max_pool_forward(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y,
                            void *user)
{
    (void)m;
    return ddp_op_max_pool2d(tape, x, &((pool2d *)user)->o, y);
}

static int avg_pool_forward(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y,
                            void *user)
{
    (void)m;
    return ddp_op_avg_pool2d(tape, x, &((pool2d *)user)->o, y);
}

static int adaptive_forward(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y,
                            void *user)
{
    (void)m;
    pool2d *p = user;
    return ddp_op_adaptive_avg_pool2d(tape, x, p->oh, p->ow, y);
}

static const ddp_module_def max_pool_def = {"MaxPool2d", max_pool_forward, NULL, free};
static const ddp_module_def avg_pool_def = {"AvgPool2d", avg_pool_forward, NULL, free};
static const ddp_module_def adaptive_def = {"AdaptiveAvgPool2d", adaptive_forward, NULL, free};

int ddp__max_pool2_module_is(const ddp_module_t *m)
{
    if (!m || m->def != &max_pool_def)
        return 0;
    const ddp_pool2d_options *o = &((const pool2d *)m->user)->o;
    int ok = 1;
    for (int i = 0; i < 2; i++) /* stride 0 is the kernel size */
        ok &= o->kernel_size[i] == 2 && (o->stride[i] == 2 || o->stride[i] == 0) &&
              o->padding[i] == 0 && o->dilation[i] == 1;
    return ok;
}

static int pool_create(const ddp_module_def *def, const ddp_pool2d_options *o, int oh, int ow,
                       ddp_module_t **out)
{
    pool2d *p = calloc(1, sizeof *p);
    DDP_FAIL_IF(!p, DDP_ERR_NOMEM, "%s: out of memory", def->type);
    if (o)
        p->o = *o;
    p->oh = oh, p->ow = ow;
    return ddp_module_create(def, p, out);
}

/* What the op would refuse, refused at creation (no input needed). */
static int pool_check(const char *op, const ddp_pool2d_options *o)
{
    DDP_FAIL_IF(!o, DDP_ERR_INVALID_ARG, "%s: options are NULL", op);
    DDP_FAIL_IF(o->kernel_size[0] < 1 || o->kernel_size[1] < 1, DDP_ERR_INVALID_ARG,
                "%s: kernel size (%d, %d) must be >= 1", op, o->kernel_size[0],
                o->kernel_size[1]);
    int st[2] = {o->stride[0] ? o->stride[0] : 1, o->stride[1] ? o->stride[1] : 1};
    return ddp__conv_check_pairs(op, st, o->padding, o->dilation);
}

int ddp_max_pool2d_create(const ddp_pool2d_options *o, ddp_module_t **out)
{
    DDP_TRY(pool_check("max_pool2d", o));
    return pool_create(&max_pool_def, o, 0, 0, out);
}

int ddp_avg_pool2d_create(const ddp_pool2d_options *o, ddp_module_t **out)
{
    DDP_TRY(pool_check("avg_pool2d", o));
    return pool_create(&avg_pool_def, o, 0, 0, out);
}

int ddp_adaptive_avg_pool2d_create(int oh, int ow, ddp_module_t **out)
{
    DDP_FAIL_IF(oh < 1 || ow < 1, DDP_ERR_INVALID_ARG,
                "adaptive_avg_pool2d: output size (%d, %d) must be >= 1", oh, ow);
    return pool_create(&adaptive_def, NULL, oh, ow, out);
}

/* ==== Dropout2d, Identity ================================================= */

typedef struct dropout2d {
    float p;
    ddp__rng rng; /* masks: one seed per forward */
} dropout2d;

static int dropout2d_forward(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y,
                             void *user)
{
    dropout2d *d = user;
    int training = ddp_module_is_training(m);
    uint64_t seed = training ? ddp__rng_next(&d->rng) : 0; /* eval draws nothing */
    return ddp_op_dropout2d(tape, x, d->p, training, seed, y);
}

static const ddp_module_def dropout2d_def = {"Dropout2d", dropout2d_forward, NULL, free};

int ddp_dropout2d_create(float p, uint64_t seed, ddp_module_t **out)
{
    DDP_FAIL_IF(!(p >= 0.0f && p <= 1.0f), DDP_ERR_INVALID_ARG,
                "dropout2d: probability %g is not in [0, 1]", (double)p);
    dropout2d *d = calloc(1, sizeof *d);
    DDP_FAIL_IF(!d, DDP_ERR_NOMEM, "dropout2d: out of memory");
    d->p = p;
    ddp__rng_seed(&d->rng, seed);
    DDP_TRY(ddp_module_create(&dropout2d_def, d, out));
    (*out)->rng = &d->rng; /* checkpoints keep where the masks are, as Dropout's */
    return 0;
}

static int identity_forward(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y,
                            void *user)
{
    (void)m, (void)tape, (void)user;
    *y = x;
    return 0;
}

static const ddp_module_def identity_def = {"Identity", identity_forward, NULL, NULL};

int ddp_identity_create(ddp_module_t **out) { return ddp_module_create(&identity_def, NULL, out); }
