/* Small socket helpers for the TCP transport (in the spirit of redis'
 * anet.c): listen, connect with retries, socket options, and whole-buffer
 * reads and writes bounded by a deadline.  Every function sets the last error
 * with the address involved. */
#ifndef DDP_TRANSPORT_NET_H
#define DDP_TRANSPORT_NET_H

#include <stddef.h>

/* Listens on host (numeric IPv4/IPv6 or a name) with an ephemeral port.
 * *fd is non-blocking; the port chosen goes to *port. */
int ddp__net_listen(const char *host, int *fd, int *port);
/* Connects to host:port, retrying refused connections until deadline.  The
 * returned socket is blocking, with TCP_NODELAY. */
int ddp__net_connect(const char *host, int port, double deadline, int *fd);
/* Accepts one connection, waiting at most until deadline; 1 if one came
 * (in *fd, blocking, TCP_NODELAY, peer address in addr), 0 on timeout. */
int ddp__net_accept(int lfd, double deadline, int *fd, char *addr, size_t addr_len);
/* TCP_NODELAY, large send/receive buffers, optional O_NONBLOCK. */
int ddp__net_tune(int fd, int nonblocking);
/* Reads/writes exactly len bytes of a blocking-or-not socket before deadline.
 * what names the other end in messages ("rank 3 (10.0.0.4:29500)"). */
int ddp__net_read_full(int fd, void *buf, size_t len, double deadline, const char *what);
int ddp__net_write_full(int fd, const void *buf, size_t len, double deadline, const char *what);
/* The address this host publishes to its peers: DDP_TCP_HOST, else the
 * first IPv4 address of gethostname(), else 127.0.0.1. */
int ddp__net_local_host(char *out, size_t len);
/* Reads len bytes from the kernel's random source. */
int ddp__net_random(void *buf, size_t len);

#endif
