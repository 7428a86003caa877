/* The flight recorder's ring (trace.h): one record per operation, written
 * when it is issued (queued, under the group's lock, which fixes the
 * order) and updated when the executor starts and ends it.
 *
 * No lock.  Each slot has one writer at a time: its issuer, then (once the
 * operation is dequeued, under the group's lock, or at once when run
 * inline) the executor, which pg->busy makes a single thread; the issuer
 * of a newer record takes a slot back only once its operation has ended
 * (open == 0, stored with release by the executor after its last write).
 * Readers (the dumper, the statistics' log) run on any thread: each slot
 * is a seqlock, version odd while written, and a reader copies the words
 * and retries when the version moved.  The words are read and written
 * with relaxed atomics (plain moves on x86), ordered by the fences. */
#include "pg/trace.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/env.h"
#include "base/error.h"

#define NWORDS (sizeof(ddp__trace_entry) / 8)
_Static_assert(sizeof(ddp__trace_entry) % 8 == 0, "a record is whole words");

/* One clock read per event (each costs ~80 ns on a kvm-clock VM, more than
 * the rest of a record): the wall clock, so that ranks' dumps compare, and
 * the statistics' durations from the same reads. */
static int64_t wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int ddp__trace_init(ddp__trace *t)
{
    memset(t, 0, sizeof *t);
    size_t cap = 0;
    int stats = 0;
    DDP_TRY(ddp__env_size("DDP_TRACE_BUFFER", &cap));
    DDP_TRY(ddp__env_bool("DDP_COMM_STATS", &stats));
    if (cap) {
        t->ring = aligned_alloc(64, cap * sizeof *t->ring);
        t->meta = calloc(cap, sizeof *t->meta);
        if (t->ring)
            memset(t->ring, 0, cap * sizeof *t->ring);
        if (!t->ring || !t->meta)
            ddp__trace_free(t);
        DDP_FAIL_IF(!t->ring, DDP_ERR_NOMEM, "flight recorder: no memory for %zu records", cap);
    }
    t->cap = cap;
    t->stats_on = cap || stats;
    return 0;
}

void ddp__trace_free(ddp__trace *t)
{
    free(t->ring);
    free(t->meta);
    t->ring = NULL;
    t->meta = NULL;
}

/* ---- the seqlock ------------------------------------------------------ */

/* The writer's side: n words of src into dst, bracketed by *ver. */
static void seq_write(_Atomic uint32_t *ver, uint64_t *dst, const uint64_t *src, size_t n)
{
    uint32_t v = atomic_load_explicit(ver, memory_order_relaxed);
    atomic_store_explicit(ver, v + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release); /* odd before any word */
    for (size_t i = 0; i < n; i++)
        __atomic_store_n(&dst[i], src[i], __ATOMIC_RELAXED);
    atomic_store_explicit(ver, v + 2, memory_order_release);
}

/* The reader's side: 0 with a consistent copy, -1 when the writer kept
 * writing (preempted in the middle: a few microseconds of retries and
 * yields). */
static int seq_read(_Atomic uint32_t *ver, const uint64_t *src, uint64_t *dst, size_t n)
{
    for (int tries = 0; tries < 10000; tries++) {
        uint32_t v1 = atomic_load_explicit(ver, memory_order_acquire);
        if (!(v1 & 1)) {
            for (size_t i = 0; i < n; i++)
                dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
            atomic_thread_fence(memory_order_acquire); /* the words before the check */
            if (atomic_load_explicit(ver, memory_order_relaxed) == v1)
                return 0;
        }
        if (tries >= 100)
            sched_yield();
    }
    return -1;
}

/* The record's layout as words (trace.h), for the writers. */
#define WORD(field) (offsetof(ddp__trace_entry, field) / 8)
#define IN_WORD(field) (offsetof(ddp__trace_entry, field) % 8)
_Static_assert(WORD(id) == 0 && IN_WORD(started_us) == 0 && IN_WORD(done_us) == 0,
               "ids and times are whole words");
_Static_assert(WORD(rc) != WORD(state) && WORD(rc) != WORD(done_us), "one store per word");
_Static_assert(offsetof(ddp__trace_entry, seq) == 8 && offsetof(ddp__trace_entry, count) == 40 &&
                   IN_WORD(root) == 0 && WORD(peer) == WORD(root) && IN_WORD(tag) == 0 &&
                   WORD(rc) == WORD(tag) && IN_WORD(kind) == 0 && WORD(label) == WORD(kind) &&
                   offsetof(ddp__trace_entry, label) == offsetof(ddp__trace_entry, kind) + 4,
               "the word layout the writers build");

/* Two 32-bit fields as the word they share (lo first in memory). */
static inline uint64_t pack32(int32_t lo, int32_t hi)
{
    int32_t two[2] = {lo, hi};
    uint64_t w;
    memcpy(&w, two, 8);
    return w;
}

static int slot_get(ddp__trace *t, size_t i, ddp__trace_entry *e)
{
    uint64_t w[NWORDS];
    if (seq_read(&t->meta[i].ver, t->ring[i].w, w, NWORDS) < 0)
        return -1;
    memcpy(e, w, sizeof w);
    return 0;
}

/* The executor's update of its record id: a time and the state (and a
 * failure's code) written in place, word by word (a copy of the whole
 * record through the stack costs more than the rest of it). */
static void update(ddp__trace *t, uint64_t id, size_t time_word, int64_t now, int state, int rc)
{
    if (!id || !t->cap)
        return;
    size_t i = (size_t)(id % t->cap);
    uint64_t *w = t->ring[i].w;
    if (__atomic_load_n(&w[0], __ATOMIC_RELAXED) != id) /* only this thread writes it now */
        return;
    uint64_t ws = __atomic_load_n(&w[WORD(state)], __ATOMIC_RELAXED);
    uint64_t wr = __atomic_load_n(&w[WORD(rc)], __ATOMIC_RELAXED);
    uint8_t st = (uint8_t)state;
    int32_t rc32 = rc;
    memcpy((char *)&ws + IN_WORD(state), &st, 1);
    memcpy((char *)&wr + IN_WORD(rc), &rc32, 4);
    _Atomic uint32_t *ver = &t->meta[i].ver;
    uint32_t v = atomic_load_explicit(ver, memory_order_relaxed);
    atomic_store_explicit(ver, v + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    __atomic_store_n(&w[time_word], (uint64_t)now, __ATOMIC_RELAXED);
    __atomic_store_n(&w[WORD(state)], ws, __ATOMIC_RELAXED);
    __atomic_store_n(&w[WORD(rc)], wr, __ATOMIC_RELAXED);
    atomic_store_explicit(ver, v + 2, memory_order_release);
    if (state >= DDP__TR_DONE)
        atomic_store_explicit(&t->meta[i].open, 0, memory_order_release); /* the issuer's again */
}

/* ---- the writers ------------------------------------------------------ */

uint64_t ddp__trace_queued(ddp__trace *t, const ddp__coll_args *a, uint64_t seq,
                           const char *label, int started, int64_t *t0_us)
{
    if (!t->cap && !started)
        return 0;
    int64_t now = t->stats_on ? wall_us() : 0;
    if (started)
        *t0_us = now;
    if (!t->cap)
        return 0;
    uint64_t id = atomic_load_explicit(&t->next_id, memory_order_relaxed) + 1;
    size_t i = (size_t)(id % t->cap);
    /* More than cap operations pending: the oldest (the one a hang is
     * about) stays, this one goes unrecorded. */
    if (atomic_load_explicit(&t->meta[i].open, memory_order_acquire))
        return 0;
    /* The words built in registers, not through a record on the stack:
     * narrow stores read back as words would stall store forwarding. */
    uint64_t w[NWORDS] = {id, seq, (uint64_t)now, started ? (uint64_t)now : 0, 0, a->count};
    w[WORD(root)] = pack32(a->root, a->peer);
    w[WORD(tag)] = pack32(a->tag, 0);
    uint8_t small[8] = {(uint8_t)a->kind, (uint8_t)a->dtype, (uint8_t)a->op,
                        (uint8_t)(started ? DDP__TR_STARTED : DDP__TR_QUEUED)};
    /* The label's words only as far as its NUL: readers stop there, so an
     * unlabelled record is 9 words, not 16. */
    size_t n = WORD(kind) + 1;
    if (label && label[0]) { /* rare: the caller's ddp_pg_set_label */
        char text[sizeof w - offsetof(ddp__trace_entry, label)] = {0};
        int len = snprintf(text, sizeof text, "%s", label);
        size_t end = offsetof(ddp__trace_entry, label) +
                     (len < (int)sizeof text ? (size_t)len : sizeof text - 1) + 1;
        memcpy(small + 4, text, 4);
        memcpy(&w[WORD(kind) + 1], text + 4, sizeof text - 4);
        n = (end + 7) / 8;
    }
    memcpy(&w[WORD(kind)], small, 8);
    atomic_store_explicit(&t->meta[i].open, 1, memory_order_relaxed);
    seq_write(&t->meta[i].ver, t->ring[i].w, w, n);
    atomic_store_explicit(&t->next_id, id, memory_order_release);
    return id;
}

int64_t ddp__trace_started(ddp__trace *t, uint64_t id)
{
    if (!t->stats_on)
        return 0;
    int64_t now = wall_us();
    update(t, id, WORD(started_us), now, DDP__TR_STARTED, 0);
    return now;
}

/* [2^b, 2^(b+1)) holds bytes; 0 and 1 byte go to bucket 0. */
static int stats_bucket(double bytes)
{
    uint64_t v = bytes >= 2 ? (uint64_t)bytes : 1;
    int b = 63 - __builtin_clzll(v);
    return b < DDP__STATS_BUCKETS ? b : DDP__STATS_BUCKETS - 1;
}

void ddp__trace_finished(ddp__trace *t, uint64_t id, const ddp__coll_args *a, int size,
                         int64_t t0_us, int rc)
{
    if (!t->stats_on)
        return;
    int64_t now = wall_us();
    update(t, id, WORD(done_us), now, rc < 0 ? DDP__TR_FAILED : DDP__TR_DONE, rc);
    if (rc == 0 && a->kind >= 0 && a->kind < DDP__NUM_COLL) {
        double bytes = ddp__stats_bytes(a, size);
        ddp__stat_cell *c = &t->stats[a->kind][stats_bucket(bytes)];
        ddp__stat_cell v = {c->calls + 1, c->bytes + (uint64_t)bytes,
                            c->us + (uint64_t)(now > t0_us ? now - t0_us : 0)};
        seq_write(&t->stats_ver, (uint64_t *)c, (const uint64_t *)&v, 3);
    }
}

/* ---- the readers ------------------------------------------------------ */

int ddp__trace_snapshot(ddp__trace *t, ddp__trace_entry **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (!t->cap)
        return 0;
    uint64_t last = atomic_load_explicit(&t->next_id, memory_order_acquire);
    uint64_t first = last > t->cap ? last - t->cap + 1 : 1;
    size_t k = (size_t)(last - first + 1), got = 0;
    ddp__trace_entry *v = k ? malloc(k * sizeof *v) : NULL;
    DDP_FAIL_IF(k && !v, DDP_ERR_NOMEM, "flight recorder: no memory for a copy");
    /* A slot the ring has moved past since (a newer id) or one whose writer
     * stayed in the middle of it is left out. */
    for (uint64_t id = first; k && id <= last; id++)
        if (slot_get(t, (size_t)(id % t->cap), &v[got]) == 0 && v[got].id == id)
            got++;
    *out = v;
    *n = got;
    return 0;
}

void ddp__trace_stats(ddp__trace *t, ddp__stat_cell out[DDP__NUM_COLL][DDP__STATS_BUCKETS])
{
    size_t n = sizeof t->stats / 8;
    if (seq_read(&t->stats_ver, (const uint64_t *)t->stats, (uint64_t *)out, n) < 0)
        memset(out, 0, sizeof t->stats); /* never seen: one writer, a few stores */
}

const char *ddp__trace_state_name(int state)
{
    static const char *const names[] = {"queued", "started", "done", "failed"};
    return state >= 0 && state <= DDP__TR_FAILED ? names[state] : "unknown";
}
