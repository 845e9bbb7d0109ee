/* The primitives of secure aggregation through OpenSSL, against published
 * known answers: RFC 7748 section 6.1 (X25519), RFC 5869 test case 1
 * (HKDF-SHA-256), RFC 8439 section 2.4.2 (ChaCha20), the GCM specification's
 * test case 16 (AES-256-GCM, McGrew and Viega); and Shamir sharing: any t
 * shares give the secret back, t - 1 do not, an altered share is caught by
 * the authenticated encryption it travels in. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/secagg_crypto.h"

static size_t hex(const char *s, uint8_t *out)
{
    size_t n = 0;
    for (; s[0] && s[1]; s += 2) {
        unsigned v;
        assert_int_equal(sscanf(s, "%2x", &v), 1);
        out[n++] = (uint8_t)v;
    }
    return n;
}

static void expect_hex(const uint8_t *got, const char *want)
{
    uint8_t w[256];
    size_t n = hex(want, w);
    assert_memory_equal(got, w, n);
}

static void test_x25519_rfc7748(void **state)
{
    (void)state;
    uint8_t a[32], b[32], pa[32], pb[32], k1[32], k2[32];
    hex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a", a);
    hex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb", b);
    assert_int_equal(fm_x25519_public(a, pa), FM_OK);
    assert_int_equal(fm_x25519_public(b, pb), FM_OK);
    expect_hex(pa, "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a");
    expect_hex(pb, "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f");
    assert_int_equal(fm_x25519_shared(a, pb, k1), FM_OK);
    assert_int_equal(fm_x25519_shared(b, pa, k2), FM_OK);
    expect_hex(k1, "4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742");
    assert_memory_equal(k1, k2, 32);
    uint8_t zero[32] = {0}; /* a small-order peer key */
    assert_int_equal(fm_x25519_shared(a, zero, k1), FM_ERR_FORMAT);
    uint8_t c[32], pc[32], d[32], pd[32];
    assert_int_equal(fm_x25519_keypair(c, pc), FM_OK);
    assert_int_equal(fm_x25519_keypair(d, pd), FM_OK);
    assert_memory_not_equal(c, d, 32);
}

static void test_hkdf_rfc5869(void **state)
{
    (void)state;
    uint8_t ikm[22], salt[13], info[10], okm[42];
    memset(ikm, 0x0b, sizeof ikm);
    for (int i = 0; i < 13; i++)
        salt[i] = (uint8_t)i;
    for (int i = 0; i < 10; i++)
        info[i] = (uint8_t)(0xf0 + i);
    assert_int_equal(fm_hkdf_sha256(salt, sizeof salt, ikm, sizeof ikm, info, sizeof info, okm, sizeof okm), FM_OK);
    expect_hex(okm, "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865");
}

static void test_chacha20_rfc8439(void **state)
{
    (void)state;
    uint8_t key[32], nonce[12], out[114], ks[114];
    for (int i = 0; i < 32; i++)
        key[i] = (uint8_t)i;
    hex("000000000000004a00000000", nonce);
    const char *pt = "Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future, "
                     "sunscreen would be it.";
    assert_int_equal(strlen(pt), 114);
    assert_int_equal(fm_chacha20(key, nonce, 1, (const uint8_t *)pt, out, 114), FM_OK);
    expect_hex(out, "6e2e359a2568f98041ba0728dd0d");
    assert_int_equal(fm_chacha20(key, nonce, 1, NULL, ks, 114), FM_OK); /* the keystream alone */
    for (int i = 0; i < 114; i++)
        assert_int_equal(ks[i] ^ (uint8_t)pt[i], out[i]);
}

static void test_gcm_spec_case16(void **state)
{
    (void)state;
    uint8_t key[32], iv[12], pt[60], aad[20], ct[60], tag[16], back[60];
    hex("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308", key);
    hex("cafebabefacedbaddecaf888", iv);
    hex("d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de"
        "657ba637b39",
        pt);
    hex("feedfacedeadbeeffeedfacedeadbeefabaddad2", aad);
    assert_int_equal(fm_gcm_seal(key, iv, aad, 20, pt, 60, ct, tag), FM_OK);
    expect_hex(ct, "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3da7b08b1056828838c5f6"
                   "1e6393ba7a0abcc9f662");
    expect_hex(tag, "76fc6ece0f4e1768cddf8853bb2d551b");
    assert_int_equal(fm_gcm_open(key, iv, aad, 20, ct, 60, tag, back), FM_OK);
    assert_memory_equal(back, pt, 60);
    ct[7] ^= 1;
    assert_int_equal(fm_gcm_open(key, iv, aad, 20, ct, 60, tag, back), FM_ERR_FORMAT);
    ct[7] ^= 1;
    aad[0] ^= 1;
    assert_int_equal(fm_gcm_open(key, iv, aad, 20, ct, 60, tag, back), FM_ERR_FORMAT);
}

/* Any t of n shares give the secret back, in any order; t - 1 do not (another
 * field element, almost never a 32-byte value); a share altered on its way
 * is caught by AES-256-GCM, the coordinator relaying it cannot change it. */
static void test_shamir(void **state)
{
    (void)state;
    enum { T = 4, N = 7 };
    uint8_t secret[32], got[32];
    for (int i = 0; i < 32; i++)
        secret[i] = (uint8_t)(0xff - i); /* (the top bits set: every 256-bit value is a secret) */
    fm_share_t sh[N], pick[N];
    assert_int_equal(fm_shamir_split(secret, T, N, sh), FM_OK);
    for (int mask = 0; mask < 1 << N; mask++) {
        int k = 0;
        for (int i = N - 1; i >= 0; i--)
            if (mask >> i & 1)
                pick[k++] = sh[i];
        if (k == 0)
            continue;
        fm_status st = fm_shamir_combine(pick, k, got);
        if (k >= T) {
            assert_int_equal(st, FM_OK);
            assert_memory_equal(got, secret, 32);
        } else {
            assert_true(st == FM_ERR_FORMAT || memcmp(got, secret, 32) != 0);
        }
    }
    pick[0] = sh[0];
    pick[1] = sh[0];
    assert_int_equal(fm_shamir_combine(pick, 2, got), FM_ERR_FORMAT); /* (the same x twice) */
    assert_int_equal(fm_shamir_split(secret, 5, 4, sh), FM_ERR_ARG);
    uint8_t key[32] = {1}, iv[12] = {2}, ct[sizeof sh[0].y], tag[16], back[sizeof sh[0].y];
    assert_int_equal(fm_gcm_seal(key, iv, NULL, 0, sh[2].y, sizeof ct, ct, tag), FM_OK);
    ct[30] ^= 0x10;
    assert_int_equal(fm_gcm_open(key, iv, NULL, 0, ct, sizeof ct, tag, back), FM_ERR_FORMAT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_x25519_rfc7748),  cmocka_unit_test(test_hkdf_rfc5869),
        cmocka_unit_test(test_chacha20_rfc8439), cmocka_unit_test(test_gcm_spec_case16),
        cmocka_unit_test(test_shamir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
