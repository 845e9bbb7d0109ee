/* Shamir t-of-n sharing over GF(2^521 - 1) (secagg_crypto.h): a random
 * polynomial of degree t - 1 whose value at 0 is the secret, a share its value
 * at x = 1..n; the secret comes back by Lagrange interpolation at 0. The
 * field is far larger than a 32-byte secret, so a combination of too few or
 * altered shares gives a value that is almost never one (2^-265). */
#include <openssl/bn.h>

#include "fedmoe/log.h"
#include "fedmoe/secagg_crypto.h"

typedef struct {
    BN_CTX *ctx;
    BIGNUM *p;
} field_t;

static bool field_open(field_t *f)
{
    f->ctx = BN_CTX_new();
    f->p = BN_new();
    return f->ctx && f->p && BN_set_bit(f->p, 521) && BN_sub_word(f->p, 1);
}

static void field_close(field_t *f)
{
    BN_free(f->p);
    BN_CTX_free(f->ctx);
}

fm_status fm_shamir_split(const uint8_t secret[FM_SHAMIR_SECRET_BYTES], int t, int n, fm_share_t *shares)
{
    if (t < 1 || n < t || n > FM_SHAMIR_MAX) {
        fm_error_set("Shamir sharing: %d of %d shares: need 1 <= t <= n <= %d", t, n, FM_SHAMIR_MAX);
        return FM_ERR_ARG;
    }
    field_t f;
    BIGNUM **a = OPENSSL_zalloc(sizeof *a * (size_t)t);
    BIGNUM *y = BN_new(), *x = BN_new();
    bool ok = field_open(&f) && a && y && x;
    for (int i = 0; ok && i < t; i++) /* a[0] the secret, the others uniform in the field */
        ok = (a[i] = BN_new()) && (i == 0 ? BN_bin2bn(secret, FM_SHAMIR_SECRET_BYTES, a[0]) != NULL
                                          : BN_priv_rand_range(a[i], f.p) == 1);
    for (int s = 0; ok && s < n; s++) {
        ok = BN_set_word(x, (BN_ULONG)(s + 1)) && BN_copy(y, a[t - 1]);
        for (int i = t - 2; ok && i >= 0; i--) /* (Horner) */
            ok = BN_mod_mul(y, y, x, f.p, f.ctx) && BN_mod_add(y, y, a[i], f.p, f.ctx);
        shares[s].x = (uint32_t)(s + 1);
        ok = ok && BN_bn2binpad(y, shares[s].y, FM_SHAMIR_Y_BYTES) == FM_SHAMIR_Y_BYTES;
    }
    for (int i = 0; a && i < t; i++)
        BN_clear_free(a[i]);
    OPENSSL_free(a);
    BN_clear_free(y);
    BN_free(x);
    field_close(&f);
    if (!ok)
        fm_error_set("Shamir sharing failed (OpenSSL)");
    return ok ? FM_OK : FM_ERR_IO;
}

/* The Lagrange weight of share j at 0: prod_{m != j} x_m / (x_m - x_j). */
static bool weight(const fm_share_t *sh, int k, int j, field_t *f, BIGNUM *w)
{
    BIGNUM *num = BN_CTX_get(f->ctx), *den = BN_CTX_get(f->ctx), *xm = BN_CTX_get(f->ctx),
           *xj = BN_CTX_get(f->ctx), *d = BN_CTX_get(f->ctx);
    bool ok = d && BN_one(num) && BN_one(den) && BN_set_word(xj, sh[j].x);
    for (int m = 0; ok && m < k; m++)
        if (m != j)
            ok = BN_set_word(xm, sh[m].x) && BN_mod_mul(num, num, xm, f->p, f->ctx) &&
                 BN_mod_sub(d, xm, xj, f->p, f->ctx) && BN_mod_mul(den, den, d, f->p, f->ctx);
    return ok && BN_mod_inverse(den, den, f->p, f->ctx) && BN_mod_mul(w, num, den, f->p, f->ctx);
}

/* The Lagrange weights of the last x set combined on this thread: the
 * coordinator rebuilds every client's secret from the same answering
 * holders, so the O(k^2) weights are computed once, not once a secret (at
 * 500 clients, 55 s of the coordinator's loop to 0.1 s). */
#define WEIGHTS_CACHED 1024
static _Thread_local struct {
    int k;
    uint32_t x[WEIGHTS_CACHED];
    uint8_t w[WEIGHTS_CACHED][FM_SHAMIR_Y_BYTES];
} cache;

static bool same_xs(const fm_share_t *sh, int k)
{
    if (cache.k != k)
        return false;
    for (int j = 0; j < k; j++)
        if (cache.x[j] != sh[j].x)
            return false;
    return true;
}

fm_status fm_shamir_combine(const fm_share_t *shares, int k, uint8_t secret[FM_SHAMIR_SECRET_BYTES])
{
    for (int i = 0; i < k; i++)
        for (int j = 0; j < i; j++)
            if (shares[i].x == 0 || shares[i].x == shares[j].x) {
                fm_error_set("Shamir shares: x = %u repeated or zero", shares[i].x);
                return FM_ERR_FORMAT;
            }
    if (k < 1 || shares[0].x == 0) {
        fm_error_set("Shamir shares: none, or x = 0");
        return FM_ERR_FORMAT;
    }
    field_t f;
    bool ok = field_open(&f);
    BN_CTX_start(f.ctx);
    BIGNUM *s = BN_CTX_get(f.ctx), *w = BN_CTX_get(f.ctx), *y = BN_CTX_get(f.ctx);
    ok = ok && y;
    if (ok)
        BN_zero(s);
    bool cached = k <= WEIGHTS_CACHED && same_xs(shares, k), keep = k <= WEIGHTS_CACHED && !cached;
    if (keep)
        cache.k = 0; /* (filled below, valid once complete) */
    for (int j = 0; ok && j < k; j++) {
        ok = BN_bin2bn(shares[j].y, FM_SHAMIR_Y_BYTES, y) && BN_cmp(y, f.p) < 0 &&
             (cached ? BN_bin2bn(cache.w[j], FM_SHAMIR_Y_BYTES, w) != NULL : weight(shares, k, j, &f, w));
        if (ok && keep) {
            cache.x[j] = shares[j].x;
            ok = BN_bn2binpad(w, cache.w[j], FM_SHAMIR_Y_BYTES) == FM_SHAMIR_Y_BYTES;
        }
        ok = ok && BN_mod_mul(w, w, y, f.p, f.ctx) && BN_mod_add(s, s, w, f.p, f.ctx);
    }
    if (ok && keep)
        cache.k = k;
    bool fits = ok && BN_num_bytes(s) <= FM_SHAMIR_SECRET_BYTES;
    if (fits)
        BN_bn2binpad(s, secret, FM_SHAMIR_SECRET_BYTES);
    BN_CTX_end(f.ctx);
    field_close(&f);
    if (!fits) {
        fm_error_set(ok ? "Shamir shares: they do not give a secret (too few, or altered)"
                        : "Shamir shares: a value outside the field, or OpenSSL failed");
        return FM_ERR_FORMAT;
    }
    return FM_OK;
}
