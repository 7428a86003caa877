/* The point-to-point matching engine that both transports (tcp, shm) run:
 * which posted receive a message goes to, what happens to a message that
 * nobody waits for yet, and how failures reach every request.  A transport
 * moves bytes (frames on a socket, messages in a ring) and calls in here at
 * each message boundary; it never keeps request queues of its own.
 * (MPI's matching queues; gloo's transport/tcp pair does the same per pair.)
 *
 * The contract:
 *
 * - Requests.  The caller owns every ddp__req and the memory it points to;
 *   the engine borrows them, links them through req->next, and owns the
 *   rest of the request (done, status, next) until status leaves 0.  A send
 *   is queued on its peer (sq) in order; a transport that hands a send over
 *   before it is finished (shm's RTS: the peer pulls the buffer) moves it to
 *   cq until the peer acknowledges it.  A receive is matched at once or
 *   posted (pq).  Matching: the oldest message from the peer with the tag;
 *   its length must equal the posted length, else "sent N bytes for tag T
 *   where M were expected" (DDP_ERR_PROTOCOL, the peer is taken down).
 * - A message that arrives before its receive (ddp__match_arrive finds no
 *   posted receive) is copied into a malloc'ed unexpected buffer when it is
 *   small (at most DDP__MATCH_EAGER bytes) or when a receive posted on the
 *   same peer sits behind it (tcp: the buffer grows with the bytes that
 *   arrive, never to a header's claimed length at once); a larger one is held: the transport stops
 *   reading that peer (the bytes stay in the kernel's socket buffer, or in
 *   the ring, and the sender is backed up) until its receive is posted, so
 *   that a fast peer's next chunk never costs a copy.  A receive posted
 *   behind a held message of another tag, or a transport that must unblock
 *   (tcp: the socket closed; shm: stuck long enough that the sender may be
 *   waiting for us), copies the held message out (ddp__match_buffer).  An
 *   unexpected message of a peer that left is still delivered; one of a peer
 *   that died is dropped with it.
 * - Peer down (ddp__match_down): the peer's reason becomes "<what><sep>
 *   <reason>" ("rank 1 (10.0.0.4:29500): connection closed ...", "rank 1
 *   (pid 1234) died ..."), every request involving it fails with
 *   DDP_ERR_PEER, and the transport's down hook releases what it holds (tcp
 *   closes the socket).  A death (DEAD) counts: the first dead peer is the
 *   cause that collective waits name.  LEFT (it destroyed its group) and
 *   ABORTED (this rank gave up) are no news of their own.
 * - Waits (ddp__match_poll): a failed request fails the wait, naming for a
 *   collective (DDP__WAIT_ANY_PEER) the first peer that died, else the
 *   request's own peer; a collective also fails as soon as any peer died.
 *   At the deadline, ddp__match_timeout: "timed out after S s waiting for
 *   <what> (D of L bytes)" or "... sending to <what> ...".
 * - Fail-all: every error returned to the caller first runs
 *   ddp__match_fail_all: the transport's give_up hook tells the live peers
 *   why ("rank R: <the error>"; tcp: an ABORT frame, shm: its slot), they
 *   are taken down (ABORTED), and every request is dropped while its memory
 *   is still valid.  The transport stays failed: later calls fail at once.
 *
 * Cost per message: the matching calls here are direct calls; the engine
 * allocates only for unexpected copies (as each transport did) and calls
 * the hooks only on failure. */
#ifndef DDP_TRANSPORT_MATCH_H
#define DDP_TRANSPORT_MATCH_H

#include <stddef.h>
#include <stdint.h>

#include "transport/transport.h"

#define DDP__MATCH_EAGER (64u << 10) /* unexpected messages up to this are copied at once */
#define DDP__MATCH_CHUNK (1u << 20)  /* first piece of a growing unexpected buffer */
#define DDP__MATCH_WHAT 300          /* "rank 3 (10.0.0.4:29500)" */
#define DDP__MATCH_REASON 1100       /* bytes of a peer's reason, at most */
#define DDP__MATCH_WHY (DDP__MATCH_WHAT + 8 + DDP__MATCH_REASON) /* what, sep, reason */
#define DDP__MATCH_ABORT 1024        /* bytes of the reason this rank gives its peers */

enum { DDP__RX_HDR, DDP__RX_BODY, DDP__RX_HELD };                               /* peer.rx */
enum { DDP__PEER_LIVE, DDP__PEER_LEFT, DDP__PEER_DEAD, DDP__PEER_ABORTED }; /* peer.state */

typedef struct ddp__match_unexp {
    uint64_t tag;
    size_t len;
    uint8_t *data;
    struct ddp__match_unexp *next;
} ddp__match_unexp;

/* The engine's part of a peer: the first member of each transport's peer
 * struct (ddp__match_init allocates the transport's structs). */
typedef struct ddp__match_peer {
    int rank;
    int state;                   /* DDP__PEER_* */
    int err;                     /* code of the failure when not live */
    char what[DDP__MATCH_WHAT];  /* names the peer in messages */
    char why[DDP__MATCH_WHY];    /* the failure, when not live */
    ddp__req *sq_head, *sq_tail; /* sends in order; the transport moves the head */
    ddp__req *cq_head, *cq_tail; /* sends handed over, waiting for the peer's ack */
    ddp__req *pq_head, *pq_tail; /* posted receives */
    ddp__match_unexp *ux_head, *ux_tail; /* messages that came before their receive */
    /* the message in progress (rx != HDR) */
    int rx;                      /* DDP__RX_* */
    uint64_t rx_tag;
    size_t rx_len, rx_off;       /* rx_off: the transport's count of bytes moved */
    size_t rx_cap;               /* bytes of the destination there are (see grow) */
    ddp__req *rx_req;            /* BODY: into this receive ... */
    ddp__match_unexp *rx_ux;     /* ... or into this unexpected buffer */
} ddp__match_peer;

/* What the receive side did with messages that came before their receive. */
typedef struct ddp__match_stats {
    uint64_t copied_frames, copied_bytes, held_frames;
} ddp__match_stats;

typedef struct ddp__match ddp__match;

/* What a transport plugs in: its words, and two hooks, run on failure only. */
typedef struct ddp__match_ops {
    const char *name;    /* "tcp", in log lines */
    const char *sep;     /* between a peer's what and its reason: ": " or " " */
    size_t reason_max;   /* bytes of a peer's reason kept, with the NUL */
    const char *aborted; /* a peer's reason once this rank gave up */
    /* Unexpected buffers grow as the bytes come (ddp__match_grow) instead of
     * taking the length a header claims at once: for a transport whose
     * frames come from a socket, where a broken or hostile peer's header
     * must not cost gigabytes before its bytes arrive.  (shm: 0; its peers
     * share our memory, and it reads a message whole.) */
    int grow;
    /* This rank gives up (before its live peers are taken down): tell them. */
    void (*give_up)(ddp__match *m, const char *why);
    /* p was taken out of service (may be NULL): release what is held for it. */
    void (*down)(ddp__match *m, ddp__match_peer *p);
} ddp__match_ops;

struct ddp__match {
    const ddp__match_ops *ops;
    int rank, size;
    void *peers;        /* size structs of stride bytes, each starting with a ddp__match_peer */
    size_t stride;
    int ndead;          /* peers that died (DEAD) */
    int first_dead;     /* the peer that died first: the cause, usually; -1 */
    ddp__match_stats stats;
};

/* Allocates size peers of peer_bytes each (zeroed; the engine's part: rank
 * r, live, what "rank r").  0, or DDP_ERR_NOMEM. */
int ddp__match_init(ddp__match *m, const ddp__match_ops *ops, int rank, int size,
                    size_t peer_bytes);
/* Frees the unexpected buffers and the peers (not the requests: the callers'). */
void ddp__match_destroy(ddp__match *m);

static inline ddp__match_peer *ddp__match_peer_at(const ddp__match *m, int r)
{
    return (ddp__match_peer *)((uint8_t *)m->peers + (size_t)r * m->stride);
}

/* Takes p out of service (see the contract; nothing when it is not live). */
__attribute__((format(printf, 4, 5)))
void ddp__match_down(ddp__match *m, ddp__match_peer *p, int state, const char *fmt, ...);
/* Sets the last error to p's failure; returns its code. */
int ddp__match_peer_error(const ddp__match_peer *p);
/* The peer that died first, else any one that is down, else NULL. */
const ddp__match_peer *ddp__match_failed(const ddp__match *m);
/* 0 when rank is a live peer, else an error naming what ("send"). */
int ddp__match_check_peer(const ddp__match *m, int rank, const char *what);

/* Fail-all with this rank's last error as the reason; returns rc. */
int ddp__match_fail_all(ddp__match *m, int rc);
/* Fail-all with the reason why (the transport's abort). */
void ddp__match_abort(ddp__match *m, const char *why);

/* Queues send r; 1 when it heads its peer's queue (the transport starts
 * it), 0 when it waits behind others, < 0 failed (fail-all done). */
int ddp__match_isend(ddp__match *m, ddp__req *r);
/* Matches receive r (an unexpected message, the held message) or posts it;
 * 0, or < 0 failed (fail-all done).  When p->rx was HELD it is BODY now:
 * into r, or the held message is being copied out of the way. */
int ddp__match_irecv(ddp__match *m, ddp__req *r);

/* A message's header arrived (tag, len): rx becomes BODY (into rx_req, or
 * copied into rx_ux) or HELD.  0, or < 0 with the peer down (a length
 * mismatch, out of memory). */
int ddp__match_arrive(ddp__match *m, ddp__match_peer *p, uint64_t tag, size_t len);
/* The message in progress goes into a fresh unexpected buffer (rx_ux,
 * BODY); 0, or < 0 with the peer down (out of memory).  With ops->grow the
 * buffer holds at most DDP__MATCH_CHUNK bytes at first (rx_cap). */
int ddp__match_buffer(ddp__match *m, ddp__match_peer *p);
/* rx_off reached rx_cap before rx_len: the unexpected buffer doubles (at
 * most to rx_len), so that what is allocated stays within twice what
 * arrived.  0, or < 0 with the peer down (out of memory). */
int ddp__match_grow(ddp__match *m, ddp__match_peer *p);
/* The message in progress is whole: its receive completes, or it is
 * delivered to one posted meanwhile, or it joins the unexpected ones. */
void ddp__match_done(ddp__match *m, ddp__match_peer *p);

/* Where the body in progress goes. */
static inline uint8_t *ddp__match_dst(const ddp__match_peer *p)
{
    return p->rx_req ? (uint8_t *)p->rx_req->buf : p->rx_ux->data;
}

int ddp__match_wait_failed(ddp__match *m, const ddp__req *r, int flags);

/* A wait's look at its requests: 0 all complete, 1 some pending, < 0 the
 * wait fails (fail-all done).  Inline: shm's wait spins on it. */
static inline int ddp__match_poll(ddp__match *m, ddp__req *const *reqs, int n, int flags)
{
    int pending = 0;
    for (int i = 0; i < n; i++) {
        if (reqs[i]->status < 0)
            return ddp__match_wait_failed(m, reqs[i], flags);
        pending += reqs[i]->status == 0;
    }
    if (!pending)
        return 0;
    if ((flags & DDP__WAIT_ANY_PEER) && m->ndead)
        return ddp__match_fail_all(m, ddp__match_peer_error(ddp__match_failed(m)));
    return 1;
}

/* The deadline passed after waited seconds: fail-all with the message. */
int ddp__match_timeout(ddp__match *m, ddp__req *const *reqs, int n, double waited);

#endif
