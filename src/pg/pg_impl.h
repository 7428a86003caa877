/* Private to the process-group files (pg.c: creation, teardown, accessors;
 * work.c: the executor, the communication thread and its queue, work
 * handles, symmetric memory; collectives.c: the collectives' entry points):
 * the group's struct and the calls between them.  Unlike pg/internal.h
 * (hooks for the DDP layer, tests and tools), nothing outside src/pg/
 * includes this. */
#ifndef DDP_PG_PG_IMPL_H
#define DDP_PG_PG_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "coll/coll.h"
#include "ddp/pg.h"
#include "pg/backend.h"
#include "pg/trace.h"

#define MSG_LEN 1024

struct ddp_pg {
    const ddp__backend *be;
    void *impl;
    int rank, size;
    double timeout_s;
    char prefix[256];      /* store keys of this group */
    ddp_store_t *store;
    int owns_store;
    int nsub;              /* new_group calls so far */
    atomic_int refs;       /* the creator's handle, plus one per ddp__pg_retain */

    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* the thread waits for work */
    pthread_cond_t cv_done; /* callers wait for completions */
    pthread_t thread;
    int thread_started;
    ddp_work_t *head, *tail;
    int busy;               /* an operation is running (thread or caller) */
    int stop;
    uint64_t next_seq;
    int broken;
    int broken_rc;
    char broken_msg[MSG_LEN];

    /* Seeing what a job does (trace.h): */
    ddp__trace trace;       /* the flight recorder and the statistics */
    char label[DDP__TRACE_LABEL]; /* under mu: ddp_pg_set_label's, "" for none */
    int debug;              /* DDP_DEBUG: DDP__DEBUG_* */
    ddp_pg_t *world;        /* the group this one was split from (itself for a world) */
    int *granks;            /* (size) each member's rank in world */
    ddp_pg_t *reg_next;     /* the registry of live groups (trace_dump.c) */
    int nbarriers;          /* monitored barriers so far */
};

enum { DDP__DEBUG_OFF, DDP__DEBUG_INFO, DDP__DEBUG_DETAIL };


/* The group's communication thread (work.c), started by group creation
 * and stopped by its teardown: runs the queued operations in issue order. */
void *ddp__pg_comm_thread(void *arg);
/* Checks and runs one operation: queued when work is non-NULL (*work is
 * the handle), else run on the caller's thread when the group is idle, or
 * queued and waited for. */
int ddp__pg_submit(ddp_pg_t *pg, const ddp__coll_args *a, ddp_work_t **work);

/* ---- trace_dump.c ---- */
/* SIGUSR1's handler, installed where SIGUSR1 still has its default action,
 * before anything that can wait (a store's connection, the rendezvous): a
 * launcher's SIGUSR1 to a rank that hangs there must not kill it.  Until a
 * group with its recorder on is registered the handler does nothing. */
void ddp__trace_install_handler(void);
/* Adds a group to the process's registry of live groups (which SIGUSR1
 * dumps) before it connects, so that a dump shows a group still setting up
 * (pg->impl NULL, read under pg->mu); starts the watcher thread at the
 * first group whose recorder is on.  Removes it at teardown or failure. */
void ddp__trace_register(ddp_pg_t *pg);
void ddp__trace_unregister(ddp_pg_t *pg);
/* After operation failure on pg (msg: its message, len bytes): writes every
 * group's dump under DDP_TRACE_DIR, and appends to msg where it went, or how
 * to get one. */
void ddp__trace_on_failure(ddp_pg_t *pg, char *msg, size_t len);
/* At a world group's teardown: the dump under DDP_TRACE_DIR, when set. */
void ddp__trace_at_destroy(ddp_pg_t *pg);

/* ---- debug.c ---- */
/* Reads DDP_DEBUG into pg->debug (error set on a bad value). */
int ddp__debug_init(ddp_pg_t *pg);
/* DDP_DEBUG=detail, before collective a (#seq) runs: every rank's
 * fingerprint (operation, dtype, count, root, reduce op) exchanged over the
 * group; DDP_ERR_MISMATCH naming the first rank that differs from rank 0
 * and both calls. */
int ddp__debug_check(ddp_pg_t *pg, const ddp__coll_args *a, uint64_t seq, double deadline);
/* "all_reduce (4 x float32, sum)", "broadcast (8 x int64, root 1)". */
void ddp__op_text(const ddp__coll_args *a, char *out, size_t len);

/* ---- comm_stats.c ---- */
/* At teardown, with DDP_COMM_STATS=1: ddp_pg_log_comm_stats. */
void ddp__comm_stats_at_destroy(ddp_pg_t *pg);

#endif
