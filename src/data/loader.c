/* DataLoader (torch.utils.data.DataLoader): batches of an epoch's sample
 * order, built either in ddp_loader_next (num_workers = 0) or ahead of time
 * by worker threads into a ring of slots.
 *
 * The ring: batch k of an epoch always goes to slot k % n_slots, so the
 * consumer takes batches in order whichever worker finished first, and the
 * contents of a batch depend only on the sampler's order: the same batches
 * for any num_workers.  A worker may claim batch k only once batch
 * k - n_slots has been handed back (the consumer gives back its batch on the
 * next call), so at most n_slots batches exist and every buffer is allocated
 * once, at creation.
 *
 * Epochs are generations: epoch_begin (and destroy) bump the generation and
 * wait for the batches being built to finish; a worker that finishes a batch
 * of an old generation throws it away.  Each worker builds one batch at a
 * time with no lock held, so that wait is bounded by one batch's work. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "base/error.h"
#include "data/idx_internal.h"

#define ERR_BYTES 1024

enum { SLOT_FREE, SLOT_BUSY, SLOT_READY };

typedef struct slot {
    float *x;           /* (batch_size, numel) */
    int64_t *y64;       /* (batch_size) */
    int32_t *y32;       /* (batch_size), only for DDP_LABEL_INT32 */
    int state;
    size_t batch;       /* which batch of the epoch it holds when READY */
    size_t size;        /* samples in it */
    int rc;             /* the worker's result, and its message */
    char err[ERR_BYTES];
} slot;

struct ddp_loader {
    ddp_dataset *ds;            /* borrowed */
    ddp_loader_opts o;
    size_t numel;
    ddp_sampler *sampler;       /* opts.sampler (borrowed) or own_sampler */
    ddp_sampler *own_sampler;
    size_t n_idx;               /* indices per epoch */
    size_t *order;              /* (n_idx) the epoch's order */
    size_t n_batches;
    slot *slots;
    size_t n_slots;

    pthread_mutex_t mu;
    pthread_cond_t work_cv;     /* workers: a batch may be claimed, or stop */
    pthread_cond_t ready_cv;    /* consumer: a slot became READY */
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
    int holding;                /* the consumer holds batch next_out - 1 */
    int busy;                   /* batches being built */
    int sleeping;               /* workers waiting on work_cv */
    size_t wake_at;             /* half the ring: a worker naps until that many are free */
    double period;              /* seconds between ddp_loader_next calls (moving average) */
    double last_call;           /* time of the last ddp_loader_next */
};

ddp_loader_opts ddp_loader_defaults(void)
{
    ddp_loader_opts o = {.batch_size = 1, .prefetch_factor = 4,
                         .label_type = DDP_LABEL_INT64, .timeout_s = 120.0};
    return o;
}

size_t ddp_loader_length(const ddp_loader *dl) { return dl ? dl->n_batches : 0; }

/* ------------------------------------------------------------------ building a batch */

static int build(ddp_loader *dl, size_t k, slot *s)
{
    size_t start = k * dl->o.batch_size;
    size_t n = dl->n_idx - start < dl->o.batch_size ? dl->n_idx - start : dl->o.batch_size;
    s->size = n;
    DDP_TRY(ddp_dataset_get_batch(dl->ds, dl->order + start, n, s->x, s->y64));
    if (s->y32)
        for (size_t i = 0; i < n; i++)
            s->y32[i] = (int32_t)s->y64[i];
    return 0;
}

static void fill_batch(const ddp_loader *dl, const slot *s, size_t k, ddp_batch *b)
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

static int claimable(const ddp_loader *dl)
{
    return dl->active && !dl->failed && dl->next_claim < dl->n_batches &&
           dl->next_claim < dl->released + dl->n_slots;
}

/* Claims the next batch and builds it (mu held on entry and on return,
 * released while building).  Workers call it, and so does the consumer
 * while the batch it waits for is not ready. */
static void claim_and_build(ddp_loader *dl)
{
    size_t k = dl->next_claim++;
    slot *s = &dl->slots[k % dl->n_slots];
    uint64_t gen = dl->gen;
    s->state = SLOT_BUSY;
    dl->busy++;
    pthread_mutex_unlock(&dl->mu);

    int rc = build(dl, k, s);

    pthread_mutex_lock(&dl->mu);
    dl->busy--;
    if (gen == dl->gen && !dl->stop) {
        s->rc = rc;
        if (rc < 0)
            snprintf(s->err, sizeof s->err, "%s", ddp_last_error());
        s->batch = k;
        s->state = SLOT_READY;
        pthread_cond_signal(&dl->ready_cv);
    } else {
        s->state = SLOT_FREE; /* an abandoned epoch's batch */
    }
    if (dl->busy == 0)
        pthread_cond_broadcast(&dl->idle_cv);
}

/* The epoch has batches left but every slot is taken: the consumer is the
 * bottleneck. */
static int ring_full(const ddp_loader *dl)
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
static double nap_seconds(const ddp_loader *dl)
{
    double t = (double)dl->wake_at * dl->period;
    return t < 100e-6 ? 100e-6 : t > 20e-3 ? 20e-3 : t;
}

static void *worker_main(void *arg)
{
    ddp_loader *dl = arg;
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
static int quiesce(ddp_loader *dl)
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
    for (size_t i = 0; i < dl->n_slots; i++)
        dl->slots[i].state = SLOT_FREE;
    dl->next_claim = dl->next_out = dl->released = 0;
    dl->holding = 0;
    dl->failed = 0;
    dl->last_call = 0; /* the pause between epochs is not the consumer's pace */
    return 0;
}

/* ------------------------------------------------------------------ life cycle */

static void free_slots(ddp_loader *dl)
{
    for (size_t i = 0; dl->slots && i < dl->n_slots; i++) {
        ddp__free_aligned(dl->slots[i].x);
        ddp__free_aligned(dl->slots[i].y64);
        ddp__free_aligned(dl->slots[i].y32);
    }
    free(dl->slots);
}

void ddp_loader_destroy(ddp_loader *dl)
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
        pthread_cond_destroy(&dl->ready_cv);
        pthread_cond_destroy(&dl->idle_cv);
        pthread_mutex_destroy(&dl->mu);
    }
    free(dl->threads);
    free_slots(dl);
    free(dl->order);
    ddp_sampler_destroy(dl->own_sampler);
    free(dl);
}

static int init_sync(ddp_loader *dl)
{
    pthread_condattr_t ca;
    DDP_FAIL_IF(pthread_condattr_init(&ca) != 0, DDP_ERR_SYSTEM, "loader: condattr_init");
    /* Timed waits on the monotonic clock: immune to wall-clock jumps. */
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    int ok = pthread_mutex_init(&dl->mu, NULL) == 0;
    ok = ok && pthread_cond_init(&dl->work_cv, &ca) == 0;
    ok = ok && pthread_cond_init(&dl->ready_cv, &ca) == 0;
    ok = ok && pthread_cond_init(&dl->idle_cv, &ca) == 0;
    pthread_condattr_destroy(&ca);
    /* glibc's init of these cannot fail; treat a failure as fatal for us. */
    DDP_FAIL_IF(!ok, DDP_ERR_SYSTEM, "loader: cannot create mutex/condition variables");
    dl->sync_ready = 1;
    return 0;
}

static int alloc_slots(ddp_loader *dl)
{
    size_t B = dl->o.batch_size;
    DDP_FAIL_IF(dl->numel > SIZE_MAX / sizeof(float) / B, DDP_ERR_INVALID_ARG,
                "loader: batch_size %zu x %zu features overflows", B, dl->numel);
    dl->slots = calloc(dl->n_slots, sizeof *dl->slots);
    DDP_FAIL_IF(!dl->slots, DDP_ERR_NOMEM, "loader: out of memory");
    for (size_t i = 0; i < dl->n_slots; i++) {
        slot *s = &dl->slots[i];
        s->x = ddp__alloc_aligned(B * dl->numel * sizeof(float));
        s->y64 = ddp__alloc_aligned(B * sizeof(int64_t));
        if (dl->o.label_type == DDP_LABEL_INT32)
            s->y32 = ddp__alloc_aligned(B * sizeof(int32_t));
        DDP_FAIL_IF(!s->x || !s->y64 || (dl->o.label_type == DDP_LABEL_INT32 && !s->y32),
                    DDP_ERR_NOMEM, "loader: out of memory for %zu batch buffers of %zu "
                    "x %zu floats", dl->n_slots, B, dl->numel);
    }
    return 0;
}

int ddp_loader_create(ddp_dataset *ds, const ddp_loader_opts *opts, ddp_loader **out)
{
    int rc = 0;
    ddp_loader *dl = NULL;
    DDP_FAIL_OUT(!ds || !out, DDP_ERR_INVALID_ARG, "ddp_loader_create: NULL argument");
    *out = NULL;
    ddp_loader_opts o = opts ? *opts : ddp_loader_defaults();
    DDP_FAIL_OUT(o.batch_size < 1, DDP_ERR_INVALID_ARG, "loader: batch_size must be >= 1");
    DDP_FAIL_OUT(o.num_workers < 0 || o.num_workers > 256, DDP_ERR_INVALID_ARG,
                 "loader: num_workers %d not in 0..256", o.num_workers);
    DDP_FAIL_OUT(o.num_workers > 0 && (o.prefetch_factor < 1 || o.prefetch_factor > 64),
                 DDP_ERR_INVALID_ARG, "loader: prefetch_factor %d not in 1..64",
                 o.prefetch_factor);
    DDP_FAIL_OUT(o.label_type != DDP_LABEL_INT64 && o.label_type != DDP_LABEL_INT32,
                 DDP_ERR_INVALID_ARG, "loader: unknown label_type %d", o.label_type);
    DDP_FAIL_OUT(!(o.timeout_s > 0), DDP_ERR_INVALID_ARG, "loader: timeout_s must be > 0");
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

int ddp_loader_epoch_begin(ddp_loader *dl, uint64_t epoch)
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

/* num_workers = 0: build batch next_out in the one slot, here. */
static int next_inline(ddp_loader *dl, ddp_batch *batch)
{
    size_t k = dl->next_out;
    int rc = build(dl, k, &dl->slots[0]);
    if (rc < 0) {
        dl->failed = rc;
        return ddp__error_context(rc, "loader: batch %zu", k);
    }
    dl->next_out++;
    fill_batch(dl, &dl->slots[0], k, batch);
    return 1;
}

int ddp_loader_next(ddp_loader *dl, ddp_batch *batch)
{
    DDP_FAIL_IF(!dl || !batch, DDP_ERR_INVALID_ARG, "ddp_loader_next: NULL argument");
    pthread_mutex_lock(&dl->mu);
    int rc = 0;
    DDP_FAIL_OUT(!dl->active, DDP_ERR_STATE, "ddp_loader_next: call ddp_loader_epoch_begin "
                 "first");
    DDP_FAIL_OUT(dl->failed, dl->failed, "loader: this epoch already failed; start another");
    if (dl->holding) { /* hand back the previous batch */
        dl->slots[(dl->next_out - 1) % dl->n_slots].state = SLOT_FREE;
        dl->holding = 0;
        dl->released++;
        /* Workers nap on a timer (nap_seconds); wake one only when the
         * queue runs low. */
        if (dl->sleeping > 0 && dl->next_claim <= dl->next_out + 1)
            pthread_cond_signal(&dl->work_cv);
    }
    if (dl->next_out >= dl->n_batches)
        goto out; /* rc 0: end of the epoch */
    if (dl->n_threads == 0) {
        pthread_mutex_unlock(&dl->mu);
        return next_inline(dl, batch);
    }
    size_t k = dl->next_out;
    slot *s = &dl->slots[k % dl->n_slots];
    double now = ddp_time_now();
    if (dl->last_call > 0)
        dl->period = dl->period > 0 ? 0.875 * dl->period + 0.125 * (now - dl->last_call)
                                    : now - dl->last_call;
    dl->last_call = now;
    struct timespec deadline;
    deadline_in(&deadline, dl->o.timeout_s);
    while (!(s->state == SLOT_READY && s->batch == k)) {
        if (claimable(dl)) {
            /* Rather than sit idle, build the next unclaimed batch here: so
             * workers never make the loader slower than num_workers = 0. */
            claim_and_build(dl);
            deadline_in(&deadline, dl->o.timeout_s); /* the wait starts now */
            continue;
        }
        int e = pthread_cond_timedwait(&dl->ready_cv, &dl->mu, &deadline);
        DDP_FAIL_OUT(e == ETIMEDOUT && !(s->state == SLOT_READY && s->batch == k),
                     DDP_ERR_TIMEOUT, "loader: batch %zu of %zu not ready after %g s "
                     "(%d worker(s) building)", k, dl->n_batches, dl->o.timeout_s, dl->busy);
    }
    if (s->rc < 0) {
        dl->failed = s->rc;
        rc = DDP_ERROR(s->rc, "loader: batch %zu: %s", k, s->err);
        goto out;
    }
    dl->next_out++;
    dl->holding = 1;
    fill_batch(dl, s, k, batch);
    rc = 1;
out:
    pthread_mutex_unlock(&dl->mu);
    return rc;
}
