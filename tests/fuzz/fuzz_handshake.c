/* libFuzzer harness: the server side of the TCP transport's connection
 * handshake (src/transport/handshake.c, ddp__hs_server), over a
 * socketpair.  The input is everything the client sends (HELLO, then
 * AUTH), written before the call, the client's end then shut for writing,
 * so the server never waits past the input.  Byte 0 picks the context:
 * bit 0, a secret ("fuzz-secret") or none; bit 1, rank 0 already joined.
 * The server is rank 2 of 4 and its group id is 32 bytes of 0x47.
 *
 * The build wraps ddp__random_bytes (-Wl,--wrap, Makefile) so that the
 * server's nonce is all zeros: a seed can then carry a valid AUTH
 * (tests/fuzz/seeds.py) and the success path is reached too.  Checks:
 * success only with peer in 0..rank-1 and not already joined; failure
 * codes are PROTOCOL/AUTH/CONNECTION/TIMEOUT/IO. */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/time.h"
#include "ddp.h"
#include "fuzz_util.h"
#include "transport/handshake.h"

#define SECRET "fuzz-secret"

int __wrap_ddp__random_bytes(void *buf, size_t n);
int __wrap_ddp__random_bytes(void *buf, size_t n)
{
    memset(buf, 0, n);
    return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 4096)
        return 0;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        abort();
    ddp__hs_ctx ctx = {.rank = 2, .size = 4};
    memset(ctx.group_id, 0x47, sizeof ctx.group_id);
    if (data[0] & 1) {
        ctx.secret = (const uint8_t *)SECRET;
        ctx.secret_len = strlen(SECRET);
    }
    unsigned char connected[4] = {(unsigned char)((data[0] >> 1) & 1), 0, 0, 0};
    size_t off = 1;
    while (off < size) { /* a socketpair buffer holds far more than 4 KiB */
        ssize_t n = write(sv[1], data + off, size - off);
        if (n <= 0)
            abort();
        off += (size_t)n;
    }
    shutdown(sv[1], SHUT_WR);
    int peer = -1, stream = -1;
    int rc = ddp__hs_server(sv[0], &ctx, connected, ddp_time_now() + 5.0, "fuzz client", &peer,
                            &stream);
    fuzz_note("handshake", rc, ddp_last_error());
    if (rc == 0) {
        if (peer < 0 || peer >= ctx.rank || connected[peer])
            abort();
    } else if (rc != DDP_ERR_PROTOCOL && rc != DDP_ERR_AUTH && rc != DDP_ERR_CONNECTION &&
               rc != DDP_ERR_TIMEOUT && rc != DDP_ERR_IO) {
        abort();
    }
    close(sv[0]);
    close(sv[1]);
    return 0;
}
