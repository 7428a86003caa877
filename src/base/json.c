/* Strict recursive-descent JSON parser; see json.h. */
#include "base/json.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

typedef struct parser {
    const char *s;
    size_t len, pos;
    int depth;
} parser;

#define FAIL(p, ...) return DDP_ERROR(DDP_ERR_FORMAT, __VA_ARGS__)

static void skip_ws(parser *p)
{
    while (p->pos < p->len && (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' ||
                               p->s[p->pos] == '\n' || p->s[p->pos] == '\r'))
        p->pos++;
}

static int peek(const parser *p) { return p->pos < p->len ? (unsigned char)p->s[p->pos] : -1; }

static int expect_char(parser *p, char c)
{
    skip_ws(p);
    if (peek(p) != c) {
        if (p->pos >= p->len)
            FAIL(p, "JSON: expected '%c' at byte %zu (end of text)", c, p->pos);
        FAIL(p, "JSON: expected '%c' at byte %zu, found '%c'", c, p->pos, p->s[p->pos]);
    }
    p->pos++;
    return 0;
}

static int hex4(parser *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int c = peek(p);
        unsigned d;
        if (c >= '0' && c <= '9')
            d = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            d = (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            d = (unsigned)(c - 'A' + 10);
        else
            FAIL(p, "JSON: bad \\u escape at byte %zu", p->pos);
        v = v * 16 + d;
        p->pos++;
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decodes a string at p->pos (the opening quote) into a malloc'ed buffer. */
static int parse_string(parser *p, char **out, size_t *outlen)
{
    size_t start = p->pos;
    DDP_TRY(expect_char(p, '"'));
    /* The decoded form is never longer than the source. */
    size_t cap = 1;
    for (size_t i = p->pos; i < p->len && p->s[i] != '"'; i++)
        cap += (p->s[i] == '\\' && i + 1 < p->len) ? (i++, 2) : 1;
    char *buf = malloc(cap + 4);
    DDP_FAIL_IF(!buf, DDP_ERR_NOMEM, "JSON: out of memory");
    size_t n = 0;
    int rc = 0;
    for (;;) {
        int c = peek(p);
        DDP_FAIL_OUT(c < 0, DDP_ERR_FORMAT, "JSON: unterminated string starting at byte %zu",
                     start);
        p->pos++;
        if (c == '"')
            break;
        DDP_FAIL_OUT(c < 0x20, DDP_ERR_FORMAT,
                     "JSON: control character 0x%02x in a string at byte %zu", c, p->pos - 1);
        if (c != '\\') {
            buf[n++] = (char)c;
            continue;
        }
        int e = peek(p);
        p->pos++;
        switch (e) {
        case '"': buf[n++] = '"'; break;
        case '\\': buf[n++] = '\\'; break;
        case '/': buf[n++] = '/'; break;
        case 'b': buf[n++] = '\b'; break;
        case 'f': buf[n++] = '\f'; break;
        case 'n': buf[n++] = '\n'; break;
        case 'r': buf[n++] = '\r'; break;
        case 't': buf[n++] = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            DDP_TRY_OUT(hex4(p, &cp));
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                DDP_FAIL_OUT(p->pos + 1 >= p->len || p->s[p->pos] != '\\' ||
                                 p->s[p->pos + 1] != 'u',
                             DDP_ERR_FORMAT, "JSON: lone surrogate \\u%04x at byte %zu", cp,
                             p->pos);
                p->pos += 2;
                DDP_TRY_OUT(hex4(p, &lo));
                DDP_FAIL_OUT(lo < 0xDC00 || lo > 0xDFFF, DDP_ERR_FORMAT,
                             "JSON: bad low surrogate \\u%04x at byte %zu", lo, p->pos);
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else {
                DDP_FAIL_OUT(cp >= 0xDC00 && cp <= 0xDFFF, DDP_ERR_FORMAT,
                             "JSON: lone surrogate \\u%04x at byte %zu", cp, p->pos);
            }
            DDP_FAIL_OUT(cp == 0, DDP_ERR_FORMAT, "JSON: \\u0000 in a string at byte %zu",
                         p->pos);
            n += put_utf8(buf + n, cp);
            break;
        }
        default:
            DDP_FAIL_OUT(1, DDP_ERR_FORMAT, "JSON: bad escape '\\%c' at byte %zu",
                         e < 0 ? '?' : e, p->pos - 1);
        }
    }
    buf[n] = '\0';
    *out = buf;
    *outlen = n;
    return 0;
out:
    free(buf);
    return rc;
}

static int parse_number(parser *p, ddp__json *v)
{
    size_t start = p->pos;
    int neg = 0, integer = 1;
    if (peek(p) == '-')
        neg = 1, p->pos++;
    if (peek(p) == '0') {
        p->pos++;
    } else if (peek(p) >= '1' && peek(p) <= '9') {
        while (peek(p) >= '0' && peek(p) <= '9')
            p->pos++;
    } else {
        FAIL(p, "JSON: bad number at byte %zu", start);
    }
    if (peek(p) == '.') {
        integer = 0;
        p->pos++;
        DDP_FAIL_IF(!(peek(p) >= '0' && peek(p) <= '9'), DDP_ERR_FORMAT,
                    "JSON: bad number at byte %zu (digit expected after '.')", start);
        while (peek(p) >= '0' && peek(p) <= '9')
            p->pos++;
    }
    if (peek(p) == 'e' || peek(p) == 'E') {
        integer = 0;
        p->pos++;
        if (peek(p) == '+' || peek(p) == '-')
            p->pos++;
        DDP_FAIL_IF(!(peek(p) >= '0' && peek(p) <= '9'), DDP_ERR_FORMAT,
                    "JSON: bad number at byte %zu (digit expected in exponent)", start);
        while (peek(p) >= '0' && peek(p) <= '9')
            p->pos++;
    }
    char tmp[64];
    size_t n = p->pos - start;
    DDP_FAIL_IF(n >= sizeof tmp, DDP_ERR_FORMAT, "JSON: number too long at byte %zu", start);
    memcpy(tmp, p->s + start, n);
    tmp[n] = '\0';
    v->type = DDP_JSON_NUMBER;
    v->num = strtod(tmp, NULL);
    if (integer && !neg) {
        errno = 0;
        unsigned long long u = strtoull(tmp, NULL, 10);
        if (errno == 0) {
            v->is_uint = 1;
            v->u64 = (uint64_t)u;
        }
    }
    return 0;
}

static int parse_value(parser *p, ddp__json *v);

/* The member names of one object, to refuse a duplicate in O(1) per member
 * (a list scan made a safetensors header of 100k tensors take 45 s): an
 * open-addressing table of borrowed names, FNV-1a hashed, kept at most
 * half full. */
typedef struct keyset {
    const char **slot;
    size_t cap, n;
} keyset;

static size_t hash_name(const char *k)
{
    uint64_t h = 1469598103934665603ull;
    for (; *k; k++)
        h = (h ^ (unsigned char)*k) * 1099511628211ull;
    return (size_t)h;
}

/* Slot of k: where it is, or the empty one where it goes. */
static size_t keyset_find(const keyset *ks, const char *k)
{
    size_t i = hash_name(k) & (ks->cap - 1);
    while (ks->slot[i] && strcmp(ks->slot[i], k) != 0)
        i = (i + 1) & (ks->cap - 1);
    return i;
}

/* Adds k (borrowed: it lives as long as the tree).  Returns 1 when it was
 * there already, 0 when added, DDP_ERR_NOMEM. */
static int keyset_add(keyset *ks, const char *k)
{
    if (2 * (ks->n + 1) > ks->cap) {
        keyset big = {calloc(ks->cap ? 2 * ks->cap : 16, sizeof *big.slot),
                      ks->cap ? 2 * ks->cap : 16, ks->n};
        DDP_FAIL_IF(!big.slot, DDP_ERR_NOMEM, "JSON: out of memory");
        for (size_t i = 0; i < ks->cap; i++)
            if (ks->slot[i])
                big.slot[keyset_find(&big, ks->slot[i])] = ks->slot[i];
        free(ks->slot);
        *ks = big;
    }
    size_t i = keyset_find(ks, k);
    if (ks->slot[i])
        return 1;
    ks->slot[i] = k;
    ks->n++;
    return 0;
}

static int parse_members(parser *p, ddp__json *v, int object, keyset *names)
{
    DDP_FAIL_IF(++p->depth > DDP_JSON_MAX_DEPTH, DDP_ERR_FORMAT,
                "JSON: nesting deeper than %d at byte %zu", DDP_JSON_MAX_DEPTH, p->pos);
    v->type = object ? DDP_JSON_OBJECT : DDP_JSON_ARRAY;
    p->pos++; /* '{' or '[' */
    char close = object ? '}' : ']';
    ddp__json **tail = &v->child;
    skip_ws(p);
    if (peek(p) == close) {
        p->pos++;
        p->depth--;
        return 0;
    }
    for (;;) {
        ddp__json *c = calloc(1, sizeof *c);
        DDP_FAIL_IF(!c, DDP_ERR_NOMEM, "JSON: out of memory");
        *tail = c; /* linked first, so the caller's free reaches it on error */
        tail = &c->next;
        v->len++;
        skip_ws(p);
        if (object) {
            size_t at = p->pos, klen;
            DDP_FAIL_IF(peek(p) != '"', DDP_ERR_FORMAT,
                        "JSON: expected a member name at byte %zu", p->pos);
            DDP_TRY(parse_string(p, &c->key, &klen));
            DDP_FAIL_IF(strlen(c->key) != klen, DDP_ERR_FORMAT,
                        "JSON: member name with a NUL at byte %zu", at);
            int dup = keyset_add(names, c->key);
            DDP_TRY(dup);
            DDP_FAIL_IF(dup, DDP_ERR_FORMAT, "JSON: duplicate member \"%s\" at byte %zu",
                        c->key, at);
            DDP_TRY(expect_char(p, ':'));
        }
        DDP_TRY(parse_value(p, c));
        skip_ws(p);
        int ch = peek(p);
        if (ch == ',') {
            p->pos++;
            skip_ws(p);
            DDP_FAIL_IF(peek(p) == close, DDP_ERR_FORMAT, "JSON: trailing comma at byte %zu",
                        p->pos);
            continue;
        }
        if (ch == close) {
            p->pos++;
            p->depth--;
            return 0;
        }
        FAIL(p, "JSON: expected ',' or '%c' at byte %zu", close, p->pos);
    }
}

static int parse_container(parser *p, ddp__json *v, int object)
{
    keyset names = {0};
    int rc = parse_members(p, v, object, &names);
    free(names.slot);
    return rc;
}

static int literal(parser *p, const char *word, int type, ddp__json *v)
{
    size_t n = strlen(word);
    DDP_FAIL_IF(p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0, DDP_ERR_FORMAT,
                "JSON: unexpected character '%c' at byte %zu", p->s[p->pos], p->pos);
    p->pos += n;
    v->type = type;
    return 0;
}

static int parse_value(parser *p, ddp__json *v)
{
    skip_ws(p);
    int c = peek(p);
    switch (c) {
    case -1:
        FAIL(p, "JSON: value expected at byte %zu (end of text)", p->pos);
    case '{':
        return parse_container(p, v, 1);
    case '[':
        return parse_container(p, v, 0);
    case '"':
        v->type = DDP_JSON_STRING;
        return parse_string(p, &v->str, &v->len);
    case 't':
        return literal(p, "true", DDP_JSON_TRUE, v);
    case 'f':
        return literal(p, "false", DDP_JSON_FALSE, v);
    case 'n':
        return literal(p, "null", DDP_JSON_NULL, v);
    default:
        if (c == '-' || (c >= '0' && c <= '9'))
            return parse_number(p, v);
        FAIL(p, "JSON: unexpected character '%c' at byte %zu", c, p->pos);
    }
}

int ddp__json_parse(const char *text, size_t len, ddp__json **out)
{
    DDP_FAIL_IF(!text || !out, DDP_ERR_INVALID_ARG, "JSON: NULL text or output");
    parser p = {.s = text, .len = len};
    ddp__json *v = calloc(1, sizeof *v);
    DDP_FAIL_IF(!v, DDP_ERR_NOMEM, "JSON: out of memory");
    int rc = parse_value(&p, v);
    if (rc == 0) {
        skip_ws(&p);
        if (p.pos != p.len)
            rc = DDP_ERROR(DDP_ERR_FORMAT, "JSON: unexpected data after the value at byte %zu",
                           p.pos);
    }
    if (rc < 0) {
        ddp__json_free(v);
        return rc;
    }
    *out = v;
    return 0;
}

void ddp__json_free(ddp__json *v)
{
    while (v) {
        ddp__json *next = v->next;
        ddp__json_free(v->child);
        free(v->key);
        free(v->str);
        free(v);
        v = next;
    }
}

const ddp__json *ddp__json_get(const ddp__json *obj, const char *key)
{
    if (!obj || obj->type != DDP_JSON_OBJECT)
        return NULL;
    for (const ddp__json *c = obj->child; c; c = c->next)
        if (strcmp(c->key, key) == 0)
            return c;
    return NULL;
}

const char *ddp__json_type_name(int type)
{
    static const char *const names[] = {"null", "false", "true", "number",
                                        "string", "array", "object"};
    return type >= 0 && type <= DDP_JSON_OBJECT ? names[type] : "unknown";
}
