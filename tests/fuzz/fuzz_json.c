/* libFuzzer harness: the strict JSON parser (src/base/json.c).  Any byte
 * string must either parse into a tree that can be walked and freed, or
 * fail with DDP_ERR_FORMAT; never crash, overread or leak. */
#include <string.h>

#include "base/json.h"
#include "ddp.h"
#include "fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

/* Walks the tree, touching every field a reader would (depth is bounded by
 * the parser's DDP_JSON_MAX_DEPTH, so recursion is fine). */
static size_t walk(const ddp__json *v, int depth)
{
    if (depth > DDP_JSON_MAX_DEPTH + 1)
        abort(); /* the parser let more nesting through than it promises */
    size_t n = 1;
    if (v->type == DDP_JSON_STRING && strlen(v->str) > v->len)
        abort(); /* str must hold len bytes then a NUL */
    (void)ddp__json_type_name(v->type);
    size_t kids = 0;
    for (const ddp__json *c = v->child; c; c = c->next, kids++) {
        if (v->type == DDP_JSON_OBJECT && (!c->key || ddp__json_get(v, c->key) == NULL))
            abort();
        n += walk(c, depth + 1);
    }
    if ((v->type == DDP_JSON_ARRAY || v->type == DDP_JSON_OBJECT) && kids != v->len)
        abort(); /* len must count the children */
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ddp__json *v = NULL;
    int rc = ddp__json_parse((const char *)data, size, &v);
    fuzz_note("json", rc, ddp_last_error());
    if (rc == 0) {
        walk(v, 1);
        ddp__json_free(v);
    } else if (rc != DDP_ERR_FORMAT && rc != DDP_ERR_NOMEM) {
        abort(); /* documented: DDP_ERR_FORMAT with the offset */
    }
    return 0;
}
