/* Private module and parameter internals shared by module.c, model.c and
 * safetensors.c. */
#ifndef DDP_NN_MODULE_H
#define DDP_NN_MODULE_H

#include "base/rng.h"
#include "ddp/nn.h"
#include "ddp/nn_module.h"

enum ddp__module_kind {
    DDP_MOD_LINEAR,
    DDP_MOD_RELU,
    DDP_MOD_FLATTEN,
    DDP_MOD_DROPOUT,
    DDP_MOD_SEQUENTIAL,
    DDP_MOD_USER, /* a ddp_module_def (module_shim.c) */
};

#define DDP_MODULE_MAX_PARAMS 2

struct ddp_module {
    int kind;            /* enum ddp__module_kind */
    int training;
    int owned;           /* adopted by a container or a model */
    int nparams;
    ddp_param *params[DDP_MODULE_MAX_PARAMS]; /* registration order; names are local */
    int nchildren;
    ddp_module_t **children;                  /* Sequential */
    int in_features, out_features;            /* Linear */
    float p;                                  /* Dropout */
    ddp__rng rng;                             /* Dropout masks */
    const ddp_module_def *def;                /* DDP_MOD_USER: its type and state */
    void *user;
};

/* A standalone parameter with its own zeroed data and grad storage (moved
 * into the model's flat blocks when the model seals).  Caller destroys. */
int ddp__param_create(const char *name, int ndim, const int64_t *shape, ddp_param **out);
void ddp__param_destroy(ddp_param *p);
/* PyTorch's default init of a Linear from rng: weight then bias,
 * U(-1/sqrt(in), 1/sqrt(in)). */
void ddp__linear_reset(ddp_module_t *m, ddp__rng *rng);
/* A DDP_MOD_USER module's def->reset, drawing from rng (module_shim.c). */
void ddp__module_user_reset(ddp_module_t *m, ddp__rng *rng);

#endif
