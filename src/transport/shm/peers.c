/* The shared-memory transport's view of its peers (shm/internal.h): their
 * pidfds and the states their slots in the segment announce (left, gave up
 * and why), and what this rank announces when it gives up: the matching
 * engine's failure hooks (transport/match.h). */
#include "transport/shm/internal.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>

#include "base/error.h"

#define LIVENESS_S 0.002 /* pidfd checks while idle, at most this often */

static shm *shm_of(ddp__match *m) { return (shm *)((uint8_t *)m - offsetof(shm, m)); }

/* This rank gives up: the segment says why, and the live peers are woken
 * to read it (the engine then drops every request). */
static void give_up(ddp__match *m, const char *why)
{
    shm *s = shm_of(m);
    if (!s->failed && s->slots) {
        seg_slot *me = &s->slots[s->base.rank];
        snprintf(me->why, sizeof me->why, "%s", why);
        atomic_store_explicit(&me->state, S_ABORTED, memory_order_release);
        s->failed = 1;
    }
    for (int r = 0; r < s->base.size; r++)
        if (r != s->base.rank && s->peers[r].m.state == DDP__PEER_LIVE)
            ddp__shm_notify(s, r);
}

const ddp__match_ops ddp__shm_match_ops = {
    .name = "shm",
    .sep = " ",
    .reason_max = WHY_LEN + 64,
    .aborted = "(this rank gave up after an error)",
    .give_up = give_up,
};

/* Reads the peers' states from the segment and their pidfds (at most every
 * LIVENESS_S, unless force or a peer gave up: then a death behind it is
 * found and named first).  A peer that left is let go once its ring is
 * drained; one that died or gave up is taken down. */
void ddp__shm_check_peers(shm *s, int force)
{
    const int n = s->base.size;
    double now = ddp_time_now();
    int pids = force || now - s->last_check >= LIVENESS_S;
    for (int r = 0; r < n && !pids; r++)
        pids = r != s->base.rank && s->peers[r].m.state == DDP__PEER_LIVE &&
               atomic_load_explicit(&s->slots[r].state, memory_order_acquire) == S_ABORTED;
    if (pids) {
        s->last_check = now;
        for (int r = 0; r < n; r++) {
            peer *p = &s->peers[r];
            /* One that left or gave up has said so: its exit is no news. */
            if (r == s->base.rank || p->m.state != DDP__PEER_LIVE ||
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
                ddp__match_down(&s->m, &p->m, DDP__PEER_DEAD,
                                "died (process exited without leaving the group)");
        }
    }
    for (int r = 0; r < n; r++) {
        peer *p = &s->peers[r];
        if (r == s->base.rank || p->m.state != DDP__PEER_LIVE)
            continue;
        uint32_t st = atomic_load_explicit(&s->slots[r].state, memory_order_acquire);
        if (st == S_ABORTED)
            ddp__match_down(&s->m, &p->m, DDP__PEER_DEAD, "gave up: %.*s", WHY_LEN - 1,
                            s->slots[r].why);
        else if (st == S_LEFT && p->m.rx == DDP__RX_HDR &&
                 atomic_load_explicit(&p->rx_ring->head, memory_order_acquire) == p->rx_tail)
            ddp__match_down(&s->m, &p->m, DDP__PEER_LEFT,
                            "left the group (destroyed its process group)");
    }
}
