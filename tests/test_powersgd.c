/* PowerSGD's hook on 2 real processes against a float64 reimplementation of
 * PyTorch 1.13's powerSGD_hook: two vanilla averaged iterations, then two
 * compressed ones (rank 1: P = sum M Q, orthogonalised, Q = sum M^T P / 2,
 * M = P Q^T), error feedback over the whole bucket, warm start, the bias
 * all-reduced as it is; every rank ends with the same bits; bad options
 * and layouts refused; and as DDP's hook (ddp_data_parallel_register_powersgd)
 * against plain DDP in the same processes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/rng.h"
#include "ddp.h"
#include "ddp/pg.h"
#include "ddp/powersgd.h"
#include "ddp/powersgd_impl.h"
#include "fork_children.h"
#include "pg_util.h"
#include "tensor/kernels.h"

/* A (8 x 6) compressed, a bias (6) as it is, B (5 x 4) compressed. */
static const ddp_powersgd_tensor LAYOUT[3] = {{0, 8, 6}, {48, 6, 1}, {54, 5, 4}};
#define N 74
#define ITERS 4

static int layout(void *user, int bucket, const ddp_powersgd_tensor **t, int *n, int *nb)
{
    (void)user;
    (void)bucket;
    *t = LAYOUT;
    *n = 3;
    *nb = 1;
    return 0;
}

static float input(int rank, int it, int e)
{
    return (float)sin(0.37 * e + 1.3 * rank + 0.71 * it) + 0.1f * (float)(e % 5);
}

/* ---- the float64 reference -------------------------------------------- */

static void orth(double *m, int64_t rows)
{
    double norm = 0;
    for (int64_t k = 0; k < rows; k++)
        norm += m[k] * m[k];
    norm = sqrt(norm);
    for (int64_t k = 0; k < rows; k++)
        m[k] = norm > 0 ? m[k] / norm : 0;
}

static double normal(ddp__rng *g) /* the hook's draw for Q's first values */
{
    double u1 = ddp__rng_uniform(g), u2 = ddp__rng_uniform(g);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return (double)(float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* out[it][e]: the bucket every rank holds after iteration it. */
static void reference(double out[ITERS][N])
{
    double err[2][N] = {{0}}, q[2][8] = {{0}};
    ddp__rng g;
    ddp__rng_seed(&g, 5);
    for (int it = 0; it < ITERS; it++) {
        double m[2][N];
        for (int r = 0; r < 2; r++)
            for (int e = 0; e < N; e++)
                m[r][e] = input(r, it, e) + (it > 0 ? err[r][e] : 0);
        if (it < 2) { /* vanilla (start_powersgd_iter 2): the average, no error */
            for (int e = 0; e < N; e++)
                out[it][e] = (m[0][e] + m[1][e]) / 2;
            continue;
        }
        for (int e = 48; e < 54; e++) /* the bias: averaged as it is */
            out[it][e] = (m[0][e] + m[1][e]) / 2;
        for (int ti = 0; ti < 3; ti += 2) {
            const ddp_powersgd_tensor *t = &LAYOUT[ti];
            double *qq = q[ti / 2], p[8] = {0};
            if (it == 2)
                for (int64_t c = 0; c < t->cols; c++)
                    qq[c] = normal(&g);
            orth(qq, t->cols);
            for (int r = 0; r < 2; r++)
                for (int64_t i = 0; i < t->rows; i++)
                    for (int64_t c = 0; c < t->cols; c++)
                        p[i] += m[r][t->offset + (size_t)(i * t->cols + c)] * qq[c];
            orth(p, t->rows);
            for (int64_t c = 0; c < t->cols; c++) {
                qq[c] = 0;
                for (int r = 0; r < 2; r++)
                    for (int64_t i = 0; i < t->rows; i++)
                        qq[c] += m[r][t->offset + (size_t)(i * t->cols + c)] * p[i];
                qq[c] /= 2;
            }
            for (int64_t i = 0; i < t->rows; i++)
                for (int64_t c = 0; c < t->cols; c++)
                    out[it][t->offset + (size_t)(i * t->cols + c)] = p[i] * qq[c];
        }
        for (int r = 0; r < 2; r++)
            for (int e = 0; e < N; e++)
                err[r][e] = m[r][e] - out[it][e];
    }
}

/* ---- the ranks ---------------------------------------------------------- */

static job J;
static float *shared; /* [rank][ITERS][N] */

/* The state's bytes: saved, loaded and saved again the same; a blob cut
 * short anywhere, with bytes after it, or with an all-zero generator fails
 * with DDP_ERR_FORMAT and its message, and changes nothing (the next save
 * is the first one's bytes). */
static int check_state_blob(ddp_powersgd_t *s)
{
    void *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    CHILD_CHECK(ddp_powersgd_state_save(s, &a, &na) == 0 && na > 56);
    CHILD_CHECK(ddp_powersgd_state_load(s, a, na) == 0);
    CHILD_CHECK(ddp_powersgd_state_save(s, &b, &nb) == 0 && nb == na && !memcmp(a, b, na));
    free(b);
    uint8_t *bad = malloc(na + 4);
    CHILD_CHECK(bad != NULL);
    memcpy(bad, a, na);
    const size_t cuts[] = {0, 10, 52, 60, na / 2, na - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
        CHILD_CHECK(ddp_powersgd_state_load(s, bad, cuts[i]) == DDP_ERR_FORMAT);
        CHILD_CHECK(contains(ddp_last_error(), "powersgd state"));
    }
    memset(bad + na, 0, 4);
    CHILD_CHECK(ddp_powersgd_state_load(s, bad, na + 4) == DDP_ERR_FORMAT);
    CHILD_CHECK(contains(ddp_last_error(), "4 bytes after the last bucket"));
    memset(bad + 16, 0, 32); /* the generator's four words */
    CHILD_CHECK(ddp_powersgd_state_load(s, bad, na) == DDP_ERR_FORMAT);
    CHILD_CHECK(contains(ddp_last_error(), "generator state is all zeros"));
    CHILD_CHECK(ddp_powersgd_state_save(s, &b, &nb) == 0 && nb == na && !memcmp(a, b, na));
    free(b);
    free(bad);
    free(a);
    return 0;
}

/* The state as a file (ddp_powersgd_state_save_file / load_file): the
 * blob's bytes back; a missing file (DDP_ERR_NOT_FOUND), a folder
 * (DDP_ERR_IO), one cut short (DDP_ERR_FORMAT naming the file and the
 * blob's fault), no path or no state (DDP_ERR_INVALID_ARG) and a temporary
 * name that cannot be made (DDP_ERR_IO, the old file as it was) each fail
 * with their message and leave the state as it was. */
static int check_state_file(ddp_powersgd_t *s, int rank)
{
    char path[128], cmd[320];
    void *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    snprintf(path, sizeof path, "%s/state.rank%d", J.dir, rank);
    CHILD_CHECK(ddp_powersgd_state_save(s, &a, &na) == 0);
    CHILD_CHECK(ddp_powersgd_state_save_file(s, path) == 0);
    CHILD_CHECK(ddp_powersgd_state_load_file(s, path) == 0);
    CHILD_CHECK(ddp_powersgd_state_save(s, &b, &nb) == 0 && nb == na && !memcmp(a, b, na));
    free(b);
    snprintf(cmd, sizeof cmd, "cmp -s %s /dev/stdin", path); /* the file is the blob */
    FILE *p = popen(cmd, "w");
    CHILD_CHECK(p && fwrite(a, 1, na, p) == na && pclose(p) == 0);

    char missing[160];
    snprintf(missing, sizeof missing, "%s.none", path);
    CHILD_CHECK(ddp_powersgd_state_load_file(s, missing) == DDP_ERR_NOT_FOUND);
    CHILD_CHECK(contains(ddp_last_error(), missing) &&
                contains(ddp_last_error(), "No such file or directory"));
    CHILD_CHECK(ddp_powersgd_state_load_file(s, J.dir) == DDP_ERR_IO); /* a folder */
    CHILD_CHECK(contains(ddp_last_error(), "a directory, not a regular file"));
    CHILD_CHECK(ddp_powersgd_state_load_file(s, "") == DDP_ERR_INVALID_ARG &&
                ddp_powersgd_state_save_file(NULL, path) == DDP_ERR_INVALID_ARG);
    CHILD_CHECK(truncate(path, 10) == 0);
    CHILD_CHECK(ddp_powersgd_state_load_file(s, path) == DDP_ERR_FORMAT);
    CHILD_CHECK(contains(ddp_last_error(), path) &&
                contains(ddp_last_error(), "powersgd state: not a PowerSGD state (10 bytes)"));
    snprintf(cmd, sizeof cmd, "mkdir %s.tmp", path); /* the temporary name taken */
    CHILD_CHECK(system(cmd) == 0);
    CHILD_CHECK(ddp_powersgd_state_save_file(s, path) == DDP_ERR_IO);
    CHILD_CHECK(contains(ddp_last_error(), "cannot create ") &&
                contains(ddp_last_error(), ".tmp: Is a directory"));
    struct stat st;
    CHILD_CHECK(stat(path, &st) == 0 && st.st_size == 10); /* the old file as it was */
    CHILD_CHECK(ddp_powersgd_state_save(s, &b, &nb) == 0 && nb == na && !memcmp(a, b, na));
    free(b);
    free(a);
    snprintf(cmd, sizeof cmd, "%s.tmp", path);
    CHILD_CHECK(rmdir(cmd) == 0 && unlink(path) == 0); /* the folder empty again */
    return 0;
}

static int rank_main(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 2, 30.0, &pg) == 0);
    ddp_powersgd_options o = ddp_powersgd_defaults();
    o.start_powersgd_iter = 2;
    o.random_seed = 5;
    ddp_powersgd_t *s = NULL;
    CHILD_CHECK(ddp_powersgd_create(&o, layout, NULL, &s) == 0);
    ddp_comm_hook h = ddp_powersgd_hook(s);
    for (int it = 0; it < ITERS; it++) {
        float *data = shared + ((size_t)rank * ITERS + (size_t)it) * N;
        for (int e = 0; e < N; e++)
            data[e] = input(rank, it, e);
        ddp_work_t *w = NULL;
        CHILD_CHECK(h.launch(h.state, pg, 0, data, N, &w) == 0);
        if (w) {
            CHILD_CHECK(ddp_work_wait(w, 30.0) == 0);
            ddp_work_destroy(w);
        }
        CHILD_CHECK(h.finish(h.state, pg, 0, data, N) == 0);
        CHILD_CHECK(ddp_powersgd_iter(s) == it + 1);
    }
    double before, after;
    ddp_powersgd_stats(s, &before, &after);
    CHILD_CHECK(before == 2 * 74 && after == 2 * (14 + 6 + 9)); /* two compressed iterations */
    const char *name;
    float *buf;
    size_t cnt;
    CHILD_CHECK(ddp_powersgd_num_states(s) == 2);
    CHILD_CHECK(ddp_powersgd_state(s, 1, &name, &buf, &cnt) == 0);
    CHILD_CHECK(strcmp(name, "powersgd.q.0") == 0 && cnt == 6 + 4);
    CHILD_CHECK(check_state_blob(s) == 0);
    CHILD_CHECK(check_state_file(s, rank) == 0);
    ddp_powersgd_destroy(s);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_against_reference(void **state)
{
    (void)state;
    job_init(&J);
    shared = shared_page(2 * ITERS * N * sizeof(float));
    rank_group g;
    start_ranks(&g, 0, 2, rank_main, NULL);
    assert_int_equal(join_ranks(&g, 60.0), 0);
    static double want[ITERS][N];
    reference(want);
    for (int it = 0; it < ITERS; it++)
        for (int e = 0; e < N; e++) {
            float a = shared[(size_t)it * N + (size_t)e], b = shared[(size_t)(ITERS + it) * N + (size_t)e];
            assert_memory_equal(&a, &b, sizeof a); /* every rank the same bits */
            if (fabs(a - want[it][e]) > 2e-5 * (1 + fabs(want[it][e])))
                fail_msg("iteration %d element %d: %.9g, float64 reference %.9g", it, e, a,
                         want[it][e]);
        }
    job_cleanup(&J);
}

/* ---- under DistributedDataParallel -------------------------------------- */

static ddp_model_t *mlp(void)
{
    ddp_module_t *l1, *r, *l2, *seq;
    ddp_model_t *m = NULL;
    if (ddp_linear_create(20, 16, 1, 3, &l1) || ddp_relu_create(&r) ||
        ddp_linear_create(16, 4, 1, 4, &l2) ||
        ddp_sequential_create((ddp_module_t *[]){l1, r, l2}, 3, &seq) ||
        ddp_model_from_module(seq, &m))
        return NULL;
    return m;
}

/* One SGD step of dm on this rank's (fixed) batch; the loss. */
static float ddp_step(ddp_data_parallel_t *dm, ddp_optim_t *o, int rank)
{
    static float x[8 * 20];
    int64_t y[8];
    for (int i = 0; i < 8 * 20; i++)
        x[i] = (float)sin(0.1 * i + rank);
    for (int i = 0; i < 8; i++)
        y[i] = (i + rank) % 4;
    ddp_tape_t *t;
    ddp_tensor xt;
    ddp_var_t *xv, *out, *loss;
    if (ddp_tape_create(&t) || ddp_tensor_wrap(&xt, x, 2, (int64_t[]){8, 20}) ||
        ddp_tape_input(t, &xt, 0, &xv) || ddp_data_parallel_forward(dm, t, xv, &out) ||
        ddp_op_cross_entropy(t, out, y, &loss))
        return NAN;
    ddp_optim_zero_grad(o);
    float l = ddp_var_item(loss);
    if (ddp_data_parallel_backward(dm, t, loss) || ddp_optim_step(o))
        l = NAN;
    ddp_tape_destroy(t);
    return l;
}

static int ddp_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 2, 30.0, &pg) == 0);
    ddp_model_t *ma = mlp(), *mb = mlp();
    CHILD_CHECK(ma && mb);
    ddp_data_parallel_t *da, *db;
    CHILD_CHECK(ddp_data_parallel_create(ma, pg, NULL, &da) == 0);
    CHILD_CHECK(ddp_data_parallel_create(mb, pg, NULL, &db) == 0);
    ddp_powersgd_options o = ddp_powersgd_defaults();
    o.start_powersgd_iter = 2;
    ddp_powersgd_t *s = NULL;
    CHILD_CHECK(ddp_data_parallel_register_powersgd(da, &o, &s) == 0);
    ddp_sgd_options so = ddp_sgd_defaults(0.1);
    ddp_optim_t *oa, *ob;
    CHILD_CHECK(ddp_sgd_create(ma, &so, &oa) == 0 && ddp_sgd_create(mb, &so, &ob) == 0);
    size_t n;
    float *pa = ddp_model_param_block(ma, &n), *pb = ddp_model_param_block(mb, &n);
    float first = 0, last = 0;
    for (int it = 0; it < 12; it++) {
        float la = ddp_step(da, oa, rank), lb = ddp_step(db, ob, rank);
        CHILD_CHECK(!isnan(la) && !isnan(lb));
        if (it == 1) /* the vanilla iterations: plain DDP's numbers */
            CHILD_CHECK(memcmp(pa, pb, n * sizeof *pa) == 0);
        if (it == 0)
            first = la;
        last = la;
    }
    CHILD_CHECK(memcmp(pa, pb, n * sizeof *pa) != 0); /* compressed since */
    CHILD_CHECK(last < first);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += pa[i];
    double mx = sum, mn = sum; /* every replica the same */
    CHILD_CHECK(ddp_pg_all_reduce(pg, &mx, 1, DDP_FLOAT64, DDP_MAX) == 0);
    CHILD_CHECK(ddp_pg_all_reduce(pg, &mn, 1, DDP_FLOAT64, DDP_MIN) == 0);
    CHILD_CHECK(mx == mn);
    double before, after;
    ddp_powersgd_stats(s, &before, &after);
    CHILD_CHECK(ddp_powersgd_iter(s) == 12 && before > 0 && after < before / 3);
    ddp_data_parallel_destroy(da);
    ddp_data_parallel_destroy(db);
    ddp_powersgd_destroy(s);
    ddp_optim_destroy(oa);
    ddp_optim_destroy(ob);
    ddp_model_destroy(ma);
    ddp_model_destroy(mb);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_under_ddp(void **state)
{
    (void)state;
    job_init(&J);
    rank_group g;
    start_ranks(&g, 0, 2, ddp_rank, NULL);
    assert_int_equal(join_ranks(&g, 60.0), 0);
    job_cleanup(&J);
}

/* A rebuild that swaps two same-sized tensors: the error kept for the old
 * places must not be added to the new ones (the state starts afresh). */
static const ddp_powersgd_tensor SWAP[2][2] = {{{0, 8, 6}, {48, 6, 8}}, {{0, 6, 8}, {48, 8, 6}}};
static int swapped;
static int swap_layout(void *user, int bucket, const ddp_powersgd_tensor **t, int *n, int *nb)
{
    (void)user;
    (void)bucket;
    *t = SWAP[swapped];
    *n = 2;
    *nb = 1;
    return 0;
}

static int swap_rank(int rank, void *arg)
{
    (void)arg;
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 1, 30.0, &pg) == 0);
    ddp_powersgd_options o = ddp_powersgd_defaults();
    o.start_powersgd_iter = 2;
    ddp_powersgd_t *s = NULL;
    CHILD_CHECK(ddp_powersgd_create(&o, swap_layout, NULL, &s) == 0);
    ddp_comm_hook h = ddp_powersgd_hook(s);
    float data[96];
    for (int it = 0; it < 4; it++) {
        swapped = it == 3; /* the layout moves before the last iteration */
        for (int e = 0; e < 96; e++) /* A gets a gradient until then, B never */
            data[e] = it < 3 && e < 48 ? (float)sin(0.3 * e + it) : 0.0f;
        ddp_work_t *w = NULL;
        CHILD_CHECK(h.launch(h.state, pg, 0, data, 96, &w) == 0);
        if (w) {
            CHILD_CHECK(ddp_work_wait(w, 30.0) == 0);
            ddp_work_destroy(w);
        }
        CHILD_CHECK(h.finish(h.state, pg, 0, data, 96) == 0);
    }
    for (int e = 0; e < 96; e++) /* zero in, nothing carried over: zero out */
        CHILD_CHECK(data[e] == 0.0f);
    ddp_powersgd_destroy(s);
    ddp_destroy_process_group(pg);
    return 0;
}

static void test_layout_change_resets_state(void **state)
{
    (void)state;
    job_init(&J);
    rank_group g;
    start_ranks(&g, 0, 1, swap_rank, NULL);
    assert_int_equal(join_ranks(&g, 60.0), 0);
    job_cleanup(&J);
}

/* Q = M^T P (powersgd_kernels.c's accumulate_q, which sums blocks of 8
 * rows 16 columns at a time in registers) against one axpy per row in row
 * order, the sums it must equal bit for bit: rows below, at and across
 * the block of 8, columns below, at and across 16, ranks 1 to 9. */
static void test_accumulate_q_is_row_axpys(void **state)
{
    (void)state;
    const int rows[] = {1, 7, 8, 9, 17}, cols[] = {1, 15, 16, 17, 33, 48}, ranks[] = {1, 2, 4, 9};
    static float e[17 * 48], p[17 * 9], got[9 * 48], want[9 * 48];
    for (int i = 0; i < 17 * 48; i++)
        e[i] = (float)sin(0.37 * i) * 3.1f;
    for (int i = 0; i < 17 * 9; i++)
        p[i] = (float)cos(0.11 * i + 0.5) / 7.0f;
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 6; b++)
            for (int c = 0; c < 4; c++) {
                int m = rows[a], n = cols[b], r = ranks[c];
                memset(got, 0x7f, sizeof got);
                memset(want, 0, sizeof want);
                for (int k = 0; k < m; k++)
                    for (int j = 0; j < r; j++)
                        ddp__vec_axpy(want + j * n, p[k * r + j], e + k * n, (size_t)n);
                ddp__psgd_accumulate_q(got, e, p, m, n, r);
                if (memcmp(got, want, (size_t)(r * n) * sizeof *got) != 0)
                    fail_msg("accumulate_q of %d x %d, rank %d differs from the row axpys", m,
                             n, r);
            }
}

static void test_bad_input(void **state)
{
    (void)state;
    ddp_powersgd_t *s = NULL;
    ddp_powersgd_options o = ddp_powersgd_defaults();
    o.matrix_approximation_rank = 0;
    assert_int_equal(ddp_powersgd_create(&o, layout, NULL, &s), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "matrix_approximation_rank 0 must be >= 1"));
    o = ddp_powersgd_defaults();
    o.start_powersgd_iter = 1; /* PyTorch refuses it too: the rebuild would move the error */
    assert_int_equal(ddp_powersgd_create(&o, layout, NULL, &s), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "start_powersgd_iter 1 must be > 1"));
    o.use_error_feedback = o.warm_start = 0;
    o.start_powersgd_iter = 0;
    assert_int_equal(ddp_powersgd_create(&o, layout, NULL, &s), 0);
    ddp_comm_hook h = ddp_powersgd_hook(s);
    float data[N] = {0};
    ddp_work_t *w = NULL;
    /* a bucket smaller than its layout says */
    assert_int_equal(h.launch(h.state, NULL, 0, data, 60, &w), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "tensor 2 (5 x 4 at 54) is outside its 60 floats"));
    const char *name;
    float *buf;
    size_t cnt;
    assert_int_equal(ddp_powersgd_state(s, 7, &name, &buf, &cnt), DDP_ERR_NOT_FOUND);
    ddp_powersgd_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_reference),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_accumulate_q_is_row_axpys),
        cmocka_unit_test(test_layout_change_resets_state),
        cmocka_unit_test(test_under_ddp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
