/* Training checkpoints: model (parameters and buffers) + optimizer state +
 * training position in one safetensors file (nn/safetensors.c does the format and the atomic write). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "ddp/ddp.h"
#include "ddp/checkpoint_extra.h"
#include "nn/safetensors.h"

#define OPT_PREFIX "optimizer."
#define MAX_STATES 8
#define NUM_META 6

int ddp_checkpoint_save_ex(const char *path, ddp_model_t *model, ddp_optim_t *opt,
                           const ddp_train_state *st, const ddp_checkpoint_options *x)
{
    DDP_FAIL_IF(!path || !model || !st, DDP_ERR_INVALID_ARG, "checkpoint: NULL argument");
    DDP_FAIL_IF(st->epoch < 0 || st->step < 0 || st->global_step < 0 || st->world_size < 1,
                DDP_ERR_INVALID_ARG,
                "checkpoint: position must be >= 0 and world_size >= 1 (epoch %lld, step %lld, "
                "global_step %lld, world_size %d)",
                (long long)st->epoch, (long long)st->step, (long long)st->global_step,
                st->world_size);
    int ns = opt ? ddp_optim_num_states(opt) : 0;
    DDP_FAIL_IF(ns > MAX_STATES, DDP_ERR_UNSUPPORTED, "checkpoint: %d optimizer states", ns);
    ddp__st_out *sd, *t; /* the model's parameters and buffers, then the optimizer's */
    size_t np;
    DDP_TRY(ddp__st_state_dict(model, &sd, &np));
    t = realloc(sd, (np + (size_t)ns + 1) * sizeof *t);
    if (!t)
        free(sd);
    DDP_FAIL_IF(!t, DDP_ERR_NOMEM, "checkpoint: out of memory");
    char names[MAX_STATES][64];
    int64_t lens[MAX_STATES];
    int rc = 0;
    for (int k = 0; k < ns; k++) {
        const char *name;
        float *data;
        size_t n;
        DDP_TRY_OUT(ddp_optim_state(opt, k, &name, &data, &n));
        snprintf(names[k], sizeof names[k], OPT_PREFIX "%s", name);
        lens[k] = (int64_t)n;
        t[np + (size_t)k] = (ddp__st_out){names[k], 1, &lens[k], data, DDP_FLOAT32};
    }
    char v[NUM_META][32];
    snprintf(v[0], sizeof v[0], "%" PRId64, st->epoch);
    snprintf(v[1], sizeof v[1], "%" PRId64, st->step);
    snprintf(v[2], sizeof v[2], "%" PRId64, st->global_step);
    snprintf(v[3], sizeof v[3], "%" PRIu64, st->seed);
    snprintf(v[4], sizeof v[4], "%d", st->world_size);
    snprintf(v[5], sizeof v[5], "%" PRId64, opt ? ddp_optim_steps(opt) : (int64_t)0);
    const char *meta[2 * NUM_META] = {"libddp.epoch", v[0], "libddp.step", v[1],
                                      "libddp.global_step", v[2], "libddp.seed", v[3],
                                      "libddp.world_size", v[4], "libddp.optimizer_steps", v[5]};
    rc = ddp__checkpoint_write(path, t, np + (size_t)ns, meta, NUM_META, opt, x);
out:
    free(t);
    return rc;
}

/* Checks that entry e exists, has dtype (F32 or I64) and holds ndim/shape. */
static int check_entry(const char *path, const ddp__st_file *f, const char *name, ddp_dtype dtype,
                       int ndim, const int64_t *shape, const ddp__st_entry **out)
{
    const ddp__st_entry *e = ddp__st_find(f, name);
    const char *want = dtype == DDP_INT64 ? "I64" : "F32";
    DDP_FAIL_IF(!e, DDP_ERR_MISMATCH, "checkpoint %s: missing %s", path, name);
    DDP_FAIL_IF(strcmp(e->dtype, want) != 0, DDP_ERR_MISMATCH,
                "checkpoint %s: %s has dtype %s, expected %s", path, name, e->dtype, want);
    int same = e->ndim == ndim;
    for (int d = 0; same && d < ndim; d++)
        same = e->shape[d] == shape[d];
    if (!same) {
        char a[128], b[128];
        ddp__st_shape_str(a, sizeof a, e->ndim, e->shape);
        ddp__st_shape_str(b, sizeof b, ndim, shape);
        return DDP_ERROR(DDP_ERR_MISMATCH, "checkpoint %s: %s has shape %s in the file, %s here",
                         path, name, a, b);
    }
    *out = e;
    return 0;
}

static int meta_int(const char *path, const ddp__st_file *f, const char *key, int64_t *out)
{
    const char *s = ddp__st_meta(f, key);
    DDP_FAIL_IF(!s, DDP_ERR_FORMAT, "checkpoint %s: no %s in __metadata__", path, key);
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    DDP_FAIL_IF(errno || end == s || *end || v < 0, DDP_ERR_FORMAT,
                "checkpoint %s: %s is '%s', not a non-negative integer", path, key, s);
    *out = v;
    return 0;
}

int ddp__checkpoint_meta_int(const char *path, const ddp__st_file *f, const char *key,
                             int64_t *out)
{
    return meta_int(path, f, key, out);
}

int ddp_checkpoint_load_ex(const char *path, ddp_model_t *model, ddp_optim_t *opt,
                           ddp_train_state *st, const ddp_checkpoint_options *x)
{
    DDP_FAIL_IF(!path || !model, DDP_ERR_INVALID_ARG, "checkpoint: NULL argument");
    ddp__st_file f;
    DDP_TRY(ddp__st_read(path, &f));
    int rc = 0;
    size_t np = 0;
    ddp__st_out *sd = NULL; /* the model's parameters and buffers */
    int ns = opt ? ddp_optim_num_states(opt) : 0;
    const ddp__st_entry **pe = NULL, *se[MAX_STATES];
    DDP_TRY_OUT(ddp__st_state_dict(model, &sd, &np));
    pe = calloc(np + 1, sizeof *pe);
    DDP_FAIL_OUT(!pe, DDP_ERR_NOMEM, "checkpoint: out of memory");
    DDP_FAIL_OUT(ns > MAX_STATES, DDP_ERR_UNSUPPORTED,
                 "checkpoint: %d optimizer states are more than supported", ns);
    /* Phase 1: check everything. */
    for (size_t i = 0; i < np; i++)
        DDP_TRY_OUT(check_entry(path, &f, sd[i].name, sd[i].dtype, sd[i].ndim, sd[i].shape,
                                &pe[i]));
    for (int k = 0; k < ns; k++) {
        const char *name;
        float *data;
        size_t n;
        char full[64];
        DDP_TRY_OUT(ddp_optim_state(opt, k, &name, &data, &n));
        snprintf(full, sizeof full, OPT_PREFIX "%s", name);
        int64_t len = (int64_t)n;
        DDP_TRY_OUT(check_entry(path, &f, full, DDP_FLOAT32, 1, &len, &se[k]));
    }
    ddp_train_state s = {0};
    int64_t ws, steps, seed;
    DDP_TRY_OUT(meta_int(path, &f, "libddp.epoch", &s.epoch));
    DDP_TRY_OUT(meta_int(path, &f, "libddp.step", &s.step));
    DDP_TRY_OUT(meta_int(path, &f, "libddp.global_step", &s.global_step));
    DDP_TRY_OUT(meta_int(path, &f, "libddp.seed", &seed));
    DDP_TRY_OUT(meta_int(path, &f, "libddp.world_size", &ws));
    DDP_TRY_OUT(meta_int(path, &f, "libddp.optimizer_steps", &steps));
    DDP_TRY_OUT(ddp__checkpoint_extra_load(path, &f, opt, x)); /* checks, then sets */
    s.seed = (uint64_t)seed;
    s.world_size = (int)ws;
    /* Phase 2: copy. */
    for (size_t i = 0; i < np; i++) /* the model's memory; sizes checked in phase 1 */
        memcpy((void *)sd[i].data, f.data + pe[i]->begin, pe[i]->end - pe[i]->begin);
    ddp_model_bump_param_version(model);
    for (int k = 0; k < ns; k++) {
        const char *name;
        float *data;
        size_t n;
        DDP_TRY_OUT(ddp_optim_state(opt, k, &name, &data, &n));
        memcpy(data, f.data + se[k]->begin, n * sizeof(float));
    }
    if (opt)
        ddp_optim_set_steps(opt, steps);
    if (st)
        *st = s;
out:
    free(pe);
    free(sd);
    ddp__st_close(&f);
    return rc;
}
