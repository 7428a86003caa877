/* DDP's tail pieces (tail-free overlap, opts.tail_chunks): the last bucket
 * is reduced as pieces whose ends match the row chunks in which nn/ computes
 * the last weight gradient (nn.h rule 7), each piece launched as soon as its
 * chunk is done, so the last bucket's reduction overlaps that layer's own
 * backward.  docs/ddp.md, "Tail-free overlap". */
#include <stdlib.h>

#include "base/error.h"
#include "ddp/wrapper.h"

/* The pieces of the last bucket for tail-free overlap: chunk boundaries of
 * the parameter last in fill order (the last gradient computed), when it is
 * a matrix (a Linear weight: rows of contiguous floats) that splits. */
int ddp__dp_plan_pieces(ddp_data_parallel_t *dm)
{
    free(dm->piece_end);
    free(dm->piece_works);
    dm->piece_end = NULL;
    dm->piece_works = NULL;
    dm->npieces = 0;
    const ddp__bucket_layout *l = &dm->layout;
    if (dm->opts.tail_chunks < 2 || dm->nparams == 0 || dm->opts.comm_hook != DDP_HOOK_ALLREDUCE)
        return 0;
    int p = dm->order[dm->nparams - 1], b = l->nbuckets - 1;
    const ddp_param *w = dm->params[p];
    if (w->ndim != 2 || w->shape[0] < 2)
        return 0;
    int64_t rows = w->shape[0];
    size_t row_len = w->numel / (size_t)rows;
    int want = dm->opts.tail_chunks < rows ? dm->opts.tail_chunks : (int)rows;
    size_t min_bytes = (size_t)(dm->opts.tail_min_piece_mb * DDP_MIB);
    if (min_bytes && l->bucket_numel[b] * sizeof(float) / min_bytes < (size_t)want)
        want = (int)(l->bucket_numel[b] * sizeof(float) / min_bytes);
    if (want < 2)
        return 0;
    int64_t *bounds = calloc((size_t)want + 1, sizeof *bounds);
    DDP_FAIL_IF(!bounds, DDP_ERR_NOMEM, "DDP: out of memory");
    int n = ddp_grad_chunk_bounds(rows, want, bounds);
    dm->piece_end = calloc((size_t)n, sizeof *dm->piece_end);
    dm->piece_works = calloc((size_t)n, sizeof *dm->piece_works);
    if (!dm->piece_end || !dm->piece_works) {
        free(bounds);
        return DDP_ERROR(DDP_ERR_NOMEM, "DDP: out of memory");
    }
    for (int k = 0; k < n; k++)
        dm->piece_end[k] = l->offset[p] + (size_t)bounds[k + 1] * row_len;
    dm->piece_end[n - 1] = l->bucket_start[b] + l->bucket_numel[b]; /* the rest of the bucket */
    free(bounds);
    dm->npieces = n > 1 ? n : 0;
    dm->piece_param = p;
    return 0;
}

/* Are the last bucket's reductions split into pieces this iteration?  Only
 * with the default hook (a user hook sees whole buckets). */
int ddp__dp_use_pieces(const ddp_data_parallel_t *dm, int b)
{
    return dm->npieces && b == dm->layout.nbuckets - 1 && !dm->has_user_hook;
}

/* Launches pieces [pieces_launched, upto) of the last bucket, the final one
 * deferred to the caller's thread when the last bucket would be. */
int ddp__dp_launch_pieces(ddp_data_parallel_t *dm, int upto)
{
    int b = dm->layout.nbuckets - 1;
    for (int k = dm->pieces_launched; k < upto; k++) {
        size_t start = k ? dm->piece_end[k - 1] : dm->layout.bucket_start[b];
        size_t n = dm->piece_end[k] - start;
        dm->piece_works[k] = NULL;
        if (k == dm->npieces - 1 && ddp__dp_defer_last(dm, b)) {
            dm->deferred = 1;
            dm->defer_start = start;
            dm->defer_count = n;
        } else {
            DDP_TRY(ddp_pg_all_reduce_async(dm->pg, dm->grads + start, n, DDP_FLOAT32, DDP_AVG,
                                         &dm->piece_works[k]));
        }
        dm->pieces_launched = k + 1;
    }
    return 0;
}

/* nn's chunk plan (nn.h rule 7): chunk the parameter computed last when its
 * bucket is the next to go and it is the bucket's last missing gradient. */
int ddp__dp_on_chunk_plan(ddp_param *p, int64_t rows, void *user)
{
    ddp_data_parallel_t *dm = user;
    int b = dm->layout.nbuckets - 1;
    (void)rows;
    if (!dm->in_backward || dm->no_sync || !ddp__dp_use_pieces(dm, b) || p->index != dm->piece_param ||
        dm->pieces_launched || dm->tracker.next_launch != b || dm->tracker.pending[b] != 1)
        return 0;
    dm->pieces_live = 1;
    return dm->npieces;
}

/* Rows [.., row_end) of the chunked parameter are final: launch the pieces
 * they complete. */
int ddp__dp_on_chunk(ddp_param *p, int64_t row_begin, int64_t row_end, void *user)
{
    ddp_data_parallel_t *dm = user;
    (void)row_begin;
    if (!dm->pieces_live || p->index != dm->piece_param)
        return 0;
    size_t done = dm->layout.offset[p->index] + (size_t)row_end * (p->numel / (size_t)p->shape[0]);
    int upto = dm->pieces_launched;
    while (upto < dm->npieces - 1 && dm->piece_end[upto] <= done)
        upto++;
    if (row_end == p->shape[0])
        upto = dm->npieces;
    return ddp__dp_launch_pieces(dm, upto);
}
