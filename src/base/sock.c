/* The socket library; see sock.h.  Waits go through poll() with the time
 * left to the deadline; syscalls are retried on EINTR where they happen. */
#include "base/sock.h"

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
#include <unistd.h>

#include "base/env.h"
#include "base/error.h"
#include "base/time.h"

int ddp__sock_set_nodelay(int fd)
{
    int one = 1;
    /* Store requests and handshake messages are small request/response
     * pairs, and a transport frame's header goes out before its payload:
     * Nagle would hold each back for an ACK. */
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
        return DDP_ERROR_ERRNO(DDP_ERR_SYSTEM, errno, "setsockopt TCP_NODELAY");
    return 0;
}

int ddp__sock_tune(int fd, int nonblocking)
{
    /* Default 4 MiB (src/base/env.c; 0: kernel autotuning): the kernel caps
     * at net.core.[rw]mem_max (4 MiB here), and a 64 MiB ring step then
     * needs few wakeups per direction. */
    size_t sockbuf = 0;
    DDP_TRY(ddp__env_size("DDP_TCP_SOCKBUF", &sockbuf));
    int buf = (int)sockbuf;
    DDP_TRY(ddp__sock_set_nodelay(fd));
    /* Best effort: a smaller kernel cap is not an error. */
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

void ddp__sock_hostport(const char *host, int port, char *buf, size_t len)
{
    if (strchr(host, ':'))
        snprintf(buf, len, "[%s]:%d", host, port);
    else
        snprintf(buf, len, "%s:%d", host, port);
}

void ddp__sock_addr_str(const struct sockaddr *sa, char *buf, size_t len)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        port = ntohs(a->sin_port);
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
        port = ntohs(a->sin6_port);
    }
    ddp__sock_hostport(ip, port, buf, len);
}

static int resolve(const char *host, int port, int passive, struct addrinfo **res, int *gai)
{
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
    *gai = getaddrinfo(host, service, &hints, res);
    return *gai == 0 ? 0 : -1;
}

int ddp__sock_listen(const char *host, int port, int backlog, int *fd_out, int *port_out)
{
    char where[300];
    ddp__sock_hostport(host, port, where, sizeof where);
    struct addrinfo *res = NULL;
    int gai = 0;
    DDP_FAIL_IF(resolve(host, port, 1, &res, &gai) < 0, DDP_ERR_CONNECTION,
                "listen on %s: cannot resolve '%s': %s", where, host, gai_strerror(gai));
    int fd = -1, err = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int one = 1;
        /* A restarted job must be able to rebind while old connections
         * linger in TIME_WAIT. */
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, backlog) == 0)
            break;
        err = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return DDP_ERROR_ERRNO(DDP_ERR_CONNECTION, err, "listen on %s", where);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
        err = errno;
        close(fd);
        return DDP_ERROR_ERRNO(DDP_ERR_SYSTEM, err, "getsockname on %s", where);
    }
    *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    *fd_out = fd;
    return 0;
}

int ddp__sock_poll_ms(double left_s)
{
    if (!(left_s > 0)) /* NaN too */
        return 0;
    return left_s > 1e6 ? 1000000000 : (int)(left_s * 1000) + 1;
}

/* Waits for events on fd until the deadline; 1 ready, 0 timed out. */
static int wait_fd(int fd, short events, double deadline)
{
    for (;;) {
        double left = deadline - ddp_time_now();
        if (left <= 0)
            return 0;
        struct pollfd p = {fd, events, 0};
        int n = poll(&p, 1, ddp__sock_poll_ms(left));
        if (n > 0)
            return 1;
        if (n < 0 && errno != EINTR)
            return 1; /* let the syscall report the error */
    }
}

/* One attempt at every resolved address; 0 connected, else errno. */
static int try_connect(struct addrinfo *res, double deadline, int *fd_out)
{
    int err = ECONNREFUSED;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            err = errno;
            continue;
        }
        int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
        if (rc < 0 && (errno == EINPROGRESS || errno == EINTR)) {
            /* Bound each attempt so a silent address does not eat the
             * whole timeout before the next one is tried. */
            double d = ddp_time_now() + 2.0 < deadline ? ddp_time_now() + 2.0 : deadline;
            if (!wait_fd(fd, POLLOUT, d)) {
                err = ETIMEDOUT;
                close(fd);
                continue;
            }
            socklen_t sl = sizeof err;
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &sl) < 0)
                err = errno;
            rc = err ? -1 : 0;
        } else if (rc < 0) {
            err = errno;
        }
        if (rc == 0) {
            *fd_out = fd;
            return 0;
        }
        close(fd);
    }
    return err;
}

int ddp__sock_connect(const char *host, int port, double deadline, const char *what,
                      int *fd_out)
{
    double total = deadline - ddp_time_now();
    ddp__backoff b;
    ddp__backoff_init(&b, total, 1.0);
    b.sleep_s = 0.01;
    char last[200] = "no attempt made";
    int attempts = 0;
    for (;;) {
        struct addrinfo *res = NULL;
        int gai = 0;
        attempts++;
        if (resolve(host, port, 0, &res, &gai) < 0) {
            snprintf(last, sizeof last, "cannot resolve '%s': %s", host, gai_strerror(gai));
        } else {
            int fd = -1, err = try_connect(res, deadline, &fd);
            freeaddrinfo(res);
            if (err == 0) {
                int rc = ddp__sock_set_nodelay(fd);
                if (rc < 0) {
                    close(fd);
                    return rc;
                }
                *fd_out = fd;
                return 0;
            }
            /* An attempt cut short by the deadline says less than the
             * error before it. */
            if (!(err == ETIMEDOUT && attempts > 1 && ddp_time_now() >= deadline))
                snprintf(last, sizeof last, "%s", strerror(err));
        }
        if (ddp__backoff_sleep(&b) < 0)
            return DDP_ERROR(DDP_ERR_TIMEOUT,
                             "%s: could not connect within %.3g s (%d attempts, last: %s)", what,
                             total, attempts, last);
    }
}

int ddp__sock_accept(int lfd, double deadline, int *fd_out, char *addr, size_t addr_len)
{
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0) {
            ddp__sock_addr_str((struct sockaddr *)&ss, addr, addr_len);
            int rc = ddp__sock_set_nodelay(fd);
            if (rc < 0) {
                close(fd);
                return rc;
            }
            *fd_out = fd;
            return 1;
        }
        /* ECONNABORTED: the client gave up while queued; wait for the next. */
        if (errno == EINTR || errno == ECONNABORTED)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return DDP_ERROR_ERRNO(DDP_ERR_SYSTEM, errno, "accept");
        if (!wait_fd(lfd, POLLIN, deadline))
            return 0;
    }
}

int ddp__sock_send_all(int fd, const void *buf, size_t len, double deadline, const char *what)
{
    const char *p = buf;
    size_t left = len;
    while (left) {
        /* MSG_NOSIGNAL: a closed peer is an error to report, not SIGPIPE.
         * MSG_DONTWAIT: a blocking socket must not block past the deadline. */
        ssize_t n = send(fd, p, left, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            left -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!wait_fd(fd, POLLOUT, deadline))
                return DDP_ERROR(DDP_ERR_TIMEOUT, "%s: send timed out (%zu of %zu bytes sent)",
                                 what, len - left, len);
            continue;
        }
        return DDP_ERROR_ERRNO(DDP_ERR_CONNECTION, errno, "%s: send", what);
    }
    return 0;
}

int ddp__sock_recv_some(int fd, void *buf, size_t cap, double deadline, const char *what,
                        size_t *got)
{
    for (;;) {
        /* Poll first: the caller expects an answer that is usually not
         * there yet, and a speculative recv would only return EAGAIN. */
        if (!wait_fd(fd, POLLIN, deadline))
            return DDP_ERROR(DDP_ERR_TIMEOUT, "%s: no answer in time", what);
        ssize_t n = recv(fd, buf, cap, MSG_DONTWAIT);
        if (n > 0) {
            *got = (size_t)n;
            return 0;
        }
        if (n == 0)
            return DDP_ERROR(DDP_ERR_CONNECTION, "%s: connection closed by the peer", what);
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
            continue; /* interrupted, or a spurious wake-up */
        return DDP_ERROR_ERRNO(DDP_ERR_CONNECTION, errno, "%s: recv", what);
    }
}

int ddp__sock_recv_all(int fd, void *buf, size_t len, double deadline, const char *what)
{
    char *p = buf;
    while (len) {
        size_t got = 0;
        DDP_TRY(ddp__sock_recv_some(fd, p, len, deadline, what, &got));
        p += got;
        len -= got;
    }
    return 0;
}
