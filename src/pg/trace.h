/* The flight recorder of a process group (PyTorch's NCCL flight recorder,
 * for every backend): a ring of the group's last N operations, each with
 * its sequence number, arguments, state and timestamps, and the caller's
 * label (ddp_pg_set_label); plus the per-operation communication
 * statistics (comm_stats.c) fed from the same timestamps.
 *
 *   trace.c       the ring: record, update, copy out;
 *   trace_dump.c  the JSON dump (DDP_TRACE_DIR/trace-rank<R>.json), the
 *                 registry of live groups, SIGUSR1 and failure dumps;
 *   comm_stats.c  counts, bytes and time per operation and size bucket;
 *   debug.c       DDP_DEBUG and the detail level's fingerprint check.
 *
 * Cost.  Records and statistics have one writer at a time (the group's
 * executor, serialised by pg->busy; a record's first write by its issuer,
 * under the group's lock), so they take no lock: each record and the
 * statistics carry a version, odd while written (a seqlock), and readers
 * copy and retry.  Two clock reads per operation (three when it waits in
 * the queue), none with the recorder off and DDP_COMM_STATS=0
 * (bench/RESULTS.md). */
#ifndef DDP_PG_TRACE_H
#define DDP_PG_TRACE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "coll/coll.h"

#define DDP__TRACE_LABEL 60
#define DDP__STATS_BUCKETS 48 /* power-of-two byte sizes: [2^b, 2^(b+1)) */

enum { DDP__TR_QUEUED, DDP__TR_STARTED, DDP__TR_DONE, DDP__TR_FAILED };

/* 128 bytes: two cache lines per record (the ring is written, cold, once
 * per operation). */
typedef struct ddp__trace_entry {
    uint64_t id;         /* record number in this group, from 1; 0: an empty slot */
    uint64_t seq;        /* the collective's sequence number (point to point: 0) */
    int64_t queued_us, started_us, done_us; /* wall clock (CLOCK_REALTIME), 0: not yet */
    uint64_t count;
    int32_t root, peer, tag, rc; /* rc: a failed operation's error code */
    uint8_t kind, dtype, op, state; /* enum ddp__coll_kind, ddp_dtype, ddp_reduce_op, DDP__TR_* */
    char label[DDP__TRACE_LABEL];
} ddp__trace_entry;
_Static_assert(sizeof(ddp__trace_entry) == 128, "a record is two cache lines");

typedef struct ddp__stat_cell {
    uint64_t calls, bytes, us;
} ddp__stat_cell;

/* A ring slot: the record, as words read and written atomically (two
 * cache lines of their own). */
typedef struct ddp__trace_slot {
    _Alignas(64) uint64_t w[sizeof(ddp__trace_entry) / 8];
} ddp__trace_slot;

/* Its seqlock version (odd: being written), and open while the operation
 * is queued or running: its executor may still write it, so the issuer of
 * a newer one leaves it alone (trace.c). */
typedef struct ddp__trace_meta {
    _Atomic uint32_t ver, open;
} ddp__trace_meta;

typedef struct ddp__trace {
    size_t cap;              /* DDP_TRACE_BUFFER: slots, 0: recorder off */
    int stats_on;            /* statistics kept: cap or DDP_COMM_STATS=1 */
    ddp__trace_slot *ring;   /* (cap) record id lives in slot id % cap */
    ddp__trace_meta *meta;   /* (cap) */
    _Atomic uint64_t next_id; /* written under the group's lock */
    _Atomic uint32_t stats_ver; /* seqlock of stats */
    ddp__stat_cell stats[DDP__NUM_COLL][DDP__STATS_BUCKETS];
} ddp__trace;

/* Which of an operation's arguments mean something: root for the rooted
 * collectives, the reduce operator for the reducing ones. */
static inline int ddp__op_has_root(int kind)
{
    return kind == DDP__BROADCAST || kind == DDP__REDUCE || kind == DDP__GATHER ||
           kind == DDP__SCATTER;
}
static inline int ddp__op_has_reduce(int kind)
{
    return kind == DDP__ALL_REDUCE || kind == DDP__REDUCE || kind == DDP__REDUCE_SCATTER;
}

/* Reads DDP_TRACE_BUFFER and DDP_COMM_STATS and allocates the ring; error
 * set on a bad value or no memory. */
int ddp__trace_init(ddp__trace *t);
void ddp__trace_free(ddp__trace *t);

/* An operation issued with sequence number seq (under the group's lock):
 * its record id (0 when the recorder is off, or when the slot it would take
 * still holds an operation that is queued or running: more than cap of
 * them pending).  label may be NULL.  started: the caller runs it at once
 * (one clock read for both events); *t0_us is then its start time for
 * ddp__trace_finished (0 when nothing is kept). */
uint64_t ddp__trace_queued(ddp__trace *t, const ddp__coll_args *a, uint64_t seq,
                           const char *label, int started, int64_t *t0_us);
/* The executor starts record id (0: none); returns the start time (wall
 * clock, microseconds; 0 when nothing is kept) for ddp__trace_finished. */
int64_t ddp__trace_started(ddp__trace *t, uint64_t id);
/* It ended with rc; a successful operation's time and bytes go into the
 * statistics (when kept: stats_on). */
void ddp__trace_finished(ddp__trace *t, uint64_t id, const ddp__coll_args *a, int size,
                         int64_t t0_us, int rc);
/* Copies the records still in the ring, oldest first, into *out (caller
 * frees); *n of them.  Safe while operations run: a record being written
 * is read again once written. */
int ddp__trace_snapshot(ddp__trace *t, ddp__trace_entry **out, size_t *n);
/* A consistent copy of the statistics. */
void ddp__trace_stats(ddp__trace *t, ddp__stat_cell out[DDP__NUM_COLL][DDP__STATS_BUCKETS]);
/* "queued", "started", "done", "failed". */
const char *ddp__trace_state_name(int state);

/* The bytes an operation moves as nccl-tests count them (the algorithm
 * bandwidth's numerator) and the factor from algorithm to bus bandwidth. */
double ddp__stats_bytes(const ddp__coll_args *a, int size);
double ddp__stats_bus_factor(int kind, int size);

#endif
