/* Sharded checkpoints, the writing side (include/ddp/zero.h, format in
 * docs/zero.md): every rank writes its shard as a safetensors file through
 * nn/safetensors.c (temporary file, fsync, rename), the ranks agree that
 * every shard is on disk, then rank 0 writes index.json the same way.  A
 * checkpoint id drawn by rank 0 goes into every file, so that shards of
 * another save are recognised even at the same step. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/file.h"
#include "base/rng.h"
#include "ddp/shard_ckpt.h"
#include "nn/safetensors.h"

void ddp__shard_file_name(char *buf, size_t len, int rank, int world)
{
    snprintf(buf, len, "shard-%05d-of-%05d.safetensors", rank, world);
}

void ddp__shard_meta_strings(const ddp__shard_meta *m, char v[][32], const char **meta)
{
    static const char *const keys[DDP__SHARD_NMETA] = {
        "libddp.epoch",      "libddp.step",       "libddp.global_step",     "libddp.seed",
        "libddp.world_size", "libddp.rank",       "libddp.optimizer_steps", "libddp.checkpoint_id"};
    snprintf(v[0], 32, "%" PRId64, m->st.epoch);
    snprintf(v[1], 32, "%" PRId64, m->st.step);
    snprintf(v[2], 32, "%" PRId64, m->st.global_step);
    snprintf(v[3], 32, "%" PRIu64, m->st.seed);
    snprintf(v[4], 32, "%d", m->world);
    snprintf(v[5], 32, "%d", m->rank);
    snprintf(v[6], 32, "%" PRId64, m->opt_steps);
    snprintf(v[7], 32, "%016" PRIx64, m->id);
    for (int i = 0; i < DDP__SHARD_NMETA; i++) {
        meta[2 * i] = keys[i];
        meta[2 * i + 1] = v[i];
    }
}

/* One shard's tensors: each piece's values, then each state's pieces. */
static int write_shard(const char *dir, const ddp__ckpt_save *s, const ddp__shard_meta *m)
{
    int ns = s->opt ? ddp_optim_num_states(s->opt) : 0;
    DDP_FAIL_IF(ns > DDP__CKPT_MAX_STATES, DDP_ERR_UNSUPPORTED, "%s: %d optimizer states are "
                "more than %d", s->what, ns, DDP__CKPT_MAX_STATES);
    size_t n = s->npieces * (size_t)(1 + ns);
    ddp__st_out *t = calloc(n ? n : 1, sizeof *t);
    char(*names)[DDP__CKPT_NAME_MAX] = calloc(n ? n : 1, sizeof *names);
    int64_t *lens = calloc(s->npieces ? s->npieces : 1, sizeof *lens);
    int rc = 0;
    char path[4096], fname[64];
    DDP_FAIL_OUT(!t || !names || !lens, DDP_ERR_NOMEM, "%s: out of memory", s->what);
    for (size_t i = 0; i < s->npieces; i++) {
        const ddp__ckpt_piece *pc = &s->pieces[i];
        lens[i] = (int64_t)pc->len;
        t[i] = (ddp__st_out){pc->name, 1, &lens[i], pc->values, DDP_FLOAT32};
    }
    for (int k = 0; k < ns; k++) {
        const char *sname;
        float *data;
        DDP_TRY_OUT(ddp_optim_state(s->opt, k, &sname, &data, NULL));
        for (size_t i = 0; i < s->npieces; i++) {
            const ddp__ckpt_piece *pc = &s->pieces[i];
            size_t j = s->npieces * (size_t)(1 + k) + i;
            snprintf(names[j], sizeof names[j], "optimizer.%s.%s", sname, pc->name);
            t[j] = (ddp__st_out){names[j], 1, &lens[i], data + pc->state_at, DDP_FLOAT32};
        }
    }
    char v[DDP__SHARD_NMETA][32];
    const char *meta[2 * DDP__SHARD_NMETA];
    ddp__shard_meta_strings(m, v, meta);
    ddp__shard_file_name(fname, sizeof fname, s->shard, s->nshards);
    snprintf(path, sizeof path, "%s/%s", dir, fname);
    rc = ddp__st_write(path, t, n, meta, DDP__SHARD_NMETA);
out:
    free(t);
    free(names);
    free(lens);
    return rc;
}

/* ==== index.json ========================================================== */

void ddp__ckpt_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* Per tensor: its place in the flat block and which rank's file holds
 * which of its element ranges (tensor-local), for readers of the index. */
static void put_tensors(FILE *f, const ddp__ckpt_save *s)
{
    fputs(",\n  \"tensors\": [", f);
    for (size_t i = 0; i < s->nentries; i++) {
        const ddp__ckpt_entry *p = &s->entries[i];
        fprintf(f, "%s\n    {\"name\": ", i ? "," : "");
        ddp__ckpt_json_string(f, p->name);
        fputs(", \"shape\": [", f);
        for (int d = 0; d < p->ndim; d++)
            fprintf(f, "%s%" PRId64, d ? ", " : "", p->shape[d]);
        fprintf(f, "], \"offset\": %zu, \"numel\": %zu, \"pieces\": [", p->offset, p->numel);
        int first = 1;
        for (int r = 0; r < s->nshards; r++) {
            size_t b = s->bounds[r], e = s->bounds[r + 1];
            b = b > p->offset ? b : p->offset;
            e = e < p->offset + p->numel ? e : p->offset + p->numel;
            if (b >= e)
                continue;
            fprintf(f, "%s{\"rank\": %d, \"begin\": %zu, \"end\": %zu}", first ? "" : ", ", r,
                    b - p->offset, e - p->offset);
            first = 0;
        }
        fputs("]}", f);
    }
    fputs("\n  ]", f);
}

static int write_index(const char *dir, const ddp__ckpt_save *s, const ddp__shard_meta *m)
{
    char *text = NULL, path[4096];
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    DDP_FAIL_IF(!f, DDP_ERR_NOMEM, "%s: out of memory for the index", s->what);
    fprintf(f,
            "{\n  \"format\": \"%s\", \"version\": 1,\n  \"id\": \"%016" PRIx64 "\",\n"
            "  \"world_size\": %d, \"total\": %zu,\n  \"epoch\": %" PRId64 ", \"step\": %" PRId64
            ", \"global_step\": %" PRId64 ", \"seed\": %" PRIu64 ", \"optimizer_steps\": %" PRId64,
            DDP__CKPT_FORMAT, m->id, s->nshards, s->total, m->st.epoch, m->st.step,
            m->st.global_step, m->st.seed, m->opt_steps);
    if (s->replicas != s->nshards)
        fprintf(f, ", \"replicas\": %d", s->replicas);
    fputs(",\n  \"states\": [", f);
    int ns = s->opt ? ddp_optim_num_states(s->opt) : 0;
    for (int k = 0; k < ns; k++) {
        const char *sname = "";
        ddp_optim_state(s->opt, k, &sname, NULL, NULL);
        fputs(k ? ", " : "", f);
        ddp__ckpt_json_string(f, sname);
    }
    fputs("],\n  \"shards\": [", f);
    for (int r = 0; r < s->nshards; r++) {
        char fname[64];
        ddp__shard_file_name(fname, sizeof fname, r, s->nshards);
        fprintf(f, "%s\n    {\"rank\": %d, \"file\": \"%s\", \"begin\": %zu, \"end\": %zu}",
                r ? "," : "", r, fname, s->bounds[r], s->bounds[r + 1]);
    }
    fputs("\n  ]", f);
    put_tensors(f, s);
    if (s->buffers)
        ddp__ckpt_buffers_json(f, s->buffers);
    fputs("\n}\n", f);
    int bad = fclose(f) != 0;
    int rc = 0;
    DDP_FAIL_OUT(bad || !text, DDP_ERR_NOMEM, "%s: out of memory for the index", s->what);
    snprintf(path, sizeof path, "%s/" DDP__CKPT_INDEX, dir);
    rc = ddp__file_write_atomic(path, text, len);
out:
    free(text);
    return rc;
}

/* ==== agreement =========================================================== */

int ddp__shard_agree(ddp_pg_t *pg, int rc, const char *what, const char *dir)
{
    int world = ddp_pg_size(pg), rank = ddp_pg_rank(pg);
    int32_t *all = calloc((size_t)world, sizeof *all);
    DDP_FAIL_IF(!all, DDP_ERR_NOMEM, "ZeRO checkpoint: out of memory");
    int32_t mine = rc;
    int grc = ddp_pg_all_gather(pg, &mine, all, 1, DDP_INT32);
    if (grc < 0) {
        free(all);
        return grc;
    }
    for (int r = 0; r < world && rc == 0; r++)
        if (all[r] < 0)
            rc = DDP_ERROR(all[r], "sharded checkpoint %s %s: rank %d failed (%s); see its "
                           "error", what, dir, r, ddp_err_name(all[r]));
    (void)rank;
    free(all);
    return rc;
}

int ddp__ckpt_save_run(const char *dir, const ddp__ckpt_save *s, const ddp_train_state *st)
{
    DDP_FAIL_IF(st->epoch < 0 || st->step < 0 || st->global_step < 0, DDP_ERR_INVALID_ARG,
                "%s save: negative position (epoch %" PRId64 ", step %" PRId64
                ", global_step %" PRId64 ")",
                s->what, st->epoch, st->step, st->global_step);
    int rank = ddp_pg_rank(s->pg);
    ddp__shard_meta m = {.st = *st, .rank = s->shard, .world = s->nshards,
                         .opt_steps = s->opt ? ddp_optim_steps(s->opt) : 0};
    m.st.world_size = s->replicas;
    if (rank == 0)
        DDP_TRY(ddp__random_bytes(&m.id, sizeof m.id));
    DDP_TRY(ddp_pg_broadcast(s->pg, &m.id, 1, DDP_INT64, 0));
    int rc = s->shard >= 0 ? write_shard(dir, s, &m) : 0;
    if (rc == 0 && rank == 0 && s->buffers)
        rc = ddp__ckpt_buffers_write(dir, s->buffers, &m);
    DDP_TRY(ddp__shard_agree(s->pg, rc, "save", dir));
    rc = rank == 0 ? write_index(dir, s, &m) : 0;
    int32_t r0 = rc;
    DDP_TRY(ddp_pg_broadcast(s->pg, &r0, 1, DDP_INT32, 0));
    if (rc == 0 && r0 < 0)
        rc = DDP_ERROR(r0, "%s save %s: rank 0 could not write the index (%s)", s->what, dir,
                       ddp_err_name(r0));
    return rc;
}

/* ZeRO's pieces and, on rank 0, the whole model's tensors: the partition's
 * shards, one per rank. */
int ddp_zero_checkpoint_save(const char *dir, ddp_zero_t *z, ddp_optim_t *opt,
                             const ddp_train_state *st)
{
    DDP_FAIL_IF(!dir || !z || !st, DDP_ERR_INVALID_ARG, "ZeRO checkpoint save: NULL argument");
    size_t np = ddp_model_num_params(z->model);
    ddp__ckpt_piece *pieces = calloc(z->npieces ? z->npieces : 1, sizeof *pieces);
    ddp__ckpt_entry *entries = calloc(np ? np : 1, sizeof *entries);
    size_t *bounds = calloc((size_t)z->world + 1, sizeof *bounds);
    int rc = 0;
    DDP_FAIL_OUT(!pieces || !entries || !bounds, DDP_ERR_NOMEM,
                 "ZeRO checkpoint: out of memory");
    for (size_t i = 0; i < z->npieces; i++) {
        const ddp__zero_piece *pc = &z->pieces[i];
        pieces[i] = (ddp__ckpt_piece){pc->real->name, pc->len, pc->sp->data, pc->sp->offset};
    }
    for (size_t i = 0; i < np; i++) {
        const ddp_param *p = ddp_model_param(z->model, i);
        entries[i] = (ddp__ckpt_entry){p->name, p->ndim, p->shape, p->offset, p->numel};
    }
    for (int r = 0; r < z->world; r++)
        ddp__zero_partition(z->total, z->world, r, &bounds[r], &bounds[r + 1]);
    ddp__ckpt_save s = {.what = "ZeRO checkpoint", .pg = z->pg, .shard = z->rank,
                        .nshards = z->world, .replicas = z->world, .pieces = pieces,
                        .npieces = z->npieces, .opt = opt, .total = z->total, .bounds = bounds,
                        .entries = entries, .nentries = np, .buffers = z->model};
    rc = ddp__ckpt_save_run(dir, &s, st);
out:
    free(pieces);
    free(entries);
    free(bounds);
    return rc;
}
