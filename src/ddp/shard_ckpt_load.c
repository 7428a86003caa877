/* Sharded checkpoints, loading and export (include/ddp/zero.h): a saved
 * partition read back into any other, in two passes over the same walk of
 * (tensor, saved shard) overlaps, the first only checking, the second
 * copying once every rank agreed that its checks passed.  The parameters
 * of this rank's new shard are read from the files, the rest come from the
 * other ranks through the step's gather; the module buffers
 * (shard_ckpt_buffers.c) every rank reads whole. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "ddp/shard_ckpt_read.h"

/* What a walk reads from and writes to. */
typedef struct walk_ctx {
    const char *dir;
    const ddp__ckpt_index *ix;
    ddp__st_file *files; /* per saved shard; data NULL when not opened */
    ddp__st_file bufs;   /* the buffers file; zeroed when there is none */
    int copy;            /* 0: check only */
    /* where flat position x goes: block[x - block_at], each optimizer
     * state's [x - state_at] (a load: the model's and its optimizer's
     * layout; an export: the whole block, no optimizer) */
    float *block;
    size_t block_at, state_at;
    ddp_optim_t *opt;
} walk_ctx;

static int open_needed(walk_ctx *c, size_t b, size_t e)
{
    for (int r = 0; r < c->ix->world; r++) {
        const ddp__ckpt_shard *s = &c->ix->shards[r];
        if (s->begin < e && b < s->end)
            DDP_TRY(ddp__ckpt_shard_open(c->dir, c->ix, r, &c->files[r]));
    }
    return 0;
}

static void close_files(walk_ctx *c)
{
    for (int r = 0; c->files && r < c->ix->world; r++)
        if (c->files[r].entries || c->files[r].data)
            ddp__st_close(&c->files[r]);
    free(c->files);
    c->files = NULL;
    if (c->bufs.entries || c->bufs.data)
        ddp__st_close(&c->bufs);
    memset(&c->bufs, 0, sizeof c->bufs);
}

/* One overlap: flat [x, y) of tensor t, held by saved shard r. */
static int segment(walk_ctx *c, const ddp__ckpt_tensor *t, int r, size_t x, size_t y)
{
    const ddp__ckpt_shard *s = &c->ix->shards[r];
    size_t pb = s->begin > t->offset ? s->begin : t->offset; /* the saved piece */
    size_t pe = s->end < t->offset + t->numel ? s->end : t->offset + t->numel;
    int rc = 0;
    const float *src = ddp__ckpt_shard_piece(c->dir, c->ix, r, &c->files[r], t->name, pe - pb,
                                             &rc);
    if (!src)
        return rc;
    if (c->copy)
        memcpy(c->block + (x - c->block_at), src + (x - pb), (y - x) * sizeof(float));
    int ns = c->opt ? c->ix->nstates : 0;
    for (int k = 0; k < ns; k++) {
        char name[DDP__CKPT_NAME_MAX];
        snprintf(name, sizeof name, "optimizer.%s.%s", c->ix->states[k], t->name);
        if (!(src = ddp__ckpt_shard_piece(c->dir, c->ix, r, &c->files[r], name, pe - pb, &rc)))
            return rc;
        float *state;
        DDP_TRY(ddp_optim_state(c->opt, k, NULL, &state, NULL));
        if (c->copy)
            memcpy(state + (x - c->state_at), src + (x - pb), (y - x) * sizeof(float));
    }
    return 0;
}

/* Every (tensor, saved shard) overlap inside flat [b, e). */
static int walk(walk_ctx *c, size_t b, size_t e)
{
    for (size_t i = 0; i < c->ix->ntensors; i++) {
        const ddp__ckpt_tensor *t = &c->ix->tensors[i];
        for (int r = 0; r < c->ix->world; r++) {
            const ddp__ckpt_shard *s = &c->ix->shards[r];
            size_t x = b, y = e;
            x = x > t->offset ? x : t->offset;
            x = x > s->begin ? x : s->begin;
            y = y < t->offset + t->numel ? y : t->offset + t->numel;
            y = y < s->end ? y : s->end;
            if (x < y)
                DDP_TRY(segment(c, t, r, x, y));
        }
    }
    return 0;
}

/* The model's parameters against the index's tensors from `first` on:
 * the first difference. */
static int check_params(const char *dir, const ddp__ckpt_index *ix, ddp_model_t *model,
                        size_t first)
{
    size_t np = ddp_model_num_params(model);
    for (size_t i = 0; i < np; i++) {
        const ddp_param *p = ddp_model_param(model, i);
        const ddp__ckpt_tensor *t = first + i < ix->ntensors ? &ix->tensors[first + i] : NULL;
        DDP_FAIL_IF(!t, DDP_ERR_MISMATCH, "checkpoint %s ends before the model's %s (tensor "
                    "%zu of the index)", dir, p->name, first + i);
        int same = strcmp(p->name, t->name) == 0 && p->ndim == t->ndim;
        for (int d = 0; same && d < p->ndim; d++)
            same = p->shape[d] == t->shape[d];
        DDP_FAIL_IF(!same, DDP_ERR_MISMATCH,
                    "checkpoint %s: tensor %zu is %s (%zu values), the model's is %s (%zu "
                    "values) or of another shape",
                    dir, first + i, t->name, t->numel, p->name, p->numel);
    }
    return 0;
}

/* The optimizer's state names against the index's. */
static int check_states(const char *dir, const ddp__ckpt_index *ix, ddp_optim_t *opt)
{
    if (!opt)
        return 0;
    int ns = ddp_optim_num_states(opt);
    DDP_FAIL_IF(ns != ix->nstates, DDP_ERR_MISMATCH,
                "checkpoint %s holds %d optimizer states, the optimizer has %d", dir,
                ix->nstates, ns);
    for (int k = 0; k < ns; k++) {
        const char *name;
        DDP_TRY(ddp_optim_state(opt, k, &name, NULL, NULL));
        DDP_FAIL_IF(strcmp(name, ix->states[k]) != 0, DDP_ERR_MISMATCH,
                    "checkpoint %s: optimizer state %d is %s, the optimizer's is %s", dir, k,
                    ix->states[k], name);
    }
    return 0;
}

/* The whole model against the index (ZeRO: every rank holds it). */
static int check_model(const char *dir, const ddp__ckpt_index *ix, ddp_zero_t *z)
{
    size_t np = ddp_model_num_params(z->model);
    DDP_FAIL_IF(np != ix->ntensors || z->total != ix->total, DDP_ERR_MISMATCH,
                "ZeRO checkpoint %s holds %zu tensors of %zu values, the model %zu of %zu", dir,
                ix->ntensors, ix->total, np, z->total);
    return check_params(dir, ix, z->model, 0);
}

/* This rank's checks past the model's: its buffers, every file that flat
 * [b, e) needs and every piece in them. */
static int load_check(walk_ctx *c, ddp_model_t *model, size_t b, size_t e)
{
    DDP_TRY(check_states(c->dir, c->ix, c->opt));
    DDP_TRY(ddp__ckpt_buffers_check_model(c->dir, c->ix, model));
    DDP_TRY(ddp__ckpt_buffers_open(c->dir, c->ix, &c->bufs));
    c->files = calloc((size_t)c->ix->world, sizeof *c->files);
    DDP_FAIL_IF(!c->files, DDP_ERR_NOMEM, "checkpoint %s: out of memory", c->dir);
    DDP_TRY(open_needed(c, b, e));
    return walk(c, b, e);
}

/* Both loads' second half: this rank's checks so far (rc) and those of
 * the files flat [b, e) needs, agreed over pg; then the copy into model
 * (and c->opt), its buffers and a new parameter version.  Closes the
 * files. */
static int load_agreed(walk_ctx *c, ddp_pg_t *pg, ddp_model_t *model, size_t b, size_t e, int rc)
{
    if (rc == 0)
        rc = load_check(c, model, b, e);
    rc = ddp__shard_agree(pg, rc, "load", c->dir);
    if (rc == 0) { /* phase 2: every rank's checks passed */
        c->copy = 1;
        rc = walk(c, b, e);
        if (rc == 0)
            ddp__ckpt_buffers_copy(c->ix, &c->bufs, model);
    }
    close_files(c);
    if (rc == 0)
        ddp_model_bump_param_version(model);
    return rc;
}

int ddp_zero_checkpoint_load(const char *dir, ddp_zero_t *z, ddp_optim_t *opt,
                             ddp_train_state *st)
{
    DDP_FAIL_IF(!dir || !z, DDP_ERR_INVALID_ARG, "ZeRO checkpoint load: NULL argument");
    ddp__ckpt_index ix;
    walk_ctx c = {.dir = dir, .ix = &ix, .opt = opt, .block = ddp_model_param_block(z->model, NULL),
                  .state_at = z->begin}; /* the shard model's layout: flat position - begin */
    int rc = ddp__ckpt_index_read(dir, &ix);
    int have_ix = rc == 0;
    if (rc == 0)
        rc = check_model(dir, &ix, z);
    rc = load_agreed(&c, z->pg, z->model, z->begin, z->end, rc);
    if (rc == 0)
        rc = ddp__zero_gather(z);
    if (rc == 0 && opt)
        ddp_optim_set_steps(opt, ix.opt_steps);
    if (rc == 0 && st)
        *st = ix.st;
    if (have_ix)
        ddp__ckpt_index_free(&ix);
    return rc;
}

/* Where the model's tensors start in the index: at its first parameter's
 * name (a model without parameters: nowhere, 0). */
static int find_part(const char *dir, const ddp__ckpt_index *ix, ddp_model_t *model,
                     size_t *first)
{
    *first = 0;
    if (ddp_model_num_params(model) == 0)
        return 0;
    const char *name = ddp_model_param(model, 0)->name;
    for (size_t i = 0; i < ix->ntensors; i++)
        if (strcmp(ix->tensors[i].name, name) == 0) {
            *first = i;
            return 0;
        }
    return DDP_ERROR(DDP_ERR_MISMATCH, "checkpoint %s has no tensor %s (the model's first of "
                     "%zu)", dir, name, ddp_model_num_params(model));
}

int ddp__ckpt_load_part(const char *dir, ddp_pg_t *pg, ddp_model_t *model, ddp_optim_t *opt,
                        ddp_train_state *st)
{
    ddp__ckpt_index ix;
    size_t n = 0, first = 0, b = 0;
    walk_ctx c = {.dir = dir, .ix = &ix, .opt = opt, .block = ddp_model_param_block(model, &n)};
    int rc = ddp__ckpt_index_read(dir, &ix);
    int have_ix = rc == 0;
    if (rc == 0 && (rc = find_part(dir, &ix, model, &first)) == 0 &&
        (rc = check_params(dir, &ix, model, first)) == 0) {
        b = n ? ix.tensors[first].offset : 0; /* the run is contiguous: the index tiles */
        c.block_at = c.state_at = b;
    }
    rc = load_agreed(&c, pg, model, b, b + n, rc);
    if (rc == 0 && opt)
        ddp_optim_set_steps(opt, ix.opt_steps);
    if (rc == 0 && st)
        *st = ix.st;
    if (have_ix)
        ddp__ckpt_index_free(&ix);
    return rc;
}

int ddp_zero_checkpoint_export(const char *dir, const char *path)
{
    DDP_FAIL_IF(!dir || !path, DDP_ERR_INVALID_ARG, "ZeRO checkpoint export: NULL argument");
    ddp__ckpt_index ix;
    DDP_TRY(ddp__ckpt_index_read(dir, &ix));
    walk_ctx c = {.dir = dir, .ix = &ix};
    ddp__st_out *t = calloc(ix.ntensors + ix.nbuffers + 1, sizeof *t);
    c.block = malloc((ix.total ? ix.total : 1) * sizeof(float));
    c.files = calloc((size_t)ix.world, sizeof *c.files);
    int rc = 0;
    DDP_FAIL_OUT(!t || !c.block || !c.files, DDP_ERR_NOMEM,
                 "ZeRO checkpoint export %s: out of memory for %zu values", dir, ix.total);
    DDP_TRY_OUT(ddp__ckpt_buffers_open(dir, &ix, &c.bufs));
    DDP_TRY_OUT(open_needed(&c, 0, ix.total));
    DDP_TRY_OUT(walk(&c, 0, ix.total));
    c.copy = 1;
    DDP_TRY_OUT(walk(&c, 0, ix.total));
    for (size_t i = 0; i < ix.ntensors; i++) {
        const ddp__ckpt_tensor *x = &ix.tensors[i];
        t[i] = (ddp__st_out){x->name, x->ndim, x->shape, c.block + x->offset, DDP_FLOAT32};
    }
    ddp__ckpt_buffers_outputs(&ix, &c.bufs, t + ix.ntensors); /* after the parameters */
    rc = ddp__st_write(path, t, ix.ntensors + ix.nbuffers, NULL, 0);
out:
    close_files(&c);
    free(c.block);
    free(t);
    ddp__ckpt_index_free(&ix);
    return rc;
}
