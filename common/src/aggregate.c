#include "fedmoe/aggregate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/log.h"

#define FIXED_BITS 40

struct fm_aggregator {
    size_t n;
    __int128 *acc;
    uint64_t total;
    int count;
    fm_agg_spec_t spec;
    bool keep;      /* mean: keep the updates and sum them at the end (fm_aggregator_keep) */
    float *rows;    /* robust rules and keep: the updates added, count x n */
    uint64_t *wts;  /* and their weights */
    int rows_cap;   /* rows allocated */
};

void fm_agg_spec_name(const fm_agg_spec_t *s, char *buf, size_t cap)
{
    if (s->rule == FM_AGG_TRIMMED_MEAN)
        snprintf(buf, cap, "trimmed-mean:%g", s->trim);
    else
        snprintf(buf, cap, "%s", s->rule == FM_AGG_MEDIAN ? "median" : "mean");
}

fm_status fm_agg_spec_parse(const char *flag, const char *text, fm_agg_spec_t *out)
{
    fm_agg_spec_t s = {FM_AGG_MEAN, 0.0};
    if (!strcmp(text, "mean")) {
        s.rule = FM_AGG_MEAN;
    } else if (!strcmp(text, "median")) {
        s.rule = FM_AGG_MEDIAN;
    } else if (!strncmp(text, "trimmed-mean:", 13)) {
        char *end;
        s.rule = FM_AGG_TRIMMED_MEAN;
        s.trim = strtod(text + 13, &end);
        if (end == text + 13 || *end || !(s.trim > 0.0 && s.trim < 0.5)) {
            fm_error_set("%s: '%s': the trimmed fraction must be a number in (0, 0.5), e.g. trimmed-mean:0.2", flag,
                         text);
            return FM_ERR_ARG;
        }
    } else {
        fm_error_set("%s: '%s' is not mean, median or trimmed-mean:F", flag, text);
        return FM_ERR_ARG;
    }
    *out = s;
    return FM_OK;
}

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
    free((*ap)->rows);
    free((*ap)->wts);
    free(*ap);
    *ap = NULL;
}

void fm_aggregator_set_rule(fm_aggregator_t *a, const fm_agg_spec_t *s)
{
    a->spec = *s;
    fm_aggregator_reset(a);
}

void fm_aggregator_reset(fm_aggregator_t *a)
{
    memset(a->acc, 0, sizeof(__int128) * a->n);
    a->total = 0;
    a->count = 0;
}

static bool keeps_rows(const fm_aggregator_t *a) { return a->keep || a->spec.rule != FM_AGG_MEAN; }

void fm_aggregator_keep(fm_aggregator_t *a, bool keep)
{
    a->keep = keep;
    fm_aggregator_reset(a);
}

fm_status fm_aggregator_reserve(fm_aggregator_t *a, int k)
{
    if (!keeps_rows(a) || k <= a->rows_cap)
        return FM_OK;
    float *r = realloc(a->rows, sizeof(float) * a->n * (size_t)k);
    if (r)
        a->rows = r;
    uint64_t *w = r ? realloc(a->wts, sizeof(uint64_t) * (size_t)k) : NULL;
    if (!w) {
        fm_error_set("out of memory keeping %d updates of %zu values", k, a->n);
        return FM_ERR_NOMEM;
    }
    a->wts = w;
    a->rows_cap = k;
    return FM_OK;
}

int fm_aggregator_clip_rows(fm_aggregator_t *a, const float *ref, double bound)
{
    int clipped = 0;
    for (int i = 0; keeps_rows(a) && i < a->count; i++)
        clipped += fm_clip_to_norm(a->rows + (size_t)i * a->n, ref, a->n, bound) > bound;
    return clipped;
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

/* x * w is exact in double (24 + 29 bits); scaling by 2^40 is exact; the
 * conversion truncates toward zero, a function of the value alone */
static inline __int128 fixed(float x, double w) { return (__int128)ldexp((double)x * w, FIXED_BITS); }

fm_status fm_aggregator_add(fm_aggregator_t *a, const float *x, uint64_t weight)
{
    fm_status st = fm_aggregator_check(a, x, weight);
    if (st != FM_OK)
        return st;
    if (keeps_rows(a)) {
        if (a->count == a->rows_cap && (st = fm_aggregator_reserve(a, a->rows_cap ? 2 * a->rows_cap : 8)) != FM_OK)
            return st;
        memcpy(a->rows + a->n * (size_t)a->count, x, sizeof(float) * a->n);
        a->wts[a->count] = weight;
        a->total += weight;
        a->count++;
        return FM_OK;
    }
    double w = (double)weight;
    for (size_t i = 0; i < a->n; i++)
        a->acc[i] += fixed(x[i], w);
    a->total += weight;
    a->count++;
    return FM_OK;
}

static int cmp_float(const void *x, const void *y)
{
    float a = *(const float *)x, b = *(const float *)y;
    return (a > b) - (a < b);
}

static void sort_floats(float *v, int k)
{
    if (k > 32) {
        qsort(v, (size_t)k, sizeof(float), cmp_float);
        return;
    }
    for (int i = 1; i < k; i++) {
        float t = v[i];
        int j = i;
        for (; j > 0 && v[j - 1] > t; j--)
            v[j] = v[j - 1];
        v[j] = t;
    }
}

/* The robust rules, one coordinate at a time over the sorted column: the
 * result depends on the multiset of values alone, not on arrival order. */
static fm_status robust_result(const fm_aggregator_t *a, float *out)
{
    int k = a->count, cut = 0;
    float *col = malloc(sizeof(float) * (size_t)k);
    if (!col)
        return FM_ERR_NOMEM;
    if (a->spec.rule == FM_AGG_TRIMMED_MEAN) {
        cut = (int)floor(a->spec.trim * k);
        cut = k - 2 * cut >= 1 ? cut : (k - 1) / 2;
    }
    for (size_t j = 0; j < a->n; j++) {
        for (int i = 0; i < k; i++)
            col[i] = a->rows[(size_t)i * a->n + j];
        sort_floats(col, k);
        if (a->spec.rule == FM_AGG_MEDIAN) {
            out[j] = k % 2 ? col[k / 2] : (float)(((double)col[k / 2 - 1] + col[k / 2]) * 0.5);
        } else {
            double s = 0.0;
            for (int i = cut; i < k - cut; i++)
                s += col[i];
            out[j] = (float)(s / (k - 2 * cut));
        }
    }
    free(col);
    return FM_OK;
}

fm_status fm_aggregator_result(const fm_aggregator_t *a, float *out)
{
    if (a->count == 0) {
        fm_error_set("nothing to average");
        return FM_ERR_STATE;
    }
    if (a->spec.rule != FM_AGG_MEAN)
        return robust_result(a, out);
    double inv = 1.0 / (double)a->total;
    if (a->keep) { /* the same exact sums, over the kept rows */
        for (size_t j = 0; j < a->n; j++) {
            __int128 s = 0;
            for (int i = 0; i < a->count; i++)
                s += fixed(a->rows[(size_t)i * a->n + j], (double)a->wts[i]);
            out[j] = (float)(ldexp((double)s, -FIXED_BITS) * inv);
        }
        return FM_OK;
    }
    for (size_t i = 0; i < a->n; i++)
        out[i] = (float)(ldexp((double)a->acc[i], -FIXED_BITS) * inv);
    return FM_OK;
}

size_t fm_aggregator_size(const fm_aggregator_t *a) { return a->n; }
uint64_t fm_aggregator_total_weight(const fm_aggregator_t *a) { return a->total; }
int fm_aggregator_count(const fm_aggregator_t *a) { return a->count; }

double fm_clip_to_norm(float *x, const float *ref, size_t n, double bound)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - ref[i];
        s += d * d;
    }
    double norm = sqrt(s);
    if (bound > 0.0 && norm > bound) {
        double f = bound / norm;
        for (size_t i = 0; i < n; i++)
            x[i] = (float)(ref[i] + ((double)x[i] - ref[i]) * f);
    }
    return norm;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

double fm_median(double *v, int n)
{
    if (n <= 0)
        return 0.0;
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

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
