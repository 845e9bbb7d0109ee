/* rng.h - a portable counter-based random generator (Philox4x32-10).
 *
 * Everything random that several parties must agree on (the class-text encoder,
 * the partitions) is drawn from (seed, stream, counter) alone, with integer
 * arithmetic, so every machine derives the same values. Uniform floats are made
 * from integers exactly; only normals and gammas use libm. */
#ifndef FEDMOE_RNG_H
#define FEDMOE_RNG_H

#include <stddef.h>
#include <stdint.h>

/* Named streams: independent sequences drawn from one run seed. */
enum {
    FM_STREAM_ENCODER = 1,    /* the frozen class-text encoder */
    FM_STREAM_PARTITION = 2,  /* client partitions and splits */
    FM_STREAM_INIT = 3,       /* initial model parameters (shared part) */
    FM_STREAM_LOCAL = 0x100,  /* + client index: a client's own draws */
};

typedef struct {
    uint32_t key[2];
    uint64_t stream;
    uint64_t counter;
    uint32_t buf[4];
    int used; /* how many of buf have been handed out */
} fm_rng_t;

/* The raw Philox4x32-10 bijection (exposed for known-answer tests). */
void fm_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

void fm_rng_init(fm_rng_t *r, uint64_t seed, uint64_t stream);
uint32_t fm_rng_u32(fm_rng_t *r);
uint64_t fm_rng_u64(fm_rng_t *r);
/* Uniform in [0, 1) with 24 random bits (exact in float). */
float fm_rng_uniform(fm_rng_t *r);
/* Uniform in [0, 1) with 53 random bits. */
double fm_rng_uniform_double(fm_rng_t *r);
/* Uniform integer in [0, n), unbiased. n > 0. */
uint32_t fm_rng_below(fm_rng_t *r, uint32_t n);
/* Standard normal (Box-Muller). */
double fm_rng_normal(fm_rng_t *r);
/* Gamma(alpha, 1), alpha > 0 (Marsaglia-Tsang). */
double fm_rng_gamma(fm_rng_t *r, double alpha);
/* Fisher-Yates shuffle of a[0..n). */
void fm_rng_shuffle(fm_rng_t *r, uint32_t *a, size_t n);
/* Fills x[0..n) uniformly in [-bound, bound]. */
void fm_rng_fill_uniform(fm_rng_t *r, float *x, size_t n, float bound);

#endif
