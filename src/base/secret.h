/* The job's shared secret, one loader for every handshake that proves it
 * (the TCPStore's, store/tcp_proto.c; the transports', transport/handshake.c).
 *
 * Rules (docs/store.md, "The shared secret"):
 *   - DDP_SECRET: the bytes of the value, as they are, at most
 *     DDP__SECRET_MAX of them (no message quotes a secret).
 *   - DDP_SECRET_FILE: the bytes of the file, less one final line ending
 *     ("\n" or "\r\n"), which editors and `echo` add; the file may hold at
 *     most DDP__SECRET_MAX bytes.  A larger file is refused, never cut.
 *   - An empty variable counts as unset; a file that is empty (or holds only
 *     a line ending) is an error.
 *   - Both variables set: an error, since one rank could use one and another
 *     the other, and the mismatch would only show as failed authentication.
 * Every error names the variable and, for the file, its path. */
#ifndef DDP_BASE_SECRET_H
#define DDP_BASE_SECRET_H

#include <stddef.h>
#include <stdint.h>

/* The largest secret file read, in bytes (line ending included). */
#define DDP__SECRET_MAX 4096

/* Loads the secret into *secret (malloc'ed, caller frees, preferably after
 * zeroing it) and its length into *len; both NULL/0 when neither variable
 * is set.  Errors: DDP_ERR_INVALID_ARG (both set, empty or oversized file),
 * DDP_ERR_IO (the file cannot be opened or read). */
int ddp__secret_load(uint8_t **secret, size_t *len);

#endif
