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
};


/* The group's communication thread (work.c), started by group creation
 * and stopped by its teardown: runs the queued operations in issue order. */
void *ddp__pg_comm_thread(void *arg);
/* Checks and runs one operation: queued when work is non-NULL (*work is
 * the handle), else run on the caller's thread when the group is idle, or
 * queued and waited for. */
int ddp__pg_submit(ddp_pg_t *pg, const ddp__coll_args *a, ddp_work_t **work);

#endif
