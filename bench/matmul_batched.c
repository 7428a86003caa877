/* Batched matmul (ddp_op_matmul on (B, M, K) x (B, K, N): one ddp_sgemm per
 * batch) against one GEMM of the same flops ((B*M, K) x (K, N), the GEMM
 * roof for these sizes), in alternated rounds; prints each one's median
 * GFLOP/s and spread and the ratio of the medians.  The op's time includes
 * the tape push (reset each repetition).
 *
 *   build/bench/matmul_batched [B M K N] [REPS] [ROUNDS]   (default 32 64 64 64, 50, 7) */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ddp.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int B = argc > 4 ? atoi(argv[1]) : 32, M = argc > 4 ? atoi(argv[2]) : 64;
    int K = argc > 4 ? atoi(argv[3]) : 64, N = argc > 4 ? atoi(argv[4]) : 64;
    int reps = argc > 5 ? atoi(argv[5]) : 50, rounds = argc > 6 ? atoi(argv[6]) : 7;
    if (B < 1 || M < 1 || K < 1 || N < 1 || reps < 1 || rounds < 1 || rounds > 64) {
        fprintf(stderr, "usage: matmul_batched [B M K N] [REPS] [ROUNDS (1..64)]\n");
        return 2;
    }
    ddp_set_num_threads(1);
    size_t na = (size_t)B * M * K, nb = (size_t)B * K * N;
    float *a = malloc(na * sizeof *a), *b = malloc(nb * sizeof *b);
    float *c = malloc((size_t)B * M * N * sizeof *c);
    if (!a || !b || !c)
        return 1;
    for (size_t i = 0; i < na; i++)
        a[i] = (float)(i % 17) / 17.0f;
    for (size_t i = 0; i < nb; i++)
        b[i] = (float)(i % 13) / 13.0f;
    ddp_tape_t *tape;
    ddp_tensor ta, tb;
    if (ddp_tape_create(&tape) < 0 || ddp_tensor_wrap(&ta, a, 3, (int64_t[]){B, M, K}) < 0 ||
        ddp_tensor_wrap(&tb, b, 3, (int64_t[]){B, K, N}) < 0)
        return 1;
    double flops = 2.0 * B * M * K * N, op_gf[64], gemm_gf[64];
    for (int r = 0; r < rounds; r++) {
        double t0 = now();
        for (int i = 0; i < reps; i++) {
            ddp_var_t *va, *vb, *y;
            ddp_tape_reset(tape);
            if (ddp_tape_input(tape, &ta, 0, &va) < 0 || ddp_tape_input(tape, &tb, 0, &vb) < 0 ||
                ddp_op_matmul(tape, va, vb, &y) < 0) {
                fprintf(stderr, "matmul: %s\n", ddp_last_error());
                return 1;
            }
        }
        op_gf[r] = flops * reps / (now() - t0) / 1e9;
        t0 = now();
        for (int i = 0; i < reps; i++) /* same flops: b's first matrix for every row */
            ddp_sgemm(0, 0, B * M, N, K, 1.0f, a, K, b, N, 0.0f, c, N);
        gemm_gf[r] = flops * reps / (now() - t0) / 1e9;
    }
    qsort(op_gf, (size_t)rounds, sizeof *op_gf, cmp);
    qsort(gemm_gf, (size_t)rounds, sizeof *gemm_gf, cmp);
    double mo = op_gf[rounds / 2], mg = gemm_gf[rounds / 2];
    printf("matmul (%d, %d, %d) x (%d, %d, %d): batched op %.1f GFLOP/s (%.1f-%.1f), one GEMM "
           "%.1f GFLOP/s (%.1f-%.1f), ratio %.2f\n", B, M, K, B, K, N, mo, op_gf[0],
           op_gf[rounds - 1], mg, gemm_gf[0], gemm_gf[rounds - 1], mo / mg);
    ddp_tape_destroy(tape);
    free(a), free(b), free(c);
    return 0;
}
