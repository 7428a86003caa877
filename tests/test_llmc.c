/* ddp-llmc (examples/llmc: a hand-written MLP on the reducer) against
 * ddp-mnist (libddp's model, tape and DDP): from the same seed, data and
 * flags, on 1, 2 and 3 ranks (ddprun), a few hundred SGD steps with and
 * without momentum, the two --save files are byte for byte the same: every
 * weight bitwise equal. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "data_fixture.h"
#include "mnist_output.h"
#include "scratch_dir.h"

static char mnist[1024], llmc[1024], ddprun[1024];

/* Runs a shell command (at most 300 s), stdout and stderr to dir/log;
 * returns its exit status, and its output in *out (caller frees). */
static int sh(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sh(char **out, const char *fmt, ...)
{
    char cmd[8192], body[7000], log[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    snprintf(log, sizeof log, "%s/log", dir);
    snprintf(cmd, sizeof cmd, "timeout -k 5 300 sh -c '%s' >%s 2>&1", body, log);
    int st = system(cmd);
    *out = slurp(log);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Both programs, the same flags, world ranks; the files must match. */
static void same_weights(int world, const char *flags)
{
    char *out, launch[1200] = "";
    if (world > 1)
        snprintf(launch, sizeof launch, "%s --standalone --nproc-per-node %d", ddprun, world);
    int st = sh(&out, "%s %s --data %s --no-progress %s --save %s/m.safetensors", launch, mnist,
                dir, flags, dir);
    if (st != 0)
        fail_msg("ddp-mnist: exit %d: %s", st, out);
    free(out);
    st = sh(&out, "%s %s --data %s %s --save %s/l.safetensors", launch, llmc, dir, flags, dir);
    if (st != 0)
        fail_msg("ddp-llmc: exit %d: %s", st, out);
    char want[32];
    snprintf(want, sizeof want, world > 1 ? "on %d ranks" : "on %d rank", world);
    assert_non_null(strstr(out, want));
    free(out);
    st = sh(&out, "cmp %s/m.safetensors %s/l.safetensors", dir, dir);
    if (st != 0)
        fail_msg("%d rank(s), %s: the weights differ: %s", world, flags, out);
    free(out);
}

/* 6400 training images: 100 steps of 64 per epoch on one rank. */
static void write_data(void)
{
    fx_write_split(dir, "train", 0, 6400, 28, 28, 10);
    fx_write_split(dir, "t10k", 0, 100, 28, 28, 10);
}

static void test_bitwise_one_rank(void **state)
{
    (void)state;
    write_data();
    same_weights(1, "--epochs 3 --seed 5"); /* 300 steps */
    same_weights(1, "--epochs 2 --seed 1 --momentum 0.9 --lr 0.05 --batch-size 32");
}

static void test_bitwise_several_ranks(void **state)
{
    (void)state;
    write_data();
    same_weights(2, "--epochs 4 --seed 5"); /* 200 steps per rank */
    same_weights(2, "--epochs 3 --seed 2 --momentum 0.5 --batch-size 48");
    same_weights(3, "--epochs 3 --seed 4"); /* the ring's order: the same vector, the same bits */
}

int main(void)
{
    const char *build = getenv("DDP_TEST_BUILD");
    build = build ? build : "build";
    snprintf(mnist, sizeof mnist, "%s/bin/ddp-mnist", build);
    snprintf(llmc, sizeof llmc, "%s/bin/ddp-llmc", build);
    snprintf(ddprun, sizeof ddprun, "%s/bin/ddprun", build);
    const struct CMUnitTest tests[] = {
        IN_SCRATCH(test_bitwise_one_rank),
        IN_SCRATCH(test_bitwise_several_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
