/* libFuzzer harness: the TCP transport's frame parsing and receive state
 * machine (src/transport/tcp/loop.c: parse_header, staging, unexpected and
 * held frames, ABORT/BYE).  The frame header is parsed only inside a live
 * transport, so each input builds a real 2-rank tcp transport in this
 * process over loopback (rank 1 on a thread, rendezvous through a
 * HashStore), then writes raw bytes on rank 1's socket to rank 0 in place
 * of rank 1's transport (ddp__tcp_debug_fd) and shuts it for writing, so
 * rank 0 always reaches the end of the stream: no wait can hang.
 *
 * Input: byte 0 & 3 = number of receives rank 0 posts (0..3), each
 * described by 3 bytes (tag, length low, length high: up to 64 KiB, so
 * both the staged and the held/body paths are reached); the rest is the
 * stream.  Rank 0 waits for its receives; any outcome but a crash, a
 * timeout (the end of the stream went unnoticed) or a sanitizer report is
 * fine. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/time.h"
#include "ddp.h"
#include "fuzz_util.h"
#include "transport/tcp.h"

#define MAX_RECV 3

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setenv("DDP_TCP_HOST", "127.0.0.1", 1);
    return 0;
}

typedef struct rank1 {
    ddp_store_t *store;
    ddp__tp *tp;
    int rc;
} rank1;

static void *rank1_main(void *arg)
{
    rank1 *r = arg;
    r->rc = ddp__tcp_create(r->store, "fz", 1, 2, 10.0, &r->tp);
    return NULL;
}

/* Writes all of buf on the blocking socket fd while rank 0 is not yet
 * reading (the inputs are small: loopback buffers take them). */
static void write_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k <= 0)
            return; /* buffer full: what did not fit is simply not sent */
        p += k;
        n -= (size_t)k;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 65536)
        return 0;
    int nrecv = data[0] & 3;
    if (nrecv > MAX_RECV || size < 1 + 3 * (size_t)nrecv)
        return 0;
    ddp_store_t *s0 = NULL;
    rank1 r1 = {0};
    ddp__tp *tp0 = NULL;
    if (ddp_store_hash_create(&s0) < 0 || ddp_store_hash_attach(s0, &r1.store) < 0)
        abort();
    pthread_t th;
    if (pthread_create(&th, NULL, rank1_main, &r1) != 0)
        abort();
    int rc0 = ddp__tcp_create(s0, "fz", 0, 2, 10.0, &tp0);
    pthread_join(th, NULL);
    if (rc0 < 0 || r1.rc < 0) {
        fprintf(stderr, "fuzz_tcp_frames: transport setup failed: %s\n", ddp_last_error());
        abort(); /* the harness, not the input */
    }

    ddp__req reqs[MAX_RECV], *rp[MAX_RECV];
    uint8_t *bufs[MAX_RECV] = {0};
    const uint8_t *q = data + 1;
    for (int i = 0; i < nrecv; i++, q += 3) {
        size_t len = (size_t)q[1] | (size_t)q[2] << 8;
        bufs[i] = malloc(len ? len : 1);
        memset(bufs[i], 0xEE, len ? len : 1);
        if (ddp__tp_irecv(tp0, &reqs[i], 1, q[0], bufs[i], len) < 0)
            abort();
        rp[i] = &reqs[i];
    }
    int fd = ddp__tcp_debug_fd(r1.tp, 0);
    write_all(fd, q, size - (size_t)(q - data));
    shutdown(fd, SHUT_WR);
    if (nrecv > 0) {
        /* The stream ends, so the wait must end with an answer, not at its
         * deadline: a timeout means the end went unnoticed (a hang).  The
         * deadline is generous (a loaded machine is slow, not wrong) and
         * under libFuzzer's -timeout of 10 s. */
        int rc = ddp__tp_wait(tp0, rp, nrecv, ddp_time_now() + 8.0, DDP__WAIT_ANY_PEER);
        fuzz_note("tcp_frames", rc, ddp_last_error());
        if (rc == DDP_ERR_TIMEOUT) {
            fprintf(stderr, "fuzz_tcp_frames: the wait timed out after end of stream: %s\n",
                    ddp_last_error());
            abort();
        }
    }
    ddp__tp_destroy(tp0);
    ddp__tp_destroy(r1.tp);
    ddp_store_destroy(r1.store);
    ddp_store_destroy(s0);
    for (int i = 0; i < nrecv; i++)
        free(bufs[i]);
    return 0;
}
