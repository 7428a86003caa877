/* The flight recorder's ring (trace.h): one record per operation, written
 * when it is issued (queued, under the group's lock, which fixes the
 * order) and updated when the executor starts and ends it.  The ring has a
 * mutex of its own so that neither the dumper nor the executor's updates
 * ever wait on the group's lock, which a caller may hold while waiting. */
#include "pg/trace.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/env.h"
#include "base/error.h"

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
    pthread_mutex_init(&t->mu, NULL);
    size_t cap = 0;
    DDP_TRY(ddp__env_size("DDP_TRACE_BUFFER", &cap));
    if (cap) {
        t->ring = aligned_alloc(64, cap * sizeof *t->ring);
        if (t->ring)
            memset(t->ring, 0, cap * sizeof *t->ring);
        DDP_FAIL_IF(!t->ring, DDP_ERR_NOMEM, "flight recorder: no memory for %zu records", cap);
    }
    t->cap = cap;
    return 0;
}

void ddp__trace_free(ddp__trace *t)
{
    free(t->ring);
    t->ring = NULL;
    pthread_mutex_destroy(&t->mu);
}

uint64_t ddp__trace_queued(ddp__trace *t, const ddp__coll_args *a, uint64_t seq,
                           const char *label, int started, int64_t *t0_us)
{
    if (!t->cap && !started)
        return 0;
    int64_t now = wall_us();
    if (started)
        *t0_us = now;
    if (!t->cap)
        return 0;
    pthread_mutex_lock(&t->mu);
    uint64_t id = ++t->next_id;
    ddp__trace_entry *e = &t->ring[id % t->cap];
    e->id = id;
    e->seq = seq;
    e->queued_us = now;
    e->started_us = started ? now : 0;
    e->done_us = 0;
    e->count = a->count;
    e->root = a->root;
    e->peer = a->peer;
    e->tag = a->tag;
    e->rc = 0;
    e->kind = (uint8_t)a->kind;
    e->dtype = (uint8_t)a->dtype;
    e->op = (uint8_t)a->op;
    e->state = started ? DDP__TR_STARTED : DDP__TR_QUEUED;
    if (label && label[0])
        snprintf(e->label, sizeof e->label, "%s", label);
    else
        e->label[0] = '\0';
    pthread_mutex_unlock(&t->mu);
    return id;
}

/* Under mu: the record id, or NULL once the ring has moved past it. */
static ddp__trace_entry *find(ddp__trace *t, uint64_t id)
{
    ddp__trace_entry *e = id && t->cap ? &t->ring[id % t->cap] : NULL;
    return e && e->id == id ? e : NULL;
}

int64_t ddp__trace_started(ddp__trace *t, uint64_t id)
{
    int64_t now = wall_us();
    if (id) {
        pthread_mutex_lock(&t->mu);
        ddp__trace_entry *e = find(t, id);
        if (e) {
            e->state = DDP__TR_STARTED;
            e->started_us = now;
        }
        pthread_mutex_unlock(&t->mu);
    }
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
    int64_t now = wall_us();
    double dt = (double)(now - t0_us) * 1e-6;
    double bytes = ddp__stats_bytes(a, size);
    pthread_mutex_lock(&t->mu);
    ddp__trace_entry *e = find(t, id);
    if (e) {
        e->state = rc < 0 ? DDP__TR_FAILED : DDP__TR_DONE;
        e->rc = rc;
        e->done_us = now;
    }
    if (rc == 0 && a->kind >= 0 && a->kind < DDP__NUM_COLL) {
        ddp__stat_cell *c = &t->stats[a->kind][stats_bucket(bytes)];
        c->calls++;
        c->bytes += (uint64_t)bytes;
        c->seconds += dt;
    }
    pthread_mutex_unlock(&t->mu);
}

int ddp__trace_snapshot(ddp__trace *t, ddp__trace_entry **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (!t->cap)
        return 0;
    pthread_mutex_lock(&t->mu);
    uint64_t last = t->next_id, first = last > t->cap ? last - t->cap + 1 : 1;
    size_t k = (size_t)(last - first + 1);
    ddp__trace_entry *v = k ? malloc(k * sizeof *v) : NULL;
    if (k && !v) {
        pthread_mutex_unlock(&t->mu);
        return DDP_ERROR(DDP_ERR_NOMEM, "flight recorder: no memory for a copy");
    }
    for (uint64_t id = first; k && id <= last; id++)
        v[id - first] = t->ring[id % t->cap];
    pthread_mutex_unlock(&t->mu);
    *out = v;
    *n = k;
    return 0;
}

const char *ddp__trace_state_name(int state)
{
    static const char *const names[] = {"queued", "started", "done", "failed"};
    return state >= 0 && state <= DDP__TR_FAILED ? names[state] : "unknown";
}
