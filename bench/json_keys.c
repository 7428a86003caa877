/* JSON parse time of a safetensors-like header with many tensors: an object
 * of N members (each a small object, names checked for duplicates) against
 * an array of the same N values (no names to check), alternated rounds in
 * one process, so the ratio shows what the duplicate check costs.  It was
 * quadratic (a list scan per member: 45 s for 100k); it is a hash set now.
 *   usage: json_keys [N=100000] [ROUNDS=7]
 * Prints "json_keys n=N object_ms=median (min-max) array_ms=... object/array=R". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "ddp/base.h"

static char *build(int n, int object, size_t *len)
{
    size_t cap = (size_t)n * 96 + 16, at = 0;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    s[at++] = object ? '{' : '[';
    for (int i = 0; i < n; i++) {
        if (object)
            at += (size_t)snprintf(s + at, cap - at, "%s\"layer.%d.w\":", i ? "," : "", i);
        else if (i)
            s[at++] = ',';
        at += (size_t)snprintf(s + at, cap - at,
                               "{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}");
    }
    s[at++] = object ? '}' : ']';
    *len = at;
    return s;
}

static double parse_ms(const char *s, size_t len)
{
    ddp__json *v = NULL;
    double t0 = ddp_time_now();
    if (ddp__json_parse(s, len, &v) < 0) {
        fprintf(stderr, "json_keys: %s\n", ddp_last_error());
        exit(1);
    }
    double dt = (ddp_time_now() - t0) * 1e3;
    ddp__json_free(v);
    return dt;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 100000, rounds = argc > 2 ? atoi(argv[2]) : 7;
    if (n < 1 || rounds < 1 || rounds > 100) {
        fprintf(stderr, "usage: json_keys [N=100000] [ROUNDS=7]\n");
        return 2;
    }
    size_t olen, alen;
    char *o = build(n, 1, &olen), *a = build(n, 0, &alen);
    if (!o || !a)
        return 1;
    double to[100], ta[100];
    for (int r = 0; r < rounds; r++) { /* alternated, so load falls on both */
        to[r] = parse_ms(o, olen);
        ta[r] = parse_ms(a, alen);
    }
    qsort(to, (size_t)rounds, sizeof *to, cmp);
    qsort(ta, (size_t)rounds, sizeof *ta, cmp);
    printf("json_keys n=%d object_ms=%.1f (%.1f-%.1f) array_ms=%.1f (%.1f-%.1f) "
           "object/array=%.2f\n",
           n, to[rounds / 2], to[0], to[rounds - 1], ta[rounds / 2], ta[0], ta[rounds - 1],
           to[rounds / 2] / ta[rounds / 2]);
    free(o);
    free(a);
    return 0;
}
