/* DataLoader (torch.utils.data.DataLoader): batches of an epoch's sample
 * order, built either in ddp_loader_next (num_workers = 0) or ahead of time
 * by worker threads into a ring of slots.
 *
 * The ring: batch k of an epoch always goes to slot k % n_slots, so the
 * consumer takes batches in order whichever worker finished first, and the
 * contents of a batch depend only on the sampler's order: the same batches
 * for any num_workers.  A worker may claim batch k only once batch
 * k - n_slots has been handed back (the consumer gives back its batch on the
 * next call) and its slot is free, so at most n_slots batches exist and
 * every buffer is allocated once, at creation.
 *
 * The consumer never waits for a worker: if the batch it needs is not ready
 * it builds it itself, claiming it if no worker has, or taking it over from
 * the worker building it (whose copy is then dropped) into a spare slot of
 * its own, after building one later batch in the meantime, which usually
 * gives the worker the time to finish.  A worker that the scheduler has
 * preempted, or that is slow, thus never delays training: a call of
 * ddp_loader_next builds at most two batches, and on average no more than
 * num_workers = 0 builds.
 *
 * Epochs are generations: epoch_begin (and destroy) bump the generation and
 * wait for the batches being built to finish; a worker that finishes a batch
 * of an old generation throws it away.  Each worker builds one batch at a
 * time with no lock held, so that wait is bounded by one batch's work. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/timeline.h"
#include "data/idx_internal.h"
#include "data/loader.h"

#define ERR_BYTES 1024

enum { SLOT_FREE, SLOT_BUSY, SLOT_READY };

typedef struct slot {
    float *x;           /* (batch_size, numel) */
    int64_t *y64;       /* (batch_size) */
    int32_t *y32;       /* (batch_size), only for DDP_LABEL_INT32 */
    int state;
    int stolen;         /* the consumer took this batch over: drop the worker's copy */
    size_t batch;       /* which batch of the epoch it holds (BUSY or READY) */
    size_t size;        /* samples in it */
    int rc;             /* the worker's result, and its message */
    char err[ERR_BYTES];
} slot;

struct ddp_loader {
    ddp_dataset_t *ds;            /* borrowed */
    ddp_loader_options o;
    size_t numel;
    ddp_sampler_t *sampler;       /* opts.sampler (borrowed) or own_sampler */
    ddp_sampler_t *own_sampler;
    size_t n_idx;               /* indices per epoch */
    size_t *order;              /* (n_idx) the epoch's order */
    size_t n_batches;
    slot *slots;                /* (n_slots) the ring */
    size_t n_slots;
    slot *spare;                /* the consumer's own slot (workers only) */

    pthread_mutex_t mu;
    pthread_cond_t work_cv;     /* workers: a batch may be claimed, or stop */
    pthread_cond_t idle_cv;     /* epoch_begin/destroy: busy dropped to 0 */
    int sync_ready;             /* mu and the condition variables exist */
    pthread_t *threads;
    int n_threads;              /* started */
    int stop;
    uint64_t gen;               /* bumped by epoch_begin and destroy */
    int active;                 /* an epoch has begun and order is valid */
    int failed;                 /* the epoch hit an error: its code */
    size_t next_claim;          /* next batch a worker may take */
    size_t next_out;            /* next batch to deliver */
    size_t released;            /* batches the consumer has handed back */
    slot *held;                 /* the slot of batch next_out - 1, or NULL */
    int busy;                   /* batches being built by workers */
    int sleeping;               /* workers waiting on work_cv */
    size_t wake_at;             /* half the ring: a worker naps until that many are free */
    double period;              /* seconds between ddp_loader_next calls (moving average) */
    double last_call;           /* time of the last ddp_loader_next */
};

ddp_loader_options ddp_loader_defaults(void)
{
    ddp_loader_options o = {.batch_size = 1, .prefetch_factor = 4,
                         .label_type = DDP_LABEL_INT64, .timeout_s = 120.0};
    return o;
}

size_t ddp_loader_length(const ddp_loader_t *dl) { return dl ? dl->n_batches : 0; }

/* ------------------------------------------------------------------ building a batch */

static int build(ddp_loader_t *dl, size_t k, slot *s)
{
    size_t start = k * dl->o.batch_size;
    size_t n = dl->n_idx - start < dl->o.batch_size ? dl->n_idx - start : dl->o.batch_size;
    s->size = n;
    uint64_t t0 = ddp__tl_begin();
    DDP_TRY(ddp_dataset_get_batch(dl->ds, dl->order + start, n, s->x, s->y64));
    if (s->y32)
        for (size_t i = 0; i < n; i++)
            s->y32[i] = (int32_t)s->y64[i];
    ddp__tl_end(t0, "batch build", "batch", (int64_t)k);
    return 0;
}

static void fill_batch(const ddp_loader_t *dl, const slot *s, size_t k, ddp_batch *b)
{
    b->x = s->x;
    b->y64 = dl->o.label_type == DDP_LABEL_INT64 ? s->y64 : NULL;
    b->y32 = s->y32;
    b->size = s->size;
    b->sample_numel = dl->numel;
    b->index = k;
}

/* ------------------------------------------------------------------ workers */

static void deadline_in(struct timespec *ts, double seconds)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    if (seconds > 1e9)
        seconds = 1e9;
    time_t whole = (time_t)seconds;
    ts->tv_sec += whole;
    ts->tv_nsec += (long)((seconds - (double)whole) * 1e9);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

static int claimable(const ddp_loader_t *dl)
{
    return dl->active && !dl->failed && dl->next_claim < dl->n_batches &&
           dl->next_claim < dl->released + dl->n_slots &&
           dl->slots[dl->next_claim % dl->n_slots].state == SLOT_FREE;
}

/* The epoch has batches left but no slot to build them in: the consumer is
 * the bottleneck. */
static int ring_full(const ddp_loader_t *dl)
{
    return dl->active && !dl->failed && dl->next_claim < dl->n_batches &&
           !claimable(dl);
}

/* How long a worker facing a full ring sleeps: until half the ring should be
 * free at the consumer's pace.  Waking a sleeping thread costs the waker
 * about 40 us on these VMs (an IPI through the hypervisor), more than
 * building a batch of 64, so the consumer does not wake workers on every
 * batch it hands back: workers nap on a timer and fill half the ring per
 * wake, and the consumer signals only when the queue runs low. */
static double nap_seconds(const ddp_loader_t *dl)
{
    double t = (double)dl->wake_at * dl->period;
    return t < 100e-6 ? 100e-6 : t > 20e-3 ? 20e-3 : t;
}

/* Claims the next batch and builds it into its slot (mu held on entry and
 * on return, released while building).  Workers call it, and so does the
 * consumer while a worker builds the batch it needs. */
static void claim_and_build(ddp_loader_t *dl)
{
    size_t k = dl->next_claim++;
    slot *s = &dl->slots[k % dl->n_slots];
    uint64_t gen = dl->gen;
    s->state = SLOT_BUSY;
    s->batch = k;
    s->stolen = 0;
    dl->busy++;
    pthread_mutex_unlock(&dl->mu);

    int rc = build(dl, k, s);

    pthread_mutex_lock(&dl->mu);
    dl->busy--;
    if (gen == dl->gen && !dl->stop && !s->stolen) {
        s->rc = rc;
        if (rc < 0)
            snprintf(s->err, sizeof s->err, "%s", ddp_last_error());
        s->state = SLOT_READY;
    } else {
        s->state = SLOT_FREE; /* an abandoned epoch's batch, or taken over */
        s->stolen = 0;
    }
    if (dl->busy == 0)
        pthread_cond_broadcast(&dl->idle_cv);
}

static void *worker_main(void *arg)
{
    ddp_loader_t *dl = arg;
    /* Background work: SCHED_BATCH keeps a worker's wake-ups from preempting
     * the training thread when other processes load every core (the
     * consumer builds what a worker has not; see ddp_loader_next).  Best
     * effort: a refusal changes nothing else. */
#ifdef SCHED_BATCH
    struct sched_param sp = {.sched_priority = 0};
    pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
#endif
    ddp__tl_name_thread("loader worker");
    pthread_mutex_lock(&dl->mu);
    for (;;) {
        while (!dl->stop && !claimable(dl)) {
            dl->sleeping++;
            if (ring_full(dl)) {
                struct timespec deadline;
                deadline_in(&deadline, nap_seconds(dl));
                pthread_cond_timedwait(&dl->work_cv, &dl->mu, &deadline);
            } else {
                /* Between epochs: no timeout needed, destroy always wakes. */
                pthread_cond_wait(&dl->work_cv, &dl->mu);
            }
            dl->sleeping--;
        }
        if (dl->stop)
            break;
        claim_and_build(dl);
    }
    pthread_mutex_unlock(&dl->mu);
    return NULL;
}

/* Abandons the current epoch and waits (mu held) until no worker is
 * building a batch of it, so that order and the slots may be rewritten. */
static int quiesce(ddp_loader_t *dl)
{
    dl->gen++;
    dl->active = 0;
    struct timespec deadline;
    deadline_in(&deadline, dl->o.timeout_s);
    while (dl->busy > 0) {
        int e = pthread_cond_timedwait(&dl->idle_cv, &dl->mu, &deadline);
        if (e == ETIMEDOUT && dl->busy > 0)
            return DDP_ERROR(DDP_ERR_TIMEOUT, "loader: %d batch(es) still being built "
                             "after %g s (a dataset get that does not return?)",
                             dl->busy, dl->o.timeout_s);
    }
    for (size_t i = 0; i < dl->n_slots; i++) {
        dl->slots[i].state = SLOT_FREE;
        dl->slots[i].stolen = 0;
    }
    dl->next_claim = dl->next_out = dl->released = 0;
    dl->held = NULL;
    dl->failed = 0;
    dl->last_call = 0; /* the pause between epochs is not the consumer's pace */
    return 0;
}

/* ------------------------------------------------------------------ life cycle */

static void free_slot(slot *s)
{
    ddp__free_aligned(s->x);
    ddp__free_aligned(s->y64);
    ddp__free_aligned(s->y32);
}

void ddp_loader_destroy(ddp_loader_t *dl)
{
    if (!dl)
        return;
    if (dl->sync_ready) {
        pthread_mutex_lock(&dl->mu);
        dl->stop = 1;
        dl->gen++;
        pthread_cond_broadcast(&dl->work_cv);
        pthread_mutex_unlock(&dl->mu);
        /* Each worker finishes at most the batch it is building. */
        for (int i = 0; i < dl->n_threads; i++)
            pthread_join(dl->threads[i], NULL);
        pthread_cond_destroy(&dl->work_cv);
        pthread_cond_destroy(&dl->idle_cv);
        pthread_mutex_destroy(&dl->mu);
    }
    free(dl->threads);
    for (size_t i = 0; dl->slots && i < dl->n_slots; i++)
        free_slot(&dl->slots[i]);
    free(dl->slots);
    if (dl->spare)
        free_slot(dl->spare);
    free(dl->spare);
    free(dl->order);
    ddp_sampler_destroy(dl->own_sampler);
    free(dl);
}

static int init_sync(ddp_loader_t *dl)
{
    pthread_condattr_t ca;
    DDP_FAIL_IF(pthread_condattr_init(&ca) != 0, DDP_ERR_SYSTEM, "loader: condattr_init");
    /* Timed waits on the monotonic clock: immune to wall-clock jumps. */
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    /* Adaptive: a thread that finds the lock taken spins briefly before
     * sleeping, so that releasing it rarely has to wake a sleeper (a wake-up
     * costs the waker ~40 us here, the critical sections ~100 ns). */
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
    int ok = pthread_mutex_init(&dl->mu, &ma) == 0;
    pthread_mutexattr_destroy(&ma);
    ok = ok && pthread_cond_init(&dl->work_cv, &ca) == 0;
    ok = ok && pthread_cond_init(&dl->idle_cv, &ca) == 0;
    pthread_condattr_destroy(&ca);
    /* glibc's init of these cannot fail; treat a failure as fatal for us. */
    DDP_FAIL_IF(!ok, DDP_ERR_SYSTEM, "loader: cannot create mutex/condition variables");
    dl->sync_ready = 1;
    return 0;
}

/* Ring slots plus, with workers, the consumer's spare. */
static int alloc_slots(ddp_loader_t *dl)
{
    size_t B = dl->o.batch_size;
    DDP_FAIL_IF(dl->numel > SIZE_MAX / sizeof(float) / B, DDP_ERR_INVALID_ARG,
                "loader: batch_size %zu x %zu features overflows", B, dl->numel);
    size_t total = dl->n_slots + (dl->o.num_workers > 0);
    dl->slots = calloc(dl->n_slots, sizeof *dl->slots);
    dl->spare = dl->o.num_workers > 0 ? calloc(1, sizeof *dl->spare) : NULL;
    DDP_FAIL_IF(!dl->slots || (dl->o.num_workers > 0 && !dl->spare), DDP_ERR_NOMEM,
                "loader: out of memory");
    for (size_t i = 0; i < total; i++) {
        slot *s = i < dl->n_slots ? &dl->slots[i] : dl->spare;
        s->x = ddp__alloc_aligned(B * dl->numel * sizeof(float));
        s->y64 = ddp__alloc_aligned(B * sizeof(int64_t));
        if (dl->o.label_type == DDP_LABEL_INT32)
            s->y32 = ddp__alloc_aligned(B * sizeof(int32_t));
        DDP_FAIL_IF(!s->x || !s->y64 || (dl->o.label_type == DDP_LABEL_INT32 && !s->y32),
                    DDP_ERR_NOMEM, "loader: out of memory for %zu batch buffers of %zu "
                    "x %zu floats", total, B, dl->numel);
    }
    return 0;
}

int ddp_loader_create(ddp_dataset_t *ds, const ddp_loader_options *opts, ddp_loader_t **out)
{
    int rc = 0;
    ddp_loader_t *dl = NULL;
    DDP_FAIL_OUT(!ds || !out, DDP_ERR_INVALID_ARG, "ddp_loader_create: NULL argument");
    *out = NULL;
    ddp_loader_options o = opts ? *opts : ddp_loader_defaults();
    DDP_FAIL_OUT(o.batch_size < 1, DDP_ERR_INVALID_ARG, "loader: batch_size must be >= 1");
    DDP_FAIL_OUT(o.num_workers < 0 || o.num_workers > 256, DDP_ERR_INVALID_ARG,
                 "loader: num_workers %d not in 0..256", o.num_workers);
    DDP_FAIL_OUT(o.num_workers > 0 && (o.prefetch_factor < 1 || o.prefetch_factor > 64),
                 DDP_ERR_INVALID_ARG, "loader: prefetch_factor %d not in 1..64",
                 o.prefetch_factor);
    DDP_FAIL_OUT(o.label_type != DDP_LABEL_INT64 && o.label_type != DDP_LABEL_INT32,
                 DDP_ERR_INVALID_ARG, "loader: unknown label_type %d", o.label_type);
    DDP_FAIL_OUT(!(o.timeout_s > 0), DDP_ERR_INVALID_ARG, "loader: timeout_s must be > 0");
    /* torch.utils.data.DataLoader raises the same: a sampler fixes the order
     * itself, so shuffle would be silently ignored. */
    DDP_FAIL_OUT(o.sampler && o.shuffle, DDP_ERR_INVALID_ARG,
                 "loader: the sampler option is mutually exclusive with shuffle (shuffle in the "
                 "sampler instead, e.g. ddp_sampler_distributed_options.shuffle, and leave "
                 "ddp_loader_options.shuffle 0)");
    /* pin_memory: page-locked host memory only matters for copies to a GPU,
     * which libddp does not have; accepted so that programs port unchanged. */

    dl = calloc(1, sizeof *dl);
    DDP_FAIL_OUT(!dl, DDP_ERR_NOMEM, "loader: out of memory");
    dl->ds = ds;
    dl->o = o;
    dl->numel = ddp_dataset_sample_numel(ds);
    if (o.sampler) {
        dl->sampler = o.sampler;
    } else {
        size_t n = ddp_dataset_length(ds);
        DDP_TRY_OUT(o.shuffle ? ddp_sampler_random_create(n, o.seed, &dl->own_sampler)
                              : ddp_sampler_sequential_create(n, &dl->own_sampler));
        dl->sampler = dl->own_sampler;
    }
    dl->n_idx = ddp_sampler_length(dl->sampler);
    dl->n_batches = o.drop_last ? dl->n_idx / o.batch_size
                                : (dl->n_idx + o.batch_size - 1) / o.batch_size;
    dl->order = malloc((dl->n_idx ? dl->n_idx : 1) * sizeof *dl->order);
    DDP_FAIL_OUT(!dl->order, DDP_ERR_NOMEM, "loader: out of memory for %zu indices",
                 dl->n_idx);
    dl->n_slots = o.num_workers > 0 ? (size_t)o.num_workers * (size_t)o.prefetch_factor : 1;
    if (dl->n_slots < 2 && o.num_workers > 0)
        dl->n_slots = 2; /* one being used, one being built */
    dl->wake_at = dl->n_slots / 2 > 0 ? dl->n_slots / 2 : 1;
    DDP_TRY_OUT(alloc_slots(dl));
    DDP_TRY_OUT(init_sync(dl));
    if (o.num_workers > 0) {
        dl->threads = calloc((size_t)o.num_workers, sizeof *dl->threads);
        DDP_FAIL_OUT(!dl->threads, DDP_ERR_NOMEM, "loader: out of memory");
        for (int i = 0; i < o.num_workers; i++) {
            int e = pthread_create(&dl->threads[i], NULL, worker_main, dl);
            if (e != 0)
                DDP_TRY_OUT(DDP_ERROR_ERRNO(DDP_ERR_SYSTEM, e, "loader: starting worker "
                                            "%d of %d", i + 1, o.num_workers));
            dl->n_threads++;
        }
    }
    *out = dl;
    dl = NULL;
out:
    ddp_loader_destroy(dl);
    return rc;
}

/* ------------------------------------------------------------------ iteration */

int ddp_loader_epoch_begin(ddp_loader_t *dl, uint64_t epoch)
{
    DDP_FAIL_IF(!dl, DDP_ERR_INVALID_ARG, "ddp_loader_epoch_begin: NULL loader");
    pthread_mutex_lock(&dl->mu);
    int rc = quiesce(dl);
    pthread_mutex_unlock(&dl->mu);
    DDP_TRY(rc);
    /* No worker touches order while inactive. */
    ddp_sampler_set_epoch(dl->sampler, epoch);
    rc = ddp_sampler_fill(dl->sampler, dl->order);
    if (rc < 0)
        return ddp__error_context(rc, "loader: sampler for epoch %llu",
                                  (unsigned long long)epoch);
    size_t n = ddp_dataset_length(dl->ds);
    for (size_t i = 0; i < dl->n_idx; i++)
        DDP_FAIL_IF(dl->order[i] >= n, DDP_ERR_INVALID_ARG, "loader: the sampler gave index "
                    "%zu at position %zu, the dataset has %zu samples", dl->order[i], i, n);
    pthread_mutex_lock(&dl->mu);
    dl->active = 1;
    pthread_cond_broadcast(&dl->work_cv);
    pthread_mutex_unlock(&dl->mu);
    return 0;
}

/* Batch k is not ready: build it here (mu held on entry and return).  It
 * goes into its ring slot when no worker has claimed it and the slot is
 * free, else into the spare; a worker building it has its copy dropped. */
static int build_here(ddp_loader_t *dl, size_t k, slot **out)
{
    slot *s = &dl->slots[k % dl->n_slots], *dst = dl->spare;
    if (dl->next_claim == k) { /* unclaimed: claim it */
        dl->next_claim++;
        if (s->state == SLOT_FREE) {
            dst = s;
            s->state = SLOT_BUSY;
            s->batch = k;
        }
    } else { /* a worker is on it (BUSY): take it over */
        s->stolen = 1;
    }
    pthread_mutex_unlock(&dl->mu);
    int rc = build(dl, k, dst);
    pthread_mutex_lock(&dl->mu);
    *out = dst;
    return rc;
}

int ddp_loader_next(ddp_loader_t *dl, ddp_batch *batch)
{
    DDP_FAIL_IF(!dl || !batch, DDP_ERR_INVALID_ARG, "ddp_loader_next: NULL argument");
    uint64_t t0 = ddp__tl_begin();
    pthread_mutex_lock(&dl->mu);
    int rc = 0;
    DDP_FAIL_OUT(!dl->active, DDP_ERR_STATE, "ddp_loader_next: call ddp_loader_epoch_begin "
                 "first");
    DDP_FAIL_OUT(dl->failed, dl->failed, "loader: this epoch already failed; start another");
    if (dl->held) { /* hand back the previous batch */
        if (dl->held != dl->spare)
            dl->held->state = SLOT_FREE;
        dl->held = NULL;
        dl->released++;
        /* Workers nap on a timer (nap_seconds); wake one only when the
         * queue runs low. */
        if (dl->sleeping > 0 && dl->next_claim <= dl->next_out + 1)
            pthread_cond_signal(&dl->work_cv);
    }
    if (dl->next_out >= dl->n_batches)
        goto out; /* rc 0: end of the epoch */
    double now = ddp_time_now();
    if (dl->last_call > 0)
        dl->period = dl->period > 0 ? 0.875 * dl->period + 0.125 * (now - dl->last_call)
                                    : now - dl->last_call;
    dl->last_call = now;

    size_t k = dl->next_out;
    slot *s = &dl->slots[k % dl->n_slots];
    if (s->state == SLOT_BUSY && claimable(dl))
        claim_and_build(dl); /* a worker is on batch k: build a later one meanwhile */
    if (s->state == SLOT_READY && s->batch == k) {
        if (s->rc < 0) {
            dl->failed = s->rc;
            rc = DDP_ERROR(s->rc, "loader: batch %zu: %s", k, s->err);
            goto out;
        }
    } else if ((rc = build_here(dl, k, &s)) < 0) {
        dl->failed = rc;
        if (s != dl->spare)
            s->state = SLOT_FREE;
        rc = ddp__error_context(rc, "loader: batch %zu", k);
        goto out;
    }
    dl->next_out++;
    dl->held = s;
    fill_batch(dl, s, k, batch);
    rc = 1;
out:
    pthread_mutex_unlock(&dl->mu);
    ddp__tl_end(t0, "loader next", NULL, 0);
    return rc;
}

void ddp__loader_adopt_sampler(ddp_loader_t *dl)
{
    dl->own_sampler = dl->sampler; /* freed with the loader */
}
