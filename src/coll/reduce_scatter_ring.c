/* Ring reduce-scatter, chunked and pipelined (Patarasuk & Yuan 2009; the
 * first half of gloo's allreduce_ring_chunked and NCCL's ring), receiving
 * through a small window of cache-resident staging slots.
 *
 * n ranks in a ring (send to r+1, receive from r-1), n-1 steps.  At step s
 * rank r sends block (r-s-1) and receives block (r-s-2), which it reduces
 * with its own contribution and forwards at step s+1.  After the last step
 * rank r holds block r reduced over all ranks, in the order r+1, r+2, ...,
 * r (mod n): partial (a) op local (b) at every hop.
 *
 * Each block is cut into K units of at most ctx->chunk bytes; unit (s, k)
 * has the index u = s*K + k (its tag).  Units are processed in groups of
 * G units, step-major inside a group: (0,g0), ..., (0,g0+G-1), (1,g0), ...
 * (the "events" e = 0, 1, ..., numbered alike on every rank); so (s+1, k)
 * is processed exactly one group size (<= G) of events after (s, k).  Unit
 * (s+1, k) leaves as soon as (s, k) is reduced, and step 0's sends run L
 * units ahead of the reductions.  2 ranks (one step): L = G = 1, so each
 * byte is reduced and forwarded within a unit or two of its arrival.  More
 * ranks: G = L (step-major, a group's step-0 sends all at once), so that a
 * unit arrives long before it is needed; unit by unit ("k-major", G = 1),
 * each unit waits on a chain of n-2 hops, which made 3 ranks sharing 2
 * cores 1.5-2x slower.  The all-reduce takes the whole block as one group,
 * G = K; a standalone reduce-scatter groups of W = ring_window / unit
 * bytes (at least 1), G = min(K, W), which bound its memory (below).
 *
 * Memory traffic (2 ranks).  A received unit lands in one of 4 staging
 * slots (chunk bytes each: the window fits in L2), is reduced from there
 * into its place while still in cache, and the slot takes the next unit.
 * The old engine received every unit into a block-sized scratch region
 * (32 MiB for a 64 MiB all-reduce), so each received byte went to DRAM and
 * came back for the reduction; and with every step-0 send queued at once, a
 * reduced unit waited behind the whole block before the all-gather sent
 * it, by then out of cache too.  With more ranks the slots form a group.
 *
 * Scratch (the group's, kept for its lifetime: ddp__coll_scratch).  With
 * es bytes per element, S = max(1, chunk / es) elements per unit, count
 * elements in the largest block, K = ceil(count / S) units per step and
 * u = es * min(S, count) bytes per slot:
 *   2 ranks:                  4u (slots; one step leaves no partials);
 *   all-reduce, n > 2:        (K + 1) u: a block and a unit (partials in
 *                             place, in the caller's buffer);
 *   reduce-scatter, n > 2:    (G + 1) u of slots + P u of partial places,
 *                             P = min(G + 1, (n - 2) K), G = min(K, W):
 *                             at most 2 (W + 1) u <= 2 ring_window + 2u,
 *                             and at most 2 (K + 1) u, about two blocks.
 * With the defaults (256 KiB units, 4 MiB window) a standalone
 * reduce-scatter holds at most 8.5 MiB, whatever n and count: a 64-rank
 * group reducing 1 GiB held ~1 GiB before ((K + 1) u of slots and a block
 * per step but the last for the partials, (n - 1) blocks in all).
 *
 * The sequence on a link.  A rank sends, in this order: step 0's units
 * 0..L-1; then, after processing each unit (s, k) in the order above, unit
 * (s+1, k) (or, at the last step, the all-gather's unit k through
 * hook->final), then step 0's unit k+L if s == 0.  Empty units (a short
 * block) are skipped but their events still count.  Every rank runs the
 * same schedule (L and G depend only on n, K, the window and whether acc is
 * given, alike on every rank), so the receiver computes its predecessor's
 * sequence (next_frame) and posts its receives in exactly that order, as
 * slots free.
 *
 * Why the receive window suffices.  TCP (and shm) hold a large frame whose
 * receive is not posted while no other receive is posted on that link:
 * they stop reading the link until it is, and flow control stalls the
 * sender; nothing is copied twice.  Receives here are posted in sending
 * order, so a frame that finds no receive comes after every posted one:
 * the link simply waits.  It never waits on a unit this rank needs next,
 * because that unit is always posted: the frames that precede (s, k) in
 * the sequence but are processed after it are (a) step-0 units sent ahead
 * (the first L, or the lead), those with k < k' <= k + L or beyond the
 * current group: at most L, and (b) for s = 0, step-1 units (1, k') of the
 * same group with k' <= k - L: at most G - L (a step-(s'+1) unit is sent
 * after (s', k'), and in this order that precedes (s, k) only if (s'+1,
 * k') does too, except across the step 0 / step 1 boundary of a group).
 * Frames that precede it and are processed before it have left their
 * slots by then (a slot is freed right after its reduction).  So max(L, G)
 * + 1 slots always leave (s, k) one: 2 ranks use 4, more ranks G + 1.
 *
 * Partials of a standalone reduce-scatter (acc == NULL).  The partial of
 * (s, k), s < n-2, must stay until its send, frame (s+1, k), has left.  It
 * goes to the next of P unit-sized places, taken in turn by the events of
 * steps 0..n-3; before reducing into a place the rank waits for the send
 * that read it last.  That send carried frame (s0+1, k0) of an event e0 at
 * least P events back; the successor processes that frame one group size
 * after e0, at event e0 + G or earlier, and e0 + G < e0 + P <= e (for
 * P = G + 1; a smaller P is the number of partials in the whole call, and
 * no place is reused).  So a
 * rank at event e only ever waits for its successor to have *received* a
 * frame that the successor processes before event e.
 *
 * Why it cannot deadlock, on either transport.  Suppose the ranks of a
 * call are stuck, each blocked in a wait, inside the loop at some event or
 * after it, waiting for its last sends.  If some are inside the loop, take
 * the one, r, at the smallest event e = (s, k): every rank has finished
 * every event before e (the others in the loop by minimality, the rest
 * have left it).  Rank r waits for one of two things:
 *  - the receive of (s, k).  It is posted (the window above).  r-1 has sent
 *    the frame: after processing (s-1, k) (event e minus a group size), or
 *    as step 0's lead after (0, k-L), or at the start.  Every frame before
 *    it on the link is posted too or already received, so neither transport
 *    holds the link before it: tcp reads on, shm drains its ring or pulls
 *    the message (cross-memory attach) into the posted buffer.
 *  - the send that read its next partial place.  r+1 has processed, hence
 *    received, that frame (previous paragraph).  On tcp its bytes were all
 *    written before they could be read; on shm they were copied into the
 *    ring before they could be read, or pulled, which is what completes a
 *    cross-memory send; and a link's sends complete in order.  The send is
 *    complete, or completes at r's next progress (it is in a wait).
 * Neither can stay pending, so r is not stuck.  If all have left the loop,
 * each waits for sends that its successor, having left the loop too, has
 * received: complete, as above.  The argument needs no buffering: it holds
 * when every send completes only once its receiver has taken the whole
 * frame (shm's cross-memory attach, a socket buffer or an shm ring smaller
 * than a unit, frames over either transport's 64 KiB eager limit held
 * until posted), and the more so when the transports buffer.  A rank that
 * starts late only delays its neighbours (r+1 waits for its frames, r-1
 * for its sends once r-1's P places are used); once it calls, the argument
 * applies; a rank later than the deadline makes the others time out, as
 * any collective does.  The all-reduce (acc given) reduces in place and
 * never waits on a send inside the loop.
 *
 * Cost: (n-1) * (alpha + B/n * beta + B/n * gamma) for B bytes; each rank
 * sends and receives (n-1)/n * B. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "coll/coll.h"

/* 2 ranks: step-0 units sent ahead of the reductions, and staging slots
 * (at least lead + group + 1; see above).  Lead 1 rather than 2: with less
 * in flight the socket buffers' pages stay in cache too (64 MiB on 2 ranks,
 * loaded machine: both ranks' CPU time 43-56 ms per all-reduce against
 * 74-76 ms with 2; bench/RESULTS.md).  The lead and the group are part of
 * the sequence on the wire: every rank derives them from (n, K) alike. */
#define RING2_LEAD 1
#define RING2_SLOTS 4

typedef struct ring {
    ddp__coll_ctx *c;
    const ddp__blocks *bl;
    const ddp__ring_hook *hook;
    size_t S, K, steps, U, es;
    unsigned phase;
    ddp__req *rreq;
    size_t lead, group; /* the schedule (see the top of the file) */
    uint8_t *stage;     /* nslots slots of slot_bytes */
    size_t slot_bytes, nslots;
    size_t *free_slot, nfree;
    /* acc == NULL: partials wait for their sends in nparts unit-sized
     * places, taken in turn; part_send[j] reads place j (or NULL). */
    uint8_t *part;
    size_t nparts, nextpart;
    ddp__req **part_send;
    /* The receive cursor in the predecessor's sending sequence. */
    size_t init;     /* step-0 units of the initial lead emitted */
    size_t event;    /* next processing event (k-major) to expand */
    int sub;         /* 0: its forward or final frame, 1: its lead frame */
    int pending;     /* a frame taken from the sequence, not yet posted */
    size_t pend_u;   /* its unit, or k for an all-gather frame */
    int pend_ag;
} ring;

static size_t ring_block(const ring *g, long off)
{
    long n = g->c->size;
    return (size_t)(((long)g->c->rank + off % n + 2 * n) % n);
}

/* Block received at step s and sent at step s. */
static size_t rb(const ring *g, size_t s) { return ring_block(g, -(long)s - 2); }
static size_t sb(const ring *g, size_t s) { return ring_block(g, -(long)s - 1); }
static size_t ulen(const ring *g, size_t b, size_t k) { return ddp__unit_len(g->bl, b, k, g->S); }

/* Processing event e: unit (s, k).  Groups of `group` units, step-major
 * inside a group: (0,g0), (0,g0+1), ..., (1,g0), ...; the last group may be
 * shorter. */
static void event_unit(const ring *g, size_t e, size_t *s, size_t *k)
{
    size_t per = g->group * g->steps, gi = e / per, r = e % per;
    size_t first = gi * g->group, size = g->K - first < g->group ? g->K - first : g->group;
    *s = r / size;
    *k = first + r % size;
}

/* The predecessor's next frame: 1 and (*u, *ag), or 0 at the end.  Its
 * frames, seen from here: (s, k) carries our block rb(s); its final units
 * are its own block, r-1. */
static int next_frame(ring *g, size_t *u, int *ag)
{
    const size_t lead = g->K < g->lead ? g->K : g->lead;
    while (g->init < lead) {
        size_t k = g->init++;
        if (ulen(g, rb(g, 0), k)) {
            *u = k;
            *ag = 0;
            return 1;
        }
    }
    while (g->event < g->U) {
        size_t k, s;
        event_unit(g, g->event, &s, &k);
        int sub = g->sub;
        if (sub == 0) {
            g->sub = 1;
            if (s + 1 < g->steps && ulen(g, rb(g, s + 1), k)) {
                *u = (s + 1) * g->K + k;
                *ag = 0;
                return 1;
            }
            if (s + 1 == g->steps && g->hook && g->hook->final &&
                ulen(g, ring_block(g, -1), k)) {
                *u = k;
                *ag = 1;
                return 1;
            }
            continue;
        }
        g->sub = 0;
        g->event++;
        if (s == 0 && k + g->lead < g->K && ulen(g, rb(g, 0), k + g->lead)) {
            *u = k + g->lead;
            *ag = 0;
            return 1;
        }
    }
    return 0;
}

/* Posts the predecessor's frames in its order while slots last. */
static int post_receives(ring *g)
{
    for (;;) {
        if (!g->pending) {
            if (!next_frame(g, &g->pend_u, &g->pend_ag))
                return 0;
            g->pending = 1;
        }
        if (g->pend_ag) {
            DDP_TRY(g->hook->expect(g->hook->arg, g->pend_u));
        } else {
            if (g->nfree == 0)
                return 0;
            size_t u = g->pend_u, len = ulen(g, rb(g, u / g->K), u % g->K);
            uint8_t *slot = g->stage + g->free_slot[--g->nfree] * g->slot_bytes;
            int prev = (g->c->rank + g->c->size - 1) % g->c->size;
            DDP_TRY(ddp__tp_irecv(g->c->tp, &g->rreq[u], prev, ddp__tag(g->c, g->phase, u), slot,
                                  len * g->es));
        }
        g->pending = 0;
    }
}

int ddp__ring_reduce_scatter(ddp__coll_ctx *c, const void *in, void *acc, void *out,
                             const ddp__blocks *bl, ddp_dtype dt, ddp_reduce_op op,
                             unsigned phase, const ddp__ring_hook *hook)
{
    const int n = c->size, next = (c->rank + 1) % n;
    const size_t es = ddp_dtype_size(dt);
    const ddp__reduce_fn fn = ddp__reduce_kernel(dt, op);
    size_t maxlen = 0;
    for (int b = 0; b < n; b++)
        maxlen = bl->len[b] > maxlen ? bl->len[b] : maxlen;
    ring g = {.c = c, .bl = bl, .hook = hook, .es = es, .phase = phase};
    g.S = c->chunk / es ? c->chunk / es : 1; /* elements per unit */
    g.K = (maxlen + g.S - 1) / g.S;          /* units per step */
    g.steps = (size_t)n - 1;
    g.U = g.steps * g.K;
    if (g.U == 0)
        return 0;
    DDP_FAIL_IF(hook && !hook->final != !hook->expect, DDP_ERR_INVALID_ARG,
                "ring hook: final and expect come together (internal error)");
    const size_t slot_bytes = g.S * es < maxlen * es ? g.S * es : maxlen * es;
    if (n == 2) {
        g.lead = RING2_LEAD;
        g.group = 1;
        g.nslots = RING2_SLOTS;
    } else {
        /* Every step-0 send of a group at once and step-major order inside
         * it: a unit of step s arrives long before it is needed, so ranks
         * sharing cores do not wait on each other unit by unit (k-major
         * order made 3 ranks on 2 cores 1.5-2x slower).  The all-reduce
         * takes the whole block as one group; a standalone reduce-scatter
         * takes groups of ring_window bytes, which bound its scratch. */
        size_t w = c->ring_window / slot_bytes ? c->ring_window / slot_bytes : 1;
        g.lead = g.group = acc || w > g.K ? g.K : w;
        g.nslots = g.group + 1;
        if (!acc) /* steps 0..n-3 leave partials: (n-2) K of them */
            g.nparts = g.group + 1 < (g.steps - 1) * g.K ? g.group + 1 : (g.steps - 1) * g.K;
    }
    int rc = 0;
    uint8_t *scratch = NULL;
    ddp__req *sreq = NULL;
    DDP_FAIL_OUT(g.U > 0xffffff, DDP_ERR_INVALID_ARG, "message too large for %zu-byte chunks",
                 c->chunk);
    DDP_TRY_OUT(ddp__coll_scratch(c, (g.nslots + g.nparts) * slot_bytes, (void **)&scratch));
    g.stage = scratch;
    g.part = scratch + g.nslots * slot_bytes;
    g.slot_bytes = slot_bytes;
    sreq = calloc(g.U, sizeof *sreq);
    g.rreq = calloc(g.U, sizeof *g.rreq);
    g.free_slot = calloc(g.nslots, sizeof *g.free_slot);
    g.part_send = calloc(g.nparts ? g.nparts : 1, sizeof *g.part_send);
    DDP_FAIL_OUT(!sreq || !g.rreq || !g.free_slot || !g.part_send, DDP_ERR_NOMEM,
                 "out of memory");
    for (size_t i = 0; i < g.nslots; i++)
        g.free_slot[g.nfree++] = g.nslots - 1 - i;

    const uint8_t *inb = in;
    uint8_t *accb = acc, *outb = out;
    /* Phase 1: the first receives, and step 0's lead. */
    DDP_TRY_OUT(post_receives(&g));
    for (size_t k = 0; k < g.K && k < g.lead; k++) {
        size_t b = sb(&g, 0), len = ulen(&g, b, k);
        if (len)
            DDP_TRY_OUT(ddp__tp_isend(c->tp, &sreq[k], next, ddp__tag(c, phase, k),
                                      inb + (bl->off[b] + k * g.S) * es, len * es));
    }
    /* Phase 2: reduce each unit out of its slot, give the slot to the next
     * frame, pass the result on, keep step 0's lead. */
    for (size_t e = 0; e < g.U; e++) {
        size_t k, s;
        event_unit(&g, e, &s, &k);
        size_t u = s * g.K + k, b = rb(&g, s), len = ulen(&g, b, k);
        int last = s + 1 == g.steps;
        /* acc == NULL, not the last step: the next place in turn, once the
         * send that read it last has left (see the top of the file). */
        ddp__req **held = !last && !accb ? &g.part_send[g.nextpart++ % g.nparts] : NULL;
        if (len) {
            DDP_FAIL_OUT(!g.rreq[u].kind, DDP_ERR_STATE,
                         "ring: unit %zu was never posted (internal error)", u);
            DDP_TRY_OUT(ddp__coll_wait1(c, &g.rreq[u]));
            uint8_t *slot = g.rreq[u].buf;
            size_t at = (bl->off[b] + k * g.S) * es;
            uint8_t *dst = last   ? outb + k * g.S * es
                           : accb ? accb + at
                                  : g.part + (size_t)(held - g.part_send) * slot_bytes;
            if (held && *held && (*held)->status == 0)
                DDP_TRY_OUT(ddp__coll_wait1(c, *held));
            fn(dst, slot, inb + at, len);
            g.free_slot[g.nfree++] = (size_t)(slot - g.stage) / slot_bytes;
            DDP_TRY_OUT(post_receives(&g));
            if (!last) {
                DDP_TRY_OUT(ddp__tp_isend(c->tp, &sreq[u + g.K], next,
                                          ddp__tag(c, phase, u + g.K), dst, len * es));
                if (held)
                    *held = &sreq[u + g.K];
            } else if (hook && hook->final)
                DDP_TRY_OUT(hook->final(hook->arg, k, dst, len));
        }
        size_t kl = k + g.lead, bs = sb(&g, 0);
        if (s == 0 && kl < g.K && ulen(&g, bs, kl))
            DDP_TRY_OUT(ddp__tp_isend(c->tp, &sreq[kl], next, ddp__tag(c, phase, kl),
                                      inb + (bl->off[bs] + kl * g.S) * es,
                                      ulen(&g, bs, kl) * es));
    }
    DDP_TRY_OUT(ddp__coll_wait_array(c, sreq, g.U));
out:
    free(sreq);
    free(g.rreq);
    free(g.free_slot);
    free(g.part_send);
    return rc;
}
