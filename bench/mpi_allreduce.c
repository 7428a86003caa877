/* Reference for bench/collectives.sh: MPI_Allreduce timed like
 * ddp-bench-collectives (same sizes, warm-up, median of back-to-back
 * iterations, same output columns).  The script builds it with
 * `mpicc -DDDP_WITH_MPI`; the Makefile's generic rule for bench sources
 * builds a stub that says so. */
#ifdef DDP_WITH_MPI
#define HAVE_MPI 1
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef HAVE_MPI
#include <mpi.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    size_t min_bytes = 4, max_bytes = 64u << 20;
    int iters = 50, warmup = 5;
    double factor = 2;
    int level = -1; /* --thread single|serialized|multiple: MPI_Init_thread's level */
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--min-bytes") == 0)
            min_bytes = (size_t)atof(argv[i + 1]);
        else if (strcmp(argv[i], "--max-bytes") == 0)
            max_bytes = (size_t)atof(argv[i + 1]);
        else if (strcmp(argv[i], "--iters") == 0)
            iters = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--step-factor") == 0)
            factor = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--thread") == 0)
            level = strcmp(argv[i + 1], "multiple") == 0     ? MPI_THREAD_MULTIPLE
                    : strcmp(argv[i + 1], "serialized") == 0 ? MPI_THREAD_SERIALIZED
                                                             : MPI_THREAD_SINGLE;
    }
    int provided = 0;
    if (level < 0)
        MPI_Init(&argc, &argv);
    else
        MPI_Init_thread(&argc, &argv, level, &provided);
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    float *a = malloc(max_bytes + 4), *b = malloc(max_bytes + 4);
    double *t = malloc(sizeof *t * (size_t)iters);
    memset(a, 0, max_bytes + 4);
    memset(b, 0, max_bytes + 4);
    if (rank == 0)
        printf("# MPI_Allreduce float32 sum, %d ranks\n# bytes median_us busbw_GBps\n", world);
    for (double sz = (double)min_bytes; sz <= (double)max_bytes; sz *= factor) {
        int count = (int)(sz / 4);
        size_t bytes = (size_t)count * 4;
        int n_it = bytes >= (16u << 20) && iters > 20 ? 20 : iters;
        for (int i = 0; i < warmup + n_it; i++) {
            double t0 = MPI_Wtime();
            MPI_Allreduce(MPI_IN_PLACE, a, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            if (i >= warmup)
                t[i - warmup] = MPI_Wtime() - t0;
        }
        qsort(t, (size_t)n_it, sizeof *t, cmp_double);
        double med = n_it % 2 ? t[n_it / 2] : (t[n_it / 2 - 1] + t[n_it / 2]) / 2;
        if (rank == 0)
            printf("%zu %.2f %.3f\n", bytes, med * 1e6,
                   (double)bytes * 2.0 * (world - 1) / world / med / 1e9);
        fflush(stdout);
    }
    free(a);
    free(b);
    free(t);
    MPI_Finalize();
    return 0;
}
#else
int main(void)
{
    fprintf(stderr, "mpi_allreduce: a stub; bench/collectives.sh builds the real one with "
                    "mpicc -DDDP_WITH_MPI\n");
    return 1;
}
#endif
