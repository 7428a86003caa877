/* A worker program for the ddprun tests.  Modes:
 *   env DIR          write DIR/env.RANK with the launcher's variables, exit 0
 *   fail R CODE      rank R says why on stderr and exits CODE; others sleep
 *   sleep DIR        write DIR/pid.RANK, then sleep 30 s
 *   flaky DIR        rank 1 dies by SIGKILL in the first generation; every
 *                    worker of the next writes DIR/done.RANK and exits 0
 *   spam N CODE      writes N numbered lines to stderr, then "FATAL-LAST",
 *                    and exits CODE
 *   grandchild DIR   leaves a child sleeping 30 s (its pid in DIR/child.RANK)
 *                    holding stdout and stderr, and exits 0
 *   runid DIR        writes TORCHELASTIC_RUN_ID to DIR/runid.RANK, exit 0
 *   allreduce DIR S  joins the job's process group (env://), writes
 *                    DIR/joined.RANK, waits S seconds, all-reduces rank + 1
 *                    and writes the sum to DIR/sum.RANK; a failure is one
 *                    line on stderr and exit 1
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
        write_file(argv[2], "env", rank, text);
        return 0;
    }
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
        usleep((useconds_t)(atof(argv[3]) * 1e6));
        if (ddp_pg_all_reduce(pg, &x, 1, DDP_INT32, DDP_SUM) < 0 || ddp_pg_barrier(pg) < 0) {
            fprintf(stderr, "all_reduce: %s\n", ddp_last_error());
            return 1;
        }
        snprintf(text, sizeof text, "%d\n", (int)x);
        write_file(argv[2], "sum", rank, text);
        ddp_destroy_process_group(pg);
        return 0;
    }
    fprintf(stderr, "usage: ddprun_worker env|fail|sleep|flaky|spam|grandchild|allreduce ...\n");
    return 2;
}
