/* Tests of ddp_launch_info_from_env: each launcher's variables, precedence,
 * and malformed values. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_none, clear_env),
        cmocka_unit_test_setup(test_torchrun, clear_env),
        cmocka_unit_test_setup(test_openmpi_and_slurm, clear_env),
        cmocka_unit_test_setup(test_malformed, clear_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
