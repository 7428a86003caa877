/* The TCP transport: a full mesh of TCP connections between the ranks of a
 * group, driven by an epoll progress engine (docs/wire-format.md).
 *
 * ddp__tcp_create rendezvouses through the store (each rank publishes its
 * listening address and DDP_SOCKET_NUM_STREAMS under prefix; ranks that
 * differ are refused), connects every pair DDP_SOCKET_NUM_STREAMS times
 * (default once; the lower rank dials the higher one) with the handshake of
 * handshake.h, then closes its listening socket: no connection is accepted
 * after setup.  Messages from 256 KiB are striped across a pair's
 * connections (tcp/stripe.c).
 *
 * The progress engine runs on whichever thread calls wait (the process
 * group's executor): it polls epoll without blocking for at most
 * DDP_TCP_SPIN_US microseconds (default 20, adapted to whether spinning
 * pays), then sleeps in epoll_wait until a socket is ready or the deadline
 * passes. */
#ifndef DDP_TRANSPORT_TCP_H
#define DDP_TRANSPORT_TCP_H

#include <stdint.h>

#include "ddp/store.h"
#include "transport/match.h"
#include "transport/transport.h"

/* Connects rank of size through store; keys go under prefix.  Waits at most
 * timeout_s for all ranks.  Caller destroys *out with ddp__tp_destroy. */
int ddp__tcp_create(ddp_store_t *store, const char *prefix, int rank, int size,
                    double timeout_s, ddp__tp **out);

/* Tests only: what the receive side did with frames that arrived before
 * their receive was posted (copied into an unexpected buffer, or held in
 * the kernel until posted), since creation.  -1 if tp is not tcp. */
typedef ddp__match_stats ddp__tcp_stats; /* copied_frames, copied_bytes, held_frames */
int ddp__tcp_debug_stats(ddp__tp *tp, ddp__tcp_stats *out);

/* Tests only: connections per pair (DDP_SOCKET_NUM_STREAMS) and the
 * messages received striped across them since creation.  -1 if not tcp. */
int ddp__tcp_debug_streams(ddp__tp *tp, int *streams, uint64_t *striped_rx);

/* Tests only: the socket connected to peer (stream 0; to inject bad frames). */
int ddp__tcp_debug_fd(ddp__tp *tp, int rank);
/* Tests only: the socket of connection `stream` (0 .. streams - 1) to peer. */
int ddp__tcp_debug_stream_fd(ddp__tp *tp, int rank, int stream);

#endif
