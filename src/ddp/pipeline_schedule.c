/* The pipeline's schedules and its step (include/ddp/pipeline.h).
 *
 * A schedule is the order in which one stage runs its 2M actions, F(m)
 * (receive micro-batch m's activation, forward, send the output) and B(m)
 * (receive the output's gradient, backward, send the input's gradient):
 *
 *   GPipe (Huang et al. 2019; torch's ScheduleGPipe): F(0) .. F(M-1), then
 *   B(0) .. B(M-1).  Every micro-batch's graph is held until its backward.
 *
 *   1F1B (PipeDream-Flush, Narayanan et al. 2021; torch's Schedule1F1B):
 *   w = min(S - 1 - stage, M) warm-up forwards, then pairs F(w + i), B(i),
 *   then the remaining backwards.  At most w + 1 graphs are held.
 *
 * Both have the bubble (S - 1) / (M + S - 1) when stages take equal time;
 * 1F1B only holds fewer activations.  Each F(m) on a stage needs F(m) of
 * the stage before, each B(m) needs B(m) of the stage after, and every list
 * has F(m) before B(m): with sends that never block (pipeline_comm.c) no
 * stage can wait on a stage that waits on it.
 *
 * The last stage weights micro-batch m's mean loss by rows_m / B, so the
 * gradients accumulated over the micro-batches are those of the batch's
 * mean loss; the replicas' average then makes them the global batch's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/time.h"
#include "base/timeline.h"
#include "ddp/pipeline_internal.h"

/* Rows of micro-batch m of a batch of B rows, and its first row: the
 * first B % M micro-batches get one row more (torch.tensor_split). */
static int64_t mb_rows(int64_t B, int M, int m, int64_t *first)
{
    int64_t q = B / M, r = B % M;
    *first = m * q + (m < r ? m : r);
    return q + (m < r);
}

/* The stage's actions in order: m for F(m), -(m + 1) for B(m). */
static void schedule_actions(const ddp_pipeline_t *pp, int *acts)
{
    int M = pp->M, n = 0;
    if (pp->opt.schedule == DDP_SCHEDULE_GPIPE) {
        for (int m = 0; m < M; m++)
            acts[n++] = m;
        for (int m = 0; m < M; m++)
            acts[n++] = -(m + 1);
        return;
    }
    int w = pp->S - 1 - pp->stage < M ? pp->S - 1 - pp->stage : M;
    for (int m = 0; m < w; m++)
        acts[n++] = m;
    for (int i = 0; i < M - w; i++) {
        acts[n++] = w + i;
        acts[n++] = -(i + 1);
    }
    for (int i = M - w; i < M; i++)
        acts[n++] = -(i + 1);
}

static int ensure_floats(float **buf, size_t *cap, size_t n)
{
    if (*cap >= n)
        return 0;
    float *p = realloc(*buf, n * sizeof *p);
    DDP_FAIL_IF(!p, DDP_ERR_NOMEM, "out of memory (%zu floats)", n);
    *buf = p;
    *cap = n;
    return 0;
}

/* The slot's input: stage 0's rows of the caller's input, else the
 * activation received from the previous stage. */
static int take_input(ddp_pipeline_t *pp, ddp__pp_slot *s, const ddp_tensor *input, int64_t first)
{
    int64_t shape[DDP_TENSOR_MAX_DIM];
    if (pp->stage == 0) {
        int64_t per = input->numel / input->shape[0];
        memcpy(shape, input->shape, sizeof shape);
        shape[0] = s->rows;
        return ddp_tensor_wrap(&s->in_t, input->data + first * per, input->ndim, shape);
    }
    shape[0] = s->rows;
    memcpy(shape + 1, pp->opt.input_shape, (size_t)pp->opt.input_ndim * sizeof *shape);
    DDP_TRY(ensure_floats(&s->in_buf, &s->in_cap, (size_t)(s->rows * pp->in_numel)));
    DDP_TRY(ddp_tensor_wrap(&s->in_t, s->in_buf, pp->opt.input_ndim + 1, shape));
    return ddp__pp_recv(pp, DDP__PP_ACT, s->mb, &s->in_t, s->in_buf);
}

static int default_loss(ddp_tape_t *tape, ddp_var_t *out, const int64_t *labels, int64_t rows,
                        ddp_var_t **loss, void *user)
{
    (void)rows;
    (void)user;
    return ddp_op_cross_entropy(tape, out, labels, loss);
}

/* F(m): forward of micro-batch m on its slot; the last stage adds the
 * weighted loss to *loss_sum. */
static int forward_mb(ddp_pipeline_t *pp, int m, const ddp_tensor *input, const int64_t *labels,
                      int64_t B, double *loss_sum)
{
    ddp__pp_slot *s = &pp->slots[m % pp->nslots];
    DDP_TRY(ddp__pp_wait_sends(pp, s)); /* its sends read the tape that we reset */
    ddp_tape_reset(s->tape);
    s->mb = m;
    int64_t first = 0;
    s->rows = mb_rows(B, pp->M, m, &first);
    DDP_TRY(take_input(pp, s, input, first));
    double t0 = ddp_time_now();
    uint64_t tl = ddp__tl_begin(); /* the stage's timeline shows its busy spans */
    DDP_TRY(ddp_tape_input(s->tape, &s->in_t, pp->stage > 0, &s->x));
    DDP_TRY(ddp_model_forward(pp->model, s->tape, s->x, &s->y));
    if (pp->next_rank < 0) {
        ddp_pipeline_loss_fn fn = pp->opt.loss ? pp->opt.loss : default_loss;
        ddp_var_t *l = NULL;
        DDP_TRY(fn(s->tape, s->y, labels ? labels + first : NULL, s->rows, &l, pp->opt.loss_user));
        DDP_TRY(ddp_op_scale(s->tape, l, (float)((double)s->rows / (double)B), &s->loss));
        *loss_sum += (double)ddp_var_item(s->loss);
    }
    pp->busy_s += ddp_time_now() - t0;
    ddp__tl_end(tl, "pipeline forward", "micro_batch", m);
    if (pp->next_rank >= 0)
        DDP_TRY(ddp__pp_send(pp, s, DDP__PP_ACT, ddp_var_tensor(s->y)));
    return 0;
}

/* B(m): backward of micro-batch m, from its loss or from the gradient the
 * next stage sends; then the input's gradient goes to the previous stage. */
static int backward_mb(ddp_pipeline_t *pp, int m)
{
    ddp__pp_slot *s = &pp->slots[m % pp->nslots];
    if (pp->next_rank >= 0) {
        const ddp_tensor *yt = ddp_var_tensor(s->y);
        DDP_TRY(ensure_floats(&pp->dy, &pp->dy_cap, (size_t)yt->numel));
        DDP_TRY(ddp__pp_recv(pp, DDP__PP_GRAD, m, yt, pp->dy));
    }
    double t0 = ddp_time_now();
    uint64_t tl = ddp__tl_begin();
    if (pp->next_rank < 0)
        DDP_TRY(ddp_tape_backward(s->tape, s->loss, pp->model));
    else
        DDP_TRY(ddp_tape_backward_grad(s->tape, s->y, pp->dy, pp->model));
    pp->busy_s += ddp_time_now() - t0;
    ddp__tl_end(tl, "pipeline backward", "micro_batch", m);
    if (pp->prev_rank < 0)
        return 0;
    ddp_tensor gx;
    const ddp_tensor *xt = ddp_var_tensor(s->x);
    DDP_TRY(ddp_tensor_wrap(&gx, (float *)ddp_var_grad(s->x), xt->ndim, xt->shape));
    return ddp__pp_send(pp, s, DDP__PP_GRAD, &gx);
}

/* DDP across replicas, once the last backward is done: the stage's
 * gradients averaged over its replicas.  The last stage finishes first and
 * reduces while the earlier stages still run their last backwards. */
static int average_grads(ddp_pipeline_t *pp)
{
    if (!pp->replicas)
        return 0;
    size_t n = 0, np = ddp_model_num_params(pp->model);
    float *block = ddp_model_grad_block(pp->model, &n);
    int whole = 1;
    for (size_t i = 0; i < np && whole; i++) {
        ddp_param *p = ddp_model_param(pp->model, i);
        whole = p->grad == block + p->offset;
    }
    int rc = 0;
    if (whole && n > 0)
        rc = ddp_pg_all_reduce(pp->replicas, block, n, DDP_FLOAT32, DDP_AVG);
    for (size_t i = 0; !whole && i < np && rc == 0; i++) { /* gradients re-pointed */
        ddp_param *p = ddp_model_param(pp->model, i);
        rc = ddp_pg_all_reduce(pp->replicas, p->grad, p->numel, DDP_FLOAT32, DDP_AVG);
    }
    if (rc < 0) {
        /* the group's message numbers its ranks 0 .. R-1: say who they are */
        char who[256] = "";
        size_t len = 0;
        for (int r = 0; r < pp->R && len + 16 < sizeof who; r++)
            len += (size_t)snprintf(who + len, sizeof who - len, "%s%d", r ? ", " : "",
                                    r * pp->S + pp->stage);
        ddp__error_context(rc, "pipeline stage %d (rank %d): averaging its gradients over the "
                           "%d replicas of the stage (world ranks %s)", pp->stage, pp->rank,
                           pp->R, who);
    }
    return rc;
}

static int check_step(const ddp_pipeline_t *pp, const ddp_tensor *input, const int64_t *labels,
                      int64_t B)
{
    DDP_FAIL_IF(pp->failed, DDP_ERR_STATE, "pipeline stage %d: an earlier step failed; the "
                "stages are out of step (destroy the pipeline)", pp->stage);
    DDP_FAIL_IF(B < pp->M, DDP_ERR_INVALID_ARG, "pipeline stage %d: batch of %lld rows cannot "
                "make %d micro-batches", pp->stage, (long long)B, pp->M);
    DDP_FAIL_IF(pp->next_rank < 0 && !labels && !pp->opt.loss, DDP_ERR_INVALID_ARG,
                "pipeline stage %d (the last): NULL labels", pp->stage);
    if (pp->stage > 0)
        return 0;
    DDP_FAIL_IF(!input || input->ndim < 1, DDP_ERR_INVALID_ARG,
                "pipeline stage 0: no input tensor");
    char got[96];
    DDP_FAIL_IF(input->shape[0] != B, DDP_ERR_INVALID_ARG,
                "pipeline stage 0: input %s does not have the batch's %lld rows",
                ddp_tensor_shape_str(input, got, sizeof got), (long long)B);
    int same = pp->opt.input_ndim == 0 || input->ndim == pp->opt.input_ndim + 1;
    for (int i = 0; same && pp->opt.input_ndim && i < pp->opt.input_ndim; i++)
        same = input->shape[i + 1] == pp->opt.input_shape[i];
    DDP_FAIL_IF(!same, DDP_ERR_INVALID_ARG, "pipeline stage 0: input %s does not match the "
                "stage's input_shape", ddp_tensor_shape_str(input, got, sizeof got));
    return 0;
}

int ddp_pipeline_step(ddp_pipeline_t *pp, const ddp_tensor *input, const int64_t *labels,
                      int64_t batch, float *loss)
{
    DDP_FAIL_IF(!pp, DDP_ERR_INVALID_ARG, "ddp_pipeline_step: NULL pipeline");
    if (loss)
        *loss = NAN;
    DDP_TRY(check_step(pp, input, labels, batch));
    int *acts = malloc(2 * (size_t)pp->M * sizeof *acts);
    DDP_FAIL_IF(!acts, DDP_ERR_NOMEM, "out of memory");
    schedule_actions(pp, acts);
    double loss_sum = 0;
    int rc = 0;
    for (int i = 0; i < 2 * pp->M && rc == 0; i++)
        rc = acts[i] >= 0 ? forward_mb(pp, acts[i], input, labels, batch, &loss_sum)
                          : backward_mb(pp, -acts[i] - 1);
    free(acts);
    if (rc == 0)
        rc = average_grads(pp);
    if (rc < 0) {
        ddp__error_context(rc, "ddp_pipeline_step %lld", (long long)pp->step);
        ddp__pp_abort(pp, rc);
        return rc;
    }
    pp->step++;
    if (loss && pp->next_rank < 0)
        *loss = (float)loss_sum;
    return 0;
}

/* Evaluation: the whole batch as micro-batch 0 on slot 0, without grad. */
static int eval_forward(ddp_pipeline_t *pp, const ddp_tensor *input, int64_t batch,
                        ddp_tensor *out)
{
    ddp__pp_slot *s = &pp->slots[0];
    DDP_TRY(ddp__pp_wait_sends(pp, s));
    ddp_tape_reset(s->tape);
    s->mb = 0;
    s->rows = batch;
    DDP_TRY(take_input(pp, s, input, 0));
    DDP_TRY(ddp_tape_input(s->tape, &s->in_t, 0, &s->x));
    DDP_TRY(ddp_model_forward(pp->model, s->tape, s->x, &s->y));
    const ddp_tensor *yt = ddp_var_tensor(s->y);
    if (pp->next_rank >= 0)
        return ddp__pp_send(pp, s, DDP__PP_ACT, yt);
    DDP_TRY(ddp_tensor_init(out, yt->ndim, yt->shape));
    memcpy(out->data, yt->data, (size_t)yt->numel * sizeof *yt->data);
    return 0;
}

int ddp_pipeline_forward(ddp_pipeline_t *pp, const ddp_tensor *input, int64_t batch,
                         ddp_tensor *out)
{
    DDP_FAIL_IF(!pp || !out, DDP_ERR_INVALID_ARG, "ddp_pipeline_forward: NULL argument");
    memset(out, 0, sizeof *out);
    DDP_FAIL_IF(batch < 1, DDP_ERR_INVALID_ARG, "pipeline stage %d: batch of %lld rows",
                pp->stage, (long long)batch);
    DDP_FAIL_IF(pp->failed, DDP_ERR_STATE, "pipeline stage %d: an earlier step failed; the "
                "stages are out of step (destroy the pipeline)", pp->stage);
    DDP_FAIL_IF(pp->stage == 0 && (!input || input->ndim < 1 || input->shape[0] != batch),
                DDP_ERR_INVALID_ARG, "pipeline stage 0: input does not have %lld rows",
                (long long)batch);
    ddp_tape_set_grad_enabled(pp->slots[0].tape, 0);
    int rc = eval_forward(pp, input, batch, out);
    ddp_tape_set_grad_enabled(pp->slots[0].tape, 1);
    if (rc < 0) {
        ddp__error_context(rc, "ddp_pipeline_forward (step %lld)", (long long)pp->step);
        ddp__pp_abort(pp, rc);
        return rc;
    }
    pp->step++;
    return 0;
}
