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
#include "run_logged.h"

static char mnist[1024], llmc[1024], ddprun[1024];

/* Both programs, the same flags, world ranks; the files must match. */
static void same_weights(int world, const char *flags)
{
    char launch[1200] = "";
    if (world > 1)
        snprintf(launch, sizeof launch, "%s --standalone --nproc-per-node %d", ddprun, world);
    result r = sh("%s %s --data %s --no-progress %s --save %s/m.safetensors", launch, mnist, dir,
                  flags, dir);
    if (r.status != 0)
        fail_msg("ddp-mnist: exit %d: %s", r.status, r.out);
    free(r.out);
    r = sh("%s %s --data %s %s --save %s/l.safetensors", launch, llmc, dir, flags, dir);
    if (r.status != 0)
        fail_msg("ddp-llmc: exit %d: %s", r.status, r.out);
    char want[32];
    snprintf(want, sizeof want, world > 1 ? "on %d ranks" : "on %d rank", world);
    assert_non_null(strstr(r.out, want));
    free(r.out);
    r = sh("cmp %s/m.safetensors %s/l.safetensors", dir, dir);
    if (r.status != 0)
        fail_msg("%d rank(s), %s: the weights differ: %s", world, flags, r.out);
    free(r.out);
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
