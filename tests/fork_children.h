/* Multi-process test helpers: run a function in forked children and
 * collect their exit codes, with a time limit.  Header-only (static), for
 * the cmocka test files that include it. */
#ifndef DDP_TESTS_FORK_CHILDREN_H
#define DDP_TESTS_FORK_CHILDREN_H

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

/* Runs fn(rank, arg) in n forked children; returns how many failed (exit
 * code != 0, or still running after limit_s, then killed).  Children report
 * with return codes and stderr: cmocka asserts must not run in a child. */
static int run_children(int n, int (*fn)(int rank, void *arg), void *arg, double limit_s)
{
    pid_t pids[64];
    if (n > 64)
        return n;
    for (int i = 0; i < n; i++) {
        fflush(NULL);
        pids[i] = fork();
        if (pids[i] == 0)
            _exit(fn(i, arg) == 0 ? 0 : 1);
    }
    int failed = 0;
    double deadline = ddp_time_now() + limit_s;
    for (int i = 0; i < n; i++) {
        int status = 0;
        for (;;) {
            pid_t r = waitpid(pids[i], &status, WNOHANG);
            if (r == pids[i])
                break;
            if (ddp_time_now() > deadline) {
                fprintf(stderr, "child %d still running after %.1f s: killed\n", i, limit_s);
                kill(pids[i], SIGKILL);
                waitpid(pids[i], &status, 0);
                status = 1;
                break;
            }
            sleep_s(0.002);
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            failed++;
    }
    return failed;
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
