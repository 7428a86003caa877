/* Test fixtures for the data layer: a scratch folder, IDX files written raw
 * or gzip'ed (with zlib, independently of the reader), and small datasets.
 * Header-only (static functions): included by tests/test_idx.c,
 * tests/test_data_mnist.c and tests/test_loader.c. */
#ifndef DDP_TEST_DATA_FIXTURE_H
#define DDP_TEST_DATA_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "ddp.h"

/* A fresh folder under $TMPDIR (or /tmp); removed by fx_rmdir. */
static inline char *fx_mkdtemp(void)
{
    const char *base = getenv("TMPDIR");
    char *path = malloc(4096);
    snprintf(path, 4096, "%s/ddp-data-test-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(path)) {
        perror("mkdtemp");
        exit(1);
    }
    return path;
}

static inline void fx_rmdir(char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    free(dir);
}

/* cmocka setup/teardown: *state is a fresh scratch folder (char *). */
static inline int fx_setup(void **state)
{
    *state = fx_mkdtemp();
    return 0;
}

static inline int fx_teardown(void **state)
{
    fx_rmdir(*state);
    return 0;
}

/* A cmocka test that gets a scratch folder as *state. */
#define IN_TMPDIR(test) cmocka_unit_test_setup_teardown(test, fx_setup, fx_teardown)

/* dir/name into a static buffer (one at a time). */
static inline const char *fx_path(const char *dir, const char *name)
{
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    return buf;
}

static inline void fx_put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* An IDX file's bytes: magic, dims (ndim of them), then nbytes of payload.
 * Caller frees; *len receives the size. */
static inline uint8_t *fx_idx_bytes(uint32_t magic, int ndim, const uint32_t *dims,
                                    const uint8_t *payload, size_t nbytes, size_t *len)
{
    *len = 4 + 4 * (size_t)ndim + nbytes;
    uint8_t *b = malloc(*len ? *len : 1);
    fx_put_be32(b, magic);
    for (int i = 0; i < ndim; i++)
        fx_put_be32(b + 4 + 4 * i, dims[i]);
    if (nbytes)
        memcpy(b + 4 + 4 * ndim, payload, nbytes);
    return b;
}

/* Bytes compressed as one gzip member (zlib's deflate with the gzip
 * wrapper).  Caller frees. */
static inline uint8_t *fx_gzip(const uint8_t *src, size_t n, size_t *out_len)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        exit(1);
    size_t cap = deflateBound(&z, (uLong)n) + 64;
    uint8_t *out = malloc(cap);
    z.next_in = (Bytef *)(uintptr_t)src;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    if (deflate(&z, Z_FINISH) != Z_STREAM_END)
        exit(1);
    *out_len = z.total_out;
    deflateEnd(&z);
    return out;
}

static inline void fx_write(const char *path, const uint8_t *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(b, 1, n, f) != n) || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

/* Writes an IDX file at dir/name, gzip'ed when gz. */
static inline void fx_write_idx(const char *dir, const char *name, int gz, uint32_t magic,
                                int ndim, const uint32_t *dims, const uint8_t *payload,
                                size_t nbytes)
{
    size_t len, zlen;
    uint8_t *b = fx_idx_bytes(magic, ndim, dims, payload, nbytes, &len);
    if (gz) {
        uint8_t *z = fx_gzip(b, len, &zlen);
        fx_write(fx_path(dir, name), z, zlen);
        free(z);
    } else {
        fx_write(fx_path(dir, name), b, len);
    }
    free(b);
}

/* Pixel value of image i at position j in generated sets. */
static inline uint8_t fx_pixel(size_t i, size_t j) { return (uint8_t)(i * 31 + j * 7 + 3); }

/* A generated MNIST-format split: n images of rows x cols and labels
 * i % classes, as dir/<prefix>-images-idx3-ubyte[.gz] and labels. */
static inline void fx_write_split(const char *dir, const char *prefix, int gz, uint32_t n,
                                  uint32_t rows, uint32_t cols, int classes)
{
    size_t numel = (size_t)rows * cols;
    uint8_t *px = malloc(n * numel + 1), *lb = malloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < numel; j++)
            px[i * numel + j] = fx_pixel(i, j);
        lb[i] = (uint8_t)(i % (size_t)classes);
    }
    char name[128];
    uint32_t idims[3] = {n, rows, cols}, ldims[1] = {n};
    snprintf(name, sizeof name, "%s-images-idx3-ubyte%s", prefix, gz ? ".gz" : "");
    fx_write_idx(dir, name, gz, DDP_IDX_MAGIC_IMAGES, 3, idims, px, n * numel);
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte%s", prefix, gz ? ".gz" : "");
    fx_write_idx(dir, name, gz, DDP_IDX_MAGIC_LABELS, 1, ldims, lb, n);
    free(px);
    free(lb);
}

#endif
