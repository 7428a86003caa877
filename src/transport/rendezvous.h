/* Rendezvous for transports: every rank publishes a small record (its
 * listening address, say) in the store and gathers everyone's, with the
 * checks a job needs before it connects anything: rank in range, one process
 * per rank, the same world size everywhere, and on timeout the list of ranks
 * that never arrived ("ranks 2, 3 did not join within 5.0 s"). */
#ifndef DDP_TRANSPORT_RENDEZVOUS_H
#define DDP_TRANSPORT_RENDEZVOUS_H

#include <stddef.h>

#include "ddp/store.h"

typedef struct ddp__rdzv_rec {
    void *data; /* malloc'ed record of one rank */
    size_t len;
} ddp__rdzv_rec;

/* 0 when 0 <= rank < size (size >= 1), else DDP_ERR_INVALID_ARG naming
 * them: the check of every call that sets up a group's transport. */
int ddp__rdzv_check_rank(int rank, int size);

/* Publishes rec under "<prefix>/rank/<rank>" and waits until every rank's
 * record is there, at most timeout_s.  recs (size entries, caller-provided)
 * receive malloc'ed copies; free them with ddp__rdzv_free, also on failure. */
int ddp__rdzv_exchange(ddp_store_t *store, const char *prefix, int rank, int size,
                       const void *rec, size_t len, double timeout_s, ddp__rdzv_rec *recs);
void ddp__rdzv_free(ddp__rdzv_rec *recs, int size);

/* Formats "rank 3" or "ranks 2, 3, 5" (at most ~16 listed, then "...")
 * for the ranks with missing[i] != 0. */
void ddp__format_ranks(char *out, size_t len, const unsigned char *missing, int size);

#endif
