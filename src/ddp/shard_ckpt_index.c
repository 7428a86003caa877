/* Sharded checkpoints, the reading side's checks: index.json parsed
 * (base/json.c) and held to the format shard_ckpt.c writes, and a shard
 * file held to its index (the same checkpoint id and step, every piece
 * present with its length).  Nothing here changes a model: loads and
 * exports check everything first (shard_ckpt_load.c). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/file.h"
#include "base/json.h"
#include "ddp/shard_ckpt_read.h"

#define INDEX_MAX (64u << 20)

/* ==== members ============================================================= */

static int get_u64(const char *path, const ddp__json *obj, const char *key, uint64_t *out)
{
    const ddp__json *v = ddp__json_get(obj, key);
    DDP_FAIL_IF(!v || v->type != DDP_JSON_NUMBER || !v->is_uint, DDP_ERR_FORMAT,
                "%s: \"%s\" is %s, not a non-negative integer", path, key,
                v ? ddp__json_type_name(v->type) : "missing");
    *out = v->u64;
    return 0;
}

static int get_i64(const char *path, const ddp__json *obj, const char *key, int64_t *out)
{
    uint64_t u;
    DDP_TRY(get_u64(path, obj, key, &u));
    DDP_FAIL_IF(u > INT64_MAX, DDP_ERR_FORMAT, "%s: \"%s\" %" PRIu64 " is too large", path, key,
                u);
    *out = (int64_t)u;
    return 0;
}

static int get_str(const char *path, const ddp__json *obj, const char *key, const char **out)
{
    const ddp__json *v = ddp__json_get(obj, key);
    DDP_FAIL_IF(!v || v->type != DDP_JSON_STRING, DDP_ERR_FORMAT, "%s: \"%s\" is %s, not a string",
                path, key, v ? ddp__json_type_name(v->type) : "missing");
    *out = v->str;
    return 0;
}

static int get_array(const char *path, const ddp__json *obj, const char *key,
                     const ddp__json **out)
{
    const ddp__json *v = ddp__json_get(obj, key);
    DDP_FAIL_IF(!v || v->type != DDP_JSON_ARRAY, DDP_ERR_FORMAT, "%s: \"%s\" is %s, not an array",
                path, key, v ? ddp__json_type_name(v->type) : "missing");
    *out = v;
    return 0;
}

/* ==== the index =========================================================== */

/* shards[i]: rank i, a plain file name in dir and a flat range, the ranges
 * tiling [0, total) in rank order (ZeRO's partition, or a pipeline's
 * stages, which may be empty: a stage without parameters). */
static int parse_shards(const char *path, const ddp__json *arr, ddp__ckpt_index *ix)
{
    DDP_FAIL_IF(arr->len != (size_t)ix->world, DDP_ERR_FORMAT,
                "%s: %zu shards listed for world_size %d", path, arr->len, ix->world);
    ix->shards = calloc(arr->len, sizeof *ix->shards);
    DDP_FAIL_IF(!ix->shards, DDP_ERR_NOMEM, "%s: out of memory", path);
    int r = 0;
    uint64_t at = 0;
    for (const ddp__json *s = arr->child; s; s = s->next, r++) {
        uint64_t rank, b, e;
        const char *file;
        DDP_FAIL_IF(s->type != DDP_JSON_OBJECT, DDP_ERR_FORMAT, "%s: shard %d is not an object",
                    path, r);
        DDP_TRY(get_u64(path, s, "rank", &rank));
        DDP_TRY(get_u64(path, s, "begin", &b));
        DDP_TRY(get_u64(path, s, "end", &e));
        DDP_TRY(get_str(path, s, "file", &file));
        uint64_t last = r + 1 == ix->world ? (uint64_t)ix->total : e;
        DDP_FAIL_IF(rank != (uint64_t)r || b != at || e < b || e != last || e > ix->total,
                    DDP_ERR_FORMAT,
                    "%s: shard %d is rank %" PRIu64 " [%" PRIu64 ", %" PRIu64
                    "), expected rank %d from %" PRIu64 " (the shards tile [0, %zu) in order)",
                    path, r, rank, b, e, r, at, ix->total);
        at = e;
        /* A name inside the folder: never a path that leaves it. */
        DDP_FAIL_IF(!*file || strchr(file, '/') || strcmp(file, ".") == 0 ||
                        strcmp(file, "..") == 0,
                    DDP_ERR_FORMAT, "%s: shard %d's file \"%s\" is not a file name", path, r,
                    file);
        ix->shards[r] = (ddp__ckpt_shard){file, (size_t)b, (size_t)e};
    }
    return 0;
}

/* tensors: in flat order, tiling [0, total) with no gap. */
static int parse_tensors(const char *path, const ddp__json *arr, ddp__ckpt_index *ix)
{
    ix->tensors = calloc(arr->len ? arr->len : 1, sizeof *ix->tensors);
    DDP_FAIL_IF(!ix->tensors, DDP_ERR_NOMEM, "%s: out of memory", path);
    size_t at = 0;
    for (const ddp__json *t = arr->child; t; t = t->next) {
        ddp__ckpt_tensor *x = &ix->tensors[ix->ntensors];
        uint64_t off, numel;
        const ddp__json *shape;
        DDP_FAIL_IF(t->type != DDP_JSON_OBJECT, DDP_ERR_FORMAT, "%s: tensor %zu is not an object",
                    path, ix->ntensors);
        DDP_TRY(get_str(path, t, "name", &x->name));
        DDP_TRY(get_u64(path, t, "offset", &off));
        DDP_TRY(get_u64(path, t, "numel", &numel));
        DDP_TRY(get_array(path, t, "shape", &shape));
        DDP_FAIL_IF(shape->len > DDP_TENSOR_MAX_DIM, DDP_ERR_FORMAT, "%s: %s has %zu dimensions",
                    path, x->name, shape->len);
        uint64_t prod = 1;
        for (const ddp__json *d = shape->child; d; d = d->next) {
            DDP_FAIL_IF(d->type != DDP_JSON_NUMBER || !d->is_uint || d->u64 > INT64_MAX ||
                            (d->u64 && prod > UINT64_MAX / d->u64),
                        DDP_ERR_FORMAT, "%s: %s has a bad shape", path, x->name);
            x->shape[x->ndim++] = (int64_t)d->u64;
            prod *= d->u64;
        }
        DDP_FAIL_IF(off != at || numel != prod || numel > ix->total - at, DDP_ERR_FORMAT,
                    "%s: %s at offset %" PRIu64 " with %" PRIu64
                    " elements does not follow the tensor before it (offset %zu) or its shape",
                    path, x->name, off, numel, at);
        x->offset = (size_t)off;
        x->numel = (size_t)numel;
        at += x->numel;
        ix->ntensors++;
    }
    DDP_FAIL_IF(at != ix->total, DDP_ERR_FORMAT, "%s: the tensors hold %zu of %zu elements", path,
                at, ix->total);
    return 0;
}

static int parse_states(const char *path, const ddp__json *arr, ddp__ckpt_index *ix)
{
    DDP_FAIL_IF(arr->len > DDP__CKPT_MAX_STATES, DDP_ERR_FORMAT, "%s: %zu optimizer states", path,
                arr->len);
    for (const ddp__json *s = arr->child; s; s = s->next) {
        DDP_FAIL_IF(s->type != DDP_JSON_STRING, DDP_ERR_FORMAT,
                    "%s: an optimizer state name is not a string", path);
        ix->states[ix->nstates++] = s->str;
    }
    return 0;
}

static int parse_index(const char *path, const ddp__json *root, ddp__ckpt_index *ix)
{
    const char *format, *id;
    uint64_t version, world, total, seed;
    const ddp__json *arr;
    DDP_FAIL_IF(root->type != DDP_JSON_OBJECT, DDP_ERR_FORMAT, "%s: not a JSON object", path);
    DDP_TRY(get_str(path, root, "format", &format));
    DDP_FAIL_IF(strcmp(format, DDP__CKPT_FORMAT) != 0, DDP_ERR_FORMAT,
                "%s: format \"%s\", expected \"%s\"", path, format, DDP__CKPT_FORMAT);
    DDP_TRY(get_u64(path, root, "version", &version));
    DDP_FAIL_IF(version != 1, DDP_ERR_UNSUPPORTED, "%s: version %" PRIu64 ", this libddp reads 1",
                path, version);
    DDP_TRY(get_str(path, root, "id", &id));
    char *end;
    errno = 0;
    ix->id = strtoull(id, &end, 16);
    DDP_FAIL_IF(errno || strlen(id) != 16 || *end, DDP_ERR_FORMAT,
                "%s: id \"%s\" is not 16 hex digits", path, id);
    DDP_TRY(get_u64(path, root, "world_size", &world));
    DDP_TRY(get_u64(path, root, "total", &total));
    DDP_FAIL_IF(world < 1 || world > 1u << 20, DDP_ERR_FORMAT, "%s: world_size %" PRIu64, path,
                world);
    ix->world = (int)world;
    ix->total = (size_t)total;
    DDP_TRY(get_i64(path, root, "epoch", &ix->st.epoch));
    DDP_TRY(get_i64(path, root, "step", &ix->st.step));
    DDP_TRY(get_i64(path, root, "global_step", &ix->st.global_step));
    DDP_TRY(get_u64(path, root, "seed", &seed));
    DDP_TRY(get_i64(path, root, "optimizer_steps", &ix->opt_steps));
    ix->st.seed = seed;
    ix->st.world_size = ix->world;
    if (ddp__json_get(root, "replicas")) { /* a pipeline's: not every shard is a replica */
        uint64_t replicas;
        DDP_TRY(get_u64(path, root, "replicas", &replicas));
        DDP_FAIL_IF(replicas < 1 || replicas > 1u << 20, DDP_ERR_FORMAT,
                    "%s: replicas %" PRIu64, path, replicas);
        ix->st.world_size = (int)replicas;
    }
    DDP_TRY(get_array(path, root, "states", &arr));
    DDP_TRY(parse_states(path, arr, ix));
    DDP_TRY(get_array(path, root, "shards", &arr));
    DDP_TRY(parse_shards(path, arr, ix));
    DDP_TRY(get_array(path, root, "tensors", &arr));
    DDP_TRY(parse_tensors(path, arr, ix));
    return ddp__ckpt_buffers_parse(path, root, ix);
}

int ddp__ckpt_index_read(const char *dir, ddp__ckpt_index *ix)
{
    memset(ix, 0, sizeof *ix);
    char path[4096], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/" DDP__CKPT_INDEX, dir);
    DDP_TRY(ddp__file_read(path, INDEX_MAX, &text, &len));
    int rc = ddp__json_parse(text, len, &ix->root);
    free(text);
    if (rc < 0)
        return ddp__error_context(rc, "%s", path);
    if ((rc = parse_index(path, ix->root, ix)) < 0)
        ddp__ckpt_index_free(ix);
    return rc;
}

void ddp__ckpt_index_free(ddp__ckpt_index *ix)
{
    free(ix->shards);
    free(ix->tensors);
    free(ix->buffers);
    ddp__json_free(ix->root);
    memset(ix, 0, sizeof *ix);
}

/* ==== a shard file ======================================================== */

static int meta_check(const char *path, const ddp__st_file *f, const char *key,
                      const char *want)
{
    const char *v = ddp__st_meta(f, key);
    DDP_FAIL_IF(!v, DDP_ERR_FORMAT, "%s: no %s in its metadata", path, key);
    DDP_FAIL_IF(strcmp(v, want) != 0, DDP_ERR_MISMATCH,
                "%s: %s is %s, the index says %s: this shard belongs to another checkpoint",
                path, key, v, want);
    return 0;
}

int ddp__ckpt_file_open(const char *dir, const ddp__ckpt_index *ix, const char *file, int r,
                        const char *what, ddp__st_file *f)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int rc = ddp__st_read(path, f);
    if (rc < 0)
        return ddp__error_context(rc, "%s", what);
    ddp__shard_meta m = {.st = ix->st, .opt_steps = ix->opt_steps, .rank = r,
                         .world = ix->world, .id = ix->id};
    char v[DDP__SHARD_NMETA][32];
    const char *meta[2 * DDP__SHARD_NMETA];
    ddp__shard_meta_strings(&m, v, meta);
    for (int i = 0; i < DDP__SHARD_NMETA && rc == 0; i++)
        rc = meta_check(path, f, meta[2 * i], meta[2 * i + 1]);
    if (rc < 0)
        ddp__st_close(f);
    return rc;
}

int ddp__ckpt_shard_open(const char *dir, const ddp__ckpt_index *ix, int r, ddp__st_file *f)
{
    char what[64];
    snprintf(what, sizeof what, "shard %d of the index", r);
    return ddp__ckpt_file_open(dir, ix, ix->shards[r].file, r, what, f);
}

const float *ddp__ckpt_shard_piece(const char *dir, const ddp__ckpt_index *ix, int r,
                                   const ddp__st_file *f, const char *name, size_t len, int *rc)
{
    const ddp__st_entry *e = ddp__st_find(f, name);
    if (!e || strcmp(e->dtype, "F32") != 0 || e->ndim != 1 || (size_t)e->shape[0] != len) {
        *rc = DDP_ERROR(DDP_ERR_FORMAT, "%s/%s: %s is %s, expected %zu F32 values", dir,
                        ix->shards[r].file, name,
                        !e ? "missing" : strcmp(e->dtype, "F32") ? e->dtype : "of another shape",
                        len);
        return NULL;
    }
    return (const float *)(f->data + e->begin);
}
