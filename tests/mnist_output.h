/* Reading what ddp-mnist wrote, for its end-to-end tests
 * (test_data_mnist_e2e.c, test_mnist_ddp.c, test_mnist_report.c) and the
 * tests of the metrics file (test_progress.c).  Include after cmocka.h. */
#ifndef DDP_TESTS_MNIST_OUTPUT_H
#define DDP_TESTS_MNIST_OUTPUT_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "ddp/base.h"

/* The whole file as a string (owned by the caller); "" when unreadable. */
static inline char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return strdup("");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = '\0';
    fclose(f);
    return s;
}

/* The percentage of the "Test accuracy: NN.NN %" line, -1 without one. */
static inline double accuracy(const char *out)
{
    const char *p = strstr(out, "Test accuracy: ");
    return p ? strtod(p + strlen("Test accuracy: "), NULL) : -1.0;
}

/* Line k (from 0) of a metrics file's text, parsed (caller frees with
 * ddp__json_free); NULL past the end.  A line that does not parse fails
 * the test. */
static inline ddp__json *record(const char *text, int k)
{
    const char *p = text;
    for (int i = 0; i < k && p; i++)
        p = (p = strchr(p, '\n')) ? p + 1 : NULL;
    if (!p || !*p)
        return NULL;
    ddp__json *v;
    size_t n = strcspn(p, "\n");
    if (ddp__json_parse(p, n, &v) < 0)
        fail_msg("line %d '%.*s': %s", k + 1, (int)n, p, ddp_last_error());
    return v;
}

/* A record's number field; a missing one fails the test. */
static inline double num(const ddp__json *o, const char *key)
{
    const ddp__json *v = ddp__json_get(o, key);
    if (!v || v->type != DDP_JSON_NUMBER)
        fail_msg("record without the number '%s'", key);
    return v->num;
}

#endif
