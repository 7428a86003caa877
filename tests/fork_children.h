/* Multi-process test helpers: run a function as ranks (forked children, or
 * threads) and collect their results, with a time limit for processes.
 * Header-only (static), for the cmocka test files that include it. */
#ifndef DDP_TESTS_FORK_CHILDREN_H
#define DDP_TESTS_FORK_CHILDREN_H

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ddp/base.h"

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* A group of ranks running fn(rank, arg): forked processes, or threads
 * (for stores that live in one process).  Ranks report with return codes
 * and stderr: cmocka asserts must not run in them. */
typedef struct rank_group {
    int n, threads;
    pid_t pids[64];
    pthread_t tids[64];
    struct rank_arg {
        int (*fn)(int rank, void *arg);
        void *arg;
        int rank, rc;
    } args[64];
} rank_group;

static void *rank_thread(void *p)
{
    struct rank_arg *a = p;
    a->rc = a->fn(a->rank, a->arg);
    return NULL;
}

static void start_ranks(rank_group *g, int threads, int n, int (*fn)(int rank, void *arg),
                        void *arg)
{
    g->n = n > 64 ? 64 : n;
    g->threads = threads;
    for (int i = 0; i < g->n; i++) {
        g->args[i] = (struct rank_arg){fn, arg, i, 1};
        if (threads) {
            if (pthread_create(&g->tids[i], NULL, rank_thread, &g->args[i]) != 0)
                g->tids[i] = 0;
            continue;
        }
        fflush(NULL);
        g->pids[i] = fork();
        if (g->pids[i] == 0)
            _exit(fn(i, arg) == 0 ? 0 : 1);
    }
}

/* Waits for child pid until the ddp_time_now() deadline: 1 when it exited
 * (its status in *status), 0 when it still ran (then it is killed and
 * reaped, and *status says so). */
static int reap_by(pid_t pid, double deadline, int *status)
{
    for (;;) {
        if (waitpid(pid, status, WNOHANG) == pid)
            return 1;
        if (ddp_time_now() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, status, 0);
            return 0;
        }
        sleep_s(0.002);
    }
}

/* Kills and reaps every child in pids (those already reaped are skipped
 * by waitpid's ECHILD): before a test fails, so that no rank outlives it. */
static inline void kill_children(const pid_t *pids, int n)
{
    for (int i = 0; i < n; i++)
        if (pids[i] > 0)
            kill(pids[i], SIGKILL);
    for (int i = 0; i < n; i++)
        if (pids[i] > 0)
            waitpid(pids[i], NULL, 0);
}

/* Waits for the group; returns how many ranks failed.  Processes still
 * running after limit_s are killed and count as failed; threads cannot be,
 * so their functions must bound their own waits. */
static int join_ranks(rank_group *g, double limit_s)
{
    int failed = 0;
    double deadline = ddp_time_now() + limit_s;
    for (int i = 0; i < g->n; i++) {
        if (g->threads) {
            if (g->tids[i])
                pthread_join(g->tids[i], NULL);
            failed += g->args[i].rc != 0;
            continue;
        }
        int status = 0;
        if (!reap_by(g->pids[i], deadline, &status)) {
            fprintf(stderr, "rank %d still running after %.1f s: killed\n", i, limit_s);
            failed++;
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            failed++;
        }
    }
    return failed;
}

/* Runs fn(rank, arg) in n forked children; returns how many failed. */
__attribute__((unused)) static int run_children(int n, int (*fn)(int rank, void *arg), void *arg,
                                                double limit_s)
{
    if (n > 64)
        return n;
    rank_group g;
    start_ranks(&g, 0, n, fn, arg);
    return join_ranks(&g, limit_s);
}

#define CHILD_CHECK(cond)                                                                  \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "%s:%d: child check failed: %s (%s)\n", __FILE__, __LINE__,   \
                    #cond, ddp_last_error());                                              \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)

#endif
