/* The flight recorder's lock-free ring (src/pg/trace.c) under a reader
 * that copies it while the executor writes: every copied record is whole
 * (its fields agree with each other, never half of two operations), in
 * order, and the ring never overwrites an operation still pending.  The
 * reader is the dumper's own copy (ddp__trace_snapshot, which
 * ddp_pg_dump_trace calls); run it under the sanitizer build too. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pg/trace.h"

#define OPS 1000000

static ddp__trace T;
static _Atomic int writing;

/* Operation i's arguments: every field derived from i, so a record mixing
 * two operations shows. */
static ddp__coll_args args_of(uint64_t i)
{
    ddp__coll_args a;
    memset(&a, 0, sizeof a);
    a.kind = DDP__ALL_REDUCE;
    a.count = (size_t)i * 3;
    a.dtype = DDP_FLOAT32;
    a.op = DDP_SUM;
    a.root = (int)(i % 1000);
    a.tag = (int)(i % 77);
    return a;
}

/* The executor: inline (queued and started at once) and queued operations
 * alternately, as work.c issues them. */
static void *writer(void *arg)
{
    (void)arg;
    for (uint64_t i = 1; i <= OPS; i++) {
        ddp__coll_args a = args_of(i);
        char label[32];
        snprintf(label, sizeof label, "op %llu", (unsigned long long)i);
        int64_t t0 = 0;
        uint64_t id = ddp__trace_queued(&T, &a, i, label, (int)(i & 1), &t0);
        if (!(i & 1))
            t0 = ddp__trace_started(&T, id);
        ddp__trace_finished(&T, id, &a, 2, t0, 0);
    }
    atomic_store(&writing, 0);
    return NULL;
}

/* 0 when e is one operation's whole record. */
static int check_record(const ddp__trace_entry *e)
{
    ddp__coll_args a = args_of(e->seq);
    char label[32];
    snprintf(label, sizeof label, "op %llu", (unsigned long long)e->seq);
    if (e->id != e->seq || e->count != a.count || e->root != a.root || e->tag != a.tag ||
        e->kind != DDP__ALL_REDUCE || strcmp(e->label, label) != 0)
        return -1;
    if (e->state > DDP__TR_DONE || !e->queued_us)
        return -1;
    if (e->state >= DDP__TR_STARTED && e->started_us < e->queued_us)
        return -1;
    if (e->state == DDP__TR_DONE && e->done_us < e->started_us)
        return -1;
    if ((e->state == DDP__TR_DONE) != (e->done_us != 0))
        return -1;
    return 0;
}

static void test_snapshot_while_writing(void **state)
{
    (void)state;
    setenv("DDP_TRACE_BUFFER", "64", 1);
    assert_int_equal(ddp__trace_init(&T), 0);
    atomic_store(&writing, 1);
    pthread_t w;
    assert_int_equal(pthread_create(&w, NULL, writer, NULL), 0);
    long copies = 0, records = 0, bad = 0, disorder = 0;
    while (atomic_load(&writing)) {
        ddp__trace_entry *v;
        size_t n;
        assert_int_equal(ddp__trace_snapshot(&T, &v, &n), 0);
        for (size_t i = 0; i < n; i++) {
            if (check_record(&v[i]) != 0) {
                if (bad++ < 3)
                    fprintf(stderr, "torn record: id %llu seq %llu count %llu label '%.20s'\n",
                            (unsigned long long)v[i].id, (unsigned long long)v[i].seq,
                            (unsigned long long)v[i].count, v[i].label);
            }
            if (i && v[i].id <= v[i - 1].id)
                disorder++;
        }
        records += (long)n;
        copies++;
        free(v);
    }
    pthread_join(w, NULL);
    fprintf(stderr, "%ld copies, %ld records checked\n", copies, records);
    assert_int_equal(bad, 0);
    assert_int_equal(disorder, 0);
    assert_true(copies > 10 && records > 100); /* the reader did run meanwhile */

    /* Once the writer is done: the last 64, all done, and the statistics
     * count every operation. */
    ddp__trace_entry *v;
    size_t n;
    assert_int_equal(ddp__trace_snapshot(&T, &v, &n), 0);
    assert_int_equal(n, 64);
    assert_int_equal(v[63].seq, OPS);
    assert_int_equal(v[0].state, DDP__TR_DONE);
    free(v);
    ddp__stat_cell cells[DDP__NUM_COLL][DDP__STATS_BUCKETS];
    ddp__trace_stats(&T, cells);
    uint64_t calls = 0;
    for (int b = 0; b < DDP__STATS_BUCKETS; b++)
        calls += cells[DDP__ALL_REDUCE][b].calls;
    assert_int_equal(calls, OPS);
    ddp__trace_free(&T);
}

/* More operations pending than the ring holds: the oldest (the one a hang
 * is about) stays, the newest go unrecorded until it ends. */
static void test_pending_are_never_overwritten(void **state)
{
    (void)state;
    setenv("DDP_TRACE_BUFFER", "4", 1);
    assert_int_equal(ddp__trace_init(&T), 0);
    uint64_t ids[6];
    for (uint64_t i = 0; i < 6; i++) {
        ddp__coll_args a = args_of(i + 1);
        ids[i] = ddp__trace_queued(&T, &a, i + 1, NULL, 0, NULL);
    }
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[3], 4);
    assert_int_equal(ids[4], 0); /* slot of record 1, still queued */
    assert_int_equal(ids[5], 0);
    ddp__coll_args a1 = args_of(1);
    ddp__trace_finished(&T, ids[0], &a1, 2, ddp__trace_started(&T, ids[0]), 0);
    ddp__coll_args a7 = args_of(7);
    assert_int_equal(ddp__trace_queued(&T, &a7, 7, NULL, 0, NULL), 5);
    ddp__trace_entry *v;
    size_t n;
    assert_int_equal(ddp__trace_snapshot(&T, &v, &n), 0);
    assert_int_equal(n, 4);
    assert_int_equal(v[0].seq, 2);
    assert_int_equal(v[3].seq, 7);
    assert_int_equal(v[3].state, DDP__TR_QUEUED);
    free(v);
    ddp__trace_free(&T);
}

/* Recorder off and DDP_COMM_STATS=0: nothing kept, no clock read (times 0). */
static void test_everything_off(void **state)
{
    (void)state;
    setenv("DDP_TRACE_BUFFER", "0", 1);
    setenv("DDP_COMM_STATS", "0", 1);
    assert_int_equal(ddp__trace_init(&T), 0);
    assert_int_equal(T.stats_on, 0);
    ddp__coll_args a = args_of(1);
    int64_t t0 = -1;
    assert_int_equal(ddp__trace_queued(&T, &a, 1, NULL, 1, &t0), 0);
    assert_int_equal(t0, 0);
    assert_int_equal(ddp__trace_started(&T, 0), 0);
    ddp__trace_finished(&T, 0, &a, 2, t0, 0);
    ddp__trace_free(&T);
    setenv("DDP_COMM_STATS", "1", 1);
    assert_int_equal(ddp__trace_init(&T), 0);
    assert_int_equal(T.stats_on, 1);
    assert_int_equal(ddp__trace_queued(&T, &a, 1, NULL, 1, &t0), 0);
    assert_true(t0 > 0);
    ddp__trace_finished(&T, 0, &a, 2, t0, 0);
    ddp__stat_cell cells[DDP__NUM_COLL][DDP__STATS_BUCKETS];
    ddp__trace_stats(&T, cells);
    assert_int_equal(cells[DDP__ALL_REDUCE][3].calls, 1); /* 12 bytes: [8, 16) */
    ddp__trace_free(&T);
    unsetenv("DDP_COMM_STATS");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_snapshot_while_writing),
        cmocka_unit_test(test_pending_are_never_overwritten),
        cmocka_unit_test(test_everything_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
