/* Small socket helpers for the TCPStore (redis anet.c in spirit): listen on
 * exactly the address given, connect with retries and back-off until a
 * deadline, and send/receive whole buffers on non-blocking sockets with
 * EINTR, EAGAIN and partial transfers handled where they happen.
 * Deadlines are absolute ddp_time_now() seconds.  `what` names the peer in
 * messages ("tcp store 10.0.0.1:29500"). */
#ifndef DDP_STORE_SOCK_H
#define DDP_STORE_SOCK_H

#include <stddef.h>
#include <sys/socket.h>

/* Binds and listens on host:port (port 0: any free port), non-blocking.
 * *port_out gets the bound port. */
int ddp__sock_listen(const char *host, int port, int backlog, int *fd_out, int *port_out);
/* Connects to host:port, retrying refused/unreachable/unresolved with
 * back-off (10 ms doubling to 1 s) until deadline.  Returns a non-blocking
 * socket with TCP_NODELAY. */
int ddp__sock_connect(const char *host, int port, double deadline, const char *what,
                      int *fd_out);
/* Whole-buffer transfers on a non-blocking socket: 0, DDP_ERR_TIMEOUT, or
 * DDP_ERR_CONNECTION (closed by the peer, reset, ...). */
int ddp__sock_send_all(int fd, const void *buf, size_t len, double deadline, const char *what);
/* Waits for data, then receives what is there (1..cap bytes) into buf. */
int ddp__sock_recv_some(int fd, void *buf, size_t cap, double deadline, const char *what,
                        size_t *got);
int ddp__sock_recv_all(int fd, void *buf, size_t len, double deadline, const char *what);
int ddp__sock_set_nonblock(int fd);
int ddp__sock_set_nodelay(int fd);
/* "1.2.3.4:5" or "[::1]:5". */
void ddp__sock_addr_str(const struct sockaddr *sa, char *buf, size_t len);
/* "host:port", with brackets around an IPv6 literal. */
void ddp__sock_hostport(const char *host, int port, char *buf, size_t len);

#endif
