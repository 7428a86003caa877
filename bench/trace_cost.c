/* What the flight recorder and the statistics cost an operation
 * (src/pg/trace.h), without a network: the executor's calls for one
 * inline collective (issued and started at once, then finished) in a
 * loop, with the recorder on (DDP_TRACE_BUFFER=2000) and with it and
 * DDP_COMM_STATS off, in alternated rounds; prints the median ns per
 * operation of each.  The same source builds against an older tree (the
 * calls are unchanged), so two builds compare in one command:
 *
 *   build/bench/trace_cost [OPS_PER_ROUND] [ROUNDS]    (default 200000, 9) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pg/trace.h"

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static double round_ns(ddp__trace *t, int n)
{
    ddp__coll_args a;
    memset(&a, 0, sizeof a);
    a.kind = DDP__ALL_REDUCE;
    a.count = 1;
    a.dtype = DDP_FLOAT32;
    a.op = DDP_SUM;
    double t0 = now_ns();
    for (int i = 0; i < n; i++) {
        int64_t s = 0;
        uint64_t id = ddp__trace_queued(t, &a, (uint64_t)i, NULL, 1, &s);
        ddp__trace_finished(t, id, &a, 2, s, 0);
    }
    return (now_ns() - t0) / n;
}

static int cmp(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 200000, rounds = argc > 2 ? atoi(argv[2]) : 9;
    if (n <= 0 || rounds <= 0 || rounds > 100) {
        fprintf(stderr, "usage: trace_cost [OPS_PER_ROUND] [ROUNDS (1-100)]\n");
        return 2;
    }
    static ddp__trace on, off;
    setenv("DDP_TRACE_BUFFER", "2000", 1);
    setenv("DDP_COMM_STATS", "0", 1);
    if (ddp__trace_init(&on) < 0)
        return 1;
    setenv("DDP_TRACE_BUFFER", "0", 1);
    if (ddp__trace_init(&off) < 0)
        return 1;
    double a[100], b[100];
    for (int r = 0; r < rounds; r++) {
        a[r] = round_ns(&on, n);
        b[r] = round_ns(&off, n);
    }
    qsort(a, (size_t)rounds, sizeof *a, cmp);
    qsort(b, (size_t)rounds, sizeof *b, cmp);
    printf("recorder on: %.1f ns/op (%.1f-%.1f); recorder and stats off: %.1f ns/op (%.1f-%.1f)\n",
           a[rounds / 2], a[0], a[rounds - 1], b[rounds / 2], b[0], b[rounds - 1]);
    ddp__trace_free(&on);
    ddp__trace_free(&off);
    return 0;
}
