#include "fedmoe/rng.h"

#include <assert.h>
#include <math.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void fm_philox4x32_10(const uint32_t in[4], const uint32_t key_in[2], uint32_t out[4])
{
    uint32_t c0 = in[0], c1 = in[1], c2 = in[2], c3 = in[3];
    uint32_t k0 = key_in[0], k1 = key_in[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

uint64_t fm_rng_stream(fm_stream_purpose purpose, uint64_t index)
{
    assert((unsigned)purpose < FM_STREAM_PURPOSES && index <= FM_STREAM_INDEX_MAX);
    return ((uint64_t)purpose << 56) | index;
}

fm_stream_purpose fm_rng_stream_purpose(uint64_t stream) { return (fm_stream_purpose)(stream >> 56); }
uint64_t fm_rng_stream_index(uint64_t stream) { return stream & FM_STREAM_INDEX_MAX; }

void fm_rng_init(fm_rng_t *r, uint64_t seed, uint64_t stream)
{
    r->key[0] = (uint32_t)seed;
    r->key[1] = (uint32_t)(seed >> 32);
    r->stream = stream;
    r->counter = 0;
    r->used = 4;
}

uint32_t fm_rng_u32(fm_rng_t *r)
{
    if (r->used == 4) {
        uint32_t ctr[4] = {(uint32_t)r->counter, (uint32_t)(r->counter >> 32),
                           (uint32_t)r->stream, (uint32_t)(r->stream >> 32)};
        fm_philox4x32_10(ctr, r->key, r->buf);
        r->counter++;
        r->used = 0;
    }
    return r->buf[r->used++];
}

uint64_t fm_rng_u64(fm_rng_t *r)
{
    uint64_t hi = fm_rng_u32(r);
    return (hi << 32) | fm_rng_u32(r);
}

float fm_rng_uniform(fm_rng_t *r) { return (float)(fm_rng_u32(r) >> 8) * (1.0f / 16777216.0f); }

double fm_rng_uniform_double(fm_rng_t *r) { return (double)(fm_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }

uint32_t fm_rng_below(fm_rng_t *r, uint32_t n)
{
    uint32_t limit = (uint32_t)(-n) % n; /* 2^32 mod n: reject the biased low values */
    uint32_t x;
    do {
        x = fm_rng_u32(r);
    } while (x < limit);
    return x % n;
}

double fm_rng_normal(fm_rng_t *r)
{
    double u1 = 1.0 - fm_rng_uniform_double(r); /* (0, 1] */
    double u2 = fm_rng_uniform_double(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

double fm_rng_gamma(fm_rng_t *r, double alpha)
{
    if (alpha < 1.0) {
        /* Gamma(a) = Gamma(a + 1) * U^(1/a) */
        double u = 1.0 - fm_rng_uniform_double(r);
        return fm_rng_gamma(r, alpha + 1.0) * pow(u, 1.0 / alpha);
    }
    double d = alpha - 1.0 / 3.0, c = 1.0 / sqrt(9.0 * d);
    for (;;) {
        double x, v;
        do {
            x = fm_rng_normal(r);
            v = 1.0 + c * x;
        } while (v <= 0.0);
        v = v * v * v;
        double u = 1.0 - fm_rng_uniform_double(r);
        if (u < 1.0 - 0.0331 * x * x * x * x)
            return d * v;
        if (log(u) < 0.5 * x * x + d * (1.0 - v + log(v)))
            return d * v;
    }
}

void fm_rng_shuffle(fm_rng_t *r, uint32_t *a, size_t n)
{
    for (size_t i = n; i > 1; i--) {
        size_t j = fm_rng_below(r, (uint32_t)i);
        uint32_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

void fm_rng_fill_uniform(fm_rng_t *r, float *x, size_t n, float bound)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (2.0f * fm_rng_uniform(r) - 1.0f) * bound;
}
