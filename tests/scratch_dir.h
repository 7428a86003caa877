/* A scratch folder per test, in the static `dir` (/tmp/ddp-test-XXXXXX),
 * made by scratch_setup and removed with its contents by scratch_teardown:
 * cmocka setup/teardown functions for tests that write files and run
 * programs on them (test_mnist_ddp.c, test_mnist_report.c, test_plot.c,
 * test_progress.c). */
#ifndef DDP_TESTS_SCRATCH_DIR_H
#define DDP_TESTS_SCRATCH_DIR_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char dir[64];

static inline int scratch_setup(void **state)
{
    (void)state;
    strcpy(dir, "/tmp/ddp-test-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static inline int scratch_teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Are files a and b of the scratch folder the same bytes? */
__attribute__((unused)) static int same_files(const char *a, const char *b)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cmp -s %s/%s %s/%s", dir, a, dir, b);
    return system(cmd) == 0;
}

/* A cmocka test run in a fresh scratch folder. */
#define IN_SCRATCH(test) cmocka_unit_test_setup_teardown(test, scratch_setup, scratch_teardown)

#endif
