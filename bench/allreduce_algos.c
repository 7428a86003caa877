/* allreduce_algos: all-reduce algorithms side by side inside one group, for
 * a machine where other jobs make absolute timings noisy.
 *
 *   build/bench/allreduce_algos [--ranks 2] [--bytes 64M] [--rounds 5]
 *                               [--iters 10] [ALGO ...]      (default: shared ring)
 *
 * Forks --ranks processes that form one group (file store in a fresh
 * temporary directory; the transport is what DDP_TRANSPORT and the host say:
 * shm on one host).  Each round runs every ALGO (auto, ring, rd, direct,
 * shared) for one warm-up and --iters timed float32 sum all-reduces of
 * --bytes, in turn, so that the algorithms share the machine's noise.  Rank
 * 0 prints per algorithm the best, the first quartile and the median of all
 * timed calls, in microseconds and as bus bandwidth (bytes x 2(n-1)/n / t).
 * The best call is the one that ran with the least interference. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ddp.h"
#include "pg/internal.h"
#include "transport/transport.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static size_t parse_bytes(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (*end == 'k' || *end == 'K')
        v *= 1024;
    else if (*end == 'm' || *end == 'M')
        v *= 1024 * 1024;
    return (size_t)v;
}

static int run_rank(int rank, int n, const char *url, size_t bytes, int rounds, int iters,
                    char **algos, int nalgo)
{
    ddp_pg_t *pg = NULL;
    if (ddp_init_process_group("tcp", url, rank, n, 60.0, &pg) != 0) {
        fprintf(stderr, "rank %d: %s\n", rank, ddp_last_error());
        return 1;
    }
    size_t count = bytes / 4;
    float *x = calloc(count ? count : 1, sizeof *x);
    double *t = malloc(sizeof *t * (size_t)(rounds * iters * nalgo));
    int rc = !x || !t;
    for (int r = 0; r < rounds && !rc; r++)
        for (int a = 0; a < nalgo && !rc; a++) {
            rc = ddp__pg_set_option(pg, "allreduce_algo", algos[a]) != 0;
            for (int i = -1; i < iters && !rc; i++) {
                double t0 = ddp_time_now();
                rc = ddp_pg_all_reduce(pg, x, count, DDP_FLOAT32, DDP_SUM) != 0;
                if (i >= 0)
                    t[(a * rounds + r) * iters + i] = ddp_time_now() - t0;
            }
        }
    if (rc)
        fprintf(stderr, "rank %d: %s\n", rank, ddp_last_error());
    if (!rc && rank == 0) {
        printf("# all_reduce float32 sum, %zu bytes, %d ranks, transport %s; %d rounds x %d "
               "calls per algorithm\n# algo best_us q1_us median_us best_GBps q1_GBps "
               "median_GBps\n",
               bytes, n, ddp__pg_transport(pg)->vt->name, rounds, iters);
        double f = 2.0 * (n - 1) / n * (double)bytes / 1e9;
        for (int a = 0; a < nalgo; a++) {
            double *v = t + a * rounds * iters;
            int m = rounds * iters;
            qsort(v, (size_t)m, sizeof *v, cmp_double);
            printf("%-8s %10.1f %10.1f %10.1f %8.2f %8.2f %8.2f\n", algos[a], v[0] * 1e6,
                   v[m / 4] * 1e6, v[m / 2] * 1e6, f / v[0], f / v[m / 4], f / v[m / 2]);
        }
        fflush(stdout);
    }
    ddp_destroy_process_group(pg);
    free(x);
    free(t);
    return rc;
}

int main(int argc, char **argv)
{
    int n = 2, rounds = 5, iters = 10, i = 1;
    size_t bytes = 64u << 20;
    for (; i + 1 < argc && strncmp(argv[i], "--", 2) == 0; i += 2) {
        if (strcmp(argv[i], "--ranks") == 0)
            n = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--bytes") == 0)
            bytes = parse_bytes(argv[i + 1]);
        else if (strcmp(argv[i], "--rounds") == 0)
            rounds = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--iters") == 0)
            iters = atoi(argv[i + 1]);
        else
            break;
    }
    static char *dflt[] = {"shared", "ring"};
    char **algos = i < argc ? argv + i : dflt;
    int nalgo = i < argc ? argc - i : 2;
    if (n < 1 || n > 64 || rounds < 1 || iters < 1 || bytes < 4) {
        fprintf(stderr, "usage: %s [--ranks N] [--bytes B] [--rounds R] [--iters I] [ALGO ...]\n",
                argv[0]);
        return 2;
    }
    char dir[] = "/tmp/ddp_allreduce_algos_XXXXXX", path[64], url[80];
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(path, sizeof path, "%s/store", dir);
    snprintf(url, sizeof url, "file://%s", path);
    pid_t pids[64];
    for (int r = 0; r < n; r++) {
        fflush(NULL);
        pids[r] = fork();
        if (pids[r] == 0)
            _exit(run_rank(r, n, url, bytes, rounds, iters, algos, nalgo));
    }
    int failed = 0;
    for (int r = 0; r < n; r++) {
        int status = 0;
        waitpid(pids[r], &status, 0);
        failed += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    }
    unlink(path);
    rmdir(dir);
    return failed ? 1 : 0;
}
