/* The TCPStore server: one background thread, epoll, the key-value table,
 * parked waiters answered when their keys appear (or at their deadline). */
#ifndef DDP_STORE_TCP_SERVER_H
#define DDP_STORE_TCP_SERVER_H

#include <stddef.h>
#include <stdint.h>

typedef struct ddp__ts_server ddp__ts_server;

/* Listens on host:port (port 0: a free port, returned in *port_out) and
 * starts the thread.  secret (may be NULL: no authentication) is copied;
 * so is job_id (NULL or "": none), which HELLO tells every client.
 * Clients that have not authenticated within min(timeout_s, 30 s) are
 * dropped. */
int ddp__ts_server_start(const char *host, int port, const uint8_t *secret, size_t slen,
                         const char *job_id, double timeout_s, ddp__ts_server **out,
                         int *port_out);
/* Stops the thread, closes every connection (clients see it closed) and
 * frees the server.  NULL is a no-op. */
void ddp__ts_server_stop(ddp__ts_server *s);
/* In a forked child: closes this process's copies of the server's
 * descriptors and frees its memory, without touching the parent's thread. */
void ddp__ts_server_abandon(ddp__ts_server *s);

#endif
