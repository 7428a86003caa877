/* ddp-mnist --zero 1|2: the same training with the optimizer state (and at
 * stage 2 the gradients) sharded over the ranks ends with the weights of
 * plain ddp-mnist to 1e-6 (stage 1 bitwise; stage 2 bitwise on 2 ranks,
 * docs/zero.md says why), on 2 ranks (an even partition: one in-place
 * all-gather) and on 3 (a short last shard: broadcasts); bad values of the
 * flag are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "data_fixture.h"
#include "ddp.h"
#include "mnist_output.h"
#include "mnist_model.h"
#include "scratch_dir.h"
#include "run_logged.h"

static char bin[1024], ddprun[1024];

/* Runs world ranks of ddp-mnist by hand (file:// rendezvous) with flags,
 * rank 0 saving to dir/out; returns the exit status, output in *log. */
static int run_ranks(int world, const char *flags, const char *out, char **log)
{
    char cmd[8192], path[256];
    int n = snprintf(cmd, sizeof cmd, "timeout -k 5 300 sh -c '");
    for (int r = world - 1; r >= 0; r--)
        n += snprintf(cmd + n, sizeof cmd - (size_t)n,
                      "%s --data %s --no-progress --init-method file://%s/rdzv-%s --rank %d "
                      "--world-size %d --save %s/%s %s %s",
                      bin, dir, dir, out, r, world, dir, out, flags, r ? "& " : "; s=$?; wait; exit $s");
    snprintf(path, sizeof path, "%s/log-%s", dir, out);
    snprintf(cmd + n, sizeof cmd - (size_t)n, "' >%s 2>&1", path);
    int st = system(cmd);
    *log = slurp(path);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_zero_matches_ddp(void **state)
{
    (void)state;
    fx_write_split(dir, "train", 0, 960, 28, 28, 10);
    fx_write_split(dir, "t10k", 0, 100, 28, 28, 10);
    const char *common = "--epochs 2 --batch-size 32 --momentum 0.9 --lr 0.05 --seed 5";
    for (int k = 0; k < 4; k++) {
        int world = 2 + k % 2, stage = 1 + k / 2;
        char flags[256], a[32], b[32], *la, *lb;
        snprintf(a, sizeof a, "ddp%d.safetensors", world);
        snprintf(b, sizeof b, "zero%d-%d.safetensors", stage, world);
        if (run_ranks(world, common, a, &la) != 0)
            fail_msg("ddp-mnist on %d ranks: %s", world, la);
        snprintf(flags, sizeof flags, "%s --zero %d", common, stage);
        if (run_ranks(world, flags, b, &lb) != 0)
            fail_msg("ddp-mnist --zero %d on %d ranks: %s", stage, world, lb);
        assert_non_null(strstr(lb, "Test accuracy: "));
        assert_non_null(strstr(lb, "Throughput: "));
        const int hidden[1] = {256};
        ddp_model_t *ma = mnist_mlp_load(dir, hidden, 1, a),
                    *mb = mnist_mlp_load(dir, hidden, 1, b);
        double d = mnist_rel_diff(ma, mb);
        assert_true(isfinite(d)); /* rank 0 saved real weights */
        if (d > 1e-6)
            fail_msg("%d ranks: --zero %d differs from DDP by %.3g (relative)", world, stage, d);
        print_message("--zero %d on %d ranks: relative difference %.3g\n", stage, world, d);
        ddp_model_destroy(ma);
        ddp_model_destroy(mb);
        free(la);
        free(lb);
    }
}

/* Sharded checkpoints under ddprun: rank 1 killed at global step 22 and the
 * group restarted resumes from step 20 (every rank its shard, 2 ranks x 15
 * steps an epoch: epoch 2, step 5) and ends with the uninterrupted run's
 * weights, bitwise, at both stages. */
static void test_zero_restart_resumes_bitwise(void **state)
{
    (void)state;
    fx_write_split(dir, "train", 0, 960, 28, 28, 10);
    fx_write_split(dir, "t10k", 0, 100, 28, 28, 10);
    for (int stage = 1; stage <= 2; stage++) {
        char common[512];
        snprintf(common, sizeof common,
                 "--data %s --no-progress --epochs 2 --batch-size 32 --momentum 0.9 --lr 0.05 "
                 "--seed 5 --checkpoint-every 4 --zero %d",
                 dir, stage);
        result a = sh("%s --standalone --nproc-per-node 2 %s %s --checkpoint-dir %s/ca%d "
                      "--save %s/a%d.safetensors",
                      ddprun, bin, common, dir, stage, dir, stage);
        if (a.status != 0)
            fail_msg("--zero %d uninterrupted: exit %d: %s", stage, a.status, a.out);
        result b = sh("%s --standalone --nproc-per-node 2 --max-restarts 1 %s %s "
                      "--checkpoint-dir %s/cb%d --crash-at-step 22 --save %s/b%d.safetensors",
                      ddprun, bin, common, dir, stage, dir, stage);
        if (b.status != 0)
            fail_msg("--zero %d restarted: exit %d: %s", stage, b.status, b.out);
        assert_non_null(strstr(b.out, "was killed by signal 9 (Killed); restarting the group"));
        if (!strstr(b.out, "/zero-latest: epoch 2, step 5 (saved by 2 ranks)"))
            fail_msg("--zero %d: no resume from step 20: %s", stage, b.out);
        char fa[32], fb[32];
        snprintf(fa, sizeof fa, "a%d.safetensors", stage);
        snprintf(fb, sizeof fb, "b%d.safetensors", stage);
        if (!same_files(fa, fb))
            fail_msg("--zero %d: the resumed run's weights differ from the uninterrupted run's",
                     stage);
        free(a.out);
        free(b.out);
    }
}

/* A checkpoint of 2 ranks resumed on 3 (the load reshards): with nothing
 * left to train the weights are the saving run's, bitwise; with one more
 * epoch it trains on and evaluates. */
static void test_zero_resume_on_other_world_size(void **state)
{
    (void)state;
    fx_write_split(dir, "train", 0, 960, 28, 28, 10);
    fx_write_split(dir, "t10k", 0, 100, 28, 28, 10);
    char common[512];
    snprintf(common, sizeof common,
             "--data %s --no-progress --batch-size 32 --momentum 0.9 --lr 0.05 --seed 5 "
             "--checkpoint-every 5 --zero 2 --checkpoint-dir %s/c",
             dir, dir);
    result a = sh("%s --standalone --nproc-per-node 2 %s %s --epochs 1 --save %s/a.safetensors",
                  ddprun, bin, common, dir);
    if (a.status != 0)
        fail_msg("2 ranks: exit %d: %s", a.status, a.out);
    result b = sh("%s --standalone --nproc-per-node 3 %s %s --epochs 1 --resume "
                  "--save %s/b.safetensors",
                  ddprun, bin, common, dir);
    if (b.status != 0 || !strstr(b.out, "epoch 2, step 0 (saved by 2 ranks)"))
        fail_msg("3 ranks, nothing to train: exit %d: %s", b.status, b.out);
    assert_true(same_files("a.safetensors", "b.safetensors"));
    result c = sh("%s --standalone --nproc-per-node 3 %s %s --epochs 2 --resume", ddprun, bin,
                  common);
    if (c.status != 0 || !strstr(c.out, "(saved by 2 ranks)") || accuracy(c.out) < 0)
        fail_msg("3 ranks, one more epoch: exit %d: %s", c.status, c.out);
    /* its own checkpoints: 3 ranks' shards, the link on the newest */
    result d = sh("%s --standalone --nproc-per-node 2 %s %s --epochs 2 --resume", ddprun, bin,
                  common);
    if (d.status != 0 || !strstr(d.out, "epoch 3, step 0 (saved by 3 ranks)"))
        fail_msg("2 ranks again: exit %d: %s", d.status, d.out);
    free(a.out);
    free(b.out);
    free(c.out);
    free(d.out);
}

static void test_bad_zero_flag(void **state)
{
    (void)state;
    const char *cases[][2] = {{"--zero 3", "--zero"},
                              {"--zero x", "--zero"}};
    mnist_bad_flags(bin, dir, cases, sizeof cases / sizeof *cases);
}

int main(void)
{
    const char *build = getenv("DDP_TEST_BUILD");
    build = build && *build ? build : "build";
    snprintf(bin, sizeof bin, "%s/bin/ddp-mnist", build);
    snprintf(ddprun, sizeof ddprun, "%s/bin/ddprun", build);
    const struct CMUnitTest tests[] = {
        IN_SCRATCH(test_zero_matches_ddp),
        IN_SCRATCH(test_zero_restart_resumes_bitwise),
        IN_SCRATCH(test_zero_resume_on_other_world_size),
        IN_SCRATCH(test_bad_zero_flag),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
