/* The primitives of secure aggregation (secagg_crypto.h), on OpenSSL. */
#include "fedmoe/secagg_crypto.h"

#include <string.h>
#include <openssl/bn.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>

#include "fedmoe/log.h"

static fm_status ossl_fail(const char *what)
{
    fm_error_set("%s failed (OpenSSL)", what);
    return FM_ERR_IO;
}

/* ---- X25519 ---- */

fm_status fm_x25519_public(const uint8_t priv[FM_X25519_BYTES], uint8_t pub[FM_X25519_BYTES])
{
    EVP_PKEY *k = EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, NULL, priv, FM_X25519_BYTES);
    size_t len = FM_X25519_BYTES;
    bool ok = k && EVP_PKEY_get_raw_public_key(k, pub, &len) == 1 && len == FM_X25519_BYTES;
    EVP_PKEY_free(k);
    return ok ? FM_OK : ossl_fail("X25519 public key");
}

fm_status fm_x25519_keypair(uint8_t priv[FM_X25519_BYTES], uint8_t pub[FM_X25519_BYTES])
{
    if (RAND_bytes(priv, FM_X25519_BYTES) != 1)
        return ossl_fail("the generator");
    return fm_x25519_public(priv, pub);
}

fm_status fm_x25519_shared(const uint8_t priv[FM_X25519_BYTES], const uint8_t peer[FM_X25519_BYTES],
                           uint8_t out[FM_X25519_BYTES])
{
    EVP_PKEY *own = EVP_PKEY_new_raw_private_key(EVP_PKEY_X25519, NULL, priv, FM_X25519_BYTES);
    EVP_PKEY *other = EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, NULL, peer, FM_X25519_BYTES);
    EVP_PKEY_CTX *ctx = own ? EVP_PKEY_CTX_new(own, NULL) : NULL;
    size_t len = FM_X25519_BYTES;
    bool ok = other && ctx && EVP_PKEY_derive_init(ctx) == 1 && EVP_PKEY_derive_set_peer(ctx, other) == 1 &&
              EVP_PKEY_derive(ctx, out, &len) == 1 && len == FM_X25519_BYTES;
    EVP_PKEY_CTX_free(ctx);
    EVP_PKEY_free(own);
    EVP_PKEY_free(other);
    if (!ok) { /* (OpenSSL refuses a small-order peer key: its secret would be all zero) */
        fm_error_set("X25519 key agreement failed: the peer's public key is unusable");
        return FM_ERR_FORMAT;
    }
    return FM_OK;
}

/* ---- HKDF-SHA-256 ---- */

fm_status fm_hkdf_sha256(const uint8_t *salt, size_t nsalt, const uint8_t *ikm, size_t nikm, const uint8_t *info,
                         size_t ninfo, uint8_t *out, size_t len)
{
    if (len > 255 * 32) {
        fm_error_set("HKDF-SHA-256 gives at most 8160 bytes");
        return FM_ERR_ARG;
    }
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, NULL);
    bool ok = ctx && EVP_PKEY_derive_init(ctx) == 1 && EVP_PKEY_CTX_set_hkdf_md(ctx, EVP_sha256()) == 1 &&
              (nsalt == 0 || EVP_PKEY_CTX_set1_hkdf_salt(ctx, salt, (int)nsalt) == 1) && /* none: HashLen zeros */
              EVP_PKEY_CTX_set1_hkdf_key(ctx, ikm, (int)nikm) == 1 &&
              EVP_PKEY_CTX_add1_hkdf_info(ctx, info, (int)ninfo) == 1 && EVP_PKEY_derive(ctx, out, &len) == 1;
    EVP_PKEY_CTX_free(ctx);
    return ok ? FM_OK : ossl_fail("HKDF-SHA-256");
}

/* ---- ChaCha20, AES-256-GCM ---- */

fm_status fm_chacha20(const uint8_t key[32], const uint8_t nonce[12], uint32_t counter, const uint8_t *in, uint8_t *out,
                      size_t len)
{
    uint8_t iv[16] = {(uint8_t)counter, (uint8_t)(counter >> 8), (uint8_t)(counter >> 16), (uint8_t)(counter >> 24)};
    memcpy(iv + 4, nonce, 12); /* (OpenSSL's ChaCha20 IV: the block counter, little-endian, then the nonce) */
    if (!in)
        memset(out, 0, len);
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    bool ok = ctx && EVP_EncryptInit_ex(ctx, EVP_chacha20(), NULL, key, iv) == 1;
    for (size_t done = 0; ok && done < len;) {
        int step = len - done > (1u << 30) ? 1 << 30 : (int)(len - done), got = 0;
        ok = EVP_EncryptUpdate(ctx, out + done, &got, in ? in + done : out + done, step) == 1 && got == step;
        done += (size_t)step;
    }
    EVP_CIPHER_CTX_free(ctx);
    return ok ? FM_OK : ossl_fail("ChaCha20");
}

/* One GCM pass: enc 1 seals (writes tag), 0 opens (checks it). */
static bool gcm(int enc, const uint8_t key[32], const uint8_t *nonce, const uint8_t *aad, size_t naad,
                const uint8_t *in, size_t n, uint8_t *out, uint8_t *tag)
{
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    int got = 0, fin = 0;
    bool ok = ctx && n < (1u << 30) && naad < (1u << 30) &&
              EVP_CipherInit_ex(ctx, EVP_aes_256_gcm(), NULL, NULL, NULL, enc) == 1 &&
              EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, FM_GCM_NONCE_BYTES, NULL) == 1 &&
              EVP_CipherInit_ex(ctx, NULL, NULL, key, nonce, enc) == 1 &&
              (naad == 0 || EVP_CipherUpdate(ctx, NULL, &got, aad, (int)naad) == 1) &&
              (n == 0 || EVP_CipherUpdate(ctx, out, &got, in, (int)n) == 1) &&
              (enc || EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, FM_GCM_TAG_BYTES, tag) == 1) &&
              EVP_CipherFinal_ex(ctx, out + (n ? got : 0), &fin) == 1 &&
              (!enc || EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, FM_GCM_TAG_BYTES, tag) == 1);
    EVP_CIPHER_CTX_free(ctx);
    return ok;
}

fm_status fm_gcm_seal(const uint8_t key[32], const uint8_t nonce[FM_GCM_NONCE_BYTES], const uint8_t *aad, size_t naad,
                      const uint8_t *in, size_t n, uint8_t *out, uint8_t tag[FM_GCM_TAG_BYTES])
{
    return gcm(1, key, nonce, aad, naad, in, n, out, tag) ? FM_OK : ossl_fail("AES-256-GCM");
}

fm_status fm_gcm_open(const uint8_t key[32], const uint8_t nonce[FM_GCM_NONCE_BYTES], const uint8_t *aad, size_t naad,
                      const uint8_t *in, size_t n, const uint8_t tag[FM_GCM_TAG_BYTES], uint8_t *out)
{
    uint8_t t[FM_GCM_TAG_BYTES];
    memcpy(t, tag, sizeof t);
    if (gcm(0, key, nonce, aad, naad, in, n, out, t))
        return FM_OK;
    memset(out, 0, n); /* (nothing of an unauthenticated plaintext is kept) */
    fm_error_set("AES-256-GCM: the tag does not match (a wrong key, or the data was changed)");
    return FM_ERR_FORMAT;
}
