/* End-to-end tests of the reference program, build/bin/ddp-mnist
 * (examples/mnist/), run as a separate process from DDP_TEST_BUILD:
 * one epoch on Fashion-MNIST at batch 64, lr 0.1 must reach >= 82 % test
 * accuracy (PyTorch 1.13 gets 82.4 % with the same recipe); the output
 * format; identical losses for any number of loader workers; --save/--load;
 * and bad flags or data: one line on stderr, exit status 2. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cblas.h>
#include <sys/wait.h>

#include "base/cpu.h"
#include "data_fixture.h"
#include "mnist_output.h"

typedef struct run_result {
    int status;     /* exit status, or -1 if it did not exit normally */
    char *out, *err;
} run_result;

/* Runs ddp-mnist with args (a shell word list) in scratch folder dir. */
static run_result run(const char *dir, const char *args)
{
    const char *build = getenv("DDP_TEST_BUILD");
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s/bin/ddp-mnist' %s >'%s/out' 2>'%s/err'",
             build && *build ? build : "build", args, dir, dir);
    int st = system(cmd);
    run_result r = {WIFEXITED(st) ? WEXITSTATUS(st) : -1, NULL, NULL};
    r.out = slurp(fx_path(dir, "out"));
    r.err = slurp(fx_path(dir, "err"));
    return r;
}

static void run_free(run_result *r)
{
    free(r->out);
    free(r->err);
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* Lines of s that start with prefix, concatenated (for comparisons). */
static void lines_starting(const char *s, const char *prefix, char *dst, size_t cap)
{
    size_t used = 0;
    dst[0] = '\0';
    for (const char *p = s; p && *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p + 1) : strlen(p);
        if (strncmp(p, prefix, strlen(prefix)) == 0 && used + len < cap) {
            memcpy(dst + used, p, len);
            used += len;
            dst[used] = '\0';
        }
        p = nl ? nl + 1 : NULL;
    }
}

static void test_fashion_mnist_one_epoch(void **state)
{
    const char *dir = *state;
    char args[4200];
    snprintf(args, sizeof args, "--epochs 1 --batch-size 64 --lr 0.1 --save '%s/m.st'", dir);
    run_result r = run(dir, args);
    if (r.status != 0)
        fail_msg("exit %d: %s", r.status, r.err);
    print_message("%s", r.out);
    /* Steps 100, 200, ..., 900 of 938, each with a loss. */
    for (int i = 100; i <= 900; i += 100) {
        char want[64];
        snprintf(want, sizeof want, "Epoch [1/1], Step [%d/938], Loss: ", i);
        const char *p = strstr(r.out, want);
        if (!p)
            fail_msg("no line \"%s\" in:\n%s", want, r.out);
        double loss = strtod(p + strlen(want), NULL);
        assert_true(loss > 0.05 && loss < 2.5);
    }
    assert_null(strstr(r.out, "Step [1000/"));
    assert_non_null(strstr(r.out, "Throughput: "));
    assert_true(strtod(strstr(r.out, "Throughput: ") + 12, NULL) > 1000);
    double acc = accuracy(r.out);
    if (acc < 82.0)
        fail_msg("test accuracy %.2f %% < 82 %%", acc);
    assert_true(acc < 95.0); /* an MLP cannot do that: the parse went wrong */
    /* nothing on stderr but, where this machine's OpenBLAS fell back to
     * older kernels than the CPU runs, the library's one warning of it */
    char warning[512], want[600] = "";
    if (ddp__cpu_blas_warning(warning, sizeof warning, openblas_get_corename(),
                              ddp__cpu_features(), getenv("OPENBLAS_CORETYPE")))
        snprintf(want, sizeof want, "[ddp W] %s\n", warning);
    assert_string_equal(r.err, want);
    /* The saved parameters evaluate to the same accuracy. */
    run_result l;
    snprintf(args, sizeof args, "--epochs 0 --load '%s/m.st'", dir);
    l = run(dir, args);
    if (l.status != 0)
        fail_msg("--load: exit %d: %s", l.status, l.err);
    assert_true(accuracy(l.out) == acc);
    assert_null(strstr(l.out, "Throughput"));
    run_free(&l);
    run_free(&r);
}

/* A small generated data set: output identical for 0 and 3 workers except
 * the throughput; --no-shuffle changes the losses. */
static void test_deterministic_across_workers(void **state)
{
    const char *dir = *state;
    fx_write_split(dir, "train", 1, 800, 28, 28, 10);
    fx_write_split(dir, "t10k", 0, 100, 28, 28, 10);
    char args[4200], a[4096], b[4096], c[4096];
    snprintf(args, sizeof args, "--data '%s' --batch-size 4 --epochs 2 --seed 3 "
             "--momentum 0.9 --lr 0.01 --workers 0", dir);
    run_result r0 = run(dir, args);
    assert_int_equal(r0.status, 0);
    snprintf(args, sizeof args, "--data '%s' --batch-size 4 --epochs 2 --seed 3 "
             "--momentum 0.9 --lr 0.01 --workers 3", dir);
    run_result r3 = run(dir, args);
    assert_int_equal(r3.status, 0);
    snprintf(args, sizeof args, "--data '%s' --batch-size 4 --epochs 2 --seed 3 "
             "--momentum 0.9 --lr 0.01 --no-shuffle", dir);
    run_result rn = run(dir, args);
    assert_int_equal(rn.status, 0);
    lines_starting(r0.out, "Epoch [", a, sizeof a);
    lines_starting(r3.out, "Epoch [", b, sizeof b);
    lines_starting(rn.out, "Epoch [", c, sizeof c);
    /* 200 steps per epoch: lines at 100 and 200, two epochs. */
    assert_int_equal(count_lines(a), 4);
    assert_non_null(strstr(a, "Epoch [2/2], Step [200/200], Loss: "));
    assert_string_equal(a, b);
    assert_string_not_equal(a, c);
    assert_true(accuracy(r0.out) == accuracy(r3.out));
    run_free(&r0);
    run_free(&r3);
    run_free(&rn);
}

/* One line on stderr naming the problem, exit status 2, nothing on stdout
 * but what came before the problem was found.  before_training: and the
 * problem stopped the run before its first step (no loss, no throughput). */
static void expect_error(const char *dir, const char *args, const char *frag,
                         int before_training)
{
    run_result r = run(dir, args);
    if (r.status != 2)
        fail_msg("ddp-mnist %s: exit %d, expected 2 (stderr: %s)", args, r.status, r.err);
    if (!strstr(r.err, frag))
        fail_msg("ddp-mnist %s: stderr lacks \"%s\": %s", args, frag, r.err);
    assert_int_equal(count_lines(r.err), 1);
    assert_null(strstr(r.out, "Test accuracy"));
    if (before_training && (strstr(r.out, "Throughput: ") || strstr(r.out, "Epoch [")))
        fail_msg("ddp-mnist %s: trained before finding \"%s\": %s", args, frag, r.out);
    run_free(&r);
}

static void expect_usage_error(const char *dir, const char *args, const char *frag)
{
    expect_error(dir, args, frag, 0);
}

static void expect_found_before_training(const char *dir, const char *args, const char *frag)
{
    expect_error(dir, args, frag, 1);
}

static void test_bad_flags_and_data(void **state)
{
    const char *dir = *state;
    expect_usage_error(dir, "--bogus", "unknown option '--bogus'");
    expect_usage_error(dir, "--epochs abc", "--epochs: expected an integer in 0..1000000, "
                       "got 'abc'");
    expect_usage_error(dir, "--batch-size 0", "--batch-size: expected an integer in 1..");
    expect_usage_error(dir, "--lr -1", "--lr: expected a number in 0..1e6, got '-1'");
    expect_usage_error(dir, "--momentum x", "--momentum: expected a number");
    expect_usage_error(dir, "--workers 100", "--workers: expected an integer in 0..64");
    expect_usage_error(dir, "--seed", "option '--seed' needs a value");
    expect_usage_error(dir, "extra", "unexpected argument 'extra'");
    expect_usage_error(dir, "--data /nonexistent/fashion",
                       "data folder /nonexistent/fashion: No such file or directory");
    char args[4200];
    snprintf(args, sizeof args, "--data '%s'", dir);
    expect_usage_error(dir, args, "train-images-idx3-ubyte[.gz]: not found");
    /* A truncated labels file: named, with what is wrong. */
    fx_write_split(dir, "train", 0, 50, 28, 28, 10);
    uint8_t lb[20] = {0};
    uint32_t dims[1] = {50};
    fx_write_idx(dir, "train-labels-idx1-ubyte", 0, DDP_IDX_MAGIC_LABELS, 1, dims, lb, 20);
    expect_usage_error(dir, args, "train-labels-idx1-ubyte: truncated: header says 50 items, "
                       "file holds 20");
    /* Training data fine, the test split missing or broken: found before
     * the first step (no throughput line: nothing was trained). */
    fx_write_split(dir, "train", 0, 50, 28, 28, 10);
    expect_found_before_training(dir, args, "t10k-images-idx3-ubyte[.gz]: not found");
    fx_write_split(dir, "t10k", 1, 20, 28, 28, 10);
    uint32_t tdims[1] = {20};
    fx_write_idx(dir, "t10k-labels-idx1-ubyte.gz", 1, DDP_IDX_MAGIC_LABELS, 1, tdims, lb, 5);
    expect_found_before_training(dir, args, "t10k-labels-idx1-ubyte.gz: truncated: header says "
                                 "20 items, file holds 5");
    tdims[0] = 19;
    fx_write_idx(dir, "t10k-labels-idx1-ubyte.gz", 1, DDP_IDX_MAGIC_LABELS, 1, tdims, lb, 19);
    expect_found_before_training(dir, args, "t10k-images-idx3-ubyte.gz holds 20 images but ");
    fx_write(fx_path(dir, "t10k-images-idx3-ubyte.gz"), (const uint8_t *)"\x1f\x8bnot gzip", 10);
    expect_found_before_training(dir, args, "t10k-images-idx3-ubyte.gz: corrupt gzip data");
    fx_write_split(dir, "t10k", 1, 20, 14, 14, 10);
    expect_found_before_training(dir, args, "test images are not 28x28 (196 pixels each, "
                                 "expected 784)");
    /* Not 28x28. */
    fx_write_split(dir, "train", 0, 50, 14, 14, 10);
    expect_usage_error(dir, args, "training images are not 28x28");
    fx_write_split(dir, "t10k", 1, 20, 28, 28, 10);

    snprintf(args, sizeof args, "--epochs 0 --load '%s/none.st'", dir);
    expect_usage_error(dir, args, "none.st");
    /* A checkpoint of another model: the mismatch is named. */
    uint8_t junk[16] = {8, 0, 0, 0, 0, 0, 0, 0, '{', '}', ' ', ' ', ' ', ' ', ' ', ' '};
    fx_write(fx_path(dir, "empty.st"), junk, 16);
    snprintf(args, sizeof args, "--epochs 0 --load '%s/empty.st'", dir);
    expect_usage_error(dir, args, "missing 0.weight");
    run_result r;

    r = run(dir, "--help");
    assert_int_equal(r.status, 0);
    assert_non_null(strstr(r.out, "usage: ddp-mnist [options]"));
    assert_non_null(strstr(r.out, "--no-shuffle"));
    run_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        IN_TMPDIR(test_fashion_mnist_one_epoch),
        IN_TMPDIR(test_deterministic_across_workers),
        IN_TMPDIR(test_bad_flags_and_data),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
