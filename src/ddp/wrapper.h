/* Private state of the DDP wrapper (include/ddp/ddp.h), a thin layer on the
 * reducer (reducer_impl.h): its regions are the model's parameters, in
 * registration order.  Shared by its files:
 *   ddp.c    the wrapper's construction: options, the reducer made with
 *            DDP's words (its options line, parameter shapes), gradients
 *            re-pointed into the bucket memory at every layout, hooks,
 *            create/destroy, introspection;
 *   step.c   the step: forward (join's flag), backward through nn's
 *            grad-ready hook into the reducer, an optimizer step under
 *            no_sync caught;
 *   tail.c   the tail pieces' plan (the last weight gradient computed in
 *            row chunks, tail_chunks) and nn's chunk hook.
 * Design and costs: docs/ddp.md. */
#ifndef DDP_DDP_WRAPPER_H
#define DDP_DDP_WRAPPER_H

#include "ddp/ddp.h"
#include "ddp/ext.h"
#include "ddp/reducer_impl.h"

#define DDP_TAIL_CHUNKS_MAX 1024

struct ddp_data_parallel {
    ddp_model_t *model;           /* borrowed */
    ddp_pg_t *pg;                 /* borrowed: the reducer holds the reference */
    ddp_data_parallel_options opts;
    int nparams;
    ddp_param **params;           /* (nparams) registration order */
    ddp_reducer_t *red;           /* the engine */
    /* A no_sync backward left local gradients that no backward reduced yet,
     * at this parameter version (ddp_model_param_version): a change of
     * version before the next synchronising backward is an optimizer step
     * on unaveraged gradients (step.c, check_no_sync_step). */
    int unsynced;
    uint64_t unsynced_version;
    int in_backward;              /* inside ddp_data_parallel_backward (hook calls are expected) */
    int piece_param;              /* tail_chunks: the chunked parameter, -1: none */
    int no_sync_refused;          /* set_no_sync(1) with reduce_scatter: the next step fails */
};

/* ---- step.c -------------------------------------------------------------- */
/* nn's grad-ready hook, installed by create. */
int ddp__dp_on_grad_ready(ddp_param *p, int used, void *user);
/* nn's grad-write hook (rule 8), installed with reduce_scatter: points the
 * gradient at its bucket's pool buffer. */
int ddp__dp_on_grad_write(ddp_param *p, float **grad, void *user);

/* ---- tail.c -------------------------------------------------------------- */
/* Plans the last bucket's pieces for the reducer's current layout. */
int ddp__dp_plan_pieces(ddp_data_parallel_t *dm, ddp_reducer_t *r);
/* nn's chunk hook (nn.h rule 7), installed by create with tail_chunks. */
int ddp__dp_on_chunk_plan(ddp_param *p, int64_t rows, void *user);
int ddp__dp_on_chunk(ddp_param *p, int64_t row_begin, int64_t row_end, void *user);

#endif
