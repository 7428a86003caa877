/* Private state of the pipeline (include/ddp/pipeline.h), shared by its
 * three files:
 *   pipeline.c           options, the (replicas x stages) layout and its
 *                        subgroups, create/destroy, accessors;
 *   pipeline_comm.c      activations and gradients between neighbouring
 *                        stages: the shape header, its checks, messages
 *                        that name the stage;
 *   pipeline_schedule.c  the GPipe and 1F1B action lists, one micro-batch's
 *                        forward and backward, the step, evaluation.
 * Design, schedules and costs: docs/pipeline.md. */
#ifndef DDP_DDP_PIPELINE_INTERNAL_H
#define DDP_DDP_PIPELINE_INTERNAL_H

#include "ddp/pipeline.h"

/* The header before every activation and gradient: 16 int64 (128 bytes). */
enum {
    DDP__PP_HDR_MAGIC, DDP__PP_HDR_KIND, DDP__PP_HDR_STEP, DDP__PP_HDR_MB, DDP__PP_HDR_STAGE,
    DDP__PP_HDR_NDIM, DDP__PP_HDR_DIMS, DDP__PP_HDR_LEN = 16
};
enum { DDP__PP_ACT = 1, DDP__PP_GRAD = 2 }; /* header kinds */

/* One micro-batch in flight on this stage: its tape and what its sends
 * still read (the tape's arena holds the values sent). */
typedef struct ddp__pp_slot {
    ddp_tape_t *tape;
    int mb;                       /* the micro-batch using it, -1: none */
    int64_t rows;
    float *in_buf;                /* (rows, input) the received activation (stage > 0) */
    size_t in_cap;                /* floats allocated */
    ddp_tensor in_t;              /* over in_buf, or over stage 0's input rows */
    ddp_var_t *x, *y, *loss;      /* input, output, weighted loss (last stage) */
    int64_t hdr[2][DDP__PP_HDR_LEN];  /* [0] activation, [1] gradient header sent */
    ddp_work_t *sends[4];         /* activation header, data, gradient header, data */
} ddp__pp_slot;

struct ddp_pipeline {
    ddp_pg_t *world;              /* borrowed */
    ddp_model_t *model;           /* borrowed: this stage's part */
    ddp_pipeline_options opt;
    int rank, stage, replica, S, R, M;
    int prev_rank, next_rank;     /* world ranks of the neighbours, -1: none */
    /* Two-rank subgroups, lower stage = rank 0: one per direction, so that
     * each subgroup's executor only sends or only receives (no deadlock
     * whatever the transport buffers). */
    ddp_pg_t *act_in, *grad_out;  /* with the previous stage */
    ddp_pg_t *act_out, *grad_in;  /* with the next stage */
    ddp_pg_t *replicas;           /* this stage on every replica (R > 1) */
    int64_t in_numel;             /* floats per sample of the input, 0: unknown (stage 0) */
    ddp__pp_slot *slots;
    int nslots;
    float *dy;                    /* gradient received from the next stage */
    size_t dy_cap;
    int64_t step;                 /* steps and evaluations so far: in every header */
    double busy_s, idle_s;
    int failed;                   /* a step failed: the stages are out of step */
};

/* pipeline.c.  After a failed step (the last error says why): the stage
 * is marked failed and every subgroup it belongs to is aborted with that
 * message, so the ranks waiting on this one fail at once, naming the cause.
 * Keeps the last error. */
void ddp__pp_abort(ddp_pipeline_t *pp, int rc);

/* pipeline_comm.c.  Sends slot's tensor (rows, ...) t on g to peer 1-side
 * as micro-batch mb (kind ACT to the next stage, GRAD to the previous). */
int ddp__pp_send(ddp_pipeline_t *pp, ddp__pp_slot *slot, int kind, const ddp_tensor *t);
/* Receives micro-batch mb's activation (kind ACT, from the previous stage)
 * or gradient (GRAD, from the next) of the expected shape into buf
 * (numel floats); a header of another step, micro-batch or shape fails
 * naming this stage, the micro-batch and both shapes. */
int ddp__pp_recv(ddp_pipeline_t *pp, int kind, int mb, const ddp_tensor *expect, float *buf);
/* Waits for the slot's sends: each ends within the group's timeout, when
 * the communication thread gives up on it (the wait itself does not time
 * out first: the tape is reset right after, so the send must be over). */
int ddp__pp_wait_sends(ddp_pipeline_t *pp, ddp__pp_slot *slot);

#endif
