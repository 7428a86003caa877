/* libddp progress: what a training program shows while it trains, for
 * programs of one's own as for ddp-mnist.
 *
 * A progress bar per epoch (tqdm's in spirit), redrawn in place with '\r'
 * on a terminal and absent elsewhere, so that a program's log lines stay
 * exactly what they are in pipes, CI logs and files:
 *
 *   Epoch 1/3 [=========>          ] 450/938  41.2k samples/s  loss 0.4321  ETA 0:03
 *
 * and a metrics file: one JSON object per line (JSON Lines), one line per
 * record, flushed as it is written, for tools/ddp-plot and any other reader:
 *
 *   {"kind":"train","wall_s":1.25,"epoch":1,"step":100,"loss":0.6123}
 *
 * Both are plain helpers: they print only where the caller points them and
 * never on their own; a write that fails is a DDP_ERR_IO with the path or
 * stream named. */
#ifndef DDP_PROGRESS_H
#define DDP_PROGRESS_H

#include <stdio.h>

#include "ddp/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the progress bar ---------------------------------------------------- */

typedef struct ddp_progress ddp_progress_t;

enum { /* when ddp_progress_options.mode draws */
    DDP_PROGRESS_AUTO = 0, /* only when the stream is a terminal (isatty) */
    DDP_PROGRESS_ON = 1,   /* always (a terminal is assumed) */
    DDP_PROGRESS_OFF = 2   /* never: every call does nothing */
};

typedef struct ddp_progress_options {
    FILE *stream;    /* where the bar goes (default stdout); borrowed */
    int mode;        /* DDP_PROGRESS_AUTO (default), _ON, _OFF */
    double interval; /* seconds between redraws (default 0.1; the last step always draws) */
    int width;       /* columns; 0 (default): the terminal's, else 80 */
} ddp_progress_options;

DDP_API ddp_progress_options ddp_progress_defaults(void);
/* A bar, drawing or not by o->mode (NULL: the defaults).  Caller destroys. */
DDP_API int ddp_progress_create(const ddp_progress_options *o, ddp_progress_t **out);
/* Ends an open bar with a line break, then frees.  NULL: nothing. */
DDP_API void ddp_progress_destroy(ddp_progress_t *p);
/* 1 when the bar draws (a terminal, or DDP_PROGRESS_ON), else 0. */
DDP_API int ddp_progress_enabled(const ddp_progress_t *p);
/* Starts a bar of total steps labelled label (copied; "Epoch 1/3"), ending
 * the previous one; its clock starts now. */
DDP_API int ddp_progress_begin(ddp_progress_t *p, const char *label, size_t total);
/* step of total done, samples processed since begin (the rate's
 * numerator: count every rank's to show the job's), the latest loss.
 * Redraws when the interval has passed, at the first and at the last step. */
DDP_API int ddp_progress_update(ddp_progress_t *p, size_t step, size_t samples, double loss);
/* Erases the bar from its line, so that the caller can print a line of its
 * own there; the next update draws the bar again below it. */
DDP_API int ddp_progress_clear(ddp_progress_t *p);
/* Draws the bar's final state and ends its line. */
DDP_API int ddp_progress_end(ddp_progress_t *p);

/* ---- the metrics file ---------------------------------------------------- */

typedef struct ddp_metrics ddp_metrics_t;

/* One field of a record: a name of letters, digits and '_' (at most 63
 * bytes), and a number (not finite: written as null). */
typedef struct ddp_metric {
    const char *name;
    double value;
} ddp_metric;

/* Opens path for records, truncated, or appended to with append = 1 (a
 * resumed run continuing its file).  Caller destroys. */
DDP_API int ddp_metrics_create(const char *path, int append, ddp_metrics_t **out);
/* Closes the file.  NULL: nothing. */
DDP_API void ddp_metrics_destroy(ddp_metrics_t *m);
/* Writes one line {"kind":KIND,"wall_s":S,FIELDS...} and flushes it:
 * kind is named as a field is; wall_s, seconds since create, comes first;
 * n fields follow in order, names distinct and neither "kind" nor "wall_s". */
DDP_API int ddp_metrics_write(ddp_metrics_t *m, const char *kind, const ddp_metric *fields,
                              size_t n);

#ifdef __cplusplus
}
#endif

#endif
