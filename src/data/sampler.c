/* Samplers: the order of an epoch's samples (torch.utils.data's
 * SequentialSampler, RandomSampler, distributed.DistributedSampler).
 *
 * Random orders are Fisher-Yates shuffles driven by xoshiro256** seeded from
 * (seed, epoch) alone, so that every process computes the same permutation
 * for an epoch without talking to the others (what DistributedSampler needs)
 * and a run can be repeated exactly. */
#include <stdlib.h>

#include "base/error.h"
#include "base/rng.h"
#include "data/idx_internal.h"

struct ddp_sampler {
    const ddp_sampler_ops *ops;
    void *self;
    uint64_t epoch;
};

/* ------------------------------------------------------------------ interface */

int ddp_sampler_create(const ddp_sampler_ops *ops, void *self, ddp_sampler_t **out)
{
    int rc = 0;
    DDP_FAIL_OUT(!out, DDP_ERR_INVALID_ARG, "ddp_sampler_create: out is NULL");
    *out = NULL;
    DDP_FAIL_OUT(!ops || !ops->length || !ops->fill, DDP_ERR_INVALID_ARG,
                 "ddp_sampler_create: ops must provide length and fill");
    ddp_sampler_t *s = calloc(1, sizeof *s);
    DDP_FAIL_OUT(!s, DDP_ERR_NOMEM, "ddp_sampler_create: out of memory");
    s->ops = ops;
    s->self = self;
    *out = s;
    return 0;
out:
    if (ops && ops->destroy) /* self was handed over: do not leak it */
        ops->destroy(self);
    return rc;
}

void ddp_sampler_destroy(ddp_sampler_t *s)
{
    if (!s)
        return;
    if (s->ops->destroy)
        s->ops->destroy(s->self);
    free(s);
}

size_t ddp_sampler_length(const ddp_sampler_t *s) { return s ? s->ops->length(s->self) : 0; }

void ddp_sampler_set_epoch(ddp_sampler_t *s, uint64_t epoch)
{
    if (s)
        s->epoch = epoch;
}

uint64_t ddp_sampler_epoch(const ddp_sampler_t *s) { return s ? s->epoch : 0; }

int ddp_sampler_fill(ddp_sampler_t *s, size_t *out)
{
    DDP_FAIL_IF(!s || !out, DDP_ERR_INVALID_ARG, "ddp_sampler_fill: NULL argument");
    return s->ops->fill(s->self, s->epoch, out);
}

/* ------------------------------------------------------------------ permutations */

/* The permutation of 0..n-1 for (seed, epoch): Fisher-Yates, Durstenfeld's
 * form, from the top down. */
static void permutation(size_t *out, size_t n, uint64_t seed, uint64_t epoch)
{
    ddp__rng r;
    /* splitmix64 inside the seeding decorrelates neighbouring inputs; the odd
     * multiplier keeps (seed, epoch) pairs apart. */
    ddp__rng_seed(&r, seed ^ (epoch * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL));
    for (size_t i = 0; i < n; i++)
        out[i] = i;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)ddp__rng_below(&r, i);
        size_t t = out[i - 1];
        out[i - 1] = out[j];
        out[j] = t;
    }
}

/* ------------------------------------------------------------------ sequential, random */

typedef struct simple {
    size_t n;
    uint64_t seed;
} simple;

static size_t simple_length(void *self) { return ((simple *)self)->n; }

static int sequential_fill(void *self, uint64_t epoch, size_t *out)
{
    (void)epoch;
    const simple *s = self;
    for (size_t i = 0; i < s->n; i++)
        out[i] = i;
    return 0;
}

static int random_fill(void *self, uint64_t epoch, size_t *out)
{
    const simple *s = self;
    permutation(out, s->n, s->seed, epoch);
    return 0;
}

static const ddp_sampler_ops sequential_ops = {simple_length, sequential_fill, free};
static const ddp_sampler_ops random_ops = {simple_length, random_fill, free};

static int simple_create(const ddp_sampler_ops *ops, size_t n, uint64_t seed,
                         ddp_sampler_t **out)
{
    DDP_FAIL_IF(!out, DDP_ERR_INVALID_ARG, "sampler: out is NULL");
    *out = NULL;
    simple *s = malloc(sizeof *s);
    DDP_FAIL_IF(!s, DDP_ERR_NOMEM, "sampler: out of memory");
    s->n = n;
    s->seed = seed;
    return ddp_sampler_create(ops, s, out);
}

int ddp_sampler_sequential_create(size_t n, ddp_sampler_t **out)
{
    return simple_create(&sequential_ops, n, 0, out);
}

int ddp_sampler_random_create(size_t n, uint64_t seed, ddp_sampler_t **out)
{
    return simple_create(&random_ops, n, seed, out);
}

/* ------------------------------------------------------------------ distributed */

typedef struct distributed {
    size_t n;            /* dataset length */
    size_t num_samples;  /* this rank's share */
    size_t total;        /* num_samples * num_replicas */
    ddp_sampler_distributed_options o;
    size_t *order;       /* (n) scratch: the epoch's full permutation */
} distributed;

ddp_sampler_distributed_options ddp_sampler_distributed_defaults(void)
{
    ddp_sampler_distributed_options o = {.num_replicas = 1, .rank = 0, .shuffle = 1,
                                      .seed = 0, .drop_last = 0};
    return o;
}

static size_t distributed_length(void *self) { return ((distributed *)self)->num_samples; }

/* torch/utils/data/distributed.py, __iter__: the full order, padded by
 * repeating it from the start (as often as needed) or cut to total, then
 * every num_replicas-th entry from rank on. */
static int distributed_fill(void *self, uint64_t epoch, size_t *out)
{
    const distributed *d = self;
    size_t *order = d->order;
    if (d->o.shuffle)
        permutation(order, d->n, d->o.seed, epoch);
    else
        for (size_t i = 0; i < d->n; i++)
            order[i] = i;
    size_t R = (size_t)d->o.num_replicas, r = (size_t)d->o.rank;
    for (size_t k = 0; k < d->num_samples; k++) {
        size_t pos = r + k * R; /* < total; past n only when padding */
        out[k] = order[pos % d->n];
    }
    return 0;
}

static void distributed_destroy(void *self)
{
    distributed *d = self;
    if (d)
        free(d->order);
    free(d);
}

static const ddp_sampler_ops distributed_ops = {distributed_length, distributed_fill,
                                                distributed_destroy};

int ddp_sampler_distributed_create(size_t n, const ddp_sampler_distributed_options *opts,
                                   ddp_sampler_t **out)
{
    int rc = 0;
    distributed *d = NULL;
    DDP_FAIL_OUT(!out, DDP_ERR_INVALID_ARG, "distributed sampler: out is NULL");
    *out = NULL;
    ddp_sampler_distributed_options o = opts ? *opts : ddp_sampler_distributed_defaults();
    DDP_FAIL_OUT(o.num_replicas < 1, DDP_ERR_INVALID_ARG,
                 "distributed sampler: num_replicas %d < 1", o.num_replicas);
    DDP_FAIL_OUT(o.rank < 0 || o.rank >= o.num_replicas, DDP_ERR_INVALID_ARG,
                 "distributed sampler: rank %d out of range [0, %d)", o.rank,
                 o.num_replicas);
    DDP_FAIL_OUT(n == 0, DDP_ERR_INVALID_ARG, "distributed sampler: empty dataset");
    size_t R = (size_t)o.num_replicas;
    DDP_FAIL_OUT(o.drop_last && n < R, DDP_ERR_INVALID_ARG,
                 "distributed sampler: drop_last with %zu samples for %zu replicas leaves "
                 "every rank empty", n, R);
    d = calloc(1, sizeof *d);
    DDP_FAIL_OUT(!d, DDP_ERR_NOMEM, "distributed sampler: out of memory");
    d->n = n;
    d->o = o;
    /* Same counts as torch: drop_last floors, otherwise ceil and pad. */
    d->num_samples = o.drop_last ? n / R : (n + R - 1) / R;
    d->total = d->num_samples * R;
    d->order = malloc(n * sizeof *d->order);
    DDP_FAIL_OUT(!d->order, DDP_ERR_NOMEM, "distributed sampler: out of memory for %zu "
                 "indices", n);
    rc = ddp_sampler_create(&distributed_ops, d, out);
    d = NULL;
out:
    distributed_destroy(d);
    return rc;
}
