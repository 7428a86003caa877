/* The shared-memory transport's segment (shm/internal.h has its layout):
 * the knobs, rank 0 creating it under a random name and the others
 * attaching, the barriers of setup (attached, CMA probed), and destroy
 * (goodbye, then unmap). */
#include "transport/shm/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "base/rng.h"
#include "base/secret.h"
#include "base/time.h"
#include "transport/handshake.h"
#include "transport/rendezvous.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

#define SEG_MAGIC 0x4d485344u /* "DSHM" */
#define SEG_VERSION 2

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

/* Maps now the pages of [p, p + len) in this process (writable, contents
 * untouched): MADV_POPULATE_WRITE (Linux 5.14), else a read of each page
 * (tmpfs maps a read fault of a shared writable mapping writable). */
static void prefault(uint8_t *p, size_t len)
{
#ifdef MADV_POPULATE_WRITE
    if (madvise(p, len, MADV_POPULATE_WRITE) == 0)
        return;
#endif
    for (size_t off = 0; off < len; off += 4096)
        (void)*(volatile uint8_t *)(p + off);
}

/* Every page this rank will use: its rings to and from each peer and every
 * rank's window.  A first touch of a page of the segment is a page fault in
 * each process; without this a fresh group paid them in its first few
 * hundred collectives, until its rings had wrapped (2 ranks: the median
 * 8 KiB all-reduce of a fresh group's first 200 calls took 8 us, of its
 * first 400 2 us; of its first 25 at 64 KiB 27-42 us, 11.5-13.6 with
 * this; bench/RESULTS.md, session 18).  The pages are the segment's,
 * shared: nothing is allocated twice, and a job that moves data touches
 * them all within its first steps anyway. */
static void populate(shm *s, const seg_off *o, int rank, int size, size_t ring, size_t window)
{
    for (int q = 0; q < size; q++) {
        if (q == rank)
            continue;
        prefault(s->map + o->data + (size_t)(rank * size + q) * ring, ring);
        prefault(s->map + o->data + (size_t)(q * size + rank) * ring, ring);
    }
    if (window)
        prefault(s->map + o->win, (size_t)size * window);
}

/* Ring bytes: a power of two, 4 KiB to 1 GiB (src/base/env.c checks the
 * range; default 1 MiB). */
static int ring_size(size_t *out)
{
    size_t want = 0, r = 4096;
    DDP_TRY(ddp__env_size("DDP_SHM_RING_BYTES", &want));
    while (r < want)
        r <<= 1;
    *out = r;
    return 0;
}

/* Window bytes per rank: 0 (no window) or whole pages, at most 1 GiB
 * (src/base/env.c; default 1 MiB). */
static int window_size(size_t *out)
{
    size_t v = 0;
    DDP_TRY(ddp__env_size("DDP_SHM_WINDOW_BYTES", &v));
    *out = align_up(v, 4096);
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
    /* Polls from 20 us, doubling to 5 ms: setup is usually a matter of
     * microseconds between the ranks. */
    ddp__backoff b;
    ddp__backoff_init(&b, deadline - ddp_time_now(), 0.005);
    b.sleep_s = 20e-6;
    for (;;) {
        int left = 0;
        for (int r = 0; r < n; r++)
            left += missing[r] = !pred(s, r);
        if (!left)
            break;
        for (int r = 0; r < n; r++) {
            peer *p = &s->peers[r];
            if (missing[r] && p->pid > 0 && kill(p->pid, 0) < 0 && errno == ESRCH) {
                rc = DDP_ERROR(DDP_ERR_PEER, "%s died during shared-memory setup", p->m.what);
                goto out;
            }
        }
        if (ddp__backoff_sleep(&b) < 0) {
            char who[256];
            ddp__format_ranks(who, sizeof who, missing, n);
            rc = DDP_ERROR(DDP_ERR_TIMEOUT, "%s did not %s within %.1f s", who, what, timeout_s);
            goto out;
        }
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

void ddp__shm_destroy(ddp__tp *tp)
{
    shm *s = (shm *)tp;
    if (!s)
        return;
    if (s->slots && !s->failed) {
        /* Goodbye, unless a send is half-done (the peer must see a failure:
         * its buffer may be about to be pulled from a dead address). */
        int clean = 1;
        for (int r = 0; r < s->base.size; r++)
            if (r != s->base.rank && (s->peers[r].m.sq_head || s->peers[r].m.cq_head))
                clean = 0;
        seg_slot *me = &s->slots[s->base.rank];
        if (!clean)
            snprintf(me->why, sizeof me->why, "rank %d destroyed its group with sends in flight",
                     s->base.rank);
        atomic_store_explicit(&me->state, clean ? S_LEFT : S_ABORTED, memory_order_release);
        for (int r = 0; r < s->base.size; r++)
            if (r != s->base.rank)
                ddp__shm_notify(s, r);
    }
    for (int r = 0; s->peers && r < s->base.size; r++) {
        peer *p = &s->peers[r];
        if (p->pidfd >= 0)
            close(p->pidfd);
    }
    ddp__match_destroy(&s->m);
    ddp__sym_set_destroy(s->sym);
    if (s->map)
        munmap(s->map, s->map_len);
    free(s->win_slot);
    free(s->win_flag);
    free(s);
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
    DDP_TRY(ddp__rdzv_check_rank(rank, size));
    double deadline = ddp_time_now() + timeout_s;
    s = calloc(1, sizeof *s);
    DDP_FAIL_OUT(!s, DDP_ERR_NOMEM, "out of memory");
    s->base.vt = &ddp__shm_vtable;
    s->base.rank = rank;
    s->base.size = size;
    DDP_TRY_OUT(ddp__env_usec("DDP_SHM_SPIN_US", &s->spin_s));
    DDP_TRY_OUT(ddp__env_usec("DDP_SHM_YIELD_US", &s->yield_s));
    s->spin_s *= 1e-6;
    s->yield_s *= 1e-6;
    DDP_TRY_OUT(ddp__env_bool("DDP_SHM_CMA", &s->cma_on));
    size_t cma_min = 0;
    DDP_TRY_OUT(ddp__env_size("DDP_SHM_CMA_BYTES", &cma_min));
    s->cma_min = cma_min < 1 ? 1 : cma_min;
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
    DDP_TRY_OUT(ddp__match_init(&s->m, &ddp__shm_match_ops, rank, size, sizeof(peer)));
    s->peers = s->m.peers;
    for (int r = 0; r < size; r++)
        s->peers[r].pidfd = -1;
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
    populate(s, &o, rank, size, ring, window);
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
        snprintf(p->m.what, sizeof p->m.what, "rank %d (pid %d)", r, (int)p->pid);
        p->pidfd = (int)syscall(SYS_pidfd_open, p->pid, 0);
    }

    /* Phase 3: may large messages be pulled?  Each rank probes every peer;
     * a sender pulls-by-RTS to peers that can read everyone. */
    atomic_store_explicit(&me->cma, ddp__shm_probe_cma(s) ? 1u : 2u, memory_order_release);
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
    if (s && s->slots && rc < 0)
        ddp__match_abort(&s->m, ddp_last_error());
    ddp__shm_destroy(s ? &s->base : NULL);
    return rc;
}

const char *ddp__shm_debug_name(ddp__tp *tp)
{
    return tp && strcmp(tp->vt->name, "shm") == 0 ? ((shm *)tp)->name : NULL;
}
