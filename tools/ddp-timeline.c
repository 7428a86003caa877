/* ddp-timeline: merges the timeline files of a job's ranks (written with
 * DDP_TIMELINE_DIR, docs/timeline.md) into one Chrome trace, one process
 * per rank, for ui.perfetto.dev or chrome://tracing.  ddprun does this by
 * itself for the ranks it started; this command is for the files of
 * several nodes gathered into one folder, or any list of them.
 *
 *   ddp-timeline merge DIR                 DIR/timeline-rank*.json -> DIR/timeline.json
 *   ddp-timeline merge -o OUT FILE...      the files, in that order -> OUT
 *   ddp-timeline svg TRACE OUT [STEPS]     a picture of the last STEPS steps (3)
 *
 * The picture is for documents and for machines without a browser: one row
 * per thread of each rank (nested spans below their parent), one per
 * rank's reductions in flight, colours by span name, time in ms from the
 * window's start.  Perfetto remains the tool to explore a trace.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "base/timeline.h"

static int usage(FILE *f, int rc)
{
    fprintf(f, "usage: ddp-timeline merge DIR\n"
               "       ddp-timeline merge -o OUT FILE...\n"
               "       ddp-timeline svg TRACE OUT.svg [STEPS]\n"
               "Merges the ranks' timelines (DDP_TIMELINE_DIR) into one Chrome trace, or\n"
               "draws the last STEPS (default 3) optimizer steps of a trace as SVG.\n");
    return rc;
}

/* ==== svg ================================================================= */

#define MAX_SPANS 200000
#define MAX_ROWS 64
#define ROW_H 16
#define LABEL_W 150
#define PLOT_W 1100

typedef struct span {
    const char *name;
    double t0, t1;
    int row, depth;
} span;

typedef struct row {
    int pid, tid, async, depth;
    const char *name; /* the thread's name (metadata), or NULL */
} row;

static span spans[MAX_SPANS];
static row rows[MAX_ROWS];
static int nspans, nrows;

static double num(const ddp__json *o, const char *key)
{
    const ddp__json *v = o ? ddp__json_get(o, key) : NULL;
    return v && v->type == DDP_JSON_NUMBER ? v->num : 0;
}

static const char *str(const ddp__json *o, const char *key)
{
    const ddp__json *v = o ? ddp__json_get(o, key) : NULL;
    return v && v->type == DDP_JSON_STRING ? v->str : NULL;
}

static int row_of(int pid, int tid, int async)
{
    for (int i = 0; i < nrows; i++)
        if (rows[i].pid == pid && rows[i].tid == tid && rows[i].async == async)
            return i;
    if (nrows == MAX_ROWS)
        return -1;
    rows[nrows] = (row){pid, tid, async, 0, NULL};
    return nrows++;
}

/* Spans of X events and of b/e pairs (an "e" closes the latest open "b" of
 * its name in its process); thread names from the metadata. */
static void collect(const ddp__json *ev)
{
    for (const ddp__json *e = ev->child; e && nspans < MAX_SPANS; e = e->next) {
        const char *ph = str(e, "ph"), *name = str(e, "name");
        if (!ph || !name)
            continue;
        int pid = (int)num(e, "pid"), tid = (int)num(e, "tid");
        if (!strcmp(ph, "M") && !strcmp(name, "thread_name")) {
            int r = row_of(pid, tid, 0);
            if (r >= 0)
                rows[r].name = str(ddp__json_get(e, "args"), "name");
        } else if (!strcmp(ph, "X") || !strcmp(ph, "b")) {
            int r = row_of(pid, ph[0] == 'b' ? 0 : tid, ph[0] == 'b');
            if (r >= 0)
                spans[nspans++] = (span){name, num(e, "ts"), num(e, "ts") + num(e, "dur"), r, 0};
        } else if (!strcmp(ph, "e")) {
            for (int i = nspans; i-- > 0;)
                if (rows[spans[i].row].async && rows[spans[i].row].pid == pid &&
                    !strcmp(spans[i].name, name) && spans[i].t1 == spans[i].t0) {
                    spans[i].t1 = num(e, "ts");
                    break;
                }
        }
    }
}

/* Nesting depth of each span inside its row (spans arrive in start order
 * per thread); async spans overlap, so each goes one level down from the
 * last still open. */
static void nest(void)
{
    double ends[MAX_ROWS][8];
    int depth[MAX_ROWS] = {0};
    for (int i = 0; i < nspans; i++) {
        span *s = &spans[i];
        int r = s->row;
        while (depth[r] && ends[r][depth[r] - 1] <= s->t0)
            depth[r]--;
        s->depth = depth[r] < 8 ? depth[r] : 7;
        if (depth[r] < 8)
            ends[r][depth[r]++] = s->t1;
        if (s->depth + 1 > rows[r].depth)
            rows[r].depth = s->depth + 1;
    }
}

static unsigned colour(const char *name)
{
    static const unsigned pal[] = {0x4e79a7, 0xf28e2b, 0xe15759, 0x76b7b2, 0x59a14f,
                                   0xedc948, 0xb07aa1, 0xff9da7, 0x9c755f, 0xbab0ac};
    unsigned h = 2166136261u;
    for (; *name; name++)
        h = (h ^ (unsigned char)*name) * 16777619u;
    return pal[h % (sizeof pal / sizeof *pal)];
}

static void put_text(FILE *f, const char *s)
{
    for (; *s; s++)
        if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '&')
            fputs("&amp;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else
            fputc(*s, f);
}

/* The window: the last `steps` optimizer steps of the first process, from
 * the end of the step before them to the end of the last; the whole trace
 * when it has no more steps than that. */
static void window(int steps, double *from, double *to)
{
    double lo = 1e300, hi = -1e300, ends[64] = {0};
    int n = 0, pid0 = nspans ? rows[spans[0].row].pid : 0;
    for (int i = 0; i < nspans; i++) {
        lo = spans[i].t0 < lo ? spans[i].t0 : lo;
        hi = spans[i].t1 > hi ? spans[i].t1 : hi;
        if (rows[spans[i].row].pid == pid0 && !strcmp(spans[i].name, "optimizer step"))
            ends[n++ % 64] = spans[i].t1;
    }
    *from = lo;
    *to = hi;
    if (n > steps) {
        *from = ends[(n - steps - 1) % 64];
        *to = ends[(n - 1) % 64];
    }
}

static int draw(const char *trace, const char *out, int steps)
{
    ddp__json *tree;
    if (ddp__timeline_load(trace, &tree) < 0)
        return -1;
    collect(ddp__json_get(tree, "traceEvents"));
    nest();
    double from, to;
    window(steps, &from, &to);
    double scale = PLOT_W / (to > from ? to - from : 1);
    FILE *f = fopen(out, "w");
    if (!f) {
        perror(out);
        ddp__json_free(tree);
        return -1;
    }
    int y = 30, ys[MAX_ROWS];
    for (int r = 0; r < nrows; r++) {
        ys[r] = y;
        y += (rows[r].depth ? rows[r].depth : 1) * ROW_H + 8;
    }
    int legend_y = y + 10, h = legend_y + 40;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%%\" "
               "height=\"100%%\" fill=\"white\"/>\n",
            LABEL_W + PLOT_W + 20, h);
    for (int t = 0; t <= 10; t++) { /* the time axis, in ms from the window's start */
        double x = LABEL_W + t * PLOT_W / 10.0;
        fprintf(f, "<line x1=\"%.1f\" y1=\"20\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/>"
                   "<text x=\"%.1f\" y=\"14\" text-anchor=\"middle\">%.2f ms</text>\n",
                x, x, y, x, (to - from) * t / 10.0 / 1e3);
    }
    for (int r = 0; r < nrows; r++) {
        fprintf(f, "<text x=\"4\" y=\"%d\">rank %d ", ys[r] + 12, rows[r].pid);
        if (rows[r].async)
            fputs("reductions", f);
        else if (rows[r].name)
            put_text(f, rows[r].name);
        else
            fprintf(f, "tid %d", rows[r].tid);
        fputs("</text>\n", f);
    }
    const char *seen[32];
    int nseen = 0;
    for (int i = 0; i < nspans; i++) {
        span *s = &spans[i];
        if (s->t1 < from || s->t0 > to)
            continue;
        double x0 = LABEL_W + ((s->t0 > from ? s->t0 : from) - from) * scale;
        double x1 = LABEL_W + ((s->t1 < to ? s->t1 : to) - from) * scale;
        double w = x1 - x0 > 0.5 ? x1 - x0 : 0.5;
        int yy = ys[s->row] + s->depth * ROW_H;
        fprintf(f, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"#%06x\">"
                   "<title>",
                x0, yy, w, ROW_H - 2, colour(s->name));
        put_text(f, s->name);
        fprintf(f, " %.1f us</title></rect>\n", s->t1 - s->t0);
        if (w > 7.0 * (double)strlen(s->name)) {
            fprintf(f, "<text x=\"%.1f\" y=\"%d\" fill=\"white\">", x0 + 3, yy + 11);
            put_text(f, s->name);
            fputs("</text>\n", f);
        }
        int k = 0;
        while (k < nseen && strcmp(seen[k], s->name))
            k++;
        if (k == nseen && nseen < 32)
            seen[nseen++] = s->name;
    }
    for (int k = 0, x = LABEL_W; k < nseen; k++) { /* the legend */
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"10\" height=\"10\" fill=\"#%06x\"/>"
                   "<text x=\"%d\" y=\"%d\">",
                x, legend_y + (k % 2) * 16, colour(seen[k]), x + 14, legend_y + 9 + (k % 2) * 16);
        put_text(f, seen[k]);
        fputs("</text>\n", f);
        x += k % 2 ? 220 : 0;
    }
    fputs("</svg>\n", f);
    int rc = ferror(f) | fclose(f);
    ddp__json_free(tree);
    return rc ? -1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")))
        return usage(stdout, 0);
    if (argc >= 4 && argc <= 5 && !strcmp(argv[1], "svg")) {
        int steps = argc == 5 ? atoi(argv[4]) : 3;
        if (steps < 1 || steps > 60)
            return usage(stderr, 2);
        if (draw(argv[2], argv[3], steps) < 0) {
            fprintf(stderr, "ddp-timeline: %s\n", ddp_last_error());
            return 1;
        }
        return 0;
    }
    if (argc < 3 || strcmp(argv[1], "merge") != 0)
        return usage(stderr, 2);
    int rc, n = 0;
    const char *out = NULL;
    if (!strcmp(argv[2], "-o")) {
        if (argc < 5)
            return usage(stderr, 2);
        out = argv[3];
        n = argc - 4;
        rc = ddp__timeline_merge((const char *const *)argv + 4, n, out);
    } else {
        if (argc != 3)
            return usage(stderr, 2);
        rc = ddp__timeline_merge_dir(argv[2], NULL, &n);
    }
    if (rc < 0) {
        fprintf(stderr, "ddp-timeline: %s\n", ddp_last_error());
        return 1;
    }
    if (out)
        printf("%d files merged into %s\n", n, out);
    else
        printf("%d ranks merged into %s/timeline.json\n", n, argv[2]);
    return 0;
}
