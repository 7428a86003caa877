/* Concurrent server handshakes during setup; see accept.h.
 *
 * One poll covers the listener and every pending connection; each pending
 * one is a ddp__hs_srv state machine moved on when its socket is ready.
 * A genuine rank's handshake takes a few round trips, so it completes as
 * soon as its bytes arrive, whatever the other connections do.  Costs are
 * bounded per connection: HANDSHAKE_S seconds and one slot of PENDING_MAX
 * (when the slots are full the oldest connection still at HELLO, most
 * likely a silent stranger, is dropped for the newcomer; see make_room). */
#include "transport/accept.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "base/sock.h"
#include "base/time.h"
#include "transport/rendezvous.h"

#define PENDING_MAX 256  /* handshakes in progress at once */
#define HANDSHAKE_S 2.0  /* per connection; a genuine rank needs milliseconds */
#define ACCEPT_LOG_MAX 8 /* warn lines about refused connections per setup */

typedef struct pending {
    ddp__hs_srv hs;
    double since;
    char addr[DDP__ACCEPT_ADDR];
} pending;

typedef struct acceptor {
    const ddp__hs_ctx *ctx;
    int lfd, want;
    int streams;        /* connections per lower rank */
    pending *p; /* n of them, oldest first; hs.fd < 0: gone (compact removes it) */
    int n;
    unsigned char *connected;
    int *fds;
    char (*addrs)[DDP__ACCEPT_ADDR];
    int refused, logged; /* connections refused; lines logged about them */
    char last[400];      /* the last refusal, for the timeout message */
} acceptor;

/* A refusal: counted, kept for the timeout message, and logged while the
 * per-setup budget lasts. */
static void note(acceptor *a, const char *why)
{
    snprintf(a->last, sizeof a->last, "%s", why);
    a->refused++;
    if (a->logged < ACCEPT_LOG_MAX) {
        a->logged++;
        DDP_WARN("tcp rank %d: rejected a connection during setup: %s", a->ctx->rank, why);
    }
}

/* Closes pending connection i, refused for reason why. */
static void refuse_one(acceptor *a, int i, const char *why)
{
    note(a, why);
    close(a->p[i].hs.fd);
    a->p[i].hs.fd = -1;
}

static void compact(acceptor *a)
{
    int k = 0;
    for (int i = 0; i < a->n; i++)
        if (a->p[i].hs.fd >= 0)
            a->p[k++] = a->p[i];
    a->n = k;
}

static void step_one(acceptor *a, int i)
{
    pending *q = &a->p[i];
    char what[DDP__ACCEPT_ADDR + 32];
    snprintf(what, sizeof what, "connection from %s", q->addr);
    int rc = ddp__hs_srv_step(&q->hs, a->ctx, a->connected, what);
    if (rc < 0) {
        refuse_one(a, i, ddp_last_error());
    } else if (rc == 1) {
        int r = q->hs.peer, slot = r * a->streams + q->hs.stream;
        a->fds[slot] = q->hs.fd;
        snprintf(a->addrs[r], DDP__ACCEPT_ADDR, "%s", q->addr);
        a->connected[slot] = 1;
        a->want--;
        q->hs.fd = -1; /* the caller's now */
    }
}

/* Frees a slot for a newcomer when all PENDING_MAX are taken.  The victim
 * is the oldest connection still at HELLO (peer < 0): one past HELLO
 * proved it knows the group and claims a rank not yet connected, so it is
 * most likely a genuine rank waiting on its AUTH, and a rank's client
 * (mesh.c) does not retry a connection refused.  Only when every slot has
 * passed HELLO is the oldest of them dropped. */
static void make_room(acceptor *a)
{
    int v = 0;
    while (v < a->n && a->p[v].hs.peer >= 0)
        v++;
    if (v == a->n)
        v = 0;
    char why[DDP__ACCEPT_ADDR + 80];
    snprintf(why, sizeof why, "connection from %s: dropped, %d handshakes pending",
             a->p[v].addr, PENDING_MAX);
    refuse_one(a, v, why);
    compact(a);
}

/* Takes every connection the listener has queued. */
static void accept_new(acceptor *a)
{
    for (;;) {
        int fd = -1;
        char addr[DDP__ACCEPT_ADDR];
        int got = ddp__sock_accept(a->lfd, 0, &fd, addr, sizeof addr);
        if (got == 0)
            return;
        if (got < 0) {
            /* A connection reset before it was set up, or out of
             * descriptors (the pending ones free theirs within
             * HANDSHAKE_S): a genuine rank is still to come, so note it
             * and go on, after a pause should the listener keep failing. */
            char why[sizeof a->last];
            snprintf(why, sizeof why, "accept failed: %s", ddp_last_error());
            note(a, why);
            (void)poll(NULL, 0, 10);
            return;
        }
        if (a->n == PENDING_MAX)
            make_room(a);
        pending *q = &a->p[a->n++];
        ddp__hs_srv_init(&q->hs, fd);
        q->since = ddp_time_now();
        snprintf(q->addr, sizeof q->addr, "%s", addr);
        step_one(a, a->n - 1); /* its HELLO may be here already */
        compact(a);
        if (a->want == 0)
            return;
    }
}

/* Refuses the connections past their deadline; returns the earliest
 * deadline left (or later, when none is pending). */
static double expire(acceptor *a, double now, double later)
{
    for (int i = 0; i < a->n; i++) {
        pending *q = &a->p[i];
        if (now - q->since >= HANDSHAKE_S) {
            char what[DDP__ACCEPT_ADDR + 32];
            snprintf(what, sizeof what, "connection from %s", q->addr);
            ddp__hs_srv_timeout(&q->hs, now - q->since, what);
            refuse_one(a, i, ddp_last_error());
        } else if (q->since + HANDSHAKE_S < later) {
            later = q->since + HANDSHAKE_S;
        }
    }
    compact(a);
    return later;
}

static int timeout_error(const acceptor *a, double timeout_s)
{
    int rank = a->ctx->rank;
    unsigned char *missing = calloc((size_t)a->ctx->size, 1);
    DDP_FAIL_IF(!missing, DDP_ERR_NOMEM, "out of memory");
    for (int k = 0; k < rank * a->streams; k++)
        missing[k / a->streams] |= !a->connected[k];
    char who[200];
    ddp__format_ranks(who, sizeof who, missing, a->ctx->size);
    free(missing);
    if (a->refused == 0)
        return DDP_ERROR(DDP_ERR_TIMEOUT, "%s did not connect to rank %d within %.1f s", who,
                         rank, timeout_s);
    return DDP_ERROR(DDP_ERR_TIMEOUT,
                     "%s did not connect to rank %d within %.1f s; %d other connection%s "
                     "refused meanwhile (last: %s)",
                     who, rank, timeout_s, a->refused, a->refused == 1 ? " was" : "s were",
                     a->last);
}

/* The end of setup: what is still pending is closed (and logged like the
 * others, as strangers), and the lines not logged are summed up. */
static void finish(acceptor *a, double now)
{
    for (int i = 0; i < a->n; i++) {
        char why[DDP__ACCEPT_ADDR + 120];
        snprintf(why, sizeof why,
                 "connection from %s: no handshake by the end of setup (%zu bytes in %.2f s)",
                 a->p[i].addr, a->p[i].hs.got, now - a->p[i].since);
        refuse_one(a, i, why);
    }
    a->n = 0;
    if (a->refused > a->logged)
        DDP_WARN("tcp rank %d: %d more connections rejected during setup (not logged one by "
                 "one)",
                 a->ctx->rank, a->refused - a->logged);
}

int ddp__hs_accept(int lfd, const ddp__hs_ctx *ctx, double deadline, double timeout_s,
                   int *fds, char (*addrs)[DDP__ACCEPT_ADDR])
{
    int rc = 0;
    int streams = ctx->streams > 1 ? ctx->streams : 1;
    acceptor a = {.ctx = ctx, .lfd = lfd, .want = ctx->rank * streams, .streams = streams,
                  .fds = fds, .addrs = addrs};
    for (int k = 0; k < a.want; k++)
        fds[k] = -1;
    struct pollfd *pfd = malloc((PENDING_MAX + 1) * sizeof *pfd);
    a.p = malloc(PENDING_MAX * sizeof *a.p);
    a.connected = calloc((size_t)ctx->size * (size_t)streams, 1);
    DDP_FAIL_OUT(!pfd || !a.p || !a.connected, DDP_ERR_NOMEM, "out of memory");
    while (a.want > 0) {
        double now = ddp_time_now();
        double wake = expire(&a, now, deadline);
        if (now >= deadline) {
            rc = timeout_error(&a, timeout_s);
            goto out;
        }
        pfd[0] = (struct pollfd){.fd = lfd, .events = POLLIN};
        for (int i = 0; i < a.n; i++)
            pfd[i + 1] = (struct pollfd){a.p[i].hs.fd, ddp__hs_srv_events(&a.p[i].hs), 0};
        int k = poll(pfd, (nfds_t)a.n + 1, ddp__sock_poll_ms(wake - now));
        if (k < 0 && errno != EINTR) {
            rc = DDP_ERROR_ERRNO(DDP_ERR_SYSTEM, errno, "poll over pending handshakes");
            goto out;
        }
        for (int i = 0; k > 0 && i < a.n && a.want > 0; i++)
            if (pfd[i + 1].revents)
                step_one(&a, i);
        compact(&a);
        if (k > 0 && (pfd[0].revents & POLLIN) && a.want > 0)
            accept_new(&a);
    }
out:
    if (a.p) {
        char keep[1024];
        snprintf(keep, sizeof keep, "%s", ddp_last_error());
        finish(&a, ddp_time_now());
        ddp__error_restore(keep);
    }
    for (int k = 0; rc < 0 && k < ctx->rank * streams; k++) {
        if (fds[k] >= 0)
            close(fds[k]);
        fds[k] = -1;
    }
    free(a.connected);
    free(a.p);
    free(pfd);
    return rc;
}
