/* The shared-memory transport's entry points (shm/internal.h): posting
 * sends and receives (matched by transport/match.h), the wait that drives
 * the rings (spin, then yield, then sleep on the bell), abort, and the
 * vtable. */
#include "transport/shm/internal.h"

#include <sched.h>

#include "base/error.h"

static int shm_isend(ddp__tp *tp, ddp__req *r)
{
    shm *s = (shm *)tp;
    int first = ddp__match_isend(&s->m, r);
    if (first <= 0)
        return first;
    peer *p = &s->peers[r->peer];
    p->sq_hdr_done = 0;
    ddp__shm_tx_progress(s, p); /* eager: small sends finish here */
    return 0;
}

static int shm_irecv(ddp__tp *tp, ddp__req *r)
{
    shm *s = (shm *)tp;
    int held = r->peer >= 0 && r->peer < s->base.size && s->peers[r->peer].m.rx == DDP__RX_HELD;
    int rc = ddp__match_irecv(&s->m, r);
    /* The held message now has its place (r, or a copy): an RTS is pulled. */
    if (rc == 0 && held && ddp__shm_body_started(s, &s->peers[r->peer]) < 0)
        return ddp__match_fail_all(&s->m, ddp__match_peer_error(&s->peers[r->peer].m));
    return rc;
}

/* Buffers every held message; 1 if there was one. */
static int unhold_all(shm *s)
{
    int moved = 0;
    for (int i = 0; i < s->base.size; i++) {
        peer *p = &s->peers[i];
        if (i != s->base.rank && p->m.state == DDP__PEER_LIVE && p->m.rx == DDP__RX_HELD) {
            if (ddp__match_buffer(&s->m, &p->m) == 0)
                ddp__shm_body_started(s, p);
            moved = 1;
        }
    }
    return moved;
}

static int moved(void *arg) { return ddp__shm_progress_all(arg); }

static int shm_wait(ddp__tp *tp, ddp__req *const *reqs, int n, double deadline, int flags)
{
    shm *s = (shm *)tp;
    double start = 0, idle_since = 0;
    unsigned spins = 0;
    ddp__shm_note_cpu(s);
    for (;;) {
        int rc = ddp__match_poll(&s->m, reqs, n, flags);
        if (rc <= 0)
            return rc;
        if (ddp__shm_progress_all(s)) {
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
        ddp__shm_check_peers(s, 0);
        if (now >= deadline)
            return ddp__match_timeout(&s->m, reqs, n, now - start);
        double idle = now - idle_since;
        /* A peer on this CPU runs only once we stop: no spin, yield at
         * once (ddp__shm_shares_cpu; the yield hands it the core now,
         * where a sleep would wait for its wake-up as well). */
        if (idle < s->spin_s && !ddp__shm_shares_cpu(s, -1))
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
        ddp__shm_nap(s, left < SLEEP_MAX_S ? left : SLEEP_MAX_S, moved, s);
    }
}

static void shm_abort(ddp__tp *tp, int code, const char *why)
{
    (void)code;
    ddp__match_abort(&((shm *)tp)->m, why);
}

const ddp__tp_vtable ddp__shm_vtable = {
    .name = "shm",
    .isend = shm_isend,
    .irecv = shm_irecv,
    .wait = shm_wait,
    .abort = shm_abort,
    .destroy = ddp__shm_destroy,
    .window = ddp__shm_window,
    .win_post = ddp__shm_win_post,
    .win_wait = ddp__shm_win_wait,
    .sym_make = ddp__shm_sym_make,
    .sym_map = ddp__shm_sym_map,
    .sym_seal = ddp__shm_sym_seal,
    .sym_drop = ddp__shm_sym_drop,
    .sym_find = ddp__shm_sym_find,
};
