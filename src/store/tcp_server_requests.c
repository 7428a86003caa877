/* TCPStore server: the requests (split from tcp_server.c, which keeps the
 * event loop and the connections, as gloo and redis keep the loop apart
 * from the commands).
 *
 * A connection authenticates first (HMAC over the secret and both
 * nonces), then sends SET, GET, WAIT, ADD, CAS, CHECK, DELETE or NUM_KEYS
 * against the server's key-value table (kv.h: the semantics of add and
 * compare_set are shared with the other stores).  GET and WAIT on missing
 * keys park the connection with a deadline; every write to the table
 * answers the parked requests whose keys now all exist, and a request past
 * its deadline gets a TIMEOUT answer naming the keys that are there.
 *
 * Anything that breaks the protocol (bad magic, unknown opcode, a length
 * over the limit, a malformed payload, a request before authentication)
 * drops that connection with a logged reason. */
#include "store/tcp_server_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "base/sha256.h"
#include "base/time.h"

/* ---- parked requests ---------------------------------------------------- */

void ddp__ts_unpark(conn *c)
{
    for (size_t i = 0; i < c->nkeys; i++)
        free(c->keys[i]);
    free(c->keys);
    c->keys = NULL;
    c->nkeys = 0;
    c->parked_op = 0;
}

static int all_present(ddp__ts_server *s, conn *c)
{
    for (size_t i = 0; i < c->nkeys; i++)
        if (!ddp__kv_find(&s->kv, c->keys[i], strlen(c->keys[i])))
            return 0;
    return 1;
}

/* Answers a GET or WAIT whose keys all exist. */
static void answer_ready(ddp__ts_server *s, conn *c, int op)
{
    ddp__ts_begin(&c->out);
    if (op == DDP__TS_GET) {
        ddp__kv_entry *e = ddp__kv_find(&s->kv, c->keys[0], strlen(c->keys[0]));
        ddp__ts_raw(&c->out, e->value, e->vlen);
    }
    ddp__ts_answer(s, c, op, 0);
}

/* After a write to the table: answer every parked request now satisfied. */
static void notify(ddp__ts_server *s)
{
    for (conn *c = s->conns; c; c = c->next) {
        if (!c->parked_op || c->dead || !all_present(s, c))
            continue;
        int op = c->parked_op;
        answer_ready(s, c, op);
        ddp__ts_unpark(c);
        ddp__ts_process(s, c);
    }
}

/* Answers parked requests past their deadline; closes connections that did
 * not authenticate in time.  Returns the epoll timeout in ms (-1: none). */
int ddp__ts_expire(ddp__ts_server *s)
{
    double now = ddp_time_now(), next = -1;
    for (conn *c = s->conns; c; c = c->next) {
        if (c->dead)
            continue;
        if (!c->authed) {
            if (now >= c->auth_deadline) {
                ddp__ts_drop(s, c, "did not authenticate in time");
                continue;
            }
            if (next < 0 || c->auth_deadline < next)
                next = c->auth_deadline;
        }
        if (!c->parked_op)
            continue;
        if (now >= c->deadline) {
            /* The answer says which keys are there, so the client can name
             * the missing ones. */
            int op = c->parked_op;
            ddp__ts_begin(&c->out);
            for (size_t i = 0; i < c->nkeys; i++)
                ddp__ts_u8(&c->out, ddp__kv_find(&s->kv, c->keys[i], strlen(c->keys[i])) != NULL);
            ddp__ts_unpark(c);
            ddp__ts_answer(s, c, op, DDP_ERR_TIMEOUT);
            ddp__ts_process(s, c);
        } else if (next < 0 || c->deadline < next) {
            next = c->deadline;
        }
    }
    if (next < 0)
        return -1;
    double ms = (next - now) * 1000.0 + 1.0;
    return ms > 3.6e6 ? 3600000 : (int)ms;
}

/* ---- requests ----------------------------------------------------------- */

/* Reads a key field: 1..MAX_KEY bytes, no NUL (keys are C strings). */
static const char *get_key(ddp__ts_reader *r, size_t *klen)
{
    const uint8_t *k = ddp__ts_get_bytes(r, DDP__STORE_MAX_KEY, klen);
    if (!k || *klen == 0 || memchr(k, 0, *klen)) {
        r->err = DDP_ERR_PROTOCOL;
        return NULL;
    }
    return (const char *)k;
}

static void park(ddp__ts_server *s, conn *c, int op, ddp__ts_reader *r, size_t n,
                 uint64_t timeout_ms)
{
    c->keys = calloc(n, sizeof *c->keys);
    if (!c->keys) {
        ddp__ts_drop(s, c, "out of memory for a waiter");
        return;
    }
    c->nkeys = n;
    for (size_t i = 0; i < n; i++) {
        size_t klen;
        const char *k = get_key(r, &klen);
        if (!k) {
            ddp__ts_unpark(c);
            ddp__ts_drop(s, c, "malformed key in a wait");
            return;
        }
        c->keys[i] = strndup(k, klen);
        if (!c->keys[i]) {
            ddp__ts_unpark(c);
            ddp__ts_drop(s, c, "out of memory for a waiter");
            return;
        }
    }
    if (r->pos != r->len) {
        ddp__ts_unpark(c);
        ddp__ts_drop(s, c, "trailing bytes after a wait");
        return;
    }
    c->parked_op = op;
    c->deadline = ddp_time_now() + (double)(timeout_ms > 4000000000000ull ? 4000000000000ull : timeout_ms) / 1000.0;
    if (all_present(s, c)) {
        answer_ready(s, c, op);
        ddp__ts_unpark(c);
    }
}

static void handle_auth(ddp__ts_server *s, conn *c, const ddp__ts_header *h, ddp__ts_reader *r)
{
    if (!s->secret || h->opcode != DDP__TS_AUTH) {
        ddp__ts_drop(s, c, "request before authentication");
        return;
    }
    const uint8_t *cnonce = ddp__ts_get_raw(r, DDP__TS_NONCE);
    const uint8_t *mac = ddp__ts_get_raw(r, 32);
    if (!cnonce || !mac || r->pos != r->len) {
        ddp__ts_drop(s, c, "malformed authentication message");
        return;
    }
    uint8_t want[32];
    ddp__ts_auth_mac(s->secret, s->slen, 0, c->nonce, cnonce, want);
    if (!ddp__ct_equal(want, mac, 32)) {
        DDP_WARN("%s: client %s: wrong secret, rejected", s->where, c->peer);
        c->close_after = 1;
        ddp__ts_answer_error(s, c, DDP__TS_AUTH, DDP_ERR_AUTH, "wrong secret");
        return;
    }
    c->authed = 1;
    ddp__ts_auth_mac(s->secret, s->slen, 1, c->nonce, cnonce, want);
    ddp__ts_begin(&c->out);
    ddp__ts_raw(&c->out, want, 32);
    ddp__ts_answer(s, c, DDP__TS_AUTH, 0);
}

static void handle(ddp__ts_server *s, conn *c, const ddp__ts_header *h, const uint8_t *payload)
{
    ddp__ts_reader r = {payload, h->length, 0, 0};
    if (!c->authed) {
        handle_auth(s, c, h, &r);
        return;
    }
    size_t klen = 0, vlen = 0, elen = 0;
    const char *key = NULL;
    const uint8_t *v = NULL, *e = NULL;
    ddp__kv_entry *ent;
    switch (h->opcode) {
    case DDP__TS_SET:
        key = get_key(&r, &klen);
        v = ddp__ts_get_bytes(&r, DDP__STORE_MAX_VALUE, &vlen);
        if (r.err || r.pos != r.len)
            break;
        if (ddp__kv_set(&s->kv, key, klen, v, vlen) < 0) {
            ddp__ts_answer_error(s, c, h->opcode, DDP_ERR_NOMEM, "server out of memory");
            return;
        }
        ddp__ts_begin(&c->out);
        ddp__ts_answer(s, c, h->opcode, 0);
        notify(s);
        return;
    case DDP__TS_GET: {
        uint64_t ms = ddp__ts_get_u64(&r);
        if (r.err)
            break;
        park(s, c, DDP__TS_GET, &r, 1, ms);
        return;
    }
    case DDP__TS_WAIT: {
        uint64_t ms = ddp__ts_get_u64(&r);
        uint32_t n = ddp__ts_get_u32(&r);
        if (r.err || n == 0 || n > DDP__STORE_MAX_KEYS)
            break;
        park(s, c, DDP__TS_WAIT, &r, n, ms);
        return;
    }
    case DDP__TS_ADD: {
        int64_t delta = (int64_t)ddp__ts_get_u64(&r), cur = 0;
        key = get_key(&r, &klen);
        if (r.err || r.pos != r.len)
            break;
        char num[32];
        size_t nlen = 0;
        int rc = ddp__kv_add(ddp__kv_find(&s->kv, key, klen), key, klen, delta, &cur, num, &nlen);
        if (rc < 0) {
            /* The client adds its own location: send the message without ours. */
            const char *msg = strstr(ddp_last_error(), ": ");
            ddp__ts_answer_error(s, c, h->opcode, rc, "%s", msg ? msg + 2 : ddp_last_error());
            return;
        }
        if (ddp__kv_set(&s->kv, key, klen, num, nlen) < 0) {
            ddp__ts_answer_error(s, c, h->opcode, DDP_ERR_NOMEM, "server out of memory");
            return;
        }
        ddp__ts_begin(&c->out);
        ddp__ts_u64(&c->out, (uint64_t)cur);
        ddp__ts_answer(s, c, h->opcode, 0);
        notify(s);
        return;
    }
    case DDP__TS_CAS: {
        key = get_key(&r, &klen);
        e = ddp__ts_get_bytes(&r, DDP__STORE_MAX_VALUE, &elen);
        v = ddp__ts_get_bytes(&r, DDP__STORE_MAX_VALUE, &vlen);
        if (r.err || r.pos != r.len)
            break;
        ent = ddp__kv_find(&s->kv, key, klen);
        int swap = ddp__kv_cas_matches(ent, e, elen);
        if (swap) {
            if (ddp__kv_set(&s->kv, key, klen, v, vlen) < 0) {
                ddp__ts_answer_error(s, c, h->opcode, DDP_ERR_NOMEM, "server out of memory");
                return;
            }
            ent = ddp__kv_find(&s->kv, key, klen);
        }
        ddp__ts_begin(&c->out);
        ddp__ts_u8(&c->out, ent != NULL);
        if (ent)
            ddp__ts_raw(&c->out, ent->value, ent->vlen);
        ddp__ts_answer(s, c, h->opcode, 0);
        if (swap)
            notify(s);
        return;
    }
    case DDP__TS_CHECK: {
        uint32_t n = ddp__ts_get_u32(&r);
        if (r.err || n == 0 || n > DDP__STORE_MAX_KEYS)
            break;
        int all = 1;
        for (uint32_t i = 0; i < n && !r.err; i++) {
            key = get_key(&r, &klen);
            if (key && !ddp__kv_find(&s->kv, key, klen))
                all = 0;
        }
        if (r.err || r.pos != r.len)
            break;
        ddp__ts_begin(&c->out);
        ddp__ts_u8(&c->out, (uint8_t)all);
        ddp__ts_answer(s, c, h->opcode, 0);
        return;
    }
    case DDP__TS_DELETE: {
        key = get_key(&r, &klen);
        if (r.err || r.pos != r.len)
            break;
        ddp__ts_begin(&c->out);
        ddp__ts_u8(&c->out, (uint8_t)ddp__kv_delete(&s->kv, key, klen));
        ddp__ts_answer(s, c, h->opcode, 0);
        return;
    }
    case DDP__TS_NUM_KEYS:
        if (r.len != 0)
            break;
        ddp__ts_begin(&c->out);
        ddp__ts_u64(&c->out, s->kv.count);
        ddp__ts_answer(s, c, h->opcode, 0);
        return;
    default:
        ddp__ts_drop(s, c, "unexpected opcode after authentication");
        return;
    }
    ddp__ts_drop(s, c, "malformed request payload");
}

/* Handles the complete requests buffered on c, one at a time. */
void ddp__ts_process(ddp__ts_server *s, conn *c)
{
    size_t pos = 0;
    while (!c->dead && !c->close_after && !c->parked_op && !ddp__ts_pending_out(c) &&
           c->in_len - pos >= DDP__TS_HEADER) {
        ddp__ts_header h;
        const char *why;
        uint32_t max = c->authed ? DDP__TS_MAX_PAYLOAD : DDP__TS_MAX_AUTH_PAYLOAD;
        if (ddp__ts_header_decode(c->in + pos, max, &h, &why) < 0) {
            char msg[160];
            snprintf(msg, sizeof msg, "%s (opcode %u, length %u)", why, h.opcode, h.length);
            ddp__ts_drop(s, c, msg);
            break;
        }
        if (c->in_len - pos - DDP__TS_HEADER < h.length)
            break; /* the rest of the payload is still on its way */
        handle(s, c, &h, c->in + pos + DDP__TS_HEADER);
        pos += DDP__TS_HEADER + h.length;
        /* Authenticated, or (no secret) a whole first request: no longer a
         * stranger that a flood of newer ones may push out. */
        if (c->stranger && c->authed && !c->dead)
            ddp__ts_stranger_remove(s, c);
    }
    if (pos) {
        memmove(c->in, c->in + pos, c->in_len - pos);
        c->in_len -= pos;
    }
    if (c->in_len == 0 && c->in_cap > SHRINK_BYTES) {
        free(c->in);
        c->in = NULL;
        c->in_cap = 0;
    }
}
