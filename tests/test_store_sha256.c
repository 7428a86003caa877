/* Tests of base/sha256.c, the digest behind the store's (and transport's)
 * shared-secret handshake: FIPS 180-4 and RFC 4231 vectors, streaming in
 * odd pieces equal to one shot, and the constant-time compare. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "base/sha256.h"

static void assert_hex(const uint8_t d[32], const char *want)
{
    char got[65];
    for (int i = 0; i < 32; i++)
        snprintf(got + 2 * i, 3, "%02x", d[i]);
    assert_string_equal(got, want);
}

static void test_sha256_vectors(void **state)
{
    (void)state;
    uint8_t d[32];
    ddp__sha256("abc", 3, d);
    assert_hex(d, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    ddp__sha256("", 0, d);
    assert_hex(d, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    ddp__sha256(m, strlen(m), d);
    assert_hex(d, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    /* One million 'a' (FIPS 180-2 appendix B.3), fed in uneven pieces. */
    static char a[1000];
    memset(a, 'a', sizeof a);
    ddp__sha256_ctx c;
    ddp__sha256_init(&c);
    size_t fed = 0, piece = 1;
    while (fed < 1000000) {
        size_t n = piece < 1000000 - fed ? piece : 1000000 - fed;
        n = n < sizeof a ? n : sizeof a;
        ddp__sha256_update(&c, a, n);
        fed += n;
        piece = piece * 3 % 997 + 1;
    }
    ddp__sha256_final(&c, d);
    assert_hex(d, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

static void test_hmac_sha256_rfc4231(void **state)
{
    (void)state;
    uint8_t d[32], key[131];
    memset(key, 0x0b, 20);
    ddp__hmac_sha256(key, 20, "Hi There", 8, d);
    assert_hex(d, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    ddp__hmac_sha256("Jefe", 4, "what do ya want for nothing?", 28, d);
    assert_hex(d, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    memset(key, 0xaa, 131);
    const char *t = "Test Using Larger Than Block-Size Key - Hash Key First";
    ddp__hmac_sha256(key, 131, t, strlen(t), d);
    assert_hex(d, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    assert_true(ddp__ct_equal("abcd", "abcd", 4));
    assert_false(ddp__ct_equal("abcd", "abce", 4));
    assert_true(ddp__ct_equal("x", "y", 0));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sha256_vectors),
        cmocka_unit_test(test_hmac_sha256_rfc4231),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
