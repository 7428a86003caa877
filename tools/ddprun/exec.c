/* What a worker's process runs, made in ddprun before the fork: its
 * environment (ddprun's own with the worker's variables) and the program
 * as execvp would find it in PATH.  The forked child of a ddprun with
 * threads (the launchers' store) may only make async-signal-safe calls
 * until exec: setenv, snprintf, fprintf and strerror may allocate or take
 * locks, none of them is async-signal-safe, and a lock another thread held
 * at the fork stays held in the child forever.  From here the child calls
 * only execve, write and strerrordesc_np (a constant string). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ddprun.h"

extern char **environ;

void ddprun_say(int fd, const char *s)
{
    for (size_t len = strlen(s); len > 0;) {
        ssize_t w = write(fd, s, len);
        if (w <= 0)
            return;
        s += w;
        len -= (size_t)w;
    }
}

/* name in PATH as execvp searches it (an empty entry: the current folder;
 * PATH unset: glibc's /bin:/usr/bin), or name itself when it has a '/':
 * into p->path (malloc'ed).  Not found: p->path NULL and p->err what
 * execvp would say, EACCES when some candidate exists but cannot be run
 * (no execute bit, a folder, a noexec mount), else ENOENT.  -1 when out
 * of memory. */
static int find_program(ddprun_exec_plan *p, const char *name)
{
    p->err = ENOENT;
    if (strchr(name, '/'))
        return (p->path = strdup(name)) ? 0 : -1;
    const char *path = getenv("PATH");
    for (const char *s = path ? path : "/bin:/usr/bin";;) {
        const char *e = strchrnul(s, ':');
        size_t n = (size_t)(e - s), len = n + strlen(name) + 2;
        char *c = malloc(len);
        if (!c)
            return -1;
        snprintf(c, len, "%.*s%s%s", (int)n, s, n ? "/" : "", name);
        struct stat st;
        if (stat(c, &st) == 0) {
            if (S_ISREG(st.st_mode) && access(c, X_OK) == 0) {
                p->path = c;
                return 0;
            }
            p->err = EACCES; /* execvp's got_eacces: said if nothing runs */
        }
        free(c);
        if (!*e)
            return 0;
        s = e + 1;
    }
}

/* Adds "name=value" to p's environment (unless keep_user and ddprun's own
 * environment has name: a user's choice stays). */
static int add(ddprun_exec_plan *p, const char *name, const char *value, int keep_user)
{
    if (keep_user && getenv(name))
        return 0;
    if (p->nowned == DDPRUN_EXEC_VARS) /* the array's room: a variable added above */
        return -1;
    char *kv = NULL;
    if (asprintf(&kv, "%s=%s", name, value) < 0)
        return -1;
    p->envp[p->nowned++] = kv;
    return 0;
}

static int add_int(ddprun_exec_plan *p, const char *name, long v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%ld", v);
    return add(p, name, buf, 0);
}

/* The worker's variables (torchrun's, and libddp's), then the rest of
 * ddprun's environment minus the names set here. */
static int make_env(ddprun_exec_plan *p, const ddprun_options *o, const ddprun_job *job,
                    const ddprun_worker *w, int restart)
{
    int rc = add_int(p, "RANK", w->rank) | add_int(p, "LOCAL_RANK", w->local_rank) |
             add_int(p, "WORLD_SIZE", (long)o->nproc * o->nnodes) |
             add_int(p, "LOCAL_WORLD_SIZE", o->nproc) | add_int(p, "GROUP_RANK", o->node_rank) |
             add_int(p, "GROUP_WORLD_SIZE", o->nnodes) | add_int(p, "ROLE_RANK", w->rank) |
             add_int(p, "MASTER_PORT", o->master_port) |
             add_int(p, "TORCHELASTIC_RESTART_COUNT", restart) |
             add_int(p, "DDP_RESTART_COUNT", restart) |
             add_int(p, "TORCHELASTIC_MAX_RESTARTS", o->max_restarts) |
             add(p, "TORCHELASTIC_RUN_ID", o->rdzv_id, 0) |
             add(p, "MASTER_ADDR", o->master_addr, 0) |
             add(p, "DDP_ERROR_FILE", w->error_file, 0);
    if (job->secret_file[0]) /* jobdir.c says why a file */
        rc |= add(p, "DDP_SECRET_FILE", job->secret_file, 0);
    /* libddp is silent by default; under ddprun its warnings (a rendezvous
     * still waiting for ranks, say) reach the user unless DDP_LOG_LEVEL says. */
    rc |= add(p, "DDP_LOG_LEVEL", "warn", 1);
    /* torchrun's default: one OpenMP thread per worker so N workers do not
     * oversubscribe the cores; a user's explicit choice stays. */
    rc |= add(p, "OMP_NUM_THREADS", "1", 1);
    if (rc)
        return -1;
    size_t nenv = (size_t)p->nowned;
    for (char **e = environ; *e; e++) {
        size_t n = strcspn(*e, "=");
        int dup = 0;
        for (int i = 0; i < p->nowned && !dup; i++)
            dup = strncmp(p->envp[i], *e, n) == 0 && p->envp[i][n] == '=';
        if (!dup)
            p->envp[nenv++] = *e;
    }
    p->envp[nenv] = NULL;
    return 0;
}

int ddprun_exec_plan_make(const ddprun_options *o, const ddprun_job *job, const ddprun_worker *w,
                          int restart, ddprun_exec_plan *p)
{
    memset(p, 0, sizeof *p);
    size_t nenv = 0, nargs = 0;
    while (environ[nenv])
        nenv++;
    while (o->argv[nargs])
        nargs++;
    p->envp = calloc(nenv + DDPRUN_EXEC_VARS + 1, sizeof *p->envp);
    p->sh_argv = calloc(nargs + 2, sizeof *p->sh_argv);
    snprintf(p->fail, sizeof p->fail, "ddprun: cannot run '%s': ", o->argv[0]);
    if (!p->envp || !p->sh_argv || make_env(p, o, job, w, restart) < 0 ||
        find_program(p, o->argv[0]) < 0)
        return -1;
    /* execvp's rule for a file without "#!": the shell reads it */
    static char sh[] = "/bin/sh";
    p->sh_argv[0] = sh;
    p->sh_argv[1] = p->path;
    for (size_t i = 1; i < nargs; i++)
        p->sh_argv[i + 1] = o->argv[i];
    return 0;
}

void ddprun_exec_plan_free(ddprun_exec_plan *p)
{
    for (int i = 0; i < p->nowned; i++) /* the strings made here, first in envp */
        free(p->envp[i]);
    free(p->envp);
    free(p->sh_argv);
    free(p->path);
    memset(p, 0, sizeof *p);
}

void ddprun_exec(const ddprun_options *o, const ddprun_exec_plan *p)
{
    int err = p->err; /* not found in PATH: as execvp says it */
    if (p->path) {
        execve(p->path, o->argv, p->envp);
        err = errno;
        if (err == ENOEXEC) {
            execve("/bin/sh", p->sh_argv, p->envp);
            err = errno;
        }
    }
    const char *why = strerrordesc_np(err); /* a constant string: no locale, no lock */
    ddprun_say(STDERR_FILENO, p->fail);
    ddprun_say(STDERR_FILENO, why ? why : "unknown error");
    ddprun_say(STDERR_FILENO, "\n");
    _exit(127);
}
