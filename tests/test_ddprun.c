/* Tests of the ddprun launcher with real worker processes
 * (tests/helpers/ddprun_worker.c): environment, failure reporting, kill -9,
 * restarts, bad flags. */
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

#include "free_port.h"

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
 * /dev/null. */
static launch start(char *const argv[])
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(p[1], 2);
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        close(p[0]);
        execv(argv[0], argv);
        _exit(126);
    }
    close(p[1]);
    return (launch){pid, p[0]};
}

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

static int read_file(const char *dir, const char *what, int rank, char *buf, size_t len)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s.%d", dir, what, rank);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, len - 1, f);
    buf[n] = '\0';
    fclose(f);
    return 0;
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

/* Two jobs on one port: the second is refused at once, naming the first
 * job's id, and the first finishes with the right sums. */
static void test_two_jobs_one_port(void **state)
{
    (void)state;
    char dir[64], dir2[64], buf[64], port[16], err[8192], err2[8192];
    make_dir(dir);
    make_dir(dir2);
    snprintf(port, sizeof port, "%d", free_port());
    char *first[] = {ddprun, "--nproc-per-node", "2", "--master-port", port,
                     "--rdzv-id", "first-job", worker, "allreduce", dir, "2", NULL};
    char *second[] = {ddprun, "--nproc-per-node", "2", "--master-port", port, worker,
                      "allreduce", dir2, "0", NULL};
    launch a = start(first);
    double deadline = now() + 20;
    for (int r = 0; r < 2; r++)
        while (read_file(dir, "joined", r, buf, sizeof buf) != 0) {
            assert_true(now() < deadline);
            usleep(10000);
        }
    double t0 = now();
    int st2 = finish(start(second), err2, sizeof err2, 15);
    double took = now() - t0;
    int st = finish(a, err, sizeof err, 30);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("first job: status %d: %s", st, err);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(read_file(dir, "sum", r, buf, sizeof buf), 0);
        assert_string_equal(buf, "3\n");
    }
    assert_true(WIFEXITED(st2) && WEXITSTATUS(st2) == 1);
    if (!strstr(err2, "address in use by another job (id 'first-job'; this job's id is '"))
        fail_msg("second job's stderr: %s", err2);
    assert_true(took < 5.0); /* at once, not at a timeout */
    assert_int_equal(read_file(dir2, "joined", 0, buf, sizeof buf), -1);
    assert_int_equal(read_file(dir2, "joined", 1, buf, sizeof buf), -1);
    remove_dir(dir);
    remove_dir(dir2);
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
    char dir[64], buf[64], err[8192];
    make_dir(dir);
    char *argv[] = {ddprun, "--nproc-per-node", "3", worker, "sleep", dir, NULL};
    launch l = start(argv);
    pid_t pids[3];
    double deadline = now() + 10;
    for (int r = 0; r < 3; r++) {
        while (read_file(dir, "pid", r, buf, sizeof buf) != 0) {
            assert_true(now() < deadline);
            usleep(10000);
        }
        pids[r] = atoi(buf);
    }
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
    char dir[64], buf[64], err[8192];
    make_dir(dir);
    char *argv[] = {ddprun, "--nproc-per-node", "2", worker, "sleep", dir, NULL};
    launch l = start(argv);
    pid_t pids[2];
    double deadline = now() + 10;
    for (int r = 0; r < 2; r++) {
        while (read_file(dir, "pid", r, buf, sizeof buf) != 0) {
            assert_true(now() < deadline);
            usleep(10000);
        }
        pids[r] = atoi(buf);
    }
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
        cmocka_unit_test(test_failure_names_rank_and_stops_others),
        cmocka_unit_test(test_kill9_worker),
        cmocka_unit_test(test_max_restarts),
        cmocka_unit_test(test_all_output_and_exact_last_error),
        cmocka_unit_test(test_prefix),
        cmocka_unit_test(test_sigterm_stops_everything),
        cmocka_unit_test(test_no_grandchild_left_behind),
        cmocka_unit_test(test_bad_flags),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
