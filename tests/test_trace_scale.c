/* tools/ddp-trace on a large job: 16 ranks' dumps of 2000 records each,
 * written here, one rank calling a different all_reduce at #1500 and one
 * that never reached #1900.  The analysis is linear in the records (it
 * took 50 s here when it searched every rank's list per lookup); the
 * bound is generous for a loaded machine and the sanitizer build. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#define RANKS 16
#define ENTRIES 2000
#define ODD_RANK 5
#define ODD_SEQ 1500
#define SHORT_RANK 9

/* Rank r's dump into dir: collectives #1..#ENTRIES, the last one still
 * running (the short rank finished #1899 and issued nothing more). */
static void write_dump(const char *dir, int r)
{
    char path[256];
    snprintf(path, sizeof path, "%s/trace-rank%d.json", dir, r);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    int last = r == SHORT_RANK ? 1899 : ENTRIES;
    fprintf(f, "{\"rank\": %d, \"pid\": %d, \"host\": \"h\", \"reason\": \"destroyed\", "
               "\"groups\": [\n  {\"name\": \"default_pg\", \"backend\": \"tcp\", \"rank\": %d, "
               "\"size\": %d, \"ranks\": [],  \"next_seq\": %d, \"buffer\": %d, \"broken\": null, "
               "\"entries\": [",
            r, 1000 + r, r, RANKS, last + 1, ENTRIES);
    for (int s = 1; s <= last; s++) {
        int count = r == ODD_RANK && s == ODD_SEQ ? 8 : 4;
        long long t = 1000000LL * s + r;
        int running = s == last && r != SHORT_RANK;
        fprintf(f, "%s\n    {\"id\": %d, \"seq\": %d, \"op\": \"all_reduce\", \"dtype\": \"float32\", "
                   "\"count\": %d, \"reduce_op\": \"sum\", \"state\": \"%s\", \"queued_us\": %lld, "
                   "\"started_us\": %lld, \"done_us\": %lld}",
                s == 1 ? "" : ",", s, s, count, running ? "started" : "done", t, t,
                running ? 0 : t + 10);
    }
    fputs("]}]}\n", f);
    assert_int_equal(fclose(f), 0);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void test_sixteen_ranks_of_2000(void **state)
{
    (void)state;
    char dir[] = "/tmp/ddp_trace_scale.XXXXXX";
    assert_non_null(mkdtemp(dir));
    for (int r = 0; r < RANKS; r++)
        write_dump(dir, r);
    const char *build = getenv("DDP_TEST_BUILD");
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s/bin/ddp-trace --tail 1 %s 2>&1", build ? build : "build", dir);
    double t0 = now_s();
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    static char out[1 << 16];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    assert_int_equal(pclose(p), 0);
    double dt = now_s() - t0;
    fprintf(stderr, "ddp-trace: %d ranks x %d records in %.2f s\n", RANKS, ENTRIES, dt);
    const char *want = "Group default_pg (16 ranks, 16 dumps): the ranks first disagree at "
                       "collective #1500. Rank 5 called all_reduce (8 x float32, sum) where the "
                       "others called all_reduce (4 x float32, sum). Of the ranks that started it";
    if (strncmp(out, want, strlen(want)) != 0)
        fprintf(stderr, "got:\n%s", out);
    assert_int_equal(strncmp(out, want, strlen(want)), 0);
    assert_true(dt < 10);

    /* Without the odd call: the short rank, found as late as #1900. */
    char path[256];
    snprintf(path, sizeof path, "%s/trace-rank%d.json", dir, ODD_RANK);
    assert_int_equal(unlink(path), 0);
    t0 = now_s();
    p = popen(cmd, "r");
    assert_non_null(p);
    n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    assert_int_equal(pclose(p), 0);
    dt = now_s() - t0;
    fprintf(stderr, "ddp-trace, a rank short: %.2f s\n%s", dt, out);
    assert_non_null(strstr(out, "first disagree at collective #1900. Rank 9 never reached it "
                                "(rank 9 issued 1900 collectives) while the others called "
                                "all_reduce (4 x float32, sum). Rank 5 wrote no dump"));
    assert_true(dt < 10);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sixteen_ranks_of_2000),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
