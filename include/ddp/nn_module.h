/* libddp nn: user modules, buffers, PyTorch's initialisation.
 *
 * A module is PyTorch's nn.Module: a type (ddp_module_def: its forward, its
 * reset_parameters, how to free its state), the user's state, its own
 * parameters and buffers (register_parameter / register_buffer) and named
 * sub-modules, nested to any depth.  Names are PyTorch's state_dict names:
 * a parameter "weight" of child "conv1" of child "0" of child "layer1" is
 * "layer1.0.conv1.weight" once the module is in a sealed model.
 *
 * Orders, as PyTorch's:
 *   - parameters (the model's flat blocks, named_parameters): a module's own
 *     parameters in registration order, then each child's, depth first, in
 *     the order the children were added;
 *   - the state dict (safetensors files, checkpoints): for each module, its
 *     parameters, then its buffers, then its children's entries.
 *
 * Buffers are state that is saved and loaded with the model but is not a
 * parameter: never in the flat parameter/gradient blocks, never seen by
 * optimizers or DDP's gradient buckets (DDP broadcasts them from rank 0
 * instead, ddp.h broadcast_buffers).  A model keeps all its buffers in one
 * flat byte block (each at an 8-byte aligned offset), so that DDP sends them
 * in one broadcast.  dtype float32, or int64 (BatchNorm's
 * num_batches_tracked, saved as safetensors I64 as PyTorch writes it).
 *
 * Ownership: a module owns its parameters, buffers and children; a container
 * or model that adopts a module owns it from then on. */
#ifndef DDP_NN_MODULE_H_PUBLIC
#define DDP_NN_MODULE_H_PUBLIC

#include "ddp/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A buffer: a view into its model's buffer block once the model is sealed
 * (standalone storage before).  data may be written in place. */
typedef struct ddp_buffer {
    char name[DDP_PARAM_NAME_MAX]; /* state_dict name ("bn1.running_mean"); local before seal */
    ddp_dtype dtype;               /* DDP_FLOAT32 or DDP_INT64 */
    void *data;                    /* (shape) values */
    size_t numel, nbytes;
    int ndim;
    int64_t shape[DDP_TENSOR_MAX_DIM];
    size_t offset;                 /* bytes into the model's buffer block */
    int index;                     /* state-dict order among buffers, 0.. */
    struct {                       /* private to libddp */
        int owns_storage;
    } priv;
} ddp_buffer;

/* ==== generators ==========================================================
 * A seeded stream of random numbers (xoshiro256**, the generator of every
 * libddp layer).  Transparent so it can live on the stack; the state is
 * opaque in meaning. */
typedef struct ddp_generator {
    uint64_t s[4];
} ddp_generator;

DDP_API void ddp_generator_seed(ddp_generator *g, uint64_t seed);
/* A uniform double in [0, 1) (53 random bits). */
DDP_API double ddp_generator_uniform(ddp_generator *g);

/* ==== user modules ======================================================== */

typedef struct ddp_module_def {
    /* The type's name, for messages ("Linear", "BatchNorm2d", "BasicBlock"). */
    const char *type;
    /* Appends the module's ops to tape: *y from x.  user is the pointer given
     * to ddp_module_create.  Use ddp_tape_param for parameters and
     * ddp_module_forward to run children. */
    int (*forward)(ddp_module_t *m, ddp_tape_t *tape, ddp_var_t *x, ddp_var_t **y, void *user);
    /* PyTorch's reset_parameters (and reset_running_stats): re-draws the
     * module's OWN parameters and buffers from gen (children are reset by
     * the caller).  NULL: the module has nothing to reset. */
    int (*reset)(ddp_module_t *m, ddp_generator *gen, void *user);
    /* Frees user; NULL: user is not freed. */
    void (*destroy)(void *user);
} ddp_module_def;

/* A new module of type def (borrowed: it must outlive the module; usually a
 * static const) with state user (owned: def->destroy(user) is called when
 * the module is freed, and also when this call fails).  Training mode. */
DDP_API int ddp_module_create(const ddp_module_def *def, void *user, ddp_module_t **out);
/* register_parameter: a zero-initialised parameter named name (no '.', unique
 * among the module's parameters, buffers and children).  *out stays valid for
 * the module's life; its data pointer moves once, when the model seals. */
DDP_API int ddp_module_add_param(ddp_module_t *m, const char *name, int ndim,
                                 const int64_t *shape, ddp_param **out);
/* register_buffer: a zero-initialised buffer of dtype DDP_FLOAT32 or
 * DDP_INT64; same naming rules and pointer stability as parameters. */
DDP_API int ddp_module_add_buffer(ddp_module_t *m, const char *name, ddp_dtype dtype, int ndim,
                                  const int64_t *shape, ddp_buffer **out);
/* Adds child under name (takes ownership, also on failure, except when
 * child is m or one of its ancestors: that is refused and nothing is
 * freed); it takes the parent's training mode. */
DDP_API int ddp_module_add_child(ddp_module_t *m, const char *name, ddp_module_t *child);
/* The child by local name ("conv1", "0"), or NULL. */
DDP_API ddp_module_t *ddp_module_child_by_name(ddp_module_t *m, const char *name);
DDP_API int ddp_module_num_children(const ddp_module_t *m);
/* The module's own buffer by local name, or NULL. */
DDP_API ddp_buffer *ddp_module_buffer(ddp_module_t *m, const char *name);
/* The state given to ddp_module_create (borrowed). */
DDP_API void *ddp_module_user(const ddp_module_t *m);
/* The type's name (def->type). */
DDP_API const char *ddp_module_type(const ddp_module_t *m);
/* 1 in training mode, 0 in evaluation mode (ddp_module_train). */
DDP_API int ddp_module_is_training(const ddp_module_t *m);
/* The state of the module's own random stream (Dropout's: one draw per
 * forward seeds that forward's mask), *nwords words (4), borrowed and
 * writable; NULL with *nwords 0 for a module without one.  A checkpoint
 * keeps it with ddp_checkpoint_rng so that a resumed run draws the masks
 * of the uninterrupted one (nwords may be NULL). */
DDP_API uint64_t *ddp_module_rng_state(ddp_module_t *m, int *nwords);

/* named_modules(): calls fn for m itself (name prefix) and every descendant
 * with its full dotted name, parents before children, in the order added.
 * Stops at the first negative return and returns it. */
typedef int (*ddp_module_visit_fn)(ddp_module_t *m, const char *name, void *user);
DDP_API int ddp_module_visit(ddp_module_t *m, const char *prefix, ddp_module_visit_fn fn,
                             void *user);
/* The same over every module of a model, in registration order. */
DDP_API int ddp_model_visit_modules(ddp_model_t *m, ddp_module_visit_fn fn, void *user);

/* ==== a model's buffers =================================================== */

/* Number of buffers and the i-th in state-dict order (NULL when out of
 * range); by state_dict name (NULL if absent).  Seal the model. */
DDP_API size_t ddp_model_num_buffers(ddp_model_t *m);
DDP_API ddp_buffer *ddp_model_buffer(ddp_model_t *m, size_t i);
DDP_API ddp_buffer *ddp_model_find_buffer(ddp_model_t *m, const char *name);
/* The buffer block (borrowed) and its size in bytes; NULL with 0 when the
 * model has no buffers.  Buffer i occupies [b->offset, b->offset + b->nbytes). */
DDP_API void *ddp_model_buffer_block(ddp_model_t *m, size_t *nbytes);

/* ==== initialisation (torch.nn.init) ======================================
 * Each fills p->data (all p->numel values) in place, drawing from gen in
 * element order, as PyTorch's functions of the same name.  Fans follow
 * torch.nn.init._calculate_fan_in_and_fan_out: for a weight of shape
 * (out, in, k...) fan_in = in * prod(k), fan_out = out * prod(k); fewer than
 * 2 dimensions fail with DDP_ERR_INVALID_ARG. */

typedef enum ddp_fan_mode { DDP_FAN_IN = 0, DDP_FAN_OUT = 1 } ddp_fan_mode;

DDP_API int ddp_init_calculate_fan(const ddp_param *p, int64_t *fan_in, int64_t *fan_out);
/* calculate_gain: "linear", "conv1d", "conv2d", "conv3d", "sigmoid" -> 1,
 * "tanh" -> 5/3, "relu" -> sqrt(2), "leaky_relu" -> sqrt(2 / (1 + a^2)),
 * "selu" -> 3/4; anything else fails. */
DDP_API int ddp_init_calculate_gain(const char *nonlinearity, double a, double *gain);
/* U(a, b) and N(mean, std). */
DDP_API int ddp_init_uniform(ddp_param *p, double a, double b, ddp_generator *gen);
DDP_API int ddp_init_normal(ddp_param *p, double mean, double std, ddp_generator *gen);
DDP_API int ddp_init_constant(ddp_param *p, double value);
DDP_API int ddp_init_zeros(ddp_param *p);
DDP_API int ddp_init_ones(ddp_param *p);
/* kaiming_uniform_: U(-bound, bound), bound = gain * sqrt(3 / fan), gain from
 * (nonlinearity, a); kaiming_normal_: N(0, gain / sqrt(fan)).  PyTorch's
 * defaults: a 0, mode DDP_FAN_IN, nonlinearity "leaky_relu". */
DDP_API int ddp_init_kaiming_uniform(ddp_param *p, double a, ddp_fan_mode mode,
                                     const char *nonlinearity, ddp_generator *gen);
DDP_API int ddp_init_kaiming_normal(ddp_param *p, double a, ddp_fan_mode mode,
                                    const char *nonlinearity, ddp_generator *gen);
/* xavier_uniform_: U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out));
 * xavier_normal_: N(0, gain * sqrt(2 / (fan_in + fan_out))). */
DDP_API int ddp_init_xavier_uniform(ddp_param *p, double gain, ddp_generator *gen);
DDP_API int ddp_init_xavier_normal(ddp_param *p, double gain, ddp_generator *gen);

/* ==== BatchNorm =========================================================
 * nn.BatchNorm1d / nn.BatchNorm2d over x (N, C, *): statistics per channel
 * over N and the spatial dimensions.  Training: normalise with the batch's
 * mean and biased variance; the running mean and variance move by momentum
 * toward the batch mean and the UNBIASED batch variance, as PyTorch does.
 * Evaluation: normalise with the running statistics. */

/* The statistics hook of SyncBatchNorm: sums buf[0..n) in place over every
 * replica that shares the batch (an all-reduce), returning 0 or a negative
 * code.  Forward calls it once with (sum x (C), sum x^2 (C), count (1));
 * backward once with (sum dy (C), sum dy*xhat (C)).  In doubles so that
 * E[x^2] - E[x]^2 keeps its digits. */
typedef int (*ddp_batch_norm_stats_fn)(double *buf, size_t n, void *user);

typedef struct ddp_batch_norm_args {
    float *running_mean, *running_var; /* (C) each, or NULL (not tracked) */
    int training;     /* 1: batch statistics (and update the running ones if given);
                         0: the running statistics (which must be given) */
    double momentum;  /* weight of this batch in the running update, in [0, 1] */
    double eps;       /* added to the variance: 1e-5 */
    ddp_batch_norm_stats_fn stats; /* NULL: this process's batch alone */
    void *stats_user;
} ddp_batch_norm_args;

/* The op: x (N, C, *) with ndim >= 2, weight and bias (C) or NULL (affine
 * off), y of x's shape.  Training with one value per channel (N * spatial
 * == 1 over all replicas) fails as PyTorch does.  Backward order: bias,
 * weight, x. */
DDP_API int ddp_op_batch_norm(ddp_tape_t *tape, ddp_var_t *x, ddp_var_t *weight,
                              ddp_var_t *bias, const ddp_batch_norm_args *args,
                              ddp_var_t **y);

typedef struct ddp_batchnorm_options {
    int num_features;        /* C */
    double eps;              /* 1e-5 */
    double momentum;         /* 0.1 */
    int cumulative_average;  /* 0; 1: PyTorch's momentum=None (weight 1 / batches seen) */
    int affine;              /* 1: parameters weight (ones) and bias (zeros) */
    int track_running_stats; /* 1: buffers running_mean (zeros), running_var (ones),
                                num_batches_tracked (int64 0) */
} ddp_batchnorm_options;

/* PyTorch's defaults for C features. */
DDP_API ddp_batchnorm_options ddp_batchnorm_defaults(int num_features);
/* BatchNorm1d takes (N, C) or (N, C, L); BatchNorm2d (N, C, H, W).  Without
 * running statistics, evaluation uses batch statistics too (as PyTorch). */
DDP_API int ddp_batchnorm1d_create(const ddp_batchnorm_options *o, ddp_module_t **out);
DDP_API int ddp_batchnorm2d_create(const ddp_batchnorm_options *o, ddp_module_t **out);
/* Is m a BatchNorm1d/2d module? */
DDP_API int ddp_module_is_batchnorm(const ddp_module_t *m);
/* Installs the statistics hook of a BatchNorm module (NULL fn: local
 * statistics again).  DDP_ERR_INVALID_ARG if m is not a BatchNorm. */
DDP_API int ddp_batchnorm_set_stats_hook(ddp_module_t *m, ddp_batch_norm_stats_fn fn,
                                         void *user);

#ifdef __cplusplus
}
#endif
#endif
