/* Transitional: the old names under which tcp.c and shm.c call the socket
 * library (base/sock.h) and the kernel's randomness (base/rng.h).  The
 * commit "transport: call sites of base/sock" renames those calls and
 * deletes this file. */
#ifndef DDP_TRANSPORT_NET_H
#define DDP_TRANSPORT_NET_H

#include "base/rng.h"
#include "base/sock.h"

static inline int ddp__net_listen(const char *host, int *fd, int *port)
{
    return ddp__sock_listen(host, 0, 128, fd, port);
}

static inline int ddp__net_connect(const char *host, int port, double deadline, int *fd)
{
    char what[300];
    ddp__sock_hostport(host, port, what, sizeof what);
    return ddp__sock_connect(host, port, deadline, what, fd);
}

#define ddp__net_accept ddp__sock_accept
#define ddp__net_tune ddp__sock_tune
#define ddp__net_write_full ddp__sock_send_all
#define ddp__net_local_host ddp__sock_local_host
#define ddp__net_random ddp__random_bytes

#endif
