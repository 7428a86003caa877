/* Handshake messages and their checks; see handshake.h and
 * docs/wire-format.md.  Every field is encoded little-endian explicitly, so
 * the format does not depend on the host or on struct layout. */
#include "transport/handshake.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "base/error.h"
#include "base/rng.h"
#include "base/sha256.h"
#include "base/sock.h"
#include "base/time.h"

enum { HS_HELLO = 1, HS_CHALLENGE = 2, HS_AUTH = 3, HS_WELCOME = 4 };
enum {
    ST_OK = 0,
    ST_BAD_GROUP = 1,
    ST_BAD_RANK = 2,
    ST_DUPLICATE = 3,
    ST_BAD_AUTH = 4,
    ST_BAD_VERSION = 5,
    ST_BAD_STREAMS = 6
};

#define HELLO_LEN (12 + 16 + DDP__HS_ID_LEN + 32)
#define CHALLENGE_LEN (12 + 32 + 32)
#define AUTH_LEN (12 + 32)
#define WELCOME_LEN 12
_Static_assert(HELLO_LEN <= DDP__HS_MSG_MAX && CHALLENGE_LEN <= DDP__HS_MSG_MAX,
               "ddp__hs_srv's buffers hold every message");

static const char *status_text(uint32_t st)
{
    switch (st) {
    case ST_BAD_GROUP: return "it belongs to another job or group";
    case ST_BAD_RANK: return "rank or world size do not match";
    case ST_DUPLICATE: return "that rank is already connected";
    case ST_BAD_AUTH: return "authentication failed (is DDP_SECRET the same everywhere?)";
    case ST_BAD_VERSION: return "protocol version differs";
    case ST_BAD_STREAMS:
        return "more connections per pair than it takes (is DDP_SOCKET_NUM_STREAMS the same "
               "everywhere?)";
    }
    return "unknown reason";
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* magic u32, version u16, type u16, then a u32 (status or flags). */
static void put_head(uint8_t *p, int type, uint32_t word)
{
    put32(p, DDP__HS_MAGIC);
    p[4] = DDP__HS_VERSION & 0xff;
    p[5] = DDP__HS_VERSION >> 8;
    p[6] = (uint8_t)type;
    p[7] = 0;
    put32(p + 8, word);
}

/* Checks magic, version and type of a received message; the message says
 * what was wrong, for the server's log or the client's error. */
static int check_head(const uint8_t *p, int type, const char *what, int *version_bad)
{
    if (get32(p) != DDP__HS_MAGIC)
        return DDP_ERROR(DDP_ERR_PROTOCOL, "%s: bad handshake magic 0x%08x (not a libddp peer)",
                         what, get32(p));
    unsigned version = p[4] | (unsigned)p[5] << 8;
    if (version != DDP__HS_VERSION) {
        if (version_bad)
            *version_bad = 1;
        return DDP_ERROR(DDP_ERR_PROTOCOL, "%s: handshake version %u, expected %u", what, version,
                         DDP__HS_VERSION);
    }
    if (p[6] != type || p[7] != 0)
        return DDP_ERROR(DDP_ERR_PROTOCOL, "%s: handshake message type %u, expected %d", what,
                         p[6], type);
    return 0;
}

/* mac = HMAC(secret, label || hello || server nonce) */
static void compute_mac(const ddp__hs_ctx *ctx, const char *label, const uint8_t *hello,
                        const uint8_t *nonce_s, uint8_t out[DDP__SHA256_LEN])
{
    uint8_t msg[8 + HELLO_LEN + 32];
    memset(msg, 0, 8);
    memcpy(msg, label, strlen(label) < 8 ? strlen(label) : 8);
    memcpy(msg + 8, hello, HELLO_LEN);
    memcpy(msg + 8 + HELLO_LEN, nonce_s, 32);
    ddp__hmac_sha256(ctx->secret ? ctx->secret : (const uint8_t *)"", ctx->secret_len, msg,
                     sizeof msg, out);
}

int ddp__hs_client(int fd, const ddp__hs_ctx *ctx, int peer, int stream, double deadline,
                   const char *what)
{
    uint8_t hello[HELLO_LEN], chal[CHALLENGE_LEN], auth[AUTH_LEN], welcome[WELCOME_LEN];
    uint8_t mac[DDP__SHA256_LEN];
    put_head(hello, HS_HELLO, ctx->secret ? 1u : 0u);
    put32(hello + 12, (uint32_t)ctx->size);
    put32(hello + 16, (uint32_t)ctx->rank);
    put32(hello + 20, (uint32_t)peer);
    put32(hello + 24, (uint32_t)stream); /* 0 for the first (and once the only) one */
    memcpy(hello + 28, ctx->group_id, DDP__HS_ID_LEN);
    DDP_TRY(ddp__random_bytes(hello + 28 + DDP__HS_ID_LEN, 32));
    DDP_TRY(ddp__sock_send_all(fd, hello, sizeof hello, deadline, what));

    DDP_TRY(ddp__sock_recv_all(fd, chal, sizeof chal, deadline, what));
    DDP_TRY(check_head(chal, HS_CHALLENGE, what, NULL));
    uint32_t st = get32(chal + 8);
    DDP_FAIL_IF(st != ST_OK, st == ST_BAD_AUTH ? DDP_ERR_AUTH : DDP_ERR_PROTOCOL,
                "%s refused the connection: %s", what, status_text(st));
    compute_mac(ctx, "ddp-srv", hello, chal + 12, mac);
    DDP_FAIL_IF(!ddp__ct_equal(mac, chal + 12 + 32, sizeof mac), DDP_ERR_AUTH,
                "%s failed to prove the shared secret (is DDP_SECRET the same everywhere?)",
                what);

    put_head(auth, HS_AUTH, 0);
    compute_mac(ctx, "ddp-cli", hello, chal + 12, auth + 12);
    DDP_TRY(ddp__sock_send_all(fd, auth, sizeof auth, deadline, what));
    DDP_TRY(ddp__sock_recv_all(fd, welcome, sizeof welcome, deadline, what));
    DDP_TRY(check_head(welcome, HS_WELCOME, what, NULL));
    st = get32(welcome + 8);
    DDP_FAIL_IF(st != ST_OK, st == ST_BAD_AUTH ? DDP_ERR_AUTH : DDP_ERR_PROTOCOL,
                "%s refused the connection: %s", what, status_text(st));
    return 0;
}

/* Best effort: tell the client why before closing (it helps a genuine but
 * misconfigured rank; a stranger learns nothing it could use).  One
 * non-blocking send: the message is small and the socket's buffer holds
 * at most our earlier messages, so it fits; if not, the client is not
 * waiting for it anyway. */
static void refuse(int fd, int type, uint32_t st)
{
    uint8_t msg[CHALLENGE_LEN];
    memset(msg, 0, sizeof msg);
    put_head(msg, type, st);
    ssize_t n = send(fd, msg, type == HS_CHALLENGE ? CHALLENGE_LEN : WELCOME_LEN,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)n;
}

/* The server's steps: read HELLO, write CHALLENGE, read AUTH, write WELCOME. */
enum { SS_HELLO, SS_CHALLENGE, SS_AUTH, SS_WELCOME, SS_DONE };

static size_t step_len(int step)
{
    static const size_t len[] = {HELLO_LEN, CHALLENGE_LEN, AUTH_LEN, WELCOME_LEN, 0};
    return len[step];
}

void ddp__hs_srv_init(ddp__hs_srv *s, int fd)
{
    memset(s, 0, sizeof *s);
    s->fd = fd;
    s->step = SS_HELLO;
    s->peer = -1;
    s->stream = -1;
}

short ddp__hs_srv_events(const ddp__hs_srv *s)
{
    return s->step == SS_CHALLENGE || s->step == SS_WELCOME ? POLLOUT : POLLIN;
}

int ddp__hs_srv_timeout(const ddp__hs_srv *s, double waited, const char *what)
{
    static const char *const name[] = {"HELLO", "CHALLENGE", "AUTH", "WELCOME", "-"};
    return DDP_ERROR(DDP_ERR_TIMEOUT,
                     "%s: no handshake within %.1f s (%zu bytes received, stuck at %s)", what,
                     waited, s->got, name[s->step]);
}

/* Moves the bytes of the current message without waiting: 1 when it is
 * whole, 0 when the socket would block (EINTR retried here), < 0 failed. */
static int move(ddp__hs_srv *s, uint8_t *buf, const char *what)
{
    int out = s->step == SS_CHALLENGE || s->step == SS_WELCOME;
    size_t len = step_len(s->step);
    while (s->off < len) {
        ssize_t n = out ? send(s->fd, buf + s->off, len - s->off, MSG_NOSIGNAL | MSG_DONTWAIT)
                        : recv(s->fd, buf + s->off, len - s->off, MSG_DONTWAIT);
        if (n > 0) {
            s->off += (size_t)n;
            s->got += out ? 0 : (size_t)n;
            continue;
        }
        if (n == 0 && !out && s->step == SS_AUTH) /* a rank's client checks our proof first */
            return DDP_ERROR(DDP_ERR_CONNECTION,
                             "%s (claiming rank %d): closed after our CHALLENGE: it did not "
                             "accept our proof (is DDP_SECRET the same everywhere?)",
                             what, s->peer);
        if (n == 0 && !out)
            return DDP_ERROR(DDP_ERR_CONNECTION,
                             "%s: connection closed during the handshake (%zu bytes received)",
                             what, s->got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        return DDP_ERROR_ERRNO(DDP_ERR_CONNECTION, errno, "%s: %s", what, out ? "send" : "recv");
    }
    s->off = 0;
    s->step++;
    return 1;
}

/* The checks of a whole HELLO; the answer (CHALLENGE) goes into s->msg. */
static int take_hello(ddp__hs_srv *s, const ddp__hs_ctx *ctx, const unsigned char *connected,
                      const char *what)
{
    const uint8_t *hello = s->hello;
    int version_bad = 0;
    int rc = check_head(hello, HS_HELLO, what, &version_bad);
    if (rc < 0) {
        if (version_bad)
            refuse(s->fd, HS_CHALLENGE, ST_BAD_VERSION);
        return rc;
    }
    uint32_t size = get32(hello + 12), src = get32(hello + 16), dst = get32(hello + 20);
    if (memcmp(hello + 28, ctx->group_id, DDP__HS_ID_LEN) != 0) {
        refuse(s->fd, HS_CHALLENGE, ST_BAD_GROUP);
        return DDP_ERROR(DDP_ERR_PROTOCOL, "%s: handshake from another job or group", what);
    }
    if (size != (uint32_t)ctx->size || dst != (uint32_t)ctx->rank || src >= (uint32_t)ctx->rank) {
        refuse(s->fd, HS_CHALLENGE, ST_BAD_RANK);
        return DDP_ERROR(DDP_ERR_PROTOCOL,
                         "%s: handshake claims rank %u of %u calling rank %u; this is rank %d of "
                         "%d (only lower ranks connect)",
                         what, src, size, dst, ctx->rank, ctx->size);
    }
    uint32_t stream = get32(hello + 24), streams = ctx->streams > 1 ? (uint32_t)ctx->streams : 1;
    if (stream >= streams) {
        refuse(s->fd, HS_CHALLENGE, ST_BAD_STREAMS);
        return DDP_ERROR(DDP_ERR_PROTOCOL,
                         "%s: rank %u opened connection %u of the pair where this rank takes %u "
                         "(is DDP_SOCKET_NUM_STREAMS the same everywhere?)",
                         what, src, stream + 1, streams);
    }
    if (connected[src * streams + stream]) {
        refuse(s->fd, HS_CHALLENGE, ST_DUPLICATE);
        return DDP_ERROR(DDP_ERR_PROTOCOL, "%s: rank %u is already connected", what, src);
    }
    s->peer = (int)src;
    s->stream = (int)stream;
    uint8_t *chal = s->msg;
    put_head(chal, HS_CHALLENGE, ST_OK);
    DDP_TRY(ddp__random_bytes(chal + 12, 32));
    compute_mac(ctx, "ddp-srv", hello, chal + 12, chal + 12 + 32);
    return 0;
}

/* The checks of AUTH (in s->msg) against the HELLO and our CHALLENGE's
 * nonce; the answer (WELCOME) goes into s->msg. */
static int take_auth(ddp__hs_srv *s, const ddp__hs_ctx *ctx, const unsigned char *connected,
                     const uint8_t *nonce_s, const char *what)
{
    uint8_t mac[DDP__SHA256_LEN];
    DDP_TRY(check_head(s->msg, HS_AUTH, what, NULL));
    compute_mac(ctx, "ddp-cli", s->hello, nonce_s, mac);
    if (!ddp__ct_equal(mac, s->msg + 12, sizeof mac)) {
        refuse(s->fd, HS_WELCOME, ST_BAD_AUTH);
        return DDP_ERROR(DDP_ERR_AUTH, "%s (claiming rank %d): wrong shared secret", what,
                         s->peer);
    }
    int streams = ctx->streams > 1 ? ctx->streams : 1;
    if (connected[s->peer * streams + s->stream]) { /* another one of that rank finished first */
        refuse(s->fd, HS_WELCOME, ST_DUPLICATE);
        return DDP_ERROR(DDP_ERR_PROTOCOL, "%s: rank %d is already connected", what, s->peer);
    }
    put_head(s->msg, HS_WELCOME, ST_OK);
    return 0;
}

int ddp__hs_srv_step(ddp__hs_srv *s, const ddp__hs_ctx *ctx, const unsigned char *connected,
                     const char *what)
{
    for (;;) {
        switch (s->step) {
        case SS_HELLO: {
            int rc = move(s, s->hello, what);
            /* Garbage is refused on its first bytes, not after HELLO_LEN. */
            if (rc == 0 && s->off >= 4 && get32(s->hello) != DDP__HS_MAGIC)
                return check_head(s->hello, HS_HELLO, what, NULL);
            if (rc <= 0)
                return rc;
            DDP_TRY(take_hello(s, ctx, connected, what));
            memcpy(s->nonce, s->msg + 12, 32); /* s->msg is reused for AUTH */
            break;
        }
        case SS_CHALLENGE:
        case SS_WELCOME: {
            int rc = move(s, s->msg, what);
            if (rc <= 0)
                return rc;
            if (s->step == SS_DONE)
                return 1;
            break;
        }
        case SS_AUTH: {
            int rc = move(s, s->msg, what);
            if (rc <= 0)
                return rc;
            DDP_TRY(take_auth(s, ctx, connected, s->nonce, what));
            break;
        }
        default: return 1;
        }
    }
}

int ddp__hs_server(int fd, const ddp__hs_ctx *ctx, const unsigned char *connected,
                   double deadline, const char *what, int *peer, int *stream)
{
    ddp__hs_srv s;
    ddp__hs_srv_init(&s, fd);
    double start = ddp_time_now();
    for (;;) {
        int rc = ddp__hs_srv_step(&s, ctx, connected, what);
        if (rc < 0)
            return rc;
        if (rc == 1) {
            *peer = s.peer;
            *stream = s.stream;
            return 0;
        }
        double left = deadline - ddp_time_now();
        if (left <= 0)
            return ddp__hs_srv_timeout(&s, ddp_time_now() - start, what);
        struct pollfd pf = {.fd = fd, .events = ddp__hs_srv_events(&s)};
        (void)poll(&pf, 1, ddp__sock_poll_ms(left));
    }
}
