/* DDP's tail pieces (tail-free overlap, opts.tail_chunks): the last bucket
 * is reduced as pieces whose ends match the row chunks in which nn/ computes
 * the last weight gradient (nn.h rule 7), each piece launched as soon as its
 * chunk is done, so the last bucket's reduction overlaps that layer's own
 * backward.  The reducer launches the pieces (reducer_step.c); the plan
 * needs the parameter's rows and nn's chunk rule, hence it lives here, on
 * the DDP side: a raw-region reducer has no rows to chunk.
 * docs/ddp.md, "Tail-free overlap". */
#include <stdlib.h>

#include "base/error.h"
#include "ddp/wrapper.h"

/* The pieces of the last bucket for tail-free overlap: chunk boundaries of
 * the parameter last in fill order (the last gradient computed), when it is
 * a matrix (a Linear weight: rows of contiguous floats) that splits. */
int ddp__dp_plan_pieces(ddp_data_parallel_t *dm, ddp_reducer_t *r)
{
    dm->piece_param = -1;
    const ddp__bucket_layout *l = &r->layout;
    if (dm->opts.tail_chunks < 2 || dm->nparams == 0 || dm->opts.comm_hook != DDP_HOOK_ALLREDUCE ||
        dm->opts.reduce_scatter)
        return ddp__reducer_set_pieces(r, NULL, 0);
    int p = r->order[dm->nparams - 1], b = l->nbuckets - 1;
    const ddp_param *w = dm->params[p];
    if (w->ndim != 2 || w->shape[0] < 2)
        return ddp__reducer_set_pieces(r, NULL, 0);
    int64_t rows = w->shape[0];
    size_t row_len = w->numel / (size_t)rows;
    int want = dm->opts.tail_chunks < rows ? dm->opts.tail_chunks : (int)rows;
    size_t min_bytes = (size_t)(dm->opts.tail_min_piece_mb * DDP_MIB);
    if (min_bytes && l->bucket_numel[b] * sizeof(float) / min_bytes < (size_t)want)
        want = (int)(l->bucket_numel[b] * sizeof(float) / min_bytes);
    if (want < 2)
        return ddp__reducer_set_pieces(r, NULL, 0);
    int64_t *bounds = calloc((size_t)want + 1, sizeof *bounds);
    size_t *ends = calloc((size_t)want + 1, sizeof *ends);
    int rc = 0;
    DDP_FAIL_OUT(!bounds || !ends, DDP_ERR_NOMEM, "DDP: out of memory");
    int n = ddp_grad_chunk_bounds(rows, want, bounds);
    for (int k = 0; k < n; k++)
        ends[k] = l->offset[p] + (size_t)bounds[k + 1] * row_len;
    ends[n - 1] = l->bucket_start[b] + l->bucket_numel[b]; /* the rest of the bucket */
    rc = ddp__reducer_set_pieces(r, ends, n > 1 ? n : 0);
    if (rc == 0 && n > 1)
        dm->piece_param = p;
out:
    free(bounds);
    free(ends);
    return rc;
}

/* nn's chunk plan (nn.h rule 7): chunk the parameter computed last when its
 * bucket is the next to go and it is the bucket's last missing gradient. */
int ddp__dp_on_chunk_plan(ddp_param *p, int64_t rows, void *user)
{
    ddp_data_parallel_t *dm = user;
    ddp_reducer_t *r = dm->red;
    int b = r->layout.nbuckets - 1;
    (void)rows;
    if (!dm->in_backward || r->no_sync || !ddp__reducer_use_pieces(r, b) ||
        p->index != dm->piece_param || r->pieces_launched || r->tracker.next_launch != b ||
        r->tracker.pending[b] != 1)
        return 0;
    r->pieces_live = 1;
    return r->npieces;
}

/* Rows [.., row_end) of the chunked parameter are final: launch the pieces
 * they complete. */
int ddp__dp_on_chunk(ddp_param *p, int64_t row_begin, int64_t row_end, void *user)
{
    ddp_data_parallel_t *dm = user;
    ddp_reducer_t *r = dm->red;
    (void)row_begin;
    if (!r->pieces_live || p->index != dm->piece_param)
        return 0;
    size_t done = r->layout.offset[p->index] + (size_t)row_end * (p->numel / (size_t)p->shape[0]);
    int upto = r->pieces_launched;
    while (upto < r->npieces - 1 && r->piece_end[upto] <= done)
        upto++;
    if (row_end == p->shape[0])
        upto = r->npieces;
    return ddp__reducer_launch_pieces(r, upto);
}
