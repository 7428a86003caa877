/* The point-to-point matching engine of tcp and shm; the contract is in
 * match.h. */
#include "transport/match.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"

int ddp__match_init(ddp__match *m, const ddp__match_ops *ops, int rank, int size,
                    size_t peer_bytes)
{
    memset(m, 0, sizeof *m);
    m->ops = ops;
    m->rank = rank;
    m->size = size;
    m->first_dead = -1;
    m->stride = peer_bytes;
    m->peers = calloc((size_t)size, peer_bytes);
    DDP_FAIL_IF(!m->peers, DDP_ERR_NOMEM, "out of memory");
    for (int r = 0; r < size; r++) {
        ddp__match_peer *p = ddp__match_peer_at(m, r);
        p->rank = r;
        p->state = DDP__PEER_LIVE;
        p->err = DDP_ERR_PEER;
        snprintf(p->what, sizeof p->what, "rank %d", r);
    }
    return 0;
}

static void free_unexp(ddp__match_unexp *u)
{
    while (u) {
        ddp__match_unexp *next = u->next;
        free(u->data);
        free(u);
        u = next;
    }
}

void ddp__match_destroy(ddp__match *m)
{
    for (int r = 0; m->peers && r < m->size; r++) {
        ddp__match_peer *p = ddp__match_peer_at(m, r);
        free_unexp(p->rx_ux);
        free_unexp(p->ux_head);
    }
    free(m->peers);
    m->peers = NULL;
}

/* ------------------------------------------------------------------ */
/* Failure                                                              */
/* ------------------------------------------------------------------ */

static void fail_list(ddp__req *r, int code)
{
    while (r) {
        ddp__req *next = r->next;
        r->status = code;
        r->next = NULL;
        r = next;
    }
}

/* Fails the peer's queued requests and forgets them (not its receive in
 * progress: peer_down fails that one). */
static void drop_requests(ddp__match_peer *p)
{
    fail_list(p->sq_head, p->err);
    fail_list(p->cq_head, p->err);
    fail_list(p->pq_head, p->err);
    p->sq_head = p->sq_tail = p->cq_head = p->cq_tail = p->pq_head = p->pq_tail = NULL;
    p->rx_req = NULL;
}

/* The peer goes down with err (DDP_ERR_PEER, or DDP_ERR_PROTOCOL for a
 * peer that broke the protocol): every wait on it fails with that code. */
static void peer_down(ddp__match *m, ddp__match_peer *p, int state, int err, const char *msg)
{
    if (p->state != DDP__PEER_LIVE)
        return;
    snprintf(p->why, sizeof p->why, "%s: %s%s%s", m->ops->name, p->what, m->ops->sep, msg);
    p->state = state;
    p->err = err;
    if (state == DDP__PEER_DEAD) {
        m->ndead++;
        if (m->first_dead < 0)
            m->first_dead = p->rank;
        DDP_WARN("%s rank %d: %s", m->ops->name, m->rank, p->why);
    } else {
        DDP_DEBUG("%s rank %d: %s", m->ops->name, m->rank, p->why);
    }
    if (m->ops->down)
        m->ops->down(m, p);
    if (p->rx_req)
        p->rx_req->status = p->err;
    drop_requests(p);
    free_unexp(p->rx_ux);
    p->rx_ux = NULL;
    /* What a departed peer sent before its goodbye is still to be had. */
    if (state != DDP__PEER_LEFT) {
        free_unexp(p->ux_head);
        p->ux_head = p->ux_tail = NULL;
    }
}

void ddp__match_down(ddp__match *m, ddp__match_peer *p, int state, const char *fmt, ...)
{
    if (p->state != DDP__PEER_LIVE)
        return;
    char msg[DDP__MATCH_REASON];
    size_t max = m->ops->reason_max < sizeof msg ? m->ops->reason_max : sizeof msg;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, max, fmt, ap);
    va_end(ap);
    peer_down(m, p, state, DDP_ERR_PEER, msg);
}

int ddp__match_peer_error(const ddp__match_peer *p)
{
    return DDP_ERROR(p->err, "%s", p->why);
}

const ddp__match_peer *ddp__match_failed(const ddp__match *m)
{
    if (m->first_dead >= 0)
        return ddp__match_peer_at(m, m->first_dead);
    for (int r = 0; r < m->size; r++)
        if (r != m->rank && ddp__match_peer_at(m, r)->state != DDP__PEER_LIVE)
            return ddp__match_peer_at(m, r);
    return NULL;
}

int ddp__match_check_peer(const ddp__match *m, int rank, const char *what)
{
    if (rank < 0 || rank >= m->size || rank == m->rank)
        return DDP_ERROR(DDP_ERR_INVALID_ARG, "%s: peer rank %d invalid for rank %d of %d", what,
                         rank, m->rank, m->size);
    const ddp__match_peer *p = ddp__match_peer_at(m, rank);
    if (p->state != DDP__PEER_LIVE)
        return ddp__error_context(ddp__match_peer_error(p), "%s", what);
    return 0;
}

void ddp__match_abort(ddp__match *m, const char *why)
{
    if (m->ops->give_up)
        m->ops->give_up(m, why);
    for (int r = 0; r < m->size; r++) {
        ddp__match_peer *p = ddp__match_peer_at(m, r);
        if (r == m->rank)
            continue;
        ddp__match_down(m, p, DDP__PEER_ABORTED, "%s", m->ops->aborted);
        drop_requests(p); /* also the requests of peers down before */
    }
}

int ddp__match_fail_all(ddp__match *m, int rc)
{
    char why[DDP__MATCH_ABORT];
    snprintf(why, sizeof why, "rank %d: %s", m->rank, ddp_last_error());
    ddp__match_abort(m, why);
    return rc;
}

static int len_mismatch(ddp__match *m, ddp__match_peer *p, uint64_t tag, uint64_t got,
                        size_t want)
{
    char msg[200];
    snprintf(msg, sizeof msg,
             "sent %" PRIu64 " bytes for tag 0x%" PRIx64 " where %zu were expected "
             "(do the ranks call the same collectives with the same sizes?)",
             got, tag, want);
    peer_down(m, p, DDP__PEER_DEAD, DDP_ERR_PROTOCOL, msg);
    return DDP_ERROR(DDP_ERR_PROTOCOL, "%s: %s", p->what, msg);
}

/* ------------------------------------------------------------------ */
/* Posting                                                              */
/* ------------------------------------------------------------------ */

int ddp__match_isend(ddp__match *m, ddp__req *r)
{
    int rc = ddp__match_check_peer(m, r->peer, "send");
    if (rc < 0)
        return ddp__match_fail_all(m, rc);
    ddp__match_peer *p = ddp__match_peer_at(m, r->peer);
    r->next = NULL;
    if (p->sq_tail) {
        p->sq_tail->next = r;
        p->sq_tail = r;
        return 0;
    }
    p->sq_head = p->sq_tail = r;
    return 1;
}

static void complete_from(ddp__req *r, ddp__match_unexp *u)
{
    if (u->len)
        memcpy(r->buf, u->data, u->len);
    r->done = u->len;
    r->status = 1;
    free(u->data);
    free(u);
}

int ddp__match_irecv(ddp__match *m, ddp__req *r)
{
    if (r->peer < 0 || r->peer >= m->size || r->peer == m->rank)
        return ddp__match_fail_all(m, ddp__match_check_peer(m, r->peer, "recv"));
    ddp__match_peer *p = ddp__match_peer_at(m, r->peer);
    /* An older buffered message with this tag comes first (also from a peer
     * that has left since). */
    ddp__match_unexp *prev = NULL;
    for (ddp__match_unexp *u = p->ux_head; u; prev = u, u = u->next) {
        if (u->tag != r->tag)
            continue;
        if (u->len != r->len) {
            r->status = DDP_ERR_PROTOCOL;
            return ddp__match_fail_all(m, len_mismatch(m, p, u->tag, u->len, r->len));
        }
        if (prev)
            prev->next = u->next;
        else
            p->ux_head = u->next;
        if (p->ux_tail == u)
            p->ux_tail = prev;
        complete_from(r, u);
        return 0;
    }
    int rc = ddp__match_check_peer(m, r->peer, "recv");
    if (rc < 0)
        return ddp__match_fail_all(m, rc);
    r->next = NULL;
    if (p->rx == DDP__RX_HELD) {
        if (p->rx_tag == r->tag) {
            if (p->rx_len != r->len) {
                r->status = DDP_ERR_PROTOCOL;
                return ddp__match_fail_all(m, len_mismatch(m, p, r->tag, p->rx_len, r->len));
            }
            p->rx_req = r;
            p->rx_cap = r->len;
            p->rx = DDP__RX_BODY;
            return 0;
        }
        /* This receive's message is behind the held one: copy the held one. */
        if (ddp__match_buffer(m, p) < 0)
            return ddp__match_fail_all(m, ddp__match_peer_error(p));
    }
    if (p->pq_tail)
        p->pq_tail->next = r;
    else
        p->pq_head = r;
    p->pq_tail = r;
    return 0;
}

/* ------------------------------------------------------------------ */
/* Arrivals                                                             */
/* ------------------------------------------------------------------ */

static ddp__req *take_posted(ddp__match_peer *p, uint64_t tag)
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

int ddp__match_buffer(ddp__match *m, ddp__match_peer *p)
{
    size_t cap = m->ops->grow && p->rx_len > DDP__MATCH_CHUNK ? DDP__MATCH_CHUNK : p->rx_len;
    ddp__match_unexp *u = calloc(1, sizeof *u);
    uint8_t *data = malloc(cap ? cap : 1);
    if (!u || !data) {
        free(u);
        free(data);
        ddp__match_down(m, p, DDP__PEER_DEAD, "out of memory buffering a %zu-byte message",
                        p->rx_len);
        return -1;
    }
    u->tag = p->rx_tag;
    u->len = p->rx_len;
    u->data = data;
    m->stats.copied_frames++;
    m->stats.copied_bytes += p->rx_len;
    p->rx_ux = u;
    p->rx_req = NULL;
    p->rx_cap = cap;
    p->rx = DDP__RX_BODY;
    return 0;
}

int ddp__match_grow(ddp__match *m, ddp__match_peer *p)
{
    size_t cap = p->rx_cap * 2;
    if (cap > p->rx_len || cap < p->rx_cap)
        cap = p->rx_len;
    uint8_t *data = realloc(p->rx_ux->data, cap);
    if (!data) {
        ddp__match_down(m, p, DDP__PEER_DEAD,
                        "out of memory buffering a %zu-byte message (%zu bytes in)", p->rx_len,
                        p->rx_off);
        return -1;
    }
    p->rx_ux->data = data;
    p->rx_cap = cap;
    return 0;
}

int ddp__match_arrive(ddp__match *m, ddp__match_peer *p, uint64_t tag, size_t len)
{
    p->rx_tag = tag;
    p->rx_len = len;
    p->rx_off = 0;
    ddp__req *r = take_posted(p, tag);
    if (r) {
        if (r->len != len) {
            r->status = DDP_ERR_PROTOCOL;
            return len_mismatch(m, p, tag, len, r->len);
        }
        p->rx_req = r;
        p->rx_cap = len;
        p->rx = DDP__RX_BODY;
        return 0;
    }
    /* Nobody waits for it: copy it if small, or if a receive posted on this
     * peer sits behind it; otherwise leave it where it is. */
    if (len <= DDP__MATCH_EAGER || p->pq_head)
        return ddp__match_buffer(m, p);
    m->stats.held_frames++;
    p->rx = DDP__RX_HELD;
    return 0;
}

void ddp__match_done(ddp__match *m, ddp__match_peer *p)
{
    if (p->rx_req) {
        p->rx_req->done = p->rx_len;
        p->rx_req->status = 1;
    } else {
        ddp__match_unexp *u = p->rx_ux;
        p->rx_ux = NULL;
        ddp__req *r = take_posted(p, u->tag); /* posted while the message arrived */
        if (r && r->len != u->len) {
            r->status = DDP_ERR_PROTOCOL;
            len_mismatch(m, p, u->tag, u->len, r->len);
            free_unexp(u);
        } else if (r) {
            complete_from(r, u);
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
    p->rx = DDP__RX_HDR;
}

/* ------------------------------------------------------------------ */
/* Waits                                                                */
/* ------------------------------------------------------------------ */

int ddp__match_wait_failed(ddp__match *m, const ddp__req *r, int flags)
{
    /* Name the cause for a collective, else this request's peer. */
    const ddp__match_peer *p = (flags & DDP__WAIT_ANY_PEER) && ddp__match_failed(m)
                                   ? ddp__match_failed(m)
                                   : ddp__match_peer_at(m, r->peer);
    return ddp__match_fail_all(m, ddp__match_peer_error(p));
}

int ddp__match_timeout(ddp__match *m, ddp__req *const *reqs, int n, double waited)
{
    for (int i = 0; i < n; i++) {
        if (reqs[i]->status != 0)
            continue;
        const ddp__match_peer *p = ddp__match_peer_at(m, reqs[i]->peer);
        return ddp__match_fail_all(
            m, DDP_ERROR(DDP_ERR_TIMEOUT, "%s: timed out after %.1f s %s %s (%zu of %zu bytes)",
                         m->ops->name, waited,
                         reqs[i]->kind == DDP__REQ_SEND ? "sending to" : "waiting for", p->what,
                         reqs[i]->done, reqs[i]->len));
    }
    return ddp__match_fail_all(
        m, DDP_ERROR(DDP_ERR_TIMEOUT, "%s: timed out after %.1f s", m->ops->name, waited));
}
