/* Starting, signalling, reaping and stopping one generation of workers.
 * Each worker runs in its own process group (a stop reaches whatever it
 * started) and dies with ddprun (PR_SET_PDEATHSIG), so nothing is left
 * behind. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ddprun.h"

/* In the child (async-signal-safe calls only: exec.c says why): own
 * process group, death with the parent, its CPUs (--bind-to core; before
 * exec, so that the program's libraries size their thread pools by them
 * when they load), then the plan's program and environment. */
static void exec_worker(const ddprun_options *o, const ddprun_worker *w,
                        const ddprun_exec_plan *plan, int out_fd, int err_fd, pid_t parent)
{
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) /* the parent died before prctl */
        _exit(127);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    if (ddprun_nofile.rlim_cur) /* main.c raised ddprun's own */
        setrlimit(RLIMIT_NOFILE, &ddprun_nofile);
    if (out_fd >= 0)
        dup2(out_fd, STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    if (ddprun_bind_worker(o, w->local_rank) < 0) /* said on its stderr */
        _exit(127);
    ddprun_exec(o, plan);
}

/* Where a worker's two streams go on the console. */
static void route(const ddprun_options *o, ddprun_worker *w)
{
    int l = w->local_rank;
    ddprun_stream *ss[2] = {&w->out, &w->err};
    for (int k = 0; k < 2; k++) {
        int bit = k ? STD_ERR : STD_OUT;
        ss[k]->is_err = k;
        ss[k]->tee = (o->tee[l] & bit) != 0;
        int off = (o->redirects[l] & bit) && !ss[k]->tee;
        ss[k]->console = off || !o->shown[l] ? NULL : k ? stderr : stdout;
    }
}

static void close_pair(int p[2])
{
    for (int k = 0; k < 2; k++)
        if (p[k] >= 0)
            close(p[k]);
}

/* Starts the workers; on failure those not started count as exited. */
int ddprun_workers_start(const ddprun_options *o, const ddprun_job *job, ddprun_worker *ws,
                         int restart)
{
    pid_t parent = getpid();
    for (int l = 0; l < o->nproc; l++) {
        memset(&ws[l], 0, sizeof ws[l]);
        ws[l].out.fd = ws[l].err.fd = -1;
        ws[l].exited = 1; /* until forked */
        ws[l].local_rank = l;
        ws[l].rank = o->node_rank * o->nproc + l;
        route(o, &ws[l]);
    }
    for (int l = 0; l < o->nproc; l++) {
        ddprun_worker *w = &ws[l];
        int out[2] = {-1, -1}, err[2] = {-1, -1};
        if (ddprun_job_worker_files(o, job, w, restart) < 0)
            return -1;
        /* stdout goes straight to ddprun's when nothing is done to it: a
         * program sees the terminal it would see alone (line-buffered). */
        int pipe_out = o->prefix || o->want_logs || !o->shown[l];
        if ((pipe_out && pipe2(out, O_CLOEXEC)) || pipe2(err, O_CLOEXEC)) {
            fprintf(stderr, "ddprun: pipe: %s\n", strerror(errno));
            close_pair(out);
            close_pair(err);
            return -1;
        }
        ddprun_exec_plan plan;
        if (ddprun_exec_plan_make(o, job, w, restart, &plan) < 0) {
            fprintf(stderr, "ddprun: out of memory\n");
            ddprun_exec_plan_free(&plan);
            close_pair(out);
            close_pair(err);
            return -1;
        }
        pid_t pid = fork();
        if (pid == 0)
            exec_worker(o, w, &plan, out[1], err[1], parent);
        int fork_errno = errno;
        ddprun_exec_plan_free(&plan);
        if (pid < 0) {
            fprintf(stderr, "ddprun: fork: %s\n", strerror(fork_errno));
            close_pair(out);
            close_pair(err);
            return -1;
        }
        setpgid(pid, pid); /* also here: no race with a kill right after */
        w->pid = pid;
        w->exited = 0;
        if (pipe_out)
            close(out[1]);
        close(err[1]);
        w->out.fd = out[0];
        w->err.fd = err[0];
    }
    return 0;
}

/* Collects exited workers; returns the index of the first failure seen, or -1. */
int ddprun_workers_reap(const ddprun_options *o, ddprun_worker *ws, int *running)
{
    int failed = -1, status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int l = 0; l < o->nproc; l++) {
            if (ws[l].pid != pid || ws[l].exited)
                continue;
            ws[l].exited = 1;
            ws[l].status = status;
            (*running)--;
            if (failed < 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
                failed = l;
        }
    }
    return failed;
}

/* group: the worker's whole process group (a stop), else the worker alone
 * (SIGUSR1: its children, a data loader's say, would die of a signal they
 * do not expect). */
void ddprun_workers_signal(const ddprun_options *o, ddprun_worker *ws, int sig, int group)
{
    for (int l = 0; l < o->nproc; l++)
        if (!ws[l].exited)
            kill(group ? -ws[l].pid : ws[l].pid, sig);
}

/* Sends sig to every live worker, SIGKILL after the grace period, and
 * reaps them (giving up 5 s after SIGKILL: a process stuck in the kernel). */
void ddprun_workers_stop(const ddprun_options *o, ddprun_worker *ws, int *running, int sig)
{
    ddprun_workers_signal(o, ws, sig, 1);
    double deadline = ddprun_now() + o->stop_timeout;
    int killed = 0;
    while (*running > 0 && ddprun_now() < deadline + 5) {
        if (!killed && ddprun_now() >= deadline) {
            ddprun_workers_signal(o, ws, SIGKILL, 1);
            killed = 1;
        }
        ddprun_output_pump_all(o, ws, 20);
        ddprun_workers_reap(o, ws, running);
    }
}

/* After the workers exited: forwards what is left in the pipes (at most
 * 1 s: a grandchild may hold them open), kills whatever is left in the
 * workers' process groups, and closes the pipes and log files. */
void ddprun_workers_finish(const ddprun_options *o, ddprun_worker *ws)
{
    double deadline = ddprun_now() + 1.0;
    for (int open = 1; open && ddprun_now() < deadline;) {
        ddprun_output_pump_all(o, ws, 20);
        open = 0;
        for (int l = 0; l < o->nproc; l++)
            open |= ws[l].out.fd >= 0 || ws[l].err.fd >= 0;
    }
    for (int l = 0; l < o->nproc; l++) {
        if (ws[l].pid > 0)
            kill(-ws[l].pid, SIGKILL); /* grandchildren; ESRCH when none */
        ddprun_output_flush(o, &ws[l]);
        ddprun_output_close(&ws[l]);
    }
}

void ddprun_describe(const ddprun_worker *w, char *buf, size_t len)
{
    int st = w->status;
    if (WIFSIGNALED(st))
        snprintf(buf, len, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(buf, len, "exited with code %d", WEXITSTATUS(st));
}
