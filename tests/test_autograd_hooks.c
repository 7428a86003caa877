/* A hand-written model with a residual connection, a shared weight and an
 * unused parameter: gradients against finite differences of a float64
 * reference, and the grad-ready contract DDP relies on (once per parameter,
 * only when final, in order, unused ones first), gradient re-pointing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "ddp.h"
#include "ddp/ext.h"
#include "gradcheck.h"

#define B 4
#define IN 4
#define H 5
#define OUT 3

typedef struct net {
    ddp_model_t *m;
    ddp_param *w1, *b1, *w2, *b2, *w3, *u;
    float x[B * IN];
    int64_t labels[B];
} net;

static void net_init(net *n)
{
    assert_int_equal(ddp_model_create(&n->m), 0);
    assert_int_equal(ddp_model_add_param(n->m, "w1", 2, (int64_t[]){H, IN}, &n->w1), 0);
    assert_int_equal(ddp_model_add_param(n->m, "b1", 1, (int64_t[]){H}, &n->b1), 0);
    assert_int_equal(ddp_model_add_param(n->m, "w2", 2, (int64_t[]){H, H}, &n->w2), 0);
    assert_int_equal(ddp_model_add_param(n->m, "b2", 1, (int64_t[]){H}, &n->b2), 0);
    assert_int_equal(ddp_model_add_param(n->m, "w3", 2, (int64_t[]){OUT, H}, &n->w3), 0);
    assert_int_equal(ddp_model_add_param(n->m, "unused", 2, (int64_t[]){3, IN}, &n->u), 0);
    assert_int_equal(ddp_model_seal(n->m), 0);
    ddp__rng rng;
    ddp__rng_seed(&rng, 3);
    for (size_t i = 0; i < ddp_model_num_params(n->m); i++) {
        ddp_param *p = ddp_model_param(n->m, i);
        gc_fill(p->data, p->numel, &rng);
    }
    gc_fill(n->x, B * IN, &rng);
    for (int i = 0; i < B; i++)
        n->labels[i] = (i * 2 + 1) % OUT;
}

/* h = relu(x W1^T + b1); r = h + (h W2^T + b2); s = relu(r W2^T + b2);
 * out = s W3^T; loss = CE(out); plus a dead branch x U^T off the loss. */
static int net_forward(net *n, ddp_tape_t *t, ddp_var_t **loss)
{
    ddp_tensor xt;
    ddp_var_t *x, *w1, *b1, *w2, *b2, *w3, *u, *a, *h, *c, *r, *d, *s, *out, *dead;
    DDP_TRY(ddp_tensor_wrap(&xt, n->x, 2, (int64_t[]){B, IN}));
    DDP_TRY(ddp_tape_input(t, &xt, 0, &x));
    DDP_TRY(ddp_tape_param(t, n->w1, &w1));
    DDP_TRY(ddp_tape_param(t, n->b1, &b1));
    DDP_TRY(ddp_tape_param(t, n->w2, &w2));
    DDP_TRY(ddp_tape_param(t, n->b2, &b2));
    DDP_TRY(ddp_tape_param(t, n->w3, &w3));
    DDP_TRY(ddp_tape_param(t, n->u, &u));
    DDP_TRY(ddp_op_linear(t, x, w1, b1, &a));
    DDP_TRY(ddp_op_relu(t, a, &h));
    DDP_TRY(ddp_op_linear(t, h, w2, b2, &c));
    DDP_TRY(ddp_op_add(t, h, c, &r));
    DDP_TRY(ddp_op_linear(t, x, u, NULL, &dead));
    DDP_TRY(ddp_op_linear(t, r, w2, b2, &d));
    DDP_TRY(ddp_op_relu(t, d, &s));
    DDP_TRY(ddp_op_linear(t, s, w3, NULL, &out));
    return ddp_op_cross_entropy(t, out, n->labels, loss);
}

/* x: w1, b1, w2, b2, w3, unused (registration order) */
static double net_ref(double *const *p, void *ctx)
{
    net *n = ctx;
    double xd[B * IN], h[B * H], c[B * H], r[B * H], s[B * H], out[B * OUT], loss = 0;
    for (int i = 0; i < B * IN; i++)
        xd[i] = n->x[i];
    gc_linear(h, xd, p[0], p[1], B, IN, H);
    for (int i = 0; i < B * H; i++)
        h[i] = fmax(h[i], 0);
    gc_linear(c, h, p[2], p[3], B, H, H);
    for (int i = 0; i < B * H; i++)
        r[i] = h[i] + c[i];
    gc_linear(s, r, p[2], p[3], B, H, H);
    for (int i = 0; i < B * H; i++)
        s[i] = fmax(s[i], 0);
    gc_linear(out, s, p[4], NULL, B, H, OUT);
    for (int b = 0; b < B; b++) {
        double mx = out[b * OUT], z = 0;
        for (int j = 1; j < OUT; j++)
            mx = fmax(mx, out[b * OUT + j]);
        for (int j = 0; j < OUT; j++)
            z += exp(out[b * OUT + j] - mx);
        loss += mx + log(z) - out[b * OUT + n->labels[b]];
    }
    return loss / B;
}

static void test_residual_shared_gradcheck(void **state)
{
    (void)state;
    net n;
    net_init(&n);
    ddp_tape_t *t;
    ddp_var_t *loss;
    assert_int_equal(ddp_tape_create(&t), 0);
    ddp_model_zero_grad(n.m);
    assert_int_equal(net_forward(&n, t, &loss), 0);
    assert_int_equal(ddp_tape_backward(t, loss, n.m), 0);
    float *vals[6];
    const float *grads[6];
    size_t lens[6];
    double *pd[6];
    for (int i = 0; i < 6; i++) {
        ddp_param *p = ddp_model_param(n.m, (size_t)i);
        vals[i] = p->data;
        grads[i] = p->grad;
        lens[i] = p->numel;
        pd[i] = malloc(p->numel * sizeof(double));
        for (size_t j = 0; j < p->numel; j++)
            pd[i][j] = p->data[j];
    }
    assert_true(fabs(ddp_var_item(loss) - net_ref(pd, &n)) < 1e-5);
    double err = gc_check(6, vals, grads, lens, net_ref, &n);
    if (err > GC_TOL)
        fail_msg("residual/shared model: gradient relative error %.3g", err);
    for (size_t j = 0; j < n.u->numel; j++)
        assert_true(n.u->grad[j] == 0.0f);
    for (int i = 0; i < 6; i++)
        free(pd[i]);
    ddp_tape_destroy(t);
    ddp_model_destroy(n.m);
}

/* ==== grad-ready hooks ==================================================== */

#define MAX_EVENTS 32

typedef struct events {
    int n;
    int index[MAX_EVENTS], used[MAX_EVENTS];
    float *snap[MAX_EVENTS];
    int fail_on;      /* parameter index whose hook fails, or -1 */
} events;

static int record(ddp_param *p, int used, void *user)
{
    events *e = user;
    if (p->index == e->fail_on)
        return DDP_ERROR(DDP_ERR_PEER, "allreduce of bucket for %s failed", p->name);
    assert_true(e->n < MAX_EVENTS);
    e->index[e->n] = p->index;
    e->used[e->n] = used;
    e->snap[e->n] = malloc(p->numel * sizeof(float));
    memcpy(e->snap[e->n], p->grad, p->numel * sizeof(float));
    e->n++;
    return 0;
}

static void events_clear(events *e)
{
    for (int i = 0; i < e->n; i++)
        free(e->snap[i]);
    e->n = 0;
}

static void test_hooks_contract(void **state)
{
    (void)state;
    net n;
    net_init(&n);
    events ev = {.fail_on = -1};
    ddp_model_set_grad_ready_hook(n.m, record, &ev);
    void *user;
    assert_ptr_equal(ddp_model_grad_ready_hook(n.m, &user), record);
    assert_ptr_equal(user, &ev);
    ddp_tape_t *t;
    ddp_var_t *loss;
    assert_int_equal(ddp_tape_create(&t), 0);
    for (int round = 0; round < 2; round++) { /* second round: accumulate (no_sync) */
        ddp_tape_reset(t);
        assert_int_equal(net_forward(&n, t, &loss), 0);
        assert_int_equal(ddp_tape_backward(t, loss, n.m), 0);
        /* unused first (used = 0), then w3; b2, w2 only after their last use
         * (the earlier linear); then b1, w1 */
        int expect_index[] = {5, 4, 3, 2, 1, 0};
        int expect_used[] = {0, 1, 1, 1, 1, 1};
        assert_int_equal(ev.n, 6);
        for (int i = 0; i < 6; i++) {
            assert_int_equal(ev.index[i], expect_index[i]);
            assert_int_equal(ev.used[i], expect_used[i]);
            ddp_param *p = ddp_model_param(n.m, (size_t)ev.index[i]);
            /* the gradient seen by the hook is the final one */
            assert_memory_equal(ev.snap[i], p->grad, p->numel * sizeof(float));
        }
        events_clear(&ev);
    }
    /* the loss of an older tape, after another forward on a second tape:
     * still each parameter once, used as on the older tape */
    ddp_tape_t *t2;
    ddp_var_t *loss2;
    assert_int_equal(ddp_tape_create(&t2), 0);
    ddp_tape_reset(t);
    assert_int_equal(net_forward(&n, t, &loss), 0);
    assert_int_equal(net_forward(&n, t2, &loss2), 0);
    assert_int_equal(ddp_tape_backward(t, loss, n.m), 0);
    assert_int_equal(ev.n, 6);
    for (int i = 0; i < 6; i++)
        assert_int_equal(ev.used[i], ev.index[i] != 5);
    events_clear(&ev);
    /* two leaf vars of one parameter on one tape (a second tape took the
     * leaf cache in between): the hook still waits for both uses */
    ddp_var_t *x, *wa, *wb, *ya, *yb, *s, *sa, *sb;
    ddp_tensor xt;
    ddp_tape_reset(t);
    assert_int_equal(ddp_tensor_wrap(&xt, n.x, 2, (int64_t[]){B, IN}), 0);
    assert_int_equal(ddp_tape_input(t, &xt, 0, &x), 0);
    assert_int_equal(ddp_tape_param(t, n.w1, &wa), 0);
    ddp_tape_reset(t2);
    assert_int_equal(ddp_tape_param(t2, n.w1, &wb), 0);
    assert_int_equal(ddp_tape_param(t, n.w1, &wb), 0);
    assert_true(wa != wb);
    assert_int_equal(ddp_op_linear(t, x, wb, NULL, &yb), 0);
    assert_int_equal(ddp_op_linear(t, x, wa, NULL, &ya), 0);
    assert_int_equal(ddp_op_sum(t, ya, &sa), 0);
    assert_int_equal(ddp_op_sum(t, yb, &sb), 0);
    assert_int_equal(ddp_op_add(t, sa, sb, &s), 0);
    ddp_model_zero_grad(n.m);
    assert_int_equal(ddp_tape_backward(t, s, n.m), 0);
    assert_int_equal(ev.n, 6);
    assert_int_equal(ev.index[5], 0);
    assert_int_equal(ev.used[5], 1);
    assert_memory_equal(ev.snap[5], n.w1->grad, n.w1->numel * sizeof(float));
    for (size_t j = 0; j < n.w1->numel; j++) /* d/dW sum(x W^T) twice */
        assert_true(n.w1->grad[j] != 0.0f);
    events_clear(&ev);
    ddp_tape_destroy(t2);

    /* a failing hook stops backward with its code and message */
    ev.fail_on = 2;
    ddp_tape_reset(t);
    assert_int_equal(net_forward(&n, t, &loss), 0);
    assert_int_equal(ddp_tape_backward(t, loss, n.m), DDP_ERR_PEER);
    assert_non_null(strstr(ddp_last_error(), "allreduce of bucket for w2 failed"));
    assert_int_equal(ev.n, 3); /* unused, w3, b2 */
    events_clear(&ev);
    ddp_tape_destroy(t);
    ddp_model_destroy(n.m);
}

/* Sequential MLP: PyTorch names, packed flat blocks, reverse-order hooks. */
static void test_hooks_sequential(void **state)
{
    (void)state;
    ddp_module_t *l[3], *seq;
    ddp_model_t *m;
    assert_int_equal(ddp_linear_create(IN, H, 1, 1, &l[0]), 0);
    assert_int_equal(ddp_relu_create(&l[1]), 0);
    assert_int_equal(ddp_linear_create(H, OUT, 1, 2, &l[2]), 0);
    assert_int_equal(ddp_sequential_create(l, 3, &seq), 0);
    assert_int_equal(ddp_model_from_module(seq, &m), 0);
    const char *names[] = {"0.weight", "0.bias", "2.weight", "2.bias"};
    size_t numel, off = 0;
    float *pb = ddp_model_param_block(m, &numel), *gb = ddp_model_grad_block(m, NULL);
    assert_int_equal(ddp_model_num_params(m), 4);
    for (size_t i = 0; i < 4; i++) {
        ddp_param *p = ddp_model_param(m, i);
        assert_string_equal(p->name, names[i]);
        assert_int_equal(p->offset, off);
        assert_ptr_equal(p->data, pb + off);
        assert_ptr_equal(p->grad, gb + off);
        assert_ptr_equal(ddp_model_find_param(m, names[i]), p);
        off += p->numel;
    }
    assert_int_equal(numel, (size_t)(H * IN + H + OUT * H + OUT));
    assert_null(ddp_model_find_param(m, "1.weight"));
    assert_null(ddp_model_param(m, 4));

    events ev = {.fail_on = -1};
    ddp_model_set_grad_ready_hook(m, record, &ev);
    ddp_tape_t *t;
    ddp_tensor xt;
    ddp_var_t *x, *y, *loss;
    float xs[B * IN];
    int64_t labels[B] = {0, 1, 2, 1};
    for (int i = 0; i < B * IN; i++)
        xs[i] = (float)sin(i + 1);
    assert_int_equal(ddp_tape_create(&t), 0);
    assert_int_equal(ddp_tensor_wrap(&xt, xs, 2, (int64_t[]){B, IN}), 0);
    assert_int_equal(ddp_tape_input(t, &xt, 0, &x), 0);
    assert_int_equal(ddp_model_forward(m, t, x, &y), 0);
    assert_int_equal(ddp_op_cross_entropy(t, y, labels, &loss), 0);
    assert_int_equal(ddp_tape_backward(t, loss, m), 0);
    assert_int_equal(ev.n, 4);
    int expect[] = {3, 2, 1, 0};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(ev.index[i], expect[i]);
        assert_int_equal(ev.used[i], 1);
    }
    events_clear(&ev);
    /* a parameter not on the tape at all is unused: forward only layer 0 */
    ddp_tape_reset(t);
    ddp_var_t *h, *s;
    assert_int_equal(ddp_tape_input(t, &xt, 0, &x), 0);
    assert_int_equal(ddp_module_forward(ddp_module_child(seq, 0), t, x, &h), 0);
    assert_int_equal(ddp_op_sum(t, h, &s), 0);
    assert_int_equal(ddp_tape_backward(t, s, m), 0);
    assert_int_equal(ev.n, 4);
    assert_true(ev.index[0] == 2 && ev.used[0] == 0 && ev.index[1] == 3 && ev.used[1] == 0);
    assert_true(ev.index[2] == 1 && ev.used[2] == 1 && ev.index[3] == 0 && ev.used[3] == 1);
    events_clear(&ev);
    ddp_tape_destroy(t);
    ddp_model_destroy(m);
}

/* DDP re-points gradients into its own buckets: backward accumulates there,
 * the model's own block is untouched, and pointing back copies back. */
static void test_set_grad(void **state)
{
    (void)state;
    net n;
    net_init(&n);
    ddp_tape_t *t;
    ddp_var_t *loss;
    size_t total;
    float *gb = ddp_model_grad_block(n.m, &total);
    assert_int_equal(ddp_tape_create(&t), 0);
    ddp_model_zero_grad(n.m);
    assert_int_equal(net_forward(&n, t, &loss), 0);
    assert_int_equal(ddp_tape_backward(t, loss, n.m), 0);
    float *ref = malloc(total * sizeof(float));
    memcpy(ref, gb, total * sizeof(float));

    /* one parameter into a bucket of our own: the current grad is copied */
    float bucket[H * H];
    assert_int_equal(ddp_param_set_grad(n.w2, bucket), 0);
    assert_ptr_equal(n.w2->grad, bucket);
    assert_memory_equal(bucket, ref + n.w2->offset, sizeof bucket);
    ddp_model_zero_grad(n.m);
    ddp_tape_reset(t);
    assert_int_equal(net_forward(&n, t, &loss), 0);
    assert_int_equal(ddp_tape_backward(t, loss, n.m), 0);
    assert_memory_equal(bucket, ref + n.w2->offset, sizeof bucket);
    /* the home slice was neither zeroed nor written: zero_grad and backward
     * went through p->grad */
    assert_memory_equal(gb + n.w2->offset, ref + n.w2->offset, sizeof bucket);
    memset(gb + n.w2->offset, 0, sizeof bucket);
    assert_int_equal(ddp_param_set_grad(n.w2, NULL), 0);
    assert_ptr_equal(n.w2->grad, gb + n.w2->offset);
    assert_memory_equal(gb, ref, total * sizeof(float));

    /* the whole block at once */
    float *block = calloc(total, sizeof(float));
    assert_int_equal(ddp_model_set_grad_block(n.m, block), 0);
    assert_memory_equal(block, ref, total * sizeof(float));
    ddp_tape_reset(t);
    assert_int_equal(net_forward(&n, t, &loss), 0);
    assert_int_equal(ddp_tape_backward(t, loss, n.m), 0); /* accumulates: 2x */
    for (size_t j = 0; j < total; j++)
        assert_true(fabs(block[j] - 2 * ref[j]) <= 1e-6 * (1 + fabs(ref[j])));
    assert_int_equal(ddp_model_set_grad_block(n.m, NULL), 0);
    assert_memory_equal(gb, block, total * sizeof(float));

    ddp_param orphan;
    memset(&orphan, 0, sizeof orphan);
    assert_int_equal(ddp_param_set_grad(&orphan, bucket), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "not in a sealed model"));
    free(block);
    free(ref);
    ddp_tape_destroy(t);
    ddp_model_destroy(n.m);
}

/* Random graphs over a pool of parameters (each used zero, one or several
 * times, some only off the loss's path): every parameter is reported once,
 * unused ones first and exactly those the loss does not depend on (computed
 * here independently, as bit masks), used ones with their final gradient. */
static void test_hooks_random_graphs(void **state)
{
    (void)state;
    enum { D = 4, NB = 3, NP = 8, NOPS = 14, GRAPHS = 200 };
    ddp_model_t *m;
    ddp_param *ps[NP];
    assert_int_equal(ddp_model_create(&m), 0);
    for (int k = 0; k < NP; k++) {
        char name[16];
        snprintf(name, sizeof name, "p%d", k);
        assert_int_equal(ddp_model_add_param(m, name, 2, (int64_t[]){D, D}, &ps[k]), 0);
    }
    assert_int_equal(ddp_model_seal(m), 0);
    ddp__rng rng;
    ddp__rng_seed(&rng, 2024);
    for (int k = 0; k < NP; k++)
        gc_fill(ps[k]->data, ps[k]->numel, &rng);
    float xs[NB * D];
    gc_fill(xs, NB * D, &rng);
    events ev = {.fail_on = -1};
    ddp_model_set_grad_ready_hook(m, record, &ev);
    ddp_tape_t *t;
    assert_int_equal(ddp_tape_create(&t), 0);
    for (int g = 0; g < GRAPHS; g++) {
        ddp_var_t *vars[NOPS + 1];
        unsigned deps[NOPS + 1]; /* bit k: depends on parameter k */
        ddp_tensor xt;
        ddp_tape_reset(t);
        assert_int_equal(ddp_tensor_wrap(&xt, xs, 2, (int64_t[]){NB, D}), 0);
        assert_int_equal(ddp_tape_input(t, &xt, 0, &vars[0]), 0);
        deps[0] = 0;
        int nv = 1;
        for (int o = 0; o < NOPS; o++) {
            int a = (int)ddp__rng_below(&rng, (uint64_t)nv);
            int b = (int)ddp__rng_below(&rng, (uint64_t)nv);
            int kind = (int)ddp__rng_below(&rng, 4);
            ddp_var_t *w;
            int k = (int)ddp__rng_below(&rng, NP);
            switch (kind) {
            case 0:
            case 1: /* linear with a random (possibly repeated) parameter */
                assert_int_equal(ddp_tape_param(t, ps[k], &w), 0);
                assert_int_equal(ddp_op_linear(t, vars[a], w, NULL, &vars[nv]), 0);
                deps[nv] = deps[a] | 1u << k;
                break;
            case 2:
                assert_int_equal(ddp_op_add(t, vars[a], vars[b], &vars[nv]), 0);
                deps[nv] = deps[a] | deps[b];
                break;
            default:
                assert_int_equal(ddp_op_relu(t, vars[a], &vars[nv]), 0);
                deps[nv] = deps[a];
                break;
            }
            nv++;
        }
        /* the loss: the sum of a random non-empty subset of the op outputs */
        ddp_var_t *loss = NULL;
        unsigned used = 0;
        for (int i = 1; i < nv; i++) {
            if (ddp__rng_below(&rng, 3) != 0 && !(i == nv - 1 && !loss))
                continue;
            ddp_var_t *s;
            assert_int_equal(ddp_op_sum(t, vars[i], &s), 0);
            if (loss)
                assert_int_equal(ddp_op_add(t, loss, s, &loss), 0);
            else
                loss = s;
            used |= deps[i];
        }
        if (!used) /* nothing requires grad: backward refuses; skip */
            continue;
        ddp_model_zero_grad(m);
        assert_int_equal(ddp_tape_backward(t, loss, m), 0);
        assert_int_equal(ev.n, NP);
        int seen[NP] = {0}, saw_used = 0;
        for (int i = 0; i < ev.n; i++) {
            int k = ev.index[i];
            seen[k]++;
            assert_int_equal(ev.used[i], (used >> k) & 1);
            if (ev.used[i])
                saw_used = 1;
            else
                assert_false(saw_used); /* unused ones come first */
            assert_memory_equal(ev.snap[i], ps[k]->grad, ps[k]->numel * sizeof(float));
        }
        for (int k = 0; k < NP; k++)
            assert_int_equal(seen[k], 1);
        events_clear(&ev);
    }
    ddp_tape_destroy(t);
    ddp_model_destroy(m);
}

/* ==== chunked weight gradients (nn.h rule 7) ============================== */

#define CK_IN 784
#define CK_OUT 256
#define CK_B 64

typedef struct chunk_log {
    int nchunks;          /* what plan answers for 0.weight */
    int plans[8];         /* plan calls per parameter index */
    char seq[512];        /* "r1 r0 c0-48 c48-96 ... r0" (ready / chunk events) */
    const float *ref_dw;  /* the unchunked 0.weight gradient */
    int rows_ok;          /* every chunk's rows were final when reported */
    int fail_chunk;       /* chunk call to fail on (-1: none) */
    int nchunk_calls;
} chunk_log;

static int ck_ready(ddp_param *p, int used, void *user)
{
    chunk_log *l = user;
    (void)used;
    size_t n = strlen(l->seq);
    snprintf(l->seq + n, sizeof l->seq - n, "r%d ", p->index);
    return 0;
}

static int ck_plan(ddp_param *p, int64_t rows, void *user)
{
    chunk_log *l = user;
    l->plans[p->index]++;
    return p->index == 0 && rows == CK_OUT ? l->nchunks : 0;
}

static int ck_chunk(ddp_param *p, int64_t r0, int64_t r1, void *user)
{
    chunk_log *l = user;
    if (l->nchunk_calls++ == l->fail_chunk)
        return DDP_ERROR(DDP_ERR_PEER, "chunk %ld-%ld refused", (long)r0, (long)r1);
    size_t len = strlen(l->seq);
    snprintf(l->seq + len, sizeof l->seq - len, "c%ld-%ld ", (long)r0, (long)r1);
    size_t a = (size_t)r0 * CK_IN, n = (size_t)(r1 - r0) * CK_IN;
    l->rows_ok &= memcmp(p->grad + a, l->ref_dw + a, n * sizeof(float)) == 0;
    return 0;
}

/* The reference model's first layer (784 -> 256, batch 64): dW computed in
 * 3, 5 and 7 row chunks is bitwise the unchunked dW, each chunk's rows are
 * final when reported, the bias is reported before the chunks and the
 * weight after the last; plan is asked once per weight, at its last use. */
static void test_chunked_weight_gradient(void **state)
{
    (void)state;
    ddp_module_t *mods[3];
    assert_int_equal(ddp_linear_create(CK_IN, CK_OUT, 1, 1, &mods[0]), 0);
    assert_int_equal(ddp_relu_create(&mods[1]), 0);
    assert_int_equal(ddp_linear_create(CK_OUT, 10, 1, 2, &mods[2]), 0);
    ddp_module_t *seq;
    assert_int_equal(ddp_sequential_create(mods, 3, &seq), 0);
    ddp_model_t *m;
    assert_int_equal(ddp_model_from_module(seq, &m), 0);
    static float xs[CK_B * CK_IN];
    int64_t labels[CK_B];
    for (int i = 0; i < CK_B * CK_IN; i++)
        xs[i] = (float)sin(0.013 * i) * 0.5f;
    for (int i = 0; i < CK_B; i++)
        labels[i] = i % 10;
    ddp_tensor xt;
    assert_int_equal(ddp_tensor_wrap(&xt, xs, 2, (int64_t[]){CK_B, CK_IN}), 0);
    ddp_tape_t *t;
    assert_int_equal(ddp_tape_create(&t), 0);
    size_t total;
    float *ref = NULL;
    const int counts[] = {0, 3, 5, 7, 3};
    for (size_t k = 0; k < sizeof counts / sizeof *counts; k++) {
        chunk_log log = {.nchunks = counts[k], .rows_ok = 1, .fail_chunk = k == 4 ? 1 : -1,
                         .ref_dw = ref};
        ddp_model_set_grad_ready_hook(m, ck_ready, &log);
        ddp_model_set_grad_chunk_hook(m, k ? &(ddp_grad_chunk_hook){ck_plan, ck_chunk, &log}
                                           : NULL);
        ddp_model_zero_grad(m);
        ddp_var_t *x, *y, *loss;
        ddp_tape_reset(t);
        assert_int_equal(ddp_tape_input(t, &xt, 0, &x), 0);
        assert_int_equal(ddp_model_forward(m, t, x, &y), 0);
        assert_int_equal(ddp_op_cross_entropy(t, y, labels, &loss), 0);
        int rc = ddp_tape_backward(t, loss, m);
        const float *g = ddp_model_grad_block(m, &total);
        if (k == 0) { /* the unchunked reference */
            assert_int_equal(rc, 0);
            assert_null(ddp_model_grad_chunk_hook(m));
            assert_string_equal(log.seq, "r3 r2 r1 r0 ");
            ref = malloc(total * sizeof *ref);
            memcpy(ref, g, total * sizeof *ref);
            continue;
        }
        if (k == 4) { /* a failing chunk call stops backward with its message */
            assert_int_equal(rc, DDP_ERR_PEER);
            assert_non_null(strstr(ddp_last_error(), "chunk 96-192 refused"));
            assert_string_equal(log.seq, "r3 r2 r1 c0-96 ");
            continue;
        }
        assert_int_equal(rc, 0);
        assert_memory_equal(g, ref, total * sizeof *ref);
        assert_true(log.rows_ok);
        assert_int_equal(log.plans[0], 1);
        assert_int_equal(log.plans[2], 1);
        int64_t bounds[8];
        int n = ddp_grad_chunk_bounds(CK_OUT, counts[k], bounds);
        assert_int_equal(n, counts[k] < 6 ? counts[k] : 6); /* 256 rows: 6 units of 48 */
        char expect[512] = "r3 r2 r1 ";
        for (int c = 0; c < n; c++)
            snprintf(expect + strlen(expect), sizeof expect - strlen(expect), "c%ld-%ld ",
                     (long)bounds[c], (long)bounds[c + 1]);
        strcat(expect, "r0 ");
        assert_string_equal(log.seq, expect);
    }
    free(ref);
    ddp_tape_destroy(t);
    ddp_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_residual_shared_gradcheck),
        cmocka_unit_test(test_hooks_contract),
        cmocka_unit_test(test_hooks_sequential),
        cmocka_unit_test(test_set_grad),
        cmocka_unit_test(test_hooks_random_graphs),
        cmocka_unit_test(test_chunked_weight_gradient),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
