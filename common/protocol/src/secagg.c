/* secagg.c - secure aggregation's masking, without I/O (secagg.h). */
#include "fedmoe/secagg.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "fedmoe/aggregate.h"
#include "fedmoe/log.h"

#define MAX_N FM_SHAMIR_MAX

struct fm_sa_client {
    uint32_t who, n, t;
    uint64_t round;
    uint8_t c_sk[FM_X25519_BYTES], s_sk[FM_X25519_BYTES], b[32];
    fm_sa_keys_t keys;
    fm_sa_keys_t *u1; /* U1's keys, by number: u1[j - 1] (who 0: absent) */
    /* the shares of every client of U1 (itself too), by owner: [j - 1][kind] */
    uint8_t (*held)[2][FM_SHAMIR_Y_BYTES];
    bool *in2; /* in2[j - 1]: j's shares were given to it, opened or not (j in U2 as this client saw it) */
    bool *has; /* has[j - 1]: j's shares opened and held (itself included) */
    uint32_t *unopened, nunopened; /* the clients whose sealed shares did not open */
    bool masked, unmasked; /* phases 2 and 3 done: each at most once */
};

/* ---- derivations: every key a (round, purpose, pair) of its own ---------- */

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* HKDF-SHA-256 of the X25519 secret of (priv, peer) with info = label,
 * round, the pair's two numbers (low first). */
static fm_status agree(const uint8_t priv[32], const uint8_t peer[32], const char *label, uint64_t round, uint32_t a,
                       uint32_t b, uint8_t out[32])
{
    uint8_t shared[32], info[64];
    fm_status st = fm_x25519_shared(priv, peer, shared);
    if (st != FM_OK)
        return st;
    size_t n = strlen(label);
    memcpy(info, label, n);
    put64(info + n, round);
    put64(info + n + 8, a < b ? a : b);
    put64(info + n + 16, a < b ? b : a);
    st = fm_hkdf_sha256(NULL, 0, shared, sizeof shared, info, n + 24, out, 32);
    OPENSSL_cleanse(shared, sizeof shared);
    return st;
}

/* The commitment to a self-mask seed: HKDF-SHA-256 of it with info = label,
 * round and owner (binding, by SHA-256's collision resistance). */
static fm_status commit(const uint8_t b[32], uint64_t round, uint32_t who, uint8_t out[32])
{
    uint8_t info[64];
    const char *label = "fedmoe secagg commit";
    size_t n = strlen(label);
    memcpy(info, label, n);
    put64(info + n, round);
    put64(info + n + 8, who);
    return fm_hkdf_sha256(NULL, 0, b, 32, info, n + 16, out, 32);
}

/* v[0..d] += sign x the mask of seed (ChaCha20's keystream, 16 bytes a value,
 * little-endian), a block at a time. */
static fm_status add_mask(fm_u128 *v, size_t d, const uint8_t seed[32], int sign)
{
    enum { VALUES = 1024 };
    static const uint8_t nonce[12] = {0};
    uint8_t buf[16 * VALUES];
    for (size_t at = 0; at <= d; at += VALUES) {
        size_t k = d + 1 - at < VALUES ? d + 1 - at : VALUES;
        fm_status st = fm_chacha20(seed, nonce, (uint32_t)(at * 16 / 64), NULL, buf, 16 * k);
        if (st != FM_OK)
            return st;
        for (size_t i = 0; i < k; i++) {
            fm_u128 m = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
            memcpy(&m, buf + 16 * i, 16); /* (the bytes are little-endian already) */
#else
            for (int j = 15; j >= 0; j--)
                m = (m << 8) | buf[16 * i + (size_t)j];
#endif
            v[at + i] = sign > 0 ? v[at + i] + m : v[at + i] - m;
        }
    }
    OPENSSL_cleanse(buf, sizeof buf);
    return FM_OK;
}

static fm_status bad(fm_status st, const char *fmt, uint32_t a, uint32_t b)
{
    fm_error_set(fmt, a, b);
    return st;
}

/* ---- the client ------------------------------------------------------------ */

fm_status fm_sa_client_new(fm_sa_client_t **out, uint32_t who, uint32_t n, uint32_t t, uint64_t round)
{
    *out = NULL;
    if (n < 1 || n > MAX_N || who < 1 || who > n || t <= n / 2 || t > n) /* t a majority: two disjoint
                                                                           groups cannot both rebuild */
        return bad(FM_ERR_ARG, "secure aggregation: client %u of %u: bad numbers, or a threshold not a majority",
                   who, n);
    fm_sa_client_t *c = calloc(1, sizeof *c);
    if (!c || !(c->u1 = calloc(n, sizeof *c->u1)) || !(c->held = calloc(n, sizeof *c->held)) ||
        !(c->has = calloc(n, sizeof *c->has)) || !(c->in2 = calloc(n, sizeof *c->in2)) ||
        !(c->unopened = calloc(n, sizeof *c->unopened))) {
        fm_sa_client_destroy(&c);
        return FM_ERR_NOMEM;
    }
    c->who = who;
    c->n = n;
    c->t = t;
    c->round = round;
    c->keys.who = who;
    fm_status st = fm_x25519_keypair(c->c_sk, c->keys.c_pk);
    if (st == FM_OK)
        st = fm_x25519_keypair(c->s_sk, c->keys.s_pk);
    if (st == FM_OK && RAND_bytes(c->b, sizeof c->b) != 1)
        st = bad(FM_ERR_IO, "secure aggregation: no random bytes for client %u of %u", who, n);
    if (st == FM_OK)
        st = commit(c->b, round, who, c->keys.b_commit);
    if (st != FM_OK) {
        fm_sa_client_destroy(&c);
        return st;
    }
    *out = c;
    return FM_OK;
}

void fm_sa_client_destroy(fm_sa_client_t **cp)
{
    fm_sa_client_t *c = *cp;
    if (!c)
        return;
    if (c->held)
        OPENSSL_cleanse(c->held, sizeof *c->held * c->n);
    free(c->u1);
    free(c->held);
    free(c->has);
    free(c->in2);
    free(c->unopened);
    OPENSSL_cleanse(c, sizeof *c);
    free(c);
    *cp = NULL;
}

void fm_sa_client_keys(const fm_sa_client_t *c, fm_sa_keys_t *out) { *out = c->keys; }

/* The key and nonce that seal from's shares for to: the c keys' agreement,
 * the direction in the nonce (both directions of a pair share the key). */
static fm_status seal_key(const fm_sa_client_t *c, const uint8_t peer_c_pk[32], uint32_t from, uint32_t to,
                          uint8_t key[32], uint8_t nonce[FM_GCM_NONCE_BYTES], uint8_t aad[16])
{
    memset(nonce, 0, FM_GCM_NONCE_BYTES);
    for (int i = 0; i < 4; i++) {
        nonce[i] = (uint8_t)(from >> (8 * i));
        nonce[4 + i] = (uint8_t)(to >> (8 * i));
    }
    put64(aad, c->round);
    memcpy(aad + 8, nonce, 8);
    return agree(c->c_sk, peer_c_pk, "fedmoe secagg seal", c->round, from, to, key);
}

fm_status fm_sa_client_share(fm_sa_client_t *c, const fm_sa_keys_t *u1, uint32_t k, fm_sa_sealed_t *out)
{
    if (k < c->t)
        return bad(FM_ERR_STATE, "secure aggregation: %u clients advertised keys, fewer than the threshold %u", k,
                   c->t);
    bool self = false;
    for (uint32_t i = 0; i < k; i++) {
        uint32_t j = u1[i].who;
        if (j < 1 || j > c->n || c->u1[j - 1].who)
            return bad(FM_ERR_FORMAT, "secure aggregation: client number %u repeated or not in 1..%u", j, c->n);
        c->u1[j - 1] = u1[i];
        self |= j == c->who;
    }
    if (!self || memcmp(&c->u1[c->who - 1], &c->keys, sizeof c->keys) != 0)
        return bad(FM_ERR_FORMAT, "secure aggregation: client %u's own keys are not among the %u advertised",
                   c->who, k);
    fm_share_t *sb = malloc(sizeof *sb * c->n), *ss = malloc(sizeof *ss * c->n);
    fm_status st = sb && ss ? FM_OK : FM_ERR_NOMEM;
    if (st == FM_OK && (st = fm_shamir_split(c->b, (int)c->t, (int)c->n, sb)) == FM_OK)
        st = fm_shamir_split(c->s_sk, (int)c->t, (int)c->n, ss);
    uint32_t o = 0;
    for (uint32_t i = 0; st == FM_OK && i < k; i++) {
        uint32_t j = u1[i].who;
        if (j == c->who) { /* its own shares of its own secrets: it answers for itself in phase 3 */
            memcpy(c->held[j - 1][0], sb[j - 1].y, FM_SHAMIR_Y_BYTES);
            memcpy(c->held[j - 1][1], ss[j - 1].y, FM_SHAMIR_Y_BYTES);
            c->has[j - 1] = c->in2[j - 1] = true;
            continue;
        }
        uint8_t key[32], nonce[FM_GCM_NONCE_BYTES], aad[16], plain[FM_SA_SEALED_BYTES];
        if ((st = seal_key(c, u1[i].c_pk, c->who, j, key, nonce, aad)) != FM_OK)
            break;
        memcpy(plain, sb[j - 1].y, FM_SHAMIR_Y_BYTES);
        memcpy(plain + FM_SHAMIR_Y_BYTES, ss[j - 1].y, FM_SHAMIR_Y_BYTES);
        out[o].from = c->who;
        out[o].to = j;
        st = fm_gcm_seal(key, nonce, aad, sizeof aad, plain, sizeof plain, out[o].sealed, out[o].tag);
        OPENSSL_cleanse(key, sizeof key);
        OPENSSL_cleanse(plain, sizeof plain);
        o++;
    }
    if (sb)
        OPENSSL_cleanse(sb, sizeof *sb * c->n);
    if (ss)
        OPENSSL_cleanse(ss, sizeof *ss * c->n);
    free(sb);
    free(ss);
    return st;
}

fm_status fm_sa_client_mask(fm_sa_client_t *c, const fm_sa_sealed_t *in, uint32_t k, const float *x, size_t d,
                            uint64_t weight, fm_u128 *out)
{
    if (k + 1 < c->t)
        return bad(FM_ERR_STATE, "secure aggregation: shares of %u clients came, fewer than the threshold %u",
                   k + 1, c->t);
    if (c->masked)
        return bad(FM_ERR_STATE, "secure aggregation: client %u of %u masked its input already", c->who, c->n);
    if (weight == 0 || weight > FM_AGG_MAX_WEIGHT)
        return bad(FM_ERR_ARG, "secure aggregation: client %u's weight out of 1..2^29 (of %u)", c->who, c->n);
    for (size_t i = 0; i < d; i++)
        if (!(x[i] >= -FM_AGG_MAX_ABS && x[i] <= FM_AGG_MAX_ABS)) /* (NaN fails too) */
            return bad(FM_ERR_ARG, "secure aggregation: client %u's value %u is not finite or beyond 2^30", c->who,
                       (uint32_t)i);
    /* every share checked and opened before any is kept: a refused call
     * changes nothing. A share that does not open (tampered on the way, or
     * sealed wrong by its sender) is not a refusal: the client still masks
     * with its sender (the pair mask comes from the public keys) and holds
     * none of its shares; the coordinator rebuilds that client's secret from
     * the others' (fm_sa_client_unopened names it) */
    uint8_t (*opened)[FM_SA_SEALED_BYTES] = malloc(sizeof *opened * (k ? k : 1));
    bool *seen = calloc(c->n, sizeof *seen), *ok = calloc(k ? k : 1, sizeof *ok);
    fm_status st = opened && seen && ok ? FM_OK : FM_ERR_NOMEM;
    for (uint32_t i = 0; st == FM_OK && i < k; i++) {
        uint32_t j = in[i].from;
        if (in[i].to != c->who || j < 1 || j > c->n || j == c->who || !c->u1[j - 1].who || c->in2[j - 1] ||
            seen[j - 1]) {
            st = bad(FM_ERR_FORMAT, "secure aggregation: shares from %u for %u are not this client's to take", j,
                     in[i].to);
            break;
        }
        seen[j - 1] = true;
        uint8_t key[32], nonce[FM_GCM_NONCE_BYTES], aad[16];
        st = seal_key(c, c->u1[j - 1].c_pk, j, c->who, key, nonce, aad);
        if (st == FM_OK)
            ok[i] = fm_gcm_open(key, nonce, aad, sizeof aad, in[i].sealed, FM_SA_SEALED_BYTES, in[i].tag,
                                opened[i]) == FM_OK;
        OPENSSL_cleanse(key, sizeof key);
    }
    for (uint32_t i = 0; st == FM_OK && i < k; i++) {
        uint32_t j = in[i].from;
        c->in2[j - 1] = true;
        if (!ok[i]) {
            c->unopened[c->nunopened++] = j;
            continue;
        }
        memcpy(c->held[j - 1][0], opened[i], FM_SHAMIR_Y_BYTES);
        memcpy(c->held[j - 1][1], opened[i] + FM_SHAMIR_Y_BYTES, FM_SHAMIR_Y_BYTES);
        c->has[j - 1] = true;
    }
    if (opened)
        OPENSSL_cleanse(opened, sizeof *opened * (k ? k : 1));
    free(opened);
    free(seen);
    free(ok);
    if (st != FM_OK)
        return st;
    c->masked = true;
    fm_sa_encode(x, d, weight, out);
    st = add_mask(out, d, c->b, +1);
    for (uint32_t j = 1; st == FM_OK && j <= c->n; j++) { /* U2: the clients whose shares it was given */
        if (j == c->who || !c->in2[j - 1])
            continue;
        uint8_t seed[32];
        if ((st = agree(c->s_sk, c->u1[j - 1].s_pk, "fedmoe secagg mask", c->round, c->who, j, seed)) == FM_OK)
            st = add_mask(out, d, seed, c->who < j ? +1 : -1);
        OPENSSL_cleanse(seed, sizeof seed);
    }
    return st;
}

fm_status fm_sa_client_unmask(fm_sa_client_t *c, const uint32_t *u3, uint32_t k, fm_sa_share_t *out, uint32_t *nout)
{
    *nout = 0;
    if (k < c->t)
        return bad(FM_ERR_STATE, "secure aggregation: %u masked inputs came, fewer than the threshold %u", k, c->t);
    if (c->unmasked || !c->masked) /* a second U3 could ask for both secrets of one client */
        return bad(FM_ERR_STATE, "secure aggregation: client %u answers one unmasking, after its masked input "
                   "(of %u)", c->who, c->n);
    bool *in3 = calloc(c->n, sizeof *in3);
    if (!in3)
        return FM_ERR_NOMEM;
    fm_status st = FM_OK;
    for (uint32_t i = 0; i < k && st == FM_OK; i++) {
        if (u3[i] < 1 || u3[i] > c->n || !c->in2[u3[i] - 1] || in3[u3[i] - 1])
            st = bad(FM_ERR_STATE, "secure aggregation: client %u is in U3 but did not share (or twice), told to %u",
                     u3[i], c->who);
        else
            in3[u3[i] - 1] = true;
    }
    if (st == FM_OK && !in3[c->who - 1]) /* its input was sent: a U3 without it would ask for its mask key */
        st = bad(FM_ERR_STATE, "secure aggregation: client %u's masked input is left out of U3 (of %u)", c->who, c->n);
    c->unmasked = st == FM_OK;
    for (uint32_t j = 1; st == FM_OK && j <= c->n; j++) {
        if (!c->has[j - 1])
            continue;
        fm_sa_share_t *s = &out[(*nout)++];
        s->owner = j;
        s->holder = c->who;
        s->kind = in3[j - 1] ? 0 : 1; /* b of those in U3; the s key of those who dropped: never both */
        memcpy(s->y, c->held[j - 1][s->kind], FM_SHAMIR_Y_BYTES);
    }
    free(in3);
    return st;
}

uint32_t fm_sa_client_unopened(const fm_sa_client_t *c, uint32_t *who, uint32_t cap)
{
    for (uint32_t i = 0; i < c->nunopened && i < cap; i++)
        who[i] = c->unopened[i];
    return c->nunopened;
}

/* ---- records ------------------------------------------------------------------ */

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

void fm_sa_keys_put(const fm_sa_keys_t *k, uint8_t out[FM_SA_KEYS_RECORD])
{
    put32(out, k->who);
    memcpy(out + 4, k->c_pk, FM_X25519_BYTES);
    memcpy(out + 4 + FM_X25519_BYTES, k->s_pk, FM_X25519_BYTES);
    memcpy(out + 4 + 2 * FM_X25519_BYTES, k->b_commit, 32);
}

void fm_sa_keys_get(const uint8_t in[FM_SA_KEYS_RECORD], fm_sa_keys_t *k)
{
    k->who = get32(in);
    memcpy(k->c_pk, in + 4, FM_X25519_BYTES);
    memcpy(k->s_pk, in + 4 + FM_X25519_BYTES, FM_X25519_BYTES);
    memcpy(k->b_commit, in + 4 + 2 * FM_X25519_BYTES, 32);
}

void fm_sa_sealed_put(const fm_sa_sealed_t *s, uint8_t out[FM_SA_SEALED_RECORD])
{
    put32(out, s->from);
    put32(out + 4, s->to);
    memcpy(out + 8, s->sealed, FM_SA_SEALED_BYTES);
    memcpy(out + 8 + FM_SA_SEALED_BYTES, s->tag, FM_GCM_TAG_BYTES);
}

void fm_sa_sealed_get(const uint8_t in[FM_SA_SEALED_RECORD], fm_sa_sealed_t *s)
{
    s->from = get32(in);
    s->to = get32(in + 4);
    memcpy(s->sealed, in + 8, FM_SA_SEALED_BYTES);
    memcpy(s->tag, in + 8 + FM_SA_SEALED_BYTES, FM_GCM_TAG_BYTES);
}

void fm_sa_share_put(const fm_sa_share_t *s, uint8_t out[FM_SA_SHARE_RECORD])
{
    put32(out, s->owner);
    out[4] = s->kind;
    memcpy(out + 5, s->y, FM_SHAMIR_Y_BYTES);
}

void fm_sa_share_get(const uint8_t in[FM_SA_SHARE_RECORD], uint32_t holder, fm_sa_share_t *s)
{
    s->owner = get32(in);
    s->holder = holder;
    s->kind = in[4];
    memcpy(s->y, in + 5, FM_SHAMIR_Y_BYTES);
}

/* ---- the coordinator --------------------------------------------------------- */

void fm_sa_encode(const float *x, size_t d, uint64_t weight, fm_u128 *out)
{
    double w = (double)weight;
    for (size_t i = 0; i < d; i++)
        out[i] = (fm_u128)fm_agg_fixed(x[i], w);
    out[d] = weight;
}

void fm_sa_sum_add(fm_u128 *sum, const fm_u128 *y, size_t d)
{
    for (size_t i = 0; i <= d; i++)
        sum[i] += y[i];
}

/* Whether secret is what owner advertised: its s key's public key, or the
 * seed its commitment binds. */
static bool matches(const fm_sa_keys_t *owner, uint8_t kind, uint64_t round, const uint8_t secret[32])
{
    uint8_t check[32];
    bool ok = kind ? fm_x25519_public(secret, check) == FM_OK && memcmp(check, owner->s_pk, 32) == 0
                   : commit(secret, round, owner->who, check) == FM_OK && memcmp(check, owner->b_commit, 32) == 0;
    OPENSSL_cleanse(check, sizeof check);
    return ok;
}

/* The secret of `owner` of this kind from the answers' shares (distinct
 * holders): the first t that rebuild what it advertised, trying choices of t
 * in order (at most 4096). */
static fm_status rebuild(const fm_sa_share_t *shares, uint32_t n, const fm_sa_keys_t *owner, uint8_t kind, uint32_t t,
                         uint64_t round, fm_share_t *all, uint8_t out[32])
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++)
        if (shares[i].owner == owner->who && shares[i].kind == kind) {
            all[k].x = shares[i].holder;
            memcpy(all[k].y, shares[i].y, FM_SHAMIR_Y_BYTES);
            k++;
        }
    if (k < t)
        return bad(FM_ERR_STATE, "secure aggregation: %u shares to rebuild client %u's secret, fewer than the threshold",
                   k, owner->who);
    uint32_t *pick = malloc(sizeof *pick * t);
    if (!pick)
        return FM_ERR_NOMEM;
    fm_share_t *try = all + k; /* (the caller's room for t more) */
    /* first the k runs of t consecutive shares, cyclically: with one wrong
     * share among more than t, some run misses it (k tries at most) */
    for (uint32_t first = 0; first < k; first++) {
        for (uint32_t i = 0; i < t; i++)
            try[i] = all[(first + i) % k];
        if (fm_shamir_combine(try, (int)t, out) == FM_OK && matches(owner, kind, round, out)) {
            free(pick);
            return FM_OK;
        }
    }
    for (uint32_t i = 0; i < t; i++) /* then other choices, in order */
        pick[i] = i;
    for (int tries = 0; tries < 4096; tries++) {
        for (uint32_t i = 0; i < t; i++)
            try[i] = all[pick[i]];
        if (fm_shamir_combine(try, (int)t, out) == FM_OK && matches(owner, kind, round, out)) {
            free(pick);
            return FM_OK;
        }
        int i = (int)t - 1; /* the next choice of t of k, in lexicographic order */
        while (i >= 0 && pick[i] == k - t + (uint32_t)i)
            i--;
        if (i < 0)
            break;
        pick[i]++;
        for (uint32_t j = (uint32_t)i + 1; j < t; j++)
            pick[j] = pick[j - 1] + 1;
    }
    free(pick);
    OPENSSL_cleanse(out, 32);
    return bad(FM_ERR_STATE, "secure aggregation: no choice of the threshold among the %u shares of client %u's "
               "secret rebuilds it", k, owner->who);
}

fm_status fm_sa_unmask(fm_u128 *sum, size_t d, uint32_t t, uint64_t round, const fm_sa_keys_t *u2, uint32_t k2,
                       const uint32_t *u3, uint32_t k3, const fm_sa_share_t *shares, uint32_t nshares,
                       uint32_t *unbuilt)
{
    *unbuilt = 0;
    if (k3 < t)
        return bad(FM_ERR_STATE, "secure aggregation: %u masked inputs, fewer than the threshold %u", k3, t);
    /* who is in U2 (bit 1) and U3 (bit 2), by number: U2 without repeats, U3
     * within U2 and without repeats */
    uint8_t *in = calloc(MAX_N + 1, 1);
    if (!in)
        return FM_ERR_NOMEM;
    fm_status st = FM_OK;
    for (uint32_t i = 0; st == FM_OK && i < k2; i++) {
        uint32_t j = u2[i].who;
        if (j < 1 || j > MAX_N || in[j])
            st = bad(FM_ERR_FORMAT, "secure aggregation: client %u twice in U2 or out of range (%u clients)", j, k2);
        else
            in[j] = 1;
    }
    for (uint32_t i = 0; st == FM_OK && i < k3; i++) {
        uint32_t j = u3[i];
        if (j < 1 || j > MAX_N || in[j] != 1)
            st = bad(FM_ERR_FORMAT, "secure aggregation: client %u of U3 is not in U2 once (%u in U3)", j, k3);
        else
            in[j] |= 2;
    }
    fm_share_t *scratch = st == FM_OK ? malloc(sizeof *scratch * ((size_t)nshares + t + 1)) : NULL; /* see rebuild */
    if (st == FM_OK && !scratch)
        st = FM_ERR_NOMEM;
    for (uint32_t i = 0; st == FM_OK && i < k2; i++) {
        uint32_t j = u2[i].who;
        bool survived = in[j] & 2;
        uint8_t secret[32];
        if ((st = rebuild(shares, nshares, &u2[i], survived ? 0 : 1, t, round, scratch, secret)) != FM_OK) {
            *unbuilt = j;
            break;
        }
        if (survived) { /* its self mask */
            st = add_mask(sum, d, secret, -1);
        } else { /* it dropped after sharing: the pair masks the survivors added with it */
            for (uint32_t m = 0; st == FM_OK && m < k2; m++) {
                uint32_t i3 = u2[m].who;
                if (!(in[i3] & 2))
                    continue;
                uint8_t seed[32];
                if ((st = agree(secret, u2[m].s_pk, "fedmoe secagg mask", round, j, i3, seed)) == FM_OK)
                    st = add_mask(sum, d, seed, i3 < j ? -1 : +1);
                OPENSSL_cleanse(seed, sizeof seed);
            }
        }
        OPENSSL_cleanse(secret, sizeof secret);
    }
    free(in);
    if (!scratch)
        return st;
    OPENSSL_cleanse(scratch, sizeof *scratch * ((size_t)nshares + t + 1));
    free(scratch);
    /* what k3 updates can sum to: each value below 2^99 in size, the weight
     * 1..2^29 each; a value with a mask left in is uniform mod 2^128 and
     * lands in range with chance about k3 x 2^-28 */
    __int128 lim = (__int128)k3 << 99;
    for (size_t i = 0; st == FM_OK && i < d; i++) {
        __int128 v = (__int128)sum[i];
        if (v > lim || v < -lim)
            st = bad(FM_ERR_STATE, "secure aggregation: value %u of the unmasked sum is out of range (%u inputs): "
                     "a mask is left in", (uint32_t)i, k3);
    }
    if (st == FM_OK && (sum[d] < k3 || sum[d] > (fm_u128)k3 * FM_AGG_MAX_WEIGHT))
        st = bad(FM_ERR_STATE, "secure aggregation: the unmasked weight is out of range (%u inputs, threshold %u): "
                 "a mask is left in", k3, t);
    return st;
}
