/* Symmetric memory of a shared-memory group: allocations that every rank
 * makes at the same point of its program, each rank's region mapped by all
 * ranks, so that a collective on such memory reads its peers' data in
 * place instead of staging it (the idea of OpenSHMEM's symmetric heap,
 * NVSHMEM and PyTorch's SymmetricMemory).
 *
 * Every function here is local to the calling rank.  An allocation is
 * collective in three steps, which the caller separates by exchanging each
 * rank's outcome (pg/backend.c): make (create this rank's region), map
 * (map every peer's region: they all exist once every rank made its own),
 * seal (remove the regions' names once every rank mapped them: nothing
 * outlives the processes; a rank that fails or dies before then has its
 * name removed by the others).  When any rank fails a step, every rank
 * drops the allocation.  Regions are /dev/shm files named after the group's
 * segment, mode 0600. */
#ifndef DDP_TRANSPORT_SYMMETRIC_H
#define DDP_TRANSPORT_SYMMETRIC_H

#include <stddef.h>
#include <stdint.h>

typedef struct ddp__sym_set ddp__sym_set;

/* The allocations of one rank of a group: names start with name (the
 * group's segment name, "/ddp-..."). */
int ddp__sym_set_create(const char *name, int rank, int size, ddp__sym_set **out);
/* Unmaps every allocation (and unlinks names not yet sealed). */
void ddp__sym_set_destroy(ddp__sym_set *set);

/* Creates this rank's region of the next allocation: len bytes rounded up
 * to whole pages, zeroed, page aligned, its pages reserved (a full /dev/shm
 * fails here, not by SIGBUS later).  Fails when DDP_SYMMETRIC_MEMORY=0. */
int ddp__sym_make(ddp__sym_set *set, size_t len, void **mine);
/* Maps every peer's region of the allocation whose region here is mine. */
int ddp__sym_map(ddp__sym_set *set, void *mine);
/* Unlinks the regions' names (every rank's: all are mapped by now); the
 * allocation becomes findable. */
void ddp__sym_seal(ddp__sym_set *set, void *mine);
/* Unmaps this rank's views of the allocation whose region here is mine
 * (at any step; unlinks every rank's name when not sealed, so that a rank
 * that died after making its region leaves nothing).  0 when mine is not
 * such a region. */
int ddp__sym_drop(ddp__sym_set *set, void *mine);

/* The sealed allocation holding [p, p + len): base[q] is rank q's region
 * (base[rank] holds p), *off is p's offset in it, *id the allocation's
 * number (the same on every rank).  NULL when there is none. */
uint8_t *const *ddp__sym_find(const ddp__sym_set *set, const void *p, size_t len, size_t *off,
                              unsigned *id);

#endif
