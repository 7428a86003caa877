/* Shared-memory transport: segment setup, rings, the progress engine; see
 * shm.h and docs/shm.md.
 *
 * Segment layout (one per group, rank 0 creates it):
 *   header      magic, version, size, ring bytes, attach count
 *   slots[n]    per rank: pid, state (live/left/aborted + reason), CMA probe
 *   bells[n]    per rank, own cache line: "sleeping" flag and futex word
 *   ctl[n*n]    per ordered pair s->d: head (producer), tail (consumer) and
 *               acked (CMA messages completed), each on its own cache line
 *   wflag[n][4] per rank: the window's flags, one cache line each
 *   data[n*n]   per ordered pair: ring_bytes of ring
 *   win[n]      per rank: the shared window's slot (window_bytes, paged)
 * head and tail count bytes since the start; the producer publishes head
 * with a release store after writing, the consumer reads it with acquire
 * (and the same in the other direction for tail).
 *
 * Messages in a ring: a 32-byte header (magic|type, tag, length, address)
 * then, for DATA, length payload bytes streamed as space frees up (a message
 * larger than the ring simply flows through it).  An RTS ("ready to send")
 * carries only the sender's buffer address: the receiver pulls the payload
 * with process_vm_readv straight into the posted buffer and bumps acked,
 * which completes the send.  The receive side is the TCP transport's state
 * machine: a message that nobody waits for yet is copied when small (or
 * when a receive posted behind it needs the ring), else held until its
 * receive is posted, so that large early messages never cost a copy. */
#include "transport/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "base/rng.h"
#include "base/secret.h"
#include "transport/handshake.h"
#include "transport/rendezvous.h"
#include "transport/symmetric.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

#define SEG_MAGIC 0x4d485344u /* "DSHM" */
#define SEG_VERSION 2
#define MSG_MAGIC 0x46534444u /* "DDSF" */
#define HDR_LEN 32
enum { MSG_DATA = 1, MSG_RTS = 2 };
#define LINE 64
#define WHY_LEN 1024
#define DEFAULT_RING (1u << 20)
#define DEFAULT_WINDOW (1u << 20)
#define DEFAULT_CMA_MIN (32u << 10)   /* RTS (one copy) from this many bytes */
#define STREAM_CHUNK (64u << 10)      /* a large message's counters move every this many bytes */
#define EAGER_MAX (64u << 10)         /* unexpected messages up to this are copied at once */
#define DEFAULT_SPIN_US 20.0
#define DEFAULT_YIELD_US 200.0
#define SLEEP_MAX_S 0.01              /* futex naps: peers are checked between them */
#define LIVENESS_S 0.002              /* pidfd checks while idle, at most this often */

enum { RX_HDR, RX_BODY, RX_HELD };
enum { P_LIVE, P_LEFT, P_DEAD, P_ABORTED };
enum { S_LIVE = 0, S_LEFT = 1, S_ABORTED = 2 }; /* slot state in the segment */

/* ------------------------------------------------------------------ */
/* Segment                                                              */
/* ------------------------------------------------------------------ */

typedef struct seg_hdr {
    uint32_t magic, version;
    uint32_t size, pad;
    uint64_t ring_bytes;
    uint64_t window_bytes;
    uint64_t total_bytes;
    _Atomic uint32_t attached; /* ranks that have mapped the segment */
} seg_hdr;

typedef struct seg_slot {
    _Atomic int32_t pid;
    _Atomic uint32_t state;   /* S_* */
    _Atomic uint32_t cma;     /* 0 probing, 1 can read every peer, 2 cannot */
    uint32_t pad;
    uint64_t probe_addr;      /* in its own address space: probe_val is there */
    uint64_t probe_val;
    char why[WHY_LEN];        /* reason of an abort */
} __attribute__((aligned(LINE))) seg_slot;

typedef struct seg_bell {
    _Atomic uint32_t sleeping;
    _Atomic uint32_t word; /* futex */
} __attribute__((aligned(LINE))) seg_bell;

typedef struct ring_ctl {
    _Atomic uint64_t head __attribute__((aligned(LINE)));
    _Atomic uint64_t tail __attribute__((aligned(LINE)));
    _Atomic uint64_t acked __attribute__((aligned(LINE)));
} ring_ctl;

typedef struct unexp {
    uint64_t tag;
    size_t len;
    uint8_t *data;
    struct unexp *next;
} unexp;

typedef struct peer {
    int rank;
    int state;
    int err;
    int pidfd;
    pid_t pid;
    int cma;             /* this rank sends RTS to the peer (it can read us) */
    char what[64];       /* "rank 3 (pid 1234)" */
    char why[WHY_LEN + 128];
    /* send side: ring me -> peer */
    ring_ctl *tx;
    uint8_t *tx_data;
    uint64_t tx_head, tx_tail_cache;
    ddp__req *sq_head, *sq_tail; /* waiting for ring space */
    int sq_hdr_done;             /* the head's header is in the ring */
    ddp__req *cq_head, *cq_tail; /* RTS sent, waiting for acked */
    uint64_t cma_sent, cma_done;
    /* receive side: ring peer -> me */
    ring_ctl *rx_ring;
    uint8_t *rx_data;
    uint64_t rx_tail, rx_head_cache;
    ddp__req *pq_head, *pq_tail; /* posted receives */
    unexp *ux_head, *ux_tail;
    int rx;
    int rx_type;
    uint64_t rx_tag, rx_addr;
    size_t rx_len, rx_off;
    ddp__req *rx_req;
    unexp *rx_ux;
} peer;

typedef struct shm {
    ddp__tp base;
    uint8_t *map;
    size_t map_len;
    seg_hdr *hdr;
    seg_slot *slots;
    seg_bell *bells;
    uint64_t ring_bytes, mask;
    size_t cma_min;
    /* the shared window (transport.h): views into the segment */
    ddp__window win;
    uint8_t **win_slot;
    ddp__win_flag **win_flag;
    peer *peers;
    int ndead;
    int first_dead;
    int failed;         /* this rank aborted */
    double spin_s, yield_s;
    double last_check;
    volatile uint64_t probe; /* read by peers' CMA probes */
    char name[64];
    ddp__sym_set *sym;  /* symmetric memory (NULL for a group of one) */
} shm;

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

typedef struct seg_off {
    size_t slots, bells, ctl, wflag, data, win;
} seg_off;

static size_t seg_layout(int n, size_t ring, size_t window, seg_off *o)
{
    size_t nn = (size_t)n * (size_t)n;
    o->slots = align_up(sizeof(seg_hdr), LINE);
    o->bells = align_up(o->slots + (size_t)n * sizeof(seg_slot), LINE);
    o->ctl = align_up(o->bells + (size_t)n * sizeof(seg_bell), LINE);
    o->wflag = align_up(o->ctl + nn * sizeof(ring_ctl), LINE);
    o->data = align_up(o->wflag + (size_t)n * DDP__WIN_FLAGS * sizeof(ddp__win_flag), 4096);
    o->win = o->data + nn * ring;
    return o->win + (size_t)n * window;
}

/* ------------------------------------------------------------------ */
/* Little helpers                                                       */
/* ------------------------------------------------------------------ */

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Rings rank r's bell if it sleeps on it (after the caller's fence). */
static void ring_bell(shm *s, int r)
{
    seg_bell *b = &s->bells[r];
    if (atomic_load_explicit(&b->sleeping, memory_order_relaxed)) {
        atomic_fetch_add_explicit(&b->word, 1, memory_order_release);
        futex(&b->word, FUTEX_WAKE, INT_MAX, NULL);
    }
}

/* Wakes rank r if it sleeps on its bell.  The fence orders our ring update
 * before the read of "sleeping"; the sleeper orders them the other way. */
static void notify(shm *s, int r)
{
    atomic_thread_fence(memory_order_seq_cst);
    ring_bell(s, r);
}

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

static void fail_list(ddp__req *r, int code)
{
    while (r) {
        ddp__req *next = r->next;
        r->status = code;
        r->next = NULL;
        r = next;
    }
}

static void free_unexp(unexp *u)
{
    while (u) {
        unexp *next = u->next;
        free(u->data);
        free(u);
        u = next;
    }
}

/* Takes the peer out of service and fails every request that involves it.
 * state is P_DEAD (an error), P_LEFT (it destroyed its group) or P_ABORTED
 * (this rank gave up). */
__attribute__((format(printf, 4, 5)))
static void peer_down(shm *s, peer *p, int state, const char *fmt, ...)
{
    if (p->state != P_LIVE)
        return;
    char msg[WHY_LEN + 64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(p->why, sizeof p->why, "%s %s", p->what, msg);
    p->state = state;
    p->err = DDP_ERR_PEER;
    if (state == P_DEAD) {
        s->ndead++;
        if (s->first_dead < 0)
            s->first_dead = p->rank;
        DDP_WARN("shm rank %d: %s", s->base.rank, p->why);
    } else {
        DDP_DEBUG("shm rank %d: %s", s->base.rank, p->why);
    }
    fail_list(p->sq_head, p->err);
    fail_list(p->cq_head, p->err);
    fail_list(p->pq_head, p->err);
    if (p->rx_req)
        p->rx_req->status = p->err;
    p->sq_head = p->sq_tail = p->cq_head = p->cq_tail = p->pq_head = p->pq_tail = NULL;
    p->rx_req = NULL;
    if (p->rx_ux) {
        free(p->rx_ux->data);
        free(p->rx_ux);
        p->rx_ux = NULL;
    }
    if (state != P_LEFT) {
        free_unexp(p->ux_head);
        p->ux_head = p->ux_tail = NULL;
    }
}

static int peer_error(const peer *p) { return DDP_ERROR(p->err, "%s", p->why); }

static ddp__req *take_posted(peer *p, uint64_t tag)
{
    ddp__req *prev = NULL;
    for (ddp__req *r = p->pq_head; r; prev = r, r = r->next) {
        if (r->tag != tag)
            continue;
        if (prev)
            prev->next = r->next;
        else
            p->pq_head = r->next;
        if (p->pq_tail == r)
            p->pq_tail = prev;
        r->next = NULL;
        return r;
    }
    return NULL;
}

static int len_mismatch(shm *s, peer *p, uint64_t tag, uint64_t got, size_t want)
{
    char msg[200];
    snprintf(msg, sizeof msg,
             "sent %" PRIu64 " bytes for tag 0x%" PRIx64 " where %zu were expected "
             "(do the ranks call the same collectives with the same sizes?)",
             got, tag, want);
    peer_down(s, p, P_DEAD, "%s", msg);
    return DDP_ERROR(DDP_ERR_PROTOCOL, "%s: %s", p->what, msg);
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
static int tx_progress(shm *s, peer *p)
{
    uint64_t start = p->tx_head;
    ddp__req *r;
    while ((r = p->sq_head) != NULL) {
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
                p->sq_head = r->next;
                if (!p->sq_head)
                    p->sq_tail = NULL;
                r->next = NULL;
                if (p->cq_tail)
                    p->cq_tail->next = r;
                else
                    p->cq_head = r;
                p->cq_tail = r;
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
        p->sq_head = r->next;
        if (!p->sq_head)
            p->sq_tail = NULL;
        r->next = NULL;
        p->sq_hdr_done = 0;
    }
    if (p->tx_head == start)
        return 0;
    atomic_store_explicit(&p->tx->head, p->tx_head, memory_order_release);
    notify(s, p->rank);
    return 1;
}

/* Completes RTS sends the receiver has pulled; 1 if any. */
static int cma_progress(peer *p)
{
    if (!p->cq_head)
        return 0;
    uint64_t acked = atomic_load_explicit(&p->tx->acked, memory_order_acquire);
    int moved = 0;
    while (p->cma_done < acked && p->cq_head) {
        ddp__req *r = p->cq_head;
        p->cq_head = r->next;
        if (!p->cq_head)
            p->cq_tail = NULL;
        r->next = NULL;
        r->done = r->len;
        r->status = 1;
        p->cma_done++;
        moved = 1;
    }
    return moved;
}

/* ------------------------------------------------------------------ */
/* Receive side                                                         */
/* ------------------------------------------------------------------ */

static void check_peers(shm *s, int force);

/* Pulls len bytes at the peer's address addr into dst (cross-memory
 * attach); on failure the peer is taken down.  0 or -1. */
static int cma_read(shm *s, peer *p, void *dst, uint64_t addr, size_t len)
{
    size_t off = 0;
    while (off < len) {
        struct iovec l = {(uint8_t *)dst + off, len - off};
        struct iovec r = {(void *)(uintptr_t)(addr + off), len - off};
        ssize_t n = process_vm_readv(p->pid, &l, 1, &r, 1, 0);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        int e = errno;
        /* A sender that gave up or died may have freed the buffer: say so
         * rather than "Bad address". */
        check_peers(s, 1);
        if (p->state != P_LIVE)
            return -1;
        errno = e;
        if (n < 0 && errno == ESRCH)
            peer_down(s, p, P_DEAD, "died (reading its %zu-byte message failed: no such process)",
                      len);
        else
            peer_down(s, p, P_DEAD, "process_vm_readv of %zu bytes failed: %s", len,
                      n < 0 ? strerror(errno) : "no progress");
        return -1;
    }
    return 0;
}

/* The message whose header was consumed goes nowhere yet: copy it into a
 * fresh unexpected buffer (an RTS is pulled at once). */
static int buffer_msg(shm *s, peer *p)
{
    unexp *u = calloc(1, sizeof *u);
    uint8_t *data = malloc(p->rx_len ? p->rx_len : 1);
    if (!u || !data) {
        free(u);
        free(data);
        peer_down(s, p, P_DEAD, "out of memory buffering a %zu-byte message", p->rx_len);
        return -1;
    }
    u->tag = p->rx_tag;
    u->len = p->rx_len;
    u->data = data;
    p->rx_req = NULL;
    if (p->rx_type == MSG_RTS) {
        if (cma_read(s, p, data, p->rx_addr, p->rx_len) < 0) {
            free(data);
            free(u);
            return -1;
        }
        atomic_fetch_add_explicit(&p->rx_ring->acked, 1, memory_order_release);
        notify(s, p->rank);
        if (p->ux_tail)
            p->ux_tail->next = u;
        else
            p->ux_head = u;
        p->ux_tail = u;
        p->rx = RX_HDR;
        return 0;
    }
    p->rx_ux = u;
    p->rx = RX_BODY;
    return 0;
}

/* Delivers the current message into posted receive r (lengths checked). */
static int deliver(shm *s, peer *p, ddp__req *r)
{
    if (r->len != p->rx_len) {
        r->status = DDP_ERR_PROTOCOL;
        return len_mismatch(s, p, p->rx_tag, p->rx_len, r->len);
    }
    if (p->rx_type == MSG_RTS) {
        if (cma_read(s, p, r->buf, p->rx_addr, r->len) < 0)
            return -1;
        atomic_fetch_add_explicit(&p->rx_ring->acked, 1, memory_order_release);
        notify(s, p->rank);
        r->done = r->len;
        r->status = 1;
        p->rx = RX_HDR;
        return 0;
    }
    p->rx_req = r;
    p->rx = RX_BODY;
    return 0;
}

static int start_msg(shm *s, peer *p)
{
    uint8_t h[HDR_LEN];
    ring_get(p->rx_data, s->mask, p->rx_tail, h, HDR_LEN);
    p->rx_tail += HDR_LEN;
    uint64_t w = get64(h);
    uint32_t magic = (uint32_t)w, type = (uint32_t)(w >> 32);
    p->rx_tag = get64(h + 8);
    uint64_t len = get64(h + 16);
    p->rx_addr = get64(h + 24);
    if (magic != MSG_MAGIC || (type != MSG_DATA && type != MSG_RTS) || len > ((uint64_t)1 << 46)) {
        peer_down(s, p, P_DEAD, "wrote a malformed message (magic 0x%08x, type %u); ring dropped",
                  magic, type);
        return -1;
    }
    p->rx_type = (int)type;
    p->rx_len = (size_t)len;
    p->rx_off = 0;
    ddp__req *r = take_posted(p, p->rx_tag);
    if (r)
        return deliver(s, p, r);
    if (len <= EAGER_MAX || p->pq_head)
        return buffer_msg(s, p);
    p->rx = RX_HELD;
    return 0;
}

static void body_done(shm *s, peer *p)
{
    if (p->rx_req) {
        p->rx_req->done = p->rx_len;
        p->rx_req->status = 1;
    } else {
        unexp *u = p->rx_ux;
        ddp__req *r = take_posted(p, u->tag); /* posted while the message arrived */
        if (r && r->len != u->len) {
            r->status = DDP_ERR_PROTOCOL;
            len_mismatch(s, p, u->tag, u->len, r->len);
            free(u->data);
            free(u);
        } else if (r) {
            if (u->len)
                memcpy(r->buf, u->data, u->len);
            r->done = u->len;
            r->status = 1;
            free(u->data);
            free(u);
        } else {
            if (p->ux_tail)
                p->ux_tail->next = u;
            else
                p->ux_head = u;
            p->ux_tail = u;
        }
    }
    p->rx_req = NULL;
    p->rx_ux = NULL;
    p->rx = RX_HDR;
}

/* Consumes what the peer wrote as far as receives allow; 1 if anything
 * moved. */
static int rx_progress(shm *s, peer *p)
{
    uint64_t start = p->rx_tail;
    int moved = 0;
    while (p->state == P_LIVE && p->rx != RX_HELD) {
        uint64_t avail = p->rx_head_cache - p->rx_tail;
        if (avail == 0 || (p->rx == RX_HDR && avail < HDR_LEN)) {
            p->rx_head_cache = atomic_load_explicit(&p->rx_ring->head, memory_order_acquire);
            avail = p->rx_head_cache - p->rx_tail;
        }
        if (p->rx == RX_HDR) {
            if (avail < HDR_LEN)
                break;
            moved = 1;
            if (start_msg(s, p) < 0)
                break;
            if (p->rx == RX_BODY && p->rx_len == 0)
                body_done(s, p);
            continue;
        }
        /* RX_BODY */
        size_t k = p->rx_len - p->rx_off;
        if (k > avail)
            k = (size_t)avail;
        if (k > STREAM_CHUNK)
            k = STREAM_CHUNK;
        if (k == 0)
            break;
        uint8_t *dst = p->rx_req ? p->rx_req->buf : p->rx_ux->data;
        ring_get(p->rx_data, s->mask, p->rx_tail, dst + p->rx_off, k);
        p->rx_tail += k;
        p->rx_off += k;
        if (p->rx_off < p->rx_len) /* give the producer the room back now */
            atomic_store_explicit(&p->rx_ring->tail, p->rx_tail, memory_order_release);
        if (p->rx_req)
            p->rx_req->done = p->rx_off;
        if (p->rx_off == p->rx_len)
            body_done(s, p);
    }
    if (p->rx_tail != start) {
        atomic_store_explicit(&p->rx_ring->tail, p->rx_tail, memory_order_release);
        notify(s, p->rank);
        moved = 1;
    }
    return moved;
}

/* ------------------------------------------------------------------ */
/* Failure                                                              */
/* ------------------------------------------------------------------ */

static const peer *failed_peer(const shm *s)
{
    if (s->first_dead >= 0)
        return &s->peers[s->first_dead];
    for (int r = 0; r < s->base.size; r++)
        if (r != s->base.rank && s->peers[r].state != P_LIVE)
            return &s->peers[r];
    return NULL;
}

/* After any error: the segment says why this rank gives up, peers are
 * woken to read it, every request is dropped. */
static void abort_all(shm *s, const char *why)
{
    if (!s->failed && s->slots) {
        seg_slot *me = &s->slots[s->base.rank];
        snprintf(me->why, sizeof me->why, "%s", why);
        atomic_store_explicit(&me->state, S_ABORTED, memory_order_release);
        s->failed = 1;
    }
    for (int r = 0; r < s->base.size; r++) {
        peer *p = &s->peers[r];
        if (r == s->base.rank)
            continue;
        if (p->state == P_LIVE) {
            notify(s, r);
            peer_down(s, p, P_ABORTED, "(this rank gave up after an error)");
        }
        fail_list(p->sq_head, p->err);
        fail_list(p->cq_head, p->err);
        fail_list(p->pq_head, p->err);
        p->sq_head = p->sq_tail = p->cq_head = p->cq_tail = p->pq_head = p->pq_tail = NULL;
        p->rx_req = NULL;
    }
}

static int fail_all(shm *s, int rc)
{
    char why[WHY_LEN];
    snprintf(why, sizeof why, "rank %d: %s", s->base.rank, ddp_last_error());
    abort_all(s, why);
    return rc;
}

/* Reads the peers' states from the segment and their pidfds (at most every
 * LIVENESS_S, unless force or a peer gave up: then a death behind it is
 * found and named first).  A peer that left is let go once its ring is
 * drained; one that died or gave up is taken down. */
static void check_peers(shm *s, int force)
{
    const int n = s->base.size;
    double now = ddp_time_now();
    int pids = force || now - s->last_check >= LIVENESS_S;
    for (int r = 0; r < n && !pids; r++)
        pids = r != s->base.rank && s->peers[r].state == P_LIVE &&
               atomic_load_explicit(&s->slots[r].state, memory_order_acquire) == S_ABORTED;
    if (pids) {
        s->last_check = now;
        for (int r = 0; r < n; r++) {
            peer *p = &s->peers[r];
            /* One that left or gave up has said so: its exit is no news. */
            if (r == s->base.rank || p->state != P_LIVE ||
                atomic_load_explicit(&s->slots[r].state, memory_order_acquire) != S_LIVE)
                continue;
            int dead;
            if (p->pidfd >= 0) {
                struct pollfd pf = {.fd = p->pidfd, .events = POLLIN};
                dead = poll(&pf, 1, 0) > 0;
            } else {
                dead = kill(p->pid, 0) < 0 && errno == ESRCH;
            }
            if (dead)
                peer_down(s, p, P_DEAD, "died (process exited without leaving the group)");
        }
    }
    for (int r = 0; r < n; r++) {
        peer *p = &s->peers[r];
        if (r == s->base.rank || p->state != P_LIVE)
            continue;
        uint32_t st = atomic_load_explicit(&s->slots[r].state, memory_order_acquire);
        if (st == S_ABORTED)
            peer_down(s, p, P_DEAD, "gave up: %.*s", WHY_LEN - 1, s->slots[r].why);
        else if (st == S_LEFT && p->rx == RX_HDR &&
                 atomic_load_explicit(&p->rx_ring->head, memory_order_acquire) == p->rx_tail)
            peer_down(s, p, P_LEFT, "left the group (destroyed its process group)");
    }
}

/* ------------------------------------------------------------------ */
/* The vtable                                                           */
/* ------------------------------------------------------------------ */

static int check_peer(shm *s, int rank, const char *what)
{
    if (rank < 0 || rank >= s->base.size || rank == s->base.rank)
        return DDP_ERROR(DDP_ERR_INVALID_ARG, "%s: peer rank %d invalid for rank %d of %d", what,
                         rank, s->base.rank, s->base.size);
    if (s->peers[rank].state != P_LIVE)
        return ddp__error_context(peer_error(&s->peers[rank]), "%s", what);
    return 0;
}

static int shm_isend(ddp__tp *tp, ddp__req *r)
{
    shm *s = (shm *)tp;
    int rc = check_peer(s, r->peer, "send");
    if (rc < 0)
        return fail_all(s, rc);
    peer *p = &s->peers[r->peer];
    r->next = NULL;
    if (p->sq_tail) {
        p->sq_tail->next = r;
        p->sq_tail = r;
        return 0;
    }
    p->sq_head = p->sq_tail = r;
    p->sq_hdr_done = 0;
    tx_progress(s, p); /* eager: small sends finish here */
    return 0;
}

static int shm_irecv(ddp__tp *tp, ddp__req *r)
{
    shm *s = (shm *)tp;
    if (r->peer < 0 || r->peer >= s->base.size || r->peer == s->base.rank)
        return fail_all(s, check_peer(s, r->peer, "recv"));
    peer *p = &s->peers[r->peer];
    /* An older buffered message with this tag comes first (also from a
     * peer that has left since). */
    unexp *prev = NULL;
    for (unexp *u = p->ux_head; u; prev = u, u = u->next) {
        if (u->tag != r->tag)
            continue;
        if (u->len != r->len) {
            r->status = DDP_ERR_PROTOCOL;
            return fail_all(s, len_mismatch(s, p, u->tag, u->len, r->len));
        }
        if (prev)
            prev->next = u->next;
        else
            p->ux_head = u->next;
        if (p->ux_tail == u)
            p->ux_tail = prev;
        if (u->len)
            memcpy(r->buf, u->data, u->len);
        r->done = u->len;
        r->status = 1;
        free(u->data);
        free(u);
        return 0;
    }
    int rc = check_peer(s, r->peer, "recv");
    if (rc < 0)
        return fail_all(s, rc);
    r->next = NULL;
    if (p->rx == RX_HELD) {
        if (p->rx_tag == r->tag) {
            if (deliver(s, p, r) < 0) /* the peer is down: the message says why */
                return fail_all(s, peer_error(p));
            return 0;
        }
        /* This receive's message is behind the held one: copy the held one. */
        if (buffer_msg(s, p) < 0)
            return fail_all(s, peer_error(p));
    }
    if (p->pq_tail)
        p->pq_tail->next = r;
    else
        p->pq_head = r;
    p->pq_tail = r;
    return 0;
}

static int progress_all(shm *s)
{
    int moved = 0;
    for (int i = 0; i < s->base.size; i++) {
        peer *p = &s->peers[i];
        if (i == s->base.rank || p->state != P_LIVE)
            continue;
        if (p->sq_head)
            moved |= tx_progress(s, p);
        if (p->cq_head)
            moved |= cma_progress(p);
        moved |= rx_progress(s, p);
    }
    return moved;
}

/* Buffers every held message; 1 if there was one. */
static int unhold_all(shm *s)
{
    int moved = 0;
    for (int i = 0; i < s->base.size; i++) {
        peer *p = &s->peers[i];
        if (i != s->base.rank && p->state == P_LIVE && p->rx == RX_HELD) {
            buffer_msg(s, p);
            moved = 1;
        }
    }
    return moved;
}

static int timeout_error(shm *s, ddp__req *const *reqs, int n, double waited)
{
    for (int i = 0; i < n; i++) {
        if (reqs[i]->status != 0)
            continue;
        const peer *p = &s->peers[reqs[i]->peer];
        return DDP_ERROR(DDP_ERR_TIMEOUT, "timed out after %.1f s %s %s (%zu of %zu bytes)",
                         waited, reqs[i]->kind == DDP__REQ_SEND ? "sending to" : "waiting for",
                         p->what, reqs[i]->done, reqs[i]->len);
    }
    return DDP_ERROR(DDP_ERR_TIMEOUT, "timed out after %.1f s", waited);
}

/* Sleeps on this rank's bell for at most secs, unless done(arg) says the
 * wait is over after "sleeping" is announced: a peer that posts then (its
 * write, its fence, its look at "sleeping") either sees the flag and wakes
 * us, or was seen by done(). */
static void nap(shm *s, double secs, int (*done)(void *arg), void *arg)
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

static int moved(void *arg) { return progress_all(arg); }

static int shm_wait(ddp__tp *tp, ddp__req *const *reqs, int n, double deadline, int flags)
{
    shm *s = (shm *)tp;
    double start = 0, idle_since = 0;
    unsigned spins = 0;
    for (;;) {
        int pending = 0;
        for (int i = 0; i < n; i++) {
            if (reqs[i]->status < 0) {
                const peer *p = (flags & DDP__WAIT_ANY_PEER) && failed_peer(s)
                                    ? failed_peer(s)
                                    : &s->peers[reqs[i]->peer];
                return fail_all(s, peer_error(p));
            }
            pending += reqs[i]->status == 0;
        }
        if (!pending)
            return 0;
        if ((flags & DDP__WAIT_ANY_PEER) && s->ndead)
            return fail_all(s, peer_error(failed_peer(s)));
        if (progress_all(s)) {
            spins = 0;
            idle_since = 0;
            continue;
        }
        /* Nothing moved: spin, then yield, then sleep; look at the clock
         * and the peers now and then. */
        if (++spins < 64) {
            cpu_relax();
            continue;
        }
        spins = 0;
        double now = ddp_time_now();
        if (start == 0)
            start = now;
        if (idle_since == 0)
            idle_since = now;
        check_peers(s, 0);
        if (now >= deadline)
            return fail_all(s, timeout_error(s, reqs, n, now - start));
        double idle = now - idle_since;
        if (idle < s->spin_s)
            continue;
        if (idle < s->yield_s) {
            sched_yield();
            continue;
        }
        /* Still stuck while holding a message nobody asked for: its sender
         * may be stuck behind our own wait (two ranks sending to each other
         * first), so take it off the sender's hands.  Not sooner: the copy
         * (and a fresh allocation's page faults) is what holding avoids. */
        if (unhold_all(s))
            continue;
        double left = deadline - now;
        nap(s, left < SLEEP_MAX_S ? left : SLEEP_MAX_S, moved, s);
    }
}

static void shm_abort(ddp__tp *tp, int code, const char *why)
{
    (void)code;
    abort_all((shm *)tp, why);
}

static void shm_destroy(ddp__tp *tp)
{
    shm *s = (shm *)tp;
    if (!s)
        return;
    if (s->slots && !s->failed) {
        /* Goodbye, unless a send is half-done (the peer must see a failure:
         * its buffer may be about to be pulled from a dead address). */
        int clean = 1;
        for (int r = 0; r < s->base.size; r++)
            if (r != s->base.rank && (s->peers[r].sq_head || s->peers[r].cq_head))
                clean = 0;
        seg_slot *me = &s->slots[s->base.rank];
        if (!clean)
            snprintf(me->why, sizeof me->why, "rank %d destroyed its group with sends in flight",
                     s->base.rank);
        atomic_store_explicit(&me->state, clean ? S_LEFT : S_ABORTED, memory_order_release);
        for (int r = 0; r < s->base.size; r++)
            if (r != s->base.rank)
                notify(s, r);
    }
    for (int r = 0; s->peers && r < s->base.size; r++) {
        peer *p = &s->peers[r];
        if (p->pidfd >= 0)
            close(p->pidfd);
        if (p->rx_ux) {
            free(p->rx_ux->data);
            free(p->rx_ux);
        }
        free_unexp(p->ux_head);
    }
    ddp__sym_set_destroy(s->sym);
    if (s->map)
        munmap(s->map, s->map_len);
    free(s->win_slot);
    free(s->win_flag);
    free(s->peers);
    free(s);
}

/* ------------------------------------------------------------------ */
/* The shared window                                                    */
/* ------------------------------------------------------------------ */

static const ddp__window *shm_window(ddp__tp *tp)
{
    shm *s = (shm *)tp;
    return s->win.bytes ? &s->win : NULL;
}

static void shm_win_post(ddp__tp *tp, int k, uint64_t v)
{
    shm *s = (shm *)tp;
    atomic_store_explicit(&s->win_flag[s->base.rank][k].v, v, memory_order_release);
    /* As notify(), one fence for every peer: the flag before "sleeping". */
    atomic_thread_fence(memory_order_seq_cst);
    for (int r = 0; r < s->base.size; r++)
        if (r != s->base.rank)
            ring_bell(s, r);
}

/* A collective on the window cannot go on without every peer: the first
 * one that is down (died, gave up, left), or NULL. */
static const peer *win_down(shm *s)
{
    for (int r = 0; r < s->base.size; r++) {
        peer *p = &s->peers[r];
        /* One that left never posts again, whatever its ring still holds. */
        if (r != s->base.rank && p->state == P_LIVE &&
            atomic_load_explicit(&s->slots[r].state, memory_order_acquire) == S_LEFT)
            peer_down(s, p, P_LEFT, "left the group (destroyed its process group)");
    }
    return failed_peer(s); /* deaths first */
}

typedef struct {
    int (*ready)(void *arg); /* the window wait's condition: < 0 when met */
    void *arg;
} win_cond;

static int win_met(void *arg)
{
    const win_cond *c = arg;
    return c->ready(c->arg) < 0;
}

static int shm_win_wait(ddp__tp *tp, int (*ready)(void *arg), void *arg, double deadline)
{
    shm *s = (shm *)tp;
    double start = 0;
    unsigned spins = 0;
    for (;;) {
        int who = ready(arg);
        if (who < 0)
            return 0;
        if (++spins < 64) {
            cpu_relax();
            continue;
        }
        spins = 0;
        double now = ddp_time_now();
        if (start == 0)
            start = now;
        check_peers(s, 0);
        const peer *down = win_down(s);
        if (down)
            return fail_all(s, peer_error(down));
        if (now >= deadline)
            return fail_all(s, DDP_ERROR(DDP_ERR_TIMEOUT,
                                         "timed out after %.1f s waiting for %s in a "
                                         "shared-memory collective",
                                         now - start, s->peers[who].what));
        /* Spin, then sleep until a peer posts (shm_win_post wakes us: the
         * flag, then the fence, then "sleeping"; here "sleeping", the fence,
         * then a last look at the flags), a nap at most, to watch peers.
         * No sched_yield phase as in shm_wait: on a busy machine a yielding
         * rank stays runnable and loses its core for a whole time slice of
         * whatever runs instead, where a sleeper is woken by the post and
         * preempts at once (64 MiB, 2 ranks, other jobs running: 3.6 GB/s
         * with the yield phase, 5.9 without). */
        if (now - start < s->spin_s)
            continue;
        win_cond c = {ready, arg};
        double left = deadline - now;
        nap(s, left < SLEEP_MAX_S ? left : SLEEP_MAX_S, win_met, &c);
    }
}

/* ------------------------------------------------------------------ */
/* Symmetric memory (transport/symmetric.c)                             */
/* ------------------------------------------------------------------ */

static int shm_sym_make(ddp__tp *tp, size_t len, void **mine)
{
    shm *s = (shm *)tp;
    DDP_FAIL_IF(!s->sym, DDP_ERR_UNSUPPORTED, "symmetric memory needs a group of 2 or more ranks");
    return ddp__sym_make(s->sym, len, mine);
}

static int shm_sym_map(ddp__tp *tp, void *mine) { return ddp__sym_map(((shm *)tp)->sym, mine); }
static void shm_sym_seal(ddp__tp *tp, void *mine) { ddp__sym_seal(((shm *)tp)->sym, mine); }
static int shm_sym_drop(ddp__tp *tp, void *mine)
{
    shm *s = (shm *)tp;
    return s->sym ? ddp__sym_drop(s->sym, mine) : 0;
}

static uint8_t *const *shm_sym_find(ddp__tp *tp, const void *p, size_t len, size_t *off,
                                    unsigned *id)
{
    return ddp__sym_find(((shm *)tp)->sym, p, len, off, id);
}

static const ddp__tp_vtable shm_vtable = {
    .name = "shm",
    .isend = shm_isend,
    .irecv = shm_irecv,
    .wait = shm_wait,
    .abort = shm_abort,
    .destroy = shm_destroy,
    .window = shm_window,
    .win_post = shm_win_post,
    .win_wait = shm_win_wait,
    .sym_make = shm_sym_make,
    .sym_map = shm_sym_map,
    .sym_seal = shm_sym_seal,
    .sym_drop = shm_sym_drop,
    .sym_find = shm_sym_find,
};

/* ------------------------------------------------------------------ */
/* Setup                                                                */
/* ------------------------------------------------------------------ */

static int env_double(const char *name, double dflt, double *out)
{
    const char *v = getenv(name);
    *out = dflt;
    if (!v || !*v)
        return 0;
    char *end;
    double d = strtod(v, &end);
    DDP_FAIL_IF(*end || d < 0, DDP_ERR_INVALID_ARG, "%s='%s': expected a number >= 0", name, v);
    *out = d;
    return 0;
}

/* Ring bytes: a power of two, at least 4 KiB. */
static int ring_size(size_t *out)
{
    double v;
    DDP_TRY(env_double("DDP_SHM_RING_BYTES", DEFAULT_RING, &v));
    size_t want = (size_t)v, r = 4096;
    DDP_FAIL_IF(want < 4096 || want > ((size_t)1 << 30), DDP_ERR_INVALID_ARG,
                "DDP_SHM_RING_BYTES=%zu: expected 4096 to 1 GiB", want);
    while (r < want)
        r <<= 1;
    *out = r;
    return 0;
}

/* Window bytes per rank: 0 (no window) or whole pages, at most 1 GiB. */
static int window_size(size_t *out)
{
    double v;
    DDP_TRY(env_double("DDP_SHM_WINDOW_BYTES", DEFAULT_WINDOW, &v));
    DDP_FAIL_IF(v > (double)((size_t)1 << 30), DDP_ERR_INVALID_ARG,
                "DDP_SHM_WINDOW_BYTES=%.0f: expected 0 to 1 GiB", v);
    *out = align_up((size_t)v, 4096);
    return 0;
}

/* Waits until pred(s, r) holds for every rank r or the deadline passes
 * (naming the missing ranks, and noticing dead ones). */
static int seg_barrier(shm *s, int (*pred)(shm *, int), double deadline, const char *what,
                       double timeout_s)
{
    int n = s->base.size;
    unsigned char *missing = malloc((size_t)n);
    DDP_FAIL_IF(!missing, DDP_ERR_NOMEM, "out of memory");
    int rc = 0;
    useconds_t pause = 20;
    for (;;) {
        int left = 0;
        for (int r = 0; r < n; r++)
            left += missing[r] = !pred(s, r);
        if (!left)
            break;
        for (int r = 0; r < n; r++) {
            peer *p = &s->peers[r];
            if (missing[r] && p->pid > 0 && kill(p->pid, 0) < 0 && errno == ESRCH) {
                rc = DDP_ERROR(DDP_ERR_PEER, "%s died during shared-memory setup", p->what);
                goto out;
            }
        }
        if (ddp_time_now() >= deadline) {
            char who[256];
            ddp__format_ranks(who, sizeof who, missing, n);
            rc = DDP_ERROR(DDP_ERR_TIMEOUT, "%s did not %s within %.1f s", who, what, timeout_s);
            goto out;
        }
        usleep(pause);
        if (pause < 5000)
            pause *= 2;
    }
out:
    free(missing);
    return rc;
}

static int is_attached(shm *s, int r)
{
    return atomic_load_explicit(&s->slots[r].pid, memory_order_acquire) != 0;
}

static int has_probed(shm *s, int r)
{
    return atomic_load_explicit(&s->slots[r].cma, memory_order_acquire) != 0;
}

/* Can this rank read every peer's memory?  (Yama, seccomp and containers
 * may forbid process_vm_readv.)  Off unless DDP_SHM_CMA=1: in the VMs
 * measured so far (docs/shm.md) pinning the sender's pages makes a pull
 * slower than the two copies through the ring. */
static int probe_cma(shm *s)
{
    const char *env = getenv("DDP_SHM_CMA");
    if (!env || strcmp(env, "1") != 0)
        return 0;
    for (int r = 0; r < s->base.size; r++) {
        if (r == s->base.rank)
            continue;
        uint64_t got = 0;
        struct iovec l = {&got, sizeof got};
        struct iovec rem = {(void *)(uintptr_t)s->slots[r].probe_addr, sizeof got};
        if (process_vm_readv(s->peers[r].pid, &l, 1, &rem, 1, 0) != (ssize_t)sizeof got ||
            got != s->slots[r].probe_val) {
            DDP_DEBUG("shm rank %d: no cross-memory attach to rank %d: %s", s->base.rank, r,
                      strerror(errno));
            return 0;
        }
    }
    return 1;
}

/* Rank 0: creates the segment under a fresh random name. */
static int seg_create(shm *s, size_t len, int *fd)
{
    uint8_t rnd[8];
    DDP_TRY(ddp__random_bytes(rnd, sizeof rnd));
    int n = snprintf(s->name, sizeof s->name, "/ddp-%d-", (int)getpid());
    for (int i = 0; i < 8; i++)
        n += snprintf(s->name + n, sizeof s->name - (size_t)n, "%02x", rnd[i]);
    *fd = shm_open(s->name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    DDP_FAIL_IF(*fd < 0, DDP_ERR_SYSTEM, "shm_open(%s): %s (set DDP_TRANSPORT=tcp to avoid "
                "shared memory)", s->name, strerror(errno));
    if (ftruncate(*fd, (off_t)len) < 0) {
        int e = errno;
        shm_unlink(s->name);
        return DDP_ERROR_ERRNO(DDP_ERR_SYSTEM, e, "ftruncate(%s, %zu)", s->name, len);
    }
    /* tmpfs reserves nothing at ftruncate: a /dev/shm too small for the
     * segment fails here, not by SIGBUS at some rank's first write. */
    int e = posix_fallocate(*fd, 0, (off_t)len);
    if (e != 0) {
        shm_unlink(s->name);
        return DDP_ERROR_ERRNO(DDP_ERR_SYSTEM, e,
                               "fallocate(%s, %zu) (/dev/shm too small? lower "
                               "DDP_SHM_RING_BYTES or DDP_SHM_WINDOW_BYTES, or set "
                               "DDP_TRANSPORT=tcp)",
                               s->name, len);
    }
    return 0;
}

static int seg_open(shm *s, ddp_store_t *store, const char *key, double deadline, size_t len,
                    int *fd)
{
    const char *keys[1] = {key};
    double left = deadline - ddp_time_now();
    int rc = ddp_store_wait(store, keys, 1, left > 0 ? left : 0.001);
    if (rc < 0)
        return ddp__error_context(rc, "rank %d waiting for rank 0's shared-memory segment",
                                  s->base.rank);
    void *val = NULL;
    size_t vlen = 0;
    DDP_TRY(ddp_store_get(store, key, &val, &vlen));
    snprintf(s->name, sizeof s->name, "%.*s", (int)vlen, (const char *)val);
    free(val);
    *fd = shm_open(s->name, O_RDWR | O_CLOEXEC, 0);
    DDP_FAIL_IF(*fd < 0, DDP_ERR_SYSTEM,
                "shm_open(%s): %s (is rank 0 on this host? set DDP_HOST_ID or DDP_TRANSPORT=tcp)",
                s->name, strerror(errno));
    struct stat st;
    DDP_FAIL_IF(fstat(*fd, &st) < 0 || (size_t)st.st_size != len, DDP_ERR_MISMATCH,
                "shared-memory segment %s has %lld bytes where %zu were expected (ranks "
                "disagree on world size, DDP_SHM_RING_BYTES or DDP_SHM_WINDOW_BYTES?)",
                s->name, (long long)st.st_size, len);
    return 0;
}

int ddp__shm_create(ddp_store_t *store, const char *prefix, int rank, int size,
                    double timeout_s, ddp__tp **out)
{
    int rc = 0, fd = -1, unlinked = 0;
    shm *s = NULL;
    *out = NULL;
    DDP_FAIL_IF(size < 1, DDP_ERR_INVALID_ARG, "world size %d must be at least 1", size);
    DDP_FAIL_IF(rank < 0 || rank >= size, DDP_ERR_INVALID_ARG,
                "rank %d out of range for world size %d", rank, size);
    double deadline = ddp_time_now() + timeout_s;
    s = calloc(1, sizeof *s);
    DDP_FAIL_OUT(!s, DDP_ERR_NOMEM, "out of memory");
    s->base.vt = &shm_vtable;
    s->base.rank = rank;
    s->base.size = size;
    s->first_dead = -1;
    double v;
    DDP_TRY_OUT(env_double("DDP_SHM_SPIN_US", DEFAULT_SPIN_US, &s->spin_s));
    DDP_TRY_OUT(env_double("DDP_SHM_YIELD_US", DEFAULT_YIELD_US, &s->yield_s));
    s->spin_s *= 1e-6;
    s->yield_s *= 1e-6;
    DDP_TRY_OUT(env_double("DDP_SHM_CMA_BYTES", DEFAULT_CMA_MIN, &v));
    s->cma_min = v < 1 ? 1 : (size_t)v;
    size_t ring = 0, window = 0;
    DDP_TRY_OUT(ring_size(&ring));
    DDP_TRY_OUT(window_size(&window));
    /* The segment needs no secret (mode 0600, a random name known only
     * through the store), but a broken DDP_SECRET_FILE fails here as it
     * would over TCP: configuration errors must not depend on placement. */
    uint8_t *secret = NULL;
    size_t secret_len = 0;
    DDP_TRY_OUT(ddp__secret_load(&secret, &secret_len));
    if (secret) {
        memset(secret, 0, secret_len);
        free(secret);
    }
    s->ring_bytes = ring;
    s->mask = ring - 1;
    s->peers = calloc((size_t)size, sizeof *s->peers);
    DDP_FAIL_OUT(!s->peers, DDP_ERR_NOMEM, "out of memory");
    for (int r = 0; r < size; r++) {
        s->peers[r].rank = r;
        s->peers[r].pidfd = -1;
        s->peers[r].state = P_LIVE;
        s->peers[r].err = DDP_ERR_PEER;
        snprintf(s->peers[r].what, sizeof s->peers[r].what, "rank %d", r);
    }
    if (size == 1) { /* nobody to talk to */
        *out = &s->base;
        return 0;
    }

    /* Phase 1: rank 0 creates the segment and publishes its name; the
     * others map it. */
    seg_off o;
    size_t len = seg_layout(size, ring, window, &o);
    char key[300];
    snprintf(key, sizeof key, "%s/shm/segment", prefix);
    if (rank == 0)
        DDP_TRY_OUT(seg_create(s, len, &fd));
    else
        DDP_TRY_OUT(seg_open(s, store, key, deadline, len, &fd));
    s->map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    DDP_FAIL_OUT(s->map == MAP_FAILED, DDP_ERR_SYSTEM, "mmap of %zu bytes of %s: %s", len,
                 s->name, strerror(errno));
    s->map_len = len;
    s->hdr = (seg_hdr *)s->map;
    s->slots = (seg_slot *)(s->map + o.slots);
    s->bells = (seg_bell *)(s->map + o.bells);
    if (rank == 0) {
        s->hdr->version = SEG_VERSION;
        s->hdr->size = (uint32_t)size;
        s->hdr->ring_bytes = ring;
        s->hdr->window_bytes = window;
        s->hdr->total_bytes = len;
        atomic_thread_fence(memory_order_release);
        s->hdr->magic = SEG_MAGIC;
        DDP_TRY_OUT(ddp_store_set(store, key, s->name, strlen(s->name)));
    } else {
        atomic_thread_fence(memory_order_acquire);
        DDP_FAIL_OUT(s->hdr->magic != SEG_MAGIC || s->hdr->version != SEG_VERSION ||
                         s->hdr->size != (uint32_t)size || s->hdr->ring_bytes != ring ||
                         s->hdr->window_bytes != window,
                     DDP_ERR_MISMATCH,
                     "shared-memory segment %s does not match (size %u, ring %llu, window %llu; "
                     "this rank: %d, %zu, %zu)",
                     s->name, s->hdr->size, (unsigned long long)s->hdr->ring_bytes,
                     (unsigned long long)s->hdr->window_bytes, size, ring, window);
    }
    for (int r = 0; r < size; r++) {
        peer *p = &s->peers[r];
        ring_ctl *ctl = (ring_ctl *)(s->map + o.ctl);
        p->tx = &ctl[rank * size + r];
        p->tx_data = s->map + o.data + (size_t)(rank * size + r) * ring;
        p->rx_ring = &ctl[r * size + rank];
        p->rx_data = s->map + o.data + (size_t)(r * size + rank) * ring;
    }
    if (window) {
        s->win_slot = calloc((size_t)size, sizeof *s->win_slot);
        s->win_flag = calloc((size_t)size, sizeof *s->win_flag);
        DDP_FAIL_OUT(!s->win_slot || !s->win_flag, DDP_ERR_NOMEM, "out of memory");
        for (int r = 0; r < size; r++) {
            s->win_slot[r] = s->map + o.win + (size_t)r * window;
            s->win_flag[r] = (ddp__win_flag *)(s->map + o.wflag) + (size_t)r * DDP__WIN_FLAGS;
        }
        s->win.bytes = window;
        s->win.slot = s->win_slot;
        s->win.flag = s->win_flag;
    }

    /* Phase 2: announce ourselves, wait for everyone, unlink the name. */
    uint8_t rnd[8];
    DDP_TRY_OUT(ddp__random_bytes(rnd, sizeof rnd));
    memcpy((void *)&s->probe, rnd, sizeof rnd);
    seg_slot *me = &s->slots[rank];
    me->probe_addr = (uint64_t)(uintptr_t)&s->probe;
    me->probe_val = s->probe;
    atomic_store_explicit(&me->pid, (int32_t)getpid(), memory_order_release);
    atomic_fetch_add_explicit(&s->hdr->attached, 1, memory_order_acq_rel);
    rc = seg_barrier(s, is_attached, deadline, "attach to the shared-memory segment", timeout_s);
    shm_unlink(s->name); /* everyone tries; all but one get ENOENT */
    unlinked = 1;
    if (rc < 0)
        goto out;
    for (int r = 0; r < size; r++) {
        peer *p = &s->peers[r];
        if (r == rank)
            continue;
        p->pid = (pid_t)atomic_load_explicit(&s->slots[r].pid, memory_order_acquire);
        snprintf(p->what, sizeof p->what, "rank %d (pid %d)", r, (int)p->pid);
        p->pidfd = (int)syscall(SYS_pidfd_open, p->pid, 0);
    }

    /* Phase 3: may large messages be pulled?  Each rank probes every peer;
     * a sender pulls-by-RTS to peers that can read everyone. */
    atomic_store_explicit(&me->cma, probe_cma(s) ? 1u : 2u, memory_order_release);
    DDP_TRY_OUT(seg_barrier(s, has_probed, deadline, "finish shared-memory setup", timeout_s));
    for (int r = 0; r < size; r++)
        s->peers[r].cma = atomic_load_explicit(&s->slots[r].cma, memory_order_acquire) == 1;
    DDP_TRY_OUT(ddp__sym_set_create(s->name, rank, size, &s->sym));
    DDP_DEBUG("shm rank %d: segment %s, %zu bytes, ring %zu, cma %d", rank, s->name, len, ring,
              s->peers[(rank + 1) % size].cma);
    *out = &s->base;
    s = NULL;
out:
    if (fd >= 0)
        close(fd);
    if (s && !unlinked && s->name[0])
        shm_unlink(s->name); /* failed before everyone attached: nothing stays behind */
    if (s && s->slots && rc < 0) {
        abort_all(s, ddp_last_error());
    }
    shm_destroy(s ? &s->base : NULL);
    return rc;
}

const char *ddp__shm_debug_name(ddp__tp *tp)
{
    return tp && strcmp(tp->vt->name, "shm") == 0 ? ((shm *)tp)->name : NULL;
}
