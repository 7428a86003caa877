/* Transport layout of a group: flat tcp, shm (one host), or hierarchical
 * (several hosts, shm inside each, tcp among one leader per host).  Every
 * rank publishes "<transport mode> <hierarchical mode> <host id>" and every
 * rank applies the same rule to the same records (select.c), so all agree.
 * docs/hierarchical.md. */
#ifndef DDP_TRANSPORT_SELECT_H
#define DDP_TRANSPORT_SELECT_H

#include "ddp/store.h"

enum { DDP__LAYOUT_TCP, DDP__LAYOUT_SHM, DDP__LAYOUT_HIER };

typedef struct ddp__layout {
    int kind;     /* DDP__LAYOUT_* */
    int nhosts;   /* distinct host ids (0 when unknown: a rank forced tcp) */
    int *host_of; /* [size]: host index of each rank; hosts are numbered in
                   * the order of their lowest rank.  NULL when unknown. */
} ddp__layout;

/* Agrees with the other ranks (keys under prefix) on the layout, at most
 * timeout_s.  Hierarchical when the group spans hosts, no rank says
 * DDP_TRANSPORT=tcp or DDP_HIERARCHICAL=0, and some host holds two ranks
 * (or some rank says DDP_HIERARCHICAL=1).  Fails on malformed variables and
 * on ranks that disagree.  Free *out with ddp__layout_free (also on failure). */
int ddp__transport_layout(ddp_store_t *store, const char *prefix, int rank, int size,
                          double timeout_s, ddp__layout *out);
void ddp__layout_free(ddp__layout *l);

#endif
