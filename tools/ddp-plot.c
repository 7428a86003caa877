/* ddp-plot: training curves from metrics files (ddp-mnist --metrics, or
 * ddp_metrics_write in a program of one's own) into a PNG image.
 *
 *   ddp-plot run1.jsonl run2.jsonl -o curves.png [--width W] [--height H]
 *
 * Two panels: loss against step (each run's "train" records' mean_loss, else
 * loss, solid,
 * and its "eval" records' test_loss, dashed, with markers) and test accuracy
 * against step ("eval" records' accuracy, with markers); the step is the
 * records' global_step.  One colour per run, runs overlaid, each named in
 * the legend by its file name less ".jsonl".
 *
 * Drawn with cairo (Debian's libcairo2-dev): a well-kept 2-D library that
 * writes PNG itself and reads it back (the test uses that), needs no
 * display, and draws anti-aliased lines and text from a C call per stroke;
 * gnuplot would be a second program to start and to quote a script for,
 * PLplot a larger library whose PNG output goes through cairo anyway.
 *
 * Exit status: 0, 2 for bad flags or a file that is missing, malformed or
 * without records (one line on stderr naming the file and line), 1 when
 * the image cannot be drawn or written. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cairo.h>
#include <fontconfig/fontconfig.h>

#include "base/json.h"
#include "ddp.h"

#define MAX_RUNS 16
#define FILE_CAP (256u << 20) /* a metrics file larger than 256 MiB is not one */

/* The runs' colours, in order (matplotlib's first ten: told apart also by
 * most colour-blind readers); the 11th run and later reuse them. */
static const double palette[][3] = {
    {0x1f / 255.0, 0x77 / 255.0, 0xb4 / 255.0}, {0xff / 255.0, 0x7f / 255.0, 0x0e / 255.0},
    {0x2c / 255.0, 0xa0 / 255.0, 0x2c / 255.0}, {0xd6 / 255.0, 0x27 / 255.0, 0x28 / 255.0},
    {0x94 / 255.0, 0x67 / 255.0, 0xbd / 255.0}, {0x8c / 255.0, 0x56 / 255.0, 0x4b / 255.0},
    {0xe3 / 255.0, 0x77 / 255.0, 0xc2 / 255.0}, {0x7f / 255.0, 0x7f / 255.0, 0x7f / 255.0},
    {0xbc / 255.0, 0xbd / 255.0, 0x22 / 255.0}, {0x17 / 255.0, 0xbe / 255.0, 0xcf / 255.0},
};
#define PALETTE_N (sizeof palette / sizeof *palette)

typedef struct series {
    double *x, *y;
    size_t n, cap;
} series;

typedef struct run {
    char name[128];
    series loss, test_loss, acc;
} run;

/* A range of data and the axis drawn for it: [lo, hi] in steps of tick. */
typedef struct axis {
    double lo, hi, tick;
} axis;

/* A panel: where it is in the image and what it maps. */
typedef struct panel {
    double x0, y0, x1, y1; /* the plot area, in pixels (y0 at the top) */
    axis ax, ay;
} panel;

__attribute__((format(printf, 1, 2))) static int fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ddp-plot: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return 2;
}

static int push(series *s, double x, double y)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        double *nx = realloc(s->x, cap * sizeof *nx);
        if (!nx)
            return -1;
        s->x = nx;
        double *ny = realloc(s->y, cap * sizeof *ny);
        if (!ny)
            return -1;
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n] = y;
    s->n++;
    return 0;
}

static void series_free(series *s)
{
    free(s->x);
    free(s->y);
}

/* A number field of a record: 0 and *v, 1 when absent or null, -1 when of
 * another type. */
static int field(const ddp__json *r, const char *key, double *v)
{
    const ddp__json *f = ddp__json_get(r, key);
    if (!f || f->type == DDP_JSON_NULL)
        return 1;
    if (f->type != DDP_JSON_NUMBER)
        return -1;
    *v = f->num;
    return 0;
}

/* One line of a metrics file into the run's series. */
static int add_record(run *r, const ddp__json *rec, const char *path, size_t line)
{
    if (rec->type != DDP_JSON_OBJECT)
        return fail("%s:%zu: a record is a JSON object, not %s", path, line,
                    ddp__json_type_name(rec->type));
    const ddp__json *kind = ddp__json_get(rec, "kind");
    if (!kind || kind->type != DDP_JSON_STRING)
        return fail("%s:%zu: the record has no \"kind\" string", path, line);
    int train = !strcmp(kind->str, "train"), eval = !strcmp(kind->str, "eval");
    if (!train && !eval)
        return 0; /* a kind of the user's own: not plotted */
    double step, v;
    if (field(rec, "global_step", &step) != 0)
        return fail("%s:%zu: the %s record has no number \"global_step\"", path, line, kind->str);
    /* a train record's mean loss since the last one, when it has it: a
     * smoother curve than the loss of the one step it was written at */
    const char *need = train ? "loss" : "accuracy";
    if (train && field(rec, "mean_loss", &v) == 0)
        need = "mean_loss";
    int rc = field(rec, need, &v);
    if (rc < 0)
        return fail("%s:%zu: the %s record's \"%s\" is not a number", path, line, kind->str, need);
    if (rc == 0 && push(train ? &r->loss : &r->acc, step, v) < 0)
        return fail("out of memory");
    if (eval && field(rec, "test_loss", &v) == 0 && push(&r->test_loss, step, v) < 0)
        return fail("out of memory");
    return 0;
}

/* The whole file, NUL-terminated; NULL with a message.  Read to its end
 * rather than by its size: a pipe or /dev/stdin will do. */
static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fail("%s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) /* the end, or an error */
            break;
        char *nb = cap < FILE_CAP ? realloc(buf, 2 * cap + 1) : NULL;
        if (!nb && cap >= FILE_CAP)
            fail("%s: larger than %u MiB: not a metrics file", path, FILE_CAP >> 20);
        if (!nb)
            free(buf);
        buf = nb;
        cap *= 2;
    }
    int err = ferror(f) ? errno : 0;
    fclose(f);
    if (buf && err) {
        fail("%s: %s", path, strerror(err));
        free(buf);
        return NULL;
    }
    if (!buf) {
        if (cap <= FILE_CAP)
            fail("%s: out of memory", path);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* The library's last message without its "file.c:line: " origin, which
 * tells a user of the tool nothing. */
static const char *reason(void)
{
    const char *m = ddp_last_error(), *c = strstr(m, ".c:");
    if (c && c[3] >= '0' && c[3] <= '9') {
        const char *p = c + 3 + strspn(c + 3, "0123456789");
        if (p[0] == ':' && p[1] == ' ' && !memchr(m, ' ', (size_t)(c - m)))
            return p + 2;
    }
    return m;
}

/* A run from a metrics file: every line a record (blank lines skipped). */
static int load_run(const char *path, run *r)
{
    const char *base = strrchr(path, '/');
    snprintf(r->name, sizeof r->name, "%s", base ? base + 1 : path);
    size_t nl = strlen(r->name);
    if (nl > 6 && !strcmp(r->name + nl - 6, ".jsonl"))
        r->name[nl - 6] = '\0';
    size_t len;
    char *text = read_file(path, &len);
    if (!text)
        return 2;
    int rc = 0;
    size_t line = 0;
    for (char *p = text; rc == 0 && p < text + len;) {
        char *end = memchr(p, '\n', (size_t)(text + len - p));
        size_t n = end ? (size_t)(end - p) : (size_t)(text + len - p);
        line++;
        if (strspn(p, " \t\r") < n) {
            ddp__json *rec;
            if (ddp__json_parse(p, n, &rec) < 0) {
                rc = fail("%s:%zu: %s", path, line, reason());
            } else {
                rc = add_record(r, rec, path, line);
                ddp__json_free(rec);
            }
        }
        p += n + 1;
    }
    free(text);
    if (rc == 0 && r->loss.n + r->acc.n + r->test_loss.n == 0)
        rc = fail("%s: no \"train\" or \"eval\" records to plot", path);
    return rc;
}

/* ---- axes -------------------------------------------------------------- */

/* 1, 2 or 5 times a power of ten, the smallest at least raw. */
static double nice_step(double raw)
{
    double p = pow(10, floor(log10(raw)));
    double m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

/* About 5 ticks over [lo, hi], ends rounded out to ticks; from_zero pins
 * lo at 0 (steps). */
static axis make_axis(double lo, double hi, int from_zero)
{
    if (from_zero)
        lo = 0;
    if (!(hi > lo)) { /* one point, or none */
        double pad = fabs(lo) > 0 ? fabs(lo) * 0.1 : 1;
        lo -= from_zero ? 0 : pad;
        hi += pad;
    }
    axis a = {.tick = nice_step((hi - lo) / 5)};
    a.lo = floor(lo / a.tick + 1e-9) * a.tick;
    a.hi = ceil(hi / a.tick - 1e-9) * a.tick;
    return a;
}

static double px(const panel *p, double x)
{
    return p->x0 + (x - p->ax.lo) / (p->ax.hi - p->ax.lo) * (p->x1 - p->x0);
}

static double py(const panel *p, double y)
{
    return p->y1 - (y - p->ay.lo) / (p->ay.hi - p->ay.lo) * (p->y1 - p->y0);
}

/* A tick label: as many decimals as the tick needs, no more. */
static void tick_label(char *s, size_t cap, double v, double tick)
{
    int dec = tick >= 1 ? 0 : (int)ceil(-log10(tick) - 1e-9);
    if (fabs(v) < tick * 1e-6)
        v = 0; /* no "-0" */
    snprintf(s, cap, "%.*f", dec, v);
}

/* Text at (x, y): ha 0 left, 0.5 centred, 1 right of the text; va 0 the
 * font's top (ascent), 1 its bottom (descent), whatever the letters, so
 * that texts side by side share their baseline. */
static void text(cairo_t *cr, double x, double y, double ha, double va, const char *s)
{
    cairo_text_extents_t e;
    cairo_font_extents_t fe;
    cairo_text_extents(cr, s, &e);
    cairo_font_extents(cr, &fe);
    cairo_move_to(cr, x - e.x_bearing - ha * e.width,
                  y + fe.ascent - va * (fe.ascent + fe.descent));
    cairo_show_text(cr, s);
}

/* A line from (x0, y0) to (x1, y1) in grey g. */
static void line(cairo_t *cr, double g, double x0, double y0, double x1, double y1)
{
    cairo_set_source_rgb(cr, g, g, g);
    cairo_move_to(cr, x0, y0);
    cairo_line_to(cr, x1, y1);
    cairo_stroke(cr);
}

/* One axis' grid lines, tick marks and labels: the x axis below the
 * panel, or (vertical) the y axis on its left. */
static void draw_ticks(cairo_t *cr, const panel *p, int vertical)
{
    const axis *a = vertical ? &p->ay : &p->ax;
    char s[64];
    for (int k = 0; k <= 1000; k++) {
        double v = a->lo + k * a->tick;
        if (v > a->hi + a->tick * 1e-6)
            break;
        tick_label(s, sizeof s, v, a->tick);
        /* on a pixel's centre: a sharp 1-pixel line */
        double c = round(vertical ? py(p, v) : px(p, v)) + 0.5;
        if (vertical) {
            line(cr, 0.9, p->x0, c, p->x1, c);
            line(cr, 0.2, p->x0 - 5, c, p->x0, c);
            text(cr, p->x0 - 8, c, 1, 0.5, s);
        } else {
            line(cr, 0.9, c, p->y0, c, p->y1);
            line(cr, 0.2, c, p->y1, c, p->y1 + 5);
            text(cr, c, p->y1 + 8, 0.5, 0, s);
        }
    }
}

/* Frame, grid, ticks, tick labels, axis labels and title of a panel. */
static void draw_axes(cairo_t *cr, const panel *p, const char *title, const char *ylabel)
{
    cairo_set_line_width(cr, 1);
    cairo_set_font_size(cr, 11);
    draw_ticks(cr, p, 0);
    draw_ticks(cr, p, 1);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    cairo_rectangle(cr, round(p->x0) + 0.5, round(p->y0) + 0.5, round(p->x1 - p->x0),
                    round(p->y1 - p->y0));
    cairo_stroke(cr);
    cairo_set_font_size(cr, 12);
    text(cr, (p->x0 + p->x1) / 2, p->y1 + 24, 0.5, 0, "step");
    cairo_save(cr);
    cairo_translate(cr, p->x0 - 44, (p->y0 + p->y1) / 2);
    cairo_rotate(cr, -M_PI / 2);
    text(cr, 0, 0, 0.5, 1, ylabel);
    cairo_restore(cr);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_BOLD);
    cairo_set_font_size(cr, 13);
    text(cr, (p->x0 + p->x1) / 2, p->y0 - 8, 0.5, 1, title);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
}

/* A series in the panel: a polyline, dashed or not, with a dot per point
 * when marked; clipped to the plot area. */
static void draw_series(cairo_t *cr, const panel *p, const series *s, const double *rgb,
                        int dashed, int marked)
{
    if (s->n == 0)
        return;
    cairo_save(cr);
    cairo_rectangle(cr, p->x0, p->y0, p->x1 - p->x0, p->y1 - p->y0);
    cairo_clip(cr);
    cairo_set_source_rgb(cr, rgb[0], rgb[1], rgb[2]);
    cairo_set_line_width(cr, 2);
    cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
    if (dashed)
        cairo_set_dash(cr, (double[]){6, 4}, 2, 0);
    for (size_t i = 0; i < s->n; i++)
        (i ? cairo_line_to : cairo_move_to)(cr, px(p, s->x[i]), py(p, s->y[i]));
    cairo_stroke(cr);
    cairo_set_dash(cr, NULL, 0, 0);
    for (size_t i = 0; marked && i < s->n; i++) {
        cairo_arc(cr, px(p, s->x[i]), py(p, s->y[i]), 3.5, 0, 2 * M_PI);
        cairo_fill(cr);
    }
    cairo_restore(cr);
}

/* The legend in the panel's top right corner: a swatch and a name per run,
 * then what solid and dashed mean. */
static void draw_legend(cairo_t *cr, const panel *p, const run *runs, int n, int styles)
{
    cairo_set_font_size(cr, 11);
    double wmax = 0;
    for (int i = 0; i < n; i++) {
        cairo_text_extents_t e;
        cairo_text_extents(cr, runs[i].name, &e);
        wmax = e.x_advance > wmax ? e.x_advance : wmax;
    }
    if (styles && wmax < 110)
        wmax = 110;
    int rows = n + (styles ? 2 : 0);
    double w = wmax + 44, h = rows * 16 + 8, x = p->x1 - w - 8, y = p->y0 + 8;
    cairo_set_source_rgba(cr, 1, 1, 1, 0.9);
    cairo_rectangle(cr, x, y, w, h);
    cairo_fill_preserve(cr);
    cairo_set_source_rgb(cr, 0.75, 0.75, 0.75);
    cairo_set_line_width(cr, 1);
    cairo_stroke(cr);
    cairo_set_line_width(cr, 2);
    for (int i = 0; i < rows; i++) {
        double ly = y + 12 + i * 16;
        const double *rgb = i < n ? palette[i % PALETTE_N] : (const double[]){0.3, 0.3, 0.3};
        cairo_set_source_rgb(cr, rgb[0], rgb[1], rgb[2]);
        if (i == n + 1)
            cairo_set_dash(cr, (double[]){6, 4}, 2, 0);
        cairo_move_to(cr, x + 8, ly);
        cairo_line_to(cr, x + 32, ly);
        cairo_stroke(cr);
        cairo_set_dash(cr, NULL, 0, 0);
        cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
        text(cr, x + 38, ly, 0, 0.5,
             i < n ? runs[i].name : i == n ? "training loss" : "test loss");
    }
}

/* [lo, hi] over some series of every run. */
static void range(const run *runs, int n, size_t offset, int use_x, double *lo, double *hi)
{
    for (int i = 0; i < n; i++) {
        const series *s = (const series *)((const char *)&runs[i] + offset);
        for (size_t k = 0; k < s->n; k++) {
            double v = use_x ? s->x[k] : s->y[k];
            *lo = v < *lo ? v : *lo;
            *hi = v > *hi ? v : *hi;
        }
    }
}

static int plot(const run *runs, int n, int width, int height, const char *out)
{
    cairo_surface_t *sf = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, width, height);
    cairo_t *cr = cairo_create(sf);
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    /* side by side when the image is wide, else one above the other */
    int wide = width >= height;
    double ml = 70, mr = 20, mt = 34, mb = 52, gap = wide ? 80 : 70;
    double pw = wide ? (width - ml - mr - gap) / 2 : width - ml - mr;
    double ph = wide ? height - mt - mb : (height - mt - mb - gap) / 2;
    double xlo = INFINITY, xhi = -INFINITY, llo = INFINITY, lhi = -INFINITY, alo = INFINITY,
           ahi = -INFINITY;
    range(runs, n, offsetof(run, loss), 1, &xlo, &xhi);
    range(runs, n, offsetof(run, test_loss), 1, &xlo, &xhi);
    range(runs, n, offsetof(run, acc), 1, &xlo, &xhi);
    range(runs, n, offsetof(run, loss), 0, &llo, &lhi);
    range(runs, n, offsetof(run, test_loss), 0, &llo, &lhi);
    range(runs, n, offsetof(run, acc), 0, &alo, &ahi);
    axis ax = make_axis(xlo, xhi, 1);
    panel loss = {ml, mt, ml + pw, mt + ph, ax, make_axis(llo > lhi ? 0 : llo, lhi, 0)};
    panel acc = {wide ? ml + pw + gap : ml, wide ? mt : mt + ph + gap, 0, 0, ax,
                 make_axis(alo > ahi ? 0 : alo, ahi, 0)};
    acc.x1 = acc.x0 + pw;
    acc.y1 = acc.y0 + ph;
    draw_axes(cr, &loss, "Loss", "loss (cross-entropy)");
    draw_axes(cr, &acc, "Test accuracy", "accuracy (%)");
    int has_test_loss = 0;
    for (int i = 0; i < n; i++) {
        const double *rgb = palette[i % PALETTE_N];
        draw_series(cr, &loss, &runs[i].loss, rgb, 0, runs[i].loss.n == 1);
        draw_series(cr, &loss, &runs[i].test_loss, rgb, 1, 1);
        draw_series(cr, &acc, &runs[i].acc, rgb, 0, 1);
        has_test_loss |= runs[i].test_loss.n > 0;
    }
    draw_legend(cr, &loss, runs, n, has_test_loss);
    cairo_status_t st = cairo_status(cr);
    if (st == CAIRO_STATUS_SUCCESS)
        st = cairo_surface_write_to_png(sf, out);
    cairo_destroy(cr);
    cairo_surface_destroy(sf);
    if (st != CAIRO_STATUS_SUCCESS) {
        fprintf(stderr, "ddp-plot: %s: %s\n", out, cairo_status_to_string(st));
        return 1;
    }
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: ddp-plot METRICS.jsonl... -o OUT.png [--width W] [--height H]\n"
               "Draws loss and test accuracy against step, one colour per run (file),\n"
               "from metrics files written by ddp-mnist --metrics or ddp_metrics_write:\n"
               "\"train\" records' mean_loss (else loss), \"eval\" records' test_loss\n"
               "and accuracy, by global_step.\n"
               "  -o, --output FILE  the PNG to write\n"
               "  --width W          pixels, 320..8000 (default 960)\n"
               "  --height H         pixels, 240..8000 (default 420)\n"
               "  --help             this text\n");
}

static int parse_size(const char *flag, const char *s, long lo, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > 8000)
        return fail("%s: expected an integer in %ld..8000, got '%s' (see --help)", flag, lo, s);
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"output", required_argument, NULL, 'o'}, {"width", required_argument, NULL, 'W'},
        {"height", required_argument, NULL, 'H'}, {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *out = NULL;
    int width = 960, height = 420, c, rc = 0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":o:", opts, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 'W': rc = parse_size("--width", optarg, 320, &width); break;
        case 'H': rc = parse_size("--height", optarg, 240, &height); break;
        case 'h': usage(stdout); return 0;
        case ':': return fail("option '%s' needs a value (see --help)", argv[optind - 1]);
        default: return fail("unknown option '%s' (see --help)", argv[optind - 1]);
        }
        if (rc)
            return rc;
    }
    int n = argc - optind;
    if (!out || n == 0)
        return fail("%s (see --help)", !out ? "no output: -o OUT.png" : "no metrics file given");
    if (n > MAX_RUNS)
        return fail("%d metrics files: at most %d", n, MAX_RUNS);
    run *runs = calloc((size_t)n, sizeof *runs);
    if (!runs)
        return fail("out of memory");
    for (int i = 0; i < n && rc == 0; i++)
        rc = load_run(argv[optind + i], &runs[i]);
    if (rc == 0)
        rc = plot(runs, n, width, height, out);
    for (int i = 0; i < n; i++) {
        series_free(&runs[i].loss);
        series_free(&runs[i].test_loss);
        series_free(&runs[i].acc);
    }
    free(runs);
    /* cairo's font caches and fontconfig's configuration live until told
     * otherwise: let them go, so that leak checkers see none */
    cairo_debug_reset_static_data();
    FcFini();
    return rc;
}
