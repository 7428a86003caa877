/* ddprun: start N worker processes of a training program on this node, the
 * way torchrun does, and watch them.
 *
 *   ddprun [--nproc-per-node N] [--nnodes N] [--node-rank R]
 *          [--master-addr A] [--master-port P] [--rdzv-endpoint A:P]
 *          [--rdzv-id ID] [--standalone] [--max-restarts K] [--prefix]
 *          [--stop-timeout S] [--log-dir DIR] [--redirects S] [--tee S]
 *          [--local-ranks-filter L] PROGRAM [ARGS...]
 *
 * Each worker gets torchrun's environment: RANK, LOCAL_RANK, WORLD_SIZE,
 * LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
 * TORCHELASTIC_RUN_ID (the job's id: --rdzv-id, else a fresh one per job on
 * one node, so that a second job on the same port is refused instead of
 * joining the first) and TORCHELASTIC_RESTART_COUNT (also as
 * DDP_RESTART_COUNT); DDP_SECRET_FILE, a fresh secret per job on one node
 * when the user set none (jobdir.c); DDP_ERROR_FILE, where a failing
 * program may write its error.  When one worker fails, the others are
 * stopped (SIGTERM, then SIGKILL after --stop-timeout) and either the whole
 * local group restarts (--max-restarts) or ddprun exits 1 with one line
 * naming the rank, its exit code or signal and its last error, then the
 * last lines of its output (output.c).  SIGINT, SIGTERM and SIGHUP stop the
 * workers the same way; SIGUSR1 is passed on to every worker (for programs
 * that act on it, such as dumping a flight recorder), and the job goes on.
 *
 * ddprun does not load libddp (it launches programs of any library version
 * and starts in a millisecond); it links a few of libddp's base helpers
 * statically: random bytes, the environment table. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "base/timeline.h"
#include "ddprun.h"

enum { RG_RESTART = -3, RG_FAILED = -4, RG_NODE_LOST = -5 };

volatile sig_atomic_t ddprun_got_signal;
volatile sig_atomic_t ddprun_got_usr1;
struct rlimit ddprun_nofile;

static void on_signal(int sig) { ddprun_got_signal = sig; }
static void on_usr1(int sig)
{
    (void)sig;
    ddprun_got_usr1 = 1;
}

double ddprun_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* What the launchers' rendezvous says between two reaps (elastic jobs):
 * 0 go on, else run_group's code for it (why filled). */
static int watch_rdzv(ddprun_rdzv *z, char *why, size_t len)
{
    static double last;
    int all_done = 0;
    if (!z || ddprun_now() - last < 0.25)
        return 0;
    last = ddprun_now();
    int rc = ddprun_rdzv_poll(z, &all_done, why, len);
    return rc == 0 ? 0 : rc == 1 ? RG_RESTART : rc == 2 ? RG_FAILED : rc == 3 ? RG_NODE_LOST : -1;
}

/* Runs one generation of workers to the end.  Returns 0 when all succeeded,
 * the failing worker's index + 1 when one failed, -1 on a launch error or a
 * lost rendezvous, -2 when ddprun itself was interrupted, RG_* when another
 * node ended the round (z: elastic jobs, else NULL). */
static int run_group(const ddprun_options *o, const ddprun_job *job, ddprun_worker *ws,
                     int restart, ddprun_rdzv *z, char *why, size_t why_len)
{
    int rc, failed, running = 0;
    ddprun_got_usr1 = 0; /* one from before these workers is not theirs */
    if (ddprun_workers_start(o, job, ws, restart) < 0) {
        for (int l = 0; l < o->nproc; l++)
            running += !ws[l].exited;
        ddprun_workers_stop(o, ws, &running, SIGTERM); /* those already started */
        rc = -1;
        goto out;
    }
    running = o->nproc;
    for (;;) {
        ddprun_output_pump_all(o, ws, 50);
        failed = ddprun_workers_reap(o, ws, &running);
        if (ddprun_got_usr1) {
            ddprun_got_usr1 = 0;
            ddprun_workers_signal(o, ws, SIGUSR1, 0);
        }
        if (ddprun_got_signal) { /* passed on; SIGKILL only after the grace period */
            ddprun_workers_stop(o, ws, &running, ddprun_got_signal);
            rc = -2;
            break;
        }
        if (failed >= 0) {
            ddprun_workers_stop(o, ws, &running, SIGTERM);
            rc = failed + 1;
            break;
        }
        if (running == 0) {
            rc = 0;
            break;
        }
        if ((rc = watch_rdzv(z, why, why_len)) != 0) {
            ddprun_workers_stop(o, ws, &running, SIGTERM);
            break;
        }
    }
out:
    ddprun_workers_finish(o, ws);
    return rc;
}

static int run_job(const ddprun_options *o, const ddprun_job *job, ddprun_worker *ws)
{
    for (int restart = 0;; restart++) {
        int rc = run_group(o, job, ws, restart, NULL, NULL, 0);
        if (rc <= 0)
            return rc;
        ddprun_worker *w = &ws[rc - 1];
        if (restart < o->max_restarts && !ddprun_got_signal) {
            char what[128];
            ddprun_describe(w, what, sizeof what);
            fprintf(stderr, "ddprun: rank %d (pid %d) %s; restarting the group (%d of %d)\n",
                    w->rank, (int)w->pid, what, restart + 1, o->max_restarts);
            continue;
        }
        ddprun_output_report(w);
        return rc;
    }
}

/* The host of the store stays until every node is done (the others need
 * the store), or the job ends otherwise. */
static int wait_all_done(ddprun_rdzv *z)
{
    char why[512];
    for (;;) {
        int all_done = 0, rc = ddprun_rdzv_poll(z, &all_done, why, sizeof why);
        if (rc < 0 || all_done || ddprun_got_signal)
            return rc < 0 ? -1 : 0;
        if (rc > 0) {
            fprintf(stderr, "ddprun: this node's workers finished; %s\n", why);
            return 0;
        }
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* One round of an elastic job: join, run, and say how it ended.  Returns
 * 0 (the job succeeded), 1 (restart: another round), or -1 (stop). */
static int elastic_round(const ddprun_options *o, const ddprun_job *job, ddprun_worker *ws,
                         ddprun_rdzv *z)
{
    static ddprun_options ro;
    char why[512] = "", msg[700];
    if (ddprun_rdzv_join(z) < 0)
        return -1;
    ro = *o;
    ro.nnodes = z->nnodes;
    ro.node_rank = z->slot;
    ro.master_addr = z->master_addr;
    ro.master_port = z->master_port;
    fprintf(stderr, "ddprun: round %lld: node %d of %d, ranks %d..%d of %d\n", z->round,
            z->slot, z->nnodes, z->slot * o->nproc, (z->slot + 1) * o->nproc - 1,
            z->nnodes * o->nproc);
    int rc = run_group(&ro, job, ws, (int)z->round, z, why, sizeof why);
    if (rc == 0)
        return ddprun_rdzv_done(z) < 0 ? -1 : z->is_host ? wait_all_done(z) : 0;
    if (rc == -1 || rc == -2)
        return -1;
    if (rc > 0) {
        char what[128];
        ddprun_worker *w = &ws[rc - 1];
        ddprun_describe(w, what, sizeof what);
        snprintf(msg, sizeof msg, "node %d: rank %d (pid %d) %s", z->slot, w->rank, (int)w->pid,
                 what);
        if (z->round >= o->max_restarts || ddprun_got_signal)
            ddprun_output_report(w); /* the job stops: its last error and lines */
    } else {
        snprintf(msg, sizeof msg, "%s", why);
    }
    int can_restart = z->round < o->max_restarts && !ddprun_got_signal;
    if (rc == RG_FAILED || !can_restart) {
        if (rc != RG_FAILED)
            ddprun_rdzv_fail(z, msg);
        fprintf(stderr, "ddprun: the job stops: %s\n", msg);
        return -1;
    }
    if (rc != RG_RESTART && ddprun_rdzv_restart(z, msg) < 0)
        return -1;
    fprintf(stderr, "ddprun: %s; every node restarts (%lld of %d)\n", msg, z->round + 1,
            o->max_restarts);
    return 1;
}

static int run_elastic(const ddprun_options *o, const ddprun_job *job, ddprun_worker *ws)
{
    ddprun_rdzv z;
    if (ddprun_rdzv_open(o, &z) < 0)
        return -1;
    int rc;
    while ((rc = elastic_round(o, job, ws, &z)) == 1)
        ;
    ddprun_rdzv_close(&z);
    free(z.seen_hb);
    free(z.seen_at);
    return rc;
}

int main(int argc, char **argv)
{
    static ddprun_options o;
    ddprun_job job;
    int rc = ddprun_parse_options(argc, argv, &o);
    if (rc)
        return rc;
    ddprun_worker *ws = calloc((size_t)o.nproc, sizeof *ws);
    if (!ws) {
        fprintf(stderr, "ddprun: out of memory\n");
        return 1;
    }
    /* Up to 4 descriptors per worker (2 pipes, 2 log files): 1024 workers
     * need more than the usual soft limit of 1024.  The workers get the
     * user's limit back (workers.c). */
    if (getrlimit(RLIMIT_NOFILE, &ddprun_nofile) == 0) {
        struct rlimit raised = {ddprun_nofile.rlim_max, ddprun_nofile.rlim_max};
        setrlimit(RLIMIT_NOFILE, &raised);
    }
    /* Handlers first: a signal while the job's files are made still
     * removes them. */
    struct sigaction sa = {.sa_handler = on_signal}, usr = {.sa_handler = on_usr1};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGUSR1, &usr, NULL);
    signal(SIGPIPE, SIG_IGN);
    ddprun_blas_env();
    if (ddprun_job_open(&o, &job) < 0)
        rc = -1;
    else if (!ddprun_got_signal)
        rc = o.elastic ? run_elastic(&o, &job, ws) : run_job(&o, &job, ws);
    ddprun_job_close(&o, &job);
    free(ws);
    if (ddp__timeline_merge_env() < 0) /* DDP_TIMELINE_DIR: the ranks' timelines in one file */
        fprintf(stderr, "ddprun: %s\n", ddp_last_error());
    if (ddprun_got_signal) {
        fprintf(stderr, "ddprun: interrupted by signal %d; workers stopped\n",
                (int)ddprun_got_signal);
        return 128 + ddprun_got_signal;
    }
    return rc == 0 ? 0 : 1;
}
