/* knn.h - K-nearest prompts (pFedMoAP): each client gets, as frozen experts,
 * the pool prompts nearest (L2) to its own.
 *
 * fm_knn is the definition: exact squared distances summed in double in index
 * order, ties to the lower index. fm_knn_batch gives the same answers for many
 * clients at once, fast: it computes every distance of a block of clients to
 * the whole pool with one GEMM (|q|^2 + |p|^2 - 2 q.p), bounds the rounding
 * error of each, keeps only the entries whose lower bound is within the K-th
 * smallest upper bound, and ranks those by the exact distance. An entry left
 * out is provably farther than K others, so the result is fm_knn's, bit for
 * bit, whatever the BLAS's summation order. */
#ifndef FEDMOE_KNN_H
#define FEDMOE_KNN_H

#include <stddef.h>

#include "fedmoe/status.h"

/* The k entries nearest (L2) to entries[self] among entries[0..n) that are not
 * NULL, excluding self; ties go to the lower index. Writes their indices, nearest
 * first, to out and returns how many (fewer than k when fewer exist; 0 when
 * entries[self] is NULL). */
int fm_knn(const float *const *entries, int n, size_t dim, int self, int k, int *out);

/* fm_knn for m queries at once: for each q, the k nearest to entries[selves[q]]
 * into out[q * k ..] and their count into found[q]. FM_ERR_NOMEM, or FM_OK. */
fm_status fm_knn_batch(const float *const *entries, int n, size_t dim, const int *selves, int m, int k, int *out,
                       int *found);

#endif
