/* Activations and gradients between neighbouring pipeline stages.
 *
 * Each tensor goes as two messages on the link's subgroup for its
 * direction: a 128-byte header (magic, kind, step, micro-batch, sending
 * stage, shape), then the floats.  The receiver reads the header first, so
 * that a tensor of the wrong shape is named with both shapes before its
 * bytes are expected (the transport would otherwise see only a length
 * mismatch, "sent N bytes where M were expected", with no stage or shape in
 * it).  The price is one small message per tensor (docs/pipeline.md gives
 * the measured cost).  Sends are asynchronous on a subgroup that only
 * sends from this side; receives block, with the group's timeout. */
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/time.h"
#include "base/timeline.h"
#include "ddp/pipeline_internal.h"

#define PP_MAGIC 0x3145504950504444LL /* "DDPPIPE1" */

static const char *kind_name(int kind) { return kind == DDP__PP_ACT ? "activation" : "gradient"; }

int ddp__pp_wait_sends(ddp_pipeline_t *pp, ddp__pp_slot *slot)
{
    int rc = 0;
    for (int i = 0; i < 4; i++) {
        if (!slot->sends[i])
            continue;
        int r = ddp_work_wait(slot->sends[i], -1);
        ddp_work_destroy(slot->sends[i]);
        slot->sends[i] = NULL;
        if (r < 0 && rc == 0) {
            int to = i < 2 ? pp->stage + 1 : pp->stage - 1;
            rc = ddp__error_context(r, "pipeline stage %d (rank %d): sending the %s of "
                                    "micro-batch %d to stage %d (rank %d)", pp->stage, pp->rank,
                                    kind_name(i < 2 ? DDP__PP_ACT : DDP__PP_GRAD), slot->mb, to,
                                    i < 2 ? pp->next_rank : pp->prev_rank);
        }
    }
    return rc;
}

int ddp__pp_send(ddp_pipeline_t *pp, ddp__pp_slot *slot, int kind, const ddp_tensor *t)
{
    ddp_pg_t *g = kind == DDP__PP_ACT ? pp->act_out : pp->grad_out;
    int peer = kind == DDP__PP_ACT ? 1 : 0, k = kind - 1;
    int64_t *h = slot->hdr[k];
    memset(h, 0, sizeof slot->hdr[k]);
    h[DDP__PP_HDR_MAGIC] = PP_MAGIC;
    h[DDP__PP_HDR_KIND] = kind;
    h[DDP__PP_HDR_STEP] = pp->step;
    h[DDP__PP_HDR_MB] = slot->mb;
    h[DDP__PP_HDR_STAGE] = pp->stage;
    h[DDP__PP_HDR_NDIM] = t->ndim;
    for (int i = 0; i < t->ndim; i++)
        h[DDP__PP_HDR_DIMS + i] = t->shape[i];
    int rc = ddp_pg_send_async(g, h, DDP__PP_HDR_LEN, DDP_INT64, peer, 0, &slot->sends[2 * k]);
    if (rc == 0)
        rc = ddp_pg_send_async(g, t->data, (size_t)t->numel, DDP_FLOAT32, peer, 1,
                               &slot->sends[2 * k + 1]);
    if (rc < 0)
        ddp__error_context(rc, "pipeline stage %d (rank %d): sending the %s of micro-batch %d",
                           pp->stage, pp->rank, kind_name(kind), slot->mb);
    return rc;
}

/* "(4, 128)" from a header's dimensions (ndim already checked). */
static char *hdr_shape(const int64_t *h, char *buf, size_t len)
{
    ddp_tensor t;
    memset(&t, 0, sizeof t);
    t.ndim = (int)h[DDP__PP_HDR_NDIM];
    for (int i = 0; i < t.ndim; i++)
        t.shape[i] = h[DDP__PP_HDR_DIMS + i];
    return ddp_tensor_shape_str(&t, buf, len);
}

/* The header against what this stage waits for: the right step and
 * micro-batch, then the shape. */
static int check_header(const ddp_pipeline_t *pp, const int64_t *h, int kind, int mb, int from,
                        const ddp_tensor *expect)
{
    DDP_FAIL_IF(h[DDP__PP_HDR_MAGIC] != PP_MAGIC || h[DDP__PP_HDR_KIND] != kind, DDP_ERR_PROTOCOL,
                "pipeline stage %d (rank %d): stage %d sent something that is not a %s header",
                pp->stage, pp->rank, from, kind_name(kind));
    DDP_FAIL_IF(h[DDP__PP_HDR_STEP] != pp->step || h[DDP__PP_HDR_MB] != mb, DDP_ERR_MISMATCH,
                "pipeline stage %d (rank %d): stage %d sent the %s of micro-batch %lld of step "
                "%lld where micro-batch %d of step %lld was expected (the stages run different "
                "schedules or steps)", pp->stage, pp->rank, from, kind_name(kind),
                (long long)h[DDP__PP_HDR_MB], (long long)h[DDP__PP_HDR_STEP], mb,
                (long long)pp->step);
    int64_t nd = h[DDP__PP_HDR_NDIM];
    DDP_FAIL_IF(nd < 0 || nd > DDP_TENSOR_MAX_DIM, DDP_ERR_PROTOCOL,
                "pipeline stage %d (rank %d): stage %d sent a %s of %lld dimensions", pp->stage,
                pp->rank, from, kind_name(kind), (long long)nd);
    int same = nd == expect->ndim;
    for (int i = 0; same && i < nd; i++)
        same = h[DDP__PP_HDR_DIMS + i] == expect->shape[i];
    char got[96], want[96];
    DDP_FAIL_IF(!same, DDP_ERR_MISMATCH,
                "pipeline stage %d (rank %d): the %s of micro-batch %d from stage %d has shape "
                "%s; stage %d expects %s", pp->stage, pp->rank, kind_name(kind), mb, from,
                hdr_shape(h, got, sizeof got), pp->stage,
                ddp_tensor_shape_str(expect, want, sizeof want));
    return 0;
}

int ddp__pp_recv(ddp_pipeline_t *pp, int kind, int mb, const ddp_tensor *expect, float *buf)
{
    ddp_pg_t *g = kind == DDP__PP_ACT ? pp->act_in : pp->grad_in;
    int peer = kind == DDP__PP_ACT ? 0 : 1;
    int from = kind == DDP__PP_ACT ? pp->stage - 1 : pp->stage + 1;
    int from_rank = kind == DDP__PP_ACT ? pp->prev_rank : pp->next_rank;
    int64_t h[DDP__PP_HDR_LEN];
    double t0 = ddp_time_now();
    uint64_t tl = ddp__tl_begin();
    int rc = ddp_pg_recv(g, h, DDP__PP_HDR_LEN, DDP_INT64, peer, 0);
    if (rc == 0) {
        rc = check_header(pp, h, kind, mb, from, expect);
        if (rc < 0) /* its message names stage, micro-batch and shapes already */
            return rc;
        rc = ddp_pg_recv(g, buf, (size_t)expect->numel, DDP_FLOAT32, peer, 1);
    }
    pp->idle_s += ddp_time_now() - t0;
    ddp__tl_end(tl, kind == DDP__PP_ACT ? "pipeline wait activation" : "pipeline wait gradient",
                "micro_batch", mb);
    if (rc < 0)
        ddp__error_context(rc, "pipeline stage %d (rank %d): waiting for the %s of micro-batch "
                           "%d from stage %d (rank %d)", pp->stage, pp->rank, kind_name(kind),
                           mb, from, from_rank);
    return rc;
}
