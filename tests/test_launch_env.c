/* Tests of ddp_launch_info_from_env: each launcher's variables, precedence,
 * and malformed values. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ddp/base.h"

static const char *all_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "SLURM_PROCID",
    "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"};

static int clear_env(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof all_vars / sizeof *all_vars; i++)
        unsetenv(all_vars[i]);
    return 0;
}

static void test_none(void **state)
{
    (void)state;
    ddp_launch_info info;
    assert_int_equal(ddp_launch_info_from_env(&info), DDP_ERR_NOT_FOUND);
    assert_non_null(strstr(ddp_last_error(), "no launcher environment"));
}

static void test_torchrun(void **state)
{
    (void)state;
    setenv("RANK", "5", 1);
    setenv("WORLD_SIZE", "8", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "4", 1);
    setenv("SLURM_PROCID", "0", 1); /* ddprun inside srun: ddprun's values win */
    setenv("SLURM_STEP_NUM_TASKS", "2", 1);
    ddp_launch_info info;
    assert_int_equal(ddp_launch_info_from_env(&info), 0);
    assert_int_equal(info.rank, 5);
    assert_int_equal(info.world_size, 8);
    assert_int_equal(info.local_rank, 1);
    assert_int_equal(info.local_world_size, 4);
    assert_string_equal(info.source, "torchrun");
}

static void test_openmpi_and_slurm(void **state)
{
    (void)state;
    setenv("OMPI_COMM_WORLD_RANK", "3", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
    ddp_launch_info info;
    assert_int_equal(ddp_launch_info_from_env(&info), 0);
    assert_int_equal(info.rank, 3);
    assert_int_equal(info.local_rank, 1);
    assert_string_equal(info.source, "openmpi");
    clear_env(NULL);
    /* A batch script's shell (sbatch --ntasks 3) is not a task of a step. */
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NTASKS", "3", 1);
    assert_int_equal(ddp_launch_info_from_env(&info), DDP_ERR_NOT_FOUND);
    assert_non_null(strstr(ddp_last_error(), "SLURM_STEP_NUM_TASKS (srun)"));
    setenv("SLURM_PROCID", "2", 1);
    setenv("SLURM_STEP_NUM_TASKS", "3", 1); /* srun's task 2 of 3 */
    assert_int_equal(ddp_launch_info_from_env(&info), 0);
    assert_int_equal(info.rank, 2);
    assert_int_equal(info.world_size, 3);
    assert_int_equal(info.local_rank, 2); /* no SLURM_LOCALID: one node */
    assert_int_equal(info.local_world_size, 3);
    assert_string_equal(info.source, "slurm");
}

static void test_malformed(void **state)
{
    (void)state;
    ddp_launch_info info;
    setenv("RANK", "x1", 1);
    setenv("WORLD_SIZE", "2", 1);
    assert_int_equal(ddp_launch_info_from_env(&info), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "RANK=x1: expected an integer from 0 to 16777216"));
    setenv("RANK", "2", 1);
    assert_int_equal(ddp_launch_info_from_env(&info), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "RANK=2 is out of range for WORLD_SIZE=2"));
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "0", 1);
    assert_int_equal(ddp_launch_info_from_env(&info), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "WORLD_SIZE=0: world size must be >= 1"));
}

/* Half a launcher's environment is an error naming the missing half, not
 * "no launcher" (which trains alone and exits 0). */
static void test_partial(void **state)
{
    (void)state;
    ddp_launch_info info;
    static const struct {
        const char *set[2][2]; /* up to two NAME=value pairs */
        const char *message;
    } cases[] = {
        {{{"RANK", "1"}, {NULL, NULL}},
         "partial launcher environment: RANK=1 is set but WORLD_SIZE is not (torchrun sets both"},
        {{{"WORLD_SIZE", "4"}, {NULL, NULL}},
         "partial launcher environment: WORLD_SIZE=4 is set but RANK is not"},
        {{{"RANK", "1"}, {"WORLD_SIZE", "2"}}, NULL}, /* whole: fine without the local pair */
        {{{"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}},
         "LOCAL_RANK=0 is set but RANK and WORLD_SIZE are not"},
        {{{"OMPI_COMM_WORLD_RANK", "1"}, {NULL, NULL}},
         "OMPI_COMM_WORLD_RANK=1 is set but OMPI_COMM_WORLD_SIZE is not (openmpi sets both"},
        {{{"PMI_SIZE", "3"}, {NULL, NULL}}, "PMI_SIZE=3 is set but PMI_RANK is not"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        clear_env(NULL);
        for (int k = 0; k < 2; k++)
            if (cases[i].set[k][0])
                setenv(cases[i].set[k][0], cases[i].set[k][1], 1);
        int rc = ddp_launch_info_from_env(&info);
        if (!cases[i].message) {
            assert_int_equal(rc, 0);
            continue;
        }
        if (rc != DDP_ERR_INVALID_ARG || !strstr(ddp_last_error(), cases[i].message))
            fail_msg("case %zu: rc %d, \"%s\"", i, rc, ddp_last_error());
    }
    /* The local pair in halves, with the global one whole. */
    clear_env(NULL);
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("LOCAL_RANK", "1", 1);
    assert_int_equal(ddp_launch_info_from_env(&info), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "LOCAL_RANK=1 is set but LOCAL_WORLD_SIZE is not"));
    /* An empty value is unset: RANK= alone is no launcher at all. */
    clear_env(NULL);
    setenv("RANK", "", 1);
    assert_int_equal(ddp_launch_info_from_env(&info), DDP_ERR_NOT_FOUND);
    /* Slurm's pairs are not whole by nature (a batch shell has SLURM_PROCID
     * alone): tested in test_openmpi_and_slurm. */
}

/* ddp-mnist with RANK but no WORLD_SIZE: exits non-zero with that message
 * instead of training alone. */
static void test_mnist_refuses_partial(void **state)
{
    (void)state;
    const char *build = getenv("DDP_TEST_BUILD");
    if (!build)
        skip();
    char out[64], cmd[1024];
    snprintf(out, sizeof out, "/tmp/ddp-test-launch-%d.txt", (int)getpid());
    snprintf(cmd, sizeof cmd, "env -u WORLD_SIZE RANK=1 %s/bin/ddp-mnist --epochs 1 >%s 2>&1",
             build, out);
    int st = system(cmd);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) != 0);
    char text[4096] = {0};
    FILE *f = fopen(out, "r");
    assert_non_null(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    unlink(out);
    if (!strstr(text, "RANK=1 is set but WORLD_SIZE is not"))
        fail_msg("ddp-mnist said: %s", text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_none, clear_env),
        cmocka_unit_test_setup(test_torchrun, clear_env),
        cmocka_unit_test_setup(test_openmpi_and_slurm, clear_env),
        cmocka_unit_test_setup(test_malformed, clear_env),
        cmocka_unit_test_setup(test_partial, clear_env),
        cmocka_unit_test_setup(test_mnist_refuses_partial, clear_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
