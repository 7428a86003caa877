/* DDP under DDP_DEBUG: at info the bucket layout, at detail each rank's
 * unused parameters and bucket ready order, logged once while they stay
 * the same.  Two forked ranks on one host. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/error.h"
#include "ddp.h"
#include "fork_children.h"
#include "pg_util.h"

#define IN 6
#define OUT 3
#define B 4

static job J;
static char logged[16384];

static void capture(int level, const char *msg, void *user)
{
    (void)level;
    (void)user;
    size_t at = strlen(logged);
    snprintf(logged + at, sizeof logged - at, "%s\n", msg);
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

/* Linear(6, 3) plus a parameter that forward never uses. */
static int make_model(ddp_model_t **out)
{
    ddp_module_t *lin;
    DDP_TRY(ddp_linear_create(IN, OUT, 1, 7, &lin));
    ddp_model_t *m;
    DDP_TRY(ddp_model_create(&m));
    DDP_TRY(ddp_model_add_module(m, "fc", lin));
    int64_t shape[1] = {5};
    ddp_param *p;
    DDP_TRY(ddp_model_add_param(m, "unused.weight", 1, shape, &p));
    DDP_TRY(ddp_model_seal(m));
    *out = m;
    return 0;
}

static int detail_rank(int rank, void *arg)
{
    const char *level = arg;
    setenv("DDP_DEBUG", level, 1);
    ddp_log_set_callback(capture, NULL);
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 2, 20.0, &pg) == 0);
    ddp_model_t *m = NULL;
    CHILD_CHECK(make_model(&m) == 0);
    ddp_data_parallel_options o = ddp_data_parallel_defaults();
    o.find_unused_parameters = 1;
    ddp_data_parallel_t *dm = NULL;
    CHILD_CHECK(ddp_data_parallel_create(m, pg, &o, &dm) == 0);
    ddp_tape_t *tape = NULL;
    CHILD_CHECK(ddp_tape_create(&tape) == 0);
    float xs[B * IN];
    int64_t labels[B];
    for (int s = 0; s < 3; s++) {
        for (int i = 0; i < B * IN; i++)
            xs[i] = (float)((i * 7 + s + rank) % 11) / 11.0f;
        for (int i = 0; i < B; i++)
            labels[i] = i % OUT;
        ddp_tensor t;
        int64_t shape[2] = {B, IN};
        CHILD_CHECK(ddp_tensor_wrap(&t, xs, 2, shape) == 0);
        ddp_tape_reset(tape);
        ddp_var_t *x, *y, *loss;
        CHILD_CHECK(ddp_tape_input(tape, &t, 0, &x) == 0);
        CHILD_CHECK(ddp_data_parallel_forward(dm, tape, x, &y) == 0);
        CHILD_CHECK(ddp_op_cross_entropy(tape, y, labels, &loss) == 0);
        CHILD_CHECK(ddp_data_parallel_backward(dm, tape, loss) == 0);
    }
    ddp_tape_destroy(tape);
    ddp_data_parallel_destroy(dm);
    ddp_model_destroy(m);
    ddp_destroy_process_group(pg);
    ddp_log_set_callback(NULL, NULL);
    char want[160];
    snprintf(want, sizeof want, "DDP_DEBUG: DDP rank %d: 3 parameters in 1 buckets: 0: 3 params",
             rank);
    CHILD_CHECK(count(logged, want) == 1);
    snprintf(want, sizeof want,
             "DDP_DEBUG=detail: DDP rank %d, iteration 1: unused parameters: unused.weight; "
             "buckets ready in order 0",
             rank);
    int detail = strcmp(level, "detail") == 0;
    if (count(logged, want) != detail || count(logged, "DDP_DEBUG=detail") != detail)
        fprintf(stderr, "rank %d logged:\n%s", rank, logged);
    CHILD_CHECK(count(logged, want) == detail);
    CHILD_CHECK(count(logged, "DDP_DEBUG=detail") == detail); /* the same report: once */
    return 0;
}

static void run_level(const char *level)
{
    job_init(&J);
    assert_int_equal(run_children(2, detail_rank, (void *)level, 60), 0);
    job_cleanup(&J);
}

static void test_detail_reports_unused_and_order(void **state)
{
    (void)state;
    run_level("detail");
}

static void test_info_reports_layout_only(void **state)
{
    (void)state;
    run_level("info");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_detail_reports_unused_and_order),
        cmocka_unit_test(test_info_reports_layout_only),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
