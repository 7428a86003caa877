/* The collective matrix of test_coll.c (every collective x world sizes 1-8
 * x counts 0, 1, 7, 1023, 1M+3 x dtypes and ops, bitwise against the
 * references) over TCP with several connections per pair: each world size
 * with its own DDP_SOCKET_NUM_STREAMS (2, 3 or 4), set in every rank before
 * its group is created, and DDP_CHUNK_BYTES at 1 MiB so that ring steps
 * are striped too.  Every group checks that it ran with that many streams
 * and that striped messages reached it. */
#include <stdio.h>
#include <stdlib.h>

#include "ddp/pg.h"
#include "pg/internal.h"
#include "transport/tcp.h"

static int streams_for(int n) { return 2 + n % 3; } /* 1: 3, 2: 4, 3: 2, 4: 3, 5: 4, 8: 4 */

/* Sets this rank's stream count; no host layout (one host). */
static const char *streams_env(int n)
{
    char v[8];
    snprintf(v, sizeof v, "%d", streams_for(n));
    setenv("DDP_SOCKET_NUM_STREAMS", v, 1);
    setenv("DDP_CHUNK_BYTES", "1048576", 1);
    return NULL;
}

static int streams_check_group(ddp_pg_t *pg)
{
    int n = ddp_pg_size(pg), streams = 0;
    uint64_t striped = 0;
    if (n == 1)
        return 0;
    if (ddp__tcp_debug_streams(ddp__pg_transport(pg), &streams, &striped) != 0 ||
        streams != streams_for(n) || striped == 0) {
        fprintf(stderr, "rank %d of %d: %d streams (want %d), %llu striped messages\n",
                ddp_pg_rank(pg), n, streams, streams_for(n), (unsigned long long)striped);
        return 1;
    }
    return 0;
}

int coll_matrix_main(void);
#define COLL_HOST_LAYOUT(n) streams_env(n)
#define COLL_CHECK_GROUP(pg) streams_check_group(pg)
#define main coll_matrix_main
#include "test_coll.c"
#undef main

int main(void)
{
    setenv("DDP_TRANSPORT", "tcp", 1);
    return coll_matrix_main();
}
