/* Process groups: the executor, the communication thread and its work
 * queue, asynchronous work handles, and symmetric memory (which takes the
 * executor's place).  Split from pg.c (creation, teardown, accessors); see
 * include/ddp/pg.h.
 *
 * Execution model.  A backend is single-threaded: exactly one thread, the
 * executor, runs operations on it.  Asynchronous operations are queued and
 * run by the group's communication thread in issue order; the thread sleeps
 * on a condition variable when the queue is empty (and in epoll while an
 * operation waits for the network), so it takes no core from the compute
 * threads.  A blocking call issued while nothing is queued or running runs
 * on the caller's own thread: no hand-off, no wake-up latency (that is what
 * makes a 4-byte all-reduce cost one network round).  Otherwise it is
 * queued like an asynchronous one and the caller waits for it.
 *
 * Failure.  When an operation fails, the backend is aborted (peers see the
 * failure, in-flight requests are dropped) and the group is marked broken:
 * every later operation fails at once with the first error's message. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/log.h"
#include "base/timeline.h"
#include "pg/internal.h"
#include "pg/pg_impl.h"

struct ddp_work {
    ddp_pg_t *pg;
    ddp__coll_args args;
    uint64_t seq;
    uint64_t trace_id;   /* its flight-recorder record */
    int heap;            /* queued by an _async call (else on a waiter's stack) */
    atomic_int refs;     /* heap works: the user's and the queue's */
    atomic_int done;
    int rc;
    char msg[MSG_LEN];
    struct ddp_work *next;
};


/* ------------------------------------------------------------------ */
/* Execution                                                            */
/* ------------------------------------------------------------------ */

static int is_collective(int kind) { return kind != DDP__SEND && kind != DDP__RECV; }

/* Runs one operation on the executor thread (record trace_id of the flight
 * recorder, started at t0 when not 0); on failure aborts the backend and
 * returns the message in msg, which also says where the flight recorder
 * went (trace_dump.c). */
static int execute(ddp_pg_t *pg, const ddp__coll_args *a, uint64_t seq, uint64_t trace_id,
                   int64_t t0, char *msg)
{
    if (!t0) /* queued: it starts now; else the caller's record said so */
        t0 = ddp__trace_started(&pg->trace, trace_id);
    double deadline = ddp_time_now() + pg->timeout_s;
    int rc = 0;
    if (pg->debug == DDP__DEBUG_DETAIL && is_collective(a->kind))
        rc = ddp__debug_check(pg, a, seq, deadline);
    if (rc == 0) {
        /* The timeline's span on the executor's track ("comm" when queued):
         * its own monotonic clock, not the recorder's wall clock. */
        uint64_t tl0 = ddp__tl_begin();
        rc = pg->be->run(pg->impl, a, seq, deadline);
        ddp__tl_end(tl0, ddp__coll_name(a->kind), "seq", (int64_t)seq);
    }
    ddp__trace_finished(&pg->trace, trace_id, a, pg->size, t0, rc);
    if (rc < 0) {
        if (is_collective(a->kind))
            ddp__error_context(rc, "%s #%llu (%zu x %s) on rank %d", ddp__coll_name(a->kind),
                               (unsigned long long)seq, a->count, ddp_dtype_name(a->dtype),
                               pg->rank);
        else
            ddp__error_context(rc, "%s (peer %d, tag %d) on rank %d", ddp__coll_name(a->kind),
                               a->peer, a->tag, pg->rank);
        snprintf(msg, MSG_LEN, "%s", ddp_last_error());
        pg->be->abort(pg->impl, rc, msg);
        ddp__trace_on_failure(pg, msg, MSG_LEN);
    }
    return rc;
}

/* Under mu: records a failure (the first one wins). */
static void mark_broken(ddp_pg_t *pg, int rc, const char *msg)
{
    if (pg->broken)
        return;
    pg->broken = 1;
    pg->broken_rc = rc;
    snprintf(pg->broken_msg, sizeof pg->broken_msg, "%s", msg);
    DDP_WARN("process group rank %d broken: %s", pg->rank, msg);
}

/* Under mu: 0 while the group works; else its first failure's code, with
 * "process group already failed: <why>" in msg (MSG_LEN bytes). */
static int broken_error(const ddp_pg_t *pg, char *msg)
{
    if (!pg->broken)
        return 0;
    snprintf(msg, MSG_LEN, "process group already failed: %.960s", pg->broken_msg);
    return pg->broken_rc;
}

/* Under mu: gives up the executor's place taken by the caller's thread. */
static void leave_executor(ddp_pg_t *pg)
{
    pg->busy = 0;
    if (pg->head)
        pthread_cond_signal(&pg->cv_work);
    pthread_cond_broadcast(&pg->cv_done); /* for become_executor */
}

static void release_work(ddp_work_t *w)
{
    if (atomic_fetch_sub(&w->refs, 1) == 1)
        free(w);
}

void *ddp__pg_comm_thread(void *arg)
{
    ddp_pg_t *pg = arg;
    ddp__tl_name_thread("comm");
    pthread_mutex_lock(&pg->mu);
    for (;;) {
        while (!pg->stop && (!pg->head || pg->busy))
            pthread_cond_wait(&pg->cv_work, &pg->mu);
        if (!pg->head || pg->busy) /* stopping and drained */
            break;
        ddp_work_t *w = pg->head;
        pg->head = w->next;
        if (!pg->head)
            pg->tail = NULL;
        pg->busy = 1;
        char msg[MSG_LEN] = "";
        int rc = broken_error(pg, msg), broken = rc != 0;
        pthread_mutex_unlock(&pg->mu);
        if (!broken)
            rc = execute(pg, &w->args, w->seq, w->trace_id, 0, msg);
        else /* never ran: the record says failed, not queued forever */
            ddp__trace_finished(&pg->trace, w->trace_id, &w->args, pg->size, 0, rc);
        pthread_mutex_lock(&pg->mu);
        if (rc < 0 && !broken)
            mark_broken(pg, rc, msg);
        pg->busy = 0;
        w->rc = rc;
        snprintf(w->msg, sizeof w->msg, "%s", msg);
        int heap = w->heap;
        atomic_store(&w->done, 1);
        pthread_cond_broadcast(&pg->cv_done);
        if (heap)
            release_work(w); /* a stack work belongs to its waiter: hands off */
    }
    pthread_mutex_unlock(&pg->mu);
    return NULL;
}

static void enqueue(ddp_pg_t *pg, ddp_work_t *w)
{
    w->next = NULL;
    if (pg->tail)
        pg->tail->next = w;
    else
        pg->head = w;
    pg->tail = w;
    pthread_cond_signal(&pg->cv_work);
}

int ddp__pg_submit(ddp_pg_t *pg, const ddp__coll_args *a, ddp_work_t **work)
{
    DDP_FAIL_IF(!pg, DDP_ERR_INVALID_ARG, "%s: NULL process group", ddp__coll_name(a->kind));
    DDP_TRY(ddp__coll_check(a, pg->rank, pg->size));
    if (work) {
        *work = NULL;
        ddp_work_t *w = calloc(1, sizeof *w);
        DDP_FAIL_IF(!w, DDP_ERR_NOMEM, "out of memory");
        w->pg = pg;
        w->args = *a;
        w->heap = 1;
        atomic_init(&w->refs, 2);
        atomic_init(&w->done, 0);
        pthread_mutex_lock(&pg->mu);
        char msg[MSG_LEN];
        int rc = broken_error(pg, msg);
        if (rc) {
            pthread_mutex_unlock(&pg->mu);
            free(w);
            return DDP_ERROR(rc, "%s", msg);
        }
        w->seq = is_collective(a->kind) ? pg->next_seq++ : 0;
        w->trace_id = ddp__trace_queued(&pg->trace, a, w->seq, pg->label, 0, NULL);
        enqueue(pg, w);
        pthread_mutex_unlock(&pg->mu);
        *work = w;
        return 0;
    }
    pthread_mutex_lock(&pg->mu);
    char msg[MSG_LEN];
    int rc = broken_error(pg, msg);
    if (rc) {
        pthread_mutex_unlock(&pg->mu);
        return DDP_ERROR(rc, "%s", msg);
    }
    uint64_t seq = is_collective(a->kind) ? pg->next_seq++ : 0;
    if (!pg->head && !pg->busy) {
        /* Idle: run here, on the caller's thread. */
        pg->busy = 1;
        int64_t t0 = 0;
        uint64_t trace_id = ddp__trace_queued(&pg->trace, a, seq, pg->label, 1, &t0);
        pthread_mutex_unlock(&pg->mu);
        rc = execute(pg, a, seq, trace_id, t0, msg);
        pthread_mutex_lock(&pg->mu);
        if (rc < 0)
            mark_broken(pg, rc, msg);
        leave_executor(pg);
        pthread_mutex_unlock(&pg->mu);
        if (rc < 0) /* execute left the message on this thread */
            return rc;
        return 0;
    }
    ddp_work_t w;
    memset(&w, 0, sizeof w);
    w.pg = pg;
    w.args = *a;
    w.seq = seq;
    w.trace_id = ddp__trace_queued(&pg->trace, a, seq, pg->label, 0, NULL);
    atomic_init(&w.refs, 1);
    atomic_init(&w.done, 0);
    enqueue(pg, &w);
    while (!atomic_load(&w.done))
        pthread_cond_wait(&pg->cv_done, &pg->mu);
    pthread_mutex_unlock(&pg->mu);
    if (w.rc < 0)
        return DDP_ERROR(w.rc, "%s", w.msg);
    return 0;
}

/* ------------------------------------------------------------------ */
/* Work handles                                                         */
/* ------------------------------------------------------------------ */

/* Under mu: waits for a completion (cv_done) until deadline (ddp_time_now
 * seconds); 0 once the deadline has passed. */
static int wait_done(ddp_pg_t *pg, double deadline)
{
    double left = deadline - ddp_time_now();
    if (left <= 0)
        return 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double t = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + (left < 1e6 ? left : 1e6);
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    pthread_cond_timedwait(&pg->cv_done, &pg->mu, &ts);
    return 1;
}

int ddp_work_wait(ddp_work_t *w, double timeout_s)
{
    DDP_FAIL_IF(!w, DDP_ERR_INVALID_ARG, "ddp_work_wait: NULL work");
    if (!atomic_load(&w->done)) {
        ddp_pg_t *pg = w->pg;
        double deadline = ddp_time_now() + (timeout_s < 0 ? 1e9 : timeout_s);
        pthread_mutex_lock(&pg->mu);
        while (!atomic_load(&w->done) && wait_done(pg, deadline))
            ;
        pthread_mutex_unlock(&pg->mu);
        DDP_FAIL_IF(!atomic_load(&w->done), DDP_ERR_TIMEOUT,
                    "%s #%llu still running after %.1f s", ddp__coll_name(w->args.kind),
                    (unsigned long long)w->seq, timeout_s);
    }
    if (w->rc < 0)
        return DDP_ERROR(w->rc, "%s", w->msg);
    return 0;
}

int ddp_work_test(ddp_work_t *w, int *done)
{
    DDP_FAIL_IF(!w || !done, DDP_ERR_INVALID_ARG, "ddp_work_test: NULL argument");
    *done = atomic_load(&w->done);
    return 0;
}

void ddp_work_destroy(ddp_work_t *w)
{
    if (w)
        release_work(w);
}

/* ------------------------------------------------------------------ */
/* Symmetric memory                                                     */
/* ------------------------------------------------------------------ */

/* Under mu: waits until nothing is queued or running, at most the group's
 * timeout (each queued operation is bounded by its own), then takes the
 * executor's place. */
static int become_executor(ddp_pg_t *pg, const char *what)
{
    double deadline = ddp_time_now() + pg->timeout_s;
    while ((pg->head || pg->busy) && wait_done(pg, deadline))
        ;
    DDP_FAIL_IF(pg->head || pg->busy, DDP_ERR_TIMEOUT,
                "%s on rank %d: the group's queued operations still run after %.1f s", what,
                pg->rank, pg->timeout_s);
    pg->busy = 1;
    return 0;
}

/* The backend's part of ddp_pg_symmetric_alloc, as the executor. */
static int sym_alloc(ddp_pg_t *pg, size_t bytes, void **p)
{
    pthread_mutex_lock(&pg->mu);
    int rc = become_executor(pg, "symmetric_alloc");
    if (rc < 0) {
        pthread_mutex_unlock(&pg->mu);
        return rc;
    }
    char msg[MSG_LEN];
    rc = broken_error(pg, msg);
    uint64_t seq = pg->next_seq;
    pg->next_seq += 2; /* the allocation's two exchanges */
    pthread_mutex_unlock(&pg->mu);
    if (rc == 0) {
        rc = pg->be->sym_alloc(pg->impl, bytes, seq, ddp_time_now() + pg->timeout_s, p);
        if (rc < 0) {
            ddp__error_context(rc, "symmetric_alloc (%zu bytes) on rank %d", bytes, pg->rank);
            snprintf(msg, sizeof msg, "%s", ddp_last_error());
            pg->be->abort(pg->impl, rc, msg);
        }
    }
    pthread_mutex_lock(&pg->mu);
    if (rc < 0)
        mark_broken(pg, rc, msg);
    leave_executor(pg);
    pthread_mutex_unlock(&pg->mu);
    return rc < 0 ? DDP_ERROR(rc, "%s", msg) : 0;
}

int ddp_pg_symmetric_alloc(ddp_pg_t *pg, size_t bytes, void **out)
{
    DDP_FAIL_IF(!pg || !out, DDP_ERR_INVALID_ARG, "ddp_pg_symmetric_alloc: NULL argument");
    *out = NULL;
    DDP_FAIL_IF(bytes == 0, DDP_ERR_INVALID_ARG, "ddp_pg_symmetric_alloc: 0 bytes");
    void *p = NULL;
    if (pg->be->sym_alloc)
        DDP_TRY(sym_alloc(pg, bytes, &p));
    if (!p)
        p = ddp__calloc_aligned(bytes);
    DDP_FAIL_IF(!p, DDP_ERR_NOMEM, "out of memory (%zu bytes)", bytes);
    *out = p;
    return 0;
}

void ddp_pg_symmetric_free(ddp_pg_t *pg, void *p)
{
    if (!p)
        return;
    int freed = 0;
    if (pg && pg->be->sym_free) {
        pthread_mutex_lock(&pg->mu);
        /* The executor may be looking the memory up. */
        if (become_executor(pg, "symmetric_free") < 0) {
            pthread_mutex_unlock(&pg->mu);
            DDP_WARN("%s: %p not freed", ddp_last_error(), p); /* leaked, never a crash */
            return;
        }
        pthread_mutex_unlock(&pg->mu);
        freed = pg->be->sym_free(pg->impl, p);
        pthread_mutex_lock(&pg->mu);
        leave_executor(pg);
        pthread_mutex_unlock(&pg->mu);
    }
    if (!freed)
        ddp__free_aligned(p);
}

/* ------------------------------------------------------------------ */
/* Deliberate failure                                                   */
/* ------------------------------------------------------------------ */

void ddp__pg_abort(ddp_pg_t *pg, int code, const char *why)
{
    if (!pg)
        return;
    pthread_mutex_lock(&pg->mu);
    if (pg->broken || become_executor(pg, "abort") < 0) {
        pthread_mutex_unlock(&pg->mu); /* failed already, or stuck: its own error stands */
        return;
    }
    char msg[MSG_LEN];
    snprintf(msg, sizeof msg, "%s", why);
    pthread_mutex_unlock(&pg->mu);
    pg->be->abort(pg->impl, code, msg);
    pthread_mutex_lock(&pg->mu);
    mark_broken(pg, code, msg);
    leave_executor(pg);
    pthread_mutex_unlock(&pg->mu);
}
