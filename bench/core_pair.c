/* What one core loses when the other core works too: the reference model's
 * forward GEMM (64 x 784 times 784 x 256, one BLAS thread) and a 64 MiB
 * memcpy, each run alone for S seconds, then in two processes at once.
 *
 *   build/bench/core_pair [S]        (default 2)
 *
 * Prints, per kernel, the rate alone, each process's rate in the pair, and
 * pair / alone.  On a machine with N idle cores and no shared bottleneck the
 * ratio is 1.0; below that, two ranks on this machine cannot reach twice
 * one rank's throughput whatever the communication costs (bench/RESULTS.md,
 * issue 5: scaling).  Run it on a quiet machine: other load only adds. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ddp.h"

#define M 64
#define N 256
#define K 784
#define COPY_BYTES (64u << 20)

/* Rate of the kernel over `seconds`: GFLOP/s (gemm) or GB/s (copy). */
static double run_kernel(int gemm, double seconds)
{
    float *a = malloc((size_t)M * K * sizeof *a), *b = malloc((size_t)K * N * sizeof *b);
    float *c = malloc((size_t)M * N * sizeof *c);
    char *src = malloc(COPY_BYTES), *dst = malloc(COPY_BYTES);
    if (!a || !b || !c || !src || !dst)
        return -1;
    for (int i = 0; i < M * K; i++)
        a[i] = (float)(i % 7) * 0.1f;
    for (int i = 0; i < K * N; i++)
        b[i] = (float)(i % 5) * 0.1f;
    memset(src, 1, COPY_BYTES);
    memset(dst, 0, COPY_BYTES);
    double t0 = ddp_time_now(), work = 0;
    while (ddp_time_now() - t0 < seconds) {
        if (gemm) {
            for (int r = 0; r < 20; r++)
                ddp_sgemm(0, 1, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N);
            work += 20.0 * 2.0 * M * N * K;
        } else {
            memcpy(dst, src, COPY_BYTES);
            work += COPY_BYTES;
        }
    }
    double rate = work / (ddp_time_now() - t0) / 1e9;
    free(a);
    free(b);
    free(c);
    free(src);
    free(dst);
    return rate;
}

/* Two processes at once; their rates in r[0], r[1]. */
static int run_pair(int gemm, double seconds, double r[2])
{
    int fds[2][2];
    pid_t pid[2];
    for (int k = 0; k < 2; k++) {
        if (pipe(fds[k]) < 0)
            return -1;
        fflush(NULL);
        pid[k] = fork();
        if (pid[k] < 0)
            return -1;
        if (pid[k] == 0) {
            double v = run_kernel(gemm, seconds);
            _exit(write(fds[k][1], &v, sizeof v) == sizeof v ? 0 : 1);
        }
    }
    int rc = 0;
    for (int k = 0; k < 2; k++) {
        int st;
        if (read(fds[k][0], &r[k], sizeof r[k]) != sizeof r[k])
            rc = -1;
        waitpid(pid[k], &st, 0);
        close(fds[k][0]);
        close(fds[k][1]);
    }
    return rc;
}

int main(int argc, char **argv)
{
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    if (!(seconds > 0 && seconds < 600)) {
        fprintf(stderr, "usage: core_pair [SECONDS]\n");
        return 2;
    }
    printf("%ld CPUs online, %.1f s per measurement\n", sysconf(_SC_NPROCESSORS_ONLN), seconds);
    for (int gemm = 1; gemm >= 0; gemm--) {
        double alone = run_kernel(gemm, seconds), pair[2];
        if (alone < 0 || run_pair(gemm, seconds, pair) < 0) {
            fprintf(stderr, "core_pair: out of memory or fork failed\n");
            return 1;
        }
        printf("%-34s alone %6.1f %s   pair %6.1f %6.1f   pair/alone %.2f\n",
               gemm ? "sgemm 64x784 x 784x256, 1 thread" : "memcpy 64 MiB", alone,
               gemm ? "GFLOP/s" : "GB/s   ", pair[0], pair[1],
               (pair[0] + pair[1]) / 2 / alone);
    }
    return 0;
}
