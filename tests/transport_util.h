/* The transport a process group runs on, by name ("shm", "tcp"; "none"
 * for a group of one), for the transport tests. */
#ifndef DDP_TESTS_TRANSPORT_UTIL_H
#define DDP_TESTS_TRANSPORT_UTIL_H

#include "ddp/pg.h"
#include "pg/internal.h"
#include "transport/transport.h"

__attribute__((unused)) static const char *transport_of(ddp_pg_t *pg)
{
    struct ddp__tp *tp = ddp__pg_transport(pg);
    return tp ? tp->vt->name : "none";
}

#endif
