/* All-reduce wall time and CPU time per iteration, per rank: the A/B
 * measure of bench/RESULTS.md's issue-3 section.  On a machine shared with
 * other busy processes wall times swing 3x from run to run, while the CPU
 * time a rank spends per all-reduce (user: the reduction; system: the
 * kernel's TCP copies and protocol work) moves much less; it is also what
 * bounds the wall time once both ranks have a core each.
 *
 * One process per rank (env:// rendezvous, like ddp-bench-collectives):
 *   for r in 1 0; do RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \
 *       DDP_TRANSPORT=tcp build/bench/allreduce_cpu 67108864 10 & done; wait
 * Rank 0 prints: bytes, the fastest and the median iteration, and for each
 * rank user + system CPU microseconds per iteration (getrusage over the
 * timed iterations, after 3 untimed ones).  To compare two versions of
 * libddp, build each (make BUILD=dir) and run their binaries in turn. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "ddp.h"

static double seconds(struct timeval t) { return (double)t.tv_sec + (double)t.tv_usec * 1e-6; }

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s BYTES ITERS\n", argv[0]);
        return 2;
    }
    size_t count = strtoull(argv[1], NULL, 10) / 4;
    int iters = atoi(argv[2]);
    if (count == 0 || iters < 1) {
        fprintf(stderr, "usage: %s BYTES ITERS\n", argv[0]);
        return 2;
    }
    ddp_pg_t *pg = NULL;
    if (ddp_init_process_group("tcp", "env://", -1, -1, 60.0, &pg) != 0) {
        fprintf(stderr, "init_process_group: %s\n", ddp_last_error());
        return 1;
    }
    int rank = ddp_pg_rank(pg), n = ddp_pg_size(pg), rc = 0;
    float *a = malloc(count * sizeof *a);
    double *t = malloc(sizeof *t * (size_t)iters);
    double *all = calloc((size_t)n * 4, sizeof *all);
    if (!a || !t || !all) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < count; i++) /* touched once: no page faults below */
        a[i] = (float)(i % 1000) * 0.001f;
    for (int i = 0; i < 3 && rc == 0; i++)
        rc = ddp_pg_all_reduce(pg, a, count, DDP_FLOAT32, DDP_SUM);
    struct rusage r0, r1;
    getrusage(RUSAGE_SELF, &r0);
    for (int i = 0; i < iters && rc == 0; i++) {
        double t0 = ddp_time_now();
        rc = ddp_pg_all_reduce(pg, a, count, DDP_FLOAT32, DDP_SUM);
        t[i] = ddp_time_now() - t0;
    }
    getrusage(RUSAGE_SELF, &r1);
    if (rc != 0) {
        fprintf(stderr, "rank %d: all_reduce: %s\n", rank, ddp_last_error());
        return 1;
    }
    qsort(t, (size_t)iters, sizeof *t, cmp_double);
    double *mine = all + 4 * rank;
    mine[0] = t[0];
    mine[1] = t[iters / 2];
    mine[2] = (seconds(r1.ru_utime) - seconds(r0.ru_utime)) / iters;
    mine[3] = (seconds(r1.ru_stime) - seconds(r0.ru_stime)) / iters;
    if (ddp_pg_all_reduce(pg, all, (size_t)n * 4, DDP_FLOAT64, DDP_SUM) != 0) {
        fprintf(stderr, "rank %d: gathering the figures: %s\n", rank, ddp_last_error());
        return 1;
    }
    if (rank == 0) {
        double cpu = 0;
        printf("%zu bytes: fastest %.0f us, median %.0f us | CPU us per iteration:", count * 4,
               all[0] * 1e6, all[1] * 1e6);
        for (int r = 0; r < n; r++) {
            printf(" r%d %.0f+%.0f", r, all[4 * r + 2] * 1e6, all[4 * r + 3] * 1e6);
            cpu += all[4 * r + 2] + all[4 * r + 3];
        }
        printf(" (all ranks %.1f ms)\n", cpu * 1e3);
    }
    free(a);
    free(t);
    free(all);
    ddp_destroy_process_group(pg);
    return 0;
}
