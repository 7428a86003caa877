/* The collective matrix of test_coll.c (every collective x world sizes 1-8
 * x counts 0, 1, 7, 1023, 1M+3 x dtypes and ops, bitwise against the
 * references) on hierarchical groups: ranks spread over fake hosts with
 * DDP_HOST_ID, uneven and interleaved (world 3: AAB, 4: ABAB, 5: AAABB, 8:
 * ABCDABCD; 2: AB with DDP_HIERARCHICAL=1, one rank per host).  All-reduce
 * results are checked against the hierarchical order (coll_ref.h), with
 * each leaders' algorithm, reduce against its hierarchical order; the
 * other collectives against the same references as on one host.  Each
 * group must have run hierarchically: every rank checks its layout and that
 * every collective went through the two levels (coll/hier.h's counters);
 * reduce_scatter is checked against its hierarchical order. */
#include <stdlib.h>

#include "coll/hier.h"
#include "ddp/pg.h"
#include "pg/internal.h"

static const char *hier_layout(int n)
{
    switch (n) {
    case 1: return "A";
    case 2: return "AB";
    case 3: return "AAB";
    case 4: return "ABAB";
    case 5: return "AAABB";
    case 8: return "ABCDABCD";
    default: return NULL;
    }
}

static int hier_check_group(ddp_pg_t *pg);

int coll_matrix_main(void);
#define COLL_HOST_LAYOUT(n) hier_layout(n)
#define COLL_CHECK_GROUP(pg) hier_check_group(pg)
#define main coll_matrix_main
#include "test_coll.c"
#undef main

/* 1 when pg is not laid out as hier_layout says or skipped a level. */
static int hier_check_group(ddp_pg_t *pg)
{
    const int n = ddp_pg_size(pg), r = ddp_pg_rank(pg);
    const char *lay = hier_layout(n);
    const ddp__hier *h = ddp__pg_hier(pg);
    if (n == 1)
        return h != NULL; /* one host: plain shm */
    if (!h) {
        fprintf(stderr, "rank %d of %d: the group is not hierarchical\n", r, n);
        return 1;
    }
    int bad = 0, lsize = 0;
    for (int q = 0; q < n; q++) {
        int same = lay[q] == lay[r];
        lsize += same;
        for (int p = 0; p < n; p++)
            bad |= (lay[p] == lay[q]) != (h->host_of[p] == h->host_of[q]);
    }
    bad |= h->local.size != lsize || (h->local.tp != NULL) != (lsize > 1);
    bad |= (h->leaders.tp != NULL) != (h->local.rank == 0);
    bad |= lsize > 1 && strcmp(h->local.tp->vt->name, "shm") != 0;
    bad |= h->leaders.tp && strcmp(h->leaders.tp->vt->name, "tcp") != 0;
    bad |= strcmp(ddp__pg_transport(pg)->vt->name, "tcp") != 0;
    static const int kinds[] = {DDP__ALL_REDUCE, DDP__BROADCAST, DDP__REDUCE, DDP__BARRIER,
                                DDP__ALL_GATHER, DDP__GATHER, DDP__SCATTER, DDP__ALL_TO_ALL,
                                DDP__REDUCE_SCATTER};
    for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++)
        bad |= h->runs[kinds[k]] == 0;
    if (bad)
        fprintf(stderr,
                "rank %d of %d: layout %s, local size %d (want %d), leader %d, runs of "
                "all_reduce/broadcast/reduce/barrier %llu/%llu/%llu/%llu (every kind must have "
                "run hierarchically)\n",
                r, n, lay, h->local.size, lsize, h->leaders.tp != NULL,
                (unsigned long long)h->runs[DDP__ALL_REDUCE],
                (unsigned long long)h->runs[DDP__BROADCAST],
                (unsigned long long)h->runs[DDP__REDUCE],
                (unsigned long long)h->runs[DDP__BARRIER]);
    return bad;
}

int main(void)
{
    setenv("DDP_TRANSPORT", "auto", 1);
    setenv("DDP_HIERARCHICAL", "1", 1); /* world 2 (AB): one rank per host */
    return coll_matrix_main();
}
