/* Raw loopback TCP bandwidth, one way, for bench/collectives.sh: the
 * ceiling the collectives work under on this machine at this moment.  A
 * forked receiver drains a socket; the sender writes BYTES in 1 MiB writes
 * and waits for a one-byte acknowledgement; prints GB/s per round.
 *
 *   tcp_loopback [BYTES [ROUNDS]]      (default 64 MiB, 5 rounds) */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    size_t total = argc > 1 ? strtoull(argv[1], NULL, 10) : 64u << 20, chunk = 1u << 20;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof a;
    if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 1) < 0 ||
        getsockname(l, (struct sockaddr *)&a, &sl) < 0) {
        perror("tcp_loopback: listen");
        return 1;
    }
    char *buf = malloc(chunk);
    if (!buf)
        return 1;
    memset(buf, 1, chunk);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) { /* receiver */
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(s, (struct sockaddr *)&a, sizeof a) < 0)
            _exit(1);
        for (int r = 0; r < rounds; r++) {
            size_t got = 0;
            while (got < total) {
                ssize_t n = recv(s, buf, chunk, 0);
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
    for (int r = 0; r < rounds; r++) {
        double t0 = now();
        size_t sent = 0;
        while (sent < total) {
            ssize_t n = send(s, buf, total - sent < chunk ? total - sent : chunk, 0);
            if (n <= 0) {
                perror("tcp_loopback: send");
                return 1;
            }
            sent += (size_t)n;
        }
        char k;
        if (recv(s, &k, 1, 0) != 1)
            return 1;
        printf("%.2f%s", (double)total / (now() - t0) / 1e9, r + 1 < rounds ? " " : " GB/s\n");
    }
    waitpid(pid, NULL, 0);
    close(s);
    close(l);
    free(buf);
    return 0;
}
