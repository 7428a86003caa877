/* TCPStore server: admitting connections, and keeping strangers from taking
 * every descriptor (split from tcp_server.c, the loop).
 *
 * Anyone who can reach the port can connect, and each connection costs the
 * server process a descriptor.  Without a bound, ~1,100 idle connections
 * against the usual limit of 1,024 descriptors left rank 0 unable to accept
 * its own ranks or to open its checkpoint file.  So:
 *
 *   - A connection is a stranger until it proves itself: with a secret,
 *     until it authenticates; without one, until it has sent a complete
 *     first request (our client sends one during its handshake).
 *   - At most `cap` strangers are held: DDP_STORE_MAX_UNAUTH, and never more
 *     than a quarter of the process's descriptor limit, so the rest of the
 *     process (its own files, the transports) keeps room.  Admitting one
 *     more drops the oldest stranger: a flood then cycles through the
 *     strangers' slots while proven connections stay, and a real client,
 *     the newest, gets its handshake done.
 *   - Out of descriptors anyway (EMFILE: the rest of the process used
 *     them): drop the oldest stranger and accept again; with no stranger to
 *     drop, the reserve descriptor (libuv's and nginx's trick) is closed to
 *     accept the pending connection and close it, then reopened, so the
 *     listening socket's queue drains instead of waking epoll forever.
 *     Without even a reserve, accepting pauses for a moment.
 *
 * Drops are counted and logged at most once a second, not one line per
 * connection of a flood. */
#include "store/tcp_server_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "base/rng.h"
#include "base/sock.h"
#include "base/time.h"

#define MAX_CONNS 65536
#define ACCEPT_PAUSE_S 0.1 /* no descriptor and no reserve: try again after this */

/* ---- strangers: a FIFO, oldest first ------------------------------------ */

static void stranger_add(ddp__ts_server *s, conn *c)
{
    c->stranger = 1;
    c->sprev = s->strangers_tail;
    c->snext = NULL;
    if (s->strangers_tail)
        s->strangers_tail->snext = c;
    else
        s->strangers = c;
    s->strangers_tail = c;
    s->nstrangers++;
}

void ddp__ts_stranger_remove(ddp__ts_server *s, conn *c)
{
    if (!c->stranger)
        return;
    if (c->sprev)
        c->sprev->snext = c->snext;
    else
        s->strangers = c->snext;
    if (c->snext)
        c->snext->sprev = c->sprev;
    else
        s->strangers_tail = c->sprev;
    c->sprev = c->snext = NULL;
    c->stranger = 0;
    s->nstrangers--;
}

/* Logs the drops and refusals since the last report, at most once a
 * second. */
static void report_drops(ddp__ts_server *s)
{
    double now = ddp_time_now();
    if ((!s->drops_unreported && !s->refused_unreported) || now < s->drops_logged_at + 1.0)
        return;
    if (s->drops_unreported)
        DDP_WARN("%s: dropped %d unauthenticated connection(s) to make room (at most %d held: "
                 "DDP_STORE_MAX_UNAUTH, and a quarter of the descriptor limit)",
                 s->where, s->drops_unreported, s->max_strangers);
    if (s->refused_unreported)
        DDP_WARN("%s: out of descriptors: refused %d connection(s)", s->where,
                 s->refused_unreported);
    s->drops_unreported = s->refused_unreported = 0;
    s->drops_logged_at = now;
}

/* Closes the oldest stranger's descriptor now (its struct goes at the next
 * reap: an event of this batch may still name it). */
static void drop_oldest_stranger(ddp__ts_server *s)
{
    conn *c = s->strangers;
    ddp__ts_stranger_remove(s, c);
    DDP_DEBUG("%s: dropping unauthenticated client %s to make room", s->where, c->peer);
    epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->fd = -1;
    c->dead = 1;
    s->drops_unreported++;
}

/* ---- the cap and the reserve ---------------------------------------------- */

int ddp__ts_admission_init(ddp__ts_server *s)
{
    int cap = 256;
    DDP_TRY(ddp__env_int("DDP_STORE_MAX_UNAUTH", &cap));
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        rlim_t quarter = rl.rlim_cur / 4 > 0 ? rl.rlim_cur / 4 : 1;
        if ((rlim_t)cap > quarter)
            cap = (int)quarter;
    }
    s->max_strangers = cap;
    s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    DDP_FAIL_IF(s->reserve_fd < 0, DDP_ERR_SYSTEM, "%s: open /dev/null (a reserve descriptor): %s",
                s->where, strerror(errno));
    return 0;
}

/* The descriptors are gone (EMFILE/ENFILE): make room, or refuse the
 * pending connection with the reserve.  Returns 1 to accept again, 0 to
 * stop for this event. */
static int out_of_descriptors(ddp__ts_server *s)
{
    if (s->strangers) {
        drop_oldest_stranger(s);
        return 1;
    }
    if (s->reserve_fd >= 0) {
        close(s->reserve_fd);
        int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        int got = fd >= 0;
        if (got)
            close(fd);
        s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (got) {
            s->refused_unreported++;
            return 1;
        }
    }
    if (s->reserve_fd < 0) {
        /* Level-triggered epoll would report the pending connection again at
         * once: stop listening for a moment instead of spinning. */
        struct epoll_event ev = {.events = 0, .data.ptr = s->listen_marker};
        epoll_ctl(s->epfd, EPOLL_CTL_MOD, s->listen_fd, &ev);
        s->accept_resume_at = ddp_time_now() + ACCEPT_PAUSE_S;
    }
    return 0;
}

/* The epoll timeout in ms until t (-1: t is 0, nothing due). */
static int ms_until(double t, double now)
{
    if (t == 0)
        return -1;
    return t <= now ? 0 : (int)((t - now) * 1000.0) + 1;
}

int ddp__ts_admission_tick(ddp__ts_server *s)
{
    report_drops(s);
    double now = ddp_time_now();
    if (s->accept_resume_at != 0 && now >= s->accept_resume_at) {
        if (s->reserve_fd < 0)
            s->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = s->listen_marker};
        epoll_ctl(s->epfd, EPOLL_CTL_MOD, s->listen_fd, &ev);
        s->accept_resume_at = 0;
    }
    int a = ms_until(s->accept_resume_at, now);
    int b = s->drops_unreported || s->refused_unreported ? ms_until(s->drops_logged_at + 1.0, now)
                                                         : -1;
    return a < 0 ? b : b < 0 ? a : a < b ? a : b;
}

/* ---- accepting ------------------------------------------------------------ */

/* Registers an accepted descriptor and sends HELLO. */
static void admit(ddp__ts_server *s, int fd, const char *peer)
{
    conn *c = s->nconns < MAX_CONNS ? calloc(1, sizeof *c) : NULL;
    if (!c) {
        DDP_WARN("%s: refusing client %s: %d connections open", s->where, peer, s->nconns);
        close(fd);
        return;
    }
    c->fd = fd;
    snprintf(c->peer, sizeof c->peer, "%s", peer);
    c->authed = s->secret == NULL;
    c->auth_deadline = ddp_time_now() + s->auth_timeout_s;
    ddp__sock_set_nodelay(fd);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    if (ddp__random_bytes(c->nonce, sizeof c->nonce) < 0 ||
        epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        DDP_WARN("%s: refusing client %s: %s", s->where, peer, ddp_last_error());
        close(fd);
        free(c);
        return;
    }
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    stranger_add(s, c);
    DDP_DEBUG("%s: client %s connected", s->where, peer);
    ddp__ts_begin(&c->out);
    ddp__ts_u8(&c->out, s->secret != NULL);
    ddp__ts_raw(&c->out, c->nonce, sizeof c->nonce);
    if (s->job_id[0]) /* optional: a server of no job sends the short HELLO */
        ddp__ts_bytes(&c->out, s->job_id, strlen(s->job_id));
    ddp__ts_answer(s, c, DDP__TS_HELLO, 0);
}

void ddp__ts_accept(ddp__ts_server *s)
{
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(s->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if ((errno == EMFILE || errno == ENFILE) && out_of_descriptors(s))
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EMFILE && errno != ENFILE)
                DDP_WARN("%s: accept: %s", s->where, strerror(errno));
            break;
        }
        if (s->nstrangers >= s->max_strangers)
            drop_oldest_stranger(s);
        char peer[64];
        ddp__sock_addr_str((struct sockaddr *)&ss, peer, sizeof peer);
        admit(s, fd, peer);
    }
    report_drops(s);
}
