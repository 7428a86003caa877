/* The job's files: a private directory and the log directory.
 *
 * The private directory (mode 0700, under $XDG_RUNTIME_DIR, else $TMPDIR,
 * else /tmp; removed when ddprun exits) holds:
 *   - the job's secret, when the user gave none on a single node: 32 random
 *     bytes as 64 hex digits in a 0600 file that the workers find through
 *     DDP_SECRET_FILE.  Without a secret the rank-0 TCPStore serves anyone
 *     who reaches its port, and a stranger who pre-sets a rendezvous key
 *     breaks the job.  A file rather than DDP_SECRET: the environment is
 *     copied into every process a worker starts (shells, compilers, data
 *     loaders), into crash reports that dump it, and is readable by the
 *     user's other processes in /proc/PID/environ for the job's whole life,
 *     while the file's path reveals nothing, the file is readable by this
 *     user alone, and it is removed with the job.  (Other users cannot read
 *     /proc/PID/environ either; the difference is the copies.)  Several
 *     nodes must share one secret, which ddprun cannot hand out: there the
 *     user's DDP_SECRET/DDP_SECRET_FILE is passed on, or a warning says the
 *     job is open.
 *   - each worker's error file (DDP_ERROR_FILE) when there are no logs.
 *
 * The log directory (--log-dir DIR, or a fresh /tmp/ddprun-logs-XXXXXX
 * when only --redirects/--tee ask for files, as torchrun makes one):
 *   DIR/<run id>/attempt_<n>/<local rank>/{stdout.log,stderr.log,error.txt}
 * torchrun's layout; a second job of the same id gets DIR/<run id>.1, and so
 * on, instead of overwriting the first's logs. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/env.h"
#include "base/rng.h"
#include "ddprun.h"

/* Where temporary folders go: $XDG_RUNTIME_DIR (a per-user tmpfs), else
 * $TMPDIR, else /tmp. */
static const char *temp_base(void)
{
    const char *names[2] = {"XDG_RUNTIME_DIR", "TMPDIR"};
    for (int k = 0; k < 2; k++) {
        const char *v = getenv(names[k]);
        struct stat st;
        if (v && *v == '/' && strlen(v) < 3000 && stat(v, &st) == 0 && S_ISDIR(st.st_mode) &&
            access(v, W_OK | X_OK) == 0)
            return v;
    }
    return "/tmp";
}

static int make_temp_dir(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s/%s-XXXXXX", temp_base(), name);
    if (mkdtemp(out))
        return 0;
    fprintf(stderr, "ddprun: cannot make a folder %s: %s\n", out, strerror(errno));
    out[0] = '\0';
    return -1;
}

/* mkdir -p, mode 0755 for folders it makes. */
static int make_dirs(const char *path)
{
    char p[4096];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) {
        errno = ENAMETOOLONG;
        return -1;
    }
    for (char *c = p + 1;; c++) {
        if (*c != '/' && *c)
            continue;
        char was = *c;
        *c = '\0';
        if (mkdir(p, 0755) < 0 && errno != EEXIST)
            return -1;
        *c = was;
        if (!was)
            return 0;
    }
}

/* The user's DDP_SECRET or DDP_SECRET_FILE, when either is set. */
static int user_has_secret(void)
{
    const char *names[2] = {"DDP_SECRET", "DDP_SECRET_FILE"};
    for (int k = 0; k < 2; k++) {
        const char *v = NULL;
        if (ddp__env_string(names[k], &v) < 0 || (v && *v))
            return 1; /* a bad value is the workers' to report */
    }
    return 0;
}

/* A fresh secret in PRIVATE/secret (0600), for DDP_SECRET_FILE. */
static int make_secret(ddprun_job *job)
{
    unsigned char r[32];
    char hex[2 * sizeof r + 2];
    snprintf(job->secret_file, sizeof job->secret_file, "%s/secret", job->private_dir);
    int fd = -1, ok = ddp__random_bytes(r, sizeof r) == 0;
    for (size_t k = 0; ok && k < sizeof r; k++)
        snprintf(hex + 2 * k, 3, "%02x", r[k]);
    if (ok) {
        hex[2 * sizeof r] = '\n';
        fd = open(job->secret_file, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        ok = fd >= 0 && write(fd, hex, sizeof hex - 1) == (ssize_t)(sizeof hex - 1);
    }
    int err = errno;
    if (fd >= 0)
        close(fd);
    explicit_bzero(r, sizeof r);
    explicit_bzero(hex, sizeof hex);
    if (ok)
        return 0;
    fprintf(stderr, "ddprun: cannot write the job's secret to %s: %s\n", job->secret_file,
            strerror(err));
    unlink(job->secret_file);
    job->secret_file[0] = '\0';
    return -1;
}

/* The run id as one safe path component: [A-Za-z0-9._-], not starting with '.'. */
static void id_component(const char *id, char *out, size_t len)
{
    size_t n = 0;
    if (id[0] == '.' && n + 1 < len)
        out[n++] = '_';
    for (const char *c = id; *c && n + 1 < len; c++) {
        int ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                 (*c >= '0' && *c <= '9') || *c == '.' || *c == '_' || *c == '-';
        out[n++] = ok ? *c : '_';
    }
    out[n] = '\0';
}

/* DIR/<run id>, or DIR/<run id>.K for the first K free. */
static int make_log_dir(const ddprun_options *o, ddprun_job *job)
{
    char base[4096], id[160];
    if (o->log_dir) {
        snprintf(base, sizeof base, "%s", o->log_dir);
        if (make_dirs(base) < 0) {
            fprintf(stderr, "ddprun: --log-dir %s: %s\n", o->log_dir, strerror(errno));
            return -1;
        }
    } else if (make_temp_dir(base, sizeof base, "ddprun-logs") < 0) {
        return -1;
    }
    id_component(o->rdzv_id, id, sizeof id);
    for (int k = 0; k < 10000; k++) {
        int n = k ? snprintf(job->logs, sizeof job->logs, "%s/%s.%d", base, id, k)
                  : snprintf(job->logs, sizeof job->logs, "%s/%s", base, id);
        if (n >= (int)sizeof job->logs - 64) {
            fprintf(stderr, "ddprun: --log-dir %s: path too long\n", base);
            break;
        }
        if (mkdir(job->logs, 0755) == 0) {
            fprintf(stderr, "ddprun: logs of this job in %s\n", job->logs);
            return 0;
        }
        if (errno != EEXIST) {
            fprintf(stderr, "ddprun: cannot make %s: %s\n", job->logs, strerror(errno));
            break;
        }
    }
    job->logs[0] = '\0';
    return -1;
}

int ddprun_job_open(const ddprun_options *o, ddprun_job *job)
{
    memset(job, 0, sizeof *job);
    if (make_temp_dir(job->private_dir, sizeof job->private_dir, "ddprun") < 0)
        return -1;
    if (!user_has_secret()) {
        if (o->nnodes == 1) {
            if (make_secret(job) < 0)
                return -1;
        } else {
            fprintf(stderr,
                    "ddprun: warning: neither DDP_SECRET nor DDP_SECRET_FILE is set: this "
                    "job's store (%s:%d) and its workers' connections serve anyone who can "
                    "reach them; give every node the same DDP_SECRET_FILE\n",
                    o->master_addr, o->master_port);
        }
    }
    if (o->want_logs && make_log_dir(o, job) < 0)
        return -1;
    return 0;
}

static FILE *open_log(const char *dir, const char *name)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        fprintf(stderr, "ddprun: cannot write %s: %s\n", path, strerror(errno));
        if (fd >= 0)
            close(fd);
    }
    return f;
}

int ddprun_job_worker_files(const ddprun_options *o, const ddprun_job *job, ddprun_worker *w,
                            int restart)
{
    (void)o;
    size_t el = sizeof w->error_file, dl = sizeof w->log_dir;
    w->log_dir[0] = '\0';
    if (!job->logs[0]) {
        if (snprintf(w->error_file, el, "%s/error.%d", job->private_dir, w->local_rank) >=
            (int)el)
            return -1; /* cannot happen: the private folder's path is short */
        unlink(w->error_file); /* the last generation's */
        return 0;
    }
    if (snprintf(w->log_dir, dl, "%s/attempt_%d/%d", job->logs, restart, w->local_rank) >=
            (int)dl ||
        snprintf(w->error_file, el, "%s/error.txt", w->log_dir) >= (int)el) {
        fprintf(stderr, "ddprun: log folder %s: path too long\n", job->logs);
        return -1;
    }
    if (make_dirs(w->log_dir) < 0) {
        fprintf(stderr, "ddprun: cannot make %s: %s\n", w->log_dir, strerror(errno));
        return -1;
    }
    w->out.log = open_log(w->log_dir, "stdout.log");
    w->err.log = open_log(w->log_dir, "stderr.log");
    return w->out.log && w->err.log ? 0 : -1;
}

void ddprun_job_close(const ddprun_options *o, ddprun_job *job)
{
    if (!job->private_dir[0])
        return;
    if (job->secret_file[0])
        unlink(job->secret_file);
    char path[4200];
    for (int l = 0; l < o->nproc; l++) {
        snprintf(path, sizeof path, "%s/error.%d", job->private_dir, l);
        unlink(path);
    }
    rmdir(job->private_dir);
    job->private_dir[0] = '\0';
}
