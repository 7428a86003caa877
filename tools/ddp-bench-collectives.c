/* ddp-bench-collectives: nccl-tests' all_reduce_perf for libddp.
 *
 * One process per rank:
 *   RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 ddp-bench-collectives &
 *   RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 ddp-bench-collectives
 * or --rank/--world-size/--init-method.  Rank 0 prints one line per size:
 *   bytes median_us busbw_GBps
 * (or a JSON array with --json).  Each size runs warm-up iterations, then
 * --iters timed ones back to back; the median is reported.  broadcast and
 * reduce do not synchronise the ranks (the root may finish long before the
 * data arrives), so for them each timed iteration starts after a barrier
 * and counts the slowest rank's time (an all_reduce MAX, not timed); ranks
 * leave a barrier up to one message latency apart, so small rooted
 * timings are approximate.
 * Bus bandwidth
 * follows nccl-tests: bytes / time times 2(n-1)/n for all_reduce, (n-1)/n
 * for all_gather, reduce_scatter and all_to_all (bytes = the whole result
 * or input of n blocks), 1 for broadcast and reduce. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ddp.h"

static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--rank R] [--world-size N] [--init-method URL] [--backend tcp]\n"
            "          [--collective all_reduce|broadcast|reduce|all_gather|reduce_scatter|"
            "all_to_all|barrier]\n"
            "          [--op sum] [--dtype float32] [--min-bytes 4] [--max-bytes 64M]\n"
            "          [--step-factor 2] [--iters 50] [--warmup 5] [--timeout 60] [--json]\n"
            "          [--symmetric (the input buffer in symmetric memory)]\n"
            "Rank and world size default to RANK and WORLD_SIZE; the init method to env://.\n",
            argv0);
}

static size_t parse_bytes(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    }
    return (size_t)v;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

enum { C_AR, C_BC, C_RED, C_AG, C_RS, C_A2A, C_BAR };
static const char *const coll_names[] = {"all_reduce", "broadcast", "reduce", "all_gather",
                                         "reduce_scatter", "all_to_all", "barrier"};

static int run_once(ddp_pg_t *pg, int coll, void *a, void *b, size_t count, ddp_dtype dt,
                    ddp_reduce_op op, int n)
{
    switch (coll) {
    case C_AR: return ddp_pg_all_reduce(pg, a, count, dt, op);
    case C_BC: return ddp_pg_broadcast(pg, a, count, dt, 0);
    case C_RED: return ddp_pg_reduce(pg, a, count, dt, op, 0);
    case C_AG: return ddp_pg_all_gather(pg, a, b, count / (size_t)n, dt);
    case C_RS: return ddp_pg_reduce_scatter(pg, a, b, count / (size_t)n, dt, op);
    case C_A2A: return ddp_pg_all_to_all(pg, a, b, count / (size_t)n, dt);
    default: return ddp_pg_barrier(pg);
    }
}

int main(int argc, char **argv)
{
    int rank = -1, world = -1, iters = 50, warmup = 5, json = 0, coll = C_AR, sym = 0;
    const char *init = "env://", *backend = "tcp", *opname = "sum", *dtname = "float32";
    size_t min_bytes = 4, max_bytes = 64u << 20;
    double factor = 2, timeout = 60;
    static const struct option opts[] = {
        {"rank", required_argument, 0, 'r'},        {"world-size", required_argument, 0, 'w'},
        {"init-method", required_argument, 0, 'i'}, {"backend", required_argument, 0, 'b'},
        {"op", required_argument, 0, 'o'},          {"dtype", required_argument, 0, 'd'},
        {"min-bytes", required_argument, 0, 'm'},   {"max-bytes", required_argument, 0, 'M'},
        {"iters", required_argument, 0, 'n'},       {"warmup", required_argument, 0, 'W'},
        {"json", no_argument, 0, 'j'},              {"collective", required_argument, 0, 'c'},
        {"step-factor", required_argument, 0, 'f'}, {"timeout", required_argument, 0, 't'},
        {"symmetric", no_argument, 0, 's'},         {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (ch) {
        case 'r': rank = atoi(optarg); break;
        case 'w': world = atoi(optarg); break;
        case 'i': init = optarg; break;
        case 'b': backend = optarg; break;
        case 'o': opname = optarg; break;
        case 'd': dtname = optarg; break;
        case 'm': min_bytes = parse_bytes(optarg); break;
        case 'M': max_bytes = parse_bytes(optarg); break;
        case 'n': iters = atoi(optarg); break;
        case 'W': warmup = atoi(optarg); break;
        case 'j': json = 1; break;
        case 's': sym = 1; break;
        case 'f': factor = atof(optarg); break;
        case 't': timeout = atof(optarg); break;
        case 'c':
            coll = -1;
            for (int i = 0; i <= C_BAR; i++)
                if (strcmp(optarg, coll_names[i]) == 0)
                    coll = i;
            if (coll < 0) {
                fprintf(stderr, "unknown collective '%s'\n", optarg);
                return 2;
            }
            break;
        default: usage(argv[0]); return ch == 'h' ? 0 : 2;
        }
    }
    ddp_dtype dt;
    ddp_reduce_op op;
    if (ddp_dtype_parse(dtname, &dt) < 0 || ddp_reduce_op_parse(opname, &op) < 0) {
        fprintf(stderr, "%s\n", ddp_last_error());
        return 2;
    }
    if (iters < 1 || factor <= 1 || min_bytes > max_bytes) {
        usage(argv[0]);
        return 2;
    }
    ddp_pg_t *pg = NULL;
    if (ddp_init_process_group(backend, init, rank, world, timeout, &pg) != 0) {
        fprintf(stderr, "init_process_group: %s\n", ddp_last_error());
        return 1;
    }
    rank = ddp_pg_rank(pg);
    world = ddp_pg_size(pg);
    size_t es = ddp_dtype_size(dt);
    size_t cap = (max_bytes / es + 1) * es * (size_t)world;
    char *a = NULL, *b = malloc(cap);
    if (sym && ddp_pg_symmetric_alloc(pg, cap, (void **)&a) < 0) { /* pg.h */
        fprintf(stderr, "symmetric_alloc: %s\n", ddp_last_error());
        return 1;
    }
    if (!sym)
        a = malloc(cap);
    double *t = malloc(sizeof *t * (size_t)iters);
    if (!a || !b || !t) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    memset(a, 0, cap); /* touch once: no page faults in the timed loop */
    memset(b, 0, cap);
    if (rank == 0 && !json)
        printf("# %s %s %s, %d ranks, backend %s\n# bytes median_us busbw_GBps\n",
               coll_names[coll], dtname, opname, world, backend);
    if (rank == 0 && !json && sym)
        printf("# input buffer in symmetric memory\n");
    if (rank == 0 && json)
        printf("[");
    int first = 1, rc = 0;
    for (double sz = (double)min_bytes; sz <= (double)max_bytes; sz *= factor) {
        size_t count = (size_t)sz / es;
        if (count == 0)
            count = 1;
        if (coll >= C_AG && coll <= C_A2A && count < (size_t)world)
            continue;
        if (coll >= C_AG && coll <= C_A2A)
            count -= count % (size_t)world;
        size_t bytes = count * es;
        int n_it = bytes >= (16u << 20) && iters > 20 ? 20 : iters;
        int rooted = coll == C_BC || coll == C_RED;
        for (int i = 0; i < warmup + n_it && rc == 0; i++) {
            if (rooted)
                rc = ddp_pg_barrier(pg);
            double t0 = ddp_time_now();
            if (rc == 0)
                rc = run_once(pg, coll, a, b, count, dt, op, world);
            double dt_s = ddp_time_now() - t0;
            if (rc == 0 && rooted)
                rc = ddp_pg_all_reduce(pg, &dt_s, 1, DDP_FLOAT64, DDP_MAX);
            if (i >= warmup)
                t[i - warmup] = dt_s;
        }
        if (rc != 0) {
            fprintf(stderr, "rank %d: %s of %zu bytes: %s\n", rank, coll_names[coll], bytes,
                    ddp_last_error());
            break;
        }
        qsort(t, (size_t)n_it, sizeof *t, cmp_double);
        double med = n_it % 2 ? t[n_it / 2] : (t[n_it / 2 - 1] + t[n_it / 2]) / 2;
        double f = coll == C_AR ? 2.0 * (world - 1) / world
                   : (coll == C_BC || coll == C_RED) ? 1.0
                   : coll == C_BAR ? 0.0 : (double)(world - 1) / world;
        double busbw = world > 1 ? (double)bytes * f / med / 1e9 : 0;
        if (rank == 0) {
            if (json)
                printf("%s\n {\"bytes\": %zu, \"median_us\": %.2f, \"busbw_GBps\": %.3f}",
                       first ? "" : ",", bytes, med * 1e6, busbw);
            else
                printf("%zu %.2f %.3f\n", bytes, med * 1e6, busbw);
            fflush(stdout);
        }
        first = 0;
        if (coll == C_BAR)
            break;
    }
    if (rank == 0 && json)
        printf("\n]\n");
    if (sym)
        ddp_pg_symmetric_free(pg, a);
    else
        free(a);
    free(b);
    free(t);
    ddp_destroy_process_group(pg);
    return rc == 0 ? 0 : 1;
}
