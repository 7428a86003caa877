/* DDP_DEBUG=off|info|detail, TORCH_DISTRIBUTED_DEBUG's levels.
 *
 * info: a line per group created, and DDP's bucket layout (src/ddp/).
 * detail: before every collective the ranks exchange its fingerprint
 * (operation, dtype, count, root, reduce operator) with an all-gather over
 * the group's own backend, so that ranks that issue different collectives
 * fail at once, every one of them with the same message naming the rank and
 * both calls, where they would otherwise time out, fail on a length, or
 * (same bytes, another operator) return garbage.  As PyTorch's
 * ProcessGroupWrapper does with a gloo group beside the real one; here the
 * exchange takes its own range of sequence numbers, so its messages never
 * meet the collective's.  Cost: one small all-gather per collective
 * (bench/RESULTS.md).  DDP adds unused parameters and bucket order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/env.h"
#include "base/error.h"
#include "pg/internal.h"
#include "pg/pg_impl.h"

/* The fingerprint exchange's sequence number: the collective's with bit 31
 * flipped.  The bit must survive in every tag the exchange's messages get:
 * coll.h's tags keep 34 bits of sequence number, and the hierarchical
 * backend's sub-transports take seq << 2 | step (coll/hier.c), which keeps
 * 32 (bit 33 was dropped there, and the exchange took the collective's own
 * tags).  Flipped rather than set, so that it differs from its collective
 * however far the count goes; it meets collective #seq +- 2^31 only, never
 * in flight at the same time. */
#define CHECK_SEQ_BIT ((uint64_t)1 << 31)
#define FP_WORDS 5

int ddp__debug_init(ddp_pg_t *pg)
{
    int level = 0; /* off, info, detail (src/base/env.c) */
    DDP_TRY(ddp__env_word("DDP_DEBUG", &level));
    pg->debug = level;
    return 0;
}

int ddp__pg_debug_level(const ddp_pg_t *pg) { return pg ? pg->debug : 0; }

void ddp__op_text(const ddp__coll_args *a, char *out, size_t len)
{
    if (a->kind == DDP__BARRIER) {
        snprintf(out, len, "barrier");
        return;
    }
    int n = snprintf(out, len, "%s (%zu x %s", ddp__coll_name(a->kind), a->count,
                     ddp_dtype_name(a->dtype));
    if (n >= 0 && (size_t)n < len && ddp__op_has_reduce(a->kind))
        n += snprintf(out + n, len - (size_t)n, ", %s", ddp_reduce_op_name(a->op));
    if (n >= 0 && (size_t)n < len && ddp__op_has_root(a->kind))
        n += snprintf(out + n, len - (size_t)n, ", root %d", a->root);
    if (n >= 0 && (size_t)n < len)
        snprintf(out + n, len - (size_t)n, ")");
}

/* What identifies a call: arguments that do not apply are -1, so that a
 * stray root on an all-reduce differs from nothing. */
static void fingerprint(const ddp__coll_args *a, int64_t *fp)
{
    fp[0] = a->kind;
    fp[1] = a->dtype;
    fp[2] = (int64_t)a->count;
    fp[3] = ddp__op_has_root(a->kind) ? a->root : -1;
    fp[4] = ddp__op_has_reduce(a->kind) ? (int64_t)a->op : -1;
}

static ddp__coll_args from_fingerprint(const int64_t *fp)
{
    return (ddp__coll_args){.kind = (int)fp[0], .dtype = (ddp_dtype)fp[1],
                            .count = (size_t)fp[2], .root = (int)fp[3],
                            .op = (ddp_reduce_op)fp[4]};
}

int ddp__debug_check(ddp_pg_t *pg, const ddp__coll_args *a, uint64_t seq, double deadline)
{
    if (pg->size < 2)
        return 0;
    int64_t mine[FP_WORDS];
    fingerprint(a, mine);
    int64_t *all = calloc((size_t)pg->size * FP_WORDS, sizeof *all);
    DDP_FAIL_IF(!all, DDP_ERR_NOMEM, "out of memory");
    ddp__coll_args g = {.kind = DDP__ALL_GATHER, .send = mine, .recv = all, .count = FP_WORDS,
                        .dtype = DDP_INT64};
    int rc = pg->be->run(pg->impl, &g, seq ^ CHECK_SEQ_BIT, deadline);
    if (rc < 0) {
        ddp__error_context(rc, "DDP_DEBUG=detail: the fingerprint exchange");
        goto out;
    }
    for (int q = 1; q < pg->size; q++) {
        if (memcmp(all + (size_t)q * FP_WORDS, all, sizeof mine) == 0)
            continue;
        char theirs[160], first[160];
        ddp__coll_args aq = from_fingerprint(all + (size_t)q * FP_WORDS);
        ddp__coll_args a0 = from_fingerprint(all);
        ddp__op_text(&aq, theirs, sizeof theirs);
        ddp__op_text(&a0, first, sizeof first);
        rc = DDP_ERROR(DDP_ERR_MISMATCH,
                       "DDP_DEBUG=detail: collective #%llu differs between ranks: rank %d "
                       "called %s where rank 0 called %s",
                       (unsigned long long)seq, q, theirs, first);
        break;
    }
out:
    free(all);
    return rc;
}
