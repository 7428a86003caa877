/* SyncBatchNorm with 2 real processes, half of the batch each, against a
 * one-process BatchNorm over the whole batch computed by each rank itself:
 * outputs and input gradients of its half, the weight and bias gradients
 * summed over the ranks, and the running statistics, over two steps, to
 * 1e-5.  Also: converting back to local statistics, and evaluation mode
 * communicating nothing. */
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
#include "fork_children.h"
#include "pg_util.h"

#define N 8 /* whole batch; each rank N / 2 */
#define C 3
#define L 2
#define STEPS 2
#define TOL 1e-5

static const float W[C] = {0.8f, 1.3f, -0.6f}, BIAS[C] = {0.1f, -0.2f, 0.3f};

static float xval(int step, int i) { return (float)(2.0 * sin(0.37 * i + step) + 0.5 * step); }
static float rval(int i) { return (float)cos(0.53 * i); }

typedef struct result {
    float y[N * C * L], dx[N * C * L], dw[C], db[C], rm[C], rv[C];
} result;

static int make_bn(ddp_model_t **m)
{
    ddp_batchnorm_options o = ddp_batchnorm_defaults(C);
    ddp_module_t *bn;
    DDP_TRY(ddp_batchnorm1d_create(&o, &bn));
    DDP_TRY(ddp_model_from_module(bn, m));
    memcpy(ddp_model_find_param(*m, "weight")->data, W, sizeof W);
    memcpy(ddp_model_find_param(*m, "bias")->data, BIAS, sizeof BIAS);
    return 0;
}

/* STEPS training steps of m on samples [first, first + n) of each step's
 * batch, loss sum(y * r); the last step's outputs and gradients into out. */
static int train(ddp_model_t *m, int first, int n, result *out)
{
    static float x[N * C * L], r[N * C * L];
    const int per = C * L;
    ddp_tape_t *tape;
    DDP_TRY(ddp_tape_create(&tape));
    int rc = 0;
    for (int s = 0; s < STEPS; s++) {
        for (int i = 0; i < n * per; i++)
            x[i] = xval(s, first * per + i), r[i] = rval(first * per + i);
        ddp_tensor tx, tr;
        int64_t shape[3] = {n, C, L};
        DDP_TRY_OUT(ddp_tensor_wrap(&tx, x, 3, shape));
        DDP_TRY_OUT(ddp_tensor_wrap(&tr, r, 3, shape));
        ddp_tape_reset(tape);
        ddp_var_t *vx, *vr, *y, *yr, *loss;
        DDP_TRY_OUT(ddp_tape_input(tape, &tx, 1, &vx));
        DDP_TRY_OUT(ddp_tape_input(tape, &tr, 0, &vr));
        DDP_TRY_OUT(ddp_model_forward(m, tape, vx, &y));
        DDP_TRY_OUT(ddp_op_mul(tape, y, vr, &yr));
        DDP_TRY_OUT(ddp_op_sum(tape, yr, &loss));
        ddp_model_zero_grad(m);
        DDP_TRY_OUT(ddp_tape_backward(tape, loss, m));
        memcpy(out->y, ddp_var_tensor(y)->data, (size_t)(n * per) * sizeof(float));
        memcpy(out->dx, ddp_var_grad(vx), (size_t)(n * per) * sizeof(float));
    }
    memcpy(out->dw, ddp_model_find_param(m, "weight")->grad, sizeof out->dw);
    memcpy(out->db, ddp_model_find_param(m, "bias")->grad, sizeof out->db);
    memcpy(out->rm, ddp_model_find_buffer(m, "running_mean")->data, sizeof out->rm);
    memcpy(out->rv, ddp_model_find_buffer(m, "running_var")->data, sizeof out->rv);
out:
    ddp_tape_destroy(tape);
    return rc;
}

static int close_to(const float *a, const float *b, int n, const char *what)
{
    for (int i = 0; i < n; i++)
        if (fabs((double)a[i] - b[i]) > TOL * (1 + fabs((double)b[i]))) {
            fprintf(stderr, "%s[%d]: %.9g, one process %.9g\n", what, i, (double)a[i],
                    (double)b[i]);
            return 0;
        }
    return 1;
}

typedef struct shared {
    job j;
} shared;

static int rank_main(int rank, void *arg)
{
    shared *s = arg;
    ddp_pg_t *pg;
    CHILD_CHECK(ddp_init_process_group("tcp", s->j.url, rank, 2, 20.0, &pg) == 0);
    static result ref, mine;
    ddp_model_t *whole, *half;
    CHILD_CHECK(make_bn(&whole) == 0 && make_bn(&half) == 0);
    CHILD_CHECK(train(whole, 0, N, &ref) == 0); /* the whole batch, locally */
    int n;
    CHILD_CHECK(ddp_sync_batchnorm_convert(half, pg, &n) == 0 && n == 1);
    CHILD_CHECK(train(half, rank * N / 2, N / 2, &mine) == 0);
    const int off = rank * N / 2 * C * L, cnt = N / 2 * C * L;
    CHILD_CHECK(close_to(mine.y, ref.y + off, cnt, "y"));
    CHILD_CHECK(close_to(mine.dx, ref.dx + off, cnt, "dx"));
    CHILD_CHECK(close_to(mine.rm, ref.rm, C, "running_mean"));
    CHILD_CHECK(close_to(mine.rv, ref.rv, C, "running_var"));
    /* Each rank's weight and bias gradients are its share of the whole's. */
    CHILD_CHECK(ddp_pg_all_reduce(pg, mine.dw, C, DDP_FLOAT32, DDP_SUM) == 0);
    CHILD_CHECK(ddp_pg_all_reduce(pg, mine.db, C, DDP_FLOAT32, DDP_SUM) == 0);
    CHILD_CHECK(close_to(mine.dw, ref.dw, C, "dweight"));
    CHILD_CHECK(close_to(mine.db, ref.db, C, "dbias"));
    /* Evaluation communicates nothing: rank 1 alone runs a forward. */
    if (rank == 1) {
        ddp_model_train(half, 0);
        CHILD_CHECK(train(half, 0, N / 2, &mine) == 0);
    }
    /* Back to local statistics: each rank normalises its half by itself. */
    ddp_model_train(half, 1);
    CHILD_CHECK(ddp_sync_batchnorm_convert(half, NULL, &n) == 0 && n == 1);
    ddp_model_t *local;
    CHILD_CHECK(make_bn(&local) == 0);
    result a, b;
    CHILD_CHECK(train(half, rank * N / 2, N / 2, &a) == 0);
    CHILD_CHECK(train(local, rank * N / 2, N / 2, &b) == 0);
    CHILD_CHECK(memcmp(a.y, b.y, (size_t)cnt * sizeof(float)) == 0);
    CHILD_CHECK(ddp_pg_barrier(pg) == 0);
    ddp_model_destroy(local);
    ddp_model_destroy(whole);
    ddp_model_destroy(half);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_sync_batchnorm_equals_whole_batch(void **state)
{
    (void)state;
    shared *s = shared_page(sizeof *s);
    job_init(&s->j);
    assert_int_equal(run_children(2, rank_main, s, 60.0), 0);
    job_cleanup(&s->j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sync_batchnorm_equals_whole_batch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
