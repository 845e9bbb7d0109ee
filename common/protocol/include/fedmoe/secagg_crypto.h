/* secagg_crypto.h - the primitives of secure aggregation (Bonawitz et al.,
 * CCS 2017), all through OpenSSL's EVP and BIGNUM: X25519 key agreement,
 * HKDF-SHA-256 key derivation, ChaCha20 mask expansion from 256-bit seeds,
 * AES-256-GCM for the pairwise shares the coordinator relays without reading,
 * and Shamir t-of-n sharing of 32-byte secrets over the prime field of
 * p = 2^521 - 1 (every 256-bit secret is an element; a share is 66 bytes).
 * Every function returns FM_OK or a failure with its reason; keys and seeds
 * come from OpenSSL's generator. */
#ifndef FEDMOE_SECAGG_CRYPTO_H
#define FEDMOE_SECAGG_CRYPTO_H

#include <stddef.h>
#include <stdint.h>

#include "fedmoe/status.h"

#define FM_X25519_BYTES 32
#define FM_GCM_NONCE_BYTES 12
#define FM_GCM_TAG_BYTES 16
#define FM_SHAMIR_SECRET_BYTES 32
#define FM_SHAMIR_Y_BYTES 66 /* an element of GF(2^521 - 1), big-endian */
#define FM_SHAMIR_MAX 65535  /* shares (x = 1..n) */

/* A fresh key pair, or the public key of a private one. */
fm_status fm_x25519_keypair(uint8_t priv[FM_X25519_BYTES], uint8_t pub[FM_X25519_BYTES]);
fm_status fm_x25519_public(const uint8_t priv[FM_X25519_BYTES], uint8_t pub[FM_X25519_BYTES]);
/* The shared secret of priv and a peer's public key (FM_ERR_FORMAT for a
 * peer key that gives the all-zero secret: a small-order point). */
fm_status fm_x25519_shared(const uint8_t priv[FM_X25519_BYTES], const uint8_t peer[FM_X25519_BYTES],
                           uint8_t out[FM_X25519_BYTES]);
/* HKDF-SHA-256 (RFC 5869): len bytes (at most 8160) from ikm, salt and info. */
fm_status fm_hkdf_sha256(const uint8_t *salt, size_t nsalt, const uint8_t *ikm, size_t nikm, const uint8_t *info,
                         size_t ninfo, uint8_t *out, size_t len);
/* ChaCha20 (RFC 8439) from block `counter`: out = in XOR keystream, or the
 * keystream itself when in is NULL. */
fm_status fm_chacha20(const uint8_t key[32], const uint8_t nonce[12], uint32_t counter, const uint8_t *in, uint8_t *out,
                      size_t len);
/* AES-256-GCM: seal writes n bytes of ciphertext and the tag; open checks
 * the tag (FM_ERR_FORMAT when the key, nonce, data or tag was changed) before
 * it gives the plaintext. */
fm_status fm_gcm_seal(const uint8_t key[32], const uint8_t nonce[FM_GCM_NONCE_BYTES], const uint8_t *aad, size_t naad,
                      const uint8_t *in, size_t n, uint8_t *out, uint8_t tag[FM_GCM_TAG_BYTES]);
fm_status fm_gcm_open(const uint8_t key[32], const uint8_t nonce[FM_GCM_NONCE_BYTES], const uint8_t *aad, size_t naad,
                      const uint8_t *in, size_t n, const uint8_t tag[FM_GCM_TAG_BYTES], uint8_t *out);

/* One Shamir share: the point (x, f(x)). */
typedef struct {
    uint32_t x;
    uint8_t y[FM_SHAMIR_Y_BYTES];
} fm_share_t;

/* n shares of secret (x = 1..n), any t of which give it back (1 <= t <= n
 * <= FM_SHAMIR_MAX); fewer give nothing about it. */
fm_status fm_shamir_split(const uint8_t secret[FM_SHAMIR_SECRET_BYTES], int t, int n, fm_share_t *shares);
/* The secret from k shares of distinct x (FM_ERR_FORMAT for repeated or zero
 * x, or a result that is not a 32-byte secret). With fewer than t shares the
 * result is some other value: nothing can tell. */
fm_status fm_shamir_combine(const fm_share_t *shares, int k, uint8_t secret[FM_SHAMIR_SECRET_BYTES]);

#endif
