/* Back-off for polling loops (store waits, connect retries): sleeps that
 * double up to a cap and never pass the deadline.  The clock itself,
 * ddp_time_now(), is public (include/ddp/base.h). */
#ifndef DDP_BASE_TIME_H
#define DDP_BASE_TIME_H

#include "ddp/base.h"

/* First sleep 50 us (set sleep_s after init for another), doubling up to
 * max_s. */
typedef struct ddp__backoff {
    double sleep_s, max_s, deadline;
} ddp__backoff;
void ddp__backoff_init(ddp__backoff *b, double timeout_s, double max_s);
/* Returns 0 after sleeping, DDP_ERR_TIMEOUT at the deadline. */
int ddp__backoff_sleep(ddp__backoff *b);

#endif
