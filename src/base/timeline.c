/* The timeline's recorder and writer (timeline.h; docs/timeline.md).
 *
 * Each thread that records gets a buffer of its own, found through a
 * thread-local pointer and listed in one registry: recording takes no lock
 * (the thread appends, then publishes the new count with a release store),
 * and a flush, from any thread, reads each buffer up to its published
 * count.  Buffers are never freed, so a flush at exit may run while the
 * communication thread or a loader worker still records.  The events are
 * kept in chunks allocated as they fill, at most DDP_TIMELINE_MAX_EVENTS per
 * thread: the cap bounds the memory (48 bytes an event), and what comes
 * after it is counted, not kept.
 *
 * The file is Chrome's trace-event format (the JSON object form): complete
 * events ("ph":"X") for spans, "b"/"e" pairs for asynchronous spans,
 * metadata events naming the process "rank R" and each thread, with pid =
 * the rank so that merged files show one process per rank. */
#include "base/timeline.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "base/env.h"
#include "base/error.h"
#include "base/log.h"

/* Events live in 2 MiB chunks with transparent huge pages requested: a
 * first touch of a fresh 4 KiB page costs about 10 us here, which was most
 * of a span's cost (600 ns) when chunks were small pages. */
#define CHUNK_BYTES ((size_t)2 << 20)
#define CHUNK_EVENTS (CHUNK_BYTES / sizeof(event))
#define MAX_NAMES 256 /* distinct user span names per thread */

enum { EV_SPAN, EV_ASYNC };

typedef struct event {
    const char *name, *arg_name;
    int64_t arg;
    uint64_t t0, t1; /* ns, this host's CLOCK_MONOTONIC */
    uint32_t kind, id;
} event;

typedef struct tl_thread {
    struct tl_thread *next;
    int tid, order;
    char name[48];
    event **chunks;          /* (nchunks) allocated as they fill */
    _Atomic size_t count;    /* events published */
    _Atomic size_t dropped;  /* events past the cap, or without memory */
    struct {
        const char *name;
        uint64_t t0;
    } stack[DDP_TIMELINE_MAX_DEPTH]; /* the user's open spans */
    int depth;
    char *names[MAX_NAMES]; /* the user's span names, copied once */
    int nnames;
} tl_thread;

_Atomic int ddp__tl_state = DDP__TL_UNKNOWN;

static struct {
    pthread_once_t once;
    pthread_mutex_t mu; /* the registry and the writer */
    tl_thread *threads;
    int nthreads;
    char dir[4096];
    size_t cap;
    int rank; /* -1: unknown (the file is named after the pid) */
    int64_t offset_ns;
    _Atomic uint32_t next_id;
} tl = {.once = PTHREAD_ONCE_INIT, .mu = PTHREAD_MUTEX_INITIALIZER, .rank = -1};

static _Thread_local tl_thread *self;

static event *chunk_alloc(void)
{
    void *p = NULL;
    if (posix_memalign(&p, CHUNK_BYTES, CHUNK_BYTES) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, CHUNK_BYTES, MADV_HUGEPAGE); /* best effort: small pages work too */
#endif
    return p;
}

uint64_t ddp__tl_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void flush_at_exit(void)
{
    if (ddp_timeline_flush() < 0)
        DDP_WARN("%s", ddp_last_error());
}

/* Reads the variables once.  A bad value leaves the timeline off and says
 * why (at warn level): a debugging aid must not stop training.  The first
 * span may open anywhere, so the caller's last error is kept. */
static void init(void)
{
    const char *dir = NULL;
    int on = 0, cap = 0;
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", ddp_last_error());
    if (ddp__env_string("DDP_TIMELINE_DIR", &dir) < 0 ||
        ddp__env_int("DDP_TIMELINE_MAX_EVENTS", &cap) < 0) {
        DDP_WARN("timeline off: %s", ddp_last_error());
    } else if (dir && strlen(dir) >= sizeof tl.dir - 64) {
        DDP_WARN("timeline off: DDP_TIMELINE_DIR is longer than %zu bytes", sizeof tl.dir - 64);
    } else if (dir) {
        snprintf(tl.dir, sizeof tl.dir, "%s", dir);
        tl.cap = (size_t)cap;
        ddp_launch_info li;
        if (ddp_launch_info_from_env(&li) == 0)
            tl.rank = li.rank;
        on = atexit(flush_at_exit) == 0;
    }
    ddp__error_restore(saved);
    atomic_store(&ddp__tl_state, on ? DDP__TL_ON : DDP__TL_OFF);
}

int ddp__tl_enabled(void)
{
    pthread_once(&tl.once, init);
    return atomic_load_explicit(&ddp__tl_state, memory_order_relaxed) == DDP__TL_ON;
}

int ddp_timeline_enabled(void) { return ddp__tl_enabled(); }

uint64_t ddp__tl_begin_slow(void)
{
    /* acquire: init's writes (the cap, the folder) are seen before any event */
    if (atomic_load_explicit(&ddp__tl_state, memory_order_acquire) == DDP__TL_ON ||
        ddp__tl_enabled())
        return ddp__tl_clock_ns();
    return 0;
}

void ddp__tl_set_rank(int rank, int64_t offset_ns)
{
    pthread_mutex_lock(&tl.mu);
    tl.rank = rank;
    tl.offset_ns = offset_ns;
    pthread_mutex_unlock(&tl.mu);
}

/* ==== recording =========================================================== */

/* The calling thread's buffer, registered at its first event; NULL without
 * memory. */
static tl_thread *thread_buffer(void)
{
    if (self)
        return self;
    tl_thread *t = calloc(1, sizeof *t);
    size_t nchunks = (tl.cap + CHUNK_EVENTS - 1) / CHUNK_EVENTS;
    if (!t || !(t->chunks = calloc(nchunks ? nchunks : 1, sizeof *t->chunks))) {
        free(t);
        return NULL;
    }
    t->tid = (int)syscall(SYS_gettid);
    if (t->tid == (int)getpid())
        snprintf(t->name, sizeof t->name, "main");
    else
        snprintf(t->name, sizeof t->name, "thread %d", t->tid);
    pthread_mutex_lock(&tl.mu);
    t->order = tl.nthreads++;
    t->next = tl.threads;
    tl.threads = t;
    pthread_mutex_unlock(&tl.mu);
    return self = t;
}

static void push(uint64_t t0, const char *name, const char *arg_name, int64_t arg, int kind)
{
    uint64_t t1 = ddp__tl_clock_ns();
    tl_thread *t = thread_buffer();
    if (!t)
        return;
    size_t n = atomic_load_explicit(&t->count, memory_order_relaxed);
    event **c = n < tl.cap ? &t->chunks[n / CHUNK_EVENTS] : NULL;
    if (!c || (!*c && !(*c = chunk_alloc()))) {
        atomic_fetch_add_explicit(&t->dropped, 1, memory_order_relaxed);
        return;
    }
    event *e = &(*c)[n % CHUNK_EVENTS];
    *e = (event){.name = name, .arg_name = arg_name, .arg = arg, .t0 = t0, .t1 = t1,
                 .kind = (uint32_t)kind};
    if (kind == EV_ASYNC)
        e->id = atomic_fetch_add_explicit(&tl.next_id, 1, memory_order_relaxed) + 1;
    atomic_store_explicit(&t->count, n + 1, memory_order_release);
}

void ddp__tl_record(uint64_t t0, const char *name, const char *arg_name, int64_t arg)
{
    push(t0, name, arg_name, arg, EV_SPAN);
}

void ddp__tl_record_async(uint64_t t0, const char *name, const char *arg_name, int64_t arg)
{
    push(t0, name, arg_name, arg, EV_ASYNC);
}

void ddp__tl_name_thread(const char *name)
{
    tl_thread *t = ddp__tl_enabled() ? thread_buffer() : NULL;
    if (t) {
        pthread_mutex_lock(&tl.mu); /* a flush may be reading it */
        snprintf(t->name, sizeof t->name, "%s", name);
        pthread_mutex_unlock(&tl.mu);
    }
}

/* A user's name, copied once per thread (events keep a pointer to it). */
static const char *intern(tl_thread *t, const char *name)
{
    for (int i = 0; i < t->nnames; i++)
        if (strcmp(t->names[i], name) == 0)
            return t->names[i];
    if (t->nnames == MAX_NAMES)
        return "(more than 256 span names on this thread)";
    char *copy = strdup(name);
    if (!copy)
        return "(out of memory)";
    return t->names[t->nnames++] = copy;
}

int ddp_timeline_begin(const char *name)
{
    DDP_FAIL_IF(!name, DDP_ERR_INVALID_ARG, "ddp_timeline_begin: NULL name");
    if (!ddp__tl_enabled())
        return 0;
    tl_thread *t = thread_buffer();
    DDP_FAIL_IF(!t, DDP_ERR_NOMEM, "ddp_timeline_begin: out of memory");
    DDP_FAIL_IF(t->depth == DDP_TIMELINE_MAX_DEPTH, DDP_ERR_STATE,
                "ddp_timeline_begin(\"%.64s\"): spans nest deeper than %d on this thread "
                "(innermost open: \"%.64s\")",
                name, DDP_TIMELINE_MAX_DEPTH, t->stack[t->depth - 1].name);
    t->stack[t->depth].name = intern(t, name);
    t->stack[t->depth].t0 = ddp__tl_clock_ns();
    t->depth++;
    return 0;
}

int ddp_timeline_end(void)
{
    if (!ddp__tl_enabled())
        return 0;
    tl_thread *t = self;
    DDP_FAIL_IF(!t || t->depth == 0, DDP_ERR_STATE,
                "ddp_timeline_end: no span is open on this thread (ddp_timeline_begin first)");
    t->depth--;
    push(t->stack[t->depth].t0, t->stack[t->depth].name, NULL, 0, EV_SPAN);
    return 0;
}

/* ==== writing ============================================================= */

/* Start order; a parent (longer) before the child that starts with it. */
static int by_start(const void *a, const void *b)
{
    const event *x = a, *y = b;
    if (x->t0 != y->t0)
        return x->t0 < y->t0 ? -1 : 1;
    return x->t1 > y->t1 ? -1 : x->t1 < y->t1;
}

/* A snapshot of thread t's published events, in start order.  Caller frees. */
static event *snapshot(tl_thread *t, size_t *n)
{
    *n = atomic_load_explicit(&t->count, memory_order_acquire);
    event *ev = malloc((*n ? *n : 1) * sizeof *ev);
    if (!ev)
        return NULL;
    for (size_t i = 0; i < *n; i += CHUNK_EVENTS) {
        size_t k = *n - i < CHUNK_EVENTS ? *n - i : CHUNK_EVENTS;
        memcpy(ev + i, t->chunks[i / CHUNK_EVENTS], k * sizeof *ev);
    }
    qsort(ev, *n, sizeof *ev, by_start);
    return ev;
}

static double us(uint64_t t) { return (double)((int64_t)t - tl.offset_ns) / 1e3; }

static void put_head(FILE *f, const event *e, const char *ph, int pid, int tid, uint64_t ts)
{
    fputs("{\"name\":", f);
    ddp__tl_put_string(f, e->name);
    fprintf(f, ",\"cat\":\"ddp\",\"ph\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f", ph, pid, tid,
            us(ts));
}

static void put_args(FILE *f, const event *e)
{
    if (e->arg_name) {
        fputs(",\"args\":{", f);
        ddp__tl_put_string(f, e->arg_name);
        fprintf(f, ":%lld}", (long long)e->arg);
    }
}

static void put_event(FILE *f, const event *e, int pid, int tid)
{
    if (e->kind == EV_SPAN) {
        put_head(f, e, "X", pid, tid, e->t0);
        fprintf(f, ",\"dur\":%.3f", (double)(e->t1 - e->t0) / 1e3);
        put_args(f, e);
        fputs("},\n", f);
        return;
    }
    put_head(f, e, "b", pid, tid, e->t0);
    fprintf(f, ",\"id\":\"0x%x\"", e->id);
    put_args(f, e);
    fputs("},\n", f);
    put_head(f, e, "e", pid, tid, e->t1);
    fprintf(f, ",\"id\":\"0x%x\"},\n", e->id);
}

/* One thread's metadata and events; its dropped count (0: none). */
static int put_thread(FILE *f, tl_thread *t, int pid, size_t *dropped)
{
    size_t n;
    event *ev = snapshot(t, &n);
    if (!ev)
        return DDP_ERROR(DDP_ERR_NOMEM, "timeline: out of memory writing %zu events", n);
    fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":",
            pid, t->tid);
    ddp__tl_put_string(f, t->name);
    fprintf(f, "}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
               "\"args\":{\"sort_index\":%d}},\n",
            pid, t->tid, t->order);
    for (size_t i = 0; i < n; i++)
        put_event(f, &ev[i], pid, t->tid);
    *dropped = atomic_load_explicit(&t->dropped, memory_order_relaxed);
    if (*dropped)
        fprintf(f, "{\"name\":\"timeline: %zu events dropped (cap %zu per thread, "
                   "DDP_TIMELINE_MAX_EVENTS)\",\"cat\":\"ddp\",\"ph\":\"i\",\"s\":\"t\","
                   "\"pid\":%d,\"tid\":%d,\"ts\":%.3f},\n",
                *dropped, tl.cap, pid, t->tid, n ? us(ev[n - 1].t0) : us(ddp__tl_clock_ns()));
    free(ev);
    return 0;
}

static int put_trace(FILE *f, int pid, const char *label)
{
    fprintf(f, "{\"traceEvents\":[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,"
               "\"tid\":0,\"args\":{\"name\":\"%s\"}},\n{\"name\":\"process_sort_index\","
               "\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"sort_index\":%d}},\n",
            pid, label, pid, pid);
    size_t dropped = 0;
    for (tl_thread *t = tl.threads; t; t = t->next) {
        size_t d = 0;
        DDP_TRY(put_thread(f, t, pid, &d));
        dropped += d;
    }
    /* The last element carries no comma: a metadata event closes the array. */
    fprintf(f, "{\"name\":\"process_labels\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
               "\"args\":{\"labels\":\"libddp %s\"}}\n],\n\"displayTimeUnit\":\"ms\",\n"
               "\"otherData\":{\"rank\":%d,\"pid\":%d,\"clock\":\"CLOCK_MONOTONIC\","
               "\"clock_offset_to_rank0_us\":%.3f,\"max_events_per_thread\":%zu,"
               "\"dropped_events\":%zu}}\n",
            pid, ddp_version(), tl.rank, (int)getpid(), (double)tl.offset_ns / 1e3, tl.cap,
            dropped);
    return 0;
}

static int write_file(void)
{
    char path[4200], tmp[4300], label[32];
    int pid = tl.rank >= 0 ? tl.rank : (int)getpid();
    if (tl.rank >= 0) {
        snprintf(path, sizeof path, "%s/timeline-rank%d.json", tl.dir, tl.rank);
        snprintf(label, sizeof label, "rank %d", tl.rank);
    } else {
        snprintf(path, sizeof path, "%s/timeline-pid%d.json", tl.dir, pid);
        snprintf(label, sizeof label, "pid %d", pid);
    }
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    if (mkdir(tl.dir, 0777) < 0 && errno != EEXIST)
        return DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "timeline: cannot create %s", tl.dir);
    FILE *f = fopen(tmp, "w");
    if (!f)
        return DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "timeline: cannot write %s", tmp);
    int rc = put_trace(f, pid, label);
    int err = ferror(f) ? EIO : 0;
    if (fclose(f) != 0 && !err)
        err = errno;
    if (rc == 0 && err)
        rc = DDP_ERROR_ERRNO(DDP_ERR_IO, err, "timeline: cannot write %s", tmp);
    if (rc == 0 && rename(tmp, path) < 0)
        rc = DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "timeline: cannot rename %s to %s", tmp, path);
    if (rc < 0)
        unlink(tmp);
    return rc;
}

int ddp_timeline_flush(void)
{
    if (!ddp__tl_enabled())
        return 0;
    pthread_mutex_lock(&tl.mu);
    int rc = write_file();
    pthread_mutex_unlock(&tl.mu);
    return rc;
}
