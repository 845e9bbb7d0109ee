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

/* The one stream table. Every random sequence is drawn from (seed, stream) and
 * every stream id is fm_rng_stream(purpose, index): the purpose in the top 8
 * bits, the index (a client's partition, a round) in the low 56. Two different
 * (purpose, index) pairs never share a stream, for any index up to
 * FM_STREAM_INDEX_MAX, so no two purposes can collide (tests/test_rng.c). */
typedef enum {
    FM_STREAM_ENCODER = 1,  /* the frozen class-text encoder (index 0) */
    FM_STREAM_PARTITION,    /* client partitions (index 0) */
    FM_STREAM_INIT,         /* initial shared and prompt parameters (index 0); the coordinator's
                             * initial local parameters, for strategies that average them (1) */
    FM_STREAM_SPLIT,        /* a client's train / validation / test split (client index) */
    FM_STREAM_HOLDOUT,      /* a client's holdout re-split (client index) */
    FM_STREAM_LOCAL,        /* a client's initial local parameters (partition index) */
    FM_STREAM_SHUFFLE,      /* a client's batch order (partition index) */
    FM_STREAM_SELECT,       /* the coordinator's choice of participants (round) */
    FM_STREAM_RUN_ID,       /* a new run's id suffix (index 0; seeded from the clock) */
    FM_STREAM_TEST,         /* tests, benchmarks and tools (any index) */
    FM_STREAM_CAP,          /* the order a client's capped splits keep examples in (client index) */
    FM_STREAM_CAP_SIZE,     /* a client's cap drawn from a range (client index) */
    FM_STREAM_NOISE,        /* the noise domain's noise of an example (its index in the dataset) */
    FM_STREAM_TILES,        /* the tile permutation of the patches domain (index 0) */
    FM_STREAM_CONCEPT,      /* a concept group's label map (group index) */
    FM_STREAM_PURPOSES      /* count; at most 256 */
} fm_stream_purpose;

#define FM_STREAM_INDEX_MAX ((1ull << 56) - 1)

/* The stream id of (purpose, index); index must be <= FM_STREAM_INDEX_MAX. */
uint64_t fm_rng_stream(fm_stream_purpose purpose, uint64_t index);
/* The inverse: the purpose and index a stream id was made from. */
fm_stream_purpose fm_rng_stream_purpose(uint64_t stream);
uint64_t fm_rng_stream_index(uint64_t stream);

typedef struct {
    uint32_t key[2];
    uint64_t stream;
    uint64_t counter;
    uint32_t buf[4];
    int used; /* how many of buf have been handed out */
} fm_rng_t;

/* The raw Philox4x32-10 bijection (exposed for known-answer tests). */
void fm_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* A generator at the start of (seed, stream) (a value, no resources), and its
 * next 32 or 64 random bits. */
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
