/* safetensors: the exact bytes we write (built by hand here), round trips,
 * files from other writers, mismatches named precisely, malformed files
 * rejected with clear messages; and the strict JSON parser under it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/json.h"
#include "nn/safetensors.h"
#include "ddp.h"

static char dir[256];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/ddp-test-st-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *path_of(const char *name)
{
    static char p[4][512]; /* a few live at once */
    static int next;
    char *b = p[next++ % 4];
    snprintf(b, sizeof p[0], "%s/%s", dir, name);
    return b;
}

/* Writes an 8-byte little-endian length (hlen, or the header's length when
 * hlen is UINT64_MAX), the header and data bytes. */
static const char *write_raw(const char *name, const char *header, uint64_t hlen,
                             const void *data, size_t dlen)
{
    const char *p = path_of(name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    uint64_t n = hlen == UINT64_MAX ? strlen(header) : hlen;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++)
        len8[i] = (unsigned char)(n >> (8 * i));
    assert_int_equal(fwrite(len8, 1, 8, f), 8);
    assert_int_equal(fwrite(header, 1, strlen(header), f), strlen(header));
    if (dlen)
        assert_int_equal(fwrite(data, 1, dlen, f), dlen);
    fclose(f);
    return p;
}

static unsigned char *read_file(const char *p, size_t *len)
{
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*len);
    assert_int_equal(fread(b, 1, *len, f), *len);
    fclose(f);
    return b;
}

/* Sequential(Linear(2, 3), ReLU, Linear(3, 1)) with values i/8. */
static ddp_model_t *tiny(uint64_t seed, int hidden)
{
    ddp_module_t *l[3], *seq;
    ddp_model_t *m;
    assert_int_equal(ddp_linear_create(2, hidden, 1, seed, &l[0]), 0);
    assert_int_equal(ddp_relu_create(&l[1]), 0);
    assert_int_equal(ddp_linear_create(hidden, 1, 1, seed + 1, &l[2]), 0);
    assert_int_equal(ddp_sequential_create(l, 3, &seq), 0);
    assert_int_equal(ddp_model_from_module(seq, &m), 0);
    return m;
}

static void test_exact_bytes_and_round_trip(void **state)
{
    (void)state;
    ddp_model_t *m = tiny(1, 3);
    size_t n;
    float *p = ddp_model_param_block(m, &n);
    assert_int_equal(n, 13);
    for (size_t i = 0; i < n; i++)
        p[i] = (float)i / 8 - 0.75f;
    const char *path = path_of("tiny.safetensors");
    assert_int_equal(ddp_model_save_safetensors(m, path), 0);

    /* The bytes, by hand: header padded with spaces to a multiple of 8. */
    char header[512] = "{\"0.weight\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[0,24]},"
                       "\"0.bias\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[24,36]},"
                       "\"2.weight\":{\"dtype\":\"F32\",\"shape\":[1,3],\"data_offsets\":[36,48]},"
                       "\"2.bias\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[48,52]},"
                       "\"__metadata__\":{\"format\":\"pt\"}}";
    while (strlen(header) % 8)
        strcat(header, " ");
    size_t hl = strlen(header), len;
    unsigned char *got = read_file(path, &len);
    assert_int_equal(len, 8 + hl + 52);
    unsigned char expect_len[8] = {(unsigned char)hl, (unsigned char)(hl >> 8), 0, 0, 0, 0, 0, 0};
    assert_memory_equal(got, expect_len, 8);
    assert_memory_equal(got + 8, header, hl);
    for (size_t i = 0; i < n; i++) { /* little-endian IEEE 754 */
        uint32_t bits;
        memcpy(&bits, &p[i], 4);
        for (int b = 0; b < 4; b++)
            assert_int_equal(got[8 + hl + 4 * i + (size_t)b], (bits >> (8 * b)) & 0xff);
    }
    free(got);
    assert_int_equal(access(path_of("tiny.safetensors.tmp"), F_OK), -1); /* renamed away */

    ddp_model_t *m2 = tiny(99, 3);
    float *p2 = ddp_model_param_block(m2, NULL);
    assert_memory_not_equal(p, p2, n * sizeof(float));
    assert_int_equal(ddp_model_load_safetensors(m2, path), 0);
    assert_memory_equal(p, p2, n * sizeof(float));
    ddp_model_destroy(m2);
    ddp_model_destroy(m);
}

/* Another writer: other member order, whitespace, no metadata. */
static void test_foreign_file(void **state)
{
    (void)state;
    float data[13];
    for (int i = 0; i < 13; i++)
        data[i] = (float)(i * i) / 16;
    /* buffer order: 2.bias, 0.weight, 0.bias, 2.weight */
    const char *h = " { \"2.weight\" : { \"shape\": [1, 3], \"dtype\": \"F32\", \"data_offsets\": [40, 52] },\n"
                    "\"0.bias\": {\"data_offsets\": [28, 40], \"dtype\": \"F32\", \"shape\": [3]},\n"
                    "\"2.bias\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},\n"
                    "\"0.weight\": {\"dtype\": \"F32\", \"shape\": [3, 2], \"data_offsets\": [4, 28]}}";
    /* a header may not start with a space: strip it */
    const char *path = write_raw("foreign.safetensors", h + 1, UINT64_MAX, data, sizeof data);
    ddp_model_t *m = tiny(5, 3);
    assert_int_equal(ddp_model_load_safetensors(m, path), 0);
    assert_true(ddp_model_find_param(m, "2.bias")->data[0] == data[0]);
    assert_memory_equal(ddp_model_find_param(m, "0.weight")->data, data + 1, 24);
    assert_memory_equal(ddp_model_find_param(m, "0.bias")->data, data + 7, 12);
    assert_memory_equal(ddp_model_find_param(m, "2.weight")->data, data + 10, 12);
    ddp_model_destroy(m);
}

static void test_mismatch_named(void **state)
{
    (void)state;
    ddp_model_t *small = tiny(1, 3), *big = tiny(1, 4);
    const char *path = path_of("small.safetensors");
    assert_int_equal(ddp_model_save_safetensors(small, path), 0);
    float before[32];
    size_t n;
    float *block = ddp_model_param_block(big, &n);
    assert_int_equal(n, 17);
    memcpy(before, block, n * sizeof(float));
    assert_int_equal(ddp_model_load_safetensors(big, path), DDP_ERR_MISMATCH);
    const char *e = ddp_last_error();
    assert_non_null(strstr(e, "3 differences with the model: "
                              "0.weight: shape (3, 2) in file, (4, 2) in model; "
                              "0.bias: shape (3) in file, (4) in model; "
                              "2.weight: shape (1, 3) in file, (1, 4) in model"));
    assert_memory_equal(before, ddp_model_param_block(big, NULL), n * sizeof(float));

    /* missing / unexpected names, another dtype */
    float d[13] = {0};
    const char *h = "{\"0.weight\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[0,24]},"
                    "\"0.bias\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[24,30]},"
                    "\"1.weight\":{\"dtype\":\"F32\",\"shape\":[1,3],\"data_offsets\":[30,42]},"
                    "\"2.bias\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[42,46]}}";
    path = write_raw("names.safetensors", h, UINT64_MAX, d, 46);
    assert_int_equal(ddp_model_load_safetensors(small, path), DDP_ERR_MISMATCH);
    e = ddp_last_error();
    assert_non_null(strstr(e, "3 differences with the model: 0.bias: dtype F16 in file, F32 in "
                              "model; missing 2.weight; unexpected 1.weight"));
    ddp_model_destroy(small);
    ddp_model_destroy(big);
}

typedef struct bad {
    const char *header;
    uint64_t hlen; /* UINT64_MAX: the header's own length */
    size_t dlen;
    const char *message;
} bad;

static void test_malformed_rejected(void **state)
{
    (void)state;
    static const float zeros[16];
    const bad cases[] = {
        {"{}", 1000, 0, "header length 1000 exceeds the 2 bytes after it"},
        {"{}", 1, 0, "header length 1 is not within [2, 100000000]"},
        {"[1]", UINT64_MAX, 0, "header does not start with '{'"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},}", UINT64_MAX, 4,
         "JSON: trailing comma at byte 54"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", UINT64_MAX, 4,
         "JSON: expected ',' or '}' at byte 53"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} x", UINT64_MAX, 4,
         "JSON: unexpected data after the value at byte 55"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
         "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", UINT64_MAX, 8,
         "JSON: duplicate member \"a\""},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", UINT64_MAX, 4,
         "a: data_offsets [0, 8] out of range (data buffer of 4 bytes)"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", UINT64_MAX, 4,
         "a: data_offsets [0, 4] hold 4 bytes, but F32 of 2 elements needs 8"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
         "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", UINT64_MAX, 12,
         "b: data_offsets [4, 12] overlap a"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", UINT64_MAX, 8,
         "a: data_offsets start at 4, leaving bytes 0..4 of the data buffer unused"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", UINT64_MAX, 12,
         "tensors cover 4 bytes of a 12-byte data buffer"},
        {"{\"a\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,4]}}", UINT64_MAX, 4,
         "a: unknown dtype \"Q4\""},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", UINT64_MAX, 4,
         "a: shape entry 0 is not a non-negative integer"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4]}}", UINT64_MAX, 4,
         "a: \"data_offsets\" must be two non-negative integers"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", UINT64_MAX,
         4, "a: unknown field \"x\""},
        {"{\"a\":[1,2]}", UINT64_MAX, 0, "a: expected an object, found array"},
        /* products that wrap to 0 must not pass as an empty tensor */
        {"{\"big\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}",
         UINT64_MAX, 0, "big: shape (4294967296, 4294967296) of F32 is 2^64 bytes or more"},
        {"{\"b\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}",
         UINT64_MAX, 0, "b: shape (4611686018427387904) of F32 is 2^64 bytes or more"},
        {"{\"c\":{\"dtype\":\"U8\",\"shape\":[9223372036854775808],\"data_offsets\":[0,0]}}",
         UINT64_MAX, 0, "c: shape entry 0 is not a non-negative integer"},
        {"{\"d\":{\"dtype\":\"F32\",\"shape\":[1099511627776],\"data_offsets\":[0,4]}}",
         UINT64_MAX, 4, "d: data_offsets [0, 4] hold 4 bytes, but F32 of 1099511627776 elements needs 4398046511104"},
        {"{\"__metadata__\":{\"k\":1}}", UINT64_MAX, 0, "__metadata__ value \"k\" is not a string"},
    };
    ddp_model_t *m = tiny(1, 3);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *p = write_raw("bad.safetensors", cases[i].header, cases[i].hlen, zeros,
                                  cases[i].dlen);
        int rc = ddp_model_load_safetensors(m, p);
        if (rc != DDP_ERR_FORMAT || !strstr(ddp_last_error(), cases[i].message))
            fail_msg("case %zu: rc %d, message \"%s\", expected \"%s\"", i, rc,
                     ddp_last_error(), cases[i].message);
        assert_non_null(strstr(ddp_last_error(), "bad.safetensors"));
    }
    /* too short for the length itself; missing file; unwritable place */
    FILE *f = fopen(path_of("short.safetensors"), "wb");
    fwrite("abc", 1, 3, f);
    fclose(f);
    assert_int_equal(ddp_model_load_safetensors(m, path_of("short.safetensors")), DDP_ERR_FORMAT);
    assert_non_null(strstr(ddp_last_error(), "file of 3 bytes is too short for the 8-byte header length"));
    assert_int_equal(ddp_model_load_safetensors(m, path_of("nope.safetensors")), DDP_ERR_NOT_FOUND);
    assert_non_null(strstr(ddp_last_error(), "nope.safetensors: No such file or directory"));
    assert_non_null(strstr(ddp_last_error(), "No such file or directory"));
    /* A FIFO or a directory: refused before any read, never a hang (alarm
     * turns one into a failure). */
    assert_int_equal(mkfifo(path_of("fifo.safetensors"), 0600), 0);
    alarm(20);
    assert_int_equal(ddp_model_load_safetensors(m, path_of("fifo.safetensors")), DDP_ERR_IO);
    alarm(0);
    assert_non_null(strstr(ddp_last_error(), "fifo.safetensors: a FIFO, not a regular file"));
    assert_int_equal(ddp_model_load_safetensors(m, dir), DDP_ERR_IO);
    assert_non_null(strstr(ddp_last_error(), ": a directory, not a regular file"));
    assert_int_equal(ddp_model_save_safetensors(m, path_of("no/such/dir/m.safetensors")), DDP_ERR_IO);
    assert_non_null(strstr(ddp_last_error(), "cannot create"));
    ddp_model_destroy(m);
}

static void test_json_strict(void **state)
{
    (void)state;
    ddp__json *v;
    const char *ok = "{\"s\":\"a\\\"b\\\\c\\/\\n\\u00e9\\ud83d\\ude00\",\"n\":[0,-1.5e2,18446744073709551615,1e400],"
                     "\"t\":true,\"f\":false,\"z\":null,\"e\":{},\"a\":[]}";
    assert_int_equal(ddp__json_parse(ok, strlen(ok), &v), 0);
    const ddp__json *s = ddp__json_get(v, "s");
    assert_string_equal(s->str, "a\"b\\c/\n\xc3\xa9\xf0\x9f\x98\x80");
    const ddp__json *n = ddp__json_get(v, "n");
    assert_int_equal(n->len, 4);
    assert_true(n->child->is_uint && n->child->u64 == 0);
    assert_true(!n->child->next->is_uint && n->child->next->num == -150.0);
    assert_true(n->child->next->next->is_uint && n->child->next->next->u64 == UINT64_MAX);
    assert_int_equal(ddp__json_get(v, "t")->type, DDP_JSON_TRUE);
    assert_int_equal(ddp__json_get(v, "z")->type, DDP_JSON_NULL);
    assert_int_equal(ddp__json_get(v, "e")->len, 0);
    assert_null(ddp__json_get(v, "missing"));
    ddp__json_free(v);

    const char *cases[][2] = {
        {"[1,]", "trailing comma"},
        {"[01]", "expected ',' or ']' at byte 2"},
        {"[1.]", "digit expected after '.'"},
        {"[\"a\tb\"]", "control character 0x09"},
        {"[\"\\x\"]", "bad escape '\\x'"},
        {"[\"\\ud800\"]", "lone surrogate \\ud800"},
        {"{\"a\" 1}", "expected ':' at byte 5"},
        {"{1:2}", "expected a member name at byte 1"},
        {"[tru]", "unexpected character 't' at byte 1"},
        {"/*c*/{}", "unexpected character '/' at byte 0"},
        {"", "value expected at byte 0 (end of text)"},
        {"\"abc", "unterminated string starting at byte 0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = ddp__json_parse(cases[i][0], strlen(cases[i][0]), &v);
        if (rc != DDP_ERR_FORMAT || !strstr(ddp_last_error(), cases[i][1]))
            fail_msg("json case %zu: rc %d, \"%s\"", i, rc, ddp_last_error());
    }
    char deep[200];
    memset(deep, '[', 100);
    memset(deep + 100, ']', 100);
    assert_int_equal(ddp__json_parse(deep, 200, &v), DDP_ERR_FORMAT);
    assert_non_null(strstr(ddp_last_error(), "nesting deeper than 64"));
}

/* A header of 100k tensors: the duplicate check must be linear (a list
 * scan took 45 s), and a duplicate is still refused by name. */
static void test_many_keys(void **state)
{
    (void)state;
    enum { N = 100000 };
    size_t cap = (size_t)N * 96 + 200, len = 0;
    char *h = malloc(cap);
    assert_non_null(h);
    len += (size_t)snprintf(h + len, cap - len, "{");
    size_t tenth = 0; /* where the first N/10 entries end */
    for (int i = 0; i < N; i++, tenth = i == N / 10 ? len : tenth)
        len += (size_t)snprintf(h + len, cap - len,
                                "%s\"layer.%d.w\":{\"dtype\":\"F32\",\"shape\":[0],"
                                "\"data_offsets\":[0,0]}", i ? "," : "", i);
    size_t open_end = len; /* before the closing brace */
    snprintf(h + len, cap - len, "}");
    ddp__json *v = NULL;
    /* Linear: 10x the keys take about 10x the time (quadratic: 100x).  The
     * best of 3 of each, against the small one measured here, so that a
     * loaded machine does not decide. */
    double small_s = 1e9, parse_s = 1e9;
    for (int rep = 0; rep < 3; rep++) {
        char keep = h[tenth];
        h[tenth] = '}';
        double t0 = ddp_time_now();
        assert_int_equal(ddp__json_parse(h, tenth + 1, &v), 0);
        double dt = ddp_time_now() - t0;
        small_s = dt < small_s ? dt : small_s;
        assert_int_equal(v->len, N / 10);
        ddp__json_free(v);
        h[tenth] = keep;
        t0 = ddp_time_now();
        if (ddp__json_parse(h, open_end + 1, &v) != 0)
            fail_msg("%s", ddp_last_error());
        dt = ddp_time_now() - t0;
        parse_s = dt < parse_s ? dt : parse_s;
        assert_int_equal(v->len, N);
        ddp__json_free(v);
    }
    /* The same header through the safetensors reader. */
    const char *p = write_raw("many.safetensors", h, UINT64_MAX, NULL, 0);
    double t0 = ddp_time_now();
    ddp__st_file f;
    if (ddp__st_read(p, &f) != 0)
        fail_msg("%s", ddp_last_error());
    double read_s = ddp_time_now() - t0;
    assert_int_equal(f.n, N);
    ddp__st_close(&f);
    print_message("100k-key header: JSON parse %.3f s (10k keys: %.3f s), safetensors read "
                  "%.3f s\n", parse_s, small_s, read_s);
    assert_true(parse_s < 30 * small_s + 0.05);
    /* Generous bounds (a loaded machine; quadratic was 45 s). */
    assert_true(parse_s < 5.0);
    assert_true(read_s < 10.0);
    /* A duplicate at the end is found, named, at its byte. */
    snprintf(h + open_end, cap - open_end,
             ",\"layer.7.w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}");
    assert_int_equal(ddp__json_parse(h, strlen(h), &v), DDP_ERR_FORMAT);
    char want[80];
    snprintf(want, sizeof want, "duplicate member \"layer.7.w\" at byte %zu", open_end + 1);
    assert_non_null(strstr(ddp_last_error(), want));
    free(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_bytes_and_round_trip),
        cmocka_unit_test(test_foreign_file),
        cmocka_unit_test(test_mismatch_named),
        cmocka_unit_test(test_malformed_rejected),
        cmocka_unit_test(test_json_strict),
        cmocka_unit_test(test_many_keys),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
