/* ddprun's handling of its workers' output: --log-dir's layout,
 * --redirects, --tee, --local-ranks-filter, and the failure report (last
 * error, DDP_ERROR_FILE, the tail, where the logs are). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "ddprun_util.h"

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

int main(void)
{
    ddprun_paths();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_log_dir),
        cmocka_unit_test(test_redirects_tee_filter),
        cmocka_unit_test(test_failure_report),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
