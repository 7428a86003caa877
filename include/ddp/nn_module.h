/* libddp nn: user modules (a STAND-IN SUBSET).
 *
 * The modules helper of issue 15 owns this header and is writing the full
 * user-module API (buffers, children by name, torch.nn.init); this branch
 * (conv) carries only the declarations its layers use, with the same names
 * and signatures, so that it builds on its own.  When both branches meet,
 * the modules helper's header replaces this one (src/nn/module_shim.c goes
 * with it). */
#ifndef DDP_NN_MODULE_H_PUBLIC
#define DDP_NN_MODULE_H_PUBLIC

#include "ddp/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A seeded stream of random numbers (xoshiro256**). */
typedef struct ddp_generator {
    uint64_t s[4];
} ddp_generator;

DDP_API void ddp_generator_seed(ddp_generator *g, uint64_t seed);
/* A uniform double in [0, 1) (53 random bits). */
DDP_API double ddp_generator_uniform(ddp_generator *g);

typedef struct ddp_module_def {
    const char *type; /* the type's name, for messages */
    /* Appends the module's ops to tape: *y from x. */
    int (*forward)(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y, void *user);
    /* Re-draws the module's own parameters from gen; NULL: nothing to reset. */
    int (*reset)(ddp_module_t *m, ddp_generator *gen, void *user);
    /* Frees user; NULL: user is not freed. */
    void (*destroy)(void *user);
} ddp_module_def;

/* A new module of type def (borrowed) with state user (owned: def->destroy
 * frees it with the module, and when this call fails).  Training mode. */
DDP_API int ddp_module_create(const ddp_module_def *def, void *user, ddp_module_t **out);
/* register_parameter: a zero-initialised parameter named name. */
DDP_API int ddp_module_add_param(ddp_module_t *m, const char *name, int ndim,
                                 const int64_t *shape, ddp_param **out);
/* 1 in training mode, 0 in evaluation mode. */
DDP_API int ddp_module_is_training(const ddp_module_t *m);
/* U(a, b) into every value of p, in element order. */
DDP_API int ddp_init_uniform(ddp_param *p, double a, double b, ddp_generator *gen);

#ifdef __cplusplus
}
#endif
#endif
