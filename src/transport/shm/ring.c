/* The shared-memory transport's rings and bells (shm/internal.h).
 *
 * Messages in a ring: a 32-byte header (magic|type, tag, length, address)
 * then, for DATA, length payload bytes streamed as space frees up (a message
 * larger than the ring simply flows through it).  An RTS ("ready to send")
 * carries only the sender's buffer address: the receiver pulls the payload
 * (shm/cma.c) straight into the posted buffer and bumps acked, which
 * completes the send.  Where a message goes is the matching engine's call
 * (transport/match.h): a message that nobody waits for yet is copied when
 * small (or when a receive posted behind it needs the ring), else held in
 * the ring until its receive is posted, so that large early messages never
 * cost a copy. */
#include "transport/shm/internal.h"

#include <limits.h>
#include <sched.h>
#include <string.h>

#define STREAM_CHUNK (64u << 10) /* a large message's counters move every this many bytes */

/* ------------------------------------------------------------------ */
/* Bells                                                                */
/* ------------------------------------------------------------------ */

/* Rings rank r's bell if it sleeps on it (after the caller's fence). */
void ddp__shm_ring_bell(shm *s, int r)
{
    seg_bell *b = &s->bells[r];
    if (atomic_load_explicit(&b->sleeping, memory_order_relaxed)) {
        atomic_fetch_add_explicit(&b->word, 1, memory_order_release);
        futex(&b->word, FUTEX_WAKE, INT_MAX, NULL);
    }
}

/* Wakes rank r if it sleeps on its bell.  The fence orders our ring update
 * before the read of "sleeping"; the sleeper orders them the other way. */
void ddp__shm_notify(shm *s, int r)
{
    atomic_thread_fence(memory_order_seq_cst);
    ddp__shm_ring_bell(s, r);
}

/* Sleeps on this rank's bell for at most secs, unless done(arg) says the
 * wait is over after "sleeping" is announced: a peer that posts then (its
 * write, its fence, its look at "sleeping") either sees the flag and wakes
 * us, or was seen by done(). */
void ddp__shm_nap(shm *s, double secs, int (*done)(void *arg), void *arg)
{
    seg_bell *b = &s->bells[s->base.rank];
    uint32_t v = atomic_load_explicit(&b->word, memory_order_acquire);
    atomic_store_explicit(&b->sleeping, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    if (!done(arg)) {
        struct timespec ts = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
        futex(&b->word, FUTEX_WAIT, v, &ts);
    }
    atomic_store_explicit(&b->sleeping, 0, memory_order_relaxed);
}

/* Publishes the CPU this rank waits on: 1 + its number, 0 if unknown.
 * Every wait does at its start, so that a peer on the same CPU sees it
 * before it decides to spin (a rank whose waits end before their first
 * look at the clock would publish nothing otherwise). */
uint32_t ddp__shm_note_cpu(shm *s)
{
    int me = sched_getcpu();
    uint32_t v = me < 0 ? 0 : (uint32_t)me + 1;
    atomic_store_explicit(&s->bells[s->base.rank].cpu1, v, memory_order_relaxed);
    return v;
}

/* Publishes the CPU this rank waits on, and says whether rank `who` (or,
 * for -1, any peer) last waited on the same one.  A waiter spins only while
 * the peer it waits for can run beside it: when the scheduler has put both
 * ranks on one core (two ranks and a busy process on 2 cores), every
 * microsecond of spinning is a microsecond the peer cannot run, and each
 * small collective took the whole spin (25 us at the 20 us default,
 * against 0.3 us on two cores).  The peer's CPU is as of its last wait: a
 * stale value costs a spin skipped or wasted, never a wrong result. */
int ddp__shm_shares_cpu(shm *s, int who)
{
    uint32_t v = ddp__shm_note_cpu(s);
    if (v == 0)
        return 0;
    int q0 = who < 0 ? 0 : who, q1 = who < 0 ? s->base.size : who + 1;
    for (int q = q0; q < q1; q++)
        if (q != s->base.rank &&
            atomic_load_explicit(&s->bells[q].cpu1, memory_order_relaxed) == v)
            return 1;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Rings                                                                */
/* ------------------------------------------------------------------ */

static void ring_put(uint8_t *data, uint64_t mask, uint64_t at, const void *src, size_t len)
{
    size_t off = (size_t)(at & mask), first = (size_t)mask + 1 - off;
    if (first >= len) {
        memcpy(data + off, src, len);
    } else {
        memcpy(data + off, src, first);
        memcpy(data, (const uint8_t *)src + first, len - first);
    }
}

static void ring_get(const uint8_t *data, uint64_t mask, uint64_t at, void *dst, size_t len)
{
    size_t off = (size_t)(at & mask), first = (size_t)mask + 1 - off;
    if (first >= len) {
        memcpy(dst, data + off, len);
    } else {
        memcpy(dst, data + off, first);
        memcpy((uint8_t *)dst + first, data, len - first);
    }
}

static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint64_t get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* ------------------------------------------------------------------ */
/* Send side                                                            */
/* ------------------------------------------------------------------ */

static uint64_t tx_free(shm *s, peer *p)
{
    uint64_t used = p->tx_head - p->tx_tail_cache;
    if (s->ring_bytes - used >= HDR_LEN && used < s->ring_bytes / 2)
        return s->ring_bytes - used;
    p->tx_tail_cache = atomic_load_explicit(&p->tx->tail, memory_order_acquire);
    return s->ring_bytes - (p->tx_head - p->tx_tail_cache);
}

/* Moves queued sends into the ring as far as space allows; 1 if anything
 * moved. */
int ddp__shm_tx_progress(shm *s, peer *p)
{
    uint64_t start = p->tx_head;
    ddp__req *r;
    while ((r = p->m.sq_head) != NULL) {
        uint64_t room = tx_free(s, p);
        if (!p->sq_hdr_done) {
            if (room < HDR_LEN)
                break;
            int rts = p->cma && r->len >= s->cma_min;
            uint8_t h[HDR_LEN];
            put64(h, (uint64_t)MSG_MAGIC | (uint64_t)(rts ? MSG_RTS : MSG_DATA) << 32);
            put64(h + 8, r->tag);
            put64(h + 16, r->len);
            put64(h + 24, (uint64_t)(uintptr_t)r->buf);
            ring_put(p->tx_data, s->mask, p->tx_head, h, HDR_LEN);
            p->tx_head += HDR_LEN;
            room -= HDR_LEN;
            p->sq_hdr_done = 1;
            if (rts) { /* completes when the receiver has pulled it */
                p->m.sq_head = r->next;
                if (!p->m.sq_head)
                    p->m.sq_tail = NULL;
                r->next = NULL;
                if (p->m.cq_tail)
                    p->m.cq_tail->next = r;
                else
                    p->m.cq_head = r;
                p->m.cq_tail = r;
                p->cma_sent++;
                p->sq_hdr_done = 0;
                continue;
            }
        }
        size_t k = r->len - r->done;
        if (k > room)
            k = (size_t)room;
        if (k > STREAM_CHUNK) /* let the consumer start on the first part */
            k = STREAM_CHUNK;
        if (k) {
            ring_put(p->tx_data, s->mask, p->tx_head, (const uint8_t *)r->buf + r->done, k);
            p->tx_head += k;
            r->done += k;
            if (r->done < r->len)
                atomic_store_explicit(&p->tx->head, p->tx_head, memory_order_release);
        }
        if (r->done < r->len) {
            if (k)
                continue;
            break;
        }
        r->status = 1; /* copied into the ring: the buffer is free again */
        p->m.sq_head = r->next;
        if (!p->m.sq_head)
            p->m.sq_tail = NULL;
        r->next = NULL;
        p->sq_hdr_done = 0;
    }
    if (p->tx_head == start)
        return 0;
    atomic_store_explicit(&p->tx->head, p->tx_head, memory_order_release);
    ddp__shm_notify(s, p->m.rank);
    return 1;
}

/* ------------------------------------------------------------------ */
/* Receive side                                                         */
/* ------------------------------------------------------------------ */

/* An RTS message whose place is known (a posted receive, or a fresh
 * unexpected buffer): pulled at once, then acknowledged, which completes
 * the sender's send.  0 or -1 (the peer is down). */
static int pull(shm *s, peer *p)
{
    if (ddp__shm_cma_read(s, p, ddp__match_dst(&p->m), p->rx_addr, p->m.rx_len) < 0)
        return -1;
    atomic_fetch_add_explicit(&p->rx_ring->acked, 1, memory_order_release);
    ddp__shm_notify(s, p->m.rank);
    ddp__match_done(&s->m, &p->m);
    return 0;
}

/* After the engine moved the message in progress to BODY: an RTS is pulled
 * now, a DATA message streams through the ring. */
int ddp__shm_body_started(shm *s, peer *p)
{
    return p->m.rx == DDP__RX_BODY && p->rx_type == MSG_RTS ? pull(s, p) : 0;
}

static int start_msg(shm *s, peer *p)
{
    uint8_t h[HDR_LEN];
    ring_get(p->rx_data, s->mask, p->rx_tail, h, HDR_LEN);
    p->rx_tail += HDR_LEN;
    uint64_t w = get64(h);
    uint32_t magic = (uint32_t)w, type = (uint32_t)(w >> 32);
    uint64_t tag = get64(h + 8), len = get64(h + 16);
    p->rx_addr = get64(h + 24);
    if (magic != MSG_MAGIC || (type != MSG_DATA && type != MSG_RTS) || len > ((uint64_t)1 << 46)) {
        ddp__match_down(&s->m, &p->m, DDP__PEER_DEAD,
                        "wrote a malformed message (magic 0x%08x, type %u); ring dropped", magic,
                        type);
        return -1;
    }
    p->rx_type = (int)type;
    if (ddp__match_arrive(&s->m, &p->m, tag, (size_t)len) < 0)
        return -1;
    return ddp__shm_body_started(s, p);
}

/* Consumes what the peer wrote as far as receives allow; 1 if anything
 * moved. */
static int rx_progress(shm *s, peer *p)
{
    ddp__match_peer *mp = &p->m;
    uint64_t start = p->rx_tail;
    int moved = 0;
    while (mp->state == DDP__PEER_LIVE && mp->rx != DDP__RX_HELD) {
        uint64_t avail = p->rx_head_cache - p->rx_tail;
        if (avail == 0 || (mp->rx == DDP__RX_HDR && avail < HDR_LEN)) {
            p->rx_head_cache = atomic_load_explicit(&p->rx_ring->head, memory_order_acquire);
            avail = p->rx_head_cache - p->rx_tail;
        }
        if (mp->rx == DDP__RX_HDR) {
            if (avail < HDR_LEN)
                break;
            moved = 1;
            if (start_msg(s, p) < 0)
                break;
            if (mp->rx == DDP__RX_BODY && mp->rx_len == 0)
                ddp__match_done(&s->m, mp);
            continue;
        }
        /* DDP__RX_BODY */
        size_t k = mp->rx_len - mp->rx_off;
        if (k > avail)
            k = (size_t)avail;
        if (k > STREAM_CHUNK)
            k = STREAM_CHUNK;
        if (k == 0)
            break;
        ring_get(p->rx_data, s->mask, p->rx_tail, ddp__match_dst(mp) + mp->rx_off, k);
        p->rx_tail += k;
        mp->rx_off += k;
        if (mp->rx_off < mp->rx_len) /* give the producer the room back now */
            atomic_store_explicit(&p->rx_ring->tail, p->rx_tail, memory_order_release);
        if (mp->rx_req)
            mp->rx_req->done = mp->rx_off;
        if (mp->rx_off == mp->rx_len)
            ddp__match_done(&s->m, mp);
    }
    if (p->rx_tail != start) {
        atomic_store_explicit(&p->rx_ring->tail, p->rx_tail, memory_order_release);
        ddp__shm_notify(s, mp->rank);
        moved = 1;
    }
    return moved;
}

/* Moves what can move on every live peer's rings; 1 if anything did. */
int ddp__shm_progress_all(shm *s)
{
    int moved = 0;
    for (int i = 0; i < s->base.size; i++) {
        peer *p = &s->peers[i];
        if (i == s->base.rank || p->m.state != DDP__PEER_LIVE)
            continue;
        if (p->m.sq_head)
            moved |= ddp__shm_tx_progress(s, p);
        if (p->m.cq_head)
            moved |= ddp__shm_cma_progress(p);
        moved |= rx_progress(s, p);
    }
    return moved;
}
