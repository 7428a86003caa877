/* The socket library of the TCPStore (store/) and the TCP transport
 * (transport/), in the spirit of redis' anet.c: name resolution, listen,
 * connect with retries and back-off, accept with a deadline, socket
 * options, whole-buffer transfers bounded by a deadline (EINTR, EAGAIN and
 * partial transfers handled where they happen), address formatting.
 *
 * Sockets made here are non-blocking, close-on-exec, with TCP_NODELAY; the
 * transfers pass MSG_DONTWAIT, so they also work on a blocking socket.
 * Deadlines are absolute ddp_time_now() seconds.  `what` names the other
 * end in messages ("tcp store 10.0.0.1:29500", "rank 3 (10.0.0.4:29500)");
 * every failure sets the last error. */
#ifndef DDP_BASE_SOCK_H
#define DDP_BASE_SOCK_H

#include <stddef.h>
#include <sys/socket.h>

/* Binds and listens on host:port (a numeric IPv4/IPv6 address or a name;
 * port 0: a free port), with SO_REUSEADDR so that a restarted job rebinds
 * while old connections linger.  *port_out gets the bound port. */
int ddp__sock_listen(const char *host, int port, int backlog, int *fd_out, int *port_out);
/* Connects to host:port, retrying refused, unreachable and unresolved
 * attempts with back-off (10 ms doubling to 1 s; an attempt waits at most
 * 2 s) until deadline, then fails with DDP_ERR_TIMEOUT naming the number of
 * attempts and the last reason. */
int ddp__sock_connect(const char *host, int port, double deadline, const char *what,
                      int *fd_out);
/* Accepts one connection on a non-blocking listener, waiting at most until
 * deadline: 1 if one came (in *fd_out; its address, ddp__sock_addr_str's
 * form, in addr), 0 on timeout, negative on error. */
int ddp__sock_accept(int lfd, double deadline, int *fd_out, char *addr, size_t addr_len);

/* Whole-buffer transfers: 0, DDP_ERR_TIMEOUT, or DDP_ERR_CONNECTION
 * (closed by the peer, reset, ...). */
int ddp__sock_send_all(int fd, const void *buf, size_t len, double deadline, const char *what);
/* Waits for data, then receives what is there (1..cap bytes) into buf. */
int ddp__sock_recv_some(int fd, void *buf, size_t cap, double deadline, const char *what,
                        size_t *got);
int ddp__sock_recv_all(int fd, void *buf, size_t len, double deadline, const char *what);

/* A poll() timeout in ms for left_s seconds of waiting: rounded up (a
 * wait never ends before its deadline), 0 when none is left, capped at
 * about 11.6 days (the caller's loop polls again; an int of ms overflows
 * past 24.8 days, and a negative timeout would wait forever). */
int ddp__sock_poll_ms(double left_s);

int ddp__sock_set_nodelay(int fd);
/* For bulk streams (the TCP transport): TCP_NODELAY, send and receive
 * buffers of DDP_TCP_SOCKBUF bytes (default 4 MiB; best effort, the kernel
 * caps them), O_NONBLOCK on or off. */
int ddp__sock_tune(int fd, int nonblocking);

/* "1.2.3.4:5" or "[::1]:5". */
void ddp__sock_addr_str(const struct sockaddr *sa, char *buf, size_t len);
/* "host:port", with brackets around an IPv6 literal. */
void ddp__sock_hostport(const char *host, int port, char *buf, size_t len);
/* The address this host publishes to its peers (local_addr.c):
 * DDP_TCP_HOST, else the address of the first interface DDP_SOCKET_IFNAME
 * selects, else the first address of gethostname(), else loopback; of the
 * family DDP_SOCKET_FAMILY asks for (any: IPv4 first, then IPv6). */
int ddp__sock_local_host(char *out, size_t len);

#endif
