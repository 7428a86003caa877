/* ddprun's parts, one concept per file:
 *   main.c     the job: generations of workers, restarts, the failure summary
 *   options.c  the command line (torchrun's flags), every value checked
 *   workers.c  starting, signalling, reaping and stopping the workers
 *   output.c   the workers' output: console, log files, tee, filter, tail,
 *              last error
 *   jobdir.c   the job's private directory (its secret, the error files)
 *              and its log directory
 *   rdzv.c     the launchers' own rendezvous across nodes (--rdzv-backend
 *              c10d): rounds, node ranks, coordinated restarts
 *   bind.c     --bind-to core: each worker on CPUs of its own
 *   exec.c     a worker's environment and program, made before its fork
 * Names shared across these files start with ddprun_ (libddp's own ddp_ and
 * ddp__ prefixes stay the library's). */
#ifndef DDPRUN_H
#define DDPRUN_H

#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/types.h>

#define MAX_WORKERS 1024
#define LINE_MAX_LEN 4096
#define TAIL_LINES 10
#define TAIL_LINE_LEN 240

/* Stream bits of --redirects/--tee (torchrun's Std: 1 stdout, 2 stderr, 3 both). */
#define STD_OUT 1
#define STD_ERR 2

typedef struct {
    int nproc, nnodes, node_rank, max_restarts, prefix;
    int elastic;              /* --rdzv-backend c10d */
    int min_nodes, max_nodes; /* --nnodes MIN:MAX (elastic) */
    double rdzv_join_timeout, rdzv_last_call, rdzv_heartbeat_timeout; /* --rdzv-conf */
    const char *master_addr;
    int master_port;
    char rdzv_id[129];
    double stop_timeout;
    const char *log_dir;  /* --log-dir; NULL: none given */
    int want_logs;        /* --log-dir, --redirects or --tee: workers' output in files */
    int filtered;         /* --local-ranks-filter given */
    /* Per local rank: STD_* bits of --redirects and --tee, and whether the
     * console shows it (--local-ranks-filter). */
    unsigned char redirects[MAX_WORKERS], tee[MAX_WORKERS], shown[MAX_WORKERS];
    int bind_core;         /* --bind-to core */
    void **bind_sets;      /* with it, per local rank: its cpu_set_t (bind.c) */
    size_t bind_set_size;  /* their size in bytes */
    char **bind_refused;   /* per local rank: what its worker says if refused */
    char **argv; /* the program and its arguments */
} ddprun_options;

/* One output stream of a worker: bytes are forwarded line by line. */
typedef struct {
    int fd;
    int is_err;
    FILE *log;     /* its log file, or NULL */
    FILE *console; /* stdout/stderr, or NULL when redirected or filtered out */
    int tee;       /* console lines prefixed "[rank]:" */
    size_t len;
    char buf[LINE_MAX_LEN];
} ddprun_stream;

typedef struct {
    pid_t pid;
    int rank, local_rank;
    int status; /* wait status, valid when exited */
    int exited;
    ddprun_stream out, err;
    /* The last stderr line that looks like an error, and the last one. */
    char last_err[LINE_MAX_LEN], last_line[LINE_MAX_LEN];
    /* The last lines of both streams, in arrival order (a ring). */
    char tail[TAIL_LINES][TAIL_LINE_LEN];
    int tail_next, tail_count;
    char error_file[4096]; /* DDP_ERROR_FILE of this generation */
    char log_dir[4096];    /* its logs' folder this generation, "" without logs */
} ddprun_worker;

/* The job's directories: a private one (0700: the generated secret, the
 * error files when there are no logs) and the log directory. */
typedef struct {
    char private_dir[4096]; /* "" until made */
    char secret_file[4200]; /* "" unless ddprun made the secret */
    char logs[4096];        /* the job's log folder, "" without logs */
} ddprun_job;

/* The launchers' rendezvous (rdzv.c). */
typedef struct {
    char id[129], host[256], self[256]; /* job id, store endpoint, this node's address */
    int port, is_host;
    struct ddp_store *store;
    int min_nodes, max_nodes, nproc;
    double join_timeout, last_call, hb_timeout;
    long long round;                   /* this round */
    int slot, nnodes;                  /* this node's rank and the nodes, this round */
    char master_addr[256];             /* the workers' store, this round */
    int master_port;
    long long *seen_hb;                /* the others' heartbeats and when they last moved */
    double *seen_at;
} ddprun_rdzv;

extern volatile sig_atomic_t ddprun_got_signal; /* SIGINT/SIGTERM/SIGHUP: stop */
extern volatile sig_atomic_t ddprun_got_usr1;   /* SIGUSR1s to pass on */
extern struct rlimit ddprun_nofile;             /* the user's descriptor limit */

double ddprun_now(void);

/* options.c: 0, or the exit status (2) after a message on stderr. */
int ddprun_parse_options(int argc, char **argv, ddprun_options *o);

/* rdzv.c: 0 or -1 after a message on stderr. */
int ddprun_rdzv_open(const ddprun_options *o, ddprun_rdzv *z);
/* Joins the next round: slot, nnodes, master address. */
int ddprun_rdzv_join(ddprun_rdzv *z);
/* 0: go on (*all_done: every node's workers succeeded); 1: another node
 * asked for a restart, 2: the job failed (why says which and why); 3: a
 * node stopped answering (why); -1: the store is gone. */
int ddprun_rdzv_poll(ddprun_rdzv *z, int *all_done, char *why, size_t len);
int ddprun_rdzv_restart(ddprun_rdzv *z, const char *why);
int ddprun_rdzv_fail(ddprun_rdzv *z, const char *why);
int ddprun_rdzv_done(ddprun_rdzv *z);
void ddprun_rdzv_close(ddprun_rdzv *z);

/* jobdir.c */
int ddprun_job_open(const ddprun_options *o, ddprun_job *job);
/* Per worker and generation: its log folder and files, its error file. */
int ddprun_job_worker_files(const ddprun_options *o, const ddprun_job *job, ddprun_worker *w,
                            int restart);
void ddprun_job_close(const ddprun_options *o, ddprun_job *job);

/* blas_env.c: OPENBLAS_CORETYPE in ddprun's environment (so the workers')
 * where OpenBLAS would fall back to older kernels than the CPU runs. */
void ddprun_blas_env(void);

/* exec.c: what a worker's process runs, made in ddprun before the fork
 * (the child of a ddprun with threads makes async-signal-safe calls only). */
#define DDPRUN_EXEC_VARS 24 /* room for the variables exec.c sets (17 today) */
typedef struct {
    char **envp;     /* the worker's environment, NULL-ended: the nowned strings
                      * made for it, then ddprun's own not overridden */
    int nowned;
    char *path;      /* argv[0] as execvp finds it in PATH; NULL: not found */
    int err;         /* then what execvp would say: ENOENT, or EACCES */
    char **sh_argv;  /* /bin/sh, path, the arguments: a file without "#!" */
    char fail[4200]; /* "ddprun: cannot run 'ARGV0': " */
} ddprun_exec_plan;
/* 0, or -1 when out of memory (the plan to be freed all the same). */
int ddprun_exec_plan_make(const ddprun_options *o, const ddprun_job *job, const ddprun_worker *w,
                          int restart, ddprun_exec_plan *p);
void ddprun_exec_plan_free(ddprun_exec_plan *p);
/* In the worker's process: runs the plan's program; when it cannot, says
 * why on stderr and exits 127 (as a shell does). */
__attribute__((noreturn)) void ddprun_exec(const ddprun_options *o, const ddprun_exec_plan *p);
/* All of s to fd, as far as it goes (a worker's last words): write only. */
void ddprun_say(int fd, const char *s);

/* bind.c: with --bind-to core, ddprun's CPUs into o, or the exit status
 * (2) after a message on stderr when there are fewer than the workers. */
int ddprun_bind_plan(ddprun_options *o);
/* In a worker before exec: binds it to its share of those CPUs; 0, or -1
 * after a message on its stderr. */
int ddprun_bind_worker(const ddprun_options *o, int local_rank);

/* output.c */
void ddprun_output_pump_all(const ddprun_options *o, ddprun_worker *ws, int timeout_ms);
void ddprun_output_flush(const ddprun_options *o, ddprun_worker *w);
void ddprun_output_close(ddprun_worker *w);
/* The failing worker's report: last error, tail, where its logs are. */
void ddprun_output_report(const ddprun_worker *w);

/* workers.c */
int ddprun_workers_start(const ddprun_options *o, const ddprun_job *job, ddprun_worker *ws,
                         int restart);
int ddprun_workers_reap(const ddprun_options *o, ddprun_worker *ws, int *running);
void ddprun_workers_signal(const ddprun_options *o, ddprun_worker *ws, int sig, int group);
void ddprun_workers_stop(const ddprun_options *o, ddprun_worker *ws, int *running, int sig);
void ddprun_workers_finish(const ddprun_options *o, ddprun_worker *ws);
void ddprun_describe(const ddprun_worker *w, char *buf, size_t len);

#endif
