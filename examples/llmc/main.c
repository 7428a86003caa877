/* ddp-llmc: ddp-mnist's model written by hand in llm.c's style (model.c),
 * trained data-parallel with the reducer (include/ddp/reducer.h) instead of
 * DistributedDataParallel: the program owns its forward, its backward and
 * its parameters; the reducer owns the gradient buckets, launches each
 * bucket's all-reduce the moment backward marks its last tensor ready, and
 * checks that every rank has the same tensors.
 *
 *   ddprun --standalone --nproc-per-node 2 ddp-llmc --epochs 1
 *   ddp-llmc --data DIR --epochs N --batch-size B --lr X --momentum X
 *            --seed S --no-shuffle --save FILE --max-steps N
 *            --init-method URL --rank R --world-size W --backend tcp --timeout S
 *
 * The weights start as ddp-mnist's (libddp's PyTorch-default init from
 * --seed, drawn through a throwaway model), the batches are ddp-mnist's
 * (the same loader and DistributedSampler), the step is SGD's formula
 * (src/optim/optim.c): so with the same flags the --save file is byte for
 * byte ddp-mnist's (tests/test_llmc.c).  Exit status 0, 2 for bad flags or
 * a missing or broken data set, 1 for any other failure. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llmc.h"

typedef struct args {
    const char *data, *save, *init_method, *backend;
    long epochs, batch, max_steps, rank, world_size;
    double lr, momentum, timeout;
    unsigned long long seed;
    int shuffle;
} args;

static int bad_usage(const char *what, const char *value)
{
    fprintf(stderr, "ddp-llmc: %s '%s' (see the top of examples/llmc/main.c)\n", what, value);
    return 2;
}

static int parse_args(int argc, char **argv, args *a)
{
    enum { O_DATA = 256, O_EPOCHS, O_BATCH, O_LR, O_MOM, O_SEED, O_NOSHUF, O_SAVE, O_MAX,
           O_INIT, O_RANK, O_WORLD, O_BACKEND, O_TIMEOUT };
    static const struct option opts[] = {
        {"data", 1, NULL, O_DATA},       {"epochs", 1, NULL, O_EPOCHS},
        {"batch-size", 1, NULL, O_BATCH}, {"lr", 1, NULL, O_LR},
        {"momentum", 1, NULL, O_MOM},    {"seed", 1, NULL, O_SEED},
        {"no-shuffle", 0, NULL, O_NOSHUF}, {"save", 1, NULL, O_SAVE},
        {"max-steps", 1, NULL, O_MAX},   {"init-method", 1, NULL, O_INIT},
        {"rank", 1, NULL, O_RANK},       {"world-size", 1, NULL, O_WORLD},
        {"backend", 1, NULL, O_BACKEND}, {"timeout", 1, NULL, O_TIMEOUT},
        {NULL, 0, NULL, 0}};
    *a = (args){.data = "/usr/share/datasets/fashion-mnist", .backend = "tcp", .epochs = 1,
                .batch = 64, .max_steps = -1, .rank = -1, .world_size = -1, .lr = 0.1,
                .timeout = 300, .shuffle = 1};
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
        char *end = NULL;
        long *l = c == O_EPOCHS ? &a->epochs : c == O_BATCH ? &a->batch : c == O_MAX ? &a->max_steps
                : c == O_RANK ? &a->rank : c == O_WORLD ? &a->world_size : NULL;
        double *d = c == O_LR ? &a->lr : c == O_MOM ? &a->momentum : c == O_TIMEOUT ? &a->timeout
                                                                                      : NULL;
        if (l || c == O_SEED) {
            long v = strtol(optarg, &end, 10);
            if (!*optarg || *end || v < 0 || v > 0x7fffffffL || (c == O_BATCH && v < 1))
                return bad_usage("bad integer", optarg);
            if (l)
                *l = v;
            else
                a->seed = (unsigned long long)v;
        } else if (d) {
            *d = strtod(optarg, &end);
            if (!*optarg || *end || !(*d >= 0) || *d > 1e9)
                return bad_usage("bad number", optarg);
        } else if (c == O_DATA) {
            a->data = optarg;
        } else if (c == O_SAVE) {
            a->save = optarg;
        } else if (c == O_INIT) {
            a->init_method = optarg;
        } else if (c == O_BACKEND) {
            a->backend = optarg;
        } else if (c == O_NOSHUF) {
            a->shuffle = 0;
        } else {
            return bad_usage("unknown option or missing value", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return bad_usage("unexpected argument", argv[optind]);
    if ((a->rank < 0) != (a->world_size < 0) || (a->rank >= 0 && a->rank >= a->world_size))
        return bad_usage("--rank and --world-size go together, rank below world size", "");
    return 0;
}

/* ==== the job ============================================================= */

typedef struct job {
    const args *a;
    int rank, world;
    ddp_pg_t *pg;          /* NULL when alone */
    ddp_reducer_t *red;    /* NULL when alone */
    ddp_model_t *init;     /* the throwaway model: initial weights, then the --save file */
    float *params;         /* (NPARAMS) the flat parameter block */
    float *grads;          /* (NPARAMS) alone: the flat gradient block */
    float *momentum;       /* (NPARAMS) SGD's momentum buffer, or NULL */
    mlp_tensors p, g;
    mlp_acts acts;
    long steps;
} job;

/* As ddp-mnist's join_job: rank and world from the flags or the launcher. */
static int join_job(job *j)
{
    ddp_launch_info li;
    int rc = ddp_launch_info_from_env(&li);
    if (rc == DDP_ERR_INVALID_ARG)
        return rc;
    j->rank = j->a->rank >= 0 ? (int)j->a->rank : rc == 0 ? li.rank : 0;
    j->world = j->a->rank >= 0 ? (int)j->a->world_size : rc == 0 ? li.world_size : 1;
    if (j->world == 1 && !j->a->init_method)
        return 0;
    return ddp_init_process_group(j->a->backend, j->a->init_method ? j->a->init_method : "env://",
                                  j->rank, j->world, j->a->timeout, &j->pg);
}

/* ddp-mnist's model, only to draw its initial weights (and to name the
 * tensors of the saved file); training never touches it. */
static int make_init_model(unsigned long long seed, ddp_model_t **m)
{
    ddp_module_t *layers[3] = {NULL, NULL, NULL}, *seq;
    int rc;
    if ((rc = ddp_linear_create(IN, HIDDEN, 1, 0, &layers[0])) < 0 ||
        (rc = ddp_relu_create(&layers[1])) < 0 ||
        (rc = ddp_linear_create(HIDDEN, CLASSES, 1, 0, &layers[2])) < 0) {
        for (int i = 0; i < 3; i++)
            ddp_module_destroy(layers[i]);
        return rc;
    }
    if ((rc = ddp_sequential_create(layers, 3, &seq)) < 0 ||
        (rc = ddp_model_from_module(seq, m)) < 0)
        return rc;
    return ddp_model_reset_parameters(*m, seed);
}

static int setup(job *j)
{
    size_t n;
    int rc;
    if ((rc = make_init_model(j->a->seed, &j->init)) < 0)
        return rc;
    float *block = ddp_model_param_block(j->init, &n);
    if (n != NPARAMS)
        return DDP_ERR_STATE;
    j->params = malloc(NPARAMS * sizeof *j->params);
    if (!j->params || (rc = mlp_acts_create(&j->acts, (size_t)j->a->batch)) < 0)
        return DDP_ERR_NOMEM;
    memcpy(j->params, block, NPARAMS * sizeof *j->params);
    mlp_carve(&j->p, j->params);
    if (j->a->momentum > 0 && !(j->momentum = calloc(NPARAMS, sizeof *j->momentum)))
        return DDP_ERR_NOMEM;
    if (!j->pg) {
        if (!(j->grads = calloc(NPARAMS, sizeof *j->grads)))
            return DDP_ERR_NOMEM;
        mlp_carve(&j->g, j->grads);
        return 0;
    }
    /* The gradients are the reducer's (bucket memory, no copies); rank 0's
     * weights go to all, as DDP does at its creation. */
    ddp_grad_region regs[NTENSORS];
    for (int i = 0; i < NTENSORS; i++)
        regs[i] = (ddp_grad_region){tensor_names[i], NULL, tensor_sizes[i]};
    if ((rc = ddp_reducer_create(j->pg, regs, NTENSORS, NULL, &j->red)) < 0)
        return rc;
    return ddp_pg_broadcast(j->pg, j->params, NPARAMS, DDP_FLOAT32, 0);
}

/* ==== a step ============================================================== */

static int grad_of(void *user, int i, float **g)
{
    job *j = user;
    if (j->red)
        return ddp_reducer_grad_buffer(j->red, i, g);
    float *mine[NTENSORS] = {j->g.w1, j->g.b1, j->g.w2, j->g.b2};
    *g = mine[i];
    return 0;
}

static int ready(void *user, int i)
{
    job *j = user;
    return j->red ? ddp_reducer_mark_ready(j->red, i) : 0;
}

/* torch.optim.SGD's update (weight_decay 0, dampening 0), written as
 * src/optim/optim.c writes it so that the floats round alike. */
static void sgd_step(job *j)
{
    const float lr = (float)j->a->lr, mom = (float)j->a->momentum, wd = 0.0f, damp = 1.0f;
    for (int t = 0, off = 0; t < NTENSORS; off += (int)tensor_sizes[t], t++) {
        float *w = j->params + off, *buf = j->momentum ? j->momentum + off : NULL;
        const float *g = j->red ? ddp_reducer_grad(j->red, t) : j->grads + off;
        for (size_t i = 0; i < tensor_sizes[t]; i++) {
            float d = 1.0f * g[i] + wd * w[i];
            if (mom == 0.0f) {
                w[i] -= lr * d;
                continue;
            }
            float b = j->steps == 0 ? d : mom * buf[i] + damp * d;
            buf[i] = b;
            w[i] -= lr * b;
        }
    }
}

static int train_step(job *j, const ddp_batch *b, float *loss)
{
    int rc;
    *loss = mlp_forward(&j->p, &j->acts, b->x, b->y64, b->size);
    if (j->red)
        ddp_reducer_zero_grad(j->red);
    else
        memset(j->grads, 0, NPARAMS * sizeof *j->grads);
    mlp_grad_io io = {grad_of, ready, j};
    if ((rc = mlp_backward(&j->p, &j->acts, b->x, b->y64, b->size, &io)) < 0 ||
        (j->red && (rc = ddp_reducer_wait(j->red)) < 0))
        return rc;
    sgd_step(j);
    j->steps++;
    return 0;
}

static int train(job *j, ddp_loader_t *dl)
{
    size_t total = ddp_loader_length(dl);
    int rc = 0;
    for (long e = 0; e < j->a->epochs && (j->a->max_steps < 0 || j->steps < j->a->max_steps);
         e++) {
        ddp_batch b;
        if ((rc = ddp_loader_epoch_begin(dl, (uint64_t)e)) < 0)
            return rc;
        while ((j->a->max_steps < 0 || j->steps < j->a->max_steps) &&
               (rc = ddp_loader_next(dl, &b)) == 1) {
            float loss;
            if ((rc = train_step(j, &b, &loss)) < 0)
                return rc;
            if (j->rank == 0 && (b.index + 1) % 100 == 0)
                printf("Epoch [%ld/%ld], Step [%zu/%zu], Loss: %.4f\n", e + 1, j->a->epochs,
                       b.index + 1, total, loss);
        }
    }
    return rc < 0 ? rc : 0;
}

/* The loader and sampler ddp-mnist makes for the same flags. */
static int make_loader(job *j, ddp_dataset_t *ds, ddp_sampler_t **sampler, ddp_loader_t **dl)
{
    ddp_loader_options lo = ddp_loader_defaults();
    lo.batch_size = (size_t)j->a->batch;
    lo.shuffle = j->a->shuffle;
    lo.seed = j->a->seed;
    if (j->pg) {
        ddp_sampler_distributed_options dso = ddp_sampler_distributed_defaults();
        dso.num_replicas = j->world;
        dso.rank = j->rank;
        dso.shuffle = j->a->shuffle;
        dso.seed = j->a->seed;
        int rc = ddp_sampler_distributed_create(ddp_dataset_length(ds), &dso, sampler);
        if (rc < 0)
            return rc;
        lo.sampler = *sampler;
        lo.shuffle = 0;
    }
    return ddp_loader_create(ds, &lo, dl);
}

int main(int argc, char **argv)
{
    args a;
    int prc = parse_args(argc, argv, &a), rc;
    if (prc)
        return prc;
    setvbuf(stdout, NULL, _IOLBF, 0);
    job j = {.a = &a};
    ddp_dataset_t *ds = NULL;
    ddp_sampler_t *sampler = NULL;
    ddp_loader_t *dl = NULL;
    ddp_mnist_options mo = ddp_mnist_defaults();
    int status = 1;
    if ((rc = join_job(&j)) < 0)
        goto out;
    if ((rc = ddp_mnist_create(a.data, &mo, &ds)) < 0) {
        status = 2; /* a missing or broken data set is bad input, as in ddp-mnist */
        goto out;
    }
    if ((rc = setup(&j)) < 0 || (rc = make_loader(&j, ds, &sampler, &dl)) < 0 ||
        (rc = train(&j, dl)) < 0)
        goto out;
    if (j.rank == 0 && a.save) {
        size_t n;
        memcpy(ddp_model_param_block(j.init, &n), j.params, NPARAMS * sizeof *j.params);
        if ((rc = ddp_model_save_safetensors(j.init, a.save)) < 0)
            goto out;
    }
    if (j.rank == 0)
        printf("Trained %ld steps on %d rank%s\n", j.steps, j.world, j.world > 1 ? "s" : "");
out:
    if (rc < 0)
        fprintf(stderr, "ddp-llmc: rank %d: %s\n", j.rank, ddp_last_error());
    ddp_loader_destroy(dl);
    ddp_sampler_destroy(sampler);
    ddp_dataset_destroy(ds);
    ddp_reducer_destroy(j.red);
    ddp_destroy_process_group(j.pg);
    ddp_model_destroy(j.init);
    mlp_acts_free(&j.acts);
    free(j.params);
    free(j.grads);
    free(j.momentum);
    return rc < 0 ? status : 0;
}
