/* Init-method URLs (file://, tcp://, env://) and the store each one makes,
 * following torch.distributed.rendezvous: the same schemes, the same
 * ?rank=&world_size= query, the same environment variables for env://.
 * Stricter than torch on malformed input: every rejection quotes the URL
 * and says what was expected. */
#include "store/store_impl.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/env.h"
#include "base/error.h"

#define URL_MAX 8192

/* "init method 'URL': " prefix of every parse error. */
#define URL_FAIL(url, ...)                                                                   \
    do {                                                                                     \
        char why_[512];                                                                      \
        snprintf(why_, sizeof why_, __VA_ARGS__);                                            \
        return DDP_ERROR(DDP_ERR_INVALID_ARG, "init method '%.300s': %s", (url), why_);      \
    } while (0)

/* Parses a whole decimal integer in [lo, hi] from s[0..n). */
static int parse_int(const char *s, size_t n, long lo, long hi, int *out)
{
    if (n == 0 || n > 10)
        return -1;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i]))
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    if (v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = (char)tolower((unsigned char)c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Percent-decodes s[0..n) into out (size cap); -1 on a bad escape, a NUL,
 * or overflow. */
static int decode(const char *s, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '%') {
            if (i + 2 >= n)
                return -1;
            int hi = hexval(s[i + 1]), lo = hexval(s[i + 2]);
            if (hi < 0 || lo < 0)
                return -1;
            c = (char)(hi * 16 + lo);
            i += 2;
        }
        if (c == '\0' || o + 1 >= cap)
            return -1;
        out[o++] = c;
    }
    out[o] = '\0';
    return 0;
}

static int parse_query(const char *url, const char *q, ddp_init_url *u)
{
    while (*q) {
        const char *amp = strchr(q, '&');
        size_t len = amp ? (size_t)(amp - q) : strlen(q);
        const char *eq = memchr(q, '=', len);
        if (len == 0) { /* "a=1&&b=2", or a trailing '&' */
            if (!amp)
                break;
            q = amp + 1;
            continue;
        }
        if (!eq)
            URL_FAIL(url, "query parameter '%.*s' has no value (write NAME=VALUE)", (int)len, q);
        size_t klen = (size_t)(eq - q), vlen = len - klen - 1;
        int *dst = NULL;
        long lo = 0;
        if (klen == 4 && memcmp(q, "rank", 4) == 0) {
            dst = &u->rank;
        } else if (klen == 10 && memcmp(q, "world_size", 10) == 0) {
            dst = &u->world_size;
            lo = 1;
        } else {
            URL_FAIL(url, "unknown query parameter '%.*s' (known: rank, world_size)", (int)klen,
                     q);
        }
        if (*dst >= 0)
            URL_FAIL(url, "query parameter '%.*s' given twice", (int)klen, q);
        if (parse_int(eq + 1, vlen, lo, 1000000000, dst) < 0)
            URL_FAIL(url, "%.*s='%.*s' is not an integer %s", (int)klen, q, (int)vlen, eq + 1,
                     lo ? ">= 1" : ">= 0");
        if (!amp)
            break;
        q = amp + 1;
    }
    if (u->rank >= 0 && u->world_size >= 0 && u->rank >= u->world_size)
        URL_FAIL(url, "rank %d out of range for world_size %d", u->rank, u->world_size);
    return 0;
}

static int valid_host_char(char c)
{
    return isalnum((unsigned char)c) || c == '-' || c == '.' || c == '_';
}

static int parse_tcp(const char *url, const char *a, size_t n, ddp_init_url *u)
{
    if (n && a[n - 1] == '/')
        n--; /* tcp://h:p/ */
    if (n == 0)
        URL_FAIL(url, "missing host and port (write tcp://HOST:PORT)");
    if (memchr(a, '/', n))
        URL_FAIL(url, "tcp:// takes no path (write tcp://HOST:PORT)");
    if (memchr(a, '@', n))
        URL_FAIL(url, "user names are not supported in tcp:// URLs");
    const char *host = a, *colon;
    size_t hlen;
    if (a[0] == '[') {
        const char *close = memchr(a, ']', n);
        if (!close)
            URL_FAIL(url, "IPv6 address without its closing ']'");
        host = a + 1;
        hlen = (size_t)(close - host);
        for (size_t i = 0; i < hlen; i++)
            if (!isxdigit((unsigned char)host[i]) && host[i] != ':' && host[i] != '.')
                URL_FAIL(url, "'%.*s' is not an IPv6 address", (int)hlen, host);
        if (hlen == 0)
            URL_FAIL(url, "empty IPv6 address");
        colon = close + 1;
        if (colon == a + n)
            URL_FAIL(url, "missing port (write tcp://[ADDR]:PORT)");
        if (*colon != ':')
            URL_FAIL(url, "garbage after the IPv6 address (write tcp://[ADDR]:PORT)");
    } else {
        colon = memchr(a, ':', n);
        if (!colon)
            URL_FAIL(url, "missing port (write tcp://HOST:PORT)");
        hlen = (size_t)(colon - a);
        if (memchr(colon + 1, ':', (size_t)(a + n - colon - 1)))
            URL_FAIL(url, "more than one ':' (an IPv6 address goes in brackets: tcp://[::1]:PORT)");
        if (hlen == 0)
            URL_FAIL(url, "missing host (write tcp://HOST:PORT)");
        for (size_t i = 0; i < hlen; i++)
            if (!valid_host_char(host[i]))
                URL_FAIL(url, "invalid character '%c' in host name", host[i]);
    }
    if (hlen >= sizeof u->host)
        URL_FAIL(url, "host name longer than %zu bytes", sizeof u->host - 1);
    size_t plen = (size_t)(a + n - colon - 1);
    if (plen == 0)
        URL_FAIL(url, "missing port after ':'");
    if (parse_int(colon + 1, plen, 1, 65535, &u->port) < 0)
        URL_FAIL(url, "port '%.*s' is not a number in 1-65535", (int)plen, colon + 1);
    memcpy(u->host, host, hlen);
    u->host[hlen] = '\0';
    return 0;
}

static int parse_file(const char *url, const char *a, size_t n, ddp_init_url *u)
{
    /* file:///abs/path (empty authority) or file://localhost/abs/path. */
    if (n >= 9 && strncasecmp(a, "localhost", 9) == 0 && (n == 9 || a[9] == '/')) {
        a += 9;
        n -= 9;
    }
    if (n == 0)
        URL_FAIL(url, "empty path (write file:///ABSOLUTE/PATH)");
    if (a[0] != '/')
        URL_FAIL(url, "the path must be absolute: write file:///ABSOLUTE/PATH (three slashes)");
    if (decode(a, n, u->path, sizeof u->path) < 0)
        URL_FAIL(url, "bad percent-escape, NUL byte, or path over %zu bytes",
                 sizeof u->path - 1);
    size_t len = strlen(u->path);
    if (len == 1 || u->path[len - 1] == '/')
        URL_FAIL(url, "the path names a directory, not a file");
    return 0;
}

int ddp_init_url_parse(const char *url, ddp_init_url *out)
{
    DDP_FAIL_IF(!out, DDP_ERR_INVALID_ARG, "ddp_init_url_parse: out is NULL");
    memset(out, 0, sizeof *out);
    out->rank = out->world_size = -1;
    DDP_FAIL_IF(!url || !*url, DDP_ERR_INVALID_ARG, "empty init method URL");
    size_t len = strnlen(url, URL_MAX + 1);
    DDP_FAIL_IF(len > URL_MAX, DDP_ERR_INVALID_ARG, "init method '%.100s...' longer than %d bytes",
                url, URL_MAX);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)url[i] <= ' ' || url[i] == 0x7f)
            URL_FAIL(url, "space or control character at offset %zu", i);
    const char *sep = strstr(url, "://");
    if (!sep)
        URL_FAIL(url, "no scheme (expected file:///PATH, tcp://HOST:PORT or env://)");
    size_t slen = (size_t)(sep - url);
    if (slen == 4 && strncasecmp(url, "file", 4) == 0)
        out->kind = DDP_INIT_FILE;
    else if (slen == 3 && strncasecmp(url, "tcp", 3) == 0)
        out->kind = DDP_INIT_TCP;
    else if (slen == 3 && strncasecmp(url, "env", 3) == 0)
        out->kind = DDP_INIT_ENV;
    else
        URL_FAIL(url, "unknown scheme '%.*s' (expected file, tcp or env)", (int)(slen > 40 ? 40 : slen),
                 url);
    if (strchr(url, '#'))
        URL_FAIL(url, "fragments ('#') are not allowed");
    const char *rest = sep + 3, *q = strchr(rest, '?');
    size_t n = q ? (size_t)(q - rest) : strlen(rest);
    if (q)
        DDP_TRY(parse_query(url, q + 1, out));
    switch (out->kind) {
    case DDP_INIT_FILE:
        return parse_file(url, rest, n, out);
    case DDP_INIT_TCP:
        return parse_tcp(url, rest, n, out);
    default:
        if (n > 0 && !(n == 1 && rest[0] == '/'))
            URL_FAIL(url, "env:// takes no address (MASTER_ADDR and MASTER_PORT give it)");
        return 0;
    }
}

/* ---- env:// ------------------------------------------------------------- */

static int env_int(const char *name, long lo, long hi, int *out)
{
    return ddp__env_launcher_int(name, lo, hi, -1, out);
}

int ddp_init_env_read(ddp_init_env *out)
{
    DDP_FAIL_IF(!out, DDP_ERR_INVALID_ARG, "ddp_init_env_read: out is NULL");
    memset(out, 0, sizeof *out);
    const char *addr = getenv("MASTER_ADDR");
    if (addr) {
        DDP_FAIL_IF(strlen(addr) >= sizeof out->master_addr, DDP_ERR_INVALID_ARG,
                    "MASTER_ADDR longer than %zu bytes", sizeof out->master_addr - 1);
        /* torch accepts a bracketed IPv6 address here too. */
        size_t n = strlen(addr);
        if (n >= 2 && addr[0] == '[' && addr[n - 1] == ']')
            snprintf(out->master_addr, sizeof out->master_addr, "%.*s", (int)(n - 2), addr + 1);
        else
            snprintf(out->master_addr, sizeof out->master_addr, "%s", addr);
        for (const char *p = out->master_addr; *p; p++)
            DDP_FAIL_IF(!valid_host_char(*p) && *p != ':', DDP_ERR_INVALID_ARG,
                        "MASTER_ADDR='%.60s' is not a host name or address (bad character '%c')",
                        addr, *p);
    }
    DDP_TRY(env_int("MASTER_PORT", 1, 65535, &out->master_port));
    DDP_TRY(env_int("RANK", 0, 1000000000, &out->rank));
    DDP_TRY(env_int("WORLD_SIZE", 1, 1000000000, &out->world_size));
    DDP_TRY(env_int("LOCAL_RANK", 0, 1000000000, &out->local_rank));
    return 0;
}

/* ---- store from URL ----------------------------------------------------- */

/* Merges a value given as argument with the URL's (and env's); -1 = unset. */
static int merge(const char *url, const char *name, int arg, int from_url, int from_env, int *out)
{
    if (arg >= 0 && from_url >= 0 && arg != from_url)
        return DDP_ERROR(DDP_ERR_INVALID_ARG, "init method '%.300s': %s %d given, but the URL says %s=%d",
                         url, name, arg, name, from_url);
    *out = arg >= 0 ? arg : from_url >= 0 ? from_url : from_env;
    return 0;
}

int ddp_store_from_url(const char *url, int rank, int world_size, double timeout_s,
                       ddp_store_t **out, int *rank_out, int *world_size_out)
{
    DDP_FAIL_IF(!out, DDP_ERR_INVALID_ARG, "ddp_store_from_url: out is NULL");
    *out = NULL;
    ddp_init_url u;
    DDP_TRY(ddp_init_url_parse(url, &u));
    if (timeout_s < 0)
        timeout_s = DDP_STORE_DEFAULT_TIMEOUT_S;
    ddp_init_env env = {.master_port = -1, .rank = -1, .world_size = -1, .local_rank = -1};
    if (u.kind == DDP_INIT_ENV)
        DDP_TRY(ddp_init_env_read(&env));
    int r, ws;
    DDP_TRY(merge(url, "rank", rank, u.rank, env.rank, &r));
    DDP_TRY(merge(url, "world_size", world_size, u.world_size, env.world_size, &ws));
    const char *hint = u.kind == DDP_INIT_ENV ? "set RANK and WORLD_SIZE, pass them, or add ?rank=R&world_size=N"
                                              : "pass it or add ?rank=R&world_size=N to the URL";
    DDP_FAIL_IF(ws < 1, DDP_ERR_INVALID_ARG, "init method '%.300s': world size not given (%s)",
                url, hint);
    DDP_FAIL_IF(r < 0, DDP_ERR_INVALID_ARG, "init method '%.300s': rank not given (%s)", url,
                hint);
    DDP_FAIL_IF(r >= ws, DDP_ERR_INVALID_ARG,
                "init method '%.300s': rank %d out of range for world size %d", url, r, ws);
    /* The job's id (torchrun's --rdzv-id, which it and ddprun hand their
     * workers as TORCHELASTIC_RUN_ID): a rank refuses a store held by
     * another job, so two jobs on one address or file cannot mix. */
    const char *job = getenv("TORCHELASTIC_RUN_ID");
    job = job ? job : "";
    DDP_FAIL_IF(strlen(job) > DDP__STORE_MAX_JOB_ID, DDP_ERR_INVALID_ARG,
                "TORCHELASTIC_RUN_ID='%.40s...' is longer than %d bytes", job,
                DDP__STORE_MAX_JOB_ID);
    int rc;
    if (u.kind == DDP_INIT_FILE) {
        rc = ddp__store_file_open(u.path, ws, job, out);
        if (rc == 0)
            ddp_store_set_timeout(*out, timeout_s);
    } else {
        const char *host = u.host;
        int port = u.port;
        if (u.kind == DDP_INIT_ENV) {
            DDP_FAIL_IF(!env.master_addr[0], DDP_ERR_INVALID_ARG,
                        "init method 'env://': MASTER_ADDR is not set");
            DDP_FAIL_IF(env.master_port < 0, DDP_ERR_INVALID_ARG,
                        "init method 'env://': MASTER_PORT is not set");
            host = env.master_addr;
            port = env.master_port;
        }
        /* DDP_STORE_BIND: where rank 0 listens when HOST is not an address
         * of its own that the others can reach (a name that resolves to
         * loopback on the master, say); "0.0.0.0" listens everywhere. */
        const char *bind = NULL;
        rc = ddp__env_string("DDP_STORE_BIND", &bind);
        if (rc == 0)
            rc = ddp__store_tcp_open(host, bind, port, r == 0, ws, timeout_s, job, out);
    }
    if (rc < 0)
        return ddp__error_context(rc, "rendezvous at '%.300s' as rank %d of %d", url, r, ws);
    if (rank_out)
        *rank_out = r;
    if (world_size_out)
        *world_size_out = ws;
    return 0;
}
