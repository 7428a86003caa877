/* The table of DDP_* environment variables and their typed readers.  See
 * env.h for the rules; README.md's "Configuration (environment)" lists the
 * same names (tests/test_env.c holds the two equal). */
#include "base/env.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/error.h"

#define KIB 1024.0
#define MIB (1024.0 * KIB)
#define GIB (1024.0 * MIB)
#define TIB (1024.0 * GIB)
/* Spin and yield budgets: at most 10 s (beyond that a wait is a sleep). */
#define USEC_MAX 1e7

#define BOOL(n, d, w) {.name = n, .type = DDP__ENV_BOOL, .lo = 0, .hi = 1, .dflt = d, .what = w}
#define INT(n, l, h, d, w) {.name = n, .type = DDP__ENV_INT, .lo = l, .hi = h, .dflt = d, .what = w}
#define SIZE(n, l, h, d, w) {.name = n, .type = DDP__ENV_SIZE, .lo = l, .hi = h, .dflt = d, .what = w}
#define USEC(n, d, w) {.name = n, .type = DDP__ENV_USEC, .lo = 0, .hi = USEC_MAX, .dflt = d, .what = w}
#define WORD(n, d, w, ...) \
    {.name = n, .type = DDP__ENV_WORD, .dflt = d, .words = {__VA_ARGS__, NULL}, .what = w}
#define STR(n, h, w) {.name = n, .type = DDP__ENV_STRING, .hi = h, .what = w}
#define SECONDS(n, l, h, d, w) \
    {.name = n, .type = DDP__ENV_SECONDS, .lo = l, .hi = h, .dflt = d, .what = w}
#define PATH(n, w) {.name = n, .type = DDP__ENV_PATH, .hi = 4095, .what = w}

static const ddp__env_var table[] = {
    /* rendezvous, security */
    STR("DDP_SECRET", 0, "shared secret that store clients and transport peers must prove"),
    PATH("DDP_SECRET_FILE", "file holding the shared secret (used when DDP_SECRET is unset)"),
    PATH("DDP_ERROR_FILE", "set by ddprun per worker: where a failing program may write its error"),
    STR("DDP_STORE_BIND", 255, "address rank 0's TCPStore listens on (default: the URL's host)"),
    INT("DDP_STORE_MAX_UNAUTH", 1, 65536, "256",
        "TCPStore server: unauthenticated connections held (oldest dropped first)"),
    SECONDS("DDP_RENDEZVOUS_REPORT_S", 0, 1e6, "10",
            "seconds between a waiting rank's reports of who is missing (0: none)"),
    SIZE("DDP_FILESTORE_COMPACT_BYTES", 0, TIB, "1048576",
         "file store: log size from which it is compacted"),
    /* compute, data, logging */
    INT("DDP_NUM_THREADS", 1, 4096, NULL,
        "BLAS threads per process (default: OPENBLAS_NUM_THREADS, else 1)"),
    WORD("DDP_CONV_WINOGRAD", "auto",
         "Winograd tile of 3x3 convolutions: auto (4x4 from a 16x16 output, else 2x2), 2 or 4",
         "auto", "2", "4"),
    PATH("DDP_DATA_CACHE_DIR",
         "cache of decompressed IDX files (default $XDG_CACHE_HOME/libddp or ~/.cache/libddp)"),
    BOOL("DDP_DATA_CACHE", "1", "0: no cache of decompressed IDX files"),
    SIZE("DDP_DATA_CACHE_MAX_BYTES", 1, TIB, "1073741824",
         "size cap of that cache (least recently used entries out)"),
    WORD("DDP_LOG_LEVEL", "off", "log to stderr from this level (silent by default)", "off",
         "error", "warn", "info", "debug", "warning"),
    PATH("DDP_TIMELINE_DIR",
         "timeline: each rank writes DIR/timeline-rank<R>.json (Chrome trace; default: off)"),
    INT("DDP_TIMELINE_MAX_EVENTS", 1, 1000000000, "262144",
         "timeline: events kept per thread (48 bytes each); later ones are counted as dropped"),
    /* transport selection */
    WORD("DDP_TRANSPORT", "auto", "transport: auto (shm on one host, else tcp), tcp or shm",
         "auto", "tcp", "shm"),
    STR("DDP_HOST_ID", 0, "host identity deciding who shares memory (default: host name + boot id)"),
    WORD("DDP_HIERARCHICAL", "auto", "two-level collectives across hosts: auto, 0 or 1", "auto",
         "0", "1"),
    /* collectives */
    WORD("DDP_ALLREDUCE_ALGO", "auto", "forces the all-reduce algorithm", "auto", "ring", "rd",
         "direct", "shared", "rabenseifner", "tree"),
    SIZE("DDP_CHUNK_BYTES", 1, TIB, "262144", "pipeline unit of the ring and the tree"),
    SIZE("DDP_ALLREDUCE_DIRECT_BYTES", 1, TIB, "65536", "auto, 2 ranks: direct up to this size"),
    SIZE("DDP_ALLREDUCE_RD_BYTES", 1, TIB, "16384",
         "auto, more ranks: recursive doubling up to this size"),
    SIZE("DDP_ALLREDUCE_RAB_BYTES", 1, TIB, "2097152",
         "auto, 4+ ranks (a power of two) without a shared window: Rabenseifner up to this size"),
    SIZE("DDP_ALLREDUCE_SHARED_BYTES", 1, TIB, "65536",
         "auto: the shared-window all-reduce from this size"),
    SIZE("DDP_SHARED_CHUNK_BYTES", 1, TIB, "262144", "pipeline chunk of the shared-window all-reduce"),
    SIZE("DDP_RING_WINDOW_BYTES", 1, TIB, "4194304",
         "standalone ring reduce-scatter, 3+ ranks: bytes of units in flight"),
    SIZE("DDP_ALLREDUCE_SYMMETRIC_BYTES", 1, TIB, "33554432",
         "all-reduce on symmetric memory: in place from this size"),
    WORD("DDP_REDUCE_ISA", "auto", "caps the reduction kernels' instruction set", "auto",
         "avx512", "avx2", "portable"),
    /* shared-memory transport */
    SIZE("DDP_SHM_RING_BYTES", 4096, GIB, "1048576",
         "shm: bytes of each pair's ring (rounded up to a power of two)"),
    SIZE("DDP_SHM_WINDOW_BYTES", 0, GIB, "1048576",
         "shm: bytes of each rank's shared window (whole pages; 0: none)"),
    USEC("DDP_SHM_SPIN_US", "20", "shm: a wait spins this long"),
    USEC("DDP_SHM_YIELD_US", "200", "shm: then yields until this long idle, then sleeps"),
    BOOL("DDP_SHM_CMA", "0", "shm: 1: large messages by cross-memory attach"),
    SIZE("DDP_SHM_CMA_BYTES", 0, TIB, "32768", "shm with DDP_SHM_CMA=1: messages from this size"),
    BOOL("DDP_SYMMETRIC_MEMORY", "1", "0: no symmetric memory (private buffers instead)"),
    /* tcp transport */
    USEC("DDP_TCP_SPIN_US", "20", "tcp: a wait polls epoll this long before it sleeps"),
    STR("DDP_TCP_HOST", 255, "tcp: address this rank listens on (default: the host name's IPv4)"),
    STR("DDP_SOCKET_IFNAME", 255, "tcp: the interfaces whose address this rank listens on "
        "(GLOO_SOCKET_IFNAME: a name, a comma list, ^ to exclude)"),
    WORD("DDP_SOCKET_FAMILY", "any", "tcp: address family of the listening address: any "
         "(IPv4 first), ipv4 or ipv6", "any", "ipv4", "ipv6"),
    INT("DDP_SOCKET_NUM_STREAMS", 1, 8, "1",
        "tcp: connections per pair of ranks; messages from 256 KiB are striped across them"),
    SIZE("DDP_TCP_SOCKBUF", 0, 2147483647.0, "4194304",
         "tcp: SO_SNDBUF/SO_RCVBUF of the connections (0: kernel autotuning)"),
    /* seeing what a job does (src/pg/trace.h) */
    SIZE("DDP_TRACE_BUFFER", 0, 1e7, "0",
         "flight recorder: operations kept per process group (0: off; 2000 is typical)"),
    PATH("DDP_TRACE_DIR", "flight recorder: every rank dumps to DIR/trace-rank<R>.json on a "
                          "failure and at exit"),
    WORD("DDP_DEBUG", "off", "info: more logs; detail: every collective's arguments checked "
                             "across ranks, DDP's unused parameters and bucket order",
         "off", "info", "detail"),
    BOOL("DDP_COMM_STATS", "0", "1: each group logs its communication statistics at exit"),
    /* DDP */
    INT("DDP_TAIL_CHUNKS", 0, 1024, NULL,
        "DDP: the last weight gradient in N chunks (default: the options', 0: off)"),
    BOOL("DDP_NO_DEFER", "0", "DDP: 1: launch the last bucket like the others (to measure)"),
    /* mpi backend */
    WORD("DDP_MPI_THREAD", "serialized", "mpi: thread level asked of MPI", "serialized",
         "multiple"),
    WORD("DDP_MPI_PROGRESS", "blocking", "mpi: how operations wait", "blocking", "poll"),
    USEC("DDP_MPI_SPIN_US", "20000", "mpi with poll: test back to back this long"),
    /* examples/mnist/ */
    BOOL("DDP_MNIST_PROFILE", "0", "ddp-mnist: 1: time per training phase, on stderr"),
    BOOL("DDP_MNIST_TIMESTAMPS", "0", "ddp-mnist: 1: print the wall time of the first step"),
};

const ddp__env_var *ddp__env_table(size_t *count)
{
    *count = sizeof table / sizeof table[0];
    return table;
}

const ddp__env_var *ddp__env_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof table / sizeof table[0]; i++)
        if (strcmp(table[i].name, name) == 0)
            return &table[i];
    return NULL;
}

/* ---- what an entry accepts, in words ---------------------------------- */

/* A byte count as people write it: "1 TiB", "4 KiB", else the digits. */
static void bytes_text(double v, char *out, size_t len)
{
    static const char *const units[] = {"TiB", "GiB", "MiB", "KiB"};
    static const double scale[] = {TIB, GIB, MIB, KIB};
    for (int i = 0; i < 4; i++)
        if (v >= scale[i] && fmod(v, scale[i]) == 0) {
            snprintf(out, len, "%.0f %s", v / scale[i], units[i]);
            return;
        }
    snprintf(out, len, "%.0f", v);
}

static void accepted(const ddp__env_var *v, char *out, size_t len)
{
    char lo[32], hi[32];
    switch (v->type) {
    case DDP__ENV_BOOL:
        snprintf(out, len, "0 or 1");
        return;
    case DDP__ENV_INT:
        snprintf(out, len, "an integer from %.0f to %.0f", v->lo, v->hi);
        return;
    case DDP__ENV_SIZE:
        bytes_text(v->lo, lo, sizeof lo);
        bytes_text(v->hi, hi, sizeof hi);
        snprintf(out, len, "a size in bytes from %s to %s", lo, hi);
        return;
    case DDP__ENV_USEC:
        snprintf(out, len, "microseconds from %g to %g", v->lo, v->hi);
        return;
    case DDP__ENV_SECONDS:
        snprintf(out, len, "seconds from %g to %g", v->lo, v->hi);
        return;
    case DDP__ENV_WORD: {
        size_t n = 0, at = 0;
        while (n < DDP__ENV_MAX_WORDS && v->words[n])
            n++;
        at += (size_t)snprintf(out, len, "%s", v->words[0]);
        for (size_t i = 1; i < n && at < len; i++)
            at += (size_t)snprintf(out + at, len - at, "%s%s", i + 1 == n ? " or " : ", ",
                                   v->words[i]);
        return;
    }
    case DDP__ENV_STRING:
    case DDP__ENV_PATH:
        snprintf(out, len, "at most %.0f bytes", v->hi);
        return;
    }
}

static int bad_value(const ddp__env_var *v, const char *value)
{
    char what[160];
    accepted(v, what, sizeof what);
    return DDP_ERROR(DDP_ERR_INVALID_ARG, "%s=%.80s: expected %s", v->name, value, what);
}

/* ---- parsing ------------------------------------------------------------- */

/* A decimal number with no sign, blank, hex, nan or inf: strtod alone
 * would take all of those. */
static int decimal(const char *s, int integer_only, double *out)
{
    if (!(s[0] >= '0' && s[0] <= '9') && !(s[0] == '.' && s[1] >= '0' && s[1] <= '9'))
        return -1;
    if (strspn(s, integer_only ? "0123456789" : "0123456789.eE+-") != strlen(s))
        return -1;
    char *end;
    errno = 0;
    double d = strtod(s, &end);
    if (*end || errno == ERANGE || !isfinite(d))
        return -1;
    *out = d;
    return 0;
}

/* value against entry v; the number (or word index) in *num. */
static int parse(const ddp__env_var *v, const char *value, double *num)
{
    double d = 0;
    switch (v->type) {
    case DDP__ENV_BOOL:
        if (strcmp(value, "0") != 0 && strcmp(value, "1") != 0)
            return bad_value(v, value);
        *num = value[0] == '1';
        return 0;
    case DDP__ENV_INT: {
        /* digits only (a '-' where the range is below zero) */
        const char *digits = value[0] == '-' && v->lo < 0 ? value + 1 : value;
        if (decimal(digits, 1, &d) < 0)
            return bad_value(v, value);
        d = digits == value ? d : -d;
        break;
    }
    case DDP__ENV_SIZE:
        if (decimal(value, 0, &d) < 0 || d != floor(d))
            return bad_value(v, value);
        break;
    case DDP__ENV_USEC:
    case DDP__ENV_SECONDS:
        if (decimal(value, 0, &d) < 0)
            return bad_value(v, value);
        break;
    case DDP__ENV_WORD:
        for (int i = 0; i < DDP__ENV_MAX_WORDS && v->words[i]; i++)
            if (strcasecmp(value, v->words[i]) == 0) {
                *num = i;
                return 0;
            }
        return bad_value(v, value);
    case DDP__ENV_STRING:
    case DDP__ENV_PATH:
        if (v->hi > 0 && (double)strlen(value) > v->hi)
            return bad_value(v, value);
        *num = 0;
        return 0;
    }
    if (d < v->lo || d > v->hi)
        return bad_value(v, value);
    *num = d;
    return 0;
}

static const char *const type_names[] = {"bool", "int", "size", "usec", "word", "string", "path",
                                           "seconds"};

/* The entry of name read as type, and its value (NULL: unset or empty). */
static int lookup(const char *name, ddp__env_type type, const ddp__env_var **var,
                  const char **value)
{
    const ddp__env_var *v = ddp__env_find(name);
    DDP_FAIL_IF(!v, DDP_ERR_INVALID_ARG,
                "environment variable %s is not in libddp's table (src/base/env.c)",
                name ? name : "(null)");
    int str = type == DDP__ENV_STRING && v->type == DDP__ENV_PATH;
    DDP_FAIL_IF(v->type != type && !str, DDP_ERR_INVALID_ARG,
                "environment variable %s is a %s, read as a %s", name, type_names[v->type],
                type_names[type]);
    const char *s = getenv(name);
    *var = v;
    *value = s && *s ? s : NULL;
    return 0;
}

/* The number of name's value or default; 1 when neither is there. */
static int number(const char *name, ddp__env_type type, double *out)
{
    const ddp__env_var *v;
    const char *s;
    DDP_TRY(lookup(name, type, &v, &s));
    if (!s && !v->dflt)
        return 1;
    if (!s) /* a default that does not parse is a table bug (tests/test_env.c) */
        return parse(v, v->dflt, out);
    return parse(v, s, out);
}

/* The numeric getters: the number, converted to the caller's type. */
#define NUMBER_GETTER(fn, ctype, etype)                      \
    int fn(const char *name, ctype *out)                     \
    {                                                        \
        double d;                                            \
        int rc = number(name, etype, &d);                    \
        if (rc == 0)                                         \
            *out = (ctype)d;                                 \
        return rc < 0 ? rc : 0;                              \
    }
NUMBER_GETTER(ddp__env_bool, int, DDP__ENV_BOOL)
NUMBER_GETTER(ddp__env_int, int, DDP__ENV_INT)
NUMBER_GETTER(ddp__env_size, size_t, DDP__ENV_SIZE)
NUMBER_GETTER(ddp__env_usec, double, DDP__ENV_USEC)
NUMBER_GETTER(ddp__env_seconds, double, DDP__ENV_SECONDS)
NUMBER_GETTER(ddp__env_word, int, DDP__ENV_WORD)

int ddp_env_bool(const char *name, int *out) { return ddp__env_bool(name, out); }

int ddp__env_string(const char *name, const char **out)
{
    const ddp__env_var *v;
    const char *s;
    DDP_TRY(lookup(name, DDP__ENV_STRING, &v, &s));
    double unused;
    if (s)
        DDP_TRY(parse(v, s, &unused));
    *out = s ? s : v->dflt;
    return 0;
}

int ddp__env_launcher_int(const char *name, long lo, long hi, int dflt, int *out)
{
    *out = dflt;
    const char *s = getenv(name);
    if (!s || !*s)
        return 0;
    ddp__env_var v = {.name = name, .type = DDP__ENV_INT, .lo = (double)lo, .hi = (double)hi};
    double d;
    DDP_TRY(parse(&v, s, &d));
    *out = (int)d;
    return 0;
}
