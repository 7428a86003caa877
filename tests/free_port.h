/* A loopback TCP port that nobody listens on now (bound to port 0, then
 * released), for tests that start a store or a job on a fixed port. */
#ifndef DDP_TESTS_FREE_PORT_H
#define DDP_TESTS_FREE_PORT_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

static inline int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) < 0)
        abort();
    close(fd);
    return ntohs(a.sin_port);
}

/* A plain blocking connection to port on 127.0.0.1, for tests that speak
 * raw bytes to a server (-1 on failure). */
static inline int loopback_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

#endif
