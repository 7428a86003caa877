/* Accepting the connections of the lower ranks during setup, with every
 * pending handshake run at once (nginx's and libuv's way: one poll over the
 * listener and all half-open connections, a state machine per connection),
 * so that strangers, port scanners and silent or malformed connections
 * never delay a genuine rank: each pending connection has its own short
 * deadline, and when too many are pending the oldest still at HELLO (not
 * one that passed the HELLO check, likely a rank) is dropped.  Rejected
 * connections are logged at warn level, one line each with the address and
 * the reason, at most ACCEPT_LOG_MAX lines per setup, then one summary. */
#ifndef DDP_TRANSPORT_ACCEPT_H
#define DDP_TRANSPORT_ACCEPT_H

#include <stddef.h>

#include "transport/handshake.h"

#define DDP__ACCEPT_ADDR 80 /* "[ipv6]:port" of a peer */

/* Accepts on the non-blocking listener lfd until every rank below
 * ctx->rank has completed the server handshake on each of its ctx->streams
 * connections, at most until deadline (timeout_s is the figure the timeout
 * message quotes).  fds[r * streams + s] (caller-provided, ctx->rank *
 * streams of them) receives stream s of rank r, which the caller owns from
 * then on, and addrs[r] (ctx->rank of them) its address.  On failure no socket is
 * left open and the message names the ranks that did not connect and the
 * last connection refused meanwhile. */
int ddp__hs_accept(int lfd, const ddp__hs_ctx *ctx, double deadline, double timeout_s,
                   int *fds, char (*addrs)[DDP__ACCEPT_ADDR]);

#endif
