/* Tests of the IDX reader (src/data/idx.c) on files written here, raw and
 * gzip'ed with zlib, and on every malformed variant: each gives its code and
 * a message naming the file and what is wrong. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <sys/stat.h>
#include <unistd.h>

#include "base/rng.h"
#include "data_fixture.h"

/* Reads dir/name expecting failure with code and every fragment in the
 * message (NULL-terminated list). */
static void expect_error(const char *dir, const char *name, uint32_t magic, int code, ...)
{
    ddp_idx idx;
    memset(&idx, 0xab, sizeof idx);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int rc = ddp_idx_read(path, magic, &idx);
    if (rc != code)
        fail_msg("%s: got %s (%s), expected %s", name, ddp_err_name(rc), ddp_last_error(),
                 ddp_err_name(code));
    assert_null(idx.data);
    assert_int_equal(idx.count, 0);
    const char *msg = ddp_last_error();
    if (!strstr(msg, path))
        fail_msg("message does not name the file: %s", msg);
    va_list ap;
    va_start(ap, code);
    for (const char *frag; (frag = va_arg(ap, const char *));)
        if (!strstr(msg, frag))
            fail_msg("message lacks \"%s\": %s", frag, msg);
    va_end(ap);
}

static uint8_t *payload(size_t n)
{
    uint8_t *p = malloc(n);
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 13 + 1);
    return p;
}

static void test_read_raw_and_gzip(void **state)
{
    const char *dir = *state;
    uint32_t dims[3] = {5, 3, 4};
    uint8_t *p = payload(60);
    fx_write_idx(dir, "raw", 0, DDP_IDX_MAGIC_IMAGES, 3, dims, p, 60);
    fx_write_idx(dir, "gz.gz", 1, DDP_IDX_MAGIC_IMAGES, 3, dims, p, 60);
    /* gzip is found by its magic bytes, not by the name. */
    fx_write_idx(dir, "gz-without-suffix", 1, DDP_IDX_MAGIC_IMAGES, 3, dims, p, 60);
    fx_write_idx(dir, "raw-with-suffix.gz", 0, DDP_IDX_MAGIC_IMAGES, 3, dims, p, 60);
    const char *names[] = {"raw", "gz.gz", "gz-without-suffix", "raw-with-suffix.gz"};
    for (int i = 0; i < 4; i++) {
        ddp_idx idx;
        int rc = ddp_idx_read(fx_path(dir, names[i]), DDP_IDX_MAGIC_IMAGES, &idx);
        if (rc != 0)
            fail_msg("%s: %s", names[i], ddp_last_error());
        assert_int_equal(idx.ndim, 3);
        assert_int_equal(idx.count, 5);
        assert_int_equal(idx.dims[1], 3);
        assert_int_equal(idx.dims[2], 4);
        assert_int_equal(idx.dims[3], 0);
        assert_int_equal(idx.item_bytes, 12);
        assert_memory_equal(idx.data, p, 60);
        ddp_idx_destroy(&idx);
        assert_null(idx.data);
        ddp_idx_destroy(&idx); /* repeated: no-op */
    }
    ddp_idx_destroy(NULL);
    free(p);
}

static void test_read_labels_and_large(void **state)
{
    const char *dir = *state;
    /* Large enough for the huge-page buffer path (>= 2 MiB). */
    size_t n = 3u << 20;
    uint8_t *p = payload(n);
    uint32_t dims[1] = {(uint32_t)n};
    fx_write_idx(dir, "big.gz", 1, DDP_IDX_MAGIC_LABELS, 1, dims, p, n);
    ddp_idx idx;
    assert_int_equal(ddp_idx_read(fx_path(dir, "big.gz"), DDP_IDX_MAGIC_LABELS, &idx), 0);
    assert_int_equal(idx.count, n);
    assert_int_equal(idx.item_bytes, 1);
    assert_memory_equal(idx.data, p, n);
    ddp_idx_destroy(&idx);
    free(p);
}

static void test_concatenated_gzip_members(void **state)
{
    const char *dir = *state;
    /* gzip -c a >x; gzip -c b >>x: one stream of a then b (RFC 1952). */
    uint32_t dims[1] = {6};
    uint8_t lb[6] = {1, 2, 3, 4, 5, 6};
    size_t len, z1, z2;
    uint8_t *b = fx_idx_bytes(DDP_IDX_MAGIC_LABELS, 1, dims, lb, 6, &len);
    uint8_t *a = fx_gzip(b, 9, &z1), *c = fx_gzip(b + 9, len - 9, &z2);
    uint8_t *both = malloc(z1 + z2);
    memcpy(both, a, z1);
    memcpy(both + z1, c, z2);
    fx_write(fx_path(dir, "two-members"), both, z1 + z2);
    ddp_idx idx;
    assert_int_equal(ddp_idx_read(fx_path(dir, "two-members"), DDP_IDX_MAGIC_LABELS, &idx),
                     0);
    assert_memory_equal(idx.data, lb, 6);
    ddp_idx_destroy(&idx);
    free(b);
    free(a);
    free(c);
    free(both);
}

static void test_bad_magic(void **state)
{
    const char *dir = *state;
    uint32_t dims3[3] = {2, 2, 2}, dims1[1] = {2};
    uint8_t p[8] = {0};
    fx_write_idx(dir, "images", 0, DDP_IDX_MAGIC_IMAGES, 3, dims3, p, 8);
    expect_error(dir, "images", DDP_IDX_MAGIC_LABELS, DDP_ERR_FORMAT,
                 "bad magic 0x00000803, expected 0x00000801 (IDX labels): 3 dimensions, "
                 "expected 1", NULL);
    fx_write_idx(dir, "floats.gz", 1, 0x00000D01, 1, dims1, p, 8);
    expect_error(dir, "floats.gz", DDP_IDX_MAGIC_LABELS, DDP_ERR_FORMAT,
                 "bad magic 0x00000d01", "elements are float", NULL);
    fx_write_idx(dir, "png", 0, 0x89504e47, 1, dims1, p, 8);
    expect_error(dir, "png", DDP_IDX_MAGIC_IMAGES, DDP_ERR_FORMAT,
                 "bad magic 0x89504e47, expected 0x00000803 (IDX images): not an IDX file",
                 NULL);
    /* A magic that is not an unsigned-byte IDX magic is the caller's error. */
    ddp_idx idx;
    assert_int_equal(ddp_idx_read(fx_path(dir, "png"), 0x0903, &idx), DDP_ERR_INVALID_ARG);
    assert_int_equal(ddp_idx_read(fx_path(dir, "png"), 0x0805, &idx), DDP_ERR_INVALID_ARG);
    assert_non_null(strstr(ddp_last_error(), "not an unsigned-byte IDX magic"));
}

static void test_truncated(void **state)
{
    const char *dir = *state;
    /* Header says 10 images of 2x3, file holds 7 and a half. */
    uint32_t dims[3] = {10, 2, 3};
    uint8_t *p = payload(45);
    fx_write_idx(dir, "short", 0, DDP_IDX_MAGIC_IMAGES, 3, dims, p, 45);
    expect_error(dir, "short", DDP_IDX_MAGIC_IMAGES, DDP_ERR_FORMAT,
                 "short: truncated: header says 10 items, file holds 7", NULL);
    fx_write_idx(dir, "short.gz", 1, DDP_IDX_MAGIC_IMAGES, 3, dims, p, 45);
    expect_error(dir, "short.gz", DDP_IDX_MAGIC_IMAGES, DDP_ERR_FORMAT,
                 "short.gz: truncated: header says 10 items, file holds 7", NULL);
    free(p);

    /* Inside the header. */
    uint8_t hdr[6] = {0, 0, 8, 3, 0, 0};
    fx_write(fx_path(dir, "hdr"), hdr, 6);
    expect_error(dir, "hdr", DDP_IDX_MAGIC_IMAGES, DDP_ERR_FORMAT,
                 "truncated: the file ends inside the IDX header (6 of 16 bytes)", NULL);
    fx_write(fx_path(dir, "two"), hdr, 2);
    expect_error(dir, "two", DDP_IDX_MAGIC_IMAGES, DDP_ERR_FORMAT,
                 "ends inside the IDX header (2 of 16 bytes)", NULL);
    fx_write(fx_path(dir, "empty"), hdr, 0);
    expect_error(dir, "empty", DDP_IDX_MAGIC_IMAGES, DDP_ERR_FORMAT, "empty file", NULL);

    /* A header claiming 4 billion 28x28 images in a tiny gzip file: refused
     * without allocating 3 TB. */
    uint32_t huge[3] = {0xffffffffu, 28, 28};
    fx_write_idx(dir, "huge.gz", 1, DDP_IDX_MAGIC_IMAGES, 3, huge, hdr, 6);
    expect_error(dir, "huge.gz", DDP_IDX_MAGIC_IMAGES, DDP_ERR_FORMAT,
                 "truncated: header says 4294967295 items, file holds 0", NULL);
}

/* A gzip file cut short, as an interrupted download leaves it. */
static void test_truncated_gzip_stream(void **state)
{
    const char *dir = *state;
    size_t n = 60000, len, zlen;
    uint8_t *lb = malloc(n);
    ddp__rng r;
    ddp__rng_seed(&r, 7);
    for (size_t i = 0; i < n; i++)
        lb[i] = (uint8_t)ddp__rng_below(&r, 10); /* random: compresses poorly */
    uint32_t dims[1] = {(uint32_t)n};
    uint8_t *b = fx_idx_bytes(DDP_IDX_MAGIC_LABELS, 1, dims, lb, n, &len);
    uint8_t *z = fx_gzip(b, len, &zlen);
    fx_write(fx_path(dir, "train-labels-idx1-ubyte.gz"), z, zlen / 2);
    expect_error(dir, "train-labels-idx1-ubyte.gz", DDP_IDX_MAGIC_LABELS, DDP_ERR_FORMAT,
                 "train-labels-idx1-ubyte.gz: truncated: header says 60000 items, file "
                 "holds ", NULL);
    /* The number held is what inflate got from half the stream. */
    const char *held = strstr(ddp_last_error(), "file holds ") + strlen("file holds ");
    long m = strtol(held, NULL, 10);
    assert_true(m > 10000 && m < 50000);

    /* Everything but the 8-byte trailer (CRC-32, length). */
    fx_write(fx_path(dir, "no-trailer.gz"), z, zlen - 8);
    expect_error(dir, "no-trailer.gz", DDP_IDX_MAGIC_LABELS, DDP_ERR_FORMAT,
                 "truncated: the gzip stream ends before its trailer", NULL);
    free(lb);
    free(b);
    free(z);
}

static void test_corrupt_gzip(void **state)
{
    const char *dir = *state;
    uint32_t dims[1] = {1000};
    uint8_t *p = payload(1000);
    size_t len, zlen;
    uint8_t *b = fx_idx_bytes(DDP_IDX_MAGIC_LABELS, 1, dims, p, 1000, &len);
    uint8_t *z = fx_gzip(b, len, &zlen);

    z[zlen - 8] ^= 0x55; /* CRC-32 of the data */
    fx_write(fx_path(dir, "crc.gz"), z, zlen);
    expect_error(dir, "crc.gz", DDP_IDX_MAGIC_LABELS, DDP_ERR_FORMAT,
                 "crc.gz: corrupt gzip data: incorrect data check", NULL);
    z[zlen - 8] ^= 0x55;

    uint8_t saved = z[10];
    z[10] = 0xff; /* first deflate block header: type 3 does not exist */
    fx_write(fx_path(dir, "block.gz"), z, zlen);
    expect_error(dir, "block.gz", DDP_IDX_MAGIC_LABELS, DDP_ERR_FORMAT,
                 "corrupt gzip data: invalid block type", NULL);
    z[10] = saved;

    z[3] = 0xe0; /* reserved flag bits in the gzip header */
    fx_write(fx_path(dir, "flags.gz"), z, zlen);
    expect_error(dir, "flags.gz", DDP_IDX_MAGIC_LABELS, DDP_ERR_FORMAT,
                 "corrupt gzip data: unknown header flags set", NULL);
    free(p);
    free(b);
    free(z);
}

static void test_trailing_data(void **state)
{
    const char *dir = *state;
    uint32_t dims[1] = {10};
    uint8_t *p = payload(15);
    fx_write_idx(dir, "tail", 0, DDP_IDX_MAGIC_LABELS, 1, dims, p, 15);
    expect_error(dir, "tail", DDP_IDX_MAGIC_LABELS, DDP_ERR_FORMAT,
                 "tail: trailing data: 5 bytes after the 10 items the header declares", NULL);
    fx_write_idx(dir, "tail.gz", 1, DDP_IDX_MAGIC_LABELS, 1, dims, p, 15);
    expect_error(dir, "tail.gz", DDP_IDX_MAGIC_LABELS, DDP_ERR_FORMAT,
                 "trailing data: 5 bytes after the 10 items the header declares", NULL);

    /* Garbage after the gzip stream itself. */
    size_t len, zlen;
    uint8_t *b = fx_idx_bytes(DDP_IDX_MAGIC_LABELS, 1, dims, p, 10, &len);
    uint8_t *z = fx_gzip(b, len, &zlen);
    z = realloc(z, zlen + 7);
    memcpy(z + zlen, "garbage", 7);
    fx_write(fx_path(dir, "garbage.gz"), z, zlen + 7);
    expect_error(dir, "garbage.gz", DDP_IDX_MAGIC_LABELS, DDP_ERR_FORMAT,
                 "7 bytes of garbage after the gzip stream", NULL);
    free(p);
    free(b);
    free(z);
}

static void test_bad_dimensions_and_open_errors(void **state)
{
    const char *dir = *state;
    uint32_t dims[3] = {4, 0, 28};
    uint8_t p[4] = {0};
    fx_write_idx(dir, "zero", 0, DDP_IDX_MAGIC_IMAGES, 3, dims, p, 0);
    expect_error(dir, "zero", DDP_IDX_MAGIC_IMAGES, DDP_ERR_FORMAT,
                 "dimension 1 is 0 in the header", NULL);
    uint32_t none[1] = {0};
    fx_write_idx(dir, "none", 0, DDP_IDX_MAGIC_LABELS, 1, none, p, 0);
    expect_error(dir, "none", DDP_IDX_MAGIC_LABELS, DDP_ERR_FORMAT,
                 "dimension 0 is 0 in the header", NULL);
    expect_error(dir, "missing", DDP_IDX_MAGIC_LABELS, DDP_ERR_NOT_FOUND,
                 "missing: No such file or directory", NULL);
    expect_error(dir, ".", DDP_IDX_MAGIC_LABELS, DDP_ERR_IO, "a directory, not a regular file",
                 NULL);
    /* A FIFO without a writer: refused before any read (a blocking open or
     * read would wait forever; alarm turns a hang into a failure). */
    char fifo[4096];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    alarm(20);
    expect_error(dir, "fifo", DDP_IDX_MAGIC_LABELS, DDP_ERR_IO, "a FIFO, not a regular file",
                 NULL);
    alarm(0);
    ddp_idx idx;
    assert_int_equal(ddp_idx_read(NULL, DDP_IDX_MAGIC_LABELS, &idx), DDP_ERR_INVALID_ARG);
}

/* Random damage to valid files, raw and gzip'ed (bytes flipped, cut,
 * appended): every read either succeeds with the declared shape or fails
 * with DDP_ERR_FORMAT naming the file; never a crash (ASan watches). */
static void test_random_damage(void **state)
{
    const char *dir = *state;
    int rounds = getenv("DDP_TEST_SANITIZER") ? 300 : 1000;
    uint32_t dims[3] = {20, 7, 9};
    uint8_t *p = payload(20 * 63);
    size_t len, zlen;
    uint8_t *raw = fx_idx_bytes(DDP_IDX_MAGIC_IMAGES, 3, dims, p, 20 * 63, &len);
    uint8_t *gz = fx_gzip(raw, len, &zlen);
    ddp__rng r;
    ddp__rng_seed(&r, 2024);
    int ok = 0, bad = 0;
    uint8_t *buf = malloc(len + zlen + 64);
    char path[4096];
    snprintf(path, sizeof path, "%s/damaged", dir);
    for (int i = 0; i < rounds; i++) {
        int use_gz = i & 1;
        size_t n = use_gz ? zlen : len;
        memcpy(buf, use_gz ? gz : raw, n);
        switch (ddp__rng_below(&r, 3)) {
        case 0: /* flip 1-3 bytes */
            for (int f = 0, m = 1 + (int)ddp__rng_below(&r, 3); f < m; f++)
                buf[ddp__rng_below(&r, n)] ^= (uint8_t)(1 + ddp__rng_below(&r, 255));
            break;
        case 1: /* cut */
            n = ddp__rng_below(&r, n);
            break;
        default: /* append */
            for (int a = 0, m = 1 + (int)ddp__rng_below(&r, 40); a < m; a++)
                buf[n++] = (uint8_t)ddp__rng_next(&r);
        }
        fx_write(path, buf, n);
        ddp_idx idx;
        int rc = ddp_idx_read(path, DDP_IDX_MAGIC_IMAGES, &idx);
        if (rc == 0) {
            assert_int_equal(idx.count * idx.item_bytes, (size_t)idx.dims[0] * idx.dims[1] *
                                                             idx.dims[2]);
            ddp_idx_destroy(&idx);
            ok++;
        } else {
            if (rc != DDP_ERR_FORMAT || !strstr(ddp_last_error(), path))
                fail_msg("round %d: %s: %s", i, ddp_err_name(rc), ddp_last_error());
            assert_null(idx.data);
            bad++;
        }
    }
    assert_true(bad > rounds / 2);
    print_message("%d damaged files read, %d refused\n", ok, bad);
    free(buf);
    free(p);
    free(raw);
    free(gz);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        IN_TMPDIR(test_read_raw_and_gzip),
        IN_TMPDIR(test_read_labels_and_large),
        IN_TMPDIR(test_concatenated_gzip_members),
        IN_TMPDIR(test_bad_magic),
        IN_TMPDIR(test_truncated),
        IN_TMPDIR(test_truncated_gzip_stream),
        IN_TMPDIR(test_corrupt_gzip),
        IN_TMPDIR(test_trailing_data),
        IN_TMPDIR(test_bad_dimensions_and_open_errors),
        IN_TMPDIR(test_random_damage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
