/* Raw loopback TCP bandwidth, for bench/collectives.sh: the ceiling the
 * collectives work under on this machine at this moment.
 *
 * One way (default): a forked receiver drains a socket; the sender writes
 * BYTES in 1 MiB writes from a 1 MiB buffer and waits for a one-byte
 * acknowledgement; prints GB/s per round.
 *
 * Both ways ("both"): what a 2-rank ring all-reduce asks of the kernel.
 * Each process sends BYTES and receives BYTES at the same time, from and
 * into buffers of BYTES (touched once before, so cold in cache like a large
 * all-reduce's vector), 1 MiB per call, with libddp's 4 MiB socket buffers;
 * prints GB/s each way per round (after one untimed round).  An all-reduce of B bytes on 2 ranks
 * moves B each way, so its bus bandwidth is directly comparable.
 *
 *   tcp_loopback [BYTES [ROUNDS [both]]]      (default 64 MiB, 5 rounds) */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (1u << 20)

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Sends and receives total bytes at once on non-blocking socket s; 0 or -1.
 * EAGAIN just means the other direction's turn: poll says when to retry. */
static int exchange(int s, const char *src, char *dst, size_t total)
{
    size_t sent = 0, got = 0;
    while (sent < total || got < total) {
        struct pollfd pf = {s, (short)((sent < total ? POLLOUT : 0) | (got < total ? POLLIN : 0)), 0};
        if (poll(&pf, 1, 10000) <= 0)
            return -1;
        while (got < total) {
            size_t k = total - got < CHUNK ? total - got : CHUNK;
            ssize_t n = recv(s, dst + got, k, MSG_DONTWAIT);
            if (n <= 0)
                break;
            got += (size_t)n;
        }
        while (sent < total) {
            size_t k = total - sent < CHUNK ? total - sent : CHUNK;
            ssize_t n = send(s, src + sent, k, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (n <= 0)
                break;
            sent += (size_t)n;
        }
    }
    return 0;
}

static int tune(int s)
{
    int one = 1, buf = 4 << 20;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(s, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(s, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    return fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
}

int main(int argc, char **argv)
{
    size_t total = argc > 1 ? strtoull(argv[1], NULL, 10) : 64u << 20;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    int both = argc > 3 && strcmp(argv[3], "both") == 0;
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof a;
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 1) < 0 ||
        getsockname(l, (struct sockaddr *)&a, &sl) < 0) {
        perror("tcp_loopback: listen");
        return 1;
    }
    size_t span = both ? total : CHUNK;
    char *buf = NULL, *in = NULL;
    fflush(NULL);
    pid_t pid = fork();
    /* Each process touches its own buffers after the fork: pages shared
     * copy-on-write would fault inside the timed rounds. */
    buf = malloc(span);
    in = both ? malloc(span) : NULL;
    if (!buf || (both && !in))
        return 1;
    memset(buf, 1, span);
    if (in)
        memset(in, 2, span);
    if (pid == 0) { /* the peer: receiver, or the other side of the exchange */
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(s, (struct sockaddr *)&a, sizeof a) < 0)
            _exit(1);
        if (both) {
            if (tune(s) < 0)
                _exit(1);
            for (int r = 0; r <= rounds; r++)
                if (exchange(s, buf, in, total) < 0)
                    _exit(1);
            _exit(0);
        }
        for (int r = 0; r < rounds; r++) {
            size_t got = 0;
            while (got < total) {
                ssize_t n = recv(s, buf, CHUNK, 0);
                if (n <= 0)
                    _exit(1);
                got += (size_t)n;
            }
            if (send(s, "k", 1, 0) != 1)
                _exit(1);
        }
        _exit(0);
    }
    int s = accept(l, NULL, NULL);
    int one = 1;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* Both ways: one untimed round first, while the peer touches its pages. */
    if (both && (tune(s) < 0 || exchange(s, buf, in, total) < 0))
        return 1;
    for (int r = 0; r < rounds; r++) {
        double t0 = now();
        if (both) {
            if (exchange(s, buf, in, total) < 0) {
                perror("tcp_loopback: exchange");
                return 1;
            }
        } else {
            size_t sent = 0;
            while (sent < total) {
                ssize_t n = send(s, buf, total - sent < CHUNK ? total - sent : CHUNK, 0);
                if (n <= 0) {
                    perror("tcp_loopback: send");
                    return 1;
                }
                sent += (size_t)n;
            }
            char k;
            if (recv(s, &k, 1, 0) != 1)
                return 1;
        }
        printf("%.2f%s", (double)total / (now() - t0) / 1e9, r + 1 < rounds ? " " : " GB/s\n");
    }
    waitpid(pid, NULL, 0);
    close(s);
    close(l);
    free(buf);
    free(in);
    return 0;
}
