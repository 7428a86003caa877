/* Tests of ddprun --bind-to (tools/ddprun/bind.c) with real workers
 * (tests/helpers/ddprun_worker.c "cpus": each writes its Cpus_allowed_list
 * and the BLAS threads it took): core gives every local rank its own share
 * of ddprun's CPUs, none leaves them as they were, too many workers and
 * bad values are refused, and a binding the kernel refuses fails the
 * worker with a message.  ddprun's own CPUs are set in its process before
 * the exec (start_with), so the cases do not depend on the machine's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ddprun_util.h"
#include "seccomp_util.h"

/* ---- CPU sets ------------------------------------------------------------ */

/* This process's CPUs, ascending: their count. */
static int my_cpus(int *cpus)
{
    cpu_set_t set;
    assert_int_equal(sched_getaffinity(0, sizeof set, &set), 0);
    int n = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set))
            cpus[n++] = c;
    return n;
}

/* "0-2,5" into cpus: their count, or -1 when it is not such a list. */
static int parse_list(const char *s, int *cpus, int max)
{
    int n = 0;
    while (*s) {
        char *e;
        long lo = strtol(s, &e, 10), hi = lo;
        if (e == s)
            return -1;
        if (*e == '-')
            hi = strtol(e + 1, &e, 10);
        for (long c = lo; c <= hi && n < max; c++)
            cpus[n++] = (int)c;
        if (*e && *e != ',')
            return -1;
        s = *e ? e + 1 : e;
    }
    return n;
}

/* One worker's report (DIR/cpus.RANK): its CPUs, OpenBLAS's threads when
 * it loaded, ddp_num_threads(). */
typedef struct {
    int cpus[CPU_SETSIZE], n, openblas, ddp;
} report;

static void read_report(const char *dir, int rank, report *r)
{
    char buf[8192], list[4096];
    assert_int_equal(read_file(dir, "cpus", rank, buf, sizeof buf), 0);
    if (sscanf(buf, "allowed=%4095s\nopenblas=%d\nddp=%d", list, &r->openblas, &r->ddp) != 3)
        fail_msg("rank %d's report: '%s'", rank, buf);
    r->n = parse_list(list, r->cpus, CPU_SETSIZE);
    assert_true(r->n > 0);
}

/* The CPU ddprun is confined to before it starts (-1: its parent's). */
static int confine_to = -1;
/* Whether ddprun's sched_setaffinity fails with EPERM (a seccomp filter). */
static int deny_binding;

static int deny_setaffinity(void) { return deny_syscall(__NR_sched_setaffinity, -1, 0, EPERM); }

static void set_up_ddprun(void)
{
    if (confine_to >= 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(confine_to, &one);
        if (sched_setaffinity(0, sizeof one, &one))
            _exit(124);
    }
    if (deny_binding && deny_setaffinity())
        _exit(125);
}

/* Runs ddprun FLAGS... --nproc-per-node NPROC worker cpus DIR to the end:
 * its exit status, its stderr in err. */
static int run_cpus(const char *flag, const char *value, int nproc, const char *dir, char *err,
                    size_t len)
{
    char n[16];
    snprintf(n, sizeof n, "%d", nproc);
    char *argv[9] = {ddprun, "--nproc-per-node", n};
    int k = 3;
    if (flag)
        argv[k++] = (char *)flag;
    if (value)
        argv[k++] = (char *)value;
    argv[k++] = worker;
    argv[k++] = "cpus";
    argv[k++] = (char *)dir;
    int st = finish(start_with(argv, NULL, set_up_ddprun), err, len, 20);
    confine_to = -1;
    deny_binding = 0;
    return st;
}

static void expect_ok(int st, const char *err)
{
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("ddprun: status %d, stderr '%s'", st, err);
}

/* ---- tests --------------------------------------------------------------- */

/* Each local rank on CPUs of its own: rank l on [l*k, (l+1)*k) of
 * ddprun's CPUs, disjoint, and no more BLAS threads than those CPUs. */
static void test_core_splits_ddprun_cpus(void **state)
{
    (void)state;
    static int mine[CPU_SETSIZE];
    int n = my_cpus(mine);
    if (n < 2) {
        fprintf(stderr, "skipped: two workers bound apart need 2 CPUs, this test has %d\n", n);
        skip();
    }
    /* OpenBLAS sizes its pool by its CPUs when it loads, unless a variable
     * says (OMP_NUM_THREADS, ddprun's 1, among them; empty: no say): the
     * binding must come before that, in the worker before exec. */
    unsetenv("OPENBLAS_NUM_THREADS");
    unsetenv("DDP_NUM_THREADS");
    setenv("OMP_NUM_THREADS", "", 1);
    static const char *const forms[2][2] = {{"--bind-to", "core"}, {"--bind_to=core", NULL}};
    for (int f = 0; f < 2; f++) {
        char dir[64], err[8192];
        make_dir(dir);
        expect_ok(run_cpus(forms[f][0], forms[f][1], 2, dir, err, sizeof err), err);
        int k = n / 2, seen[CPU_SETSIZE] = {0};
        for (int l = 0; l < 2; l++) {
            report r;
            read_report(dir, l, &r);
            assert_int_equal(r.n, k);
            for (int i = 0; i < k; i++) {
                assert_int_equal(r.cpus[i], mine[l * k + i]);
                assert_int_equal(seen[r.cpus[i]]++, 0); /* no CPU given twice */
            }
            assert_true(r.openblas >= 1 && r.openblas <= k);
            assert_true(r.ddp >= 1 && r.ddp <= k);
        }
        remove_dir(dir);
    }
}

/* After it, pass or fail: the thread variables as the other tests expect
 * them (unset). */
static int forget_thread_env(void **state)
{
    (void)state;
    unsetenv("OMP_NUM_THREADS");
    return 0;
}

/* The CPUs are ddprun's own, not the machine's: confined to its last CPU,
 * ddprun binds its one worker there. */
static void test_core_uses_ddprun_own_set(void **state)
{
    (void)state;
    static int mine[CPU_SETSIZE];
    int n = my_cpus(mine);
    if (n < 2) {
        fprintf(stderr, "skipped: ddprun confined apart from CPU %d needs 2 CPUs, this test "
                        "has %d\n", mine[0], n);
        skip();
    }
    char dir[64], err[8192];
    make_dir(dir);
    confine_to = mine[n - 1];
    expect_ok(run_cpus("--bind-to", "core", 1, dir, err, sizeof err), err);
    report r;
    read_report(dir, 0, &r);
    assert_int_equal(r.n, 1);
    assert_int_equal(r.cpus[0], mine[n - 1]);
    remove_dir(dir);
}

/* --bind-to none, as no flag: every worker keeps ddprun's CPUs. */
static void test_none_leaves_cpus(void **state)
{
    (void)state;
    static int mine[CPU_SETSIZE];
    int n = my_cpus(mine);
    for (int form = 0; form < 2; form++) {
        char dir[64], err[8192];
        make_dir(dir);
        int st = form ? run_cpus("--bind-to", "none", 2, dir, err, sizeof err)
                      : run_cpus(NULL, NULL, 2, dir, err, sizeof err);
        expect_ok(st, err);
        for (int l = 0; l < 2; l++) {
            report r;
            read_report(dir, l, &r);
            assert_int_equal(r.n, n);
            assert_memory_equal(r.cpus, mine, sizeof *mine * (size_t)n);
        }
        remove_dir(dir);
    }
}

/* More workers than ddprun's CPUs: refused before any starts, saying
 * how many of each and what to do. */
static void test_core_refuses_oversubscription(void **state)
{
    (void)state;
    static int mine[CPU_SETSIZE];
    my_cpus(mine);
    char dir[64], err[8192], want[512], buf[64];
    make_dir(dir);
    confine_to = mine[0];
    int st = run_cpus("--bind-to", "core", 2, dir, err, sizeof err);
    snprintf(want, sizeof want,
             "ddprun: --bind-to core: 2 workers per node, but ddprun may run on only 1 CPU (%d): "
             "give --nproc-per-node 1 or less, or --bind-to none\n",
             mine[0]);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 2 || strcmp(err, want) != 0)
        fail_msg("status %d, stderr '%s', want '%s'", st, err, want);
    assert_int_equal(read_file(dir, "cpus", 0, buf, sizeof buf), -1); /* none started */
    remove_dir(dir);
}

static void test_bad_values(void **state)
{
    (void)state;
    static const char *const values[] = {"socket", "", "Core", "core,none", " core"};
    for (size_t i = 0; i < sizeof values / sizeof *values; i++) {
        char dir[64], err[8192], want[256];
        make_dir(dir);
        int st = run_cpus("--bind-to", values[i], 1, dir, err, sizeof err);
        snprintf(want, sizeof want,
                 "ddprun: bad --bind-to '%s': want none or core (see ddprun --help)\n", values[i]);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 2 || strcmp(err, want) != 0)
            fail_msg("'%s': status %d, stderr '%s', want '%s'", values[i], st, err, want);
        remove_dir(dir);
    }
}

/* Whether a seccomp filter can be set here (a container may forbid it). */
static int seccomp_works(void)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        cpu_set_t set;
        _exit(deny_setaffinity() || sched_getaffinity(0, sizeof set, &set) ||
              sched_setaffinity(0, sizeof set, &set) == 0 || errno != EPERM);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* A binding the kernel refuses (here a seccomp filter; in life a cpuset
 * changed under the job): the worker says so and fails as a failed exec
 * does, and ddprun reports it. */
static void test_refused_binding_fails_worker(void **state)
{
    (void)state;
    if (!seccomp_works()) {
        fprintf(stderr, "skipped: no seccomp filter here to make sched_setaffinity fail\n");
        skip();
    }
    static int mine[CPU_SETSIZE];
    my_cpus(mine);
    char dir[64], err[8192], want[256];
    make_dir(dir);
    confine_to = mine[0];
    deny_binding = 1;
    int st = run_cpus("--bind-to", "core", 1, dir, err, sizeof err);
    snprintf(want, sizeof want,
             "exited with code 127; last error: ddprun: cannot bind local rank 0 to CPU %d: %s\n",
             mine[0], strerror(EPERM));
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 1 || !strstr(err, want))
        fail_msg("status %d, stderr '%s', want '%s'", st, err, want);
    remove_dir(dir);
}

int main(void)
{
    ddprun_paths();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_core_splits_ddprun_cpus, forget_thread_env),
        cmocka_unit_test(test_core_uses_ddprun_own_set),
        cmocka_unit_test(test_none_leaves_cpus),
        cmocka_unit_test(test_core_refuses_oversubscription),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_refused_binding_fails_worker),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
