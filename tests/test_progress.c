/* Tests of the training-report helpers of include/ddp/progress.h: the
 * progress bar (what it draws, where, how often, within the width; nothing
 * at all off a terminal) and the metrics file (every line parsed back with
 * base/json.c, the strict parser; bad names and unwritable paths refused
 * with their messages). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ddp.h"
#include "mnist_output.h"
#include "scratch_dir.h"

/* A bar drawing into a memory stream; *buf holds what it wrote after
 * fflush. */
static ddp_progress_t *memory_bar(int mode, int width, double interval, FILE **f, char **buf,
                                  size_t *len)
{
    *f = open_memstream(buf, len);
    assert_non_null(*f);
    ddp_progress_options o = ddp_progress_defaults();
    o.stream = *f;
    o.mode = mode;
    o.width = width;
    o.interval = interval;
    ddp_progress_t *p;
    assert_int_equal(ddp_progress_create(&o, &p), 0);
    return p;
}

static size_t count(const char *s, const char *what)
{
    size_t n = 0;
    for (const char *p = s; (p = strstr(p, what)) != NULL; p += strlen(what))
        n++;
    return n;
}

/* Each '\r'-drawn frame: at most width - 1 columns, erased to the end. */
static void check_frames(const char *out, int width)
{
    for (const char *p = strchr(out, '\r'); p; p = strchr(p + 1, '\r')) {
        size_t n = strcspn(p + 1, "\r\n\033");
        if (n > (size_t)width - 1)
            fail_msg("a frame of %zu columns at width %d: '%.*s'", n, width, (int)n, p + 1);
    }
}

static void test_bar_fields_and_redraws(void **state)
{
    (void)state;
    FILE *f;
    char *out;
    size_t len;
    /* interval 1 h: only the first and the last step draw, then end. */
    ddp_progress_t *p = memory_bar(DDP_PROGRESS_ON, 100, 3600, &f, &out, &len);
    assert_int_equal(ddp_progress_enabled(p), 1);
    assert_int_equal(ddp_progress_begin(p, "Epoch 1/2", 4), 0);
    for (size_t s = 1; s <= 4; s++) {
        usleep(20000);
        assert_int_equal(ddp_progress_update(p, s, s * 64, 0.25 * (double)s), 0);
    }
    assert_int_equal(ddp_progress_end(p), 0);
    fflush(f);
    assert_int_equal(count(out, "\r"), 3); /* step 1, step 4, end */
    assert_int_equal(count(out, "\n"), 1);
    /* 1 of 4: a quarter of the bar, then '>'; the end: all of it */
    const char *f1 = strstr(out, "\rEpoch 1/2 ["), *f4 = strstr(out, "=] 4/4  ");
    assert_non_null(f1);
    assert_non_null(f4);
    size_t cols = strcspn(f1, "]") - strlen("\rEpoch 1/2 [");
    size_t quarter = strspn(f1 + strlen("\rEpoch 1/2 ["), "=");
    if (cols < 10 || quarter != cols / 4 || f1[strlen("\rEpoch 1/2 [") + quarter] != '>')
        fail_msg("step 1 of 4 on a bar of %zu columns: '%.*s'", cols, (int)strcspn(f1 + 1, "\r"),
                 f1 + 1);
    assert_non_null(strstr(f1, "] 1/4  "));
    /* the bar keeps its width from frame to frame, whatever the numbers */
    for (const char *q = strchr(out, '\r'); q; q = strchr(q + 1, '\r'))
        if (strcspn(q, "]") != strcspn(f1, "]"))
            fail_msg("the bar changed width: '%s'", out);
    assert_non_null(strstr(out, " samples/s  loss 1.0000  ETA 0:00\033[K\n"));
    assert_null(strstr(out, "1.0000  ETA 0:00 ")); /* no padding after the ETA */
    /* the rate: 256 samples in about 80 ms (3.2k/s; at most 12.8k/s) */
    const char *r = strstr(out, "4/4  ");
    double rate = strtod(r + 5, NULL);
    if (!(rate > 100 && rate < 12800))
        fail_msg("rate %g samples/s from '%s'", rate, r);
    check_frames(out, 100);
    ddp_progress_destroy(p);
    fclose(f);
    free(out);
}

static void test_bar_fits_narrow_terminals(void **state)
{
    (void)state;
    int widths[] = {30, 60, 81};
    for (size_t i = 0; i < sizeof widths / sizeof *widths; i++) {
        FILE *f;
        char *out;
        size_t len;
        ddp_progress_t *p = memory_bar(DDP_PROGRESS_ON, widths[i], 0, &f, &out, &len);
        assert_int_equal(ddp_progress_begin(p, "Epoch 10/10", 100000), 0);
        for (size_t s = 1; s <= 100000; s += 33333)
            assert_int_equal(ddp_progress_update(p, s, s * 1000, 2.5), 0);
        assert_int_equal(ddp_progress_end(p), 0);
        fflush(f);
        check_frames(out, widths[i]);
        assert_non_null(strstr(out, "\rEpoch 10/10"));
        if (widths[i] >= 60)
            assert_non_null(strstr(out, "100000/100000"));
        ddp_progress_destroy(p);
        fclose(f);
        free(out);
    }
}

/* Off a terminal the bar is off: not a byte, whatever is called. */
static void test_bar_silent_off_a_terminal(void **state)
{
    (void)state;
    for (int mode = DDP_PROGRESS_AUTO; mode <= DDP_PROGRESS_OFF; mode += 2) {
        FILE *f;
        char *out;
        size_t len;
        ddp_progress_t *p = memory_bar(mode, 0, 0, &f, &out, &len);
        assert_int_equal(ddp_progress_enabled(p), 0);
        assert_int_equal(ddp_progress_begin(p, "Epoch 1/1", 3), 0);
        assert_int_equal(ddp_progress_update(p, 3, 3, 1.0), 0);
        assert_int_equal(ddp_progress_clear(p), 0);
        assert_int_equal(ddp_progress_end(p), 0);
        ddp_progress_destroy(p);
        fflush(f);
        assert_int_equal(len, 0);
        fclose(f);
        free(out);
    }
    /* AUTO on a pipe: isatty says no */
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    FILE *w = fdopen(fds[1], "w");
    ddp_progress_options o = ddp_progress_defaults();
    o.stream = w;
    ddp_progress_t *p;
    assert_int_equal(ddp_progress_create(&o, &p), 0);
    assert_int_equal(ddp_progress_enabled(p), 0);
    ddp_progress_destroy(p);
    fclose(w);
    close(fds[0]);
}

/* clear erases the bar; the next update draws it again, even within the
 * interval; destroy ends an open bar's line. */
static void test_bar_clear_and_destroy(void **state)
{
    (void)state;
    FILE *f;
    char *out;
    size_t len;
    ddp_progress_t *p = memory_bar(DDP_PROGRESS_ON, 80, 3600, &f, &out, &len);
    assert_int_equal(ddp_progress_update(p, 1, 1, 1.0), DDP_ERR_STATE);
    assert_non_null(strstr(ddp_last_error(), "progress: update before ddp_progress_begin"));
    assert_int_equal(ddp_progress_begin(p, "E", 10), 0);
    assert_int_equal(ddp_progress_update(p, 1, 1, 1.0), 0);
    assert_int_equal(ddp_progress_update(p, 2, 2, 1.0), 0); /* within the interval */
    assert_int_equal(ddp_progress_clear(p), 0);
    fputs("a line of the program's\n", f);
    assert_int_equal(ddp_progress_update(p, 3, 3, 1.0), 0);
    ddp_progress_destroy(p);
    fflush(f);
    assert_null(strstr(out, " 2/10 "));
    const char *c = strstr(out, "\r\033[Ka line of the program's\n\rE [");
    if (!c || !strstr(c, " 3/10 ") || out[len - 1] != '\n')
        fail_msg("clear, print, redraw, end: '%s'", out);
    fclose(f);
    free(out);
}

static void test_bar_bad_options(void **state)
{
    (void)state;
    ddp_progress_options o = ddp_progress_defaults();
    ddp_progress_t *p = (ddp_progress_t *)&o;
    o.mode = 7;
    assert_int_equal(ddp_progress_create(&o, &p), DDP_ERR_INVALID_ARG);
    assert_null(p);
    assert_non_null(strstr(ddp_last_error(), "progress: mode 7 is not DDP_PROGRESS_AUTO"));
    o = ddp_progress_defaults();
    o.interval = NAN;
    assert_int_equal(ddp_progress_create(&o, &p), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "progress: interval nan s is not in 0..3600"));
    ddp_progress_destroy(NULL);
}

/* ---- the metrics file ------------------------------------------------------ */

/* Line k (from 0) of the file at path, parsed; NULL past the end. */
static ddp__json *file_record(const char *path, int k)
{
    char *text = slurp(path);
    ddp__json *v = record(text, k);
    free(text);
    return v;
}

static void test_metrics_records_parse_back(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    ddp_metrics_t *m;
    assert_int_equal(ddp_metrics_create(path, 0, &m), 0);
    ddp_metric train[] = {{"epoch", 1}, {"step", 100}, {"loss", 0.6123}, {"lr", 0.1},
                          {"samples_per_s", 41234.5}};
    assert_int_equal(ddp_metrics_write(m, "train", train, 5), 0);
    ddp_metric odd[] = {
        {"x", NAN}, {"y", INFINITY}, {"big", 9007199254740991.0}, {"tiny", 1e-30}};
    assert_int_equal(ddp_metrics_write(m, "odd", odd, 4), 0);
    /* written and flushed at once: readable while the file is open */
    ddp__json *r = file_record(path, 0);
    assert_non_null(r);
    assert_int_equal(r->len, 7);
    assert_string_equal(r->child->key, "kind"); /* kind, then wall_s, then the fields */
    assert_string_equal(ddp__json_get(r, "kind")->str, "train");
    assert_string_equal(r->child->next->key, "wall_s");
    double wall = num(r, "wall_s");
    assert_true(wall >= 0 && wall < 60);
    assert_true(num(r, "epoch") == 1 && num(r, "step") == 100);
    assert_true(fabs(num(r, "loss") - 0.6123) < 1e-9 && num(r, "lr") == 0.1);
    assert_true(fabs(num(r, "samples_per_s") - 41234.5) < 1e-6);
    ddp__json_free(r);
    r = file_record(path, 1);
    assert_int_equal(ddp__json_get(r, "x")->type, DDP_JSON_NULL);
    assert_int_equal(ddp__json_get(r, "y")->type, DDP_JSON_NULL);
    const ddp__json *big = ddp__json_get(r, "big");
    assert_true(big->is_uint && big->u64 == 9007199254740991ull);
    assert_true(fabs(num(r, "tiny") / 1e-30 - 1) < 1e-8);
    ddp__json_free(r);
    ddp_metrics_destroy(m);
    /* append = 1 continues the file; 0 starts it again */
    assert_int_equal(ddp_metrics_create(path, 1, &m), 0);
    assert_int_equal(ddp_metrics_write(m, "eval", (ddp_metric[]){{"accuracy", 81.5}}, 1), 0);
    ddp_metrics_destroy(m);
    r = file_record(path, 2);
    assert_true(num(r, "accuracy") == 81.5);
    ddp__json_free(r);
    assert_int_equal(ddp_metrics_create(path, 0, &m), 0);
    assert_int_equal(ddp_metrics_write(m, "eval", NULL, 0), 0);
    ddp_metrics_destroy(m);
    r = file_record(path, 0);
    assert_int_equal(r->len, 2);
    ddp__json_free(r);
    assert_null(file_record(path, 1));
    ddp_metrics_destroy(NULL);
}

static void test_metrics_refuses_bad_names_and_paths(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/m.jsonl", dir);
    ddp_metrics_t *m;
    assert_int_equal(ddp_metrics_create(path, 0, &m), 0);
    struct {
        const char *kind, *name1, *name2, *msg;
    } cases[] = {
        {"", "a", "b", "metrics: kind '' is not 1 to 63 letters, digits or '_'"},
        {"tr\"ain", "a", "b", "metrics: kind 'tr\"ain' is not"},
        {"train", "lo ss", "b", "metrics: field 0's name 'lo ss' is not 1 to 63"},
        {"train", "a", "wall_s", "metrics: field name 'wall_s' is the record's own"},
        {"train", "kind", "b", "metrics: field name 'kind' is the record's own"},
        {"train", "a", "a", "metrics: field 'a' given twice"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ddp_metric f[] = {{cases[i].name1, 1}, {cases[i].name2, 2}};
        assert_int_equal(ddp_metrics_write(m, cases[i].kind, f, 2), DDP_ERR_INVALID_ARG);
        if (!strstr(ddp_last_error(), cases[i].msg))
            fail_msg("case %zu: '%s', expected '%s'", i, ddp_last_error(), cases[i].msg);
    }
    ddp_metrics_destroy(m);
    FILE *f = fopen(path, "r"); /* nothing written by the refused calls */
    assert_int_equal(fgetc(f), EOF);
    fclose(f);
    snprintf(path, sizeof path, "%s/none/m.jsonl", dir);
    m = (ddp_metrics_t *)path;
    assert_int_equal(ddp_metrics_create(path, 0, &m), DDP_ERR_IO);
    assert_null(m);
    char want[256];
    snprintf(want, sizeof want, "metrics file %s: No such file or directory", path);
    if (!strstr(ddp_last_error(), want))
        fail_msg("'%s', expected '%s'", ddp_last_error(), want);
    /* a full disk: the write that fails says so */
    assert_int_equal(ddp_metrics_create("/dev/full", 0, &m), 0);
    assert_int_equal(ddp_metrics_write(m, "train", NULL, 0), DDP_ERR_IO);
    assert_non_null(
        strstr(ddp_last_error(), "metrics file /dev/full: write: No space left on device"));
    ddp_metrics_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bar_fields_and_redraws),
        cmocka_unit_test(test_bar_fits_narrow_terminals),
        cmocka_unit_test(test_bar_silent_off_a_terminal),
        cmocka_unit_test(test_bar_clear_and_destroy),
        cmocka_unit_test(test_bar_bad_options),
        IN_SCRATCH(test_metrics_records_parse_back),
        IN_SCRATCH(test_metrics_refuses_bad_names_and_paths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
