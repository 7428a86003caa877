/* Pipelined double-binary-tree all-reduce (the idea of NCCL's "double
 * binary tree", Sanders, Speck & Träff 2009's two-tree broadcast/reduce):
 * the vector is cut in two halves, each half is reduced up one binary tree
 * towards its root and broadcast back down the same tree, both directions
 * pipelined over units of DDP_CHUNK_BYTES.  The two trees are laid out so
 * that a rank is an inner node (two children) in at most one of them, so
 * every rank sends and receives about 2B in all: the ring's bandwidth term,
 * with a latency of 2 depth steps instead of the ring's 2 (n-1), for any n
 * (no fold for n not a power of two, which recursive doubling and
 * Rabenseifner need).
 *
 * The tree over positions 0..n-1 (the in-order layout): position p > 0 with
 * lowest set bit b has children p - b/2 and p + h, h the largest power of
 * two below b with p + h < n (none when b = 1); position 0 is the root and
 * has one child, the largest power of two <= n-1.  A subtree covers an
 * interval of positions and its root is the one of them with the most
 * trailing zeros.  Tree 0 puts rank r at position r; tree 1 at n-1-r (n
 * even) or r-1 mod n (n odd): the odd positions are the leaves, so the
 * inner nodes of one tree are leaves of the other.
 *
 * Order (docs/algorithms.md): each node computes (left child's partial op
 * its own value) op right child's partial, so an element is reduced over
 * the positions in increasing order, grouped by the tree; the root divides
 * for AVG and every rank receives the root's bits.
 *
 * Cost: 2 (depth + K - 1) steps of a unit of B/(2K) bytes (K units per half):
 * about 2 depth alpha + 2 B beta + B/2 gamma per inner node, depth =
 * ceil(log2 n). */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "coll/coll.h"


/* ---- the tree over positions ------------------------------------------- */

static void pos_children(int n, int p, int *left, int *right)
{
    *left = *right = -1;
    if (p == 0) {
        int h = 1;
        while (h * 2 <= n - 1)
            h *= 2;
        if (n > 1)
            *right = h;
        return;
    }
    int b = p & -p;
    if (b == 1)
        return;
    *left = p - b / 2;
    int h = b / 2;
    while (h >= 1 && p + h >= n)
        h /= 2;
    if (h >= 1)
        *right = p + h;
}

static int pos_of(int n, int t, int r)
{
    return t == 0 ? r : n % 2 == 0 ? n - 1 - r : (r + n - 1) % n;
}

static int rank_of(int n, int t, int p)
{
    return p < 0 ? -1 : t == 0 ? p : n % 2 == 0 ? n - 1 - p : (p + 1) % n;
}

/* One rank's part in one tree. */
typedef struct tree {
    int parent, child[2]; /* ranks, -1 for none; child[0] precedes in the order */
    int lag;              /* units between an up step and the down step it waits for */
    int height;           /* of the tree (its depth D) */
    size_t slots;         /* staging slots per child: min(units, 2 height + 2) */
    size_t off, count, units; /* the half (elements) and its units */
    unsigned up_phase, down_phase;
    uint8_t *slot;        /* [2][slots] units of the children's partials */
    ddp__req *rslot;      /* [2][slots] their receives */
    ddp__req *up_send, *down_recv; /* [units] to and from the parent */
    ddp__req *down_send;  /* [units][2] to the children */
} tree;

/* Links of rank r in tree t, and its lag: the up step of unit s runs about
 * h_sub steps after unit s left the leaves (h_sub its subtree's height),
 * while unit s comes back down about height + depth steps after that; so a
 * rank waits for unit s - lag coming down at the up step of unit s. */
static int tree_links(tree *tr, int n, int t, int r)
{
    int *parent = malloc(sizeof *parent * (size_t)n), *depth = malloc(sizeof *depth * (size_t)n);
    int *below = malloc(sizeof *below * (size_t)n); /* deepest depth in each subtree */
    if (!parent || !depth || !below) {
        free(parent);
        free(depth);
        free(below);
        return DDP_ERROR(DDP_ERR_NOMEM, "out of memory");
    }
    for (int p = 0; p < n; p++)
        parent[p] = -1;
    for (int p = 0; p < n; p++) {
        int lc, rc;
        pos_children(n, p, &lc, &rc);
        if (lc >= 0)
            parent[lc] = p;
        if (rc >= 0)
            parent[rc] = p;
    }
    int height = 0;
    for (int p = 0; p < n; p++) {
        depth[p] = 0;
        for (int q = parent[p]; q >= 0; q = parent[q])
            depth[p]++;
        below[p] = depth[p];
        height = depth[p] > height ? depth[p] : height;
    }
    for (int p = 0; p < n; p++)
        for (int q = parent[p]; q >= 0; q = parent[q])
            below[q] = depth[p] > below[q] ? depth[p] : below[q];
    int me = pos_of(n, t, r), lc, rc;
    pos_children(n, me, &lc, &rc);
    tr->parent = rank_of(n, t, parent[me]);
    tr->child[0] = rank_of(n, t, lc);
    tr->child[1] = rank_of(n, t, rc);
    tr->lag = height + depth[me] - (below[me] - depth[me]);
    tr->height = height;
    free(parent);
    free(depth);
    free(below);
    return 0;
}

/* ---- one unit's steps ---------------------------------------------------- */

typedef struct run {
    ddp__coll_ctx *c;
    uint8_t *buf;
    size_t es, S, unit_bytes; /* S: elements per unit; unit_bytes: a slot's size */
    ddp_dtype dt;
    ddp_reduce_op op;
    ddp__reduce_fn fn;
} run;

static size_t unit_len(const run *u, const tree *tr, size_t k)
{
    size_t at = k * u->S;
    return tr->count - at < u->S ? tr->count - at : u->S;
}

static uint8_t *unit_at(const run *u, const tree *tr, size_t k)
{
    return u->buf + (tr->off + k * u->S) * u->es;
}

static uint8_t *slot_at(const run *u, const tree *tr, int ch, size_t k)
{
    return tr->slot + ((size_t)ch * tr->slots + k % tr->slots) * u->unit_bytes;
}

static ddp__req *rslot_at(const tree *tr, int ch, size_t k)
{
    return &tr->rslot[(size_t)ch * tr->slots + k % tr->slots];
}

/* Posts the receive of child ch's partial of unit k into its slot. */
static int post_child(const run *u, tree *tr, int ch, size_t k)
{
    return ddp__tp_irecv(u->c->tp, rslot_at(tr, ch, k), tr->child[ch],
                         ddp__tag(u->c, tr->up_phase, k), slot_at(u, tr, ch, k),
                         unit_len(u, tr, k) * u->es);
}

/* Sends the final unit k to the children. */
static int send_down(const run *u, tree *tr, size_t k)
{
    for (int ch = 0; ch < 2; ch++)
        if (tr->child[ch] >= 0)
            DDP_TRY(ddp__tp_isend(u->c->tp, &tr->down_send[2 * k + (size_t)ch], tr->child[ch],
                                  ddp__tag(u->c, tr->down_phase, k), unit_at(u, tr, k),
                                  unit_len(u, tr, k) * u->es));
    return 0;
}

/* Up step of unit k: fold the children's partials into it (in place),
 * then send it to the parent and expect the result back into the same
 * place, or, at the root, send the result down. */
static int up(const run *u, tree *tr, size_t k)
{
    uint8_t *mine = unit_at(u, tr, k);
    size_t len = unit_len(u, tr, k);
    for (int ch = 0; ch < 2; ch++) {
        if (tr->child[ch] < 0)
            continue;
        DDP_TRY(ddp__coll_wait1(u->c, rslot_at(tr, ch, k)));
        if (ch == 0) /* the left subtree comes first in the order */
            u->fn(mine, slot_at(u, tr, ch, k), mine, len);
        else
            u->fn(mine, mine, slot_at(u, tr, ch, k), len);
        if (k + tr->slots < tr->units)
            DDP_TRY(post_child(u, tr, ch, k + tr->slots));
    }
    if (tr->parent < 0) {
        if (u->op == DDP_AVG)
            ddp__reduce_divide(mine, len, u->dt, u->c->size);
        return send_down(u, tr, k);
    }
    /* The result can only arrive once the parent has all of this partial,
     * so receiving it into the place being sent is safe. */
    DDP_TRY(ddp__tp_isend(u->c->tp, &tr->up_send[k], tr->parent, ddp__tag(u->c, tr->up_phase, k),
                          mine, len * u->es));
    return ddp__tp_irecv(u->c->tp, &tr->down_recv[k], tr->parent,
                         ddp__tag(u->c, tr->down_phase, k), mine, len * u->es);
}

/* Down step of unit k: the result arrived; pass it on. */
static int down(const run *u, tree *tr, size_t k)
{
    DDP_TRY(ddp__coll_wait1(u->c, &tr->down_recv[k]));
    return send_down(u, tr, k);
}

/* ---- the all-reduce ------------------------------------------------------ */

static int tree_alloc(tree *tr)
{
    tr->rslot = calloc(2 * tr->slots + 1, sizeof *tr->rslot);
    tr->up_send = calloc(tr->units + 1, sizeof *tr->up_send);
    tr->down_recv = calloc(tr->units + 1, sizeof *tr->down_recv);
    tr->down_send = calloc(2 * tr->units + 1, sizeof *tr->down_send);
    DDP_FAIL_IF(!tr->rslot || !tr->up_send || !tr->down_recv || !tr->down_send, DDP_ERR_NOMEM,
                "out of memory for %zu units", tr->units);
    return 0;
}

static void tree_free(tree *tr)
{
    free(tr->rslot);
    free(tr->up_send);
    free(tr->down_recv);
    free(tr->down_send);
}

/* Both trees' steps, interleaved unit by unit, leaves too: a rank's up
 * step of unit s comes after its wait for unit s - lag coming down, which
 * needs its parent's up step of that unit, after which the parent has
 * posted the receives of units up to s - lag + slots; lag <= 2 height, so
 * with 2 height + 2 slots no unit arrives before its receive is posted
 * (the transport would then copy it out whenever a receive posted later
 * on the same link, of the other tree, needs the bytes behind it). */
static int pipeline(const run *u, tree *trees)
{
    size_t steps = 0;
    for (int t = 0; t < 2; t++) {
        tree *tr = &trees[t];
        for (int ch = 0; ch < 2; ch++)
            for (size_t k = 0; tr->child[ch] >= 0 && k < tr->slots; k++)
                DDP_TRY(post_child(u, tr, ch, k));
        size_t last = tr->units + (tr->parent >= 0 ? (size_t)tr->lag : 0);
        steps = tr->units && last > steps ? last : steps;
    }
    for (size_t s = 0; s < steps; s++)
        for (int t = 0; t < 2; t++) {
            tree *tr = &trees[t];
            if (s < tr->units)
                DDP_TRY(up(u, tr, s));
            size_t lag = (size_t)tr->lag;
            if (tr->parent >= 0 && s >= lag && s - lag < tr->units)
                DDP_TRY(down(u, tr, s - lag));
        }
    for (int t = 0; t < 2; t++) {
        DDP_TRY(ddp__coll_wait_array(u->c, trees[t].up_send, trees[t].units));
        DDP_TRY(ddp__coll_wait_array(u->c, trees[t].down_send, 2 * trees[t].units));
    }
    return 0;
}

int ddp__allreduce_tree(ddp__coll_ctx *c, void *buf, size_t count, ddp_dtype dt,
                        ddp_reduce_op op)
{
    const int n = c->size;
    run u = {.c = c, .buf = buf, .es = ddp_dtype_size(dt), .dt = dt, .op = op,
             .fn = ddp__reduce_kernel(dt, op)};
    u.S = c->chunk / u.es ? c->chunk / u.es : 1;
    tree trees[2] = {{0}, {0}};
    int rc = 0;
    size_t half = count - count / 2; /* tree 0 takes the first, longer half */
    size_t widest = half < u.S ? half : u.S;
    u.unit_bytes = (widest * u.es + 63) & ~(size_t)63;
    uint8_t *scratch;
    for (int t = 0; t < 2; t++) {
        tree *tr = &trees[t];
        tr->off = t == 0 ? 0 : half;
        tr->count = t == 0 ? half : count / 2;
        tr->units = (tr->count + u.S - 1) / u.S;
        tr->up_phase = 1 + 2 * (unsigned)t;
        tr->down_phase = 2 + 2 * (unsigned)t;
        DDP_FAIL_OUT(tr->units > 0xffffff, DDP_ERR_INVALID_ARG,
                     "tree all-reduce: %zu elements is too many for %zu-byte chunks", count,
                     c->chunk);
        DDP_TRY_OUT(tree_links(tr, n, t, c->rank));
        tr->slots = 2 * (size_t)tr->height + 2;
        tr->slots = tr->slots < tr->units ? tr->slots : tr->units;
        DDP_TRY_OUT(tree_alloc(tr));
    }
    /* Both trees have the same height, and tree 0 at least as many units. */
    DDP_TRY_OUT(ddp__coll_scratch(c, 2 * 2 * trees[0].slots * u.unit_bytes, (void **)&scratch));
    trees[0].slot = scratch;
    trees[1].slot = scratch + 2 * trees[0].slots * u.unit_bytes;
    rc = pipeline(&u, trees);
out:
    tree_free(&trees[0]);
    tree_free(&trees[1]);
    return rc;
}
