/* ddprun: start N worker processes of a training program on this node, the
 * way torchrun does, and watch them.
 *
 *   ddprun [--nproc-per-node N] [--nnodes N] [--node-rank R]
 *          [--master-addr A] [--master-port P] [--rdzv-endpoint A:P]
 *          [--rdzv-id ID] [--standalone] [--max-restarts K] [--prefix]
 *          [--stop-timeout S] PROGRAM [ARGS...]
 *
 * Each worker gets torchrun's environment: RANK, LOCAL_RANK, WORLD_SIZE,
 * LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
 * TORCHELASTIC_RUN_ID (the job's id: --rdzv-id, else a fresh one per job on
 * one node, so that a second job on the same port is refused instead of
 * joining the first) and TORCHELASTIC_RESTART_COUNT (also as
 * DDP_RESTART_COUNT).  When one worker
 * fails, the others are stopped (SIGTERM, then SIGKILL after --stop-timeout)
 * and either the whole local group restarts (--max-restarts) or ddprun exits
 * 1 with one line naming the rank, its exit code or signal and the last line
 * it wrote to stderr.  Workers run in their own process groups and die with
 * ddprun (PR_SET_PDEATHSIG), so nothing is left behind.
 *
 * ddprun uses libc alone, not libddp (it launches programs of any library
 * version, and starts in a millisecond), so its few helpers (a free port, a
 * random id, integer flags) are its own.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/timeline.h"

#define MAX_WORKERS 1024
#define LINE_MAX_LEN 4096

typedef struct {
    int nproc, nnodes, node_rank, max_restarts, prefix;
    const char *master_addr;
    int master_port;
    char rdzv_id[129];
    double stop_timeout;
    char **argv; /* the program and its arguments */
} options;

/* One output stream of a worker: bytes are forwarded line by line. */
typedef struct {
    int fd;
    size_t len;
    char buf[LINE_MAX_LEN];
} stream;

typedef struct {
    pid_t pid;
    int rank, local_rank;
    int status; /* wait status, valid when exited */
    int exited;
    stream out, err;
    char last_err[LINE_MAX_LEN];
} worker;

static volatile sig_atomic_t got_signal;

static void on_signal(int sig) { got_signal = sig; }

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ddprun [options] PROGRAM [ARGS...]\n"
            "  --nproc-per-node N   workers on this node (default 1)\n"
            "  --nnodes N           nodes in the job (default 1)\n"
            "  --node-rank R        this node's index, 0..nnodes-1 (default 0)\n"
            "  --master-addr A      address of rank 0's store (default 127.0.0.1)\n"
            "  --master-port P      its port (default 29500)\n"
            "  --rdzv-endpoint A:P  same as --master-addr A --master-port P\n"
            "  --rdzv-id ID         the job's id, the same on every node (default: a fresh\n"
            "                       one on a single node; 'none' with --nnodes > 1)\n"
            "  --standalone         single node, pick a free port on 127.0.0.1\n"
            "  --max-restarts K     restart the whole group up to K times (default 0)\n"
            "  --prefix             prefix each output line with \"[rank N]: \"\n"
            "  --stop-timeout S     seconds between SIGTERM and SIGKILL (default 1)\n"
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

static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
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
static void fresh_id(options *o)
{
    if (o->nnodes > 1) {
        snprintf(o->rdzv_id, sizeof o->rdzv_id, "none");
        return;
    }
    unsigned char r[8];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    int ok = fd >= 0 && read(fd, r, sizeof r) == (ssize_t)sizeof r;
    if (fd >= 0)
        close(fd);
    if (!ok) { /* no /dev/urandom: still unique on this host */
        snprintf(o->rdzv_id, sizeof o->rdzv_id, "%d-%ld", (int)getpid(), (long)time(NULL));
        return;
    }
    for (size_t k = 0; k < sizeof r; k++)
        snprintf(o->rdzv_id + 2 * k, 3, "%02x", r[k]);
}

/* Accepts both --flag=value and --flag value, and torchrun's underscores. */
static const char *flag_value(int argc, char **argv, int *i, const char *name)
{
    const char *a = argv[*i];
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

static int parse_options(int argc, char **argv, options *o)
{
    *o = (options){.nproc = 1, .nnodes = 1, .master_addr = "127.0.0.1",
                   .master_port = 29500, .stop_timeout = 1.0};
    static char endpoint_host[256];
    int standalone = 0, i;
    for (i = 1; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i], *v;
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
        } else if ((v = flag_value(argc, argv, &i, "--nproc-per-node"))) {
            if (parse_int(v, 1, MAX_WORKERS, &o->nproc))
                return fail_usage("bad --nproc-per-node '%s': want 1..1024", v);
        } else if ((v = flag_value(argc, argv, &i, "--nnodes"))) {
            if (parse_int(v, 1, 1 << 20, &o->nnodes))
                return fail_usage("bad --nnodes '%s': want a positive integer", v);
        } else if ((v = flag_value(argc, argv, &i, "--node-rank"))) {
            if (parse_int(v, 0, 1 << 20, &o->node_rank))
                return fail_usage("bad --node-rank '%s': want an integer >= 0", v);
        } else if ((v = flag_value(argc, argv, &i, "--master-addr"))) {
            if (!*v)
                return fail_usage("empty --master-addr");
            o->master_addr = v;
        } else if ((v = flag_value(argc, argv, &i, "--master-port"))) {
            if (parse_int(v, 1, 65535, &o->master_port))
                return fail_usage("bad --master-port '%s': want 1..65535", v);
        } else if ((v = flag_value(argc, argv, &i, "--rdzv-endpoint"))) {
            const char *colon = strrchr(v, ':');
            size_t hl = colon ? (size_t)(colon - v) : 0;
            if (!colon || hl == 0 || hl >= sizeof endpoint_host ||
                parse_int(colon + 1, 1, 65535, &o->master_port))
                return fail_usage("bad --rdzv-endpoint '%s': want HOST:PORT", v);
            memcpy(endpoint_host, v, hl);
            endpoint_host[hl] = '\0';
            /* [v6addr]:port */
            if (endpoint_host[0] == '[' && endpoint_host[hl - 1] == ']') {
                memmove(endpoint_host, endpoint_host + 1, hl - 2);
                endpoint_host[hl - 2] = '\0';
            }
            o->master_addr = endpoint_host;
        } else if ((v = flag_value(argc, argv, &i, "--rdzv-id"))) {
            if (!*v || strlen(v) >= sizeof o->rdzv_id || strpbrk(v, " \t\n'"))
                return fail_usage("bad --rdzv-id '%s': want 1..128 characters, no spaces "
                                  "or quotes", v);
            snprintf(o->rdzv_id, sizeof o->rdzv_id, "%s", v);
        } else if ((v = flag_value(argc, argv, &i, "--max-restarts"))) {
            if (parse_int(v, 0, 1000000, &o->max_restarts))
                return fail_usage("bad --max-restarts '%s': want an integer >= 0", v);
        } else if ((v = flag_value(argc, argv, &i, "--stop-timeout"))) {
            char *end;
            o->stop_timeout = strtod(v, &end);
            if (end == v || *end || o->stop_timeout < 0 || o->stop_timeout > 3600)
                return fail_usage("bad --stop-timeout '%s': want seconds, 0..3600", v);
        } else {
            return fail_usage("unknown option '%s'", a);
        }
    }
    if (i >= argc)
        return fail_usage("no program to run");
    if (o->node_rank >= o->nnodes)
        return fail_usage("--node-rank %d must be below --nnodes %d", o->node_rank, o->nnodes);
    if ((long)o->nproc * o->nnodes > (1L << 24))
        return fail_usage("world size too large");
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
    if (!o->rdzv_id[0])
        fresh_id(o);
    o->argv = argv + i;
    return 0;
}

static void set_env_int(const char *name, long v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%ld", v);
    setenv(name, buf, 1);
}

/* In the child: environment, own process group, death with the parent. */
static void exec_worker(const options *o, const worker *w, int restart, int out_fd,
                        int err_fd, pid_t parent)
{
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) /* the parent died before prctl */
        _exit(127);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    if (out_fd >= 0)
        dup2(out_fd, STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    set_env_int("RANK", w->rank);
    set_env_int("LOCAL_RANK", w->local_rank);
    set_env_int("WORLD_SIZE", (long)o->nproc * o->nnodes);
    set_env_int("LOCAL_WORLD_SIZE", o->nproc);
    set_env_int("GROUP_RANK", o->node_rank);
    set_env_int("GROUP_WORLD_SIZE", o->nnodes);
    set_env_int("ROLE_RANK", w->rank);
    set_env_int("MASTER_PORT", o->master_port);
    set_env_int("TORCHELASTIC_RESTART_COUNT", restart);
    set_env_int("DDP_RESTART_COUNT", restart);
    set_env_int("TORCHELASTIC_MAX_RESTARTS", o->max_restarts);
    setenv("TORCHELASTIC_RUN_ID", o->rdzv_id, 1);
    setenv("MASTER_ADDR", o->master_addr, 1);
    /* libddp is silent by default; under ddprun its warnings (a rendezvous
     * still waiting for ranks, say) reach the user unless DDP_LOG_LEVEL says. */
    setenv("DDP_LOG_LEVEL", "warn", 0);
    /* torchrun's default: one OpenMP thread per worker so N workers do not
     * oversubscribe the cores; a user's explicit choice stays. */
    setenv("OMP_NUM_THREADS", "1", 0);
    execvp(o->argv[0], o->argv);
    fprintf(stderr, "ddprun: cannot run '%s': %s\n", o->argv[0], strerror(errno));
    _exit(127);
}

/* Starts the workers; on failure those not started count as exited. */
static int start_workers(const options *o, worker *ws, int restart)
{
    pid_t parent = getpid();
    for (int l = 0; l < o->nproc; l++) {
        memset(&ws[l], 0, sizeof ws[l]);
        ws[l].out.fd = ws[l].err.fd = -1;
        ws[l].exited = 1; /* until forked */
        ws[l].local_rank = l;
        ws[l].rank = o->node_rank * o->nproc + l;
    }
    for (int l = 0; l < o->nproc; l++) {
        worker *w = &ws[l];
        int out[2] = {-1, -1}, err[2] = {-1, -1};
        if ((o->prefix && pipe2(out, O_CLOEXEC)) || pipe2(err, O_CLOEXEC)) {
            fprintf(stderr, "ddprun: pipe: %s\n", strerror(errno));
            for (int k = 0; k < 2; k++) {
                if (out[k] >= 0)
                    close(out[k]);
                if (err[k] >= 0)
                    close(err[k]);
            }
            return -1;
        }
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "ddprun: fork: %s\n", strerror(errno));
            for (int k = 0; k < 2; k++) {
                if (out[k] >= 0)
                    close(out[k]);
                close(err[k]);
            }
            return -1;
        }
        if (pid == 0)
            exec_worker(o, w, restart, out[1], err[1], parent);
        setpgid(pid, pid); /* also here: no race with a kill right after */
        w->pid = pid;
        w->exited = 0;
        if (o->prefix)
            close(out[1]);
        close(err[1]);
        w->out.fd = out[0];
        w->err.fd = err[0];
    }
    return 0;
}

/* Forwards one line (without its newline) to `to`, remembering stderr lines. */
static void emit_line(const options *o, worker *w, stream *s, const char *line, size_t n, FILE *to)
{
    if (o->prefix)
        fprintf(to, "[rank %d]: ", w->rank);
    fwrite(line, 1, n, to);
    fputc('\n', to);
    if (s == &w->err && n > 0) {
        memcpy(w->last_err, line, n);
        w->last_err[n] = '\0';
    }
}

/* Writes out the complete lines in s; a full buffer or a flush (at EOF)
 * also writes the unfinished rest. */
static void emit_lines(const options *o, worker *w, stream *s, FILE *to, int flush)
{
    size_t start = 0;
    for (size_t i = 0; i < s->len; i++) {
        if (s->buf[i] == '\n') {
            emit_line(o, w, s, s->buf + start, i - start, to);
            start = i + 1;
        }
    }
    /* An unfinished line goes out at EOF, or when it alone fills the buffer. */
    if (start < s->len && (flush || (start == 0 && s->len == sizeof s->buf - 1))) {
        emit_line(o, w, s, s->buf + start, s->len - start, to);
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
    fflush(to);
}

/* Reads what is available; closes the stream at EOF. */
static void pump(const options *o, worker *w, stream *s, FILE *to)
{
    ssize_t n = read(s->fd, s->buf + s->len, sizeof s->buf - 1 - s->len);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n <= 0) {
        emit_lines(o, w, s, to, 1);
        close(s->fd);
        s->fd = -1;
        return;
    }
    s->len += (size_t)n;
    emit_lines(o, w, s, to, 0);
}

/* Polls the workers' pipes for up to timeout_ms, forwarding output. */
static void pump_all(const options *o, worker *ws, int timeout_ms)
{
    struct pollfd pfd[2 * MAX_WORKERS];
    stream *who[2 * MAX_WORKERS];
    worker *owner[2 * MAX_WORKERS];
    int n = 0;
    for (int l = 0; l < o->nproc; l++) {
        stream *ss[2] = {&ws[l].out, &ws[l].err};
        for (int k = 0; k < 2; k++) {
            if (ss[k]->fd < 0)
                continue;
            pfd[n] = (struct pollfd){.fd = ss[k]->fd, .events = POLLIN};
            who[n] = ss[k];
            owner[n++] = &ws[l];
        }
    }
    if (n == 0) {
        if (timeout_ms > 0)
            poll(NULL, 0, timeout_ms);
        return;
    }
    if (poll(pfd, (nfds_t)n, timeout_ms) <= 0)
        return;
    for (int k = 0; k < n; k++)
        if (pfd[k].revents)
            pump(o, owner[k], who[k], who[k] == &owner[k]->out ? stdout : stderr);
}

/* Collects exited workers; returns the index of the first failure seen, or -1. */
static int reap(const options *o, worker *ws, int *running)
{
    int failed = -1, status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int l = 0; l < o->nproc; l++) {
            if (ws[l].pid != pid || ws[l].exited)
                continue;
            ws[l].exited = 1;
            ws[l].status = status;
            (*running)--;
            if (failed < 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
                failed = l;
        }
    }
    return failed;
}

static void signal_all(const options *o, worker *ws, int sig)
{
    for (int l = 0; l < o->nproc; l++)
        if (!ws[l].exited)
            kill(-ws[l].pid, sig);
}

/* Sends sig to every live worker, SIGKILL after the grace period, and
 * reaps them (giving up 5 s after SIGKILL: a process stuck in the kernel). */
static void stop_all(const options *o, worker *ws, int *running, int sig)
{
    signal_all(o, ws, sig);
    double deadline = now() + o->stop_timeout;
    int killed = 0;
    while (*running > 0 && now() < deadline + 5) {
        if (!killed && now() >= deadline) {
            signal_all(o, ws, SIGKILL);
            killed = 1;
        }
        pump_all(o, ws, 20);
        reap(o, ws, running);
    }
}

/* After the workers exited: forwards what is left in the pipes (at most
 * 1 s: a grandchild may hold them open), kills whatever is left in the
 * workers' process groups, and closes the pipes. */
static void finish_group(const options *o, worker *ws)
{
    double deadline = now() + 1.0;
    for (int open = 1; open && now() < deadline;) {
        pump_all(o, ws, 20);
        open = 0;
        for (int l = 0; l < o->nproc; l++)
            open |= ws[l].out.fd >= 0 || ws[l].err.fd >= 0;
    }
    for (int l = 0; l < o->nproc; l++) {
        if (ws[l].pid > 0)
            kill(-ws[l].pid, SIGKILL); /* grandchildren; ESRCH when none */
        stream *ss[2] = {&ws[l].out, &ws[l].err};
        for (int k = 0; k < 2; k++)
            if (ss[k]->fd >= 0) {
                emit_lines(o, &ws[l], ss[k], k ? stderr : stdout, 1);
                close(ss[k]->fd);
                ss[k]->fd = -1;
            }
    }
}

static void describe(const worker *w, char *buf, size_t len)
{
    int st = w->status;
    if (WIFSIGNALED(st))
        snprintf(buf, len, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(buf, len, "exited with code %d", WEXITSTATUS(st));
}

/* Runs one generation of workers to the end.  Returns 0 when all succeeded,
 * the failing worker's index + 1 when one failed, -1 on a launch error,
 * -2 when ddprun itself was interrupted. */
static int run_group(const options *o, worker *ws, int restart)
{
    int rc, failed, running = 0;
    if (start_workers(o, ws, restart) < 0) {
        for (int l = 0; l < o->nproc; l++)
            running += !ws[l].exited;
        stop_all(o, ws, &running, SIGTERM); /* those already started */
        rc = -1;
        goto out;
    }
    running = o->nproc;
    for (;;) {
        pump_all(o, ws, 50);
        failed = reap(o, ws, &running);
        if (got_signal) { /* passed on; SIGKILL only after the grace period */
            stop_all(o, ws, &running, got_signal);
            rc = -2;
            break;
        }
        if (failed >= 0) {
            stop_all(o, ws, &running, SIGTERM);
            rc = failed + 1;
            break;
        }
        if (running == 0) {
            rc = 0;
            break;
        }
    }
out:
    finish_group(o, ws);
    return rc;
}

int main(int argc, char **argv)
{
    options o;
    int rc = parse_options(argc, argv, &o);
    if (rc)
        return rc;
    worker *ws = calloc((size_t)o.nproc, sizeof *ws);
    if (!ws) {
        fprintf(stderr, "ddprun: out of memory\n");
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    for (int restart = 0;; restart++) {
        rc = run_group(&o, ws, restart);
        if (rc <= 0)
            break;
        worker *w = &ws[rc - 1];
        char what[128];
        describe(w, what, sizeof what);
        if (restart < o.max_restarts && !got_signal) {
            fprintf(stderr, "ddprun: rank %d (pid %d) %s; restarting the group (%d of %d)\n",
                    w->rank, (int)w->pid, what, restart + 1, o.max_restarts);
            continue;
        }
        fprintf(stderr, "ddprun: rank %d (local rank %d, pid %d) %s; last error: %s\n", w->rank,
                w->local_rank, (int)w->pid, what, w->last_err[0] ? w->last_err : "(none)");
        break;
    }
    free(ws);
    if (ddp__timeline_merge_env() < 0) /* DDP_TIMELINE_DIR: the ranks' timelines in one file */
        fprintf(stderr, "ddprun: %s\n", ddp_last_error());
    if (rc == -2) {
        fprintf(stderr, "ddprun: interrupted by signal %d; workers stopped\n", (int)got_signal);
        return 128 + got_signal;
    }
    return rc == 0 ? 0 : 1;
}
