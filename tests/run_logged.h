/* A shell command for the end-to-end tests of the programs
 * (test_mnist_ddp.c, test_mnist_pipeline.c, test_cnn.c, test_llmc.c): run with a time limit, its
 * stdout and stderr together in the scratch folder's log, read back.
 * Include after scratch_dir.h (it uses `dir`) and mnist_output.h (slurp). */
#ifndef DDP_TESTS_RUN_LOGGED_H
#define DDP_TESTS_RUN_LOGGED_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

typedef struct {
    int status; /* exit status, -1 when killed */
    char *out;  /* stdout and stderr together (caller frees) */
} result;

/* Runs a shell command (at most 600 s), output to dir/log. */
static result sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static result sh(const char *fmt, ...)
{
    char cmd[8192], body[7000], log[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    snprintf(log, sizeof log, "%s/log", dir);
    snprintf(cmd, sizeof cmd, "timeout -k 5 600 sh -c '%s' >%s 2>&1", body, log);
    int st = system(cmd);
    result r = {WIFEXITED(st) ? WEXITSTATUS(st) : -1, slurp(log)};
    return r;
}

#endif
