/* The shared-memory transport's cross-memory attach (shm/internal.h): a
 * message of DDP_SHM_CMA_BYTES or more is announced by an RTS in the ring
 * and pulled by the receiver with process_vm_readv straight from the
 * sender's buffer (one copy instead of two), when every rank may read every
 * peer's memory.  Off unless DDP_SHM_CMA=1 (docs/shm.md). */
#include "transport/shm/internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "base/log.h"

/* Can this rank read every peer's memory?  (Yama, seccomp and containers
 * may forbid process_vm_readv.)  Off unless DDP_SHM_CMA=1: in the VMs
 * measured so far (docs/shm.md) pinning the sender's pages makes a pull
 * slower than the two copies through the ring. */
int ddp__shm_probe_cma(shm *s)
{
    if (!s->cma_on)
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

/* Pulls len bytes at the peer's address addr into dst (cross-memory
 * attach); on failure the peer is taken down.  0 or -1. */
int ddp__shm_cma_read(shm *s, peer *p, void *dst, uint64_t addr, size_t len)
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
        ddp__shm_check_peers(s, 1);
        if (p->m.state != DDP__PEER_LIVE)
            return -1;
        errno = e;
        if (n < 0 && errno == ESRCH)
            ddp__match_down(&s->m, &p->m, DDP__PEER_DEAD,
                            "died (reading its %zu-byte message failed: no such process)", len);
        else
            ddp__match_down(&s->m, &p->m, DDP__PEER_DEAD,
                            "process_vm_readv of %zu bytes failed: %s", len,
                            n < 0 ? strerror(errno) : "no progress");
        return -1;
    }
    return 0;
}

/* Completes RTS sends the receiver has pulled; 1 if any. */
int ddp__shm_cma_progress(peer *p)
{
    if (!p->m.cq_head)
        return 0;
    uint64_t acked = atomic_load_explicit(&p->tx->acked, memory_order_acquire);
    int moved = 0;
    while (p->cma_done < acked && p->m.cq_head) {
        ddp__req *r = p->m.cq_head;
        p->m.cq_head = r->next;
        if (!p->m.cq_head)
            p->m.cq_tail = NULL;
        r->next = NULL;
        r->done = r->len;
        r->status = 1;
        p->cma_done++;
        moved = 1;
    }
    return moved;
}
