/* ddp-trace DIR: reads every rank's flight-recorder dump (DIR/trace-rank<R>.json,
 * written by libddp on a failure, at exit with DDP_TRACE_DIR=DIR, or on
 * SIGUSR1) and says in one paragraph per group what went wrong: the first
 * collective (sequence number) where the ranks disagree, on the call (op,
 * count, dtype, root, reduce operator) or on having reached it at all; the
 * ranks that never reached it (or wrote no dump); the one that started it
 * last; then each rank's last operations.  PyTorch's fr_trace does the same
 * for NCCL's flight recorder.
 *
 *   ddp-trace [--tail N] DIR
 *
 * Exit status: 0 once the dumps were read (whatever they say), 2 when
 * none could be. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "ddp.h"

#define MAX_RANKS 4096

typedef struct dump {
    int rank;
    ddp__json *root;
    const ddp__json *group; /* the group being analysed in this dump, or NULL */
} dump;

static double num(const ddp__json *o, const char *key, double dflt)
{
    const ddp__json *v = o ? ddp__json_get(o, key) : NULL;
    return v && v->type == DDP_JSON_NUMBER ? v->num : dflt;
}

static const char *str(const ddp__json *o, const char *key)
{
    const ddp__json *v = o ? ddp__json_get(o, key) : NULL;
    return v && v->type == DDP_JSON_STRING ? v->str : NULL;
}

static int is_p2p(const ddp__json *e)
{
    const char *op = str(e, "op");
    return op && (strcmp(op, "send") == 0 || strcmp(op, "recv") == 0);
}

/* "all_reduce (4 x float32, sum)": what identifies a call. */
static void call_text(const ddp__json *e, char *out, size_t len)
{
    if (str(e, "op") && strcmp(str(e, "op"), "barrier") == 0) {
        snprintf(out, len, "barrier");
        return;
    }
    int n = snprintf(out, len, "%s (%.0f x %s", str(e, "op") ? str(e, "op") : "?",
                     num(e, "count", 0), str(e, "dtype") ? str(e, "dtype") : "?");
    if (str(e, "reduce_op") && n >= 0 && (size_t)n < len)
        n += snprintf(out + n, len - (size_t)n, ", %s", str(e, "reduce_op"));
    if (ddp__json_get(e, "root") && n >= 0 && (size_t)n < len)
        n += snprintf(out + n, len - (size_t)n, ", root %.0f", num(e, "root", 0));
    if (ddp__json_get(e, "peer") && n >= 0 && (size_t)n < len)
        n += snprintf(out + n, len - (size_t)n, ", peer %.0f, tag %.0f", num(e, "peer", 0),
                      num(e, "tag", 0));
    if (n >= 0 && (size_t)n < len)
        snprintf(out + n, len - (size_t)n, ")");
}

/* A group's collectives #first.. #first+span-1 on every rank, each with
 * its call text made once: the analysis looks each up many times (an
 * entry list per lookup was O(seqs x ranks^2 x entries)). */
typedef struct cell {
    const ddp__json *e; /* NULL: not in that rank's dump */
    char *text;
} cell;

typedef struct seq_index {
    int n;
    double first;
    size_t span;
    cell *c; /* [rank * span + seq - first] */
} seq_index;

static int index_build(seq_index *x, int n, const ddp__json *const *g, double first, double last)
{
    x->n = n;
    x->first = first;
    x->span = first >= 0 ? (size_t)(last - first) + 1 : 0;
    x->c = calloc((size_t)n * x->span + 1, sizeof *x->c);
    if (!x->c)
        return -1;
    for (int r = 0; r < n; r++) {
        const ddp__json *es = g[r] ? ddp__json_get(g[r], "entries") : NULL;
        for (const ddp__json *e = es ? es->child : NULL; e; e = e->next) {
            double s = num(e, "seq", -1);
            if (is_p2p(e) || s < first || s > last)
                continue;
            cell *c = &x->c[(size_t)r * x->span + (size_t)(s - first)];
            if (c->e) /* the first record of a seq, as before */
                continue;
            char text[512];
            call_text(e, text, sizeof text);
            c->e = e;
            c->text = strdup(text);
            if (!c->text)
                return -1;
        }
    }
    return 0;
}

static void index_free(seq_index *x)
{
    for (size_t i = 0; x->c && i < (size_t)x->n * x->span; i++)
        free(x->c[i].text);
    free(x->c);
}

/* Rank r's collective #seq, or NULL. */
static const cell *at_seq(const seq_index *x, int r, double seq)
{
    const cell *c = &x->c[(size_t)r * x->span + (size_t)(seq - x->first)];
    return c->e ? c : NULL;
}

/* The call most ranks made at #seq (ties: the lowest rank's), or NULL:
 * one pass over the ranks against the distinct calls seen so far (one or
 * two in practice). */
static const cell *majority(const seq_index *x, double seq, const cell **distinct, int *votes)
{
    int nd = 0, best = -1;
    for (int r = 0; r < x->n; r++) {
        const cell *c = at_seq(x, r, seq);
        if (!c)
            continue;
        int k = 0;
        while (k < nd && strcmp(distinct[k]->text, c->text) != 0)
            k++;
        if (k == nd) {
            distinct[nd++] = c;
            votes[k] = 0;
        }
        votes[k]++;
    }
    for (int k = 0; k < nd; k++)
        if (best < 0 || votes[k] > votes[best])
            best = k;
    return best < 0 ? NULL : distinct[best];
}

/* Lowest and highest collective sequence numbers recorded (-1: none). */
static void seq_range(const ddp__json *group, double *lo, double *hi)
{
    *lo = *hi = -1;
    const ddp__json *es = ddp__json_get(group, "entries");
    for (const ddp__json *e = es ? es->child : NULL; e; e = e->next) {
        if (is_p2p(e))
            continue;
        double s = num(e, "seq", -1);
        if (*lo < 0 || s < *lo)
            *lo = s;
        if (s > *hi)
            *hi = s;
    }
}

static int read_dump(const char *dir, const char *name, dump *d)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    int rc = buf ? ddp__json_parse(buf, n, &d->root) : -1;
    free(buf);
    if (rc < 0 || !d->root || d->root->type != DDP_JSON_OBJECT) {
        fprintf(stderr, "ddp-trace: %s: %s\n", path, rc < 0 ? ddp_last_error() : "not a dump");
        ddp__json_free(rc < 0 ? NULL : d->root);
        return -1;
    }
    d->rank = (int)num(d->root, "rank", -1);
    return d->rank >= 0 ? 0 : -1;
}

/* "ranks 0, 2" / "rank 1" into out from the ranks flagged in set (n). */
static void rank_list(const unsigned char *set, int n, char *out, size_t len)
{
    int k = 0;
    for (int r = 0; r < n; r++)
        k += set[r] != 0;
    size_t at = (size_t)snprintf(out, len, "rank%s", k > 1 ? "s" : "");
    for (int r = 0, i = 0; r < n && at < len; r++)
        if (set[r])
            at += (size_t)snprintf(out + at, len - at, "%s%d", i++ ? ", " : " ", r);
}

/* The analysis of one group of size n, whose dumps are g[r] (NULL: none). */
static void analyse(const char *name, int n, const ddp__json *const *g)
{
    unsigned char *nodump = calloc((size_t)n, 1), *never = calloc((size_t)n, 1),
                  *odd = calloc((size_t)n, 1);
    double first = -1, last = -1;
    int have = 0;
    for (int r = 0; r < n; r++) {
        double lo, hi;
        if (!g[r]) {
            nodump[r] = 1;
            continue;
        }
        have++;
        seq_range(g[r], &lo, &hi);
        if (lo >= 0 && (first < 0 || lo > first))
            first = lo; /* from here every dump still holds its records */
        if (hi > last)
            last = hi;
    }
    printf("Group %s (%d ranks, %d dumps)", name, n, have);
    seq_index x;
    const cell **distinct = calloc((size_t)n, sizeof *distinct);
    int *votes = calloc((size_t)n, sizeof *votes);
    if (index_build(&x, n, g, first, last) < 0 || !distinct || !votes) {
        printf(": out of memory for the analysis.\n");
        goto out;
    }
    char text[512];
    const char *who = "?";
    double at = -1;
    int kind = 0; /* 1: calls differ, 2: some never reached it, 3: stuck, no dump from some */
    for (double s = first < 0 ? 0 : first; first >= 0 && s <= last && !kind; s++) {
        const cell *major = majority(&x, s, distinct, votes);
        who = major ? major->text : "?";
        int done = 1;
        for (int r = 0; r < n; r++) {
            const cell *c = g[r] ? at_seq(&x, r, s) : NULL;
            never[r] = g[r] && !c && num(g[r], "next_seq", 0) <= s;
            odd[r] = 0;
            if (c) {
                odd[r] = strcmp(c->text, who) != 0;
                kind = odd[r] ? 1 : kind;
                done &= str(c->e, "state") && strcmp(str(c->e, "state"), "done") == 0;
            }
            if (never[r] && kind != 1)
                kind = 2;
        }
        if (!kind && !done && have < n)
            kind = 3;
        at = s;
    }
    if (!kind) {
        printf(": no disagreement in the records (collectives #%.0f to #%.0f).\n", first, last);
    } else {
        printf(": the ranks first disagree at collective #%.0f.", at);
        for (int r = 0; kind == 1 && r < n; r++)
            if (odd[r])
                printf(" Rank %d called %s where the others called %s.", r,
                       at_seq(&x, r, at)->text, who);
        if (kind == 2 || (kind == 1 && memchr(never, 1, (size_t)n))) {
            rank_list(never, n, text, sizeof text);
            text[0] = 'R';
            printf(" %s never reached it (", text);
            for (int r = 0, i = 0; r < n; r++)
                if (never[r])
                    printf("%srank %d issued %.0f collectives", i++ ? "; " : "", r,
                           num(g[r], "next_seq", 0));
            printf(") while the others called %s.", who);
        }
        if (have < n) {
            rank_list(nodump, n, text, sizeof text);
            text[0] = 'R';
            if (kind == 3)
                printf(" %s wrote no dump and never said it reached #%.0f, which every other "
                       "rank started and none finished (stopped, killed or hung?).",
                       text, at);
            else
                printf(" %s wrote no dump (stopped, killed or hung?).", text);
        }
        /* who started it last */
        int lastr = -1, firstr = -1;
        double tl = 0, tf = 0;
        for (int r = 0; r < n; r++) {
            const cell *c = g[r] ? at_seq(&x, r, at) : NULL;
            double t = c ? num(c->e, "started_us", 0) : 0;
            if (t <= 0)
                continue;
            if (lastr < 0 || t > tl)
                tl = t, lastr = r;
            if (firstr < 0 || t < tf)
                tf = t, firstr = r;
        }
        if (lastr >= 0 && lastr != firstr)
            printf(" Of the ranks that started it, rank %d started last, %.3f ms after rank %d.",
                   lastr, (tl - tf) / 1e3, firstr);
        printf("\n");
    }
out:
    index_free(&x);
    free(distinct);
    free(votes);
    free(nodump);
    free(never);
    free(odd);
}

/* A rank's last ops, oldest first. */
static void tail(int rank, const ddp__json *root, const ddp__json *group, int ntail)
{
    const ddp__json *es = ddp__json_get(group, "entries");
    size_t n = es ? es->len : 0, i = 0;
    printf("  rank %d (pid %.0f, %s):", rank, num(root, "pid", 0),
           str(root, "host") ? str(root, "host") : "?");
    if (!n)
        printf(" no operation recorded");
    for (const ddp__json *e = es ? es->child : NULL; e; e = e->next, i++) {
        if (i + (size_t)ntail < n)
            continue;
        char text[512];
        call_text(e, text, sizeof text);
        double t0 = num(e, "started_us", 0), t1 = num(e, "done_us", 0);
        printf("\n    #%.0f %s %s", num(e, "seq", 0), text, str(e, "state"));
        if (t0 > 0 && t1 > 0)
            printf(" in %.3f ms", (t1 - t0) / 1e3);
        if (str(e, "error"))
            printf(" (%s)", str(e, "error"));
        if (str(e, "label"))
            printf(" [%s]", str(e, "label"));
    }
    printf("\n    why dumped: %s\n", str(root, "reason") ? str(root, "reason") : "?");
}

int main(int argc, char **argv)
{
    int ntail = 5;
    const char *dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--tail") == 0 && i + 1 < argc)
            ntail = atoi(argv[++i]);
        else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0 || dir)
            dir = NULL, i = argc;
        else
            dir = argv[i];
    }
    if (!dir) {
        fprintf(stderr, "usage: ddp-trace [--tail N] DIR   (DIR: DDP_TRACE_DIR of the job)\n");
        return 2;
    }
    DIR *d = opendir(dir);
    if (!d) {
        perror(dir);
        return 2;
    }
    static dump dumps[MAX_RANKS];
    int nd = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL && nd < MAX_RANKS) {
        size_t len = strlen(de->d_name);
        if (strncmp(de->d_name, "trace-rank", 10) || len < 15 ||
            strcmp(de->d_name + len - 5, ".json"))
            continue;
        if (read_dump(dir, de->d_name, &dumps[nd]) == 0)
            nd++;
    }
    closedir(d);
    if (!nd) {
        fprintf(stderr, "ddp-trace: no readable trace-rank*.json in %s\n", dir);
        return 2;
    }
    /* Groups by name, in the order of the first dump that has them, then
     * any the others add. */
    const char *names[64];
    int nn = 0;
    for (int i = 0; i < nd; i++) {
        const ddp__json *gs = ddp__json_get(dumps[i].root, "groups");
        for (const ddp__json *g = gs ? gs->child : NULL; g && nn < 64; g = g->next) {
            const char *nm = str(g, "name");
            int seen = !nm;
            for (int k = 0; k < nn && !seen; k++)
                seen = strcmp(names[k], nm) == 0;
            if (!seen)
                names[nn++] = nm;
        }
    }
    for (int k = 0; k < nn; k++) {
        const ddp__json *by_rank[MAX_RANKS] = {0};
        int n = 0;
        for (int i = 0; i < nd; i++) {
            const ddp__json *gs = ddp__json_get(dumps[i].root, "groups");
            dumps[i].group = NULL;
            for (const ddp__json *g = gs ? gs->child : NULL; g; g = g->next)
                if (str(g, "name") && strcmp(str(g, "name"), names[k]) == 0) {
                    int r = (int)num(g, "rank", -1), size = (int)num(g, "size", 0);
                    if (r >= 0 && r < MAX_RANKS && size <= MAX_RANKS) {
                        by_rank[r] = g;
                        n = size > n ? size : n;
                        dumps[i].group = g;
                    }
                }
        }
        analyse(names[k], n, by_rank);
        for (int r = 0; r < n; r++)
            for (int i = 0; i < nd; i++)
                if (dumps[i].group && dumps[i].group == by_rank[r])
                    tail(r, dumps[i].root, by_rank[r], ntail);
    }
    for (int i = 0; i < nd; i++)
        ddp__json_free(dumps[i].root);
    return 0;
}
