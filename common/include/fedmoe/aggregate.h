/* aggregate.h - exact, order-independent weighted averaging, and K-nearest prompts.
 *
 * The aggregator accumulates weight * x for each update as it arrives, in 128-bit
 * fixed point (2^-40 resolution): integer addition is associative, so the result
 * does not depend on the order in which updates arrive, and memory stays one
 * accumulator per parameter whatever the number of clients. */
#ifndef FEDMOE_AGGREGATE_H
#define FEDMOE_AGGREGATE_H

#include <stddef.h>
#include <stdint.h>

#include "fedmoe/status.h"

/* Largest |value| and weight the aggregator takes (larger is an error). */
#define FM_AGG_MAX_ABS 1073741824.0 /* 2^30 */
#define FM_AGG_MAX_WEIGHT (1ull << 29)

typedef struct fm_aggregator fm_aggregator_t;

/* An aggregator of n values; caller destroys it. */
fm_status fm_aggregator_new(fm_aggregator_t **out, size_t n);
/* Frees the aggregator, sets *a to NULL; safe on NULL. */
void fm_aggregator_destroy(fm_aggregator_t **a);
/* Forgets everything added. */
void fm_aggregator_reset(fm_aggregator_t *a);
/* Checks that x (n values) can be added with this weight: finite, within
 * FM_AGG_MAX_ABS, 0 < weight <= FM_AGG_MAX_WEIGHT. */
fm_status fm_aggregator_check(const fm_aggregator_t *a, const float *x, uint64_t weight);
/* Adds weight * x; checks first and changes nothing on error. */
fm_status fm_aggregator_add(fm_aggregator_t *a, const float *x, uint64_t weight);
/* out (n) = sum(weight x) / sum(weight). FM_ERR_STATE when nothing was added. */
fm_status fm_aggregator_mean(const fm_aggregator_t *a, float *out);
/* Its vector length, the total weight and the number of updates added so far. */
size_t fm_aggregator_size(const fm_aggregator_t *a);
uint64_t fm_aggregator_total_weight(const fm_aggregator_t *a);
int fm_aggregator_count(const fm_aggregator_t *a);

/* The k entries nearest (L2) to entries[self] among entries[0..n) that are not
 * NULL, excluding self; ties go to the lower index. Writes their indices, nearest
 * first, to out and returns how many (fewer than k when fewer exist; 0 when
 * entries[self] is NULL). */
int fm_knn(const float *const *entries, int n, size_t dim, int self, int k, int *out);

#endif
