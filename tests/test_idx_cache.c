/* Tests of the decompressed cache of gzip'ed IDX files (src/data/
 * idx_cache.c) on real files in a scratch folder: hits and repairs, the
 * size cap with least recently used entries out, entries of vanished or
 * changed sources removed, what is not an entry left alone, a bad
 * DDP_DATA_CACHE_MAX_BYTES, and several processes sharing one folder. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/rng.h"
#include "data_fixture.h"
#include "fork_children.h"

static char saved_dir[4096];
static int had_dir;

/* *state: a scratch folder; DDP_DATA_CACHE_DIR is its "cache" subfolder
 * (tests/run.sh's own is put back at the end). */
static int setup(void **state)
{
    fx_setup(state);
    const char *was = getenv("DDP_DATA_CACHE_DIR");
    had_dir = was != NULL;
    snprintf(saved_dir, sizeof saved_dir, "%s", was ? was : "");
    char cache[1024];
    snprintf(cache, sizeof cache, "%s/cache", (char *)*state);
    setenv("DDP_DATA_CACHE_DIR", cache, 1);
    unsetenv("DDP_DATA_CACHE_MAX_BYTES");
    return 0;
}

static int teardown(void **state)
{
    if (had_dir)
        setenv("DDP_DATA_CACHE_DIR", saved_dir, 1);
    else
        unsetenv("DDP_DATA_CACHE_DIR");
    unsetenv("DDP_DATA_CACHE_MAX_BYTES");
    return fx_teardown(state);
}

#define IN_CACHE_DIR(test) cmocka_unit_test_setup_teardown(test, setup, teardown)

static uint8_t *payload(size_t n, unsigned seed)
{
    uint8_t *p = malloc(n);
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 13 + seed * 7 + 1);
    return p;
}

/* Regular files (not links) in dir: how many start with prefix (NULL: any)
 * and end with suffix, their total size, the path of the last one. */
static int count_files(const char *dir, const char *prefix, const char *suffix, long *bytes,
                       char *last, size_t len)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    if (bytes)
        *bytes = 0;
    while (d && (e = readdir(d))) {
        char path[4500];
        struct stat st;
        size_t nl = strlen(e->d_name), sl = strlen(suffix);
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode) || nl < sl ||
            strcmp(e->d_name + nl - sl, suffix) != 0 ||
            (prefix && strncmp(e->d_name, prefix, strlen(prefix)) != 0))
            continue;
        n++;
        if (bytes)
            *bytes += (long)st.st_size;
        if (last)
            snprintf(last, len, "%s", path);
    }
    if (d)
        closedir(d);
    return n;
}

static int entries(const char *cache, const char *source_name)
{
    return count_files(cache, source_name, ".idx", NULL, NULL, 0);
}

/* dir/name, gzip'ed: 5 images of 3 x 4 (an entry of 76 bytes). */
static void write_source(const char *dir, const char *name, unsigned seed)
{
    uint32_t dims[3] = {5, 3, 4};
    uint8_t *p = payload(60, seed);
    fx_write_idx(dir, name, 1, DDP_IDX_MAGIC_IMAGES, 3, dims, p, 60);
    free(p);
}

/* Reads dir/name and checks its bytes against write_source(seed). */
static void read_source(const char *dir, const char *name, unsigned seed)
{
    ddp_idx idx;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (ddp_idx_read(path, DDP_IDX_MAGIC_IMAGES, &idx) != 0)
        fail_msg("%s: %s", name, ddp_last_error());
    uint8_t *p = payload(60, seed);
    assert_int_equal(idx.count, 5);
    assert_memory_equal(idx.data, p, 60);
    free(p);
    ddp_idx_destroy(&idx);
    sleep_s(0.02); /* the next use is later on the file system's clock */
}

static void test_decompressed_cache(void **state)
{
    const char *dir = *state;
    char cache[1024], entry[4500];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    write_source(dir, "img.gz", 0);
    for (int round = 0; round < 3; round++) {
        read_source(dir, "img.gz", 0);
        /* One decompressed copy: header (16 bytes) and the 60 item bytes. */
        long bytes;
        assert_int_equal(count_files(cache, NULL, "", &bytes, entry, sizeof entry), 1);
        assert_int_equal(bytes, 76);
        if (round == 1) /* damage it: the next read repairs it */
            assert_int_equal(truncate(entry, 10), 0);
    }
    /* A changed source (same size) misses the old entry, which goes. */
    write_source(dir, "img.gz", 1);
    read_source(dir, "img.gz", 1);
    assert_int_equal(entries(cache, "img.gz-"), 1);
    /* Raw sources are not cached; DDP_DATA_CACHE=0 turns caching off. */
    snprintf(cache, sizeof cache, "%s/cache2", dir);
    setenv("DDP_DATA_CACHE_DIR", cache, 1);
    uint32_t dims[3] = {5, 3, 4};
    uint8_t *p = payload(60, 0);
    fx_write_idx(dir, "raw", 0, DDP_IDX_MAGIC_IMAGES, 3, dims, p, 60);
    free(p);
    read_source(dir, "raw", 0);
    setenv("DDP_DATA_CACHE", "0", 1);
    read_source(dir, "img.gz", 1);
    unsetenv("DDP_DATA_CACHE");
    assert_int_equal(count_files(cache, NULL, "", NULL, NULL, 0), 0);
}

/* A cap of two entries: a third pushes out the one used least recently
 * (a hit counts as a use). */
static void test_size_cap_least_recently_used(void **state)
{
    const char *dir = *state;
    char cache[1024];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    setenv("DDP_DATA_CACHE_MAX_BYTES", "160", 1);
    write_source(dir, "a.gz", 1);
    write_source(dir, "b.gz", 2);
    write_source(dir, "c.gz", 3);
    read_source(dir, "a.gz", 1);
    read_source(dir, "b.gz", 2);
    read_source(dir, "a.gz", 1); /* a hit: b is now the least recently used */
    read_source(dir, "c.gz", 3);
    assert_int_equal(entries(cache, "a.gz-"), 1);
    assert_int_equal(entries(cache, "b.gz-"), 0);
    assert_int_equal(entries(cache, "c.gz-"), 1);
    read_source(dir, "b.gz", 2); /* decompressed again; a goes */
    assert_int_equal(entries(cache, "a.gz-"), 0);
    assert_int_equal(entries(cache, "b.gz-"), 1);
    assert_int_equal(entries(cache, "c.gz-"), 1);
    long bytes;
    assert_int_equal(count_files(cache, NULL, ".idx", &bytes, NULL, 0), 2);
    assert_true(bytes <= 160);
    /* An entry larger than the cap is not written at all. */
    setenv("DDP_DATA_CACHE_MAX_BYTES", "75", 1);
    write_source(dir, "d.gz", 4);
    read_source(dir, "d.gz", 4);
    assert_int_equal(entries(cache, "d.gz-"), 0);
    assert_int_equal(count_files(cache, NULL, ".idx", NULL, NULL, 0), 2);
}

static void test_stale_entries_removed(void **state)
{
    const char *dir = *state;
    char cache[1024];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    write_source(dir, "gone.gz", 1);
    write_source(dir, "changed.gz", 2);
    read_source(dir, "gone.gz", 1);
    read_source(dir, "changed.gz", 2);
    assert_int_equal(entries(cache, "gone.gz-"), 1);
    assert_int_equal(count_files(cache, NULL, "", NULL, NULL, 0), 2);
    /* What is not an entry stays, however old: other files; so does an
     * entry's fresh temporary file (a writer at work); an entry's temporary
     * file an hour old (its writer died) goes. */
#define ENTRY "a-0123456789abcdef-76-1700000000.000000003-0123456789abcdef.idx"
    const char *keep[] = {"notes.txt", "x.idx", "notes.idx.Qq11Qq.tmp", ENTRY ".Ab12Cd.tmp"};
    struct timespec hour_ago[2] = {{time(NULL) - 3600, 0}, {time(NULL) - 3600, 0}};
    for (int i = 0; i < 4; i++) {
        fx_write(fx_path(cache, keep[i]), (const uint8_t *)"keep", 4);
        if (i < 3)
            assert_int_equal(utimensat(AT_FDCWD, fx_path(cache, keep[i]), hour_ago, 0), 0);
    }
    const char *old = ENTRY ".Xy34Zw.tmp";
    fx_write(fx_path(cache, old), (const uint8_t *)"old", 3);
    assert_int_equal(utimensat(AT_FDCWD, fx_path(cache, old), hour_ago, 0), 0);
    /* The source of one entry vanishes, another's changes elsewhere. */
    assert_int_equal(unlink(fx_path(dir, "gone.gz")), 0);
    write_source(dir, "changed.gz", 3);
    write_source(dir, "new.gz", 4);
    read_source(dir, "new.gz", 4); /* a write: the folder is swept */
    assert_int_equal(entries(cache, "gone.gz-"), 0);
    assert_int_equal(entries(cache, "changed.gz-"), 0);
    assert_int_equal(entries(cache, "new.gz-"), 1);
    assert_int_equal(access(fx_path(cache, old), F_OK), -1);
    for (int i = 0; i < 4; i++)
        if (access(fx_path(cache, keep[i]), F_OK) != 0)
            fail_msg("the sweep removed %s, which is not a cache entry", keep[i]);
    /* Only new.gz's link to its source is left. */
    DIR *d = opendir(cache);
    struct dirent *e;
    int links = 0;
    while ((e = readdir(d))) {
        struct stat st;
        if (lstat(fx_path(cache, e->d_name), &st) == 0 && S_ISLNK(st.st_mode)) {
            links++;
            assert_int_equal(strncmp(e->d_name, "new.gz-", 7), 0);
        }
    }
    closedir(d);
    assert_int_equal(links, 1);
}

static void test_bad_max_bytes(void **state)
{
    const char *dir = *state;
    write_source(dir, "a.gz", 1);
    const char *bad[] = {"12x", "0", "-5", " "};
    for (int i = 0; i < 4; i++) {
        setenv("DDP_DATA_CACHE_MAX_BYTES", bad[i], 1);
        ddp_idx idx;
        assert_int_equal(ddp_idx_read(fx_path(dir, "a.gz"), DDP_IDX_MAGIC_IMAGES, &idx),
                         DDP_ERR_INVALID_ARG);
        assert_null(idx.data);
        char want[128];
        snprintf(want, sizeof want, "DDP_DATA_CACHE_MAX_BYTES=%s: expected a size in bytes",
                 bad[i]);
        if (!strstr(ddp_last_error(), want))
            fail_msg("message lacks \"%s\": %s", want, ddp_last_error());
    }
}

/* Ranks sharing one folder with a cap of two entries among four sources:
 * entries are written, hit and evicted under each other's feet, and every
 * read must still return the source's bytes. */
#define SHARED_ITEMS 2000
#define SHARED_ENTRY (16 + SHARED_ITEMS * 28 * 28)

static int shared_rank(int rank, void *arg)
{
    const char *dir = arg;
    ddp__rng r;
    ddp__rng_seed(&r, (uint64_t)rank + 1);
    uint8_t *want = malloc((size_t)SHARED_ITEMS * 784);
    for (int i = 0; i < 40; i++) {
        unsigned k = (unsigned)ddp__rng_below(&r, 4);
        char name[32];
        snprintf(name, sizeof name, "s%u.gz", k);
        ddp_idx idx;
        CHILD_CHECK(ddp_idx_read(fx_path(dir, name), DDP_IDX_MAGIC_IMAGES, &idx) == 0);
        for (size_t j = 0; j < (size_t)SHARED_ITEMS * 784; j++)
            want[j] = (uint8_t)(j * 13 + k * 7 + 1);
        CHILD_CHECK(idx.count == SHARED_ITEMS);
        CHILD_CHECK(memcmp(idx.data, want, (size_t)SHARED_ITEMS * 784) == 0);
        ddp_idx_destroy(&idx);
    }
    free(want);
    return 0;
}

static void test_ranks_share_a_bounded_folder(void **state)
{
    const char *dir = *state;
    char cache[1024], cap[32];
    snprintf(cache, sizeof cache, "%s/cache", dir);
    snprintf(cap, sizeof cap, "%d", 2 * SHARED_ENTRY + 100);
    setenv("DDP_DATA_CACHE_MAX_BYTES", cap, 1);
    uint32_t dims[3] = {SHARED_ITEMS, 28, 28};
    for (unsigned k = 0; k < 4; k++) {
        uint8_t *p = payload((size_t)SHARED_ITEMS * 784, k);
        char name[32];
        snprintf(name, sizeof name, "s%u.gz", k);
        fx_write_idx(dir, name, 1, DDP_IDX_MAGIC_IMAGES, 3, dims, p, (size_t)SHARED_ITEMS * 784);
        free(p);
    }
    assert_int_equal(run_children(4, shared_rank, (void *)dir, 120), 0);
    /* No temporary file left; the entries within the cap, give or take
     * the entry of a writer whose sweep ran while another renamed. */
    long bytes;
    assert_int_equal(count_files(cache, NULL, ".tmp", NULL, NULL, 0), 0);
    int n = count_files(cache, NULL, ".idx", &bytes, NULL, 0);
    assert_true(n >= 1);
    assert_true(bytes <= 3 * SHARED_ENTRY);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        IN_CACHE_DIR(test_decompressed_cache),
        IN_CACHE_DIR(test_size_cap_least_recently_used),
        IN_CACHE_DIR(test_stale_entries_removed),
        IN_CACHE_DIR(test_bad_max_bytes),
        IN_CACHE_DIR(test_ranks_share_a_bounded_folder),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
