/* The shared-memory transport's private parts, shared by its files:
 *   shm/segment.c  the segment: layout, knobs, create / attach, destroy
 *   shm/ring.c     the byte rings (send and receive progress) and the bells
 *                  (futex words) that wake a sleeping rank
 *   shm/cma.c      cross-memory attach: large messages pulled by the receiver
 *   shm/peers.c    liveness (pidfds, slot states) and failure
 *   shm/wait.c     the entry points: post, wait (spin, yield, sleep), abort
 *   shm/window.c   the shared window and symmetric memory
 * The public face is transport/shm.h; docs/shm.md tells the design.
 *
 * Segment layout (one per group, rank 0 creates it):
 *   header      magic, version, size, ring bytes, attach count
 *   slots[n]    per rank: pid, state (live/left/aborted + reason), CMA probe
 *   bells[n]    per rank, own cache line: "sleeping" flag, futex word, the
 *               CPU it last waited on
 *   ctl[n*n]    per ordered pair s->d: head (producer), tail (consumer) and
 *               acked (CMA messages completed), each on its own cache line
 *   wflag[n][4] per rank: the window's flags, one cache line each
 *   data[n*n]   per ordered pair: ring_bytes of ring
 *   win[n]      per rank: the shared window's slot (window_bytes, paged)
 * head and tail count bytes since the start; the producer publishes head
 * with a release store after writing, the consumer reads it with acquire
 * (and the same in the other direction for tail). */
#ifndef DDP_TRANSPORT_SHM_INTERNAL_H
#define DDP_TRANSPORT_SHM_INTERNAL_H

#include <linux/futex.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "transport/match.h"
#include "transport/shm.h"
#include "transport/symmetric.h"
#include "transport/transport.h"

/* A message in a ring: a 32-byte header (shm/ring.c), then DATA's payload. */
#define MSG_MAGIC 0x46534444u /* "DDSF" */
#define HDR_LEN 32
enum { MSG_DATA = 1, MSG_RTS = 2 };
#define LINE 64
#define WHY_LEN 1024
#define SLEEP_MAX_S 0.01              /* futex naps: peers are checked between them */

enum { S_LIVE = 0, S_LEFT = 1, S_ABORTED = 2 }; /* slot state in the segment */

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
    _Atomic uint32_t cpu1; /* 1 + the CPU its rank last waited on (0: not yet) */
} __attribute__((aligned(LINE))) seg_bell;

typedef struct ring_ctl {
    _Atomic uint64_t head __attribute__((aligned(LINE)));
    _Atomic uint64_t tail __attribute__((aligned(LINE)));
    _Atomic uint64_t acked __attribute__((aligned(LINE)));
} ring_ctl;

typedef struct peer {
    ddp__match_peer m; /* first: the engine's part (queues, receive state, failure) */
    int pidfd;
    pid_t pid;
    int cma;             /* this rank sends RTS to the peer (it can read us) */
    /* send side: ring me -> peer */
    ring_ctl *tx;
    uint8_t *tx_data;
    uint64_t tx_head, tx_tail_cache;
    int sq_hdr_done;             /* the head of m.sq has its header in the ring */
    uint64_t cma_sent, cma_done; /* RTS sent, and completed by the peer's acks */
    /* receive side: ring peer -> me */
    ring_ctl *rx_ring;
    uint8_t *rx_data;
    uint64_t rx_tail, rx_head_cache;
    int rx_type;         /* of the message in progress: MSG_DATA or MSG_RTS */
    uint64_t rx_addr;    /* RTS: the sender's buffer, in its address space */
} peer;

typedef struct shm {
    ddp__tp base;
    uint8_t *map;
    size_t map_len;
    seg_hdr *hdr;
    seg_slot *slots;
    seg_bell *bells;
    uint64_t ring_bytes, mask;
    size_t cma_min; /* RTS (one copy) from this many bytes: DDP_SHM_CMA_BYTES */
    int cma_on;     /* DDP_SHM_CMA=1 */
    /* the shared window (transport.h): views into the segment */
    ddp__window win;
    uint8_t **win_slot;
    ddp__win_flag **win_flag;
    ddp__match m;
    peer *peers;        /* m's peers */
    int failed;         /* this rank aborted */
    double spin_s, yield_s;
    double last_check;
    volatile uint64_t probe; /* read by peers' CMA probes */
    char name[64];
    ddp__sym_set *sym;  /* symmetric memory (NULL for a group of one) */
} shm;

static inline long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* shm/ring.c */
void ddp__shm_ring_bell(shm *s, int r);
void ddp__shm_notify(shm *s, int r);
void ddp__shm_nap(shm *s, double secs, int (*done)(void *arg), void *arg);
uint32_t ddp__shm_note_cpu(shm *s);
int ddp__shm_shares_cpu(shm *s, int who);
int ddp__shm_tx_progress(shm *s, peer *p);
int ddp__shm_progress_all(shm *s);
int ddp__shm_body_started(shm *s, peer *p);
/* shm/cma.c */
int ddp__shm_probe_cma(shm *s);
int ddp__shm_cma_read(shm *s, peer *p, void *dst, uint64_t addr, size_t len);
int ddp__shm_cma_progress(peer *p);
/* shm/peers.c */
extern const ddp__match_ops ddp__shm_match_ops;
void ddp__shm_check_peers(shm *s, int force);
/* shm/wait.c */
extern const ddp__tp_vtable ddp__shm_vtable;
/* shm/window.c */
const ddp__window *ddp__shm_window(ddp__tp *tp);
void ddp__shm_win_post(ddp__tp *tp, int k, uint64_t v);
int ddp__shm_win_wait(ddp__tp *tp, int (*ready)(void *arg), void *arg, double deadline);
int ddp__shm_sym_make(ddp__tp *tp, size_t len, void **mine);
int ddp__shm_sym_map(ddp__tp *tp, void *mine);
void ddp__shm_sym_seal(ddp__tp *tp, void *mine);
int ddp__shm_sym_drop(ddp__tp *tp, void *mine);
uint8_t *const *ddp__shm_sym_find(ddp__tp *tp, const void *p, size_t len, size_t *off,
                                  unsigned *id);
/* shm/segment.c */
void ddp__shm_destroy(ddp__tp *tp);

#endif
