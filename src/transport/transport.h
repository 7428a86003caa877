/* The transport interface: what collective algorithms see of the network
 * (gloo's transport::Pair, libuv's stream vtable; STYLE.md rule 10).
 *
 * A transport connects the ranks of one group and moves tagged byte buffers
 * between them.  Operations are asynchronous: isend/irecv post a request
 * (memory owned by the caller, usually the algorithm's stack, which must stay
 * valid until the request completes or the transport is aborted) and
 * ddp__tp_wait drives progress until the requests complete.
 *
 * A transport is single-threaded by contract: the process group guarantees
 * that exactly one thread (the "executor") calls into it at a time.
 *
 * Matching: a receive from peer P with tag T takes the oldest message from P
 * with tag T; its length must equal the posted length (a mismatch is a
 * protocol error naming the peer: ranks disagree about a collective).
 */
#ifndef DDP_TRANSPORT_TRANSPORT_H
#define DDP_TRANSPORT_TRANSPORT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ddp__tp ddp__tp;

enum { DDP__REQ_SEND = 1, DDP__REQ_RECV = 2 };

/* One posted send or receive.  The algorithm fills peer, tag, buf, len;
 * the transport owns the rest until status leaves 0. */
typedef struct ddp__req {
    int kind;       /* DDP__REQ_SEND or DDP__REQ_RECV */
    int peer;       /* rank in the group */
    uint64_t tag;
    void *buf;      /* source (send) or destination (recv) */
    size_t len;
    /* transport-private */
    size_t done;    /* bytes moved so far */
    int status;     /* 0 pending, 1 complete, <0 failed (DDP_ERR_*) */
    struct ddp__req *next;
} ddp__req;

/* Wait modes: a collective fails as soon as any peer of the group dies (all
 * ranks take part in it); a point-to-point wait only cares about its peers. */
enum { DDP__WAIT_ANY_PEER = 1 };

typedef struct ddp__tp_vtable {
    const char *name;
    int (*isend)(ddp__tp *tp, ddp__req *req);
    int (*irecv)(ddp__tp *tp, ddp__req *req);
    /* Drives progress until all n requests complete, deadline (ddp_time_now()
     * seconds) passes, or a peer fails.  On failure the message names the
     * peer and the transport stays failed: later calls fail at once. */
    int (*wait)(ddp__tp *tp, ddp__req *const *reqs, int n, double deadline, int flags);
    /* Drops every pending request (after a failure; the memory they point to
     * may go away).  The transport stays failed. */
    void (*abort)(ddp__tp *tp, int code, const char *why);
    void (*destroy)(ddp__tp *tp);

    /* ---- optional: memory shared by the ranks (NULL where not offered) ----
     * A transport whose ranks share an address range (shm) offers a window:
     * per rank a slot of bytes that every rank maps, and per rank
     * DDP__WIN_FLAGS counters that only their owner advances.  Algorithms
     * that reduce straight out of their peers' memory are written against
     * it (coll/allreduce_shared.c); tcp leaves them NULL. */
    /* The window (same layout on every rank), or NULL when this group has
     * none. */
    const struct ddp__window *(*window)(ddp__tp *tp);
    /* Publishes this rank's flag k = v (release: what the rank wrote before
     * is visible to a peer that sees v) and wakes peers asleep in win_wait. */
    void (*win_post)(ddp__tp *tp, int k, uint64_t v);
    /* Waits until ready(arg) returns -1 (ready); otherwise it returns the
     * rank it waits for, named in the timeout message.  Spins, yields, then
     * sleeps until a peer posts; fails when the deadline passes or any peer
     * of the group dies, gives up or leaves (the transport then stays
     * failed, as after wait). */
    int (*win_wait)(ddp__tp *tp, int (*ready)(void *arg), void *arg, double deadline);

    /* ---- optional: symmetric memory (shm; NULL elsewhere) ----
     * Allocations every rank makes at the same point, each rank's region
     * mapped by every rank (transport/symmetric.h): the steps of one
     * allocation, each local, which the caller separates by an exchange of
     * their outcomes, dropping the allocation everywhere when a rank failed
     * (pg/backend.c). */
    int (*sym_make)(ddp__tp *tp, size_t len, void **mine);
    int (*sym_map)(ddp__tp *tp, void *mine);
    void (*sym_seal)(ddp__tp *tp, void *mine);
    /* 1 when mine was an allocation (now unmapped here), else 0. */
    int (*sym_drop)(ddp__tp *tp, void *mine);
    /* Every rank's region of the sealed allocation holding [p, p + len) of
     * this rank's memory, p at *off in each, *id the allocation's number
     * (equal on every rank); NULL when p is not in one. */
    uint8_t *const *(*sym_find)(ddp__tp *tp, const void *p, size_t len, size_t *off,
                                unsigned *id);
} ddp__tp_vtable;

/* The shared window of a transport that has one (see the vtable). */
#define DDP__WIN_FLAGS 4 /* the shared-window all-reduce uses all four */
typedef struct ddp__win_flag {
    _Atomic uint64_t v;
} __attribute__((aligned(64))) ddp__win_flag; /* one cache line each */

typedef struct ddp__window {
    size_t bytes;                 /* per rank slot, a multiple of 4096 */
    uint8_t *const *slot;         /* slot[q]: rank q's bytes, page aligned */
    ddp__win_flag *const *flag;   /* flag[q][k], k < DDP__WIN_FLAGS: rank q's */
} ddp__window;

/* Common head of every transport. */
struct ddp__tp {
    const ddp__tp_vtable *vt;
    int rank;
    int size;
};

static inline void ddp__req_init(ddp__req *r, int kind, int peer, uint64_t tag, void *buf,
                                 size_t len)
{
    r->kind = kind;
    r->peer = peer;
    r->tag = tag;
    r->buf = buf;
    r->len = len;
    r->done = 0;
    r->status = 0;
    r->next = NULL;
}

static inline int ddp__tp_isend(ddp__tp *tp, ddp__req *r, int peer, uint64_t tag,
                                const void *buf, size_t len)
{
    ddp__req_init(r, DDP__REQ_SEND, peer, tag, (void *)buf, len);
    return tp->vt->isend(tp, r);
}

static inline int ddp__tp_irecv(ddp__tp *tp, ddp__req *r, int peer, uint64_t tag, void *buf,
                                size_t len)
{
    ddp__req_init(r, DDP__REQ_RECV, peer, tag, buf, len);
    return tp->vt->irecv(tp, r);
}

static inline int ddp__tp_wait(ddp__tp *tp, ddp__req *const *reqs, int n, double deadline,
                               int flags)
{
    return tp->vt->wait(tp, reqs, n, deadline, flags);
}

static inline int ddp__tp_wait1(ddp__tp *tp, ddp__req *r, double deadline, int flags)
{
    return tp->vt->wait(tp, &r, 1, deadline, flags);
}

static inline void ddp__tp_abort(ddp__tp *tp, int code, const char *why)
{
    tp->vt->abort(tp, code, why);
}

/* The shared window, or NULL (transport without one, or none for this group). */
static inline const ddp__window *ddp__tp_window(ddp__tp *tp)
{
    return tp->vt->window ? tp->vt->window(tp) : NULL;
}

/* The regions of symmetric memory holding [p, p + len), or NULL (see the
 * vtable). */
static inline uint8_t *const *ddp__tp_sym_find(ddp__tp *tp, const void *p, size_t len,
                                               size_t *off, unsigned *id)
{
    return tp->vt->sym_find ? tp->vt->sym_find(tp, p, len, off, id) : NULL;
}

static inline void ddp__tp_win_post(ddp__tp *tp, int k, uint64_t v)
{
    tp->vt->win_post(tp, k, v);
}

static inline int ddp__tp_win_wait(ddp__tp *tp, int (*ready)(void *arg), void *arg,
                                   double deadline)
{
    return tp->vt->win_wait(tp, ready, arg, deadline);
}

static inline void ddp__tp_destroy(ddp__tp *tp)
{
    if (tp)
        tp->vt->destroy(tp);
}

#endif
