/* Private module, parameter and buffer internals shared by module.c,
 * layers.c, batchnorm.c, model.c and safetensors.c. */
#ifndef DDP_NN_MODULE_H
#define DDP_NN_MODULE_H

#include "base/rng.h"
#include "ddp/nn.h"

struct ddp_module {
    const ddp_module_def *def;
    void *user;
    int training;
    int owned;                /* adopted by a container or a model */
    int nparams, params_cap;
    ddp_param **params;       /* own, registration order; local names until sealed */
    int nbuffers, buffers_cap;
    ddp_buffer **buffers;     /* own, registration order */
    int nchildren, children_cap;
    ddp_module_t **children;  /* in the order added */
    char **child_names;       /* (nchildren) local names */
    ddp__rng *rng;            /* the module's random stream in user (Dropout's masks), or
                                 NULL: ddp_module_rng_state, for checkpoints */
};

/* A standalone parameter with its own zeroed data and grad storage (moved
 * into the model's flat blocks when the model seals).  Caller destroys. */
int ddp__param_create(const char *name, int ndim, const int64_t *shape, ddp_param **out);
void ddp__param_destroy(ddp_param *p);
/* The same for a buffer (its storage moves into the model's buffer block). */
int ddp__buffer_create(const char *name, ddp_dtype dtype, int ndim, const int64_t *shape,
                       ddp_buffer **out);
void ddp__buffer_destroy(ddp_buffer *b);
/* Frees m, its state and its subtree (whether owned or not). */
void ddp__module_free(ddp_module_t *m);
/* reset_parameters over m's subtree: each module's def->reset, parents
 * first, from the one generator gen. */
int ddp__module_reset(ddp_module_t *m, ddp_generator *gen);
/* One state-dict entry: a parameter or a buffer, with its full name. */
typedef struct ddp__sd_item {
    const char *name;
    ddp_param *param;   /* or */
    ddp_buffer *buffer;
} ddp__sd_item;
/* The model's state dict in PyTorch's order (each module's parameters, its
 * buffers, then its children's entries); borrowed; seals the model. */
int ddp__model_state_dict(ddp_model_t *m, const ddp__sd_item **items, size_t *n);

/* The generator's state as the library's rng (same algorithm, same stream). */
static inline void ddp__gen_to_rng(const ddp_generator *g, ddp__rng *r)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = g->s[i];
}
static inline void ddp__rng_to_gen(const ddp__rng *r, ddp_generator *g)
{
    for (int i = 0; i < 4; i++)
        g->s[i] = r->s[i];
}

#endif
