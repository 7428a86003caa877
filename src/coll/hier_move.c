/* Hierarchical all_gather, gather, scatter, all_to_all and reduce_scatter
 * (hier.h): as hier.c's all_reduce, what crosses the network is one message
 * per pair of hosts, not one per pair of ranks.  Each host's leader stages
 * its host's blocks in HOST ORDER (ranks sorted by host, then by their
 * index on the host: position host_start[h] + local_index[r]), the leaders
 * exchange whole host segments, and the leader hands its ranks their part.
 *
 * Data movement (all_gather, gather, scatter, all_to_all) is exact whatever
 * the route.  reduce_scatter folds in the hierarchical order of
 * docs/hierarchical.md: each host's vectors in rank order onto its leader
 * (reduce_direct.c), then the leaders' ring reduce-scatter over host
 * segments (the segment of host h reduced in ring order h+1, ..., h).
 * A leader's staging lives in the flat context's scratch (the flat
 * transport is idle while the two levels run). */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "coll/hier.h"

static size_t pos_of(const ddp__hier *h, int r)
{
    return (size_t)(h->host_start[h->host_of[r]] + h->local_index[r]);
}

static int host_size(const ddp__hier *h, int host)
{
    return h->host_start[host + 1] - h->host_start[host];
}

/* Host segments of a host-ordered vector of unit-byte blocks per rank. */
static int host_blocks(const ddp__hier *h, size_t unit, ddp__blocks *bl)
{
    bl->off = malloc(sizeof *bl->off * (size_t)h->nhosts);
    bl->len = malloc(sizeof *bl->len * (size_t)h->nhosts);
    if (!bl->off || !bl->len) {
        ddp__blocks_free(bl);
        return DDP_ERROR(DDP_ERR_NOMEM, "out of memory");
    }
    for (int g = 0; g < h->nhosts; g++) {
        bl->off[g] = (size_t)h->host_start[g] * unit;
        bl->len[g] = (size_t)host_size(h, g) * unit;
    }
    return 0;
}

/* Moves n unit-sized blocks between rank order and host order. */
static void to_rank_order(const ddp__hier *h, uint8_t *dst, const uint8_t *host_ord, size_t unit)
{
    for (int r = 0; r < h->size; r++)
        memcpy(dst + (size_t)r * unit, host_ord + pos_of(h, r) * unit, unit);
}

static void to_host_order(const ddp__hier *h, uint8_t *dst, const uint8_t *rank_ord, size_t unit)
{
    for (int r = 0; r < h->size; r++)
        memcpy(dst + pos_of(h, r) * unit, rank_ord + (size_t)r * unit, unit);
}

/* Every rank's B bytes onto its leader, at host-order position (S: the
 * leader's host-ordered staging; NULL elsewhere). */
static int gather_host(ddp__hier *h, const void *send, uint8_t *S, size_t B)
{
    uint8_t *seg = S ? S + (size_t)h->host_start[h->host] * B : NULL;
    if (!h->local.tp) {
        memmove(seg, send, B);
        return 0;
    }
    return ddp__hier_local_error(h, ddp__gather_direct(&h->local, send, seg, B, 0));
}

/* Among leaders: host segments of S (unit bytes per rank) sent to or
 * received from one leader (to_root: every other leader sends its own
 * segment to root_host; else root_host sends each leader its segment). */
static int leaders_root(ddp__hier *h, uint8_t *S, size_t unit, int root_host, int to_root)
{
    const int H = h->nhosts, me = h->host;
    ddp__req *reqs = calloc((size_t)H, sizeof *reqs);
    DDP_FAIL_IF(!reqs, DDP_ERR_NOMEM, "out of memory");
    int rc = 0;
    for (int g = 0; g < H; g++) {
        int peer = me == root_host ? g : root_host;
        if (g == root_host || (me != root_host && g != me))
            continue;
        uint8_t *seg = S + (size_t)h->host_start[g] * unit;
        size_t len = (size_t)host_size(h, g) * unit;
        if ((me == root_host) == to_root)
            rc = ddp__tp_irecv(h->leaders.tp, &reqs[g], peer, ddp__tag(&h->leaders, 0, 0), seg, len);
        else
            rc = ddp__tp_isend(h->leaders.tp, &reqs[g], peer, ddp__tag(&h->leaders, 0, 0), seg, len);
        if (rc < 0)
            break;
    }
    if (rc == 0)
        rc = ddp__coll_wait_array(&h->leaders, reqs, (size_t)H);
    free(reqs);
    return ddp__hier_leaders_error(h, rc);
}

/* One message between the root and its leader inside the root's host. */
static int root_leader_xfer(ddp__hier *h, int root, void *buf, size_t bytes, int leader_sends)
{
    ddp__req r;
    int leader = h->local.rank == 0, peer = leader ? h->local_index[root] : 0;
    uint64_t tag = ddp__tag(&h->local, 0, 0);
    int rc = leader == leader_sends ? ddp__tp_isend(h->local.tp, &r, peer, tag, buf, bytes)
                                    : ddp__tp_irecv(h->local.tp, &r, peer, tag, buf, bytes);
    if (rc == 0)
        rc = ddp__coll_wait1(&h->local, &r);
    return ddp__hier_local_error(h, rc);
}

int ddp__hier_all_gather(ddp__hier *h, ddp__coll_ctx *flat, const void *send, void *recv,
                         size_t B)
{
    const int leader = h->local.rank == 0;
    uint8_t *S = NULL;
    if (leader)
        DDP_TRY(ddp__coll_scratch(flat, (size_t)h->size * B, (void **)&S));
    ddp__hier_step(h, flat, 0);
    DDP_TRY(gather_host(h, send, S, B));
    ddp__hier_step(h, flat, 1);
    if (h->leaders.tp) {
        ddp__blocks bl = {0};
        DDP_TRY(host_blocks(h, B, &bl));
        int rc = ddp__ring_all_gather(&h->leaders, S, &bl, 1, 0, NULL, NULL);
        ddp__blocks_free(&bl);
        DDP_TRY(ddp__hier_leaders_error(h, rc));
        to_rank_order(h, recv, S, B);
    }
    ddp__hier_step(h, flat, 2);
    if (h->local.tp)
        DDP_TRY(ddp__hier_local_error(
            h, ddp__broadcast_tree(&h->local, recv, (size_t)h->size * B, 0)));
    return 0;
}

int ddp__hier_gather(ddp__hier *h, ddp__coll_ctx *flat, const void *send, void *recv, size_t B,
                     int root)
{
    const int leader = h->local.rank == 0, root_host = h->host_of[root];
    const int at_root_host = h->host == root_host, root_leads = h->local_index[root] == 0;
    const size_t all = (size_t)h->size * B;
    uint8_t *S = NULL;
    if (leader)
        DDP_TRY(ddp__coll_scratch(flat, 2 * all, (void **)&S));
    ddp__hier_step(h, flat, 0);
    DDP_TRY(gather_host(h, send, S, B));
    ddp__hier_step(h, flat, 1);
    if (h->leaders.tp)
        DDP_TRY(leaders_root(h, S, B, root_host, 1));
    ddp__hier_step(h, flat, 2);
    if (!at_root_host)
        return 0;
    if (leader)
        to_rank_order(h, root_leads ? recv : S + all, S, B);
    if (!root_leads && (leader || h->rank == root))
        DDP_TRY(root_leader_xfer(h, root, leader ? S + all : recv, all, 1));
    return 0;
}

int ddp__hier_scatter(ddp__hier *h, ddp__coll_ctx *flat, const void *send, void *recv, size_t B,
                      int root)
{
    const int leader = h->local.rank == 0, root_host = h->host_of[root];
    const int at_root_host = h->host == root_host, root_leads = h->local_index[root] == 0;
    const size_t all = (size_t)h->size * B;
    uint8_t *S = NULL;
    if (leader)
        DDP_TRY(ddp__coll_scratch(flat, 2 * all, (void **)&S));
    ddp__hier_step(h, flat, 0);
    if (at_root_host && !root_leads && (leader || h->rank == root))
        DDP_TRY(root_leader_xfer(h, root, leader ? S + all : (void *)send, all, 0));
    if (at_root_host && leader)
        to_host_order(h, S, root_leads ? send : S + all, B);
    ddp__hier_step(h, flat, 1);
    if (h->leaders.tp)
        DDP_TRY(leaders_root(h, S, B, root_host, 0));
    ddp__hier_step(h, flat, 2);
    uint8_t *seg = S ? S + (size_t)h->host_start[h->host] * B : NULL;
    if (!h->local.tp) {
        memcpy(recv, seg, B);
        return 0;
    }
    return ddp__hier_local_error(h, ddp__scatter_direct(&h->local, seg, recv, B, 0));
}

/* all_to_all: each leader gathers its ranks' whole send vectors (G: local
 * index x rank), packs one message per destination host (O: for host h',
 * [source local index][destination index on h']), the leaders exchange
 * them (I: from host h'', [source index on h''][destination local index]),
 * and the leader scatters each of its ranks its n blocks (R, over G). */
static void pack_out(const ddp__hier *h, const uint8_t *G, uint8_t *O, size_t B)
{
    const int l = host_size(h, h->host), n = h->size;
    for (int d = 0; d < n; d++) { /* destination rank d */
        int dh = h->host_of[d], dl = h->local_index[d], dsz = host_size(h, dh);
        for (int i = 0; i < l; i++)
            memcpy(O + ((size_t)l * (size_t)h->host_start[dh] + (size_t)i * (size_t)dsz +
                        (size_t)dl) * B,
                   G + ((size_t)i * (size_t)n + (size_t)d) * B, B);
    }
}

static void unpack_in(const ddp__hier *h, const uint8_t *I, uint8_t *R, size_t B)
{
    const int l = host_size(h, h->host), n = h->size;
    for (int s = 0; s < n; s++) { /* source rank s */
        int sh = h->host_of[s], sl = h->local_index[s];
        for (int i = 0; i < l; i++)
            memcpy(R + ((size_t)i * (size_t)n + (size_t)s) * B,
                   I + ((size_t)l * (size_t)h->host_start[sh] + (size_t)sl * (size_t)l +
                        (size_t)i) * B,
                   B);
    }
}

static int leaders_exchange(ddp__hier *h, const uint8_t *O, uint8_t *I, size_t B)
{
    const int H = h->nhosts, me = h->host, l = host_size(h, me);
    ddp__req *reqs = calloc(2 * (size_t)H, sizeof *reqs);
    DDP_FAIL_IF(!reqs, DDP_ERR_NOMEM, "out of memory");
    int rc = 0;
    for (int g = 0; g < H && rc == 0; g++) {
        size_t at = (size_t)l * (size_t)h->host_start[g] * B;
        size_t len = (size_t)l * (size_t)host_size(h, g) * B;
        if (g == me) {
            memcpy(I + at, O + at, len);
            continue;
        }
        uint64_t tag = ddp__tag(&h->leaders, 0, 0);
        rc = ddp__tp_irecv(h->leaders.tp, &reqs[2 * g], g, tag, I + at, len);
        if (rc == 0)
            rc = ddp__tp_isend(h->leaders.tp, &reqs[2 * g + 1], g, tag, O + at, len);
    }
    if (rc == 0)
        rc = ddp__coll_wait_array(&h->leaders, reqs, 2 * (size_t)H);
    free(reqs);
    return ddp__hier_leaders_error(h, rc);
}

int ddp__hier_all_to_all(ddp__hier *h, ddp__coll_ctx *flat, const void *send, void *recv,
                         size_t B)
{
    const int leader = h->local.rank == 0;
    const size_t row = (size_t)h->size * B, part = (size_t)host_size(h, h->host) * row;
    uint8_t *G = NULL;
    if (leader)
        DDP_TRY(ddp__coll_scratch(flat, 3 * part, (void **)&G));
    ddp__hier_step(h, flat, 0);
    if (h->local.tp)
        DDP_TRY(ddp__hier_local_error(h, ddp__gather_direct(&h->local, send, G, row, 0)));
    else
        memcpy(G, send, row);
    ddp__hier_step(h, flat, 1);
    if (h->leaders.tp) {
        uint8_t *O = G + part, *I = G + 2 * part;
        pack_out(h, G, O, B);
        DDP_TRY(leaders_exchange(h, O, I, B));
        unpack_in(h, I, G, B);
    }
    ddp__hier_step(h, flat, 2);
    if (!h->local.tp) {
        memcpy(recv, G, row);
        return 0;
    }
    return ddp__hier_local_error(h, ddp__scatter_direct(&h->local, G, recv, row, 0));
}

/* reduce_scatter of count elements per rank: reduce onto the leader,
 * ring reduce-scatter of host segments among leaders, scatter inside. */
int ddp__hier_reduce_scatter(ddp__hier *h, ddp__coll_ctx *flat, const void *send, void *recv,
                             size_t count, ddp_dtype dt, ddp_reduce_op op)
{
    const int leader = h->local.rank == 0;
    const ddp_reduce_op sum_op = op == DDP_AVG ? DDP_SUM : op;
    const size_t es = ddp_dtype_size(dt), unit = count * es, all = (size_t)h->size * unit;
    const size_t mine = (size_t)host_size(h, h->host) * unit;
    uint8_t *A = NULL;
    if (leader) { /* A: the host's sum in rank order, P: host order, Q: its segment */
        DDP_TRY(ddp__coll_scratch(flat, 2 * all + mine, (void **)&A));
        memcpy(A, send, all);
    }
    ddp__hier_step(h, flat, 0);
    /* The leader (the root) reduces its copy in place; the others send theirs. */
    if (h->local.tp)
        DDP_TRY(ddp__hier_local_error(h, ddp__reduce_direct(&h->local, leader ? A : send, A,
                                                            (size_t)h->size * count, dt,
                                                            sum_op, 0)));
    ddp__hier_step(h, flat, 1);
    if (h->leaders.tp) {
        uint8_t *P = A + all, *Q = P + all;
        to_host_order(h, P, A, unit);
        ddp__blocks bl = {0};
        DDP_TRY(host_blocks(h, count, &bl));
        int rc = ddp__ring_reduce_scatter(&h->leaders, P, NULL, Q, &bl, dt, sum_op, 0, NULL);
        ddp__blocks_free(&bl);
        DDP_TRY(ddp__hier_leaders_error(h, rc));
        if (op == DDP_AVG)
            ddp__reduce_divide(Q, (size_t)host_size(h, h->host) * count, dt, h->size);
        A = Q;
    }
    ddp__hier_step(h, flat, 2);
    if (!h->local.tp) {
        memcpy(recv, A, unit);
        return 0;
    }
    return ddp__hier_local_error(h, ddp__scatter_direct(&h->local, A, recv, unit, 0));
}
