/* A worker program for the ddprun tests.  Modes:
 *   env DIR          write DIR/env.RANK with the launcher's variables, exit 0
 *   fail R CODE      rank R says why on stderr and exits CODE; others sleep
 *   sleep DIR        write DIR/pid.RANK, then sleep 30 s
 *   flaky DIR        rank 1 dies by SIGKILL in the first generation; every
 *                    worker of the next writes DIR/done.RANK and exits 0
 *   elastic DIR      generation 0: writes DIR/gen0.RANK (its pid) and sleeps
 *                    30 s; a later generation G writes DIR/genG.RANK
 *                    ("WORLD_SIZE GROUP_RANK") and exits 0
 *   spam N CODE      writes N numbered lines to stderr, then "FATAL-LAST",
 *                    and exits CODE
 *   grandchild DIR   leaves a child sleeping 30 s (its pid in DIR/child.RANK)
 *                    holding stdout and stderr, and exits 0
 *   runid DIR        writes TORCHELASTIC_RUN_ID to DIR/runid.RANK, exit 0
 *   allreduce DIR S  joins the job's process group (env://), writes
 *                    DIR/joined.RANK, waits S seconds (S "go": until DIR/go
 *                    exists, at most 30 s), all-reduces rank + 1
 *                    and writes the sum to DIR/sum.RANK; a failure is one
 *                    line on stderr and exit 1
 *   secret DIR       writes DIR/secret.RANK: DDP_SECRET_FILE, that file's
 *                    mode and bytes, and whether DDP_SECRET is set; exit 0
 *   out              "out RANK" to stdout, "err RANK" to stderr, exit 0
 *   errlines         stderr: a progress line, an error, a cleanup line; exit 4
 *   errfile MSG      writes MSG to DDP_ERROR_FILE, then noise to stderr; exit 3
 *   signals DIR      records each SIGUSR1 ("USR1") and SIGTERM/SIGINT
 *                    ("TERM"/"INT", then exit 0) in DIR/signals.RANK after
 *                    writing DIR/ready.RANK; waits up to 30 s
 *   cpus DIR         writes DIR/cpus.RANK: its Cpus_allowed_list, the
 *                    threads its OpenBLAS took when it loaded, and
 *                    ddp_num_threads(); exit 0
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cblas.h>

#include "base/env.h"
#include "ddp.h"

static int env_int(const char *name)
{
    const char *v = getenv(name);
    return v ? atoi(v) : -1;
}

static void write_file(const char *dir, const char *what, int rank, const char *text)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/%s.%d", dir, what, rank);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f)
        exit(90);
    fputs(text, f);
    fclose(f);
    rename(tmp, path); /* the test sees whole files only */
}

/* DDP_* variables through libddp's table, as programs read them. */
static const char *ddp_var(const char *name)
{
    const char *v = NULL;
    if (ddp__env_string(name, &v) < 0)
        exit(91);
    return v && *v ? v : NULL;
}

static void report_secret(const char *dir, int rank)
{
    char text[2048], secret[256] = "";
    const char *path = ddp_var("DDP_SECRET_FILE");
    struct stat st;
    int mode = path && stat(path, &st) == 0 ? (int)(st.st_mode & 07777) : -1;
    FILE *f = path ? fopen(path, "r") : NULL;
    if (f) {
        if (!fgets(secret, sizeof secret, f))
            secret[0] = '\0';
        secret[strcspn(secret, "\n")] = '\0';
        fclose(f);
    }
    snprintf(text, sizeof text, "file=%s\nmode=%o\nsecret=%s\nenv=%s\n", path ? path : "",
             mode < 0 ? 0 : mode, secret, ddp_var("DDP_SECRET") ? "set" : "unset");
    write_file(dir, "secret", rank, text);
}

/* Signal handlers append to one file opened before them (write is
 * async-signal-safe; stdio is not). */
static int signals_fd = -1;

static void on_signal(int sig)
{
    const char *what = sig == SIGUSR1 ? "USR1\n" : sig == SIGTERM ? "TERM\n" : "INT\n";
    if (write(signals_fd, what, strlen(what)) < 0)
        _exit(92);
    if (sig != SIGUSR1)
        _exit(0);
}

static int record_signals(const char *dir, int rank)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/signals.%d", dir, rank);
    signals_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (signals_fd < 0)
        return 93;
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    snprintf(path, sizeof path, "%d\n", (int)getpid());
    write_file(dir, "ready", rank, path);
    for (int i = 0; i < 3000; i++)
        usleep(10000); /* each signal cuts one sleep short */
    return 0;
}

/* Where the worker may run and how many BLAS threads it took: OpenBLAS's
 * count first, as its constructor set it, before libddp sets its own. */
static int report_cpus(const char *dir, int rank)
{
    char line[1024], list[1024] = "", text[2048];
    int openblas = openblas_get_num_threads();
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 94;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Cpus_allowed_list: %1023s", list) == 1)
            break;
    fclose(f);
    snprintf(text, sizeof text, "allowed=%s\nopenblas=%d\nddp=%d\n", list, openblas,
             ddp_num_threads());
    write_file(dir, "cpus", rank, text);
    return 0;
}

int main(int argc, char **argv)
{
    int rank = env_int("RANK");
    char text[2048];
    if (argc == 3 && !strcmp(argv[1], "env")) {
        const char *names[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                               "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                               "TORCHELASTIC_RESTART_COUNT", "OMP_NUM_THREADS",
                               "DDP_LOG_LEVEL"};
        size_t n = 0;
        for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
            const char *v = getenv(names[i]);
            n += (size_t)snprintf(text + n, sizeof text - n, "%s=%s\n", names[i], v ? v : "");
        }
        int nrank = 0, nomp = 0; /* a variable twice: getenv sees one, Python the other */
        for (char **e = environ; *e; e++) {
            nrank += !strncmp(*e, "RANK=", 5);
            nomp += !strncmp(*e, "OMP_NUM_THREADS=", 16);
        }
        snprintf(text + n, sizeof text - n, "entries named RANK %d, OMP_NUM_THREADS %d\n", nrank,
                 nomp);
        write_file(argv[2], "env", rank, text);
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "blas")) { /* the kernels this worker's OpenBLAS runs */
        const char *want = getenv("OPENBLAS_CORETYPE");
        snprintf(text, sizeof text, "OPENBLAS_CORETYPE=%s\ncore=%s\n", want ? want : "",
                 openblas_get_corename());
        write_file(argv[2], "blas", rank, text);
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "cpus"))
        return report_cpus(argv[2], rank);
    if (argc == 3 && !strcmp(argv[1], "runid")) {
        const char *id = getenv("TORCHELASTIC_RUN_ID");
        write_file(argv[2], "runid", rank, id ? id : "");
        return 0;
    }
    if (argc == 4 && !strcmp(argv[1], "fail")) {
        if (rank == atoi(argv[2])) {
            fprintf(stderr, "some progress\nworker %d failing on purpose\n", rank);
            return atoi(argv[3]);
        }
        sleep(30);
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "sleep")) {
        snprintf(text, sizeof text, "%d\n", (int)getpid());
        write_file(argv[2], "pid", rank, text);
        sleep(30);
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "flaky")) {
        if (env_int("TORCHELASTIC_RESTART_COUNT") == 0) {
            if (rank == 1)
                raise(SIGKILL);
            sleep(30);
            return 0;
        }
        write_file(argv[2], "done", rank, "ok\n");
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "elastic")) {
        int gen = env_int("TORCHELASTIC_RESTART_COUNT");
        char what[32];
        snprintf(what, sizeof what, "gen%d", gen);
        if (gen == 0) {
            snprintf(text, sizeof text, "%d\n", (int)getpid());
            write_file(argv[2], what, rank, text);
            sleep(30);
            return 0;
        }
        snprintf(text, sizeof text, "%d %d\n", env_int("WORLD_SIZE"), env_int("GROUP_RANK"));
        write_file(argv[2], what, rank, text);
        return 0;
    }
    if (argc == 4 && !strcmp(argv[1], "spam")) {
        for (int i = 0; i < atoi(argv[2]); i++)
            fprintf(stderr, "line %d\n", i);
        fprintf(stderr, "FATAL-LAST\n");
        return atoi(argv[3]);
    }
    if (argc == 3 && !strcmp(argv[1], "grandchild")) {
        pid_t pid = fork();
        if (pid == 0) {
            sleep(30);
            _exit(0);
        }
        snprintf(text, sizeof text, "%d\n", (int)pid);
        write_file(argv[2], "child", rank, text);
        return 0;
    }
    if (argc == 4 && !strcmp(argv[1], "allreduce")) {
        ddp_pg_t *pg = NULL;
        int32_t x = rank + 1;
        if (ddp_init_process_group("tcp", "env://", -1, -1, 20, &pg) < 0) {
            fprintf(stderr, "init: %s\n", ddp_last_error());
            return 1;
        }
        write_file(argv[2], "joined", rank, "ok\n");
        if (!strcmp(argv[3], "go")) { /* until the test says (at most 30 s) */
            char go[4200];
            snprintf(go, sizeof go, "%s/go", argv[2]);
            for (int i = 0; i < 3000 && access(go, F_OK) != 0; i++)
                usleep(10000);
        } else {
            usleep((useconds_t)(atof(argv[3]) * 1e6));
        }
        if (ddp_pg_all_reduce(pg, &x, 1, DDP_INT32, DDP_SUM) < 0 || ddp_pg_barrier(pg) < 0) {
            fprintf(stderr, "all_reduce: %s\n", ddp_last_error());
            return 1;
        }
        snprintf(text, sizeof text, "%d\n", (int)x);
        write_file(argv[2], "sum", rank, text);
        ddp_destroy_process_group(pg);
        return 0;
    }
    if (argc == 3 && !strcmp(argv[1], "secret")) {
        report_secret(argv[2], rank);
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "out")) {
        printf("out %d\n", rank);
        fprintf(stderr, "err %d\n", rank);
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "errlines")) {
        fprintf(stderr, "step 1 done\nerror: the real cause\nshutting down\n");
        return 4;
    }
    if (argc == 3 && !strcmp(argv[1], "errfile")) {
        const char *path = ddp_var("DDP_ERROR_FILE");
        FILE *f = path ? fopen(path, "w") : NULL;
        if (!f)
            return 94;
        fprintf(f, "%s\n", argv[2]);
        fclose(f);
        fprintf(stderr, "fatal: noise on stderr\n");
        return 3;
    }
    if (argc == 3 && !strcmp(argv[1], "signals"))
        return record_signals(argv[2], rank);
    fprintf(stderr, "usage: ddprun_worker env|fail|sleep|flaky|spam|grandchild|allreduce|secret|"
                    "out|errlines|errfile|signals ...\n");
    return 2;
}
