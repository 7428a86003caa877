/* The one-thread sgemm rate (ddp_sgemm, OpenBLAS) for the GEMM shapes that
 * ddp-cnn's step runs (PyTorch's examples/mnist network, batch 64), and for
 * the shapes of other lowerings of its second convolution (several samples
 * per GEMM, Winograd F(2x2, 3x3)'s 16 products): the roof each lowering can
 * reach.  Each shape: REPS calls per round, ROUNDS rounds alternated over the
 * shapes; prints the median GFLOP/s and the spread (min-max).
 *
 *   build/bench/matmul_shapes [REPS] [ROUNDS]   (default 20, 5) */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ddp.h"

typedef struct shape {
    const char *what;
    int ta, tb, m, n, k;
    int calls; /* GEMMs of this shape per batch of 64 */
} shape;

/* ddp-cnn's GEMMs at batch 64 (conv: one per sample, docs/cnn.md) */
static const shape shapes[] = {
    {"conv1 fwd  W (32,9) cols (9,676)", 0, 0, 32, 676, 9, 64},
    {"conv1 dW   dy (32,676) cols^T", 0, 1, 32, 9, 676, 64},
    {"conv2 fwd  W (64,288) cols (288,576)", 0, 0, 64, 576, 288, 64},
    {"conv2 dW   dy (64,576) cols^T (576,288)", 0, 1, 64, 288, 576, 64},
    {"conv2 dcol W^T (288,64) dy (64,576)", 1, 0, 288, 576, 64, 64},
    {"conv2 fwd, 4 samples (64,288) (288,2304)", 0, 0, 64, 2304, 288, 16},
    {"conv2 dW, 4 samples (64,2304) (2304,288)", 0, 1, 64, 288, 2304, 16},
    {"wino fwd   U (64,32) V (32,144)", 0, 0, 64, 144, 32, 16 * 64},
    {"wino fwd   U (64,32) V (32,576) 4 smp", 0, 0, 64, 576, 32, 16 * 16},
    {"wino fwd   U (64,32) V (32,2304) 16 smp", 0, 0, 64, 2304, 32, 16 * 4},
    {"wino dx    U^T (32,64) M (64,576) 4 smp", 1, 0, 32, 576, 64, 16 * 16},
    /* what conv_winograd*.c runs today: one sample, 156 tiles (144 + one
     * spare per row of tiles) */
    {"wino fwd   U (64,32) V (32,156)", 0, 0, 64, 156, 32, 16 * 64},
    {"wino dx    U' (32,64) V' (64,182)", 0, 0, 32, 182, 64, 16 * 64}, /* 13x14 tiles */
    {"wino dW    dM (64,156) V^T (156,32)", 0, 1, 64, 32, 156, 16 * 64},
    {"fc1 fwd    x (64,9216) W^T (9216,128)", 0, 1, 64, 128, 9216, 1},
    {"fc1 dW     dy^T (128,64) x (64,9216)", 1, 0, 128, 9216, 64, 1},
    {"fc1 dx     dy (64,128) W (128,9216)", 0, 0, 64, 9216, 128, 1},
};
enum { NSHAPES = sizeof shapes / sizeof shapes[0] };

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

static float *filled(size_t n, int mod)
{
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; p && i < n; i++)
        p[i] = (float)(i % (size_t)mod) / (float)mod - 0.5f;
    return p;
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 20, rounds = argc > 2 ? atoi(argv[2]) : 5;
    if (reps < 1 || rounds < 1 || rounds > 64) {
        fprintf(stderr, "usage: matmul_shapes [REPS] [ROUNDS (1..64)]\n");
        return 2;
    }
    ddp_set_num_threads(1);
    size_t big = (size_t)128 * 9216; /* the largest operand of any shape */
    float *a = filled(big, 17), *b = filled(big, 13), *c = filled(big, 11);
    if (!a || !b || !c)
        return 1;
    static double gf[NSHAPES][64];
    for (int r = 0; r < rounds; r++)
        for (int s = 0; s < NSHAPES; s++) {
            const shape *q = &shapes[s];
            int lda = q->ta ? q->m : q->k, ldb = q->tb ? q->k : q->n;
            double t0 = now();
            for (int i = 0; i < reps; i++)
                ddp_sgemm(q->ta, q->tb, q->m, q->n, q->k, 1.0f, a, lda, b, ldb, 0.0f, c, q->n);
            gf[s][r] = 2.0 * q->m * q->n * q->k * reps / (now() - t0) / 1e9;
        }
    printf("%-42s %8s %13s %12s\n", "shape (one thread)", "GFLOP/s", "(min-max)",
           "ms per batch");
    for (int s = 0; s < NSHAPES; s++) {
        const shape *q = &shapes[s];
        qsort(gf[s], (size_t)rounds, sizeof gf[s][0], cmp);
        double med = gf[s][rounds / 2];
        double ms = 2.0 * q->m * q->n * q->k * q->calls / med / 1e6;
        printf("%-42s %8.1f (%5.1f-%5.1f) %12.2f\n", q->what, med, gf[s][0], gf[s][rounds - 1],
               ms);
    }
    free(a), free(b), free(c);
    return 0;
}
