/* Private state of the DDP wrapper (include/ddp/ddp.h), shared by its five
 * files:
 *   ddp.c    the wrapper's state and construction: options, create/destroy,
 *            the bucket layout and its one-time rebuild, introspection;
 *   agree.c  the cross-rank agreement check at creation (options, parameter
 *            names and shapes);
 *   step.c   the step: forward, backward with the grad-ready hook, bucket
 *            launch (built-in and user comm hooks), the deferred last bucket,
 *            the wait;
 *   tail.c   the tail pieces: the last bucket reduced in pieces while the
 *            last weight gradient is computed in row chunks (tail_chunks);
 *   join.c   join for uneven inputs.
 * Design and costs: docs/ddp.md. */
#ifndef DDP_DDP_WRAPPER_H
#define DDP_DDP_WRAPPER_H

#include "ddp/ddp.h"
#include "ddp/bucket.h"
#include "ddp/ext.h"

#define DDP_MIB (1024.0 * 1024.0)
#define DDP_TAIL_CHUNKS_MAX 1024

struct ddp_data_parallel {
    ddp_model_t *model;           /* borrowed */
    ddp_pg_t *pg;                 /* a reference held (ddp__pg_retain): teardown in any order */
    ddp_data_parallel_options opts;
    int nparams;
    ddp_param **params;           /* (nparams) registration order */
    size_t *numel;                /* (nparams) */
    ddp__bucket_layout layout;
    ddp__bucket_tracker tracker;
    float *grads;                 /* (layout.total_numel) the bucket memory */
    uint16_t *half;               /* (layout.total_numel) fp16/bf16 hook scratch */
    ddp_work_t **works;           /* (nbuckets) reductions in flight */
    unsigned char *launched;      /* (nbuckets) launched this iteration, not yet waited */
    int *order;                   /* (nparams) fill order of the current layout */
    int *ready_order;             /* (nparams) used parameters in ready order */
    int nready;
    int no_sync;
    /* A no_sync backward left local gradients that no backward reduced yet,
     * at this parameter version (ddp_model_param_version): a change of
     * version before the next synchronising backward is an optimizer step
     * on unaveraged gradients (step.c, check_no_sync_step). */
    int unsynced;
    uint64_t unsynced_version;
    int in_backward;              /* inside ddp_data_parallel_backward (hook calls are expected) */
    int rebuilt;
    ddp_comm_hook user_hook;
    int has_user_hook;
    int join_enabled, join_throw;
    int deferred;                 /* [defer_start, +defer_count) waits for the end of backward */
    size_t defer_start, defer_count;
    int no_defer;                 /* DDP_NO_DEFER=1: launch it like the others (to measure) */
    /* Tail-free overlap (opts.tail_chunks): the last bucket is reduced as
     * npieces consecutive pieces, the same on every rank in every
     * iteration; piece k ends where chunk k of the last parameter in fill
     * order (computed last) ends.  The pieces go out one by one while that
     * parameter's gradient is computed in row chunks (live), or all at once
     * when the bucket completes otherwise. */
    int npieces;                  /* 0: the last bucket is reduced whole */
    int piece_param;              /* the chunked parameter */
    size_t *piece_end;            /* (npieces) element offsets in grads */
    ddp_work_t **piece_works;     /* (npieces) */
    int pieces_launched;          /* pieces launched this iteration */
    int pieces_live;              /* launched as the chunks are computed */
    uint64_t *tl_launch;          /* (tl_nlaunch) timeline: each bucket's launch time, 0: none */
    int tl_nlaunch;
    /* DDP_DEBUG=detail (debug.c): iterations so far, the last report */
    unsigned long long debug_iter;
    char *debug_last;
};

/* ---- ddp.c: the layout --------------------------------------------------- */
/* PyTorch rebuilds once, and not when unused parameters are searched for. */
int ddp__dp_rebuild_due(const ddp_data_parallel_t *dm);
/* Rebuilds the buckets from rank 0's ready order (collective). */
int ddp__dp_rebuild_buckets(ddp_data_parallel_t *dm);

/* ---- agree.c ------------------------------------------------------------- */
/* All ranks check that every rank has rank 0's options and parameter names
 * and shapes (collective); DDP_ERR_MISMATCH names the first difference. */
int ddp__dp_check_same_params(ddp_data_parallel_t *dm);

/* ---- step.c -------------------------------------------------------------- */
/* nn's grad-ready hook, installed by create. */
int ddp__dp_on_grad_ready(ddp_param *p, int used, void *user);
/* Launches bucket b's reduction through the comm hook. */
int ddp__dp_launch_bucket(ddp_data_parallel_t *dm, int b);
/* Is bucket b (or its last piece) reduced on the caller's thread after
 * backward rather than handed to the communication thread? */
int ddp__dp_defer_last(const ddp_data_parallel_t *dm, int b);
/* Reduces the deferred bucket or piece, if any, on this thread. */
int ddp__dp_reduce_deferred(ddp_data_parallel_t *dm);
/* Waits for every launched bucket and piece (with finish: runs the hooks'
 * finish steps); leaves nothing in flight; the first failure wins. */
int ddp__dp_wait_buckets(ddp_data_parallel_t *dm, int finish);

/* ---- tail.c -------------------------------------------------------------- */
/* Plans the last bucket's pieces for the current layout (npieces 0: none). */
int ddp__dp_plan_pieces(ddp_data_parallel_t *dm);
/* Is bucket b reduced in pieces this iteration? */
int ddp__dp_use_pieces(const ddp_data_parallel_t *dm, int b);
/* Launches pieces [pieces_launched, upto) of the last bucket. */
int ddp__dp_launch_pieces(ddp_data_parallel_t *dm, int upto);
/* nn's chunk hook (nn.h rule 7), installed by create with tail_chunks. */
int ddp__dp_on_chunk_plan(ddp_param *p, int64_t rows, void *user);
int ddp__dp_on_chunk(ddp_param *p, int64_t row_begin, int64_t row_end, void *user);

/* ---- debug.c (DDP_DEBUG) ------------------------------------------------- */
/* info: logs the bucket layout. */
void ddp__dp_debug_layout(const ddp_data_parallel_t *dm);
/* detail: logs this iteration's unused parameters and bucket ready order
 * when they differ from the last iteration's. */
void ddp__dp_debug_iteration(ddp_data_parallel_t *dm);

/* ---- join.c -------------------------------------------------------------- */
/* The join protocol's part of a forward (when join is enabled): the "still
 * training" all-reduce, and throw_on_early_termination's check. */
int ddp__dp_join_forward(ddp_data_parallel_t *dm);

#endif
