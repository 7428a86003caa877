/* Flight-recorder dumps: every group of a process written as one JSON file,
 * DIR/trace-rank<R>.json (R: the rank in the world group), on a collective's
 * failure, at teardown and at exit (groups never destroyed) when
 * DDP_TRACE_DIR is set, on SIGUSR1, and on request (ddp_pg_dump_trace).  tools/ddp-trace reads every rank's file.
 *
 * The registry.  A dump must reach every live group of the process, and
 * SIGUSR1 names no group: so the groups are listed in one process-wide
 * registry (like the logging sink, process state by nature), under its own
 * mutex.  Lock order: registry, then a group's mu, then its recorder's.
 *
 * SIGUSR1.  A handler may call only async-signal-safe functions, and a job
 * is usually dumped because it hangs: a comm thread stuck in a collective
 * cannot act on a flag.  So the handler writes one byte to a pipe, and a
 * watcher thread, blocked in read(2) on the other end, writes the dumps.
 * The handler is installed when a group starts to be made, before anything
 * that can wait (a rank that never joins is the usual hang to look at), and
 * whether or not the recorder is on, only where SIGUSR1 still has its
 * default action (a program's own handler, or SIG_IGN, is left alone).  The
 * watcher starts at the first group whose recorder is on, and stops when
 * the last group goes (the handler then does nothing), so that destroying
 * every group gives every thread and descriptor back; a forked child drops
 * its parent's registry and pipe at fork (pthread_atfork) and gets a pipe
 * and watcher of its own at its first group. */
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "pg/internal.h"
#include "pg/pg_impl.h"

/* Where SIGUSR1 and ddp_pg_dump_trace(pg, NULL) write without DDP_TRACE_DIR:
 * beside the program, as a core file would be. */
#define DEFAULT_DIR "ddp-trace"

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static ddp_pg_t *reg_head;
static pthread_t watcher_thread;
static int watcher_running;
static int pipe_rd = -1;
static atomic_int pipe_wr = -1;    /* read by the handler */
static atomic_int in_handler;      /* handlers running: the pipe is not closed under them */

/* ------------------------------------------------------------------ */
/* JSON                                                                 */
/* ------------------------------------------------------------------ */

/* A JSON string: quotes, backslashes and control characters escaped; bytes
 * above 127 become '?', since a message may carry any bytes and a dump must
 * stay valid UTF-8 for the strict reader (base/json.c). */
static void put_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p >= 0x80 ? '?' : *p, f);
    }
    fputc('"', f);
}

static void put_entry(FILE *f, const ddp__trace_entry *e, int first)
{
    fprintf(f, "%s\n    {\"id\": %llu, \"seq\": %llu, \"op\": \"%s\", \"dtype\": \"%s\", "
               "\"count\": %llu",
            first ? "" : ",", (unsigned long long)e->id, (unsigned long long)e->seq,
            ddp__coll_name(e->kind), ddp_dtype_name((ddp_dtype)e->dtype),
            (unsigned long long)e->count);
    if (ddp__op_has_root(e->kind))
        fprintf(f, ", \"root\": %d", (int)e->root);
    if (ddp__op_has_reduce(e->kind))
        fprintf(f, ", \"reduce_op\": \"%s\"", ddp_reduce_op_name((ddp_reduce_op)e->op));
    if (e->kind == DDP__SEND || e->kind == DDP__RECV)
        fprintf(f, ", \"peer\": %d, \"tag\": %d", (int)e->peer, (int)e->tag);
    fprintf(f, ", \"state\": \"%s\", \"queued_us\": %lld, \"started_us\": %lld, "
               "\"done_us\": %lld",
            ddp__trace_state_name(e->state), (long long)e->queued_us, (long long)e->started_us,
            (long long)e->done_us);
    if (e->state == DDP__TR_FAILED)
        fprintf(f, ", \"error\": \"%s\"", ddp_err_name(e->rc));
    if (e->label[0]) {
        fputs(", \"label\": ", f);
        put_str(f, e->label);
    }
    fputc('}', f);
}

/* One group's object; 0, or the copy's failure. */
static int put_group(FILE *f, ddp_pg_t *g, int first)
{
    ddp__trace_entry *v;
    size_t n;
    DDP_TRY(ddp__trace_snapshot(&g->trace, &v, &n));
    pthread_mutex_lock(&g->mu);
    unsigned long long next_seq = (unsigned long long)g->next_seq;
    int broken = g->broken;
    int setting_up = !g->impl; /* registered before it connects (pg.c) */
    char why[MSG_LEN];
    snprintf(why, sizeof why, "%s", g->broken_msg);
    pthread_mutex_unlock(&g->mu);
    fprintf(f, "%s\n  {\"name\": ", first ? "" : ",");
    put_str(f, g->prefix);
    fprintf(f, ", \"backend\": \"%s\", \"rank\": %d, \"size\": %d, \"ranks\": [", g->be->name,
            g->rank, g->size);
    for (int i = 0; i < g->size; i++)
        fprintf(f, "%s%d", i ? ", " : "", g->granks[i]);
    fprintf(f, "], \"setting_up\": %s, \"next_seq\": %llu, \"buffer\": %zu, \"broken\": ",
            setting_up ? "true" : "false", next_seq, g->trace.cap);
    if (broken)
        put_str(f, why);
    else
        fputs("null", f);
    fputs(", \"entries\": [", f);
    for (size_t i = 0; i < n; i++)
        put_entry(f, &v[i], i == 0);
    fputs("]}", f);
    free(v);
    return 0;
}

/* Under reg_mu: world's dump (it and its subgroups) into dir; the path in
 * path (len bytes).  Written to a temporary name and renamed, so a reader
 * never sees half a file. */
static int dump_world(ddp_pg_t *world, const char *dir, const char *reason, char *path,
                      size_t len)
{
    int rc = 0;
    char tmp[4200];
    if (mkdir(dir, 0777) < 0 && errno != EEXIST)
        return DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "flight recorder: cannot make folder %s", dir);
    snprintf(path, len, "%s/trace-rank%d.json", dir, world->rank);
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    /* DIR may be shared and the name is predictable: a new file of our own,
     * never one that is there already, nor a link planted at that name. */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        rc = DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "flight recorder: cannot create %s", tmp);
        if (fd >= 0) {
            close(fd);
            unlink(tmp);
        }
        return rc;
    }
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    fprintf(f, "{\"format\": \"libddp-trace\", \"version\": 1, \"rank\": %d, \"world_size\": %d, "
               "\"pid\": %ld, \"host\": ",
            world->rank, world->size, (long)getpid());
    put_str(f, host);
    fprintf(f, ", \"time_us\": %lld, \"reason\": ",
            (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000);
    put_str(f, reason);
    fputs(", \"groups\": [", f);
    int first = 1;
    for (ddp_pg_t *g = reg_head; g && rc == 0; g = g->reg_next)
        if (g->world == world) {
            rc = put_group(f, g, first);
            first = 0;
        }
    fputs("]}\n", f);
    /* A failed write (ENOSPC) may surface only in the stream's error flag:
     * a truncated dump must not be renamed into place as a whole one. */
    int bad = fflush(f) != 0 || ferror(f);
    int err = errno ? errno : EIO;
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        err = errno;
    }
    if (bad && rc == 0)
        rc = DDP_ERROR_ERRNO(DDP_ERR_IO, err, "flight recorder: cannot write %s", tmp);
    if (rc == 0 && rename(tmp, path) < 0)
        rc = DDP_ERROR_ERRNO(DDP_ERR_IO, errno, "flight recorder: cannot rename %s", tmp);
    if (rc < 0)
        unlink(tmp);
    return rc;
}

/* DDP_TRACE_DIR, or NULL when unset (a bad value is logged and ignored: a
 * dump must never fail the call that triggers it). */
static const char *trace_dir(void)
{
    const char *dir = NULL;
    if (ddp__env_string("DDP_TRACE_DIR", &dir) < 0)
        DDP_WARN("%s", ddp_last_error());
    return dir && *dir ? dir : NULL;
}

/* ------------------------------------------------------------------ */
/* The registry and SIGUSR1                                             */
/* ------------------------------------------------------------------ */

/* Lock-free atomics and write(2) only: async-signal-safe. */
static void on_sigusr1(int sig)
{
    (void)sig;
    int saved = errno;
    atomic_fetch_add(&in_handler, 1);
    int fd = atomic_load(&pipe_wr);
    if (fd >= 0) {
        char c = 1;
        ssize_t r = write(fd, &c, 1); /* full pipe: a dump is pending anyway */
        (void)r;
    }
    atomic_fetch_sub(&in_handler, 1);
    errno = saved;
}

/* Under reg_mu: every world group of the process, dumped. */
static void dump_all_locked(const char *reason)
{
    const char *dir = trace_dir();
    char path[4096], saved[1024];
    snprintf(saved, sizeof saved, "%s", ddp_last_error());
    for (ddp_pg_t *g = reg_head; g; g = g->reg_next)
        if (g->world == g && g->trace.cap) {
            if (dump_world(g, dir ? dir : DEFAULT_DIR, reason, path, sizeof path) == 0)
                ddp__log(DDP_LOG_WARN, "flight recorder (%s): rank %d wrote %s", reason, g->rank,
                         path);
            else
                ddp__log(DDP_LOG_WARN, "flight recorder (%s): %s", reason, ddp_last_error());
        }
    ddp__error_restore(saved);
}

static void dump_all(const char *reason)
{
    pthread_mutex_lock(&reg_mu);
    dump_all_locked(reason);
    pthread_mutex_unlock(&reg_mu);
}

/* atexit: with DDP_TRACE_DIR, the groups a program never destroyed (it
 * exited on an error, say) are dumped too.  Exit must not hang on a dump
 * that another thread is writing: the registry is waited for 2 s at most. */
static void dump_at_exit(void)
{
    if (!trace_dir())
        return;
    for (int i = 0; i < 2000; i++) {
        if (pthread_mutex_trylock(&reg_mu) == 0) {
            if (reg_head)
                dump_all_locked("exit without destroying the group");
            pthread_mutex_unlock(&reg_mu);
            return;
        }
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
}

static void *watcher(void *arg)
{
    int fd = (int)(intptr_t)arg;
    char buf[64];
    for (;;) {
        ssize_t r = read(fd, buf, sizeof buf); /* several signals: one dump */
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return NULL;
        dump_all("SIGUSR1");
    }
}

/* fork without exec: the child has the forking thread only, so no watcher
 * and no handler running, and its parent's groups and pipe are not its
 * own: a SIGUSR1 it gets before it makes a group of its own must not make
 * its PARENT dump, nor may its first group join its parent's thread.  The
 * registry is held across fork, so that the child's copy is consistent
 * (a dump in progress delays a fork by its length). */
static void before_fork(void) { pthread_mutex_lock(&reg_mu); }
static void after_fork_parent(void) { pthread_mutex_unlock(&reg_mu); }
static void after_fork_child(void)
{
    reg_head = NULL;
    watcher_running = 0;
    int wr = atomic_exchange(&pipe_wr, -1);
    if (wr >= 0)
        close(wr);
    if (pipe_rd >= 0)
        close(pipe_rd);
    pipe_rd = -1;
    atomic_store(&in_handler, 0);
    pthread_mutex_unlock(&reg_mu);
}

static void at_first_use(void)
{
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
    atexit(dump_at_exit);
}

/* Under reg_mu: 1 when SIGUSR1 is ours, installed now if it still had its
 * default action (a program's own handler, or SIG_IGN, is left alone). */
static int claim_sigusr1(void)
{
    struct sigaction old;
    if (sigaction(SIGUSR1, NULL, &old) < 0)
        return 0;
    if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler == on_sigusr1)
        return 1;
    if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL)
        return 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigusr1;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGUSR1, &sa, NULL) == 0;
}

/* Under reg_mu: the pipe and the watcher.  Without them the handler does
 * nothing, which beats dying: a warning, and the job goes on. */
static void start_watcher(void)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) < 0) {
        DDP_WARN("flight recorder: no SIGUSR1 dumps: cannot make a pipe: %s", strerror(errno));
        return;
    }
    fcntl(fds[1], F_SETFL, O_NONBLOCK); /* the handler must never block */
    if (pthread_create(&watcher_thread, NULL, watcher, (void *)(intptr_t)fds[0]) != 0) {
        DDP_WARN("flight recorder: no SIGUSR1 dumps: cannot start the watcher thread");
        close(fds[0]);
        close(fds[1]);
        return;
    }
    watcher_running = 1;
    pipe_rd = fds[0];
    atomic_store(&pipe_wr, fds[1]);
}

void ddp__trace_install_handler(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, at_first_use);
    pthread_mutex_lock(&reg_mu);
    claim_sigusr1();
    pthread_mutex_unlock(&reg_mu);
}

void ddp__trace_register(ddp_pg_t *pg)
{
    ddp__trace_install_handler();
    pthread_mutex_lock(&reg_mu);
    if (pg->trace.cap && !watcher_running && claim_sigusr1())
        start_watcher();
    pg->reg_next = reg_head;
    reg_head = pg;
    pthread_mutex_unlock(&reg_mu);
}

void ddp__trace_unregister(ddp_pg_t *pg)
{
    pthread_mutex_lock(&reg_mu);
    for (ddp_pg_t **p = &reg_head; *p; p = &(*p)->reg_next)
        if (*p == pg) {
            *p = pg->reg_next;
            break;
        }
    /* The last group: the watcher goes (joined outside the lock, which a
     * dump in progress needs).  The handler stays, writing nowhere: a
     * launcher that signals every worker must not kill one that has no
     * group any more. */
    int stop = !reg_head && watcher_running;
    int rd = -1, wr = -1;
    pthread_t t = watcher_thread;
    if (stop) {
        wr = atomic_exchange(&pipe_wr, -1);
        rd = pipe_rd;
        pipe_rd = -1;
        watcher_running = 0;
    }
    pthread_mutex_unlock(&reg_mu);
    if (stop) {
        /* A handler that read wr before the exchange may still write it:
         * close it only once none runs (they take a few microseconds). */
        while (atomic_load(&in_handler))
            sched_yield();
        close(wr); /* the watcher reads end of file */
        pthread_join(t, NULL);
        close(rd);
    }
}

/* ------------------------------------------------------------------ */
/* When dumps are written                                               */
/* ------------------------------------------------------------------ */

void ddp__trace_on_failure(ddp_pg_t *pg, char *msg, size_t len)
{
    size_t at = strlen(msg);
    if (!pg->trace.cap) { /* off by default: its cost shows on the smallest collectives */
        snprintf(msg + at, len - at, " (DDP_TRACE_BUFFER=2000 DDP_TRACE_DIR=DIR: every rank's "
                                     "flight recorder, explained by ddp-trace DIR)");
        ddp__error_restore(msg);
        return;
    }
    const char *dir = trace_dir();
    if (!dir) {
        snprintf(msg + at, len - at, " (DDP_TRACE_DIR=DIR: every rank's flight recorder, "
                                     "explained by ddp-trace DIR)");
    } else {
        char path[4096];
        pthread_mutex_lock(&reg_mu);
        int rc = dump_world(pg->world, dir, msg, path, sizeof path);
        pthread_mutex_unlock(&reg_mu);
        if (rc == 0)
            snprintf(msg + at, len - at, " (flight recorder: %s; ddp-trace %s explains)", path,
                     dir);
        else
            snprintf(msg + at, len - at, " (no flight recorder dump: %s)", ddp_last_error());
    }
    ddp__error_restore(msg); /* the caller's thread reports msg */
}

void ddp__trace_at_destroy(ddp_pg_t *pg)
{
    const char *dir = pg->world == pg && pg->trace.cap ? trace_dir() : NULL;
    if (!dir)
        return;
    char path[4096], reason[MSG_LEN + 32];
    pthread_mutex_lock(&pg->mu);
    snprintf(reason, sizeof reason, "%s%s", pg->broken ? "destroyed after: " : "destroyed",
             pg->broken ? pg->broken_msg : "");
    pthread_mutex_unlock(&pg->mu);
    pthread_mutex_lock(&reg_mu);
    if (dump_world(pg, dir, reason, path, sizeof path) < 0)
        DDP_WARN("%s", ddp_last_error());
    pthread_mutex_unlock(&reg_mu);
}

int ddp_pg_dump_trace(ddp_pg_t *pg, const char *dir)
{
    DDP_FAIL_IF(!pg, DDP_ERR_INVALID_ARG, "dump_trace: NULL process group");
    DDP_FAIL_IF(!pg->trace.cap, DDP_ERR_STATE,
                "dump_trace: the flight recorder is off (DDP_TRACE_BUFFER=0)");
    if (!dir)
        dir = trace_dir();
    char path[4096];
    pthread_mutex_lock(&reg_mu);
    int rc = dump_world(pg->world, dir ? dir : DEFAULT_DIR, "ddp_pg_dump_trace", path,
                        sizeof path);
    pthread_mutex_unlock(&reg_mu);
    return rc;
}
