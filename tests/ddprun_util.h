/* What the ddprun tests share: starting ddprun with real workers
 * (tests/helpers/ddprun_worker.c), collecting its stderr and status, and
 * reading the files the workers write (DIR/WHAT.RANK). */
#ifndef DDP_TESTS_DDPRUN_UTIL_H
#define DDP_TESTS_DDPRUN_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char ddprun[4096], worker[4096];

/* ddprun and the worker program of the build under test (DDP_TEST_BUILD). */
static inline void ddprun_paths(void)
{
    const char *build = getenv("DDP_TEST_BUILD");
    if (!build)
        build = "build";
    snprintf(ddprun, sizeof ddprun, "%s/bin/ddprun", build);
    snprintf(worker, sizeof worker, "%s/tests/helpers/ddprun_worker", build);
}

static inline double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct {
    pid_t pid;
    int err_fd;
} launch;

/* Starts ddprun with argv (NULL-terminated), stderr to a pipe, stdout to
 * out_path (NULL: /dev/null); in_child, when given, runs in ddprun's
 * process before the exec (its CPUs, a seccomp filter). */
static inline launch start_with(char *const argv[], const char *out_path, void (*in_child)(void))
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(p[1], 2);
        int out = open(out_path ? out_path : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(out, 1);
        close(p[0]);
        if (in_child)
            in_child();
        execv(argv[0], argv);
        _exit(126);
    }
    close(p[1]);
    return (launch){pid, p[0]};
}

static inline launch start_to(char *const argv[], const char *out_path)
{
    return start_with(argv, out_path, NULL);
}

static inline launch start(char *const argv[]) { return start_to(argv, NULL); }

/* Waits for ddprun to exit (at most limit_s), collecting its stderr. */
static inline int finish(launch l, char *err, size_t len, double limit_s)
{
    size_t n = 0;
    double deadline = now() + limit_s;
    int status = -1;
    for (;;) {
        struct pollfd pfd = {.fd = l.err_fd, .events = POLLIN};
        if (poll(&pfd, 1, 50) > 0) {
            ssize_t r = read(l.err_fd, err + n, len - 1 - n);
            if (r > 0)
                n += (size_t)r;
        }
        if (waitpid(l.pid, &status, WNOHANG) == l.pid)
            break;
        if (now() > deadline) {
            kill(l.pid, SIGKILL);
            waitpid(l.pid, &status, 0);
            fail_msg("ddprun did not exit within %.1f s", limit_s);
        }
    }
    ssize_t r;
    while ((r = read(l.err_fd, err + n, len - 1 - n)) > 0)
        n += (size_t)r;
    err[n] = '\0';
    close(l.err_fd);
    return status;
}

static inline void make_dir(char *dir)
{
    strcpy(dir, "/tmp/ddprun-test-XXXXXX");
    assert_non_null(mkdtemp(dir));
}

static inline void remove_dir(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static inline int read_path(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, len - 1, f);
    buf[n] = '\0';
    fclose(f);
    return 0;
}

/* DIR/WHAT.RANK, a worker's report. */
static inline int read_file(const char *dir, const char *what, int rank, char *buf, size_t len)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s.%d", dir, what, rank);
    return read_path(path, buf, len);
}

/* Waits (at most 20 s) for DIR/WHAT.RANK of ranks 0..n-1; pids, when
 * given, gets the number each file holds. */
static inline void wait_files(const char *dir, const char *what, int n, pid_t *pids)
{
    char buf[64];
    double deadline = now() + 20;
    for (int r = 0; r < n; r++) {
        while (read_file(dir, what, r, buf, sizeof buf) != 0) {
            if (now() > deadline)
                fail_msg("no %s/%s.%d after 20 s", dir, what, r);
            usleep(10000);
        }
        if (pids)
            pids[r] = atoi(buf);
    }
}

/* Waits for a job of 2 "allreduce" workers and checks both sums. */
static inline void expect_sums(launch l, const char *dir, const char *job)
{
    char err[8192], buf[64];
    int st = finish(l, err, sizeof err, 30);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("%s: status %d: %s", job, st, err);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(read_file(dir, "sum", r, buf, sizeof buf), 0);
        assert_string_equal(buf, "3\n");
    }
}

#endif
