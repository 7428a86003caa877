/* Private: DDP's buffer synchronisation (buffers.c). */
#ifndef DDP_DDP_BUFFERS_H
#define DDP_DDP_BUFFERS_H

#include "ddp/nn.h"
#include "ddp/pg.h"

/* Broadcasts every buffer of m (its whole buffer block, one collective)
 * from rank 0 of pg.  Collective: every rank calls it at the same point;
 * a model without buffers sends nothing (on every rank alike, since DDP
 * checks that the ranks' models match). */
int ddp__broadcast_buffers(ddp_pg_t *pg, ddp_model_t *m);

/* Every rank holds as many buffers, of as many bytes, as rank 0 (else all
 * fail alike with DDP_ERR_MISMATCH naming the first rank that differs).
 * Collective. */
int ddp__check_buffers(ddp_pg_t *pg, ddp_model_t *m);

#endif
