/* A small strict JSON parser (RFC 8259) into a tree, for file headers such
 * as safetensors'.  Strict: no comments, no trailing commas, no duplicate
 * keys in an object, no control characters in strings, nothing but
 * whitespace after the value, nesting at most DDP_JSON_MAX_DEPTH.  Errors
 * are DDP_ERR_FORMAT with the byte offset: "JSON: expected ':' at byte 17". */
#ifndef DDP_BASE_JSON_H
#define DDP_BASE_JSON_H

#include <stddef.h>
#include <stdint.h>

#define DDP_JSON_MAX_DEPTH 64

enum ddp__json_type {
    DDP_JSON_NULL,
    DDP_JSON_FALSE,
    DDP_JSON_TRUE,
    DDP_JSON_NUMBER,
    DDP_JSON_STRING,
    DDP_JSON_ARRAY,
    DDP_JSON_OBJECT,
};

typedef struct ddp__json ddp__json;
struct ddp__json {
    int type;            /* enum ddp__json_type */
    char *key;           /* member name inside an object (decoded), else NULL */
    char *str;           /* STRING: decoded UTF-8, NUL-terminated (len bytes) */
    size_t len;          /* STRING: bytes; ARRAY/OBJECT: number of children */
    double num;          /* NUMBER */
    int is_uint;         /* NUMBER written as a non-negative integer that fits u64 */
    uint64_t u64;        /* its exact value */
    ddp__json *child;    /* ARRAY/OBJECT: first element / member */
    ddp__json *next;     /* next sibling */
};

/* Parses len bytes of text.  Caller frees *out with ddp__json_free. */
int ddp__json_parse(const char *text, size_t len, ddp__json **out);
void ddp__json_free(ddp__json *v);
/* Member of an object by name, or NULL. */
const ddp__json *ddp__json_get(const ddp__json *obj, const char *key);
/* "object", "array", ... for messages. */
const char *ddp__json_type_name(int type);

#endif
