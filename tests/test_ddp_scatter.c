/* DDP's reduce_scatter mode (ZeRO-2's gradient side) on a model, 2 and 3
 * real processes: after backward each rank's shard equals its slice of
 * plain DDP's averaged gradient (the same model, data and ranks), over two
 * steps with the shard zeroed between them; the parameters' gradients go
 * through the pool (nn's grad-write hook), which holds no more buffers
 * than it has (the reducer's stats); a weight used twice (written at the
 * start of backward, ready at the end) takes an overflow buffer when the
 * pool has one buffer, and the result is still right; no_sync is refused
 * with a message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "ddp.h"
#include "ddp/ext.h"
#include "fork_children.h"
#include "scratch_dir.h"

#define IN 16
#define H 32
#define OUT 4
#define B 6
#define NP 4

static int join_group(int rank, int n, const char *tag, ddp_pg_t **pg)
{
    char url[256];
    snprintf(url, sizeof url, "file://%s/store-%s", dir, tag);
    return ddp_init_process_group("tcp", url, rank, n, 20.0, pg);
}

/* Parameters w0 (H, IN), s (H, H), w1 (H, H), w2 (OUT, H), values from a
 * formula.  Forward: relu(x w0^T) -> relu(. s^T) -> relu(. w1^T) ->
 * [shared: relu(. s^T)] -> . w2^T: with `shared`, s is used twice. */
static const char *const pnames[NP] = {"w0", "s", "w1", "w2"};
static const int64_t pshape[NP][2] = {{H, IN}, {H, H}, {H, H}, {OUT, H}};

static int make_model(ddp_model_t **out, ddp_param **ps)
{
    ddp_model_t *m;
    DDP_TRY(ddp_model_create(&m));
    for (int i = 0; i < NP; i++)
        DDP_TRY(ddp_model_add_param(m, pnames[i], 2, pshape[i], &ps[i]));
    DDP_TRY(ddp_model_seal(m));
    for (int i = 0; i < NP; i++)
        for (size_t j = 0; j < ps[i]->numel; j++)
            ps[i]->data[j] = (float)(0.3 * sin(0.7 * (double)j + 1.3 * i));
    *out = m;
    return 0;
}

static int layer(ddp_tape_t *t, ddp_var_t *x, ddp_param *p, int relu, ddp_var_t **y)
{
    ddp_var_t *w, *z;
    DDP_TRY(ddp_tape_param(t, p, &w));
    DDP_TRY(ddp_op_linear(t, x, w, NULL, &z));
    return relu ? ddp_op_relu(t, z, y) : (*y = z, 0);
}

static int loss_of(ddp_data_parallel_t *dm, ddp_tape_t *t, ddp_param **ps, int rank, int it,
                   int shared, ddp_var_t **loss)
{
    static float xs[B * IN];
    static int64_t labels[B];
    for (int i = 0; i < B; i++) {
        for (int j = 0; j < IN; j++)
            xs[i * IN + j] = (float)sin(0.37 * (i + B * (rank + 3 * it)) + 0.11 * j);
        labels[i] = (i + rank + it) % OUT;
    }
    ddp_tensor xt;
    DDP_TRY(ddp_tensor_wrap(&xt, xs, 2, (int64_t[]){B, IN}));
    ddp_tape_reset(t);
    ddp_var_t *h;
    DDP_TRY(ddp_tape_input(t, &xt, 0, &h));
    DDP_TRY(ddp_reducer_num_regions(ddp_data_parallel_reducer(dm)) == NP ? 0 : DDP_ERR_STATE);
    DDP_TRY(layer(t, h, ps[0], 1, &h));
    DDP_TRY(layer(t, h, ps[1], 1, &h));
    DDP_TRY(layer(t, h, ps[2], 1, &h));
    if (shared)
        DDP_TRY(layer(t, h, ps[1], 1, &h));
    DDP_TRY(layer(t, h, ps[3], 0, &h));
    return ddp_op_cross_entropy(t, h, labels, loss);
}

typedef struct {
    int world, pool, shared;
    const char *tag;
} scatter_case;

/* One rank: plain DDP and reduce_scatter DDP side by side on two copies of
 * the model, two iterations each. */
static int scatter_rank(int rank, void *arg)
{
    const scatter_case *c = arg;
    ddp_pg_t *pg;
    CHILD_CHECK(join_group(rank, c->world, c->tag, &pg) == 0);
    ddp_model_t *m[2];
    ddp_param *ps[2][NP];
    ddp_data_parallel_t *dm[2];
    ddp_tape_t *tape;
    CHILD_CHECK(ddp_tape_create(&tape) == 0);
    for (int k = 0; k < 2; k++) {
        ddp_data_parallel_options o = ddp_data_parallel_defaults();
        o.bucket_cap_mb = o.first_bucket_cap_mb = 1e-6; /* a bucket per parameter */
        o.reduce_scatter = k;
        o.grad_pool_buffers = c->pool;
        o.rebuild_buckets = 0;
        CHILD_CHECK(make_model(&m[k], ps[k]) == 0);
        CHILD_CHECK(ddp_data_parallel_create(m[k], pg, &o, &dm[k]) == 0);
    }
    for (int it = 0; it < 2; it++) {
        ddp_var_t *loss;
        for (int k = 0; k < 2; k++) {
            ddp_model_zero_grad(m[k]);
            CHILD_CHECK(loss_of(dm[k], tape, ps[k], rank, it, c->shared, &loss) == 0);
            CHILD_CHECK(ddp_data_parallel_backward(dm[k], tape, loss) == 0);
        }
        float *shard;
        size_t begin, count, flat = 0;
        CHILD_CHECK(ddp_data_parallel_shard_grad(dm[1], &shard, &begin, &count) == 0);
        for (int i = 0; i < NP; i++, flat += ps[0][i - 1]->numel)
            for (size_t j = 0; j < ps[0][i]->numel; j++) {
                size_t at = flat + j;
                if (at < begin || at >= begin + count)
                    continue;
                double want = ps[0][i]->grad[j], got = shard[at - begin];
                CHILD_CHECK(fabs(got - want) <= 1e-6 * (1e-3 + fabs(want)));
            }
        ddp_data_parallel_zero_shard_grad(dm[1]);
    }
    ddp_reducer_stats st;
    CHILD_CHECK(ddp_reducer_pool_stats(ddp_data_parallel_reducer(dm[1]), &st) == 0);
    CHILD_CHECK(st.buckets_reduced == 2 * NP && st.buffers_in_use == 0);
    if (c->shared && c->pool == 1) {
        CHILD_CHECK(st.overflow_buffers == 1 && st.buffers_in_use_max == 2);
    } else {
        CHILD_CHECK(st.overflow_buffers == 0 && st.buffers_in_use_max <= c->pool);
        CHILD_CHECK(c->pool > 1 || st.pool_waits >= 2 * (NP - 1));
    }
    /* No no_sync here: refused at the next step, with the reason. */
    ddp_data_parallel_set_no_sync(dm[1], 1);
    ddp_var_t *loss;
    CHILD_CHECK(loss_of(dm[1], tape, ps[1], rank, 0, c->shared, &loss) == 0);
    CHILD_CHECK(ddp_data_parallel_backward(dm[1], tape, loss) == DDP_ERR_INVALID_ARG);
    CHILD_CHECK(strstr(ddp_last_error(), "no_sync was asked for with reduce_scatter"));
    for (int k = 0; k < 2; k++) {
        ddp_data_parallel_destroy(dm[k]);
        ddp_model_destroy(m[k]);
    }
    ddp_tape_destroy(tape);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_shard_matches_ddp(void **state)
{
    (void)state;
    scatter_case two = {2, 2, 0, "two"}, three = {3, 1, 0, "three"};
    assert_int_equal(run_children(2, scatter_rank, &two, 60), 0);
    assert_int_equal(run_children(3, scatter_rank, &three, 60), 0);
}

static void test_shared_weight_overflows_safely(void **state)
{
    (void)state;
    scatter_case one = {2, 1, 1, "shared1"}, two = {3, 2, 1, "shared2"};
    assert_int_equal(run_children(2, scatter_rank, &one, 60), 0);
    assert_int_equal(run_children(3, scatter_rank, &two, 60), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        IN_SCRATCH(test_shard_matches_ddp),
        IN_SCRATCH(test_shared_weight_overflows_safely),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
