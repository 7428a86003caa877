/* libddp timeline: what each thread of each rank did, and when, as Chrome
 * trace-event JSON (open it in ui.perfetto.dev or chrome://tracing).
 *
 * Off by default.  With DDP_TIMELINE_DIR=DIR set on every rank, libddp
 * records its own spans (DDP forward and backward, each bucket's
 * reduction, the waits, the optimizer step, the DataLoader) and each rank
 * writes DIR/timeline-rank<R>.json when the DDP wrapper is destroyed, at
 * ddp_timeline_flush() and at process exit; ddprun merges the ranks' files
 * into DIR/timeline.json.  A program adds its own spans:
 *
 *     ddp_timeline_begin("evaluate");
 *     ...
 *     ddp_timeline_end();
 *
 * Spans nest (at most DDP_TIMELINE_MAX_DEPTH deep per thread) and belong to
 * the thread that began them.  While the timeline is off every call
 * returns 0 at once.  docs/timeline.md has the format and the limits. */
#ifndef DDP_TIMELINE_H
#define DDP_TIMELINE_H

#include "ddp/base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DDP_TIMELINE_MAX_DEPTH 32

/* 1 when the timeline records (DDP_TIMELINE_DIR is set), else 0. */
DDP_API int ddp_timeline_enabled(void);
/* Opens a span called name on this thread's track (name is copied).
 * DDP_ERR_STATE when spans nest deeper than DDP_TIMELINE_MAX_DEPTH;
 * DDP_ERR_INVALID_ARG for a NULL name. */
DDP_API int ddp_timeline_begin(const char *name);
/* Closes this thread's innermost open span; DDP_ERR_STATE when none is open. */
DDP_API int ddp_timeline_end(void);
/* Writes this process's timeline file now (every event recorded so far, by
 * every thread); later flushes rewrite it whole.  DDP_ERR_IO names the file
 * and the reason when it cannot be written. */
DDP_API int ddp_timeline_flush(void);

#ifdef __cplusplus
}
#endif
#endif
