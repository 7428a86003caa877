/* Data-layer benchmark: time to load an MNIST-format training set (IDX
 * files, gzip'ed or raw) and DataLoader throughput for 0..4 workers.
 * Usage: data_load [DIR] [REPEATS] [BATCH] [WORK_US]
 * WORK_US: the consumer spins that long per batch after reading it (a
 * stand-in for a training step; 0 measures the loader alone).
 * Prints one line per measurement; the minimum over REPEATS is the figure
 * that bench/RESULTS.md records (noise from other processes only adds). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

#include "ddp.h"

/* CPU seconds of this thread: what the load costs, whatever else runs. */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
    int repeats = argc > 2 ? atoi(argv[2]) : 5;
    size_t batch = argc > 3 ? (size_t)atoi(argv[3]) : 64;
    double work_s = argc > 4 ? atof(argv[4]) * 1e-6 : 0.0;
    double best = 1e9, sum = 0, cpu_best = 1e9;
    ddp_dataset_t *ds = NULL;
    for (int r = 0; r < repeats; r++) {
        ddp_dataset_destroy(ds);
        ds = NULL;
        double t0 = ddp_time_now(), c0 = cpu_now();
        if (ddp_mnist_create(dir, NULL, &ds) < 0) {
            fprintf(stderr, "data_load: %s\n", ddp_last_error());
            return 1;
        }
        double t = ddp_time_now() - t0, c = cpu_now() - c0;
        sum += t;
        if (t < best)
            best = t;
        if (c < cpu_best)
            cpu_best = c;
    }
    printf("load train split (%zu samples): min %.3f s, mean %.3f s over %d; min CPU time "
           "%.3f s\n", ddp_dataset_length(ds), best, sum / repeats, repeats, cpu_best);
    for (int w = 0; w <= 4; w++) {
        ddp_loader_options o = ddp_loader_defaults();
        o.batch_size = batch;
        o.shuffle = 1;
        o.num_workers = w;
        ddp_loader_t *dl;
        if (ddp_loader_create(ds, &o, &dl) < 0) {
            fprintf(stderr, "data_load: %s\n", ddp_last_error());
            return 1;
        }
        double t0 = ddp_time_now();
        size_t samples = 0;
        ddp_batch b;
        int rc;
        ddp_loader_epoch_begin(dl, 0);
        volatile float sink = 0;
        double waited = 0, tw = ddp_time_now();
        while ((rc = ddp_loader_next(dl, &b)) == 1) {
            waited += ddp_time_now() - tw;
            samples += b.size;
            sink += b.x[b.size * b.sample_numel - 1]; /* touch the batch */
            for (double end = ddp_time_now() + work_s; ddp_time_now() < end;)
                ;
            tw = ddp_time_now();
        }
        double t = ddp_time_now() - t0;
        (void)sink;
        if (rc < 0) {
            fprintf(stderr, "data_load: %s\n", ddp_last_error());
            return 1;
        }
        printf("loader epoch, batch %zu, %d workers, %.0f us work per batch: %.3f s, %.0f "
               "samples/s, %.3f s in ddp_loader_next\n", batch, w, work_s * 1e6, t,
               (double)samples / t, waited);
        ddp_loader_destroy(dl);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("peak RSS %.1f MB\n", (double)ru.ru_maxrss / 1024.0);
    ddp_dataset_destroy(ds);
    return 0;
}
