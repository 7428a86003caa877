/* The shared-memory transport's memory that algorithms address directly
 * (shm/internal.h): the shared window (transport.h: per rank a slot and
 * flags every rank maps) with its post and wait, and symmetric memory
 * (transport/symmetric.c). */
#include "transport/shm/internal.h"

#include "base/error.h"

const ddp__window *ddp__shm_window(ddp__tp *tp)
{
    shm *s = (shm *)tp;
    return s->win.bytes ? &s->win : NULL;
}

void ddp__shm_win_post(ddp__tp *tp, int k, uint64_t v)
{
    shm *s = (shm *)tp;
    atomic_store_explicit(&s->win_flag[s->base.rank][k].v, v, memory_order_release);
    /* As ddp__shm_notify(), one fence for every peer: the flag before "sleeping". */
    atomic_thread_fence(memory_order_seq_cst);
    for (int r = 0; r < s->base.size; r++)
        if (r != s->base.rank)
            ddp__shm_ring_bell(s, r);
}

/* A collective on the window cannot go on without every peer: the first
 * one that is down (died, gave up, left), or NULL. */
static const ddp__match_peer *win_down(shm *s)
{
    for (int r = 0; r < s->base.size; r++) {
        peer *p = &s->peers[r];
        /* One that left never posts again, whatever its ring still holds. */
        if (r != s->base.rank && p->m.state == DDP__PEER_LIVE &&
            atomic_load_explicit(&s->slots[r].state, memory_order_acquire) == S_LEFT)
            ddp__match_down(&s->m, &p->m, DDP__PEER_LEFT,
                            "left the group (destroyed its process group)");
    }
    return ddp__match_failed(&s->m); /* deaths first */
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

int ddp__shm_win_wait(ddp__tp *tp, int (*ready)(void *arg), void *arg, double deadline)
{
    shm *s = (shm *)tp;
    double start = 0;
    unsigned spins = 0;
    ddp__shm_note_cpu(s);
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
        ddp__shm_check_peers(s, 0);
        const ddp__match_peer *down = win_down(s);
        if (down)
            return ddp__match_fail_all(&s->m, ddp__match_peer_error(down));
        if (now >= deadline)
            return ddp__match_fail_all(&s->m, DDP_ERROR(DDP_ERR_TIMEOUT,
                                                        "timed out after %.1f s waiting for %s "
                                                        "in a shared-memory collective",
                                                        now - start, s->peers[who].m.what));
        /* Spin, then sleep until a peer posts (shm_win_post wakes us: the
         * flag, then the fence, then "sleeping"; here "sleeping", the fence,
         * then a last look at the flags), a nap at most, to watch peers.
         * No sched_yield phase as in shm_wait: on a busy machine a yielding
         * rank stays runnable and loses its core for a whole time slice of
         * whatever runs instead, where a sleeper is woken by the post and
         * preempts at once (64 MiB, 2 ranks, other jobs running: 3.6 GB/s
         * with the yield phase, 5.9 without).  No spin either when the
         * peer last waited on this CPU (ddp__shm_shares_cpu). */
        if (now - start < s->spin_s && !ddp__shm_shares_cpu(s, who))
            continue;
        win_cond c = {ready, arg};
        double left = deadline - now;
        ddp__shm_nap(s, left < SLEEP_MAX_S ? left : SLEEP_MAX_S, win_met, &c);
    }
}

/* ------------------------------------------------------------------ */
/* Symmetric memory (transport/symmetric.c)                             */
/* ------------------------------------------------------------------ */

int ddp__shm_sym_make(ddp__tp *tp, size_t len, void **mine)
{
    shm *s = (shm *)tp;
    DDP_FAIL_IF(!s->sym, DDP_ERR_UNSUPPORTED, "symmetric memory needs a group of 2 or more ranks");
    return ddp__sym_make(s->sym, len, mine);
}

int ddp__shm_sym_map(ddp__tp *tp, void *mine)
{
    return ddp__sym_map(((shm *)tp)->sym, mine); }
void ddp__shm_sym_seal(ddp__tp *tp, void *mine)
{
    ddp__sym_seal(((shm *)tp)->sym, mine); }
int ddp__shm_sym_drop(ddp__tp *tp, void *mine)
{
    shm *s = (shm *)tp;
    return s->sym ? ddp__sym_drop(s->sym, mine) : 0;
}

uint8_t *const *ddp__shm_sym_find(ddp__tp *tp, const void *p, size_t len, size_t *off,
                                  unsigned *id)
{
    return ddp__sym_find(((shm *)tp)->sym, p, len, off, id);
}
