/* What the training-report helpers (include/ddp/progress.h) cost per call,
 * against the clock read they cannot avoid (ddp_time_now), in alternated
 * rounds: ddp_progress_update with the bar off (a pipe, CI), with it on
 * (into /dev/null, redrawn every 0.1 s as on a terminal, or at every call
 * with --interval 0), and ddp_metrics_write of ddp-mnist's 7-field train
 * record into a file.  Prints per case the median ns per call over the
 * rounds, with the range, and its ratio to the clock read.
 *
 *   build/bench/progress_cost [--rounds 7] [--calls 200000]            */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ddp.h"

enum { CLOCK, BAR_OFF, BAR_ON, METRICS, NCASES };
static const char *const names[NCASES] = {"ddp_time_now (reference)", "progress_update, bar off",
                                          "progress_update, bar on", "metrics_write, 7 fields"};

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* ns per call of case c over n calls. */
static double measure(int c, long n, ddp_progress_t *off, ddp_progress_t *on, ddp_metrics_t *m)
{
    volatile double sink = 0;
    double t0 = ddp_time_now();
    for (long i = 0; i < n; i++) {
        switch (c) {
        case CLOCK: sink += ddp_time_now(); break;
        case BAR_OFF: ddp_progress_update(off, (size_t)i % 900 + 1, (size_t)i * 64, 0.5); break;
        case BAR_ON: ddp_progress_update(on, (size_t)i % 900 + 1, (size_t)i * 64, 0.5); break;
        case METRICS: {
            ddp_metric f[] = {{"epoch", 1},   {"step", (double)i}, {"global_step", (double)i},
                              {"loss", 0.53}, {"mean_loss", 0.61}, {"lr", 0.1},
                              {"samples_per_s", 51234.5}};
            if (ddp_metrics_write(m, "train", f, 7) < 0) {
                fprintf(stderr, "progress_cost: %s\n", ddp_last_error());
                exit(1);
            }
            break;
        }
        }
    }
    (void)sink;
    return (ddp_time_now() - t0) / (double)n * 1e9;
}

int main(int argc, char **argv)
{
    int rounds = 7;
    long calls = 200000;
    double interval = 0.1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--calls"))
            calls = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--interval"))
            interval = atof(argv[i + 1]);
    }
    if (rounds < 1 || rounds > 99 || calls < 1) {
        fprintf(stderr, "usage: progress_cost [--rounds 1..99] [--calls N] [--interval S]\n");
        return 2;
    }
    FILE *null = fopen("/dev/null", "w");
    char path[] = "/tmp/ddp-progress-cost-XXXXXX";
    int fd = mkstemp(path);
    if (!null || fd < 0)
        return 1;
    close(fd);
    ddp_progress_options o = ddp_progress_defaults();
    o.stream = null;
    o.mode = DDP_PROGRESS_OFF;
    ddp_progress_t *off, *on;
    ddp_metrics_t *m;
    if (ddp_progress_create(&o, &off) < 0 || (o.mode = DDP_PROGRESS_ON, o.interval = interval,
                                              ddp_progress_create(&o, &on)) < 0 ||
        ddp_metrics_create(path, 0, &m) < 0) {
        fprintf(stderr, "progress_cost: %s\n", ddp_last_error());
        return 1;
    }
    ddp_progress_begin(off, "Epoch 1/1", 900);
    ddp_progress_begin(on, "Epoch 1/1", 900);
    double ns[NCASES][99];
    for (int r = 0; r < rounds; r++)
        for (int c = 0; c < NCASES; c++) /* alternated: each round runs every case */
            ns[c][r] = measure(c, c == METRICS ? calls / 20 : calls, off, on, m);
    printf("case                        median ns/call (range)        / clock read\n");
    double ref = 0;
    for (int c = 0; c < NCASES; c++) {
        qsort(ns[c], (size_t)rounds, sizeof(double), cmp);
        double med = ns[c][rounds / 2];
        if (c == CLOCK)
            ref = med;
        printf("%-27s %9.1f (%.1f-%.1f) %10.2f\n", names[c], med, ns[c][0], ns[c][rounds - 1],
               med / ref);
    }
    ddp_progress_destroy(off);
    ddp_progress_destroy(on);
    ddp_metrics_destroy(m);
    fclose(null);
    unlink(path);
    return 0;
}
