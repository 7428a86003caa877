/* Private to the TCPStore server (tcp_server.c, the event loop and the
 * connections; tcp_server_requests.c, the requests and the key-value
 * semantics): the server and connection structs and the calls between the
 * two halves, kept apart as gloo and redis keep the loop from the
 * commands.  Nothing here is seen outside src/store/. */
#ifndef DDP_STORE_TCP_SERVER_INTERNAL_H
#define DDP_STORE_TCP_SERVER_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "store/kv.h"
#include "store/store_impl.h"
#include "store/tcp_proto.h"
#include "store/tcp_server.h"

#define SHRINK_BYTES (1u << 20) /* buffers larger than this are freed when idle */

typedef struct conn {
    struct conn *prev, *next;
    struct conn *sprev, *snext; /* the strangers' FIFO (tcp_server_accept.c) */
    int stranger;               /* not yet proven: on that FIFO */
    int fd;                     /* -1 once dropped to make room */
    char peer[64];
    int authed;
    int dead;          /* close after this loop iteration */
    int close_after;   /* close once the pending answer is written */
    int want_out;      /* EPOLLOUT registered */
    double auth_deadline;
    uint8_t nonce[DDP__TS_NONCE];
    uint8_t *in;
    size_t in_len, in_cap;
    ddp__ts_writer out;
    size_t out_off;
    /* A parked GET or WAIT. */
    int parked_op;
    char **keys;
    size_t nkeys;
    double deadline;
} conn;

struct ddp__ts_server {
    int listen_fd, epfd, wake_fd;
    pthread_t thread;
    char where[320];
    uint8_t *secret;
    size_t slen;
    char job_id[DDP__STORE_MAX_JOB_ID + 1]; /* told to every client in HELLO */
    ddp__kv kv;
    conn *conns;
    int nconns;
    /* Admission (tcp_server_accept.c). */
    void *listen_marker;          /* epoll's data for the listening socket */
    conn *strangers, *strangers_tail; /* oldest first */
    int nstrangers, max_strangers;
    int reserve_fd;               /* closed to accept-and-refuse at EMFILE */
    double accept_resume_at;      /* accepting paused until then (0: not) */
    int drops_unreported, refused_unreported;
    double drops_logged_at;
    int stop;
    double auth_timeout_s;
};

/* ---- connections (tcp_server.c) ------------------------------------------ */

/* Marks c to be closed after this loop iteration, logging why (once). */
void ddp__ts_drop(ddp__ts_server *s, conn *c, const char *why);
/* Sends the answer built in c->out (what the socket does not take now
 * waits for EPOLLOUT). */
void ddp__ts_answer(ddp__ts_server *s, conn *c, int op, int32_t status);
/* Sends an answer whose payload is the formatted message. */
void ddp__ts_answer_error(ddp__ts_server *s, conn *c, int op, int32_t status, const char *fmt,
                          ...) __attribute__((format(printf, 5, 6)));
/* An answer still being written: the next request waits for it. */
static inline int ddp__ts_pending_out(const conn *c) { return c->out.len > 0; }

/* ---- admission (tcp_server_accept.c) ------------------------------------- */

/* Reads the cap on strangers and opens the reserve descriptor. */
int ddp__ts_admission_init(ddp__ts_server *s);
/* Accepts what is pending on the listening socket. */
void ddp__ts_accept(ddp__ts_server *s);
/* c proved itself (or is going): off the strangers' FIFO. */
void ddp__ts_stranger_remove(ddp__ts_server *s, conn *c);
/* Between batches of events: listens again after a pause of accepting, and
 * logs the drops not yet reported.  Returns the epoll timeout in ms until
 * the next of those is due (-1: none). */
int ddp__ts_admission_tick(ddp__ts_server *s);

/* ---- requests (tcp_server_requests.c) ------------------------------------ */

/* Handles the complete requests buffered on c, one at a time. */
void ddp__ts_process(ddp__ts_server *s, conn *c);
/* Answers parked requests past their deadline; closes connections that did
 * not authenticate in time.  Returns the epoll timeout in ms (-1: none). */
int ddp__ts_expire(ddp__ts_server *s);
/* Frees a parked request's keys (c is no longer parked). */
void ddp__ts_unpark(conn *c);

#endif
