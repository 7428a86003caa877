/* ddprun's command line: torchrun's flags (both --flag=value and --flag
 * value, dashes or underscores), each value checked whole.  A bad value is
 * refused with exit status 2 and a message naming the flag and the value:
 * strtol/strtod alone take " 12", "+12", "12abc" (unchecked), "nan",
 * "inf" and overflow, and a nan --stop-timeout passed every range check. */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/rng.h"
#include "ddprun.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ddprun [options] PROGRAM [ARGS...]\n"
            "  --nproc-per-node N   workers on this node (default 1)\n"
            "  --nnodes N|MIN:MAX   nodes in the job (default 1); MIN:MAX with\n"
            "                       --rdzv-backend c10d: the job runs with MIN to MAX nodes\n"
            "  --node-rank R        this node's index, 0..nnodes-1 (default 0)\n"
            "  --master-addr A      address of rank 0's store (default 127.0.0.1)\n"
            "  --master-port P      its port (default 29500)\n"
            "  --rdzv-endpoint A:P  same as --master-addr A --master-port P\n"
            "  --rdzv-id ID         the job's id, the same on every node (default: a fresh\n"
            "                       one on a single node; 'none' with --nnodes > 1)\n"
            "  --standalone         single node, pick a free port on 127.0.0.1\n"
            "  --rdzv-backend B     static (default: --node-rank and --master-addr given)\n"
            "                       or c10d: the launchers meet at --rdzv-endpoint (the\n"
            "                       one that binds it hosts the store), node ranks are\n"
            "                       assigned, a failure anywhere restarts every node\n"
            "  --rdzv-conf K=V,...  c10d: join_timeout (600 s), last_call_timeout (2 s,\n"
            "                       after MIN nodes came), heartbeat_timeout (15 s)\n"
            "  --max-restarts K     restart the whole group up to K times (default 0)\n"
            "  --prefix             prefix each output line with \"[rank N]: \"\n"
            "  --stop-timeout S     seconds between SIGTERM and SIGKILL (default 1)\n"
            "  --log-dir DIR        every worker's stdout and stderr also in\n"
            "                       DIR/<run id>/attempt_<n>/<local rank>/{stdout,stderr}.log\n"
            "  -r, --redirects S    streams to the log files only, not the console:\n"
            "                       0 none, 1 stdout, 2 stderr, 3 both, for all local\n"
            "                       ranks, or per local rank: 0:1,1:2\n"
            "  -t, --tee S          streams to the log files and the console, each\n"
            "                       console line prefixed \"[rank]:\" (same syntax)\n"
            "  --local-ranks-filter L  the console shows only these local ranks (0,2)\n"
            "  --bind-to none|core  none (default): workers run where the scheduler puts\n"
            "                       them; core: local rank l runs on CPUs l*k..(l+1)*k-1 of\n"
            "                       ddprun's own, k = its CPUs / --nproc-per-node\n"
            "  -h, --help           this text\n");
}

__attribute__((format(printf, 1, 2))) static int fail_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ddprun: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see ddprun --help)\n");
    va_end(ap);
    return 2;
}

/* A decimal integer from lo to hi, digits only (no sign, blank or
 * trailing text); end, when given, gets where the digits stop instead of
 * requiring the string's end. */
static int parse_int_at(const char *s, long lo, long hi, int *out, const char **end)
{
    if (!isdigit((unsigned char)s[0]))
        return -1;
    char *e;
    errno = 0;
    long v = strtol(s, &e, 10);
    if (errno || (!end && *e) || v < lo || v > hi)
        return -1;
    if (end)
        *end = e;
    *out = (int)v;
    return 0;
}

static int parse_int(const char *s, long lo, long hi, int *out)
{
    return parse_int_at(s, lo, hi, out, NULL);
}

/* Seconds from lo to hi: a finite decimal number, nothing around it. */
static int parse_seconds(const char *s, double lo, double hi, double *out)
{
    if (!isdigit((unsigned char)s[0]) && !(s[0] == '.' && isdigit((unsigned char)s[1])))
        return -1;
    char *e;
    errno = 0;
    double v = strtod(s, &e);
    if (errno || *e || !isfinite(v) || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* --redirects/--tee: "N" (0-3) for every local rank, or "L:N,L:N" per
 * local rank (the others 0); *top gets the highest local rank named (-1
 * for the first form), checked against --nproc-per-node at the end. */
static int parse_std(const char *v, unsigned char *per_rank, int *top)
{
    int n;
    memset(per_rank, 0, MAX_WORKERS);
    *top = -1;
    if (parse_int(v, 0, 3, &n) == 0) {
        memset(per_rank, n, MAX_WORKERS);
        return 0;
    }
    for (const char *p = v;;) {
        int l;
        const char *e;
        if (parse_int_at(p, 0, MAX_WORKERS - 1, &l, &e) || *e != ':' ||
            parse_int_at(e + 1, 0, 3, &n, &e) || (*e && *e != ','))
            return -1;
        per_rank[l] = (unsigned char)n;
        *top = l > *top ? l : *top;
        if (!*e)
            return 0;
        p = e + 1;
    }
}

/* --local-ranks-filter: "0,2,3"; *top as above. */
static int parse_rank_list(const char *v, unsigned char *shown, int *top)
{
    memset(shown, 0, MAX_WORKERS);
    *top = -1;
    for (const char *p = v;;) {
        int l;
        const char *e;
        if (parse_int_at(p, 0, MAX_WORKERS - 1, &l, &e) || (*e && *e != ','))
            return -1;
        shown[l] = 1;
        *top = l > *top ? l : *top;
        if (!*e)
            return 0;
        p = e + 1;
    }
}

/* Binds port 0 on loopback to learn a free port (torchrun --standalone). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* The job's id when --rdzv-id gives none: random on one node (every job
 * its own); several nodes must agree without talking, so they get
 * torchrun's default, "none". */
static int fresh_id(ddprun_options *o)
{
    if (o->nnodes > 1) {
        snprintf(o->rdzv_id, sizeof o->rdzv_id, "none");
        return 0;
    }
    unsigned char r[8];
    if (ddp__random_bytes(r, sizeof r) < 0) {
        fprintf(stderr, "ddprun: no random job id: %s\n", strerror(errno));
        return 1;
    }
    for (size_t k = 0; k < sizeof r; k++)
        snprintf(o->rdzv_id + 2 * k, 3, "%02x", r[k]);
    return 0;
}

/* Accepts both --flag=value and --flag value, and torchrun's underscores;
 * short, when given ("-r"), is the flag's one-letter form. */
static const char *flag_value(int argc, char **argv, int *i, const char *name, const char *short_)
{
    const char *a = argv[*i];
    if (short_ && !strcmp(a, short_))
        return *i + 1 < argc ? argv[++*i] : "";
    size_t n = strlen(name);
    char norm[64];
    snprintf(norm, sizeof norm, "%s", a);
    for (char *c = norm + 2; *c && *c != '='; c++)
        if (*c == '_')
            *c = '-';
    if (strncmp(norm, name, n) != 0)
        return NULL;
    if (norm[n] == '=')
        return a + n + 1;
    if (norm[n] != '\0')
        return NULL;
    if (*i + 1 >= argc)
        return "";
    return argv[++*i];
}

static int parse_endpoint(ddprun_options *o, const char *v)
{
    static char host[256];
    const char *colon = strrchr(v, ':');
    size_t hl = colon ? (size_t)(colon - v) : 0;
    if (!colon || hl == 0 || hl >= sizeof host || parse_int(colon + 1, 1, 65535, &o->master_port))
        return fail_usage("bad --rdzv-endpoint '%s': want HOST:PORT, PORT 1..65535", v);
    memcpy(host, v, hl);
    host[hl] = '\0';
    if (host[0] == '[' && host[hl - 1] == ']') { /* [v6addr]:port */
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = '\0';
    }
    o->master_addr = host;
    return 0;
}

/* --nnodes N or MIN:MAX. */
static int parse_nnodes(ddprun_options *o, const char *v)
{
    const char *colon = strchr(v, ':'), *end = NULL;
    if (!colon) {
        if (parse_int(v, 1, 1 << 20, &o->nnodes))
            return fail_usage("bad --nnodes '%s': want 1..%d or MIN:MAX", v, 1 << 20);
        o->min_nodes = o->max_nodes = o->nnodes;
        return 0;
    }
    if (parse_int_at(v, 1, 1 << 20, &o->min_nodes, &end) || end != colon ||
        parse_int(colon + 1, 1, 1 << 20, &o->max_nodes) || o->max_nodes < o->min_nodes)
        return fail_usage("bad --nnodes '%s': want MIN:MAX with 1 <= MIN <= MAX <= %d", v,
                          1 << 20);
    o->nnodes = o->max_nodes;
    return 0;
}

/* --rdzv-conf join_timeout=S,last_call_timeout=S,heartbeat_timeout=S. */
static int parse_rdzv_conf(ddprun_options *o, const char *v)
{
    static const char *names[3] = {"join_timeout", "last_call_timeout", "heartbeat_timeout"};
    double *vals[3] = {&o->rdzv_join_timeout, &o->rdzv_last_call, &o->rdzv_heartbeat_timeout};
    const char *p = v;
    while (*p) {
        size_t n = strcspn(p, ","), k;
        char item[128];
        if (n >= sizeof item)
            return fail_usage("bad --rdzv-conf '%s': item too long", v);
        memcpy(item, p, n);
        item[n] = '\0';
        char *eq = strchr(item, '=');
        for (k = 0; eq && k < 3; k++)
            if ((size_t)(eq - item) == strlen(names[k]) && !strncmp(item, names[k], strlen(names[k])))
                break;
        if (!eq || k == 3 || parse_seconds(eq + 1, 0.01, 86400, vals[k]))
            return fail_usage("bad --rdzv-conf item '%s': want join_timeout, last_call_timeout "
                              "or heartbeat_timeout = seconds (0.01..86400)", item);
        p += n + (p[n] == ',');
    }
    return 0;
}

/* The highest local rank that --redirects, --tee, --local-ranks-filter name. */
typedef struct {
    int redirects, tee, filter;
} named_ranks;

/* One flag with a value (argv[*i], maybe argv[*i + 1]): 0, or the exit
 * status after the message. */
static int parse_valued(ddprun_options *o, int argc, char **argv, int *i, named_ranks *top)
{
    const char *v;
    if ((v = flag_value(argc, argv, i, "--nproc-per-node", NULL))) {
        if (parse_int(v, 1, MAX_WORKERS, &o->nproc))
            return fail_usage("bad --nproc-per-node '%s': want 1..%d", v, MAX_WORKERS);
    } else if ((v = flag_value(argc, argv, i, "--nnodes", NULL))) {
        return parse_nnodes(o, v);
    } else if ((v = flag_value(argc, argv, i, "--rdzv-backend", NULL))) {
        if (strcmp(v, "static") && strcmp(v, "c10d"))
            return fail_usage("bad --rdzv-backend '%s': want static or c10d", v);
        o->elastic = !strcmp(v, "c10d");
    } else if ((v = flag_value(argc, argv, i, "--rdzv-conf", NULL))) {
        return parse_rdzv_conf(o, v);
    } else if ((v = flag_value(argc, argv, i, "--node-rank", NULL))) {
        if (parse_int(v, 0, 1 << 20, &o->node_rank))
            return fail_usage("bad --node-rank '%s': want 0..%d", v, 1 << 20);
    } else if ((v = flag_value(argc, argv, i, "--master-addr", NULL))) {
        if (!*v)
            return fail_usage("empty --master-addr");
        o->master_addr = v;
    } else if ((v = flag_value(argc, argv, i, "--master-port", NULL))) {
        if (parse_int(v, 1, 65535, &o->master_port))
            return fail_usage("bad --master-port '%s': want 1..65535", v);
    } else if ((v = flag_value(argc, argv, i, "--rdzv-endpoint", NULL))) {
        return parse_endpoint(o, v);
    } else if ((v = flag_value(argc, argv, i, "--rdzv-id", NULL))) {
        if (!*v || strlen(v) >= sizeof o->rdzv_id || strpbrk(v, " \t\n'"))
            return fail_usage("bad --rdzv-id '%s': want 1..128 characters, no spaces "
                              "or quotes", v);
        snprintf(o->rdzv_id, sizeof o->rdzv_id, "%s", v);
    } else if ((v = flag_value(argc, argv, i, "--max-restarts", NULL))) {
        if (parse_int(v, 0, 1000000, &o->max_restarts))
            return fail_usage("bad --max-restarts '%s': want 0..1000000", v);
    } else if ((v = flag_value(argc, argv, i, "--stop-timeout", NULL))) {
        if (parse_seconds(v, 0, 3600, &o->stop_timeout))
            return fail_usage("bad --stop-timeout '%s': want seconds, 0..3600", v);
    } else if ((v = flag_value(argc, argv, i, "--log-dir", NULL))) {
        if (!*v)
            return fail_usage("empty --log-dir");
        o->log_dir = v;
    } else if ((v = flag_value(argc, argv, i, "--redirects", "-r"))) {
        if (parse_std(v, o->redirects, &top->redirects))
            return fail_usage("bad --redirects '%s': want 0..3, or LOCAL_RANK:0..3,...", v);
    } else if ((v = flag_value(argc, argv, i, "--tee", "-t"))) {
        if (parse_std(v, o->tee, &top->tee))
            return fail_usage("bad --tee '%s': want 0..3, or LOCAL_RANK:0..3,...", v);
    } else if ((v = flag_value(argc, argv, i, "--local-ranks-filter", NULL))) {
        if (parse_rank_list(v, o->shown, &top->filter))
            return fail_usage("bad --local-ranks-filter '%s': want local ranks, as in 0,2", v);
        o->filtered = 1;
    } else if ((v = flag_value(argc, argv, i, "--bind-to", NULL))) {
        if (strcmp(v, "none") && strcmp(v, "core"))
            return fail_usage("bad --bind-to '%s': want none or core", v);
        o->bind_core = !strcmp(v, "core");
    } else {
        return fail_usage("unknown option '%s'", argv[*i]);
    }
    return 0;
}

/* Local ranks named by --redirects, --tee or --local-ranks-filter exist;
 * whether the workers' output goes to files. */
static int check_ranks(ddprun_options *o, const named_ranks *top)
{
    const char *names[3] = {"--redirects", "--tee", "--local-ranks-filter"};
    int tops[3] = {top->redirects, top->tee, top->filter};
    for (int m = 0; m < 3; m++)
        if (tops[m] >= o->nproc)
            return fail_usage("%s names local rank %d, but --nproc-per-node is %d", names[m],
                              tops[m], o->nproc);
    if (!o->filtered)
        memset(o->shown, 1, sizeof o->shown);
    o->want_logs = o->log_dir != NULL;
    for (int l = 0; l < o->nproc; l++)
        o->want_logs |= o->redirects[l] || o->tee[l];
    return 0;
}

int ddprun_parse_options(int argc, char **argv, ddprun_options *o)
{
    memset(o, 0, sizeof *o);
    o->nproc = 1;
    o->nnodes = 1;
    o->master_addr = "127.0.0.1";
    o->master_port = 29500;
    o->stop_timeout = 1.0;
    o->rdzv_join_timeout = 600;
    o->rdzv_last_call = 2;
    o->rdzv_heartbeat_timeout = 15;
    named_ranks top = {-1, -1, -1};
    int standalone = 0, i, rc;
    for (i = 1; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--")) {
            i++;
            break;
        } else if (!strcmp(a, "--standalone")) {
            standalone = 1;
        } else if (!strcmp(a, "--prefix")) {
            o->prefix = 1;
        } else if ((rc = parse_valued(o, argc, argv, &i, &top))) {
            return rc;
        }
    }
    if (i >= argc)
        return fail_usage("no program to run");
    if (o->node_rank >= o->nnodes)
        return fail_usage("--node-rank %d must be below --nnodes %d", o->node_rank, o->nnodes);
    if (o->min_nodes != o->max_nodes && !o->elastic)
        return fail_usage("--nnodes MIN:MAX needs --rdzv-backend c10d");
    if (o->elastic && o->node_rank)
        return fail_usage("--rdzv-backend c10d assigns node ranks; drop --node-rank");
    if (o->elastic && !o->min_nodes)
        o->min_nodes = o->max_nodes = o->nnodes;
    if (o->elastic && !o->rdzv_id[0])
        return fail_usage("--rdzv-backend c10d needs --rdzv-id, the same on every node of "
                          "the job (launchers of other jobs are kept apart by it)");
    if ((long)o->nproc * o->nnodes > (1L << 24))
        return fail_usage("world size too large");
    if ((rc = check_ranks(o, &top)) || (rc = ddprun_bind_plan(o)))
        return rc;
    if (standalone) {
        if (o->nnodes != 1)
            return fail_usage("--standalone runs one node; drop --nnodes");
        o->master_addr = "127.0.0.1";
        o->master_port = free_port();
        if (o->master_port < 0) {
            fprintf(stderr, "ddprun: --standalone: no free port on 127.0.0.1: %s\n",
                    strerror(errno));
            return 2;
        }
    }
    if (!o->rdzv_id[0] && fresh_id(o))
        return 1;
    o->argv = argv + i;
    return 0;
}
