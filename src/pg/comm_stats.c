/* Communication statistics of a group: per operation and power-of-two size
 * bucket, the calls, bytes and time (from the executor's start to the end
 * of each call, as the flight recorder sees them), with the algorithm and
 * bus bandwidths of nccl-tests (doc/PERFORMANCE.md there): algbw = bytes /
 * time, where bytes is the size the call moves per rank (all_gather: the
 * whole output; reduce_scatter, all_to_all: the whole input), and busbw =
 * algbw x a factor per operation that makes it comparable with the
 * hardware's bandwidth: 2(n-1)/n for all_reduce, (n-1)/n for all_gather,
 * reduce_scatter and all_to_all, 1 for broadcast and reduce.  Printed
 * through the log module by ddp_pg_log_comm_stats, and at teardown with
 * DDP_COMM_STATS=1.  Kept while the flight recorder is on or with
 * DDP_COMM_STATS=1 (read when the group is created); with both off no
 * operation reads the clock. */
#include <stdio.h>
#include <string.h>

#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "pg/pg_impl.h"

double ddp__stats_bytes(const ddp__coll_args *a, int size)
{
    double b = (double)a->count * (double)ddp_dtype_size(a->dtype);
    switch (a->kind) {
    case DDP__ALL_GATHER:
    case DDP__GATHER:
    case DDP__SCATTER:
    case DDP__REDUCE_SCATTER:
    case DDP__ALL_TO_ALL:
        return b * size;
    default:
        return b;
    }
}

double ddp__stats_bus_factor(int kind, int size)
{
    double n = size;
    switch (kind) {
    case DDP__ALL_REDUCE:
        return 2 * (n - 1) / n;
    case DDP__ALL_GATHER:
    case DDP__GATHER:
    case DDP__SCATTER:
    case DDP__REDUCE_SCATTER:
    case DDP__ALL_TO_ALL:
        return (n - 1) / n;
    default:
        return 1;
    }
}

/* "4 B", "64 KiB": a bucket's lower end. */
static void size_text(int b, char *out, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = b / 10 < 4 ? b / 10 : 4;
    snprintf(out, len, "%llu %s", b ? 1ULL << (b - 10 * u) : 0ULL, units[u]); /* 0: 0-1 B */
}

int ddp_pg_log_comm_stats(ddp_pg_t *pg)
{
    DDP_FAIL_IF(!pg, DDP_ERR_INVALID_ARG, "log_comm_stats: NULL process group");
    ddp__stat_cell cells[DDP__NUM_COLL][DDP__STATS_BUCKETS]; /* 20 KB */
    ddp__trace_stats(&pg->trace, cells);
    ddp__log(DDP_LOG_INFO, "comm stats: group %s, rank %d of %d (%s)", pg->prefix, pg->rank,
             pg->size, pg->be->name);
    if (!pg->trace.stats_on) { /* no clock read at all on the hot path */
        ddp__log(DDP_LOG_INFO, "comm stats: not kept (DDP_TRACE_BUFFER=0 and DDP_COMM_STATS=0)");
        return 0;
    }
    ddp__log(DDP_LOG_INFO, "comm stats: %-14s %9s %10s %14s %11s %11s %11s", "op", "size from",
             "calls", "bytes", "time ms", "algbw GB/s", "busbw GB/s");
    int any = 0;
    for (int k = 0; k < DDP__NUM_COLL; k++)
        for (int b = 0; b < DDP__STATS_BUCKETS; b++) {
            const ddp__stat_cell *c = &cells[k][b];
            if (!c->calls)
                continue;
            char from[32];
            size_text(b, from, sizeof from);
            double seconds = (double)c->us * 1e-6;
            double alg = seconds > 0 ? (double)c->bytes / seconds / 1e9 : 0;
            ddp__log(DDP_LOG_INFO, "comm stats: %-14s %9s %10llu %14llu %11.3f %11.3f %11.3f",
                     ddp__coll_name(k), from, (unsigned long long)c->calls,
                     (unsigned long long)c->bytes, seconds * 1e3, alg,
                     alg * ddp__stats_bus_factor(k, pg->size));
            any = 1;
        }
    if (!any)
        ddp__log(DDP_LOG_INFO, "comm stats: no operation completed");
    return 0;
}

void ddp__comm_stats_at_destroy(ddp_pg_t *pg)
{
    int on = 0;
    if (ddp__env_bool("DDP_COMM_STATS", &on) < 0)
        DDP_WARN("%s", ddp_last_error());
    if (on)
        ddp_pg_log_comm_stats(pg);
}
