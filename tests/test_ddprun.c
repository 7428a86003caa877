/* Tests of the ddprun launcher with real worker processes
 * (tests/helpers/ddprun_worker.c): environment, job ids, failure
 * reporting, kill -9, restarts, bad flags and numbers, signals.  The job's
 * secret: test_ddprun_secret.c; log files, tee, filter, the failure report:
 * test_ddprun_output.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cblas.h>

#include "base/cpu.h"
#include "ddprun_util.h"
#include "free_port.h"
static void test_environment(void **state)
{
    (void)state;
    char dir[64], buf[2048], want[512], err[4096];
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
                 "OMP_NUM_THREADS=1\nDDP_LOG_LEVEL=warn\n"
                 "entries named RANK 1, OMP_NUM_THREADS 1\n",
                 rank, local);
        assert_string_equal(buf, want);
    }
    /* a user's RANK is replaced (one RANK in the worker's environment, not
     * two), a user's OMP_NUM_THREADS kept */
    setenv("RANK", "99", 1);
    setenv("OMP_NUM_THREADS", "7", 1);
    char *one[] = {ddprun, "--standalone", "--nproc-per-node", "1", worker, "env", dir, NULL};
    st = finish(start(one), err, sizeof err, 10);
    unsetenv("RANK");
    unsetenv("OMP_NUM_THREADS");
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(read_file(dir, "env", 0, buf, sizeof buf), 0);
    if (!strstr(buf, "RANK=0\n") || !strstr(buf, "OMP_NUM_THREADS=7\n") ||
        !strstr(buf, "entries named RANK 1, OMP_NUM_THREADS 1\n"))
        fail_msg("a user's RANK and OMP_NUM_THREADS under ddprun: %s", buf);
    remove_dir(dir);
}

/* Whether this OpenBLAS is an x86-64 one with every kernel set
 * (DYNAMIC_ARCH), which OPENBLAS_CORETYPE chooses among. */
static int dynamic_x86_openblas(void)
{
#if defined(__x86_64__)
    return strstr(openblas_get_config(), "DYNAMIC_ARCH") != NULL;
#else
    return 0;
#endif
}

/* OPENBLAS_CORETYPE as ddprun leaves it: where the workers' OpenBLAS would
 * fall back to kernels older than the CPU runs (Debian 12's OpenBLAS on an
 * Intel model it does not know), ddprun sets it, says so, and the worker's
 * OpenBLAS runs the kernels named; elsewhere it is left unset; a user's
 * own value stays, whatever it is, with no note. */
static void test_blas_kernels(void **state)
{
    (void)state;
    char dir[64], buf[2048], err[4096], core[64] = "", want[128] = "";
    make_dir(dir);
    char *argv[] = {ddprun, "--standalone", "--nproc-per-node", "1", worker, "blas", dir, NULL};
    const char *user = getenv("OPENBLAS_CORETYPE");
    char saved[64] = "";
    if (user)
        snprintf(saved, sizeof saved, "%s", user);
    unsetenv("OPENBLAS_CORETYPE");
    int st = finish(start(argv), err, sizeof err, 10);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(read_file(dir, "blas", 0, buf, sizeof buf), 0);
    if (!strncmp(buf, "OPENBLAS_CORETYPE=\n", 19)) { /* left alone: OpenBLAS's own choice is fine */
        assert_int_equal(sscanf(buf, "OPENBLAS_CORETYPE=\ncore=%63s", core), 1);
        assert_null(ddp__cpu_blas_core(core));
        assert_null(strstr(err, "OpenBLAS"));
    } else { /* set: the worker runs those kernels, and the user is told */
        assert_int_equal(sscanf(buf, "OPENBLAS_CORETYPE=%127s\ncore=%63s", want, core), 2);
        assert_true(strcasecmp(want, core) == 0 || !dynamic_x86_openblas());
        assert_null(ddp__cpu_blas_core(core));
        char note[200];
        snprintf(note, sizeof note, "workers get OPENBLAS_CORETYPE=%s\n", want);
        assert_non_null(strstr(err, note));
    }
    setenv("OPENBLAS_CORETYPE", "Prescott", 1);
    st = finish(start(argv), err, sizeof err, 10);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(read_file(dir, "blas", 0, buf, sizeof buf), 0);
    const char *given = "OPENBLAS_CORETYPE=Prescott\ncore=";
    assert_int_equal(strncmp(buf, given, strlen(given)), 0);
    /* an x86 OpenBLAS built for every kernel set runs the one named */
    if (dynamic_x86_openblas())
        assert_string_equal(buf, "OPENBLAS_CORETYPE=Prescott\ncore=Prescott\n");
    assert_null(strstr(err, "OpenBLAS"));
    if (saved[0])
        setenv("OPENBLAS_CORETYPE", saved, 1);
    else
        unsetenv("OPENBLAS_CORETYPE");
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

/* PATH as it was before set_path (unset when it was). */
static char saved_path[4096];
static int had_path;

static void set_path(const char *path)
{
    const char *old = getenv("PATH");
    had_path = old != NULL;
    snprintf(saved_path, sizeof saved_path, "%s", old ? old : "");
    setenv("PATH", path, 1);
}

static void restore_path(void)
{
    if (had_path)
        setenv("PATH", saved_path, 1);
    else
        unsetenv("PATH");
}

/* An executable (mode) file named name in folder dir holding text. */
static void write_program(const char *dir, const char *name, const char *text, mode_t mode)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(chmod(path, mode), 0);
}

/* The program as execvp finds it (tools/ddprun/exec.c, which makes it in
 * ddprun before the fork): a name searched along PATH past a folder that
 * does not exist and past a copy without the execute bit, a file without
 * "#!" read by /bin/sh with its arguments and the worker's variables; a
 * name whose only file cannot be run (Permission denied), one that is
 * nowhere and a path that does not exist (No such file or directory): the
 * worker says why and fails, and so does the job.  The programs live under
 * the build folder: /tmp may be mounted noexec. */
static void test_program_lookup(void **state)
{
    (void)state;
    char bin[256], noexec[300], err[8192], buf[256], want[64], path[8192], dir[64];
    const char *build = getenv("DDP_TEST_BUILD");
    snprintf(bin, sizeof bin, "%s/tests/ddprun-lookup-XXXXXX", build && *build ? build : "build");
    assert_non_null(mkdtemp(bin));
    snprintf(noexec, sizeof noexec, "%s/noexec", bin);
    assert_int_equal(mkdir(noexec, 0755), 0);
    const char *script = "printf '%s %s\\n' \"$RANK\" \"$1\" >\"$2/script.$RANK\"\n";
    write_program(noexec, "ddprun-test-script", "exit 3\n", 0644);
    write_program(bin, "ddprun-test-script", script, 0755);
    write_program(bin, "ddprun-test-noexec", script, 0644);
    make_dir(dir);
    const char *old = getenv("PATH");
    snprintf(path, sizeof path, "/nonexistent-ddprun-dir:%s:%s:%s", noexec, bin,
             old ? old : "/bin:/usr/bin");

    set_path(path);
    char *argv[] = {ddprun, "--nproc-per-node", "2", "ddprun-test-script", "hello", dir, NULL};
    int st = finish(start(argv), err, sizeof err, 10);
    restore_path();
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("the script along PATH: status %d: %s", st, err);
    for (int rank = 0; rank < 2; rank++) {
        assert_int_equal(read_file(dir, "script", rank, buf, sizeof buf), 0);
        snprintf(want, sizeof want, "%d hello\n", rank);
        assert_string_equal(buf, want);
    }
    const char *cases[][2] = {
        {"ddprun-test-noexec", "ddprun: cannot run 'ddprun-test-noexec': Permission denied"},
        {"ddprun-no-such-program",
         "ddprun: cannot run 'ddprun-no-such-program': No such file or directory"},
        {"/nonexistent-ddprun-dir/prog",
         "ddprun: cannot run '/nonexistent-ddprun-dir/prog': No such file or directory"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *one[] = {ddprun, "--nproc-per-node", "1", (char *)cases[i][0], NULL};
        set_path(path);
        st = finish(start(one), err, sizeof err, 10);
        restore_path();
        if ((WIFEXITED(st) && WEXITSTATUS(st) == 0) || !strstr(err, cases[i][1]))
            fail_msg("'%s': status %d, want \"%s\": %s", cases[i][0], st, cases[i][1], err);
    }
    remove_dir(dir);
    remove_dir(bin);
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
        {"--nproc-per-node", "want 1..1024"}, {"--nnodes", "want 1..1048576 or MIN:MAX"},
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
    ddprun_paths();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_environment),
        cmocka_unit_test(test_program_lookup),
        cmocka_unit_test(test_blas_kernels),
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
        cmocka_unit_test(test_bad_numbers),
        cmocka_unit_test(test_signals_forwarded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
