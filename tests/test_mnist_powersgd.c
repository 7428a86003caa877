/* ddp-mnist --hidden and --powersgd: the MLP of --hidden has the layers
 * asked for, initialised as the library initialises them from --seed, and
 * trains; --powersgd on 2 ranks sends the floats PowerSGD's arithmetic
 * says ((rows + cols) x rank per compressed matrix, the rest as it is) and
 * ends with other weights than plain DDP, while a --powersgd-start beyond
 * the last step is plain DDP to 1e-6; a run restarted from a checkpoint
 * (PowerSGD's state in it) ends bitwise as the uninterrupted run; bad
 * values of the flags are refused with their messages. */
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

/* Runs world ranks of ddp-mnist by hand (file:// rendezvous; 1: alone)
 * with flags, rank 0 saving to dir/out; the exit status, output in *log. */
static int run_ranks(int world, const char *flags, const char *out, char **log)
{
    char cmd[8192], path[256];
    int n = snprintf(cmd, sizeof cmd, "timeout -k 5 300 sh -c '");
    for (int r = world - 1; r >= 0; r--) {
        char dist[512] = "";
        if (world > 1)
            snprintf(dist, sizeof dist, "--init-method file://%s/rdzv-%s --rank %d --world-size %d",
                     dir, out, r, world);
        n += snprintf(cmd + n, sizeof cmd - (size_t)n,
                      "%s --data %s --no-progress %s --save %s/%s %s %s", bin, dir, dist, dir,
                      out, flags, r ? "& " : "; s=$?; wait; exit $s");
    }
    snprintf(path, sizeof path, "%s/log-%s", dir, out);
    snprintf(cmd + n, sizeof cmd - (size_t)n, "' >%s 2>&1", path);
    int st = system(cmd);
    *log = slurp(path);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void write_data(void)
{
    fx_write_split(dir, "train", 0, 960, 28, 28, 10);
    fx_write_split(dir, "t10k", 0, 100, 28, 28, 10);
}

static void test_hidden_layers(void **state)
{
    (void)state;
    write_data();
    const int h[] = {32, 16};
    char *l0, *l1;
    const char *flags = "--hidden 32,16 --batch-size 32 --seed 3";
    if (run_ranks(1, "--hidden 32,16 --seed 3 --epochs 0", "init.safetensors", &l0) != 0)
        fail_msg("--epochs 0: %s", l0);
    if (run_ranks(1, flags, "trained.safetensors", &l1) != 0)
        fail_msg("--hidden 32,16: %s", l1);
    assert_non_null(strstr(l1, "Test accuracy: "));
    /* the shapes are those of 784-32-16-10 (a load of any other fails) and
     * the initial values those of the library's init from seed 3 */
    ddp_model_t *ref = mnist_mlp(h, 2), *init = mnist_mlp_load(dir, h, 2, "init.safetensors"),
                *trained = mnist_mlp_load(dir, h, 2, "trained.safetensors");
    assert_int_equal(ddp_model_reset_parameters(ref, 3), 0);
    assert_true(mnist_rel_diff(ref, init) == 0);
    double moved = mnist_rel_diff(init, trained);
    if (!(moved > 1e-3))
        fail_msg("training moved the weights by only %.3g", moved);
    ddp_model_destroy(ref);
    ddp_model_destroy(init);
    ddp_model_destroy(trained);
    free(l0);
    free(l1);
}

/* Floats one step sends with PowerSGD of rank r on 784-64-10, as
 * PyTorch's powerSGD_hook counts them: a matrix is compressed when
 * (rows + cols) r x 2 < rows cols, biases never. */
static double floats_per_step(int r, double *before)
{
    const int rows[] = {64, 10}, cols[] = {784, 64};
    double after = 64 + 10; /* the biases */
    *before = 64 + 10;
    for (int i = 0; i < 2; i++) {
        double full = (double)rows[i] * cols[i], low = (double)(rows[i] + cols[i]) * r;
        *before += full;
        after += low * 2 < full ? low : full;
    }
    return after;
}

static void test_powersgd_two_ranks(void **state)
{
    (void)state;
    write_data();
    const int h[] = {64};
    const char *common = "--hidden 64 --epochs 2 --batch-size 32 --lr 0.05 --seed 7";
    char flags[512], *ld, *lp, *ll;
    if (run_ranks(2, common, "ddp.safetensors", &ld) != 0)
        fail_msg("plain DDP: %s", ld);
    snprintf(flags, sizeof flags, "%s --powersgd 2 --powersgd-start 4", common);
    if (run_ranks(2, flags, "psgd.safetensors", &lp) != 0)
        fail_msg("--powersgd 2: %s", lp);
    snprintf(flags, sizeof flags, "%s --powersgd 2 --powersgd-start 1000", common);
    if (run_ranks(2, flags, "late.safetensors", &ll) != 0)
        fail_msg("--powersgd-start 1000: %s", ll);
    /* 960 samples / 2 ranks / 32 = 15 steps an epoch, 30 in all, 4 plain */
    double before, after = floats_per_step(2, &before);
    char want[256];
    snprintf(want, sizeof want, "PowerSGD: 26 compressed steps, %.0f of %.0f gradient floats sent",
             26 * after, 26 * before);
    if (!strstr(lp, want))
        fail_msg("want '%s' in: %s", want, lp);
    assert_non_null(strstr(ll, "PowerSGD: 0 compressed steps, 0 of 0 gradient floats sent"));
    ddp_model_t *md = mnist_mlp_load(dir, h, 1, "ddp.safetensors"), *mp = mnist_mlp_load(dir, h, 1, "psgd.safetensors"),
                *ml = mnist_mlp_load(dir, h, 1, "late.safetensors");
    double late = mnist_rel_diff(md, ml), comp = mnist_rel_diff(md, mp);
    print_message("plain DDP against start 1000: %.3g, against PowerSGD rank 2: %.3g\n", late,
                  comp);
    if (late > 1e-6)
        fail_msg("--powersgd-start beyond the last step differs from DDP by %.3g", late);
    if (!(comp > 1e-4 && comp < 1))
        fail_msg("PowerSGD rank 2 differs from DDP by %.3g (want compressed, not diverged)",
                 comp);
    ddp_model_destroy(md);
    ddp_model_destroy(mp);
    ddp_model_destroy(ml);
    free(ld);
    free(lp);
    free(ll);
}

/* A resume from dir/D for EPOCHS epochs that must fail. */
static result failed_resume(const char *common, const char *d, int epochs)
{
    result r = sh("%s --standalone --nproc-per-node 2 %s %s --epochs %d --checkpoint-dir %s/%s "
                  "--resume",
                  ddprun, bin, common, epochs, dir, d);
    assert_int_not_equal(r.status, 0);
    return r;
}

/* Whether dir/A.safetensors and dir/B.safetensors are the same bytes. */
static void assert_same_weights(const char *a, const char *b, const char *what)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cmp -s %s/%s.safetensors %s/%s.safetensors", dir, a, dir, b);
    if (system(cmd) != 0) {
        const int h[] = {64};
        char fa[64], fb[64];
        snprintf(fa, sizeof fa, "%s.safetensors", a);
        snprintf(fb, sizeof fb, "%s.safetensors", b);
        ddp_model_t *ma = mnist_mlp_load(dir, h, 1, fa), *mb = mnist_mlp_load(dir, h, 1, fb);
        fail_msg("%s: the weights differ by %.3g", what, mnist_rel_diff(ma, mb));
    }
}

/* A resume from dir/D for EPOCHS epochs: it starts at AT ("epoch E, step
 * S") and ends with the weights of dir/REF.safetensors. */
static void resume_equals(const char *common, const char *d, int epochs, const char *at,
                          const char *ref, const char *what)
{
    result r = sh("%s --standalone --nproc-per-node 2 %s %s --epochs %d --checkpoint-dir %s/%s "
                  "--resume --save %s/resumed.safetensors",
                  ddprun, bin, common, epochs, dir, d, dir);
    char want[128];
    snprintf(want, sizeof want, "/checkpoint.safetensors: %s", at);
    if (r.status != 0 || !strstr(r.out, want))
        fail_msg("%s: exit %d, want a resume from %s: %s", what, r.status, at, r.out);
    free(r.out);
    assert_same_weights(ref, "resumed", what);
}

/* The PowerSGD state files in dir/D: exactly one per rank, of step STEP. */
static void assert_states_of(const char *d, int step)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "cd %s/%s && test \"$(ls | grep -c powersgd)\" = 2 && "
             "test -f checkpoint.safetensors.powersgd.step%d.rank0 && "
             "test -f checkpoint.safetensors.powersgd.step%d.rank1",
             dir, d, step, step);
    if (system(cmd) != 0) {
        snprintf(cmd, sizeof cmd, "ls %s/%s | tr '\\n' ' '", dir, d);
        result l = sh("%s", cmd);
        fail_msg("want the states of step %d alone in %s: %s", step, d, l.out);
    }
}

/* Checkpoints carry every rank's PowerSGD state (its error feedback, Q,
 * the iteration, the generator), named after the checkpoint's step: under
 * ddprun, rank 1 killed at global step 22 of 30 and the group restarted
 * resumes from step 20 (epoch 2, step 5; compressed since step 4) and
 * ends with the uninterrupted run's weights, bitwise; every save removed
 * the older states.  A save cut off between the states and the checkpoint
 * (states of step 32 there, garbage here; the checkpoint still step 28's)
 * does not disturb the resume: it reads step 28's and ends as the
 * uninterrupted run.  A save that fails on either side (rank 1's state,
 * rank 0's checkpoint) stops every rank and leaves the checkpoint before it
 * resumable.  A damaged or missing state, or one of another step under the
 * checkpoint's name, is refused with a message naming it. */
static void test_powersgd_restart_resumes_bitwise(void **state)
{
    (void)state;
    write_data();
    char common[512];
    snprintf(common, sizeof common,
             "--data %s --no-progress --hidden 64 --batch-size 32 --lr 0.05 --seed 7 "
             "--powersgd 2 --powersgd-start 4 --checkpoint-every 4",
             dir);
    for (int e = 2; e <= 3; e++) {
        result a = sh("%s --standalone --nproc-per-node 2 %s %s --epochs %d --checkpoint-dir "
                      "%s/ca%d --save %s/a%d.safetensors",
                      ddprun, bin, common, e, dir, e, dir, e);
        if (a.status != 0)
            fail_msg("uninterrupted, %d epochs: exit %d: %s", e, a.status, a.out);
        free(a.out);
    }
    result b = sh("%s --standalone --nproc-per-node 2 --max-restarts 1 %s %s --epochs 2 "
                  "--checkpoint-dir %s/cb --crash-at-step 22 --save %s/b.safetensors",
                  ddprun, bin, common, dir, dir);
    if (b.status != 0)
        fail_msg("restarted: exit %d: %s", b.status, b.out);
    assert_non_null(strstr(b.out, "was killed by signal 9 (Killed); restarting the group"));
    if (!strstr(b.out, "/checkpoint.safetensors: epoch 2, step 5"))
        fail_msg("no resume from step 20: %s", b.out);
    assert_same_weights("a2", "b", "the resumed run against the uninterrupted one");
    assert_states_of("cb", 28);

    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "cd %s/cb && head -c 4096 /dev/urandom >checkpoint.safetensors.powersgd.step32.rank0 "
             "&& cp checkpoint.safetensors.powersgd.step32.rank0 "
             "checkpoint.safetensors.powersgd.step32.rank1",
             dir);
    assert_int_equal(system(cmd), 0);
    resume_equals(common, "cb", 3, "epoch 2, step 13", "a3", "the resume beside a cut-off save");
    assert_states_of("cb", 44);

    /* rank 1 cannot write its state of step 24 (a folder where its file
     * goes): every rank stops before rank 0 replaces the step-20
     * checkpoint, which then resumes as the uninterrupted run */
    snprintf(cmd, sizeof cmd, "mkdir -p %s/cf/checkpoint.safetensors.powersgd.step24.rank1.tmp",
             dir);
    assert_int_equal(system(cmd), 0);
    result f = sh("%s --standalone --nproc-per-node 2 %s %s --epochs 2 --checkpoint-dir %s/cf",
                  ddprun, bin, common, dir);
    if (f.status == 0 || !strstr(f.out, "rank 1: ") ||
        !strstr(f.out, "cannot create ") ||
        !strstr(f.out, "checkpoint.safetensors.powersgd.step24.rank1.tmp: Is a directory") ||
        !strstr(f.out, "rank 0: another rank could not write its part of the checkpoint"))
        fail_msg("want the failed save to stop every rank: exit %d: %s", f.status, f.out);
    snprintf(cmd, sizeof cmd, "rmdir %s/cf/checkpoint.safetensors.powersgd.step24.rank1.tmp",
             dir);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd,
             "cd %s/cf && test -f checkpoint.safetensors.powersgd.step20.rank0 && "
             "test -f checkpoint.safetensors.powersgd.step20.rank1",
             dir);
    assert_int_equal(system(cmd), 0); /* the step-20 checkpoint's states stay */
    resume_equals(common, "cf", 2, "epoch 2, step 5", "a2", "the resume after a failed save");

    /* rank 0 cannot write the checkpoint itself (its temporary name taken)
     * at step 32, after every rank wrote its state of that step: every
     * rank stops, rank 1 saying why; the step-28 checkpoint and its states
     * stay, and resume as the uninterrupted run */
    snprintf(cmd, sizeof cmd, "cp -r %s/ca2 %s/cg && mkdir %s/cg/checkpoint.safetensors.tmp", dir,
             dir, dir);
    assert_int_equal(system(cmd), 0);
    result g = failed_resume(common, "cg", 3);
    if (!strstr(g.out, "rank 0: ") || !strstr(g.out, "checkpoint.safetensors.tmp") ||
        !strstr(g.out, "rank 1: rank 0 could not write the checkpoint ") ||
        !strstr(g.out, "/cg/checkpoint.safetensors: stopping"))
        fail_msg("want rank 0's failed save to stop every rank: exit %d: %s", g.status, g.out);
    snprintf(cmd, sizeof cmd,
             "rmdir %s/cg/checkpoint.safetensors.tmp && cd %s/cg && "
             "test -f checkpoint.safetensors.powersgd.step28.rank0 && "
             "test -f checkpoint.safetensors.powersgd.step28.rank1",
             dir, dir);
    assert_int_equal(system(cmd), 0);
    resume_equals(common, "cg", 3, "epoch 2, step 13", "a3",
                  "the resume after rank 0's failed save");
    assert_states_of("cg", 44);

    /* rank 0's state cut short, rank 1's gone: the resume stops, naming them */
    snprintf(cmd, sizeof cmd, "truncate -s 10 %s/cb/checkpoint.safetensors.powersgd.step44.rank0",
             dir);
    assert_int_equal(system(cmd), 0);
    result t = failed_resume(common, "cb", 2);
    if (!strstr(t.out, "rank 0: ") ||
        !strstr(t.out, "/cb/checkpoint.safetensors.powersgd.step44.rank0: ") ||
        !strstr(t.out, "powersgd state: not a PowerSGD state (10 bytes)") ||
        !strstr(t.out, "rank 1: another rank could not load its PowerSGD state: stopping"))
        fail_msg("want the damaged state named: %s", t.out);
    snprintf(cmd, sizeof cmd, "rm %s/cb/checkpoint.safetensors.powersgd.step44.rank1", dir);
    assert_int_equal(system(cmd), 0);
    result c = failed_resume(common, "cb", 2);
    if (!strstr(c.out, "rank 1: the checkpoint ") ||
        !strstr(c.out, "(step 44) has no PowerSGD state for this rank: ") ||
        !strstr(c.out,
                "/cb/checkpoint.safetensors.powersgd.step44.rank1: No such file or directory"))
        fail_msg("want the missing state named: %s", c.out);

    /* step 28's states (run a2's) under the name of a step-44 checkpoint
     * (run a3's): refused, naming both steps */
    snprintf(cmd, sizeof cmd,
             "cd %s && for r in 0 1; do cp ca2/checkpoint.safetensors.powersgd.step28.rank$r "
             "ca3/checkpoint.safetensors.powersgd.step44.rank$r || exit 1; done",
             dir);
    assert_int_equal(system(cmd), 0);
    result m = failed_resume(common, "ca3", 2);
    if (!strstr(m.out, "/ca3/checkpoint.safetensors.powersgd.step44.rank0 holds PowerSGD's "
                       "state after step 28, not the checkpoint's step 44"))
        fail_msg("want the state of another step refused: %s", m.out);
    free(b.out);
    free(f.out);
    free(g.out);
    free(t.out);
    free(c.out);
    free(m.out);
}

static void test_bad_flags(void **state)
{
    (void)state;
    const char *cases[][2] = {
        {"--hidden 0", "--hidden: expected widths in 1..65536 separated by commas, got '0'"},
        {"--hidden 64,", "--hidden: expected widths in 1..65536 separated by commas, got '64,'"},
        {"--hidden 1,2,3,4,5,6,7,8,9", "--hidden: at most 8 layers, got '1,2,3,4,5,6,7,8,9'"},
        {"--hidden 64 --pipeline-stages 2", "--pipeline-stages does not support --hidden yet"},
        {"--powersgd 0", "--powersgd: expected an integer in 1..1024, got '0'"},
        {"--powersgd 4 --powersgd-start 1", "--powersgd-start: expected an integer in 2.."},
        {"--powersgd-start 10", "--powersgd-start needs --powersgd"},
        {"--powersgd 4 --zero 1", "--powersgd does not go with --zero yet"},
    };
    mnist_bad_flags(bin, dir, cases, sizeof cases / sizeof *cases);
}

int main(void)
{
    const char *build = getenv("DDP_TEST_BUILD");
    build = build && *build ? build : "build";
    snprintf(bin, sizeof bin, "%s/bin/ddp-mnist", build);
    snprintf(ddprun, sizeof ddprun, "%s/bin/ddprun", build);
    const struct CMUnitTest tests[] = {
        IN_SCRATCH(test_hidden_layers),
        IN_SCRATCH(test_powersgd_two_ranks),
        IN_SCRATCH(test_powersgd_restart_resumes_bitwise),
        IN_SCRATCH(test_bad_flags),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
