/* Hierarchical all_reduce, broadcast, reduce and barrier (the data-movement
 * collectives and reduce_scatter are in hier_move.c) over two levels of
 * transports (hier.h): the ranks of each host (shared memory) and one
 * leader per host (tcp).  The classic two-level scheme of MPICH's SMP-aware
 * collectives (MPIR_Allreduce_intra_smp) and NCCL's tree across nodes:
 * what crosses the network is one vector per host, not one per rank.
 *
 * all_reduce, with l ranks on a host, H hosts, B bytes:
 *   Phase 1: reduce onto the leader inside each host (reduce_direct.c: the
 *            leader folds its host's vectors in rank order);
 *   Phase 2: all_reduce among the H leaders (coll.c's choice by size:
 *            direct, recursive doubling or ring over the host partials);
 *   Phase 3: broadcast from the leader inside each host (broadcast_tree.c).
 * AVG runs SUM and the leaders divide by the group size once, after phase 2.
 * Reduction order, so bitwise the same on every rank and every run:
 * y_h = x(r_h0) op x(r_h1) op ... over host h's ranks in increasing order,
 * then the leaders' algorithm's order over y_0 .. y_{H-1} (hosts numbered by
 * their lowest rank).  Cost: local (l-1) B in and B out at the leader,
 * the leaders' all-reduce over H ranks (ring: 2 (H-1)/H B per leader on the
 * network, instead of 2 (n-1)/n B per rank for n = l H ranks on the flat
 * ring), and a local tree broadcast.
 *
 * Each phase runs to completion before the next (one executor drives one
 * transport at a time), under the operation's deadline.  Sub-collectives
 * take sequence numbers (seq << 2 | step) on their own transports, so two
 * steps on the same transport never share a tag. */
#include "coll/hier.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

/* ------------------------------------------------------------------ */
/* Error messages in the group's rank numbers                           */
/* ------------------------------------------------------------------ */

/* Copies "rank N" / "ranks N, M" at *s into out as group ranks. */
static size_t put_ranks(const char **s, char *out, size_t room, const int *map, int n)
{
    const char *p = *s;
    size_t o = 0;
    int plural = p[4] == 's';
    size_t word = plural ? 6 : 5;
    if (room <= word)
        return 0;
    memcpy(out, p, word);
    o = word;
    p += word;
    for (;;) {
        char *end;
        long v = strtol(p, &end, 10);
        int r = v >= 0 && v < n ? map[v] : (int)v;
        int w = snprintf(out + o, room - o, "%d", r);
        if (w < 0 || (size_t)w >= room - o)
            break;
        o += (size_t)w;
        p = end;
        if (!plural || p[0] != ',' || p[1] != ' ' || !isdigit((unsigned char)p[2]))
            break;
        if (room - o <= 2)
            break;
        memcpy(out + o, ", ", 2);
        o += 2;
        p += 2;
    }
    *s = p;
    return o;
}

static int at_rank_word(const char *msg, const char *s)
{
    if (s > msg && (isalnum((unsigned char)s[-1]) || s[-1] == '_'))
        return 0;
    if (strncmp(s, "rank ", 5) == 0)
        return isdigit((unsigned char)s[5]);
    if (strncmp(s, "ranks ", 6) == 0)
        return isdigit((unsigned char)s[6]);
    return 0;
}

int ddp__hier_error(int rc, const int *map, int n, const char *what)
{
    if (rc >= 0)
        return rc;
    const char *msg = ddp_last_error(), *s = msg;
    char out[1024];
    size_t o = 0;
    int translate = 1;
    while (*s && o + 1 < sizeof out) {
        if (translate && at_rank_word(msg, s)) {
            size_t w = put_ranks(&s, out + o, sizeof out - o, map, n);
            if (w == 0) /* no room left for the rank word: the message ends here */
                break;
            o += w;
            continue;
        }
        if (translate && strncmp(s, "gave up: ", 9) == 0) {
            /* The reason a peer gave: its transport's own words ("rank N:
             * ...", same numbering) or a group-level message (already in
             * group ranks: copied as is). */
            const char *q = s + 9;
            translate = 0;
            if (strncmp(q, "rank ", 5) == 0 && at_rank_word(msg, q)) {
                const char *d = q + 5;
                while (isdigit((unsigned char)*d))
                    d++;
                translate = d[0] == ':' && d[1] == ' ';
            }
            if (o + 9 >= sizeof out)
                break;
            memcpy(out + o, s, 9);
            o += 9;
            s += 9;
            continue;
        }
        out[o++] = *s++;
    }
    out[o] = '\0';
    ddp__error_restore(out);
    return ddp__error_context(rc, "%s", what);
}

int ddp__hier_local_error(ddp__hier *h, int rc)
{
    if (rc >= 0)
        return rc;
    return ddp__hier_error(rc, h->local_ranks, h->local.size, "inside host (shm)");
}

int ddp__hier_leaders_error(ddp__hier *h, int rc)
{
    if (rc >= 0)
        return rc;
    return ddp__hier_error(rc, h->leader_ranks, h->nhosts, "among host leaders (tcp)");
}

/* ------------------------------------------------------------------ */
/* The collectives                                                      */
/* ------------------------------------------------------------------ */

void ddp__hier_step(ddp__hier *h, const ddp__coll_ctx *flat, unsigned step)
{
    h->local.seq = h->leaders.seq = flat->seq << 2 | step;
    h->local.deadline = h->leaders.deadline = flat->deadline;
}

static int all_reduce(ddp__hier *h, const ddp__coll_ctx *flat, void *buf, size_t count,
                      ddp_dtype dt, ddp_reduce_op op)
{
    const ddp_reduce_op sum_op = op == DDP_AVG ? DDP_SUM : op;
    /* Phase 1: each host's vectors onto its leader. */
    ddp__hier_step(h, flat, 0);
    if (h->local.tp)
        DDP_TRY(ddp__hier_local_error(
            h, ddp__reduce_direct(&h->local, buf, buf, count, dt, sum_op, 0)));
    /* Phase 2: the host partials among the leaders. */
    ddp__hier_step(h, flat, 1);
    if (h->leaders.tp) {
        ddp__coll_args la = {.kind = DDP__ALL_REDUCE, .send = buf, .recv = buf, .count = count,
                             .dtype = dt, .op = sum_op};
        DDP_TRY(ddp__hier_leaders_error(h, ddp__coll_run(&h->leaders, &la)));
        if (op == DDP_AVG)
            ddp__reduce_divide(buf, count, dt, h->size);
    }
    /* Phase 3: the result from each leader to its host. */
    ddp__hier_step(h, flat, 2);
    if (h->local.tp)
        DDP_TRY(ddp__hier_local_error(h, ddp__broadcast_tree(&h->local, buf, count * ddp_dtype_size(dt), 0)));
    return 0;
}

static int broadcast(ddp__hier *h, const ddp__coll_ctx *flat, void *buf, size_t bytes, int root)
{
    const int root_host = h->host_of[root];
    /* Phase 1: the root's host, from the root (its leader included). */
    ddp__hier_step(h, flat, 0);
    if (h->local.tp && h->host == root_host)
        DDP_TRY(ddp__hier_local_error(h, ddp__broadcast_tree(&h->local, buf, bytes, h->local_index[root])));
    /* Phase 2: from the root host's leader to the other leaders. */
    ddp__hier_step(h, flat, 1);
    if (h->leaders.tp)
        DDP_TRY(ddp__hier_leaders_error(h, ddp__broadcast_tree(&h->leaders, buf, bytes, root_host)));
    /* Phase 3: every other host, from its leader. */
    ddp__hier_step(h, flat, 2);
    if (h->local.tp && h->host != root_host)
        DDP_TRY(ddp__hier_local_error(h, ddp__broadcast_tree(&h->local, buf, bytes, 0)));
    return 0;
}

/* reduce: phase 1 folds each host onto its leader, phase 2 the host
 * partials onto the root host's leader (reduce_direct.c both times, so the
 * order is the all-reduce's with direct leaders: hosts in host order), and
 * phase 3 hands the result to the root when it is not that leader.  Ranks
 * other than the root keep their buffers: a leader works on a copy. */
static int reduce(ddp__hier *h, ddp__coll_ctx *flat, void *buf, size_t count, ddp_dtype dt,
                  ddp_reduce_op op, int root)
{
    const ddp_reduce_op sum_op = op == DDP_AVG ? DDP_SUM : op;
    const size_t bytes = count * ddp_dtype_size(dt);
    const int root_host = h->host_of[root], leader = h->local.rank == 0;
    const int root_leads = h->local_index[root] == 0;
    uint8_t *acc = buf;
    if (leader && root != h->rank) { /* the flat context is idle: its scratch is free */
        DDP_TRY(ddp__coll_scratch(flat, bytes, (void **)&acc));
        memcpy(acc, buf, bytes);
    }
    ddp__hier_step(h, flat, 0);
    uint8_t *part = leader ? acc : buf; /* in place: a leader's copy, the others' input */
    if (h->local.tp)
        DDP_TRY(ddp__hier_local_error(
            h, ddp__reduce_direct(&h->local, part, part, count, dt, sum_op, 0)));
    ddp__hier_step(h, flat, 1);
    if (h->leaders.tp)
        DDP_TRY(ddp__hier_leaders_error(
            h, ddp__reduce_direct(&h->leaders, acc, acc, count, dt, sum_op, root_host)));
    if (leader && h->host == root_host && op == DDP_AVG)
        ddp__reduce_divide(acc, count, dt, h->size);
    ddp__hier_step(h, flat, 2);
    if (h->host == root_host && !root_leads && (leader || h->rank == root)) {
        ddp__req r;
        if (leader)
            DDP_TRY(ddp__hier_local_error(h, ddp__tp_isend(h->local.tp, &r, h->local_index[root],
                                                 ddp__tag(&h->local, 0, 0), acc, bytes)));
        else
            DDP_TRY(ddp__hier_local_error(h, ddp__tp_irecv(h->local.tp, &r, 0, ddp__tag(&h->local, 0, 0),
                                                 buf, bytes)));
        DDP_TRY(ddp__hier_local_error(h, ddp__coll_wait1(&h->local, &r)));
    }
    return 0;
}

/* Nobody leaves before everyone has arrived: a leader passes the leaders'
 * barrier only after its host's first barrier, and its host's ranks pass
 * the second one only after their leader has reached it. */
static int barrier(ddp__hier *h, const ddp__coll_ctx *flat)
{
    ddp__hier_step(h, flat, 0);
    if (h->local.tp)
        DDP_TRY(ddp__hier_local_error(h, ddp__barrier_dissemination(&h->local)));
    ddp__hier_step(h, flat, 1);
    if (h->leaders.tp)
        DDP_TRY(ddp__hier_leaders_error(h, ddp__barrier_dissemination(&h->leaders)));
    ddp__hier_step(h, flat, 2);
    if (h->local.tp)
        DDP_TRY(ddp__hier_local_error(h, ddp__barrier_dissemination(&h->local)));
    return 0;
}

int ddp__hier_run(ddp__hier *h, ddp__coll_ctx *flat, const ddp__coll_args *a)
{
    int rc;
    /* Tuning set on the group (ddp__pg_set_option) holds for both levels;
     * a forced all-reduce algorithm is the leaders' (those of the message
     * interface only: the leaders are on different hosts). */
    h->leaders.allreduce_algo =
        flat->allreduce_algo != DDP__AR_SHARED ? flat->allreduce_algo : DDP__AR_AUTO;
    h->local.chunk = h->leaders.chunk = flat->chunk;
    switch (a->kind) {
    case DDP__ALL_REDUCE:
        if (a->count == 0)
            return 0;
        rc = all_reduce(h, flat, a->recv, a->count, a->dtype, a->op);
        break;
    case DDP__BROADCAST:
        if (a->count == 0)
            return 0;
        rc = broadcast(h, flat, a->recv, a->count * ddp_dtype_size(a->dtype), a->root);
        break;
    case DDP__REDUCE:
        if (a->count == 0)
            return 0;
        /* Out of place: the root works on its output, a copy of its input;
         * the others' input is only read (reduce() writes no non-root's
         * buffer: a leader works on a copy), hence the cast. */
        if (a->send != a->recv && h->rank == a->root)
            memcpy(a->recv, a->send, a->count * ddp_dtype_size(a->dtype));
        rc = reduce(h, flat, h->rank == a->root ? a->recv : (void *)a->send, a->count, a->dtype,
                    a->op, a->root);
        break;
    case DDP__BARRIER:
        rc = barrier(h, flat);
        break;
    case DDP__ALL_GATHER:
        if (a->count == 0)
            return 0;
        rc = ddp__hier_all_gather(h, flat, a->send, a->recv, a->count * ddp_dtype_size(a->dtype));
        break;
    case DDP__GATHER:
        if (a->count == 0)
            return 0;
        rc = ddp__hier_gather(h, flat, a->send, a->recv, a->count * ddp_dtype_size(a->dtype),
                              a->root);
        break;
    case DDP__SCATTER:
        if (a->count == 0)
            return 0;
        rc = ddp__hier_scatter(h, flat, a->send, a->recv, a->count * ddp_dtype_size(a->dtype),
                               a->root);
        break;
    case DDP__ALL_TO_ALL:
        if (a->count == 0)
            return 0;
        rc = ddp__hier_all_to_all(h, flat, a->send, a->recv,
                                  a->count * ddp_dtype_size(a->dtype));
        break;
    case DDP__REDUCE_SCATTER:
        if (a->count == 0)
            return 0;
        rc = ddp__hier_reduce_scatter(h, flat, a->send, a->recv, a->count, a->dtype, a->op);
        break;
    default:
        return ddp__coll_run(flat, a);
    }
    if (rc == 0)
        h->runs[a->kind]++;
    return rc;
}
