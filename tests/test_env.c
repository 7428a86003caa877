/* The DDP_* environment variables (src/base/env.c): the table against
 * README.md's configuration table and the sources, each type's parsing
 * and messages, and bad values failing group creation instead of running
 * wrong.  Test-only variables (DDP_TEST_*) are not in the table: the
 * library never reads them (tests/run.sh and the tests do, by getenv). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/env.h"
#include "ddp/data.h"
#include "ddp/pg.h"
#include "ddp/store.h"
#include "ddp/tensor.h"
#include "fork_children.h"
#include "pg_util.h"

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s)
        s[n] = '\0';
    fclose(f);
    return s;
}

/* The DDP_* name that starts at p into out ("" when none). */
static const char *name_at(const char *p, char *out, size_t len)
{
    size_t n = 0;
    if (strncmp(p, "DDP_", 4) == 0)
        while ((isupper((unsigned char)p[n]) || isdigit((unsigned char)p[n]) || p[n] == '_') &&
               n + 1 < len) {
            out[n] = p[n];
            n++;
        }
    out[n] = '\0';
    return p + n;
}

/* Reads name, set to value (unset when NULL), with its type's getter,
 * from a caller's value of init; the result as a number in *num (a string:
 * 1 when there is one).  Returns the getter's code. */
static int read_var(const char *name, const char *value, double init, double *num)
{
    const ddp__env_var *v = ddp__env_find(name);
    assert_non_null(v);
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    int iv = (int)init;
    size_t sv = (size_t)init;
    double dv = init;
    const char *str = NULL;
    int rc = 0;
    switch (v->type) {
    case DDP__ENV_BOOL: rc = ddp__env_bool(name, &iv); dv = iv; break;
    case DDP__ENV_INT: rc = ddp__env_int(name, &iv); dv = iv; break;
    case DDP__ENV_SIZE: rc = ddp__env_size(name, &sv); dv = (double)sv; break;
    case DDP__ENV_USEC: rc = ddp__env_usec(name, &dv); break;
    case DDP__ENV_SECONDS: rc = ddp__env_seconds(name, &dv); break;
    case DDP__ENV_WORD: rc = ddp__env_word(name, &iv); dv = iv; break;
    case DDP__ENV_STRING:
    case DDP__ENV_PATH: rc = ddp__env_string(name, &str); dv = str != NULL; break;
    }
    unsetenv(name);
    *num = dv;
    return rc;
}

/* name=value's number (read_var), which must be accepted. */
static double value_of(const char *name, const char *value, double init)
{
    double d = 0;
    if (read_var(name, value, init, &d) != 0)
        fail_msg("%s=%s: %s", name, value ? value : "(unset)", ddp_last_error());
    return d;
}

/* ---- (a) README.md's table and the sources ------------------------------ */

/* The README's "Configuration (environment)" table: its rows. */
static char *readme_table(void)
{
    char *s = read_text("README.md");
    if (!s)
        return NULL;
    char *start = strstr(s, "## Configuration (environment)");
    char *end = start ? strstr(start + 3, "\n## ") : NULL;
    if (!start) {
        free(s);
        return NULL;
    }
    if (end)
        *end = '\0';
    memmove(s, start, strlen(start) + 1);
    return s;
}

/* Does a row of the table name var in its first column? */
static int readme_lists(const char *table, const char *var)
{
    for (const char *line = table; line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
        if (line[0] != '|')
            continue;
        const char *col_end = strchr(line + 1, '|');
        for (const char *p = line; col_end && p < col_end; p++) {
            char name[64];
            name_at(p, name, sizeof name);
            if (p > line && p[-1] == '`' && strcmp(name, var) == 0)
                return 1;
        }
    }
    return 0;
}

static void test_readme_and_table_agree(void **state)
{
    (void)state;
    char *table = readme_table();
    assert_non_null(table);
    size_t n;
    const ddp__env_var *t = ddp__env_table(&n);
    assert_true(n >= 35);
    for (size_t i = 0; i < n; i++)
        if (!readme_lists(table, t[i].name))
            fail_msg("%s is in src/base/env.c's table but not in README.md's", t[i].name);
    /* Every DDP_* name anywhere in the README's table's rows is a variable. */
    int rows = 0;
    for (const char *line = table; line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
        if (line[0] != '|')
            continue;
        rows++;
        const char *eol = strchr(line, '\n');
        for (const char *p = line; (p = strstr(p, "DDP_")) != NULL && (!eol || p < eol);) {
            char name[64];
            p = name_at(p, name, sizeof name);
            if (!ddp__env_find(name))
                fail_msg("README.md's configuration table names %s, not in the table", name);
        }
    }
    assert_true(rows > 20);
    free(table);
}

/* Every entry: a DDP_ name, unique, described, a default that its own
 * reader accepts (an unset variable reads as it). */
static void test_table_entries(void **state)
{
    (void)state;
    size_t n;
    const ddp__env_var *t = ddp__env_table(&n);
    for (size_t i = 0; i < n; i++) {
        const char *name = t[i].name;
        assert_int_equal(strncmp(name, "DDP_", 4), 0);
        assert_int_not_equal(strncmp(name, "DDP_TEST_", 9), 0);
        assert_true(t[i].what && strlen(t[i].what) > 10);
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(name, t[j].name);
        assert_ptr_equal(ddp__env_find(name), &t[i]);
        if (t[i].type == DDP__ENV_WORD)
            assert_non_null(t[i].words[1]);
        double d = 0;
        if (read_var(name, NULL, 7, &d) != 0)
            fail_msg("%s: its default does not read: %s", name, ddp_last_error());
        if (t[i].dflt == NULL && t[i].type != DDP__ENV_STRING && t[i].type != DDP__ENV_PATH)
            assert_true(d == 7); /* left as the caller set it */
    }
}

/* No source reads a DDP_* variable past the table: no getenv("DDP_...")
 * outside env.c, and every ddp__env_*("NAME") names a listed variable. */
static void scan_file(const char *path, int *files)
{
    size_t len = strlen(path);
    if (len < 3 || strcmp(path + len - 2, ".c") != 0 || strcmp(path, "src/base/env.c") == 0)
        return;
    char *s = read_text(path);
    if (!s)
        return;
    ++*files;
    if (strstr(s, "getenv(\"DDP_"))
        fail_msg("%s reads a DDP_* variable by getenv: use src/base/env.h", path);
    /* the library's getters, and the public one programs use */
    static const char *const getters[] = {"ddp__env_", "ddp_env_"};
    for (int g = 0; g < 2; g++)
        for (const char *p = s; (p = strstr(p, getters[g])) != NULL;) {
            p = strchr(p, '(');
            if (!p)
                break;
            p++;
            if (*p != '"')
                continue;
            char name[64];
            p = name_at(p + 1, name, sizeof name);
            if (name[0] && !ddp__env_find(name))
                fail_msg("%s reads %s, which is not in src/base/env.c's table", path, name);
        }
    free(s);
}

static void scan_dir(const char *dir, int depth, int *files)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (depth > 0)
            scan_dir(path, depth - 1, files);
        scan_file(path, files);
    }
    closedir(d);
}

static void test_sources_read_only_listed_variables(void **state)
{
    (void)state;
    int files = 0;
    scan_dir("src", 2, &files);
    scan_dir("tools", 1, &files); /* tools/ddprun/ too */
    scan_dir("examples", 1, &files); /* examples/mnist/ too */
    assert_true(files > 60); /* run from the repository's root (tests/run.sh) */
}

/* ---- (b) each type's values and messages ------------------------------- */

/* name=value must fail with msg (exactly, after the file:line prefix). */
static void rejects(const char *name, const char *value, const char *msg)
{
    double unused;
    int rc = read_var(name, value, 0, &unused);
    if (rc != DDP_ERR_INVALID_ARG)
        fail_msg("%s=%s was accepted (rc %d)", name, value, rc);
    const char *got = strstr(ddp_last_error(), ": DDP_");
    if (!got || strcmp(got + 2, msg) != 0)
        fail_msg("%s=%s: expected '%s', got '%s'", name, value, msg, ddp_last_error());
}

static const char *const junk[] = {"abc", "12x", "-1", "1e30", "nan", "inf", " 12", "12 ", "0x10"};

static void rejects_junk(const char *name, const char *accepted)
{
    for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s=%s: expected %s", name, junk[i], accepted);
        rejects(name, junk[i], msg);
    }
}

static void test_size(void **state)
{
    (void)state;
    const char *what = "a size in bytes from 1 to 1 TiB";
    rejects_junk("DDP_CHUNK_BYTES", what);
    rejects("DDP_CHUNK_BYTES", "-1", "DDP_CHUNK_BYTES=-1: expected a size in bytes from 1 to 1 TiB");
    rejects("DDP_CHUNK_BYTES", "0", "DDP_CHUNK_BYTES=0: expected a size in bytes from 1 to 1 TiB");
    rejects("DDP_CHUNK_BYTES", "1099511627777",
            "DDP_CHUNK_BYTES=1099511627777: expected a size in bytes from 1 to 1 TiB");
    rejects("DDP_CHUNK_BYTES", "18446744073709551615",
            "DDP_CHUNK_BYTES=18446744073709551615: expected a size in bytes from 1 to 1 TiB");
    rejects("DDP_CHUNK_BYTES", "1.5", "DDP_CHUNK_BYTES=1.5: expected a size in bytes from 1 to 1 TiB");
    rejects("DDP_CHUNK_BYTES", "64k", "DDP_CHUNK_BYTES=64k: expected a size in bytes from 1 to 1 TiB");
    rejects("DDP_CHUNK_BYTES", "+5", "DDP_CHUNK_BYTES=+5: expected a size in bytes from 1 to 1 TiB");
    rejects("DDP_SHM_RING_BYTES", "12",
            "DDP_SHM_RING_BYTES=12: expected a size in bytes from 4 KiB to 1 GiB");
    rejects("DDP_TCP_SOCKBUF", "1e30",
            "DDP_TCP_SOCKBUF=1e30: expected a size in bytes from 0 to 2147483647");
    /* Unset and empty read as the default; the spellings of today's parsers. */
    assert_true(value_of("DDP_CHUNK_BYTES", NULL, 0) == 262144);
    assert_true(value_of("DDP_CHUNK_BYTES", "", 0) == 262144);
    assert_true(value_of("DDP_CHUNK_BYTES", "65536", 0) == 65536);
    assert_true(value_of("DDP_CHUNK_BYTES", "1", 0) == 1);
    assert_true(value_of("DDP_CHUNK_BYTES", "1099511627776", 0) == 1099511627776.0);
    assert_true(value_of("DDP_CHUNK_BYTES", "1e6", 0) == 1000000);
    assert_true(value_of("DDP_CHUNK_BYTES", "2E3", 0) == 2000);
    assert_true(value_of("DDP_CHUNK_BYTES", "1.5e3", 0) == 1500);
    assert_true(value_of("DDP_SHM_WINDOW_BYTES", "0", 0) == 0);
    assert_true(value_of("DDP_TCP_SOCKBUF", "0", 0) == 0);
}

static void test_int(void **state)
{
    (void)state;
    rejects_junk("DDP_NUM_THREADS", "an integer from 1 to 4096");
    rejects("DDP_NUM_THREADS", "0", "DDP_NUM_THREADS=0: expected an integer from 1 to 4096");
    rejects("DDP_NUM_THREADS", "4097", "DDP_NUM_THREADS=4097: expected an integer from 1 to 4096");
    rejects("DDP_NUM_THREADS", "2.0", "DDP_NUM_THREADS=2.0: expected an integer from 1 to 4096");
    rejects("DDP_NUM_THREADS", "1e3", "DDP_NUM_THREADS=1e3: expected an integer from 1 to 4096");
    rejects("DDP_TAIL_CHUNKS", "3x", "DDP_TAIL_CHUNKS=3x: expected an integer from 0 to 1024");
    assert_true(value_of("DDP_NUM_THREADS", NULL, -3) == -3); /* no default: the caller's stays */
    assert_true(value_of("DDP_NUM_THREADS", "", -3) == -3);
    assert_true(value_of("DDP_NUM_THREADS", "8", -3) == 8);
    assert_true(value_of("DDP_NUM_THREADS", "4096", -3) == 4096);
    assert_true(value_of("DDP_TAIL_CHUNKS", "0", -1) == 0);
}

static void test_seconds(void **state)
{
    (void)state;
    rejects_junk("DDP_RENDEZVOUS_REPORT_S", "seconds from 0 to 1e+06");
    rejects("DDP_RENDEZVOUS_REPORT_S", "2e6",
            "DDP_RENDEZVOUS_REPORT_S=2e6: expected seconds from 0 to 1e+06");
    assert_true(value_of("DDP_RENDEZVOUS_REPORT_S", NULL, -1) == 10);
    assert_true(value_of("DDP_RENDEZVOUS_REPORT_S", "0.4", -1) == 0.4);
    assert_true(value_of("DDP_RENDEZVOUS_REPORT_S", "0", -1) == 0);
}

static void test_usec(void **state)
{
    (void)state;
    rejects_junk("DDP_SHM_SPIN_US", "microseconds from 0 to 1e+07");
    rejects("DDP_TCP_SPIN_US", "fast", "DDP_TCP_SPIN_US=fast: expected microseconds from 0 to 1e+07");
    rejects("DDP_MPI_SPIN_US", "1e8", "DDP_MPI_SPIN_US=1e8: expected microseconds from 0 to 1e+07");
    rejects("DDP_SHM_SPIN_US", "-0.5", "DDP_SHM_SPIN_US=-0.5: expected microseconds from 0 to 1e+07");
    static const struct {
        const char *value;
        double want;
    } ok[] = {{NULL, 20}, {"", 20}, {"0", 0}, {"0.5", 0.5}, {".5", 0.5}, {"2e3", 2000},
              {"2000", 2000}, {"10000000", 1e7}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        assert_true(value_of("DDP_SHM_SPIN_US", ok[i].value, -1) == ok[i].want);
    assert_true(value_of("DDP_MPI_SPIN_US", NULL, -1) == 20000);
    assert_true(value_of("DDP_TCP_SPIN_US", NULL, -1) == 20);
}

static void test_bool(void **state)
{
    (void)state;
    rejects_junk("DDP_SHM_CMA", "0 or 1");
    rejects("DDP_SHM_CMA", "yes", "DDP_SHM_CMA=yes: expected 0 or 1");
    rejects("DDP_SYMMETRIC_MEMORY", "2", "DDP_SYMMETRIC_MEMORY=2: expected 0 or 1");
    rejects("DDP_DATA_CACHE", "off", "DDP_DATA_CACHE=off: expected 0 or 1");
    assert_true(value_of("DDP_SHM_CMA", NULL, -1) == 0);
    assert_true(value_of("DDP_SHM_CMA", "1", -1) == 1);
    assert_true(value_of("DDP_SYMMETRIC_MEMORY", NULL, -1) == 1);
    assert_true(value_of("DDP_SYMMETRIC_MEMORY", "", -1) == 1);
    assert_true(value_of("DDP_SYMMETRIC_MEMORY", "0", -1) == 0);
}

static void test_word(void **state)
{
    (void)state;
    rejects_junk("DDP_TRANSPORT", "auto, tcp or shm");
    rejects("DDP_TRANSPORT", "infiniband", "DDP_TRANSPORT=infiniband: expected auto, tcp or shm");
    rejects("DDP_ALLREDUCE_ALGO", "bogus",
            "DDP_ALLREDUCE_ALGO=bogus: expected auto, ring, rd, direct, shared, rabenseifner or tree");
    rejects("DDP_HIERARCHICAL", "yes", "DDP_HIERARCHICAL=yes: expected auto, 0 or 1");
    rejects("DDP_LOG_LEVEL", "loud",
            "DDP_LOG_LEVEL=loud: expected off, error, warn, info, debug or warning");
    assert_true(value_of("DDP_TRANSPORT", NULL, -1) == 0);
    assert_true(value_of("DDP_TRANSPORT", "shm", -1) == 2);
    assert_true(value_of("DDP_TRANSPORT", "TCP", -1) == 1); /* case ignored, as DDP_LOG_LEVEL's */
    assert_true(value_of("DDP_MPI_THREAD", NULL, -1) == 0);  /* serialized */
    assert_true(value_of("DDP_MPI_THREAD", "multiple", -1) == 1);
}

static void test_string(void **state)
{
    (void)state;
    char big[300];
    memset(big, 'h', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    char msg[400];
    snprintf(msg, sizeof msg, "DDP_TCP_HOST=%.80s: expected at most 255 bytes", big);
    rejects("DDP_TCP_HOST", big, msg);
    const char *s = "x";
    unsetenv("DDP_TCP_HOST");
    assert_int_equal(ddp__env_string("DDP_TCP_HOST", &s), 0);
    assert_null(s);
    setenv("DDP_TCP_HOST", "", 1);
    assert_int_equal(ddp__env_string("DDP_TCP_HOST", &s), 0);
    assert_null(s);
    setenv("DDP_TCP_HOST", "10.0.0.2", 1);
    assert_int_equal(ddp__env_string("DDP_TCP_HOST", &s), 0);
    assert_string_equal(s, "10.0.0.2");
    unsetenv("DDP_TCP_HOST");
    setenv("DDP_DATA_CACHE_DIR", "/tmp/x", 1); /* a path reads as a string */
    assert_int_equal(ddp__env_string("DDP_DATA_CACHE_DIR", &s), 0);
    assert_string_equal(s, "/tmp/x");
    unsetenv("DDP_DATA_CACHE_DIR");
}

/* A name not in the table, or read as another type, is refused. */
static void test_unlisted_names_are_refused(void **state)
{
    (void)state;
    size_t v = 0;
    setenv("DDP_NOT_A_KNOB", "5", 1);
    assert_int_equal(ddp__env_size("DDP_NOT_A_KNOB", &v), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(),
                           "environment variable DDP_NOT_A_KNOB is not in libddp's table"));
    unsetenv("DDP_NOT_A_KNOB");
    int b = 0;
    assert_int_equal(ddp__env_bool("DDP_CHUNK_BYTES", &b), DDP_ERR_INVALID_ARG);
    assert_non_null(
        strstr(ddp_last_error(), "environment variable DDP_CHUNK_BYTES is a size, read as a bool"));
    assert_null(ddp__env_find("DDP_TEST_SANITIZER"));
}

/* ---- (c) end to end: group creation fails, naming the value ---------- */

static job J;

static int bad_chunk_rank(int rank, void *arg)
{
    (void)arg;
    setenv("DDP_CHUNK_BYTES", "-1", 1);
    ddp_pg_t *pg = NULL;
    int rc = ddp_init_process_group("tcp", J.url, rank, 2, 10.0, &pg);
    CHILD_CHECK(rc == DDP_ERR_INVALID_ARG && pg == NULL);
    CHILD_CHECK(contains(ddp_last_error(),
                         "DDP_CHUNK_BYTES=-1: expected a size in bytes from 1 to 1 TiB"));
    return 0;
}

/* A small valid chunk still pipelines a broadcast correctly. */
static int small_chunk_rank(int rank, void *arg)
{
    (void)arg;
    setenv("DDP_CHUNK_BYTES", "4096", 1);
    ddp_pg_t *pg = NULL;
    CHILD_CHECK(ddp_init_process_group("tcp", J.url, rank, 2, 10.0, &pg) == 0);
    enum { N = 100000 };
    static float buf[N];
    for (int i = 0; i < N; i++)
        buf[i] = rank == 0 ? (float)i : -1.0f;
    int rc = ddp_pg_broadcast(pg, buf, N, DDP_FLOAT32, 0);
    ddp_destroy_process_group(pg);
    CHILD_CHECK(rc == 0);
    for (int i = 0; i < N; i++)
        CHILD_CHECK(buf[i] == (float)i);
    return 0;
}

/* DDP_TCP_SOCKBUF=1e30 used to read as 1 (atoi) and the job timed out. */
static int bad_sockbuf_rank(int rank, void *arg)
{
    (void)arg;
    setenv("DDP_TRANSPORT", "tcp", 1);
    setenv("DDP_TCP_SOCKBUF", "1e30", 1);
    ddp_pg_t *pg = NULL;
    int rc = ddp_init_process_group("tcp", J.url, rank, 2, 10.0, &pg);
    CHILD_CHECK(rc == DDP_ERR_INVALID_ARG && pg == NULL);
    CHILD_CHECK(contains(ddp_last_error(),
                         "DDP_TCP_SOCKBUF=1e30: expected a size in bytes from 0 to 2147483647"));
    return 0;
}

static void test_bad_sockbuf_fails_group_creation(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(2, bad_sockbuf_rank, NULL, 30), 0);
    job_cleanup(&J);
}

static void test_bad_chunk_fails_group_creation(void **state)
{
    (void)state;
    job_init(&J);
    assert_int_equal(run_children(2, bad_chunk_rank, NULL, 30), 0);
    job_cleanup(&J);
    job_init(&J);
    assert_int_equal(run_children(2, small_chunk_rank, NULL, 30), 0);
    job_cleanup(&J);
}


/* ---- readers that cannot fail their call: a warning, never silence ----- */

static char logged[1024];

static void keep_log(int level, const char *msg, void *user)
{
    (void)user;
    if (level == DDP_LOG_WARN)
        snprintf(logged, sizeof logged, "%s", msg);
}

/* A bad DDP_LOG_LEVEL turns warnings on and says why; the caller's last
 * error stays.  (The level is read once per process: a child.) */
static int bad_log_level(int rank, void *arg)
{
    (void)rank;
    (void)arg;
    setenv("DDP_LOG_LEVEL", "loud", 1);
    ddp_log_set_callback(keep_log, NULL);
    ddp_clear_error();
    CHILD_CHECK(ddp_log_level() == DDP_LOG_WARN);
    CHILD_CHECK(contains(logged, "DDP_LOG_LEVEL=loud: expected off, error, warn, info, debug or "
                                 "warning (logging warnings)"));
    CHILD_CHECK(ddp_last_error()[0] == '\0');
    return 0;
}

/* A bad DDP_NUM_THREADS: one thread, and a warning naming it. */
static int bad_num_threads(int rank, void *arg)
{
    (void)rank;
    (void)arg;
    setenv("DDP_NUM_THREADS", "4x", 1);
    unsetenv("OPENBLAS_NUM_THREADS");
    ddp_log_set_callback(keep_log, NULL);
    ddp_log_set_level(DDP_LOG_WARN);
    CHILD_CHECK(ddp_num_threads() == 1);
    CHILD_CHECK(contains(logged, "DDP_NUM_THREADS=4x: expected an integer from 1 to 4096 "
                                 "(using OPENBLAS_NUM_THREADS, else 1)"));
    return 0;
}

static void test_warnings_name_the_value(void **state)
{
    (void)state;
    assert_int_equal(run_children(1, bad_log_level, NULL, 30), 0);
    assert_int_equal(run_children(1, bad_num_threads, NULL, 30), 0);
}

/* The store and data readers fail their call. */
static void test_store_and_data_calls_fail(void **state)
{
    (void)state;
    job_init(&J);
    setenv("DDP_FILESTORE_COMPACT_BYTES", "-1", 1);
    ddp_store_t *st = NULL;
    int rc = ddp_store_file_create(J.path, 1, &st);
    unsetenv("DDP_FILESTORE_COMPACT_BYTES");
    assert_int_equal(rc, DDP_ERR_INVALID_ARG);
    assert_null(st);
    assert_non_null(strstr(ddp_last_error(), "DDP_FILESTORE_COMPACT_BYTES=-1: expected a size in "
                                             "bytes from 0 to 1 TiB"));
    job_cleanup(&J);
    setenv("DDP_DATA_CACHE", "no", 1);
    ddp_idx idx;
    rc = ddp_idx_read("tests/test_env.c", 0x803, &idx);
    unsetenv("DDP_DATA_CACHE");
    assert_int_equal(rc, DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "DDP_DATA_CACHE=no: expected 0 or 1"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_warnings_name_the_value), /* first: no log level read yet */
        cmocka_unit_test(test_readme_and_table_agree),
        cmocka_unit_test(test_table_entries),
        cmocka_unit_test(test_sources_read_only_listed_variables),
        cmocka_unit_test(test_size),
        cmocka_unit_test(test_int),
        cmocka_unit_test(test_usec),
        cmocka_unit_test(test_seconds),
        cmocka_unit_test(test_bool),
        cmocka_unit_test(test_word),
        cmocka_unit_test(test_string),
        cmocka_unit_test(test_unlisted_names_are_refused),
        cmocka_unit_test(test_bad_chunk_fails_group_creation),
        cmocka_unit_test(test_bad_sockbuf_fails_group_creation),
        cmocka_unit_test(test_store_and_data_calls_fail),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
