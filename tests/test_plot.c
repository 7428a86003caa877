/* Tests of tools/ddp-plot: the PNG it writes is read back with cairo (the
 * library that drew it) and checked for its size and, pixel by pixel, for
 * each run's colour spread across both panels (a curve, not only its
 * legend swatch); bad input gets one line naming the file and line. */
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

#ifdef DDP_HAVE_CAIRO
#include <cairo.h>
#endif

#include "mnist_output.h"
#include "scratch_dir.h"


static char plot[1024];

/* dir/name (one at a time) */
static const char *in_dir(const char *name)
{
    static char buf[256];
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    return buf;
}


/* Runs ddp-plot with args; its exit status, its stderr in *err. */
static int run_plot(char **err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int run_plot(char **err, const char *fmt, ...)
{
    char args[2048], cmd[4096], log[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(log, sizeof log, "%s/err", dir);
    snprintf(cmd, sizeof cmd, "timeout 60 %s %s 2>%s", plot, args, log);
    int st = system(cmd);
    *err = slurp(log);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Two runs over steps 100..1000: train records every 100 steps, evals every
 * 200, values that differ between the runs. */
static void write_runs(void)
{
    for (int r = 0; r < 2; r++) {
        char path[128];
        snprintf(path, sizeof path, "%s/%s.jsonl", dir, r ? "two-ranks" : "one-rank");
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        for (int s = 100; s <= 1000; s += 100) {
            fprintf(f, "{\"kind\":\"train\",\"wall_s\":%d,\"epoch\":1,\"step\":%d,"
                       "\"global_step\":%d,\"loss\":%g,\"lr\":0.1}\n",
                    s / 100, s, s, 2.0 / (1 + s / 200.0) + 0.1 * r);
            if (s % 200 == 0)
                fprintf(f, "{\"kind\":\"eval\",\"wall_s\":%d,\"epoch\":1,\"global_step\":%d,"
                           "\"test_loss\":%g,\"accuracy\":%g}\n",
                        s / 100, s, 2.2 / (1 + s / 200.0), 60 + s / 50.0 - 3 * r);
            if (s == 500)
                fputs("\n{\"kind\":\"note\",\"text\":\"a kind of one's own\"}\n", f);
        }
        fclose(f);
    }
}

#ifdef DDP_HAVE_CAIRO
/* Columns of [x0, x1) x [y0, y1) that hold a pixel of colour rgb (within 8
 * per channel of it: anti-aliasing leaves the line's core exact). */
static int columns_with(cairo_surface_t *s, uint32_t rgb, int x0, int x1, int y0, int y1)
{
    const unsigned char *data = cairo_image_surface_get_data(s);
    int stride = cairo_image_surface_get_stride(s), n = 0;
    for (int x = x0; x < x1; x++)
        for (int y = y0; y < y1; y++) {
            uint32_t p = *(const uint32_t *)(data + (size_t)y * (size_t)stride + (size_t)x * 4);
            int dr = (int)((p >> 16) & 255) - (int)((rgb >> 16) & 255);
            int dg = (int)((p >> 8) & 255) - (int)((rgb >> 8) & 255);
            int db = (int)(p & 255) - (int)(rgb & 255);
            if (abs(dr) <= 8 && abs(dg) <= 8 && abs(db) <= 8 && (p >> 24) == 255) {
                n++;
                break;
            }
        }
    return n;
}
#endif

/* Wide: panels side by side; tall: one above the other.  Each run's
 * colour (the first two of the palette) fills a curve's span in each. */
static void test_png_size_and_curves(void **state)
{
    (void)state;
#ifndef DDP_HAVE_CAIRO
    print_message("skip: built without cairo (libcairo2-dev)\n");
    skip();
#else
    write_runs();
    const uint32_t colours[2] = {0x1f77b4, 0xff7f0e};
    const int sizes[2][2] = {{800, 360}, {420, 720}};
    for (int k = 0; k < 2; k++) {
        int w = sizes[k][0], h = sizes[k][1];
        char *err, png[128];
        snprintf(png, sizeof png, "%s/c%d.png", dir, k);
        int st = run_plot(&err, "%s/one-rank.jsonl %s/two-ranks.jsonl -o %s --width %d --height %d",
                          dir, dir, png, w, h);
        if (st != 0)
            fail_msg("exit %d: %s", st, err);
        assert_string_equal(err, "");
        free(err);
        cairo_surface_t *s = cairo_image_surface_create_from_png(png);
        if (cairo_surface_status(s) != CAIRO_STATUS_SUCCESS)
            fail_msg("%s: %s", png, cairo_status_to_string(cairo_surface_status(s)));
        assert_int_equal(cairo_image_surface_get_width(s), w);
        assert_int_equal(cairo_image_surface_get_height(s), h);
        cairo_surface_flush(s);
        for (int c = 0; c < 2; c++) {
            /* the two panels' halves; a panel's data span is over a third
             * of the image's side, the legend's swatch 24 pixels */
            int a = k == 0 ? columns_with(s, colours[c], 0, w / 2, 0, h)
                           : columns_with(s, colours[c], 0, w, 0, h / 2);
            int b = k == 0 ? columns_with(s, colours[c], w / 2, w, 0, h)
                           : columns_with(s, colours[c], 0, w, h / 2, h);
            int need = k == 0 ? w / 6 : w / 3;
            if (a < need || b < need)
                fail_msg("%dx%d: colour %06x in %d and %d columns of the two panels, expected %d",
                         w, h, colours[c], a, b, need);
        }
        /* a third colour was never used */
        assert_int_equal(columns_with(s, 0x2ca02c, 0, w, 0, h), 0);
        cairo_surface_destroy(s);
    }
#endif
}

static void test_bad_input_named(void **state)
{
    (void)state;
#ifndef DDP_HAVE_CAIRO
    print_message("skip: built without cairo (libcairo2-dev)\n");
    skip();
#else
    FILE *f = fopen(in_dir("bad.jsonl"), "w");
    fputs("{\"kind\":\"train\",\"global_step\":1,\"loss\":1}\n{\"kind\":\"train\",}\n", f);
    fclose(f);
    f = fopen(in_dir("empty.jsonl"), "w");
    fputs("{\"kind\":\"note\"}\n", f);
    fclose(f);
    f = fopen(in_dir("nostep.jsonl"), "w");
    fputs("{\"kind\":\"eval\",\"accuracy\":50}\n", f);
    fclose(f);
    struct {
        const char *file, *more, *msg; /* named: the message starts "ddp-plot: DIR/file" */
        int named;
    } cases[] = {
        {"none.jsonl", "-o /dev/null", ": No such file or directory", 1},
        {"bad.jsonl", "-o /dev/null", ":2: JSON: trailing comma at byte 16\n", 1},
        {"empty.jsonl", "-o /dev/null", ": no \"train\" or \"eval\" records to plot", 1},
        {"nostep.jsonl", "-o /dev/null", ":1: the eval record has no number \"global_step\"", 1},
        {"bad.jsonl", "--width 10 -o /dev/null", "--width: expected an integer in 320..8000", 0},
        {"bad.jsonl", "", "no output: -o OUT.png", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char msg[512], *err;
        if (cases[i].named)
            snprintf(msg, sizeof msg, "ddp-plot: %s/%s%s", dir, cases[i].file, cases[i].msg);
        else
            snprintf(msg, sizeof msg, "ddp-plot: %s", cases[i].msg);
        int st = run_plot(&err, "%s/%s %s", dir, cases[i].file, cases[i].more);
        if (st != 2 || !strstr(err, msg))
            fail_msg("'%s %s': exit %d, '%s'; expected 2 and '%s'", cases[i].file, cases[i].more,
                     st, err, msg);
        free(err);
    }
    /* an output that cannot be written: exit 1, cairo's reason */
    write_runs();
    char *err;
    int st = run_plot(&err, "%s/one-rank.jsonl -o %s/none/x.png", dir, dir);
    if (st != 1 || !strstr(err, "/none/x.png: "))
        fail_msg("unwritable output: exit %d, '%s'", st, err);
    free(err);
#endif
}

int main(void)
{
    const char *build = getenv("DDP_TEST_BUILD");
    build = build && *build ? build : "build";
    snprintf(plot, sizeof plot, "%s/bin/ddp-plot", build);
    const struct CMUnitTest tests[] = {
        IN_SCRATCH(test_png_size_and_curves),
        IN_SCRATCH(test_bad_input_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
