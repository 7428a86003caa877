/* A shell command for the end-to-end tests of the programs
 * (test_mnist_ddp.c, test_mnist_pipeline.c, test_cnn.c, test_llmc.c,
 * test_netns_cluster.c): run with a time limit, its stdout and stderr
 * together in a log file of the scratch folder, read back.
 * Include after scratch_dir.h (it uses `dir`) and mnist_output.h (slurp). */
#ifndef DDP_TESTS_RUN_LOGGED_H
#define DDP_TESTS_RUN_LOGGED_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

typedef struct {
    int status; /* exit status, -1 when killed */
    char *out;  /* stdout and stderr together (caller frees) */
} result;

static result vsh_in(int limit_s, const char *log_name, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));
static result vsh_in(int limit_s, const char *log_name, const char *fmt, va_list ap)
{
    char cmd[16384], body[15000], log[256];
    int len = vsnprintf(body, sizeof body, fmt, ap);
    if (len < 0 || (size_t)len >= sizeof body) { /* never run a command cut short */
        result cut = {-1, strdup("run_logged.h: the command is longer than 15000 bytes")};
        return cut;
    }
    snprintf(log, sizeof log, "%s/%s", dir, log_name);
    snprintf(cmd, sizeof cmd, "timeout -k 5 %d sh -c '%s' >%s 2>&1", limit_s, body, log);
    int st = system(cmd);
    result r = {WIFEXITED(st) ? WEXITSTATUS(st) : -1, slurp(log)};
    return r;
}

/* Runs a shell command for at most limit_s seconds, output to dir/log_name. */
static inline result sh_in(int limit_s, const char *log_name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline result sh_in(int limit_s, const char *log_name, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    result r = vsh_in(limit_s, log_name, fmt, ap);
    va_end(ap);
    return r;
}

/* Runs a shell command (at most 600 s), output to dir/log. */
static inline result sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline result sh(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    result r = vsh_in(600, "log", fmt, ap);
    va_end(ap);
    return r;
}

#endif
