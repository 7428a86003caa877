/* End-to-end tests of what ddp-mnist shows and records (issue 12): the
 * progress bar in a real terminal (a detached tmux session: its screen read
 * back with capture-pane, its raw bytes with pipe-pane), no bar in a pipe
 * (the log lines exactly, nothing else), and the --metrics file of a
 * 2-rank run under ddprun, every line parsed with base/json.c and checked
 * against what the program printed. */
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
#include <unistd.h>

#include "data_fixture.h"
#include "mnist_output.h"
#include "scratch_dir.h"

static char bin[1024], ddprun[1024];

/* Runs a shell command (at most 300 s); its exit status. */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char body[8192], cmd[8400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "timeout -k 5 300 sh -c '%s'", body);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A small data set: 200 training images (100 steps of 2), 50 test ones. */
static int setup(void **state)
{
    if (scratch_setup(state) < 0)
        return -1;
    fx_write_split(dir, "train", 0, 200, 28, 28, 10);
    fx_write_split(dir, "t10k", 0, 50, 28, 28, 10);
    return 0;
}


static size_t count(const char *s, const char *what)
{
    size_t n = 0;
    for (const char *p = s; (p = strstr(p, what)) != NULL; p += strlen(what))
        n++;
    return n;
}

/* The bar in a terminal: a tmux pane 100 columns wide (on a server of its
 * own, -L, so that no user's tmux is touched).  ddp-mnist waits for a file
 * before it starts, so that pipe-pane records its every byte. */
static void test_progress_bar_in_a_terminal(void **state)
{
    (void)state;
    if (system("command -v tmux >/dev/null 2>&1") != 0)
        skip(); /* tmux: scripts/install-deps.sh installs it */
    char tmux[128];
    snprintf(tmux, sizeof tmux, "tmux -L ddp-test-%d -f /dev/null", (int)getpid());
    int st = sh("%s new-session -d -s bar -x 100 -y 30 \"while [ ! -e %s/go ]; do sleep 0.05; "
                "done; %s --data %s --epochs 2 --batch-size 2; echo EXIT=\\$?; sleep 300\"",
                tmux, dir, bin, dir);
    assert_int_equal(st, 0);
    assert_int_equal(sh("%s pipe-pane -t bar \"cat >%s/raw\" && touch %s/go", tmux, dir, dir), 0);
    char *screen = strdup("");
    for (int i = 0; i < 1200 && !strstr(screen, "EXIT="); i++) {
        usleep(100000);
        free(screen);
        sh("%s capture-pane -p -t bar >%s/screen", tmux, dir);
        screen = slurp(fx_path(dir, "screen"));
    }
    sh("%s kill-server", tmux);
    char *raw = slurp(fx_path(dir, "raw"));
    if (!strstr(screen, "EXIT=0"))
        fail_msg("ddp-mnist in tmux did not finish with 0:\n%s", screen);
    /* On the screen: one line per epoch, at its final state, with every
     * field; no log lines; the rest as in a pipe. */
    for (int e = 1; e <= 2; e++) {
        char label[32];
        snprintf(label, sizeof label, "Epoch %d/2 [", e);
        const char *p = strstr(screen, label);
        if (!p || count(screen, label) != 1)
            fail_msg("not one bar line '%s' on the screen:\n%s", label, screen);
        size_t n = strcspn(p, "\n");
        char line[256];
        snprintf(line, sizeof line, "%.*s", (int)n, p);
        size_t cols = strcspn(line, "]") - strlen(label);
        int full = cols >= 10 && strspn(line + strlen(label), "=") == cols;
        if (!full || !strstr(line, "] 100/100  ") || !strstr(line, " samples/s  loss ") ||
            !strstr(line, "  ETA 0:00") || n > 99)
            fail_msg("bar line '%s' is not full, lacks a field or is over 99 columns", line);
        double loss = strtod(strstr(line, "loss ") + 5, NULL);
        assert_true(loss > 0 && loss < 10);
        double rate = strtod(strstr(line, "100/100 ") + 8, NULL);
        assert_true(rate > 0);
    }
    assert_null(strstr(screen, "Epoch [1/2], Step ["));
    assert_non_null(strstr(screen, "Loaded 200 training samples from "));
    assert_non_null(strstr(screen, "Throughput: "));
    assert_true(accuracy(screen) >= 0);
    /* In the bytes: drawn in place, each frame after a '\r', several frames
     * per epoch (the first step, the last, the end) and no line break
     * between the frames of an epoch. */
    for (int e = 1; e <= 2; e++) {
        char frame[32];
        snprintf(frame, sizeof frame, "\rEpoch %d/2 [", e);
        if (count(raw, frame) < 3)
            fail_msg("%zu frames of epoch %d in the terminal's bytes", count(raw, frame), e);
        const char *first = strstr(raw, frame), *last = first;
        for (const char *p = first; (p = strstr(p + 1, frame)) != NULL;)
            last = p;
        assert_true(memchr(first, '\n', (size_t)(last - first)) == NULL);
    }
    free(raw);
    free(screen);
}

/* Not a terminal: the log lines of always and nothing else, no '\r', no
 * escape sequence, no bar. */
static void test_no_bar_in_a_pipe(void **state)
{
    (void)state;
    assert_int_equal(sh("%s --data %s --epochs 2 --batch-size 2 | cat >%s/out", bin, dir, dir), 0);
    char *out = slurp(fx_path(dir, "out"));
    assert_null(strchr(out, '\r'));
    assert_null(strchr(out, '\033'));
    assert_null(strstr(out, "samples/s  loss"));
    static const char *const lines[] = {"Loaded 200 training samples from ",
                                        "Epoch [1/2], Step [100/100], Loss: ",
                                        "Epoch [2/2], Step [100/100], Loss: ", "Throughput: ",
                                        "Test accuracy: "};
    const char *p = out;
    for (size_t i = 0; i < sizeof lines / sizeof *lines; i++) {
        if (strncmp(p, lines[i], strlen(lines[i])) != 0)
            fail_msg("line %zu is not '%s...':\n%s", i + 1, lines[i], out);
        p = strchr(p, '\n');
        assert_non_null(p);
        p++;
    }
    if (*p)
        fail_msg("more than the log lines:\n%s", out);
    free(out);
}

/* The printed number after the first occurrence of prefix, -1 if none. */
static double printed(const char *out, const char *prefix)
{
    const char *p = strstr(out, prefix);
    return p ? strtod(p + strlen(prefix), NULL) : -1;
}

/* --metrics on 2 ranks, batch 1: each rank 100 steps an epoch, a train
 * record at each log line (step 100), an eval every 75 steps and at the
 * end; rank 0 alone writes, and the records say what the output said. */
static void test_metrics_file_of_two_ranks(void **state)
{
    (void)state;
    int st = sh("%s --standalone --nproc-per-node 2 %s --data %s --epochs 2 --batch-size 1 "
                "--metrics %s/m.jsonl --eval-every 75 >%s/out 2>&1",
                ddprun, bin, dir, dir, dir);
    char *out = slurp(fx_path(dir, "out")), *m = slurp(fx_path(dir, "m.jsonl"));
    if (st != 0)
        fail_msg("exit %d: %s", st, out);
    /* kind, epoch, global step of each record, in order */
    struct {
        const char *kind;
        int epoch, global;
    } want[] = {{"eval", 1, 75}, {"train", 1, 100}, {"eval", 2, 150},
                {"train", 2, 200}, {"eval", 2, 200}};
    size_t n = sizeof want / sizeof *want;
    assert_int_equal(count(m, "\n"), n);
    double wall = 0;
    for (size_t i = 0; i < n; i++) {
        ddp__json *r = record(m, (int)i);
        const ddp__json *kind = ddp__json_get(r, "kind");
        if (!kind || strcmp(kind->str, want[i].kind) || num(r, "epoch") != want[i].epoch ||
            num(r, "global_step") != want[i].global)
            fail_msg("record %zu: expected %s, epoch %d, step %d: %s", i + 1, want[i].kind,
                     want[i].epoch, want[i].global, m);
        assert_true(num(r, "wall_s") >= wall);
        wall = num(r, "wall_s");
        char prefix[96];
        if (!strcmp(want[i].kind, "train")) {
            assert_true(num(r, "step") == 100 && num(r, "lr") == 0.1);
            assert_true(num(r, "mean_loss") > 0 && num(r, "mean_loss") < 10);
            assert_true(num(r, "samples_per_s") > 0);
            snprintf(prefix, sizeof prefix, "Epoch [%d/2], Step [100/100], Loss: ", want[i].epoch);
            assert_true(fabs(num(r, "loss") - printed(out, prefix)) <= 0.00005);
        } else if (i + 1 < n) {
            snprintf(prefix, sizeof prefix, "Evaluation at step %d: test loss ", want[i].global);
            assert_true(fabs(num(r, "test_loss") - printed(out, prefix)) <= 0.00005);
            const char *acc = strstr(strstr(out, prefix), "accuracy ");
            assert_true(fabs(num(r, "accuracy") - strtod(acc + 9, NULL)) <= 0.005);
        } else {
            assert_true(fabs(num(r, "accuracy") - accuracy(out)) <= 0.005);
            assert_true(num(r, "test_loss") > 0);
        }
        ddp__json_free(r);
    }
    free(out);
    free(m);
}

/* An untrained model's test loss is about ln 10 on 10 balanced classes:
 * the record's cross-entropy is the one of the evaluation, not a slip. */
static void test_metrics_untrained_loss_near_ln10(void **state)
{
    (void)state;
    assert_int_equal(sh("%s --data %s --epochs 0 --metrics %s/m.jsonl >%s/out 2>&1", bin, dir, dir,
                        dir),
                     0);
    char *m = slurp(fx_path(dir, "m.jsonl"));
    ddp__json *r = record(m, 0);
    assert_non_null(r);
    assert_null(record(m, 1));
    assert_string_equal(ddp__json_get(r, "kind")->str, "eval");
    double loss = num(r, "test_loss");
    if (fabs(loss - log(10.0)) > 0.3)
        fail_msg("untrained test loss %g, expected about %g", loss, log(10.0));
    ddp__json_free(r);
    free(m);
}

int main(void)
{
    const char *build = getenv("DDP_TEST_BUILD");
    build = build && *build ? build : "build";
    snprintf(bin, sizeof bin, "%s/bin/ddp-mnist", build);
    snprintf(ddprun, sizeof ddprun, "%s/bin/ddprun", build);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_progress_bar_in_a_terminal, setup, scratch_teardown),
        cmocka_unit_test_setup_teardown(test_no_bar_in_a_pipe, setup, scratch_teardown),
        cmocka_unit_test_setup_teardown(test_metrics_file_of_two_ranks, setup, scratch_teardown),
        cmocka_unit_test_setup_teardown(test_metrics_untrained_loss_near_ln10, setup,
                                        scratch_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
