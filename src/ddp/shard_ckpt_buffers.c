/* Sharded checkpoints' module buffers (BatchNorm's running_mean,
 * running_var, num_batches_tracked): state that is not a parameter, so not
 * in the flat partition, and small.  Rank 0 writes its buffers whole into
 * one more file, buffers.safetensors, with the metadata of its shard (the
 * same checkpoint id and step, so a buffers file of another save is
 * recognised), and index.json lists them ("buffers_file", "buffers": name,
 * dtype, shape, in state-dict order).  Rank 0's, as DDP's broadcast_buffers
 * and PyTorch's own checkpoints of a DDP model take them.  A load gives
 * every rank those values; the consolidated export carries them next to the
 * parameters, so that PyTorch's load_state_dict(strict=True) accepts it.
 * An index without "buffers" (a model without buffers, or a checkpoint
 * from before they were saved) holds none. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "ddp/ext.h"
#include "ddp/shard_ckpt_read.h"

static const char *dtype_name(ddp_dtype dt) { return dt == DDP_INT64 ? "I64" : "F32"; }

int ddp__ckpt_buffers_write(const char *dir, ddp_model_t *model, const ddp__shard_meta *m)
{
    size_t nb = ddp_model_num_buffers(model);
    if (nb == 0)
        return 0;
    ddp__st_out *t = calloc(nb, sizeof *t);
    DDP_FAIL_IF(!t, DDP_ERR_NOMEM, "ZeRO checkpoint: out of memory for %zu buffers", nb);
    for (size_t i = 0; i < nb; i++) {
        const ddp_buffer *b = ddp_model_buffer(model, i);
        t[i] = (ddp__st_out){b->name, b->ndim, b->shape, b->data, b->dtype};
    }
    char v[DDP__SHARD_NMETA][32], path[4096];
    const char *meta[2 * DDP__SHARD_NMETA];
    ddp__shard_meta_strings(m, v, meta);
    snprintf(path, sizeof path, "%s/" DDP__CKPT_BUFFERS, dir);
    int rc = ddp__st_write(path, t, nb, meta, DDP__SHARD_NMETA);
    free(t);
    return rc;
}

void ddp__ckpt_buffers_json(FILE *f, ddp_model_t *model)
{
    size_t nb = ddp_model_num_buffers(model);
    if (nb == 0)
        return;
    fputs(",\n  \"buffers_file\": \"" DDP__CKPT_BUFFERS "\",\n  \"buffers\": [", f);
    for (size_t i = 0; i < nb; i++) {
        const ddp_buffer *b = ddp_model_buffer(model, i);
        fprintf(f, "%s\n    {\"name\": ", i ? "," : "");
        ddp__ckpt_json_string(f, b->name);
        fprintf(f, ", \"dtype\": \"%s\", \"shape\": [", dtype_name(b->dtype));
        for (int d = 0; d < b->ndim; d++)
            fprintf(f, "%s%" PRId64, d ? ", " : "", b->shape[d]);
        fputs("]}", f);
    }
    fputs("\n  ]", f);
}

/* ==== reading ============================================================= */

static int parse_one(const char *path, const ddp__json *b, ddp__ckpt_buffer *x, size_t i)
{
    const ddp__json *name = ddp__json_get(b, "name"), *dt = ddp__json_get(b, "dtype");
    const ddp__json *shape = ddp__json_get(b, "shape");
    DDP_FAIL_IF(b->type != DDP_JSON_OBJECT || !name || name->type != DDP_JSON_STRING || !dt ||
                    dt->type != DDP_JSON_STRING || !shape || shape->type != DDP_JSON_ARRAY ||
                    shape->len > DDP_TENSOR_MAX_DIM,
                DDP_ERR_FORMAT,
                "%s: buffer %zu is not {\"name\": string, \"dtype\": string, \"shape\": [...]}",
                path, i);
    DDP_FAIL_IF(strcmp(dt->str, "F32") != 0 && strcmp(dt->str, "I64") != 0, DDP_ERR_FORMAT,
                "%s: buffer %s has dtype \"%s\", not F32 or I64", path, name->str, dt->str);
    x->name = name->str;
    x->dtype = dt->str[0] == 'I' ? DDP_INT64 : DDP_FLOAT32;
    for (const ddp__json *d = shape->child; d; d = d->next) {
        DDP_FAIL_IF(d->type != DDP_JSON_NUMBER || !d->is_uint || d->u64 > INT32_MAX,
                    DDP_ERR_FORMAT, "%s: buffer %s has a bad shape", path, x->name);
        x->shape[x->ndim++] = (int64_t)d->u64;
    }
    return 0;
}

int ddp__ckpt_buffers_parse(const char *path, const ddp__json *root, ddp__ckpt_index *ix)
{
    const ddp__json *arr = ddp__json_get(root, "buffers");
    const ddp__json *file = ddp__json_get(root, "buffers_file");
    if (!arr && !file)
        return 0; /* none saved */
    DDP_FAIL_IF(!arr || arr->type != DDP_JSON_ARRAY || !file || file->type != DDP_JSON_STRING,
                DDP_ERR_FORMAT, "%s: \"buffers\" (an array) and \"buffers_file\" (a string) "
                "come together", path);
    DDP_FAIL_IF(strcmp(file->str, DDP__CKPT_BUFFERS) != 0, DDP_ERR_FORMAT,
                "%s: buffers_file \"%s\", expected \"" DDP__CKPT_BUFFERS "\"", path, file->str);
    ix->buffers = calloc(arr->len ? arr->len : 1, sizeof *ix->buffers);
    DDP_FAIL_IF(!ix->buffers, DDP_ERR_NOMEM, "%s: out of memory", path);
    for (const ddp__json *b = arr->child; b; b = b->next, ix->nbuffers++)
        DDP_TRY(parse_one(path, b, &ix->buffers[ix->nbuffers], ix->nbuffers));
    return 0;
}

int ddp__ckpt_buffers_open(const char *dir, const ddp__ckpt_index *ix, ddp__st_file *f)
{
    memset(f, 0, sizeof *f);
    if (ix->nbuffers == 0)
        return 0;
    DDP_TRY(ddp__ckpt_file_open(dir, ix, DDP__CKPT_BUFFERS, 0, "the buffers file of the index", f));
    for (size_t i = 0; i < ix->nbuffers; i++) {
        const ddp__ckpt_buffer *b = &ix->buffers[i];
        const ddp__st_entry *e = ddp__st_find(f, b->name);
        char why[160];
        if (!ddp__st_entry_fits(e, b->dtype, b->ndim, b->shape, why, sizeof why)) {
            ddp__st_close(f);
            return DDP_ERROR(DDP_ERR_FORMAT, "%s/" DDP__CKPT_BUFFERS ": buffer %s: %s (against "
                             "the index)", dir, b->name, why);
        }
    }
    return 0;
}

int ddp__ckpt_buffers_check_model(const char *dir, const ddp__ckpt_index *ix,
                                  ddp_model_t *model)
{
    size_t nb = ddp_model_num_buffers(model);
    DDP_FAIL_IF(nb != ix->nbuffers, DDP_ERR_MISMATCH,
                "checkpoint %s holds %zu buffers, the model has %zu", dir, ix->nbuffers, nb);
    for (size_t i = 0; i < nb; i++) {
        const ddp_buffer *b = ddp_model_buffer(model, i);
        const ddp__ckpt_buffer *x = &ix->buffers[i];
        int same = strcmp(b->name, x->name) == 0 && b->dtype == x->dtype && b->ndim == x->ndim;
        for (int d = 0; same && d < b->ndim; d++)
            same = b->shape[d] == x->shape[d];
        if (!same) {
            char a[128], c[128];
            ddp__st_shape_str(a, sizeof a, x->ndim, x->shape);
            ddp__st_shape_str(c, sizeof c, b->ndim, b->shape);
            return DDP_ERROR(DDP_ERR_MISMATCH,
                             "checkpoint %s: buffer %zu is %s %s %s, the model's is %s %s %s",
                             dir, i, x->name, dtype_name(x->dtype), a, b->name,
                             dtype_name(b->dtype), c);
        }
    }
    return 0;
}

void ddp__ckpt_buffers_copy(const ddp__ckpt_index *ix, const ddp__st_file *f, ddp_model_t *model)
{
    for (size_t i = 0; i < ix->nbuffers; i++) {
        ddp_buffer *b = ddp_model_buffer(model, i);
        const ddp__st_entry *e = ddp__st_find(f, b->name); /* checked by the open */
        memcpy(b->data, f->data + e->begin, b->nbytes);
    }
}

void ddp__ckpt_buffers_outputs(const ddp__ckpt_index *ix, const ddp__st_file *f, ddp__st_out *t)
{
    for (size_t i = 0; i < ix->nbuffers; i++) {
        const ddp__ckpt_buffer *b = &ix->buffers[i];
        const ddp__st_entry *e = ddp__st_find(f, b->name);
        t[i] = (ddp__st_out){b->name, b->ndim, b->shape, f->data + e->begin, b->dtype};
    }
}
