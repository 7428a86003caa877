/* Socket helpers; see net.h.  Syscalls are retried on EINTR where they
 * happen; waits go through poll() with the time left to the deadline. */
#include "transport/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/error.h"

/* 4 MiB: the kernel caps at net.core.[rw]mem_max (4 MiB here); a 64 MiB
 * ring step then needs few wakeups per direction. */
#define SOCKBUF_BYTES (4 << 20)

static int ms_left(double deadline)
{
    double left = deadline - ddp_time_now();
    if (left <= 0)
        return 0;
    if (left > 1e6)
        return 1000000000;
    return (int)(left * 1000.0) + 1;
}

static int resolve(const char *host, int port, int passive, struct addrinfo **res)
{
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    char portstr[16];
    snprintf(portstr, sizeof portstr, "%d", port);
    int gai = getaddrinfo(host, portstr, &hints, res);
    if (gai != 0)
        return DDP_ERROR(DDP_ERR_CONNECTION, "cannot resolve host '%s': %s", host,
                         gai_strerror(gai));
    return 0;
}

int ddp__net_tune(int fd, int nonblocking)
{
    int one = 1, buf = SOCKBUF_BYTES;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
        return DDP_ERROR_ERRNO(DDP_ERR_SYSTEM, errno, "setsockopt(TCP_NODELAY)");
    /* Best effort: a smaller kernel cap is not an error. */
    const char *e = getenv("DDP_TCP_SOCKBUF");
    if (e)
        buf = atoi(e);
    if (buf > 0) {
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0)
        return DDP_ERROR_ERRNO(DDP_ERR_SYSTEM, errno, "fcntl(F_GETFL)");
    fl = nonblocking ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
    if (fcntl(fd, F_SETFL, fl) < 0)
        return DDP_ERROR_ERRNO(DDP_ERR_SYSTEM, errno, "fcntl(F_SETFL)");
    return 0;
}

int ddp__net_listen(const char *host, int *fd_out, int *port_out)
{
    struct addrinfo *res = NULL;
    int rc = 0, fd = -1, err = 0;
    DDP_TRY(resolve(host, 0, 1, &res));
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                    ai->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 128) == 0)
            break;
        err = errno;
        close(fd);
        fd = -1;
    }
    DDP_FAIL_OUT(fd < 0, DDP_ERR_CONNECTION, "cannot listen on %s: %s", host, strerror(err));
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
        rc = DDP_ERROR_ERRNO(DDP_ERR_SYSTEM, errno, "getsockname");
        goto out;
    }
    *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    *fd_out = fd;
    fd = -1;
out:
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    return rc;
}

/* Waits for a non-blocking connect; 0 connected, else errno. */
static int connect_wait(int fd, double deadline)
{
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    for (;;) {
        int n = poll(&p, 1, ms_left(deadline));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return errno;
        if (n == 0)
            return ETIMEDOUT;
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        return soerr;
    }
}

int ddp__net_connect(const char *host, int port, double deadline, int *fd_out)
{
    struct addrinfo *res = NULL;
    DDP_TRY(resolve(host, port, 0, &res));
    int err = 0, rc = 0;
    useconds_t backoff = 1000;
    for (;;) {
        for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
            int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                            ai->ai_protocol);
            if (fd < 0) {
                err = errno;
                continue;
            }
            err = 0;
            if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
                err = errno;
                if (err == EINPROGRESS || err == EINTR)
                    err = connect_wait(fd, deadline);
            }
            if (err == 0) {
                rc = ddp__net_tune(fd, 0);
                if (rc < 0) {
                    close(fd);
                    goto out;
                }
                *fd_out = fd;
                goto out;
            }
            close(fd);
        }
        /* Refused: the peer may not listen yet; retry until the deadline. */
        if (ddp_time_now() + backoff * 1e-6 >= deadline || (err != ECONNREFUSED && err != EAGAIN)) {
            rc = DDP_ERROR(err == ETIMEDOUT ? DDP_ERR_TIMEOUT : DDP_ERR_CONNECTION,
                           "connect to %s:%d: %s", host, port, strerror(err ? err : ETIMEDOUT));
            goto out;
        }
        usleep(backoff);
        if (backoff < 50000)
            backoff *= 2;
    }
out:
    freeaddrinfo(res);
    return rc;
}

static void format_addr(const struct sockaddr_storage *ss, char *out, size_t len)
{
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        port = ntohs(in->sin_port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        port = ntohs(in6->sin6_port);
    }
    snprintf(out, len, "%s:%d", host, port);
}

int ddp__net_accept(int lfd, double deadline, int *fd_out, char *addr, size_t addr_len)
{
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC);
        if (fd >= 0) {
            format_addr(&ss, addr, addr_len);
            int rc = ddp__net_tune(fd, 0);
            if (rc < 0) {
                close(fd);
                return rc;
            }
            *fd_out = fd;
            return 1;
        }
        if (errno == EINTR || errno == ECONNABORTED)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return DDP_ERROR_ERRNO(DDP_ERR_SYSTEM, errno, "accept");
        int ms = ms_left(deadline);
        if (ms == 0)
            return 0;
        struct pollfd p = {.fd = lfd, .events = POLLIN};
        if (poll(&p, 1, ms) < 0 && errno != EINTR)
            return DDP_ERROR_ERRNO(DDP_ERR_SYSTEM, errno, "poll");
    }
}

/* Both directions: poll for the event, then one syscall; partial transfers
 * advance the offset, EINTR/EAGAIN retry, 0 bytes read is the peer closing. */
static int xfer_full(int fd, void *buf, size_t len, double deadline, const char *what, int wr)
{
    size_t off = 0;
    while (off < len) {
        ssize_t n = wr ? send(fd, (char *)buf + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT)
                       : recv(fd, (char *)buf + off, len - off, MSG_DONTWAIT);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n == 0 && !wr)
            return DDP_ERROR(DDP_ERR_CONNECTION, "%s closed the connection", what);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return DDP_ERROR_ERRNO(DDP_ERR_CONNECTION, errno, "%s %s",
                                   wr ? "write to" : "read from", what);
        int ms = ms_left(deadline);
        if (ms == 0)
            return DDP_ERROR(DDP_ERR_TIMEOUT, "%s %s: timed out after %zu of %zu bytes",
                             wr ? "write to" : "read from", what, off, len);
        struct pollfd p = {.fd = fd, .events = wr ? POLLOUT : POLLIN};
        if (poll(&p, 1, ms) < 0 && errno != EINTR)
            return DDP_ERROR_ERRNO(DDP_ERR_SYSTEM, errno, "poll");
    }
    return 0;
}

int ddp__net_read_full(int fd, void *buf, size_t len, double deadline, const char *what)
{
    return xfer_full(fd, buf, len, deadline, what, 0);
}

int ddp__net_write_full(int fd, const void *buf, size_t len, double deadline, const char *what)
{
    return xfer_full(fd, (void *)buf, len, deadline, what, 1);
}

int ddp__net_local_host(char *out, size_t len)
{
    const char *env = getenv("DDP_TCP_HOST");
    if (env && *env) {
        snprintf(out, len, "%s", env);
        return 0;
    }
    char name[256];
    snprintf(out, len, "127.0.0.1");
    if (gethostname(name, sizeof name) != 0)
        return 0;
    name[sizeof name - 1] = '\0';
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(name, NULL, &hints, &res) != 0)
        return 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)ai->ai_addr;
        if (inet_ntop(AF_INET, &in->sin_addr, out, (socklen_t)len))
            break;
    }
    freeaddrinfo(res);
    return 0;
}

int ddp__net_random(void *buf, size_t len)
{
    size_t off = 0;
    while (off < len) {
        ssize_t n = getrandom((char *)buf + off, len - off, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return DDP_ERROR_ERRNO(DDP_ERR_SYSTEM, errno, "getrandom");
        off += (size_t)n;
    }
    return 0;
}
