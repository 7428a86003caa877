/* The timeline: spans of what each thread of a rank did (forward, backward,
 * bucket reductions, optimizer step, data loading, waits) written as Chrome
 * trace-event JSON, which ui.perfetto.dev and chrome://tracing open
 * (docs/timeline.md).  The lowest layer, so that nn/, optim/, data/ and ddp/
 * all record into it; users record their own spans through
 * include/ddp/timeline.h.
 *
 * Off by default, and then one predictable branch per span: a span is
 *
 *     uint64_t t0 = ddp__tl_begin();      // 0 when the timeline is off
 *     ...work...
 *     ddp__tl_end(t0, "backward", NULL, 0);
 *
 * where ddp__tl_begin is one relaxed load and compare when off, and
 * ddp__tl_end tests t0.  On with DDP_TIMELINE_DIR=DIR: each rank writes
 * DIR/timeline-rank<R>.json at ddp_timeline_flush, at
 * ddp_data_parallel_destroy and at process exit.
 *
 * Each thread records into its own buffer (no lock on the recording path),
 * at most DDP_TIMELINE_MAX_EVENTS events per thread; later events are
 * counted and the file says how many were dropped.  Timestamps come from
 * CLOCK_MONOTONIC, shared by every process of a host; across hosts DDP
 * estimates each rank's offset to rank 0's clock at creation (timeline.c). */
#ifndef DDP_BASE_TIMELINE_H
#define DDP_BASE_TIMELINE_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#include "ddp/timeline.h"

enum { DDP__TL_UNKNOWN = 0, DDP__TL_OFF = 1, DDP__TL_ON = 2 };
/* The process-wide switch (like the log level: the environment's, read once). */
extern _Atomic int ddp__tl_state;

/* Reads DDP_TIMELINE_DIR on the first call; the clock in ns when on, else 0. */
uint64_t ddp__tl_begin_slow(void);
/* Records one complete span [t0, now) on the calling thread's track. */
void ddp__tl_record(uint64_t t0, const char *name, const char *arg_name, int64_t arg);
/* Records an asynchronous span [t0, now) of its own track (Perfetto draws
 * async spans of one name on one row: reductions in flight overlap). */
void ddp__tl_record_async(uint64_t t0, const char *name, const char *arg_name, int64_t arg);

/* The clock in ns (never 0) when the timeline is on, 0 when off. */
static inline uint64_t ddp__tl_begin(void)
{
    if (__builtin_expect(atomic_load_explicit(&ddp__tl_state, memory_order_relaxed) == DDP__TL_OFF,
                         1))
        return 0;
    return ddp__tl_begin_slow();
}

/* name and arg_name: static strings (borrowed until the process ends). */
static inline void ddp__tl_end(uint64_t t0, const char *name, const char *arg_name, int64_t arg)
{
    if (__builtin_expect(t0 != 0, 0))
        ddp__tl_record(t0, name, arg_name, arg);
}

static inline void ddp__tl_end_async(uint64_t t0, const char *name, const char *arg_name,
                                     int64_t arg)
{
    if (__builtin_expect(t0 != 0, 0))
        ddp__tl_record_async(t0, name, arg_name, arg);
}

/* Is the timeline on (reads the environment on the first call)? */
int ddp__tl_enabled(void);
/* Names the calling thread's track ("loader worker 1"); copied.  Does
 * nothing when the timeline is off. */
void ddp__tl_name_thread(const char *name);
/* This process's rank and its clock's offset to rank 0's in ns (DDP's
 * creation sets them; before, the rank comes from the launcher's variables). */
void ddp__tl_set_rank(int rank, int64_t offset_ns);
/* The clock the timeline uses (CLOCK_MONOTONIC) in ns. */
uint64_t ddp__tl_clock_ns(void);

/* ---- timeline_merge.c ---------------------------------------------------- */
/* Writes s as a JSON string (quotes, escapes). */
void ddp__tl_put_string(FILE *f, const char *s);
/* Merges the rank files dir/timeline-rank<R>.json, ranks in order, into one
 * trace at out (NULL: dir/timeline.json); every event keeps its rank's
 * pid, so Perfetto shows one process per rank.  *nranks (may be NULL): the
 * files merged.  DDP_ERR_NOT_FOUND when dir holds none; DDP_ERR_FORMAT when
 * one is not a trace (its name and the parser's message). */
int ddp__timeline_merge_dir(const char *dir, const char *out, int *nranks);
/* ddprun's call after its workers exit: with DDP_TIMELINE_DIR set, merges
 * that folder's rank files into DIR/timeline.json; 0 when unset. */
int ddp__timeline_merge_env(void);
/* Reads and parses a trace file (one with a "traceEvents" array).  Caller
 * frees *out with ddp__json_free. */
struct ddp__json;
int ddp__timeline_load(const char *path, struct ddp__json **out);
/* Merges the given trace files into out. */
int ddp__timeline_merge(const char *const *paths, int n, const char *out);

#endif
