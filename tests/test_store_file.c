/* Tests of the FileStore (src/store/file_store.c): every store operation
 * with real processes (store_cases.h), plus what is the file's own: removal
 * by the last member, corrupt and foreign files, compaction. */
#include "store_cases.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "base/rng.h"

static char store_path[256];

static int open_store(int rank, int world_size, ddp_store_t **out)
{
    (void)rank;
    (void)world_size;
    /* world_size 0: the shared cases open and close handles freely, so the
     * file must not be removed between them. */
    return ddp_store_file_create(store_path, 0, out);
}

static void fresh_store(void)
{
    unlink(store_path);
}

static int exists_path(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

static void write_file(const char *p, const void *data, size_t len, int append)
{
    int fd = open(p, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, data, len), (ssize_t)len);
    close(fd);
}

/* ---- membership: the last of world_size members removes the file -------- */

static int member(int rank, void *arg)
{
    (void)arg;
    ddp_store_t *s = NULL;
    CHILD_CHECK(ddp_store_file_create(store_path, 3, &s) == 0);
    ddp_store_set_timeout(s, 10);
    CHILD_CHECK(ddp_store_add(s, "arrived", 1, NULL) == 0);
    /* Stay until all three arrived, so no one leaves early. */
    char key[16];
    snprintf(key, sizeof key, "r%d", rank);
    CHILD_CHECK(ddp_store_set(s, key, "x", 1) == 0);
    const char *all[] = {"r0", "r1", "r2"};
    CHILD_CHECK(ddp_store_wait(s, all, 3, 10) == 0);
    ddp_store_destroy(s);
    return 0;
}

static void test_last_member_removes_file(void **state)
{
    (void)state;
    fresh_store();
    assert_int_equal(run_children(3, member, NULL, 30), 0);
    assert_false(exists_path(store_path));

    /* Fewer than world_size have left: the file stays for the late ones. */
    ddp_store_t *a = NULL, *b = NULL;
    assert_int_equal(ddp_store_file_create(store_path, 2, &a), 0);
    assert_int_equal(ddp_store_set(a, "k", "v", 1), 0);
    ddp_store_destroy(a);
    assert_true(exists_path(store_path));
    assert_int_equal(ddp_store_file_create(store_path, 2, &b), 0);
    assert_value(b, "k", "v", 1);
    ddp_store_destroy(b);
    assert_false(exists_path(store_path));
}

/* ---- bad files ---------------------------------------------------------- */

static void test_foreign_file_rejected(void **state)
{
    (void)state;
    fresh_store();
    ddp_store_t *s = (ddp_store_t *)&s;
    write_file(store_path, "this is not a store file, just some text\n", 41, 0);
    assert_int_equal(ddp_store_file_create(store_path, 1, &s), DDP_ERR_FORMAT);
    assert_null(s);
    assert_non_null(strstr(ddp_last_error(), store_path));
    assert_non_null(strstr(ddp_last_error(), "not a libddp FileStore file (bad magic)"));

    write_file(store_path, "DDPF", 4, 0);
    assert_int_equal(ddp_store_file_create(store_path, 1, &s), DDP_ERR_FORMAT);
    assert_non_null(strstr(ddp_last_error(), "file is 4 bytes, shorter than the 32-byte"));

    /* Right magic, unknown version. */
    uint8_t h[32] = {'D', 'D', 'P', 'F', 'S', 'T', 'O', 'R', 9, 0, 0, 0, 32};
    write_file(store_path, h, sizeof h, 0);
    assert_int_equal(ddp_store_file_create(store_path, 1, &s), DDP_ERR_FORMAT);
    assert_non_null(strstr(ddp_last_error(), "format version 9"));
    unlink(store_path);
}

static void test_corrupt_records_reported(void **state)
{
    (void)state;
    fresh_store();
    ddp_store_t *s = NULL;
    assert_int_equal(ddp_store_file_create(store_path, 0, &s), 0);
    assert_int_equal(ddp_store_set(s, "good", "value", 5), 0);
    struct stat st;
    assert_int_equal(stat(store_path, &st), 0);
    off_t good_end = st.st_size;

    /* Random bytes after the good records: a new handle sees the damage. */
    uint8_t junk[64]; /* junk[4], the type byte: 4 * 37 + 11 = 159 */
    for (size_t i = 0; i < sizeof junk; i++)
        junk[i] = (uint8_t)(i * 37 + 11);
    write_file(store_path, junk, sizeof junk, 1);
    ddp_store_t *t = NULL;
    assert_int_equal(ddp_store_file_create(store_path, 0, &t), DDP_ERR_FORMAT);
    char want[128];
    snprintf(want, sizeof want, "corrupt file: unknown record type 159 at offset %lld",
             (long long)good_end);
    assert_non_null(strstr(ddp_last_error(), want));
    /* And so does the open one, at its next operation, without crashing. */
    void *v = NULL;
    size_t len;
    assert_int_equal(ddp_store_get(s, "good", &v, &len), DDP_ERR_FORMAT);
    assert_non_null(strstr(ddp_last_error(), "corrupt file"));

    /* A flipped byte inside a record fails its checksum. */
    assert_int_equal(truncate(store_path, good_end), 0);
    int fd = open(store_path, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, "V", 1, good_end - 1), 1);
    close(fd);
    assert_int_equal(ddp_store_file_create(store_path, 0, &t), DDP_ERR_FORMAT);
    /* The last record is "good" (16-byte header, key, value), after the
     * handle's JOIN record. */
    snprintf(want, sizeof want, "checksum mismatch in record at offset %lld",
             (long long)good_end - 16 - 4 - 5);
    assert_non_null(strstr(ddp_last_error(), want));

    /* A record cut short. */
    assert_int_equal(truncate(store_path, good_end - 3), 0);
    assert_int_equal(ddp_store_file_create(store_path, 0, &t), DDP_ERR_FORMAT);
    assert_non_null(strstr(ddp_last_error(), "runs past the end of the file"));

    /* A huge length field is refused before any allocation. */
    assert_int_equal(truncate(store_path, 32), 0);
    uint8_t rec[16] = {0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f};
    write_file(store_path, rec, sizeof rec, 1);
    assert_int_equal(ddp_store_file_create(store_path, 0, &t), DDP_ERR_FORMAT);
    assert_non_null(strstr(ddp_last_error(), "value length 2147483647"));
    ddp_store_destroy(s);
    unlink(store_path);
}

/* Random damage to a good file (flipped bytes, cut tails): opening it
 * either works or says FORMAT; nothing crashes (ASan checks the parser). */
static void test_random_damage(void **state)
{
    (void)state;
    fresh_store();
    ddp_store_t *s = NULL;
    assert_int_equal(ddp_store_file_create(store_path, 0, &s), 0);
    assert_int_equal(ddp_store_set(s, "alpha", "one", 3), 0);
    assert_int_equal(ddp_store_add(s, "beta", 7, NULL), 0);
    assert_int_equal(ddp_store_set(s, "gamma", "three", 5), 0);
    assert_int_equal(ddp_store_delete_key(s, "alpha", NULL), 0);
    ddp_store_destroy(s);
    uint8_t good[512];
    int fd = open(store_path, O_RDONLY);
    ssize_t size = read(fd, good, sizeof good);
    close(fd);
    assert_true(size > 32 && size < (ssize_t)sizeof good);
    ddp__rng rng;
    ddp__rng_seed(&rng, 5);
    int opened = 0, rejected = 0;
    for (int i = 0; i < 300; i++) {
        uint8_t bad[512];
        memcpy(bad, good, (size_t)size);
        size_t len = (size_t)size;
        if (i % 3 == 0) {
            len = (size_t)ddp__rng_below(&rng, (uint64_t)size);
        } else {
            int flips = 1 + (int)ddp__rng_below(&rng, 3);
            for (int f = 0; f < flips; f++)
                bad[ddp__rng_below(&rng, len)] ^= (uint8_t)(1 + ddp__rng_below(&rng, 255));
        }
        write_file(store_path, bad, len, 0);
        int rc = ddp_store_file_create(store_path, 0, &s);
        if (rc == 0) {
            opened++;
            int64_t n = -1;
            assert_int_equal(ddp_store_num_keys(s, &n), 0);
            assert_true(n >= 0 && n <= 3);
            ddp_store_destroy(s);
        } else {
            rejected++;
            assert_int_equal(rc, DDP_ERR_FORMAT);
            assert_non_null(strstr(ddp_last_error(), store_path));
        }
    }
    assert_true(rejected > 200); /* header-count flips and cuts at 0 still open */
    assert_true(opened > 0);
    unlink(store_path);
}

static void test_open_errors(void **state)
{
    (void)state;
    ddp_store_t *s = NULL;
    assert_int_equal(ddp_store_file_create("/nonexistent-dir/x/store", 1, &s), DDP_ERR_IO);
    assert_non_null(strstr(ddp_last_error(),
                           "file store /nonexistent-dir/x/store: No such file or directory"));
    /* A FIFO (or a directory) where the file should be: refused at once,
     * not a read that waits forever (alarm: a hang fails the test). */
    char fifo[300];
    snprintf(fifo, sizeof fifo, "%s.fifo", store_path);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    alarm(20);
    assert_int_equal(ddp_store_file_create(fifo, 1, &s), DDP_ERR_IO);
    alarm(0);
    assert_null(s);
    assert_non_null(strstr(ddp_last_error(), "a FIFO, not a regular file"));
    assert_non_null(strstr(ddp_last_error(), fifo));
    unlink(fifo);
    assert_int_equal(ddp_store_file_create("/tmp", 1, &s), DDP_ERR_IO);
    assert_non_null(strstr(ddp_last_error(), "file store /tmp: "));
    assert_int_equal(ddp_store_file_create("", 1, &s), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "empty path"));
    assert_int_equal(ddp_store_file_create(store_path, -1, &s), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "world size -1 is negative"));
}

/* ---- compaction --------------------------------------------------------- */

static void test_compaction_keeps_values(void **state)
{
    (void)state;
    fresh_store();
    setenv("DDP_FILESTORE_COMPACT_BYTES", "4096", 1);
    ddp_store_t *a = NULL, *b = NULL;
    assert_int_equal(ddp_store_file_create(store_path, 0, &a), 0);
    assert_int_equal(ddp_store_file_create(store_path, 0, &b), 0);
    unsetenv("DDP_FILESTORE_COMPACT_BYTES");
    assert_int_equal(ddp_store_set(a, "keep", "kept", 4), 0);
    assert_value(b, "keep", "kept", 4); /* b has read the first generation */
    /* A second link keeps the old file's link count above 0 after the
     * rename (as NFS's silly rename does): b must see the superseded mark. */
    char keep[300];
    snprintf(keep, sizeof keep, "%s.keep", store_path);
    unlink(keep);
    assert_int_equal(link(store_path, keep), 0);
    for (int i = 0; i < 2000; i++)
        assert_int_equal(ddp_store_add(a, "n", 1, NULL), 0);
    assert_int_equal(ddp_store_set(a, "gone", "x", 1), 0);
    assert_int_equal(ddp_store_delete_key(a, "gone", NULL), 0);
    struct stat st;
    assert_int_equal(stat(store_path, &st), 0);
    assert_true(st.st_size < 8192); /* 2000 adds would be ~40 KB uncompacted */
    int64_t r = 0;
    assert_int_equal(ddp_store_add(b, "n", 0, &r), 0);
    assert_int_equal(r, 2000);
    assert_value(b, "keep", "kept", 4);
    int64_t n = 0;
    assert_int_equal(ddp_store_num_keys(b, &n), 0);
    assert_int_equal(n, 2);
    /* The old file was marked, and is no longer where the store lives. */
    int fd = open(keep, O_RDONLY);
    uint8_t h[32];
    assert_int_equal(read(fd, h, 32), 32);
    close(fd);
    for (int i = 16; i < 24; i++)
        assert_int_equal(h[i], 0xff);
    struct stat st_keep;
    assert_int_equal(stat(keep, &st_keep), 0);
    assert_int_equal(stat(store_path, &st), 0);
    assert_true(st.st_ino != st_keep.st_ino);
    unlink(keep);
    ddp_store_destroy(a);
    ddp_store_destroy(b);
    unlink(store_path);
}

static int warnings;

static void count_warning(int level, const char *msg, void *user)
{
    (void)user;
    if (level == DDP_LOG_WARN && strstr(msg, "compaction skipped"))
        warnings++;
}

/* A compaction that cannot write its new file leaves the log as it was,
 * warns once, and does not try again on every append. */
static void test_compaction_failure_harmless(void **state)
{
    (void)state;
    fresh_store();
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.compact.%d", store_path, (int)getpid());
    assert_int_equal(mkdir(tmp, 0700), 0); /* in the way of the new file */
    setenv("DDP_FILESTORE_COMPACT_BYTES", "4096", 1);
    ddp_store_t *s = NULL;
    assert_int_equal(ddp_store_file_create(store_path, 0, &s), 0);
    unsetenv("DDP_FILESTORE_COMPACT_BYTES");
    warnings = 0;
    ddp_log_set_callback(count_warning, NULL);
    ddp_log_set_level(DDP_LOG_WARN);
    for (int i = 0; i < 400; i++)
        assert_int_equal(ddp_store_add(s, "n", 1, NULL), 0);
    ddp_log_set_callback(NULL, NULL);
    ddp_log_set_level(DDP_LOG_OFF);
    assert_true(warnings >= 1 && warnings <= 3); /* the log doubles between tries */
    int64_t n = 0;
    assert_int_equal(ddp_store_add(s, "n", 0, &n), 0);
    assert_int_equal(n, 400);
    ddp_store_destroy(s);
    rmdir(tmp);
    unlink(store_path);
}

static int add_compacting(int rank, void *arg)
{
    (void)arg;
    ddp_store_t *s = NULL;
    CHILD_CHECK(ddp_store_file_create(store_path, 4, &s) == 0);
    char key[16];
    snprintf(key, sizeof key, "mine/%d", rank);
    for (int i = 0; i < 300; i++) {
        CHILD_CHECK(ddp_store_add(s, "n", 1, NULL) == 0);
        CHILD_CHECK(ddp_store_set(s, key, &i, sizeof i) == 0);
    }
    int64_t n = 0;
    CHILD_CHECK(ddp_store_add(s, "finished", 1, &n) == 0);
    const char *all = "all";
    if (n == 4)
        CHILD_CHECK(ddp_store_set(s, all, "", 0) == 0);
    CHILD_CHECK(ddp_store_wait(s, &all, 1, 20) == 0);
    CHILD_CHECK(ddp_store_add(s, "n", 0, &n) == 0 && n == 1200);
    ddp_store_destroy(s);
    return 0;
}

/* Four processes adding while the log is compacted again and again. */
static void test_concurrent_compaction(void **state)
{
    (void)state;
    fresh_store();
    setenv("DDP_FILESTORE_COMPACT_BYTES", "2048", 1);
    assert_int_equal(run_children(4, add_compacting, NULL, 60), 0);
    unsetenv("DDP_FILESTORE_COMPACT_BYTES");
    assert_false(exists_path(store_path)); /* the last of 4 removed it */
    /* No compaction left a temporary file behind. */
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.compact.", store_path);
    DIR *d = opendir("/tmp");
    assert_non_null(d);
    struct dirent *e;
    int stray = 0;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, tmp + 5, strlen(tmp + 5)) == 0)
            stray++;
    closedir(d);
    assert_int_equal(stray, 0);
}

/* ---- stale and live files of other jobs (init-method rendezvous) --------- */

static char logged[2048];

static void keep_warning(int level, const char *msg, void *user)
{
    (void)user;
    if (level == DDP_LOG_WARN)
        snprintf(logged, sizeof logged, "%s", msg);
}

static void url_of(char *url, size_t len)
{
    snprintf(url, len, "file://%s", store_path);
}

/* A run killed in its rendezvous (its rank 0 claimed, never left) leaves
 * the file behind: the next job, of another id or of none, empties it and
 * goes on, with a warning, instead of "rank 0 joined twice". */
static void test_stale_file_reused(void **state)
{
    (void)state;
    char url[300];
    url_of(url, sizeof url);
    for (int round = 0; round < 2; round++) {
        fresh_store();
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            setenv("TORCHELASTIC_RUN_ID", "old-run", 1);
            ddp_store_t *s = NULL;
            if (ddp_store_from_url(url, 0, 2, 5, &s, NULL, NULL) < 0 ||
                ddp_store_add(s, "ddp/world/join/0", 1, NULL) < 0)
                _exit(1);
            _exit(0); /* killed, say: no destroy, no LEAVE */
        }
        int st;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        assert_true(exists_path(store_path));

        if (round == 0)
            setenv("TORCHELASTIC_RUN_ID", "new-run", 1);
        logged[0] = 0;
        ddp_log_set_callback(keep_warning, NULL);
        ddp_log_set_level(DDP_LOG_WARN);
        ddp_store_t *s = NULL;
        int rc = ddp_store_from_url(url, 0, 2, 5, &s, NULL, NULL);
        ddp_log_set_callback(NULL, NULL);
        ddp_log_set_level(DDP_LOG_OFF);
        unsetenv("TORCHELASTIC_RUN_ID");
        assert_int_equal(rc, 0);
        int64_t n = -1;
        assert_int_equal(ddp_store_add(s, "ddp/world/join/0", 1, &n), 0);
        assert_int_equal(n, 1); /* a fresh claim, not a second one */
        assert_int_equal(ddp_store_num_keys(s, &n), 0);
        assert_int_equal(n, 1);
        if (!strstr(logged, "reusing the file of an earlier run that is gone (id 'old-run'; "
                            "1 member died, 0 left): its keys are dropped"))
            fail_msg("round %d: warning '%s'", round, logged);
        ddp_store_destroy(s);
    }
    unlink(store_path);
}

/* The file of a live job of another id is not taken over: the second job
 * fails at once, naming the holder and what to delete, and the first one
 * goes on; a late rank of the same job still joins. */
static void test_live_job_file_kept(void **state)
{
    (void)state;
    char url[300];
    url_of(url, sizeof url);
    fresh_store();
    int ready[2], go[2];
    assert_int_equal(pipe(ready), 0);
    assert_int_equal(pipe(go), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("TORCHELASTIC_RUN_ID", "live-job", 1);
        ddp_store_t *s = NULL;
        char c = 0;
        int ok = ddp_store_from_url(url, 0, 2, 10, &s, NULL, NULL) == 0 &&
                 ddp_store_set(s, "k", "v", 1) == 0;
        ok = ok && write(ready[1], "r", 1) == 1 && read(go[0], &c, 1) == 1;
        void *v = NULL;
        size_t len = 0;
        ok = ok && ddp_store_get(s, "k", &v, &len) == 0 && len == 1 && !memcmp(v, "v", 1) &&
             ddp_store_set(s, "k2", "w", 1) == 0;
        free(v);
        ddp_store_destroy(s);
        _exit(ok ? 0 : 1);
    }
    char c;
    assert_int_equal(read(ready[0], &c, 1), 1);

    setenv("TORCHELASTIC_RUN_ID", "other-job", 1);
    ddp_store_t *x = NULL;
    double t0 = ddp_time_now();
    assert_int_equal(ddp_store_from_url(url, 1, 2, 10, &x, NULL, NULL), DDP_ERR_EXISTS);
    assert_true(ddp_time_now() - t0 < 2.0);
    assert_null(x);
    char want[600];
    snprintf(want, sizeof want,
             "file store %s: a different job (id 'live-job', pid %d on ", store_path, (int)pid);
    if (!strstr(ddp_last_error(), want))
        fail_msg("got '%s'", ddp_last_error());
    snprintf(want, sizeof want,
             "holds this store (this job's id is 'other-job'): not joining it; use another file "
             "for this job, or delete %s if that job is gone",
             store_path);
    assert_non_null(strstr(ddp_last_error(), want));
    unsetenv("TORCHELASTIC_RUN_ID");
    assert_int_equal(ddp_store_from_url(url, 1, 2, 10, &x, NULL, NULL), DDP_ERR_EXISTS);
    assert_non_null(strstr(ddp_last_error(), "(this job has no id)"));

    /* A late rank of the live job itself is let in, and sees its keys. */
    setenv("TORCHELASTIC_RUN_ID", "live-job", 1);
    assert_int_equal(ddp_store_from_url(url, 1, 2, 10, &x, NULL, NULL), 0);
    unsetenv("TORCHELASTIC_RUN_ID");
    assert_value(x, "k", "v", 1);

    assert_int_equal(write(go[1], "g", 1), 1);
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_value(x, "k2", "w", 1);
    ddp_store_destroy(x);
    assert_false(exists_path(store_path)); /* the last of the 2 removed it */
    close(ready[0]);
    close(ready[1]);
    close(go[0]);
    close(go[1]);
}

int main(void)
{
    snprintf(store_path, sizeof store_path, "/tmp/ddp-test-filestore-%d", (int)getpid());
    const struct CMUnitTest tests[] = {
        STORE_CASES,
        cmocka_unit_test(test_last_member_removes_file),
        cmocka_unit_test(test_foreign_file_rejected),
        cmocka_unit_test(test_corrupt_records_reported),
        cmocka_unit_test(test_random_damage),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_compaction_keeps_values),
        cmocka_unit_test(test_concurrent_compaction),
        cmocka_unit_test(test_compaction_failure_harmless),
        cmocka_unit_test(test_stale_file_reused),
        cmocka_unit_test(test_live_job_file_kept),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    unlink(store_path);
    return rc;
}
