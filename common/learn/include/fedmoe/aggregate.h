/* aggregate.h - exact, order-independent aggregation rules and norm clipping.
 *
 * Rule mean (the default): the aggregator accumulates weight * x for each update
 * as it arrives, in 128-bit fixed point (2^-40 resolution): integer addition is
 * associative, so the result does not depend on the order in which updates
 * arrive, and memory stays one accumulator per parameter whatever the number of
 * clients. The robust rules, coordinate-wise median and trimmed mean (Yin et al.
 * 2018), keep every update of the round and, per coordinate, sort the values:
 * the result is a function of the set of updates alone. Kept updates beyond
 * FM_AGG_MEMORY bytes go to an unlinked temporary file (in $TMPDIR, else /tmp),
 * read back in blocks, so memory stays bounded whatever the number of clients
 * (disk: updates x values). They are unweighted: a client's sample count buys it no more than one
 * value per coordinate. */
#ifndef FEDMOE_AGGREGATE_H
#define FEDMOE_AGGREGATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fedmoe/status.h"

/* Largest |value| and weight the aggregator takes (larger is an error). */
#define FM_AGG_MAX_ABS 1073741824.0 /* 2^30 */
#define FM_AGG_MAX_WEIGHT (1ull << 29)
/* Bytes of kept updates held in memory at most (the rest in a file). */
#define FM_AGG_MEMORY ((size_t)16 << 20)

typedef struct fm_aggregator fm_aggregator_t;

typedef enum {
    FM_AGG_MEAN = 0,     /* weighted mean */
    FM_AGG_TRIMMED_MEAN, /* per coordinate: drop the floor(trim x k) smallest and largest, average the rest */
    FM_AGG_MEDIAN,       /* per coordinate: the median (the mean of the two middle values for even k) */
} fm_agg_rule;

/* A rule and its parameter, as the flag --aggregate spells them. */
typedef struct {
    fm_agg_rule rule;
    double trim; /* trimmed mean: the fraction cut at each end, in (0, 0.5) */
} fm_agg_spec_t;
/* "mean", "median", "trimmed-mean:0.2" into buf; and the inverse (FM_ERR_ARG
 * with a reason naming flag). */
void fm_agg_spec_name(const fm_agg_spec_t *s, char *buf, size_t cap);
fm_status fm_agg_spec_parse(const char *flag, const char *text, fm_agg_spec_t *out);

/* An aggregator of n values; caller destroys it. */
fm_status fm_aggregator_new(fm_aggregator_t **out, size_t n);
/* Frees the aggregator, sets *a to NULL; safe on NULL. */
void fm_aggregator_destroy(fm_aggregator_t **a);
/* Sets the rule (mean when never set); forgets everything added. */
void fm_aggregator_set_rule(fm_aggregator_t *a, const fm_agg_spec_t *s);
/* Forgets everything added (a robust rule keeps its buffer for the next round). */
void fm_aggregator_reset(fm_aggregator_t *a);
/* Mean: keep every update (memory: updates x values) instead of summing as
 * they come, so that they can be clipped once all are in
 * (fm_aggregator_clip_rows); the result is the same exact weighted mean. Forgets
 * everything added. */
void fm_aggregator_keep(fm_aggregator_t *a, bool keep);
/* Bytes of kept updates held in memory (FM_AGG_MEMORY unless set; tests set
 * less to exercise the file). */
void fm_aggregator_set_memory(fm_aggregator_t *a, size_t bytes);
/* Clips every kept update to distance bound from ref (fm_clip_to_norm);
 * returns how many were clipped. */
int fm_aggregator_clip_rows(fm_aggregator_t *a, const float *ref, double bound);
/* Mean that keeps: sums the kept updates (clip them first) and goes on summing
 * as updates come, holding none (the result is the same exact weighted mean);
 * nothing under a robust rule or when not keeping. */
void fm_aggregator_fold(fm_aggregator_t *a);
/* Updates held as copies (in memory or the file) at the moment. */
int fm_aggregator_held(const fm_aggregator_t *a);
/* Whether kept updates went to the spill file (more than the memory allows). */
bool fm_aggregator_spilled(const fm_aggregator_t *a);
/* Makes room for k updates (robust rules keep them), so that adding up to k
 * checked updates cannot fail for want of memory (writing the file can:
 * FM_ERR_IO). */
fm_status fm_aggregator_reserve(fm_aggregator_t *a, int k);
/* Checks that x (n values) can be added with this weight: finite, within
 * FM_AGG_MAX_ABS, 0 < weight <= FM_AGG_MAX_WEIGHT. */
fm_status fm_aggregator_check(const fm_aggregator_t *a, const float *x, uint64_t weight);
/* Adds weight * x (mean) or keeps a copy of x (robust rules); checks first and
 * changes nothing on error (FM_ERR_NOMEM or FM_ERR_IO when a copy cannot be
 * kept). */
fm_status fm_aggregator_add(fm_aggregator_t *a, const float *x, uint64_t weight);
/* out (n) = the rule over what was added: sum(weight x) / sum(weight) for mean.
 * FM_ERR_STATE when nothing was added. */
fm_status fm_aggregator_result(const fm_aggregator_t *a, float *out);
/* The mean's fixed point: weight x value x 2^FM_AGG_FIXED_BITS, truncated
 * toward zero, in 128 bits. x * w is exact in double (24 + 29 bits) and so is
 * the scaling; computed as (__int128)ldexp(v, 40) without the slow software
 * conversion to 128 bits: v = hi + frac exactly (|v| < 2^59, hi = trunc(v)),
 * frac has v's sign and |frac| < 1, so trunc(v 2^40) = hi 2^40 + trunc(frac
 * 2^40), both parts converted by the hardware. A function of the value
 * alone: secure aggregation's clients compute the same integers. */
#define FM_AGG_FIXED_BITS 40
static inline __int128 fm_agg_fixed(float x, double w)
{
    double v = (double)x * w;
    int64_t hi = (int64_t)v;
    int64_t lo = (int64_t)((v - (double)hi) * (double)(1ull << FM_AGG_FIXED_BITS));
    return (__int128)hi * ((__int128)1 << FM_AGG_FIXED_BITS) + lo;
}
/* Mean: adds a sum of `count` updates already in fixed point (n values: the
 * sum of fm_agg_fixed(x, w) over them) and their total weight, as if each
 * had been added (secure aggregation's unmasked sum); FM_ERR_STATE under a
 * robust rule or when keeping rows. */
fm_status fm_aggregator_add_sum(fm_aggregator_t *a, const __int128 *sum, uint64_t total_weight, int count);
/* Its vector length, the total weight and the number of updates added so far. */
size_t fm_aggregator_size(const fm_aggregator_t *a);
uint64_t fm_aggregator_total_weight(const fm_aggregator_t *a);
int fm_aggregator_count(const fm_aggregator_t *a);

/* Bounds the L2 norm of x - ref (n values) by bound: when it is larger, x
 * becomes ref + (x - ref) x bound / norm. bound <= 0: no bound. Returns the norm
 * before clipping (summed in index order in double: a function of x and ref). */
double fm_clip_to_norm(float *x, const float *ref, size_t n, double bound);
/* Its two steps: the L2 norm of x - ref (summed in index order in double),
 * and x <- ref + (x - ref) x f. */
double fm_distance(const float *x, const float *ref, size_t n);
void fm_scale_toward(float *x, const float *ref, size_t n, double f);
/* The lower median of v[0..n): its ceil(n/2)-th smallest value, which the
 * larger half cannot move (sorts v); 0 when n is 0. */
double fm_lower_median(double *v, int n);

#endif
