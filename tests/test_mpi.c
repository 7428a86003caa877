/* The mpi backend: the collective matrix, async work, subgroups, rank and
 * size checks and timeouts, each run by mpirun over
 * $DDP_TEST_BUILD/tests/helpers/mpi_worker (one process per rank); and the
 * errors of a build without MPI or an unknown backend.
 *
 * Under ASan (or DDP_TEST_SANITIZER) the big counts are left out and
 * LeakSanitizer is off in the workers: Open MPI keeps allocations until
 * exit by design. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "ddp.h"

static int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

static void test_unknown_backend(void **state)
{
    (void)state;
    ddp_pg_t *pg = (ddp_pg_t *)1;
    int rc = ddp_init_process_group("nccl", "file:///tmp/ddp_test_mpi_none", 0, 1, 5.0, &pg);
    assert_int_equal(rc, DDP_ERR_UNSUPPORTED);
    assert_null(pg);
    assert_true(contains(ddp_last_error(), "unknown backend 'nccl'"));
}

#ifndef DDP_HAVE_MPI

static void test_built_without_mpi(void **state)
{
    (void)state;
    ddp_pg_t *pg = (ddp_pg_t *)1;
    int rc = ddp_init_process_group("mpi", NULL, -1, -1, 5.0, &pg);
    assert_int_equal(rc, DDP_ERR_UNSUPPORTED);
    assert_null(pg);
    assert_true(contains(ddp_last_error(), "libddp was built without MPI"));
    for (const char *const *n = ddp_pg_backend_names(); *n; n++)
        assert_string_not_equal(*n, "mpi");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unknown_backend),
        cmocka_unit_test(test_built_without_mpi),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else

static char out[1 << 16];
static int expect_failure; /* the run is meant to fail: keep the log quiet */

/* Built with ASan (make SAN=1), or told so. */
#if defined(__SANITIZE_ADDRESS__)
#define BUILT_WITH_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BUILT_WITH_ASAN 1
#endif
#endif
#ifndef BUILT_WITH_ASAN
#define BUILT_WITH_ASAN 0
#endif

static int sanitizer(void)
{
    const char *s = getenv("DDP_TEST_SANITIZER");
    return BUILT_WITH_ASAN || (s && *s == '1');
}

/* Runs `env mpirun -np n mpi_worker args` (env: "VAR=value ..." that the
 * ranks inherit); returns the exit status, the output (stdout and stderr)
 * in out.  DDP_TEST_MPIRUN replaces the launcher (MPICH: mpirun.mpich). */
static int mpirun(int n, const char *env, const char *args)
{
    const char *build = getenv("DDP_TEST_BUILD"), *launcher = getenv("DDP_TEST_MPIRUN");
    char cmd[2048];
    if (!launcher && system("command -v mpirun >/dev/null 2>&1") != 0) {
        fprintf(stderr, "mpirun not on PATH (install openmpi-bin): skipped\n");
        skip();
    }
    snprintf(cmd, sizeof cmd, "%s %s %s -np %d %s/tests/helpers/mpi_worker %s 2>&1",
             sanitizer() ? "ASAN_OPTIONS=detect_leaks=0" : "", env,
             launcher ? launcher : "mpirun --allow-run-as-root --oversubscribe", n,
             build ? build : "build", args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t len = fread(out, 1, sizeof out - 1, p);
    out[len] = 0;
    int st = pclose(p);
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    if (rc != 0 && !expect_failure)
        fprintf(stderr, "%s\n-> exit %d\n%s\n", cmd, rc, out);
    return rc;
}

/* Every rank printed "rank r: ok". */
static void assert_all_ok(int n)
{
    for (int r = 0; r < n; r++) {
        char want[32];
        snprintf(want, sizeof want, "rank %d: ok", r);
        assert_true(contains(out, want));
    }
}

static void matrix(int n, const char *env, const char *args)
{
    assert_int_equal(mpirun(n, env, args), 0);
    assert_all_ok(n);
    assert_true(contains(out, "ok 7")); /* 700+ cases ran */
}

static void test_names(void **state)
{
    (void)state;
    int found = 0;
    for (const char *const *n = ddp_pg_backend_names(); *n; n++)
        found += strcmp(*n, "mpi") == 0;
    assert_int_equal(found, 1);
}

static void test_matrix_1(void **state) { (void)state; matrix(1, "", "matrix"); }
static void test_matrix_2(void **state) { (void)state; matrix(2, "", sanitizer() ? "matrix" : "matrix big"); }
static void test_matrix_3(void **state) { (void)state; matrix(3, "", sanitizer() ? "matrix" : "matrix big"); }
static void test_matrix_4(void **state) { (void)state; matrix(4, "", "matrix"); }
static void test_matrix_5(void **state) { (void)state; matrix(5, "", "matrix"); }
static void test_matrix_8(void **state) { (void)state; matrix(8, "", "matrix"); }

/* Non-blocking MPI calls tested against the deadline. */
static void test_matrix_poll(void **state)
{
    (void)state;
    matrix(3, "DDP_MPI_PROGRESS=poll DDP_MPI_SPIN_US=100", "matrix");
}

static void test_async(void **state)
{
    (void)state;
    assert_int_equal(mpirun(3, "", "async"), 0);
    assert_all_ok(3);
    assert_int_equal(mpirun(2, "DDP_MPI_PROGRESS=poll", "async"), 0);
    assert_all_ok(2);
    assert_int_equal(mpirun(2, "DDP_MPI_THREAD=multiple", "async"), 0);
    assert_all_ok(2);
    /* Rank 0 alone asks for poll mode: the group agrees on it, no hang. */
    assert_int_equal(mpirun(3, "", "mixed"), 0);
    assert_all_ok(3);
}

static void test_subgroup(void **state)
{
    (void)state;
    assert_int_equal(mpirun(5, "", "subgroup"), 0);
    assert_all_ok(5);
    assert_int_equal(mpirun(1, "", "subgroup"), 0);
    assert_all_ok(1);
    /* Full thread level: every group makes blocking calls. */
    assert_int_equal(mpirun(3, "DDP_MPI_THREAD=multiple", "subgroup"), 0);
    assert_all_ok(3);
}

static void test_rank_mismatch(void **state)
{
    (void)state;
    assert_int_equal(mpirun(2, "", "mismatch"), 0);
    assert_true(contains(out, "size: DDP_ERR_MISMATCH: "));
    assert_true(contains(out, "world size 99 given, but MPI has 2 processes"));
    assert_true(contains(out, "rank: DDP_ERR_MISMATCH: "));
    assert_true(contains(out, "rank 7 given, but MPI says this process is rank 1 of 2"));
    assert_all_ok(2); /* and the next init, with MPI's view, works */
}

static void test_bad_progress(void **state)
{
    (void)state;
    expect_failure = 1;
    int rc = mpirun(1, "DDP_MPI_PROGRESS=spin", "async");
    expect_failure = 0;
    assert_int_not_equal(rc, 0);
    assert_true(contains(out, "DDP_MPI_PROGRESS=spin: expected blocking or poll"));
    expect_failure = 1;
    rc = mpirun(1, "DDP_MPI_THREAD=single", "async");
    expect_failure = 0;
    assert_int_not_equal(rc, 0);
    assert_true(contains(out, "DDP_MPI_THREAD=single: expected serialized or multiple"));
}

/* Rank 1 skips an all-reduce: rank 0 reports a timeout after the group's
 * 2 s, and the group stays failed. */
static void test_timeout(void **state)
{
    (void)state;
    expect_failure = 1; /* rank 0 leaves without MPI_Finalize: mpirun fails the job */
    mpirun(2, "DDP_MPI_PROGRESS=poll", "timeout");
    expect_failure = 0;
    assert_true(contains(out, "timeout: DDP_ERR_TIMEOUT after 2."));
    assert_true(contains(out, "all_reduce #0 (1 x float32) on rank 0"));
    assert_true(contains(out, "MPI_Iallreduce did not complete within 2.0 s"));
    assert_true(contains(out, "after: DDP_ERR_TIMEOUT: "));
    assert_true(contains(out, "process group already failed"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unknown_backend), cmocka_unit_test(test_names),
        cmocka_unit_test(test_matrix_1),        cmocka_unit_test(test_matrix_2),
        cmocka_unit_test(test_matrix_3),        cmocka_unit_test(test_matrix_4),
        cmocka_unit_test(test_matrix_5),        cmocka_unit_test(test_matrix_8),
        cmocka_unit_test(test_matrix_poll),     cmocka_unit_test(test_async),
        cmocka_unit_test(test_subgroup),        cmocka_unit_test(test_rank_mismatch),
        cmocka_unit_test(test_bad_progress),    cmocka_unit_test(test_timeout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
