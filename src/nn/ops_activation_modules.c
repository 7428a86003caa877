/* Activation modules (nn.LeakyReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid,
 * nn.Softmax, nn.LogSoftmax): parameterless user modules, one type each,
 * whose forward runs the op of ops_activation.c / ops.c.
 * They are user modules (ddp/nn_module.h, ddp_module_create). */
#include <math.h>
#include <stdlib.h>

#include "base/error.h"
#include "ddp/nn_module.h"
#include "ddp/nn_ops.h"

/* The module's arguments (its user state; freed with it). */
typedef struct act_args {
    float slope; /* LeakyReLU */
    int approx;  /* GELU */
    int dim;     /* Softmax, LogSoftmax */
} act_args;

static int leaky_fwd(ddp_module_t *m, ddp_tape_t *t, ddp_var_t *x, ddp_var_t **y, void *u)
{
    (void)m;
    return ddp_op_leaky_relu(t, x, ((const act_args *)u)->slope, y);
}
static int gelu_fwd(ddp_module_t *m, ddp_tape_t *t, ddp_var_t *x, ddp_var_t **y, void *u)
{
    (void)m;
    return ddp_op_gelu(t, x, ((const act_args *)u)->approx, y);
}
static int silu_fwd(ddp_module_t *m, ddp_tape_t *t, ddp_var_t *x, ddp_var_t **y, void *u)
{
    (void)m, (void)u;
    return ddp_op_silu(t, x, y);
}
static int tanh_fwd(ddp_module_t *m, ddp_tape_t *t, ddp_var_t *x, ddp_var_t **y, void *u)
{
    (void)m, (void)u;
    return ddp_op_tanh(t, x, y);
}
static int sigmoid_fwd(ddp_module_t *m, ddp_tape_t *t, ddp_var_t *x, ddp_var_t **y, void *u)
{
    (void)m, (void)u;
    return ddp_op_sigmoid(t, x, y);
}
static int softmax_fwd(ddp_module_t *m, ddp_tape_t *t, ddp_var_t *x, ddp_var_t **y, void *u)
{
    (void)m;
    return ddp_op_softmax(t, x, ((const act_args *)u)->dim, y);
}
static int log_softmax_fwd(ddp_module_t *m, ddp_tape_t *t, ddp_var_t *x, ddp_var_t **y, void *u)
{
    (void)m;
    return ddp_op_log_softmax_dim(t, x, ((const act_args *)u)->dim, y);
}

static const ddp_module_def leaky_relu_def = {"LeakyReLU", leaky_fwd, NULL, free};
static const ddp_module_def gelu_def = {"GELU", gelu_fwd, NULL, free};
static const ddp_module_def silu_def = {"SiLU", silu_fwd, NULL, NULL};
static const ddp_module_def tanh_def = {"Tanh", tanh_fwd, NULL, NULL};
static const ddp_module_def sigmoid_def = {"Sigmoid", sigmoid_fwd, NULL, NULL};
static const ddp_module_def softmax_def = {"Softmax", softmax_fwd, NULL, free};
static const ddp_module_def log_softmax_def = {"LogSoftmax", log_softmax_fwd, NULL, free};

/* A module of type def with arguments a (copied). */
static int with_args(const ddp_module_def *def, act_args a, ddp_module_t **out)
{
    DDP_FAIL_IF(!out, DDP_ERR_INVALID_ARG, "%s: out is NULL", def->type);
    act_args *u = malloc(sizeof *u);
    DDP_FAIL_IF(!u, DDP_ERR_NOMEM, "%s: out of memory", def->type);
    *u = a;
    return ddp_module_create(def, u, out); /* frees u on failure */
}

int ddp_leaky_relu_create(float slope, ddp_module_t **out)
{
    DDP_FAIL_IF(!isfinite(slope), DDP_ERR_INVALID_ARG, "LeakyReLU: slope %g is not finite",
                (double)slope);
    return with_args(&leaky_relu_def, (act_args){.slope = slope}, out);
}

int ddp_gelu_create(int approx, ddp_module_t **out)
{
    DDP_FAIL_IF(approx != DDP_GELU_EXACT && approx != DDP_GELU_TANH, DDP_ERR_INVALID_ARG,
                "GELU: approximation %d is neither DDP_GELU_EXACT nor DDP_GELU_TANH", approx);
    return with_args(&gelu_def, (act_args){.approx = approx}, out);
}

int ddp_silu_create(ddp_module_t **out) { return ddp_module_create(&silu_def, NULL, out); }
int ddp_tanh_create(ddp_module_t **out) { return ddp_module_create(&tanh_def, NULL, out); }
int ddp_sigmoid_create(ddp_module_t **out) { return ddp_module_create(&sigmoid_def, NULL, out); }

int ddp_softmax_create(int dim, ddp_module_t **out)
{
    return with_args(&softmax_def, (act_args){.dim = dim}, out);
}

int ddp_log_softmax_create(int dim, ddp_module_t **out)
{
    return with_args(&log_softmax_def, (act_args){.dim = dim}, out);
}
