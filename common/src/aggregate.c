#include "fedmoe/aggregate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/log.h"

#define FIXED_BITS 40

struct fm_aggregator {
    size_t n;
    __int128 *acc;
    uint64_t total;
    int count;
};

fm_status fm_aggregator_new(fm_aggregator_t **out, size_t n)
{
    *out = NULL;
    fm_aggregator_t *a = calloc(1, sizeof *a);
    if (!a)
        return FM_ERR_NOMEM;
    a->n = n;
    a->acc = calloc(n ? n : 1, sizeof(__int128));
    if (!a->acc) {
        free(a);
        return FM_ERR_NOMEM;
    }
    *out = a;
    return FM_OK;
}

void fm_aggregator_destroy(fm_aggregator_t **ap)
{
    if (!ap || !*ap)
        return;
    free((*ap)->acc);
    free(*ap);
    *ap = NULL;
}

void fm_aggregator_reset(fm_aggregator_t *a)
{
    memset(a->acc, 0, sizeof(__int128) * a->n);
    a->total = 0;
    a->count = 0;
}

fm_status fm_aggregator_check(const fm_aggregator_t *a, const float *x, uint64_t weight)
{
    if (weight == 0 || weight > FM_AGG_MAX_WEIGHT) {
        fm_error_set("weight %llu out of range 1..%llu", (unsigned long long)weight, FM_AGG_MAX_WEIGHT);
        return FM_ERR_ARG;
    }
    if (a->total + weight > (1ull << 62)) {
        fm_error_set("total weight overflows");
        return FM_ERR_ARG;
    }
    for (size_t i = 0; i < a->n; i++)
        if (!(fabsf(x[i]) <= (float)FM_AGG_MAX_ABS)) {
            fm_error_set("value %zu (%g) is not finite or beyond %g", i, (double)x[i], FM_AGG_MAX_ABS);
            return FM_ERR_ARG;
        }
    return FM_OK;
}

fm_status fm_aggregator_add(fm_aggregator_t *a, const float *x, uint64_t weight)
{
    fm_status st = fm_aggregator_check(a, x, weight);
    if (st != FM_OK)
        return st;
    double w = (double)weight;
    for (size_t i = 0; i < a->n; i++) {
        /* x * w is exact in double (24 + 29 bits); scaling by 2^40 is exact; the
         * conversion truncates toward zero, a function of the value alone */
        a->acc[i] += (__int128)ldexp((double)x[i] * w, FIXED_BITS);
    }
    a->total += weight;
    a->count++;
    return FM_OK;
}

fm_status fm_aggregator_mean(const fm_aggregator_t *a, float *out)
{
    if (a->count == 0) {
        fm_error_set("nothing to average");
        return FM_ERR_STATE;
    }
    double inv = 1.0 / (double)a->total;
    for (size_t i = 0; i < a->n; i++)
        out[i] = (float)(ldexp((double)a->acc[i], -FIXED_BITS) * inv);
    return FM_OK;
}

size_t fm_aggregator_size(const fm_aggregator_t *a) { return a->n; }
uint64_t fm_aggregator_total_weight(const fm_aggregator_t *a) { return a->total; }
int fm_aggregator_count(const fm_aggregator_t *a) { return a->count; }

int fm_knn(const float *const *entries, int n, size_t dim, int self, int k, int *out)
{
    if (self < 0 || self >= n || !entries[self] || k <= 0)
        return 0;
    const float *me = entries[self];
    int found = 0;
    double best[k];
    for (int i = 0; i < n; i++) {
        if (i == self || !entries[i])
            continue;
        double d2 = 0.0;
        for (size_t j = 0; j < dim; j++) {
            double t = (double)entries[i][j] - me[j];
            d2 += t * t;
        }
        /* insertion into the sorted list of the best k; equal distances keep the lower index first */
        int pos = found;
        while (pos > 0 && best[pos - 1] > d2)
            pos--;
        if (pos >= k)
            continue;
        int last = found < k ? found : k - 1;
        for (int q = last; q > pos; q--) {
            best[q] = best[q - 1];
            out[q] = out[q - 1];
        }
        best[pos] = d2;
        out[pos] = i;
        if (found < k)
            found++;
    }
    return found;
}
