/* What one timeline span costs (src/base/timeline.h): a loop of tiny work
 * items, each bare, each wrapped in a span with the timeline off, and each
 * wrapped with it on, in alternated rounds; prints the median ns per item
 * of each and the differences (the span's cost).
 *
 *   build/bench/timeline_cost [ITEMS_PER_ROUND] [ROUNDS]    (default 200000, 7)
 *
 * The switch is flipped in place between rounds (the recorder reads
 * DDP_TIMELINE_DIR, set here to a scratch folder, once); nothing is written:
 * the timeline is off again before exit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/timeline.h"

static volatile uint64_t sink;

/* A few ns of dependent work, so the loop is not empty. */
static inline uint64_t work(uint64_t x)
{
    x ^= x << 13;
    x ^= x >> 7;
    return x ^ (x << 17);
}

static double bare(int n)
{
    uint64_t x = 88172645463325252ull, t0 = ddp__tl_clock_ns();
    for (int i = 0; i < n; i++)
        x = work(x);
    sink = x;
    return (double)(ddp__tl_clock_ns() - t0) / n;
}

static double spans(int n)
{
    uint64_t x = 88172645463325252ull, t0 = ddp__tl_clock_ns();
    for (int i = 0; i < n; i++) {
        uint64_t s = ddp__tl_begin();
        x = work(x);
        ddp__tl_end(s, "bench span", "i", i);
    }
    sink = x;
    return (double)(ddp__tl_clock_ns() - t0) / n;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 200000, rounds = argc > 2 ? atoi(argv[2]) : 7;
    if (n < 1 || rounds < 1 || rounds > 100) {
        fprintf(stderr, "usage: timeline_cost [ITEMS_PER_ROUND] [ROUNDS<=100]\n");
        return 2;
    }
    char dir[] = "/tmp/ddp-timeline-cost-XXXXXX", cap[32];
    if (!mkdtemp(dir))
        return 1;
    snprintf(cap, sizeof cap, "%d", n * rounds);
    setenv("DDP_TIMELINE_DIR", dir, 1);
    setenv("DDP_TIMELINE_MAX_EVENTS", cap, 1);
    if (!ddp__tl_enabled()) {
        fprintf(stderr, "timeline_cost: the timeline did not turn on: %s\n", ddp_last_error());
        return 1;
    }
    double b[100], off[100], on[100];
    for (int r = 0; r < rounds; r++) {
        b[r] = bare(n);
        atomic_store(&ddp__tl_state, DDP__TL_OFF);
        off[r] = spans(n);
        atomic_store(&ddp__tl_state, DDP__TL_ON);
        on[r] = spans(n);
    }
    atomic_store(&ddp__tl_state, DDP__TL_OFF); /* no file at exit */
    rmdir(dir);
    double mb = median(b, rounds), moff = median(off, rounds), mon = median(on, rounds);
    printf("timeline span cost, %d items x %d alternated rounds (median ns per item)\n", n, rounds);
    printf("bare %.2f  span off %.2f  span on %.2f\n", mb, moff, mon);
    printf("cost of a span: off %.2f ns, on %.2f ns\n", moff - mb, mon - mb);
    return 0;
}
