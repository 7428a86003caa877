/* Tests of the ddprun launcher with real worker processes
 * (tests/helpers/ddprun_worker.c): environment, the job's secret (and a
 * stranger on the job's store), failure reporting, kill -9, restarts, bad
 * flags and numbers, log files, tee, filter, error files, signals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "ddp.h"
#include "free_port.h"
#include "store/tcp_proto.h"

static char ddprun[4096], worker[4096];

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct {
    pid_t pid;
    int err_fd;
} launch;

/* Starts ddprun with argv (NULL-terminated), stderr to a pipe, stdout to
 * out_path (NULL: /dev/null). */
static launch start_to(char *const argv[], const char *out_path)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(p[1], 2);
        int out = open(out_path ? out_path : "/dev/null", O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(out, 1);
        close(p[0]);
        execv(argv[0], argv);
        _exit(126);
    }
    close(p[1]);
    return (launch){pid, p[0]};
}

static launch start(char *const argv[]) { return start_to(argv, NULL); }

/* Waits for ddprun to exit (at most limit_s), collecting its stderr. */
static int finish(launch l, char *err, size_t len, double limit_s)
{
    size_t n = 0;
    double deadline = now() + limit_s;
    int status = -1;
    for (;;) {
        struct pollfd pfd = {.fd = l.err_fd, .events = POLLIN};
        if (poll(&pfd, 1, 50) > 0) {
            ssize_t r = read(l.err_fd, err + n, len - 1 - n);
            if (r > 0)
                n += (size_t)r;
        }
        if (waitpid(l.pid, &status, WNOHANG) == l.pid)
            break;
        if (now() > deadline) {
            kill(l.pid, SIGKILL);
            waitpid(l.pid, &status, 0);
            fail_msg("ddprun did not exit within %.1f s", limit_s);
        }
    }
    ssize_t r;
    while ((r = read(l.err_fd, err + n, len - 1 - n)) > 0)
        n += (size_t)r;
    err[n] = '\0';
    close(l.err_fd);
    return status;
}

static void make_dir(char *dir)
{
    strcpy(dir, "/tmp/ddprun-test-XXXXXX");
    assert_non_null(mkdtemp(dir));
}

static void remove_dir(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static int read_path(const char *path, char *buf, size_t len)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, len - 1, f);
    buf[n] = '\0';
    fclose(f);
    return 0;
}

/* DIR/WHAT.RANK, a worker's report. */
static int read_file(const char *dir, const char *what, int rank, char *buf, size_t len)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s.%d", dir, what, rank);
    return read_path(path, buf, len);
}

/* Waits (at most 20 s) for DIR/WHAT.RANK of ranks 0..n-1; pids, when
 * given, gets the number each file holds. */
static void wait_files(const char *dir, const char *what, int n, pid_t *pids)
{
    char buf[64];
    double deadline = now() + 20;
    for (int r = 0; r < n; r++) {
        while (read_file(dir, what, r, buf, sizeof buf) != 0) {
            if (now() > deadline)
                fail_msg("no %s/%s.%d after 20 s", dir, what, r);
            usleep(10000);
        }
        if (pids)
            pids[r] = atoi(buf);
    }
}

static void test_environment(void **state)
{
    (void)state;
    char dir[64], buf[2048], want[256], err[4096];
    make_dir(dir);
    char *argv[] = {ddprun, "--nproc-per-node", "3", "--nnodes=2", "--node_rank", "1",
                    "--rdzv-endpoint", "10.1.2.3:4567", worker, "env", dir, NULL};
    int st = finish(start(argv), err, sizeof err, 10);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    for (int local = 0; local < 3; local++) {
        int rank = 3 + local;
        assert_int_equal(read_file(dir, "env", rank, buf, sizeof buf), 0);
        snprintf(want, sizeof want,
                 "RANK=%d\nLOCAL_RANK=%d\nWORLD_SIZE=6\nLOCAL_WORLD_SIZE=3\nGROUP_RANK=1\n"
                 "MASTER_ADDR=10.1.2.3\nMASTER_PORT=4567\nTORCHELASTIC_RESTART_COUNT=0\n"
                 "OMP_NUM_THREADS=1\nDDP_LOG_LEVEL=warn\n",
                 rank, local);
        assert_string_equal(buf, want);
    }
    remove_dir(dir);
}

static void test_standalone_picks_port(void **state)
{
    (void)state;
    char dir[64], buf[2048], err[4096];
    make_dir(dir);
    char *argv[] = {ddprun, "--standalone", "--nproc-per-node", "1", worker, "env", dir, NULL};
    int st = finish(start(argv), err, sizeof err, 10);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(read_file(dir, "env", 0, buf, sizeof buf), 0);
    const char *p = strstr(buf, "MASTER_PORT=");
    assert_non_null(p);
    int port = atoi(p + strlen("MASTER_PORT="));
    assert_true(port > 0 && port < 65536 && port != 29500);
    assert_non_null(strstr(buf, "MASTER_ADDR=127.0.0.1\n"));
    remove_dir(dir);
}

/* Every job its own id (--rdzv-id, else a fresh one), the same on all its
 * workers, in TORCHELASTIC_RUN_ID. */
static void test_job_id(void **state)
{
    (void)state;
    char dir[64], a[2048], b[2048], err[4096], id[2][2048];
    make_dir(dir);
    for (int job = 0; job < 2; job++) {
        char *argv[] = {ddprun, "--nproc-per-node", "2", worker, "runid", dir, NULL};
        int st = finish(start(argv), err, sizeof err, 10);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        assert_int_equal(read_file(dir, "runid", 0, a, sizeof a), 0);
        assert_int_equal(read_file(dir, "runid", 1, b, sizeof b), 0);
        assert_string_equal(a, b);
        assert_true(strlen(a) > 8);
        snprintf(id[job], sizeof id[job], "%s", a);
    }
    assert_string_not_equal(id[0], id[1]);
    char *given[] = {ddprun, "--rdzv_id=train-7", worker, "runid", dir, NULL};
    int st = finish(start(given), err, sizeof err, 10);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(read_file(dir, "runid", 0, a, sizeof a), 0);
    assert_string_equal(a, "train-7");
    remove_dir(dir);
}

/* Waits for a job of 2 "allreduce" workers and checks both sums. */
static void expect_sums(launch l, const char *dir, const char *job)
{
    char err[8192], buf[64];
    int st = finish(l, err, sizeof err, 30);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("%s: status %d: %s", job, st, err);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(read_file(dir, "sum", r, buf, sizeof buf), 0);
        assert_string_equal(buf, "3\n");
    }
}

/* Two jobs on one port: the second is refused at once, naming the first
 * job's id, and the first finishes with the right sums. */
static void test_two_jobs_one_port(void **state)
{
    (void)state;
    char dir[64], dir2[64], buf[64], port[16], err2[8192];
    make_dir(dir);
    make_dir(dir2);
    snprintf(port, sizeof port, "%d", free_port());
    char *first[] = {ddprun, "--nproc-per-node", "2", "--master-port", port,
                     "--rdzv-id", "first-job", worker, "allreduce", dir, "2", NULL};
    char *second[] = {ddprun, "--nproc-per-node", "2", "--master-port", port, worker,
                      "allreduce", dir2, "0", NULL};
    launch a = start(first);
    wait_files(dir, "joined", 2, NULL);
    double t0 = now();
    int st2 = finish(start(second), err2, sizeof err2, 15);
    double took = now() - t0;
    expect_sums(a, dir, "first job");
    assert_true(WIFEXITED(st2) && WEXITSTATUS(st2) == 1);
    if (!strstr(err2, "address in use by another job (id 'first-job'; this job's id is '"))
        fail_msg("second job's stderr: %s", err2);
    assert_true(took < 5.0); /* at once, not at a timeout */
    assert_int_equal(read_file(dir2, "joined", 0, buf, sizeof buf), -1);
    assert_int_equal(read_file(dir2, "joined", 1, buf, sizeof buf), -1);
    remove_dir(dir);
    remove_dir(dir2);
}

/* ---- the job's secret ---------------------------------------------------- */

/* The value of "name=" in a worker's report. */
static void field(const char *report, const char *name, char *out, size_t len)
{
    char key[64];
    snprintf(key, sizeof key, "%s=", name);
    const char *p = strstr(report, key);
    assert_non_null(p);
    p += strlen(key);
    size_t n = strcspn(p, "\n");
    assert_true(n < len);
    memcpy(out, p, n);
    out[n] = '\0';
}

/* Without DDP_SECRET/DDP_SECRET_FILE, a single-node job's workers share a
 * fresh secret: 64 hex digits in a 0600 file, another per job, removed
 * when the job ends; the user's own secret is passed on untouched. */
static void test_secret_per_job(void **state)
{
    (void)state;
    char dir[64], rep[2][2048], err[4096], file[2][1024], secret[2][256], v[256];
    unsetenv("DDP_SECRET");
    unsetenv("DDP_SECRET_FILE");
    make_dir(dir);
    for (int job = 0; job < 2; job++) {
        char *argv[] = {ddprun, "--nproc-per-node", "2", worker, "secret", dir, NULL};
        int st = finish(start(argv), err, sizeof err, 10);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        assert_int_equal(read_file(dir, "secret", 0, rep[0], sizeof rep[0]), 0);
        assert_int_equal(read_file(dir, "secret", 1, rep[1], sizeof rep[1]), 0);
        assert_string_equal(rep[0], rep[1]);
        field(rep[0], "file", file[job], sizeof file[job]);
        field(rep[0], "secret", secret[job], sizeof secret[job]);
        field(rep[0], "mode", v, sizeof v);
        assert_string_equal(v, "600");
        field(rep[0], "env", v, sizeof v);
        assert_string_equal(v, "unset");
        assert_int_equal(strlen(secret[job]), 64);
        assert_int_equal(strspn(secret[job], "0123456789abcdef"), 64);
        struct stat st_file;
        assert_int_equal(stat(file[job], &st_file), -1); /* gone with the job */
        assert_null(strstr(err, "warning"));
    }
    assert_string_not_equal(secret[0], secret[1]);
    assert_string_not_equal(file[0], file[1]);

    setenv("DDP_SECRET", "users-own", 1);
    char *argv[] = {ddprun, worker, "secret", dir, NULL};
    int st = finish(start(argv), err, sizeof err, 10);
    unsetenv("DDP_SECRET");
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(read_file(dir, "secret", 0, rep[0], sizeof rep[0]), 0);
    assert_string_equal(rep[0], "file=\nmode=0\nsecret=\nenv=set\n");
    remove_dir(dir);
}

/* Several nodes cannot get a secret from ddprun: one clear warning, once
 * (not once per restart), and the job runs open. */
static void test_secret_multi_node_warns(void **state)
{
    (void)state;
    char dir[64], rep[2048], err[8192];
    unsetenv("DDP_SECRET");
    unsetenv("DDP_SECRET_FILE");
    make_dir(dir);
    char *argv[] = {ddprun, "--nnodes", "2", "--nproc-per-node", "2", "--master-port", "29999",
                    "--max-restarts", "1", worker, "flaky", dir, NULL};
    int st = finish(start(argv), err, sizeof err, 10);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_non_null(strstr(err, "restarting the group (1 of 1)"));
    const char *want = "ddprun: warning: neither DDP_SECRET nor DDP_SECRET_FILE is set: this "
                       "job's store (127.0.0.1:29999) and its workers' connections serve anyone "
                       "who can reach them; give every node the same DDP_SECRET_FILE\n";
    const char *at = strstr(err, want);
    if (!at)
        fail_msg("stderr: %s", err);
    assert_null(strstr(at + strlen(want), "warning"));
    char *report[] = {ddprun, "--nnodes", "2", worker, "secret", dir, NULL};
    st = finish(start(report), err, sizeof err, 10);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(read_file(dir, "secret", 0, rep, sizeof rep), 0);
    assert_string_equal(rep, "file=\nmode=0\nsecret=\nenv=unset\n");
    remove_dir(dir);
}

/* Reads exactly n bytes (at most 5 s); the count read, short at EOF or an error. */
static size_t read_n(int fd, uint8_t *buf, size_t n)
{
    size_t got = 0;
    double deadline = now() + 5;
    while (got < n && now() < deadline) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, 100) <= 0)
            continue;
        ssize_t r = read(fd, buf + got, n - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    return got;
}

/* On a raw connection to the store: takes its HELLO, then sends opcode
 * (SET or GET of a rendezvous key) without authenticating; the server must
 * close the connection without an answer. */
static void raw_request_refused(int port, int opcode)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    uint8_t head[DDP__TS_HEADER], payload[512];
    ddp__ts_header h;
    const char *why = NULL;
    assert_int_equal(read_n(fd, head, sizeof head), sizeof head);
    assert_int_equal(ddp__ts_header_decode(head, sizeof payload, &h, &why), 0);
    assert_int_equal(h.opcode, DDP__TS_HELLO);
    assert_int_equal(read_n(fd, payload, h.length), h.length);
    assert_int_equal(payload[0], 1); /* auth_required */
    ddp__ts_writer w = {0};
    ddp__ts_begin(&w);
    if (opcode == DDP__TS_GET)
        ddp__ts_u64(&w, 1000);
    ddp__ts_bytes(&w, "rdzv/rank/1", 11);
    if (opcode == DDP__TS_SET)
        ddp__ts_bytes(&w, "stranger", 8);
    int n = ddp__ts_finish(&w, opcode, 0);
    assert_true(n > 0);
    assert_int_equal(write(fd, w.buf, (size_t)n), n);
    free(w.buf);
    assert_int_equal(read_n(fd, head, sizeof head), 0); /* closed, nothing answered */
    close(fd);
}

/* A stranger (no secret, or a guessed one) connecting to the port of a
 * running job's store is refused: the library's client at the handshake,
 * a raw SET or GET of a rendezvous key by the server, which drops the
 * connection; the job is not disturbed. */
static void test_stranger_cannot_use_store(void **state)
{
    (void)state;
    char dir[64], port[16];
    unsetenv("DDP_SECRET");
    unsetenv("DDP_SECRET_FILE");
    make_dir(dir);
    int p = free_port();
    snprintf(port, sizeof port, "%d", p);
    char *argv[] = {ddprun, "--nproc-per-node", "2", "--master-port", port, worker,
                    "allreduce", dir, "1.5", NULL};
    launch l = start(argv);
    wait_files(dir, "joined", 2, NULL);
    ddp_store_t *store = NULL;
    int rc = ddp_store_tcp_create("127.0.0.1", p, 0, 0, 5.0, &store);
    assert_int_equal(rc, DDP_ERR_AUTH);
    assert_null(store);
    if (!strstr(ddp_last_error(), "the server requires a shared secret"))
        fail_msg("no secret: %s", ddp_last_error());
    setenv("DDP_SECRET", "a-guess", 1);
    rc = ddp_store_tcp_create("127.0.0.1", p, 0, 0, 5.0, &store);
    unsetenv("DDP_SECRET");
    assert_int_equal(rc, DDP_ERR_AUTH);
    assert_null(store);
    if (!strstr(ddp_last_error(), "the server rejected our shared secret"))
        fail_msg("a guessed secret: %s", ddp_last_error());
    raw_request_refused(p, DDP__TS_SET);
    raw_request_refused(p, DDP__TS_GET);
    expect_sums(l, dir, "the job");
    remove_dir(dir);
}

static void test_failure_names_rank_and_stops_others(void **state)
{
    (void)state;
    char err[8192];
    char *argv[] = {ddprun, "--nproc-per-node", "3", worker, "fail", "2", "7", NULL};
    double t0 = now();
    int st = finish(start(argv), err, sizeof err, 10);
    /* The sleeping ranks would take 30 s: they must have been stopped. */
    assert_true(now() - t0 < 3.0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    assert_non_null(strstr(err, "ddprun: rank 2 (local rank 2, pid "));
    assert_non_null(strstr(err, "exited with code 7; last error: worker 2 failing on purpose\n"));
}

static void test_kill9_worker(void **state)
{
    (void)state;
    char dir[64], err[8192];
    make_dir(dir);
    char *argv[] = {ddprun, "--nproc-per-node", "3", worker, "sleep", dir, NULL};
    launch l = start(argv);
    pid_t pids[3];
    wait_files(dir, "pid", 3, pids);
    double t0 = now();
    assert_int_equal(kill(pids[1], SIGKILL), 0);
    int st = finish(l, err, sizeof err, 5);
    assert_true(now() - t0 < 2.0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    assert_non_null(strstr(err, "ddprun: rank 1 (local rank 1, pid "));
    assert_non_null(strstr(err, "was killed by signal 9"));
    /* No worker left behind. */
    for (int r = 0; r < 3; r++)
        assert_true(kill(pids[r], 0) == -1 && errno == ESRCH);
    remove_dir(dir);
}

static void test_max_restarts(void **state)
{
    (void)state;
    char dir[64], buf[64], err[8192];
    make_dir(dir);
    char *once[] = {ddprun, "--nproc-per-node", "2", "--max-restarts", "1", worker,
                    "flaky", dir, NULL};
    int st = finish(start(once), err, sizeof err, 10);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_non_null(strstr(err, "restarting the group (1 of 1)"));
    for (int r = 0; r < 2; r++)
        assert_int_equal(read_file(dir, "done", r, buf, sizeof buf), 0);
    /* Without a restart the same job fails. */
    char *never[] = {ddprun, "--nproc-per-node", "2", worker, "flaky", dir, NULL};
    st = finish(start(never), err, sizeof err, 10);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    assert_non_null(strstr(err, "rank 1"));
    remove_dir(dir);
}

static int count_lines_with(const char *s, const char *prefix)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, prefix)); p++)
        n += p == s || p[-1] == '\n';
    return n;
}

static void test_all_output_and_exact_last_error(void **state)
{
    (void)state;
    static char err[1 << 20];
    char *argv[] = {ddprun, "--nproc-per-node", "1", worker, "spam", "20000", "3", NULL};
    int st = finish(start(argv), err, sizeof err, 20);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    /* Every line arrives whole, none split, and the last one is reported. */
    assert_int_equal(count_lines_with(err, "line "), 20000);
    assert_non_null(strstr(err, "line 19999\nFATAL-LAST\n"));
    assert_non_null(strstr(err, "exited with code 3; last error: FATAL-LAST\n"));
}

static void test_prefix(void **state)
{
    (void)state;
    char err[8192];
    char *argv[] = {ddprun, "--prefix", "--nproc-per-node", "2", worker, "spam", "1", "0", NULL};
    int st = finish(start(argv), err, sizeof err, 10);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_non_null(strstr(err, "[rank 0]: line 0\n"));
    assert_non_null(strstr(err, "[rank 1]: FATAL-LAST\n"));
}

static void test_sigterm_stops_everything(void **state)
{
    (void)state;
    char dir[64], err[8192];
    make_dir(dir);
    char *argv[] = {ddprun, "--nproc-per-node", "2", worker, "sleep", dir, NULL};
    launch l = start(argv);
    pid_t pids[2];
    wait_files(dir, "pid", 2, pids);
    double t0 = now();
    assert_int_equal(kill(l.pid, SIGTERM), 0);
    int st = finish(l, err, sizeof err, 5);
    assert_true(now() - t0 < 2.0);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGTERM);
    assert_non_null(strstr(err, "interrupted by signal 15"));
    for (int r = 0; r < 2; r++)
        assert_true(kill(pids[r], 0) == -1 && errno == ESRCH);
    remove_dir(dir);
}

static void test_no_grandchild_left_behind(void **state)
{
    (void)state;
    char dir[64], buf[64], err[4096];
    make_dir(dir);
    char *argv[] = {ddprun, "--nproc-per-node", "1", worker, "grandchild", dir, NULL};
    double t0 = now();
    int st = finish(start(argv), err, sizeof err, 10);
    assert_true(now() - t0 < 3.0); /* not the grandchild's 30 s */
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(read_file(dir, "child", 0, buf, sizeof buf), 0);
    pid_t child = atoi(buf);
    /* Killed by ddprun; reaped by init once it is gone. */
    double deadline = now() + 2;
    while (kill(child, 0) == 0 && now() < deadline)
        usleep(10000);
    assert_true(kill(child, 0) == -1 && errno == ESRCH);
    remove_dir(dir);
}

static void test_bad_flags(void **state)
{
    (void)state;
    char err[4096];
    struct {
        char *args[4];
        const char *msg;
    } cases[] = {
        {{"--bogus", worker, NULL}, "unknown option '--bogus'"},
        {{"--nproc-per-node", "0", worker, NULL}, "bad --nproc-per-node '0'"},
        {{"--master-port", "70000", worker, NULL}, "bad --master-port '70000'"},
        {{"--rdzv-endpoint", "nohost", worker, NULL}, "bad --rdzv-endpoint 'nohost'"},
        {{"--rdzv-id", "two words", worker, NULL},
         "bad --rdzv-id 'two words': want 1..128 characters, no spaces or quotes"},
        {{"--nproc-per-node", "2", NULL}, "no program to run"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *argv[6] = {ddprun};
        for (int k = 0; k < 4 && cases[i].args[k]; k++)
            argv[k + 1] = cases[i].args[k];
        int st = finish(start(argv), err, sizeof err, 5);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 2);
        if (!strstr(err, cases[i].msg))
            fail_msg("case %zu: '%s' lacks '%s'", i, err, cases[i].msg);
    }
}

/* Every numeric flag refuses nan, inf, negatives, trailing text, blanks,
 * overflow and emptiness, naming the flag and the value. */
static void test_bad_numbers(void **state)
{
    (void)state;
    char err[4096], want[256];
    static const struct {
        const char *flag, *want;
    } flags[] = {
        {"--nproc-per-node", "want 1..1024"}, {"--nnodes", "want 1..1048576"},
        {"--node-rank", "want 0..1048576"},   {"--master-port", "want 1..65535"},
        {"--max-restarts", "want 0..1000000"}, {"--stop-timeout", "want seconds, 0..3600"},
    };
    static const char *const values[] = {"nan", "inf", "-1", "3x", " 3", "+3", "",
                                         "99999999999999999999", "1e999", "0x"};
    enum { NF = sizeof flags / sizeof *flags, NV = sizeof values / sizeof *values };
    /* All at once, then collected: a sanitizer build starts slowly. */
    launch runs[NF][NV];
    for (size_t f = 0; f < NF; f++)
        for (size_t v = 0; v < NV; v++) {
            char arg[128];
            snprintf(arg, sizeof arg, "%s=%s", flags[f].flag, values[v]);
            char *argv[] = {ddprun, arg, worker, NULL};
            runs[f][v] = start(argv);
        }
    for (size_t f = 0; f < NF; f++)
        for (size_t v = 0; v < NV; v++) {
            int st = finish(runs[f][v], err, sizeof err, 30);
            snprintf(want, sizeof want, "ddprun: bad %s '%s': %s (see ddprun --help)\n",
                     flags[f].flag, values[v], flags[f].want);
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 2 || strcmp(err, want) != 0)
                fail_msg("%s='%s': status %d, stderr '%s', want '%s'", flags[f].flag, values[v],
                         st, err, want);
        }
    /* The port of --rdzv-endpoint, and the stream specs, the same way. */
    static const struct {
        const char *flag, *value, *msg;
    } more[] = {
        {"--rdzv-endpoint", "h:nan", "bad --rdzv-endpoint 'h:nan': want HOST:PORT, PORT 1..65535"},
        {"--rdzv-endpoint", "h:99999999999999999999", "bad --rdzv-endpoint 'h:9999"},
        {"--rdzv-endpoint", "h:12 ", "bad --rdzv-endpoint 'h:12 '"},
        {"--redirects", "4", "bad --redirects '4': want 0..3, or LOCAL_RANK:0..3,..."},
        {"--redirects", "0:1,", "bad --redirects '0:1,'"},
        {"-r", "0:-1", "bad --redirects '0:-1'"},
        {"--tee", "1:x", "bad --tee '1:x'"},
        {"-t", "99999999999999999999:1", "bad --tee '9999"},
        {"--local-ranks-filter", "0,nan", "bad --local-ranks-filter '0,nan': want local ranks"},
        {"--local-ranks-filter", "", "bad --local-ranks-filter ''"},
        {"--redirects", "3:1", "--redirects names local rank 3, but --nproc-per-node is 1"},
        {"--local-ranks-filter", "0,1", "--local-ranks-filter names local rank 1, but"},
    };
    for (size_t i = 0; i < sizeof more / sizeof *more; i++) {
        char *argv[] = {ddprun, (char *)more[i].flag, (char *)more[i].value, worker, NULL};
        int st = finish(start(argv), err, sizeof err, 5);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 2 || !strstr(err, more[i].msg))
            fail_msg("%s %s: status %d, stderr '%s'", more[i].flag, more[i].value, st, err);
    }
}

/* ---- output: log files, redirects, tee, filter, the failure report ------ */

/* DIR/<run id>/attempt_0/<local rank>/NAME's text. */
static void read_log(const char *logs, int attempt, int local, const char *name, char *buf,
                     size_t len)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/attempt_%d/%d/%s", logs, attempt, local, name);
    if (read_path(path, buf, len) != 0)
        fail_msg("no %s", path);
}

/* --log-dir: every rank's streams, whole, in torchrun's layout, the console
 * as without it; a second job of the same id does not overwrite the
 * first's logs. */
static void test_log_dir(void **state)
{
    (void)state;
    char dir[64], logs[256], out[256], buf[4096], err[8192], want[64];
    make_dir(dir);
    snprintf(logs, sizeof logs, "%s/logs", dir); /* made by ddprun */
    snprintf(out, sizeof out, "%s/console", dir);
    for (int job = 0; job < 2; job++) {
        char *argv[] = {ddprun, "--nproc-per-node", "2", "--log-dir", logs, "--rdzv-id",
                        "logjob", worker, "out", NULL};
        int st = finish(start_to(argv, out), err, sizeof err, 10);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        char job_dir[300];
        snprintf(job_dir, sizeof job_dir, job ? "%s/logjob.1" : "%s/logjob", logs);
        snprintf(want, sizeof want, "ddprun: logs of this job in ");
        assert_non_null(strstr(err, want));
        assert_non_null(strstr(err, job_dir));
        for (int r = 0; r < 2; r++) {
            read_log(job_dir, 0, r, "stdout.log", buf, sizeof buf);
            snprintf(want, sizeof want, "out %d\n", r);
            assert_string_equal(buf, want);
            read_log(job_dir, 0, r, "stderr.log", buf, sizeof buf);
            snprintf(want, sizeof want, "err %d\n", r);
            assert_string_equal(buf, want);
            assert_non_null(strstr(err, want)); /* and on the console */
        }
        assert_int_equal(read_path(out, buf, sizeof buf), 0);
        assert_non_null(strstr(buf, "out 0\n"));
        assert_non_null(strstr(buf, "out 1\n"));
    }
    remove_dir(dir);
}

/* --redirects takes streams off the console, --tee marks them "[rank]:",
 * --local-ranks-filter hides ranks from the console but not from the files. */
static void test_redirects_tee_filter(void **state)
{
    (void)state;
    char dir[64], logs[256], out[256], buf[4096], err[8192];
    make_dir(dir);
    snprintf(logs, sizeof logs, "%s/logs", dir);
    snprintf(out, sizeof out, "%s/console", dir);
    char *argv[] = {ddprun, "--nproc-per-node", "3", "--log-dir", logs, "--rdzv-id", "rt",
                    "-r", "1", "--tee", "0:2", "--local-ranks-filter", "0,1", worker, "out", NULL};
    int st = finish(start_to(argv, out), err, sizeof err, 10);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(read_path(out, buf, sizeof buf), 0);
    assert_string_equal(buf, ""); /* every stdout redirected */
    assert_non_null(strstr(err, "\n[0]:err 0\n"));
    assert_non_null(strstr(err, "\nerr 1\n"));
    assert_null(strstr(err, "err 2")); /* filtered out */
    assert_null(strstr(err, "\nerr 0\n"));
    char job_dir[300];
    snprintf(job_dir, sizeof job_dir, "%s/rt", logs);
    for (int r = 0; r < 3; r++) {
        char want[64];
        read_log(job_dir, 0, r, "stdout.log", buf, sizeof buf);
        snprintf(want, sizeof want, "out %d\n", r);
        assert_string_equal(buf, want);
        read_log(job_dir, 0, r, "stderr.log", buf, sizeof buf);
        snprintf(want, sizeof want, "err %d\n", r);
        assert_string_equal(buf, want); /* unprefixed, filter or not */
    }
    /* Without --log-dir, --redirects writes to a fresh folder it names. */
    char *tmp[] = {ddprun, "--redirects", "3", worker, "out", NULL};
    st = finish(start_to(tmp, out), err, sizeof err, 10);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    const char *at = strstr(err, "ddprun: logs of this job in ");
    assert_non_null(at);
    char made[512];
    snprintf(made, sizeof made, "%s", at + strlen("ddprun: logs of this job in "));
    made[strcspn(made, "\n")] = '\0';
    assert_null(strstr(err, "err 0"));
    read_log(made, 0, 0, "stderr.log", buf, sizeof buf);
    assert_string_equal(buf, "err 0\n");
    *strrchr(made, '/') = '\0';
    assert_non_null(strstr(made, "ddprun-logs-"));
    remove_dir(made);
    remove_dir(dir);
}

/* The report names the last line that looks like an error, not the
 * cleanup after it, then the rank's last lines and where its logs are;
 * a DDP_ERROR_FILE written by the program wins. */
static void test_failure_report(void **state)
{
    (void)state;
    char dir[64], logs[256], err[8192], buf[1024];
    make_dir(dir);
    snprintf(logs, sizeof logs, "%s/logs", dir);
    char *lines[] = {ddprun, "--log-dir", logs, "--rdzv-id", "rep", worker, "errlines", NULL};
    int st = finish(start(lines), err, sizeof err, 10);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    char want[1024];
    snprintf(want, sizeof want,
             "exited with code 4; last error: error: the real cause\n"
             "ddprun: rank 0's last 3 lines of output:\n"
             "ddprun:   | step 1 done\n"
             "ddprun:   | error: the real cause\n"
             "ddprun:   | shutting down\n"
             "ddprun: rank 0's whole output: %s/rep/attempt_0/0/{stdout,stderr}.log\n",
             logs);
    if (!strstr(err, want))
        fail_msg("stderr '%s' lacks '%s'", err, want);

    char *file[] = {ddprun, "--nproc-per-node", "2", worker, "errfile", "cuda out of paper",
                    NULL};
    st = finish(start(file), err, sizeof err, 10);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    if (!strstr(err, "exited with code 3; last error: cuda out of paper\n"))
        fail_msg("stderr: %s", err);
    /* With logs, the error file lies beside them. */
    char *both[] = {ddprun, "--log-dir", logs, "--rdzv-id", "ef", worker, "errfile", "oops",
                    NULL};
    st = finish(start(both), err, sizeof err, 10);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    assert_non_null(strstr(err, "last error: oops\n"));
    char path[512];
    snprintf(path, sizeof path, "%s/ef/attempt_0/0/error.txt", logs);
    assert_int_equal(read_path(path, buf, sizeof buf), 0);
    assert_string_equal(buf, "oops\n");
    remove_dir(dir);
}

/* ---- signals ------------------------------------------------------------- */

/* Waits until DIR/signals.RANK holds want for every rank. */
static void wait_signals(const char *dir, int n, const char *want)
{
    char buf[256];
    double deadline = now() + 10;
    for (int r = 0; r < n; r++)
        for (;;) {
            if (read_file(dir, "signals", r, buf, sizeof buf) == 0 && !strcmp(buf, want))
                break;
            if (now() > deadline)
                fail_msg("rank %d recorded '%s', not '%s'", r, buf, want);
            usleep(10000);
        }
}

/* SIGUSR1 reaches every worker, which go on; SIGTERM and SIGINT then stop
 * them as before. */
static void test_signals_forwarded(void **state)
{
    (void)state;
    static const int stops[2] = {SIGTERM, SIGINT};
    static const char *const recorded[2] = {"USR1\nUSR1\nTERM\n", "USR1\nUSR1\nINT\n"};
    for (int k = 0; k < 2; k++) {
        char dir[64], err[8192];
        pid_t pids[2];
        make_dir(dir);
        char *argv[] = {ddprun, "--nproc-per-node", "2", worker, "signals", dir, NULL};
        launch l = start(argv);
        wait_files(dir, "ready", 2, pids);
        assert_int_equal(kill(l.pid, SIGUSR1), 0);
        wait_signals(dir, 2, "USR1\n");
        assert_int_equal(kill(l.pid, SIGUSR1), 0);
        wait_signals(dir, 2, "USR1\nUSR1\n");
        for (int r = 0; r < 2; r++)
            assert_int_equal(kill(pids[r], 0), 0); /* still running */
        assert_int_equal(kill(l.pid, stops[k]), 0);
        int st = finish(l, err, sizeof err, 10);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 128 + stops[k]);
        wait_signals(dir, 2, recorded[k]);
        remove_dir(dir);
    }
}

int main(void)
{
    const char *build = getenv("DDP_TEST_BUILD");
    if (!build)
        build = "build";
    snprintf(ddprun, sizeof ddprun, "%s/bin/ddprun", build);
    snprintf(worker, sizeof worker, "%s/tests/helpers/ddprun_worker", build);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_environment),
        cmocka_unit_test(test_standalone_picks_port),
        cmocka_unit_test(test_job_id),
        cmocka_unit_test(test_two_jobs_one_port),
        cmocka_unit_test(test_secret_per_job),
        cmocka_unit_test(test_secret_multi_node_warns),
        cmocka_unit_test(test_stranger_cannot_use_store),
        cmocka_unit_test(test_failure_names_rank_and_stops_others),
        cmocka_unit_test(test_kill9_worker),
        cmocka_unit_test(test_max_restarts),
        cmocka_unit_test(test_all_output_and_exact_last_error),
        cmocka_unit_test(test_prefix),
        cmocka_unit_test(test_sigterm_stops_everything),
        cmocka_unit_test(test_no_grandchild_left_behind),
        cmocka_unit_test(test_bad_flags),
        cmocka_unit_test(test_bad_numbers),
        cmocka_unit_test(test_log_dir),
        cmocka_unit_test(test_redirects_tee_filter),
        cmocka_unit_test(test_failure_report),
        cmocka_unit_test(test_signals_forwarded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
