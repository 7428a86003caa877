/* The autograd tape: a per-tape arena reused across iterations, leaf vars
 * for inputs and parameters, and the backward driver that fires the
 * grad-ready hooks.  See include/ddp/nn.h (contract) and docs/autograd.md. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/timeline.h"
#include "nn/autograd.h"
#include "tensor/kernels.h"
#include "tensor/shape.h"
#include "ddp/ext.h"

#define ARENA_ALIGN 64

/* Tape generations are unique process-wide so that a parameter's cached leaf
 * var (tape pointer, generation) can never match a later tape that happens to
 * reuse a freed tape's address.  Only an id source, not shared state. */
static _Atomic uint64_t next_gen = 1;

/* ==== arena =============================================================== */

void *ddp__tape_alloc(ddp_tape_t *tape, size_t bytes)
{
    size_t need = (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
    if (need == 0)
        need = ARENA_ALIGN;
    if (tape->used + need <= tape->cap) {
        void *p = tape->arena + tape->used;
        tape->used += need;
        return p;
    }
    /* Overflow: take a separate chunk for now; reset folds the total into one
     * arena, so a steady-state iteration never gets here. */
    if (tape->nspill == tape->spill_cap) {
        size_t ncap = tape->spill_cap ? 2 * tape->spill_cap : 16;
        char **s = realloc(tape->spill, ncap * sizeof *s);
        if (!s) {
            DDP_ERROR(DDP_ERR_NOMEM, "tape arena: cannot grow the spill list");
            return NULL;
        }
        tape->spill = s;
        tape->spill_cap = ncap;
    }
    char *p = ddp__alloc_aligned(need);
    if (!p) {
        DDP_ERROR(DDP_ERR_NOMEM, "tape arena: cannot allocate %zu bytes", need);
        return NULL;
    }
    tape->spill[tape->nspill++] = p;
    tape->spill_bytes += need;
    return p;
}

int ddp_tape_create(ddp_tape_t **out)
{
    DDP_FAIL_IF(!out, DDP_ERR_INVALID_ARG, "tape: out is NULL");
    ddp_tape_t *t = calloc(1, sizeof *t);
    DDP_FAIL_IF(!t, DDP_ERR_NOMEM, "tape: out of memory");
    t->gen = atomic_fetch_add(&next_gen, 1);
    t->grad_enabled = 1;
    *out = t;
    return 0;
}

static void free_spill(ddp_tape_t *tape)
{
    for (size_t i = 0; i < tape->nspill; i++)
        ddp__free_aligned(tape->spill[i]);
    tape->nspill = 0;
    tape->spill_bytes = 0;
}

void ddp_tape_reset(ddp_tape_t *tape)
{
    if (!tape)
        return;
    if (tape->nspill) {
        size_t want = tape->used + tape->spill_bytes;
        free_spill(tape);
        char *a = ddp__alloc_aligned(want);
        if (a) { /* on failure keep the old arena; the next step spills again */
            ddp__free_aligned(tape->arena);
            tape->arena = a;
            tape->cap = want;
        }
    }
    tape->used = 0;
    tape->nvars = 0;
    tape->backward_ran = 0;
    tape->gen = atomic_fetch_add(&next_gen, 1);
}

void ddp_tape_destroy(ddp_tape_t *tape)
{
    if (!tape)
        return;
    free_spill(tape);
    free(tape->spill);
    ddp__free_aligned(tape->arena);
    free(tape->vars);
    free(tape);
}

void ddp_tape_set_grad_enabled(ddp_tape_t *tape, int enabled)
{
    if (tape)
        tape->grad_enabled = enabled ? 1 : 0;
}

size_t ddp_tape_arena_bytes(const ddp_tape_t *tape)
{
    return tape ? tape->cap + tape->spill_bytes : 0;
}

/* ==== vars ================================================================ */

int ddp__tape_push(ddp_tape_t *tape, const ddp__op_def *def, int ndim, const int64_t *shape,
                   int alloc_data, ddp_var_t **out)
{
    /* A forgotten reset would keep every iteration's vars (and the arena
     * would spill more each step): once backward has run, the tape is done
     * until ddp_tape_reset.  Backward itself may run again (nn.h). */
    DDP_FAIL_IF(tape->backward_ran, DDP_ERR_STATE,
                "tape: a forward op on a tape whose backward already ran; call "
                "ddp_tape_reset(tape) at the start of each iteration (without it the tape "
                "keeps every iteration's vars and grows each step)");
    if (tape->nvars == tape->vars_cap) {
        size_t ncap = tape->vars_cap ? 2 * tape->vars_cap : 64;
        ddp_var_t **v = realloc(tape->vars, ncap * sizeof *v);
        DDP_FAIL_IF(!v, DDP_ERR_NOMEM, "tape: cannot grow to %zu vars", ncap);
        tape->vars = v;
        tape->vars_cap = ncap;
    }
    ddp_var_t *v = ddp__tape_alloc(tape, sizeof *v);
    if (!v)
        return DDP_ERR_NOMEM;
    memset(v, 0, sizeof *v);
    v->def = def;
    v->in = v->in_inline;
    DDP_TRY(ddp__tensor_set_shape(&v->t, ndim, shape));
    if (alloc_data) {
        v->t.data = ddp__tape_alloc(tape, (size_t)v->t.numel * sizeof(float));
        if (!v->t.data)
            return DDP_ERR_NOMEM;
    }
    v->index = tape->nvars;
    tape->vars[tape->nvars++] = v;
    *out = v;
    return 0;
}

int ddp_tape_input(ddp_tape_t *tape, const ddp_tensor *t, int requires_grad, ddp_var_t **out)
{
    DDP_FAIL_IF(!tape || !t || !out, DDP_ERR_INVALID_ARG, "tape input: NULL argument");
    DDP_FAIL_IF(!t->data, DDP_ERR_INVALID_ARG, "tape input: tensor has no data");
    ddp_var_t *v;
    DDP_TRY(ddp__tape_push(tape, NULL, t->ndim, t->shape, 0, &v));
    v->t.data = t->data;
    v->requires_grad = requires_grad ? 1 : 0;
    *out = v;
    return 0;
}

int ddp_tape_param(ddp_tape_t *tape, ddp_param *p, ddp_var_t **out)
{
    DDP_FAIL_IF(!tape || !p || !out, DDP_ERR_INVALID_ARG, "tape param: NULL argument");
    if (p->priv.tape == tape && p->priv.tape_gen == tape->gen && p->priv.var) {
        *out = p->priv.var;
        return 0;
    }
    ddp_var_t *v;
    DDP_TRY(ddp__tape_push(tape, NULL, p->ndim, p->shape, 0, &v));
    v->t.data = p->data;
    v->requires_grad = 1;
    v->param = p;
    p->priv.tape = tape;
    p->priv.tape_gen = tape->gen;
    p->priv.var = v;
    *out = v;
    return 0;
}

const ddp_tensor *ddp_var_tensor(const ddp_var_t *v) { return v ? &v->t : NULL; }

const float *ddp_var_grad(const ddp_var_t *v)
{
    if (!v)
        return NULL;
    return v->param ? v->param->grad : v->grad;
}

float ddp_var_item(const ddp_var_t *v) { return v && v->t.data ? v->t.data[0] : 0.0f; }

float *ddp__grad_target(ddp_tape_t *tape, ddp_var_t *v, int *acc)
{
    if (v->param) {
        *acc = 1; /* parameters accumulate across backward calls */
        ddp_param *p = v->param;
        if (tape->bw_write && p->priv.model == tape->bw_model &&
            p->priv.write_pass != tape->bw_pass) {
            p->priv.write_pass = tape->bw_pass; /* once per pass (ext.h rule 8) */
            float *g = p->grad;
            int rc = tape->bw_write(p, &g, tape->bw_write_user);
            if (rc < 0 || !g) {
                tape->grad_target_rc = rc < 0 ? rc
                                              : DDP_ERROR(DDP_ERR_STATE, "grad-write hook of %s "
                                                          "gave no memory", p->name);
                return NULL;
            }
            p->grad = g;
        }
        return p->grad;
    }
    if (v->def && (v->def->flags & DDP__OP_VIEW)) {
        /* A view's gradient is its input's, seen through the view: writers
         * go straight there and the view's backward has nothing to copy. */
        ddp_var_t *base = v->in[0];
        float *g = ddp__grad_target(tape, base, acc);
        if (!g)
            return NULL;
        if (!*acc && v->t.numel != base->t.numel) {
            /* A view of part of its input (narrow): the rest of the input's
             * fresh gradient gets no write from here, so it starts at 0. */
            memset(g, 0, (size_t)base->t.numel * sizeof *g);
            *acc = 1;
        }
        v->grad = g + v->view_offset;
        v->grad_written = 1;
        return v->grad;
    }
    if (!v->grad) {
        v->grad = ddp__tape_alloc(tape, (size_t)v->t.numel * sizeof(float));
        if (!v->grad) {
            tape->grad_target_rc = DDP_ERR_NOMEM;
            return NULL;
        }
    }
    *acc = v->grad_written;
    v->grad_written = 1;
    return v->grad;
}

/* ==== backward ============================================================ */

int ddp__tape_has(const ddp_tape_t *tape, const ddp_var_t *v)
{
    /* Compare pointers only: a var from before a reset may point into freed
     * memory.  Scans from the end, where an op's inputs usually are. */
    for (size_t i = tape->nvars; v && i-- > 0;)
        if (tape->vars[i] == v)
            return 1;
    return 0;
}

/* One more reachable use of p in backward pass `pass` (the first resets). */
static void count_use(ddp_param *p, uint64_t pass, int uses)
{
    if (p->priv.used_pass != pass) {
        p->priv.used_pass = pass;
        p->priv.pending = 0;
    }
    p->priv.pending += uses;
}

int ddp__tape_release(ddp_tape_t *tape, ddp_var_t *v, int j)
{
    if (v->released & (UINT64_C(1) << j))
        return 0;
    v->released |= UINT64_C(1) << j;
    ddp_param *p = v->in[j]->param;
    if (p && --p->priv.pending == 0 && tape->bw_hook && p->priv.model == tape->bw_model)
        return tape->bw_hook(p, 1, tape->bw_user);
    return 0;
}

static int backward_run(ddp_tape_t *tape, ddp_var_t *loss, const float *dy, ddp_model_t *model);

static int backward_entry(ddp_tape_t *tape, ddp_var_t *y, const float *dy, ddp_model_t *model)
{
    uint64_t t0 = ddp__tl_begin();
    int rc = backward_run(tape, y, dy, model);
    ddp__tl_end(t0, "autograd backward", NULL, 0);
    if (rc == 0)
        tape->backward_ran = 1;
    tape->bw_model = NULL;
    tape->bw_hook = NULL;
    tape->bw_user = NULL;
    tape->bw_write = NULL;
    tape->bw_write_user = NULL;
    return rc;
}

int ddp_tape_backward(ddp_tape_t *tape, ddp_var_t *loss, ddp_model_t *model)
{
    DDP_FAIL_IF(!tape || !loss, DDP_ERR_INVALID_ARG, "backward: NULL tape or loss");
    return backward_entry(tape, loss, NULL, model);
}

int ddp_tape_backward_grad(ddp_tape_t *tape, ddp_var_t *y, const float *dy, ddp_model_t *model)
{
    DDP_FAIL_IF(!tape || !y || !dy, DDP_ERR_INVALID_ARG, "backward: NULL tape, output or gradient");
    return backward_entry(tape, y, dy, model);
}

/* dy NULL: loss is a scalar seeded with 1; else the upstream gradient. */
static int backward_run(ddp_tape_t *tape, ddp_var_t *loss, const float *dy, ddp_model_t *model)
{
    DDP_FAIL_IF(!ddp__tape_has(tape, loss), DDP_ERR_INVALID_ARG,
                "backward: the %s var is not on this tape (was the tape reset?)",
                dy ? "output" : "loss");
    char buf[64];
    DDP_FAIL_IF(!dy && loss->t.numel != 1, DDP_ERR_INVALID_ARG,
                "backward: the loss must have one element, not shape %s (give its gradient "
                "with ddp_tape_backward_grad)",
                ddp_tensor_shape_str(&loss->t, buf, sizeof buf));
    DDP_FAIL_IF(!loss->requires_grad, DDP_ERR_INVALID_ARG,
                "backward: the %s does not depend on any parameter or input that "
                "requires grad", dy ? "output" : "loss");
    ddp_grad_ready_fn hook = NULL;
    void *user = NULL;
    if (model) {
        DDP_TRY(ddp_model_seal(model));
        hook = ddp_model_grad_ready_hook(model, &user);
        tape->bw_write = ddp_model_grad_write_hook(model, &tape->bw_write_user);
    }
    tape->bw_model = model;
    tape->bw_hook = hook;
    tape->bw_user = user;

    /* Phase 1: which vars lie on a path to the loss (tape order is
     * topological: inputs come first), and how many reachable uses each
     * parameter has, over all its leaf vars should a tape hold two; the
     * parameters reached are stamped with this pass's id. */
    for (size_t i = 0; i < tape->nvars; i++) {
        ddp_var_t *v = tape->vars[i];
        v->reachable = 0;
        v->grad_written = 0;
        v->released = 0;
    }
    uint64_t pass = atomic_fetch_add(&next_gen, 1);
    tape->bw_pass = pass;
    loss->reachable = 1;
    if (loss->param)
        count_use(loss->param, pass, 0);
    for (size_t i = loss->index + 1; i-- > 0;) {
        ddp_var_t *v = tape->vars[i];
        if (!v->reachable)
            continue;
        for (int j = 0; j < v->nin; j++) {
            ddp_var_t *in = v->in[j];
            if (in->requires_grad) {
                in->reachable = 1;
                if (in->param)
                    count_use(in->param, pass, 1);
            }
        }
    }

    /* Phase 2: parameters the loss does not use are ready at once. */
    size_t np = model ? ddp_model_num_params(model) : 0;
    for (size_t i = 0; hook && i < np; i++) {
        ddp_param *p = ddp_model_param(model, i);
        if (p->priv.used_pass != pass)
            DDP_TRY(hook(p, 0, user));
    }

    /* Phase 3: seed d(loss)/d(loss) = 1 (or dy) and walk the tape backwards; a
     * parameter is final when its last reachable consumer has run. */
    int acc;
    float *g = ddp__grad_target(tape, loss, &acc);
    if (!g)
        return tape->grad_target_rc;
    if (dy)
        ddp__vec_acc_to(g, dy, (size_t)loss->t.numel, acc);
    else
        ddp__vec_fill_to(g, 1.0f, 1, acc);
    if (loss->param && hook && loss->param->priv.model == model)
        DDP_TRY(hook(loss->param, 1, user));
    for (size_t i = loss->index + 1; i-- > 0;) {
        ddp_var_t *v = tape->vars[i];
        if (!v->reachable || !v->def)
            continue;
        if (v->grad_written && v->def->backward)
            DDP_TRY(v->def->backward(tape, v));
        for (int j = v->nin - 1; j >= 0; j--) /* reverse argument order */
            DDP_TRY(ddp__tape_release(tape, v, j));
    }
    return 0;
}
