/* The progress bar of include/ddp/progress.h: one line per bar, redrawn in
 * place ('\r', then erase to the end of the line) at most every interval,
 * cut to the terminal's width so that it never wraps (a wrapped line can no
 * longer be redrawn in place).  Off, it costs a branch per call. */
#include "ddp/progress.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "base/error.h"

#define LINE_CAP 512

struct ddp_progress {
    FILE *stream;
    int enabled, width;
    double interval;
    char label[64];
    size_t total, step, step0, samples; /* step0: the step before the first update */
    double loss, t0, last_draw; /* last_draw < 0: not drawn since begin */
    int begun;                  /* begin called, end not yet: the bar is on the line */
    int updated;                /* update called since begin */
};

ddp_progress_options ddp_progress_defaults(void)
{
    return (ddp_progress_options){.stream = NULL, .mode = DDP_PROGRESS_AUTO, .interval = 0.1,
                                  .width = 0};
}

int ddp_progress_create(const ddp_progress_options *o, ddp_progress_t **out)
{
    ddp_progress_options d = o ? *o : ddp_progress_defaults();
    DDP_FAIL_IF(!out, DDP_ERR_INVALID_ARG, "progress: out is NULL");
    *out = NULL;
    DDP_FAIL_IF(d.mode < DDP_PROGRESS_AUTO || d.mode > DDP_PROGRESS_OFF, DDP_ERR_INVALID_ARG,
                "progress: mode %d is not DDP_PROGRESS_AUTO, _ON or _OFF", d.mode);
    DDP_FAIL_IF(!(d.interval >= 0) || d.interval > 3600, DDP_ERR_INVALID_ARG,
                "progress: interval %g s is not in 0..3600", d.interval);
    DDP_FAIL_IF(d.width < 0 || d.width > LINE_CAP - 1, DDP_ERR_INVALID_ARG,
                "progress: width %d is not in 0..%d", d.width, LINE_CAP - 1);
    ddp_progress_t *p = calloc(1, sizeof *p);
    DDP_FAIL_IF(!p, DDP_ERR_NOMEM, "progress: out of memory");
    p->stream = d.stream ? d.stream : stdout;
    p->interval = d.interval;
    int fd = fileno(p->stream);
    p->enabled =
        d.mode == DDP_PROGRESS_ON || (d.mode == DDP_PROGRESS_AUTO && fd >= 0 && isatty(fd));
    p->width = d.width;
    struct winsize ws;
    if (!p->width)
        p->width = fd >= 0 && ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 ? ws.ws_col : 80;
    if (p->width > LINE_CAP - 1)
        p->width = LINE_CAP - 1;
    *out = p;
    return 0;
}

int ddp_progress_enabled(const ddp_progress_t *p) { return p && p->enabled; }

/* "1:05", "2:03:45"; "--:--" before there is a rate. */
static void format_eta(char *s, size_t cap, double secs)
{
    if (!(secs >= 0) || secs > 359999) {
        snprintf(s, cap, "--:--");
        return;
    }
    long t = lround(secs);
    if (t >= 3600)
        snprintf(s, cap, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(s, cap, "%ld:%02ld", t / 60, t % 60);
}

/* "950", "41.2k", "1.31M" */
static void format_rate(char *s, size_t cap, double r)
{
    if (r >= 1e6)
        snprintf(s, cap, "%.2fM", r / 1e6);
    else if (r >= 1e4)
        snprintf(s, cap, "%.1fk", r / 1e3);
    else
        snprintf(s, cap, "%.0f", r);
}

/* The bar's text: label, a bar of whatever width is left, the counts.  The
 * counts take the same room from frame to frame (the step padded to the
 * total's digits, the rate to 6 columns, room kept for a loss and an ETA of
 * 7), so that the bar keeps its width while the numbers change. */
static void format_line(const ddp_progress_t *p, double now, char *line)
{
    double dt = now - p->t0;
    double rate = dt > 0 ? (double)p->samples / dt : 0;
    size_t done = p->step - p->step0; /* since the first update: a resumed epoch's skip */
    double eta = done > 0 && dt > 0 ? dt / (double)done * (double)(p->total - p->step) : -1;
    char r[32], e[32], l[32], total[32], tail[256];
    format_rate(r, sizeof r, rate);
    format_eta(e, sizeof e, eta);
    snprintf(l, sizeof l, "%.4f", p->loss);
    int digits = snprintf(total, sizeof total, "%zu", p->total);
    int n = snprintf(tail, sizeof tail, " %*zu/%s  %6s samples/s  loss %s  ETA %s", digits, p->step,
                     total, r, l, e);
    int le = (int)strlen(e), ll = (int)strlen(l);
    int reserved = n - le - ll + (le > 7 ? le : 7) + (ll > 7 ? ll : 7);
    /* label + " [" + bar + "]" + tail fits width - 1 (the last column
     * would wrap on some terminals); a bar narrower than 10 is left out. */
    int room = p->width - 1 - (int)strlen(p->label) - 3 - reserved;
    int bar = room > 40 ? 40 : room;
    if (bar < 10) {
        snprintf(line, LINE_CAP, "%s%s", p->label, tail);
    } else {
        char b[48];
        size_t full = p->total ? p->step * (size_t)bar / p->total : 0;
        for (int i = 0; i < bar; i++)
            b[i] = (size_t)i < full ? '=' : (size_t)i == full ? '>' : ' ';
        b[bar] = '\0';
        snprintf(line, LINE_CAP, "%s [%s]%s", p->label, b, tail);
    }
    line[p->width > 1 ? p->width - 1 : 1] = '\0';
}

static int draw(ddp_progress_t *p, double now)
{
    char line[LINE_CAP];
    format_line(p, now, line);
    /* \r: back to the line's start; \033[K: erase what a longer line left */
    if (fprintf(p->stream, "\r%s\033[K", line) < 0 || fflush(p->stream) != 0)
        return DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "progress: writing the bar");
    p->last_draw = now;
    return 0;
}

int ddp_progress_begin(ddp_progress_t *p, const char *label, size_t total)
{
    DDP_FAIL_IF(!p, DDP_ERR_INVALID_ARG, "progress: NULL bar");
    if (!p->enabled)
        return 0;
    DDP_TRY(ddp_progress_end(p));
    snprintf(p->label, sizeof p->label, "%s", label ? label : "");
    p->total = total;
    p->step = p->step0 = p->samples = 0;
    p->updated = 0;
    p->loss = NAN;
    p->t0 = ddp_time_now();
    p->last_draw = -1;
    p->begun = 1;
    return 0;
}

int ddp_progress_update(ddp_progress_t *p, size_t step, size_t samples, double loss)
{
    DDP_FAIL_IF(!p, DDP_ERR_INVALID_ARG, "progress: NULL bar");
    if (!p->enabled)
        return 0;
    DDP_FAIL_IF(!p->begun, DDP_ERR_STATE, "progress: update before ddp_progress_begin");
    p->step = step > p->total ? p->total : step;
    if (!p->updated) /* the first update of this bar: the steps before it were skipped */
        p->step0 = p->step ? p->step - 1 : 0;
    p->updated = 1;
    p->samples = samples;
    p->loss = loss;
    double now = ddp_time_now();
    if (p->last_draw < 0 || p->step == p->total || now - p->last_draw >= p->interval)
        return draw(p, now);
    return 0;
}

int ddp_progress_clear(ddp_progress_t *p)
{
    DDP_FAIL_IF(!p, DDP_ERR_INVALID_ARG, "progress: NULL bar");
    if (!p->enabled || !p->begun || p->last_draw < 0)
        return 0;
    p->last_draw = -1; /* the next update draws again, below what is printed */
    if (fputs("\r\033[K", p->stream) == EOF || fflush(p->stream) != 0)
        return DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "progress: erasing the bar");
    return 0;
}

int ddp_progress_end(ddp_progress_t *p)
{
    DDP_FAIL_IF(!p, DDP_ERR_INVALID_ARG, "progress: NULL bar");
    if (!p->enabled || !p->begun)
        return 0;
    p->begun = 0;
    DDP_TRY(draw(p, ddp_time_now())); /* the final state, with its final rate */
    if (fputc('\n', p->stream) == EOF || fflush(p->stream) != 0)
        return DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "progress: writing the bar");
    return 0;
}

void ddp_progress_destroy(ddp_progress_t *p)
{
    if (!p)
        return;
    (void)ddp_progress_end(p);
    free(p);
}
