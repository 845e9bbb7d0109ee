#include "fedmoe/knn.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/kernels.h"

#define QUERY_BLOCK 64 /* queries per GEMM: a block's distances are QUERY_BLOCK x n floats */

/* Inserts (d2, i) into the sorted best list of at most k (found so far);
 * equal distances keep the lower index first when i comes in increasing order. */
static void insert(double *best, int *out, int *found, int k, double d2, int i)
{
    int pos = *found;
    while (pos > 0 && best[pos - 1] > d2)
        pos--;
    if (pos >= k)
        return;
    int last = *found < k ? *found : k - 1;
    for (int q = last; q > pos; q--) {
        best[q] = best[q - 1];
        out[q] = out[q - 1];
    }
    best[pos] = d2;
    out[pos] = i;
    if (*found < k)
        (*found)++;
}

static double exact_d2(const float *a, const float *b, size_t dim)
{
    double d2 = 0.0;
    for (size_t j = 0; j < dim; j++) {
        double t = (double)a[j] - b[j];
        d2 += t * t;
    }
    return d2;
}

int fm_knn(const float *const *entries, int n, size_t dim, int self, int k, int *out)
{
    if (self < 0 || self >= n || !entries[self] || k <= 0)
        return 0;
    int found = 0;
    double best[k];
    for (int i = 0; i < n; i++)
        if (i != self && entries[i])
            insert(best, out, &found, k, exact_d2(entries[i], entries[self], dim), i);
    return found;
}

static double sumsq(const float *x, size_t dim)
{
    double s = 0.0;
    for (size_t j = 0; j < dim; j++)
        s += (double)x[j] * x[j];
    return s;
}

/* One query: approximate squared distances a_j = qq + pp_j - 2 g_j (g the GEMM's
 * q.p_j) with the bound e_j on |a_j - d2_j|: the float dot product is off by at
 * most gamma |q| |p_j| (gamma = dim u / (1 - dim u), u = 2^-24, |q.p| summed in
 * any order), the rest in double is nearly exact; doubled for safety. */
static void one_query(const float *const *entries, const int *live, int nl, size_t dim, const double *pp,
                      const float *g, double *lower, int self, int k, int *out, int *found)
{
    const float *q = entries[self];
    double qq = sumsq(q, dim), u = ldexp(1.0, -24), gamma = dim * u / (1.0 - dim * u);
    double tops[k]; /* the k smallest upper bounds, ascending */
    int ntops = 0, dummy[k];
    for (int j = 0; j < nl; j++) {
        if (live[j] == self)
            continue;
        double a = qq + pp[j] - 2.0 * (double)g[j];
        double e = 2.0 * (2.0 * gamma * sqrt(qq * pp[j]) + 1e-12 * (qq + pp[j]));
        lower[j] = a - e;
        insert(tops, dummy, &ntops, k, a + e, j);
    }
    double t = ntops == k ? tops[k - 1] : INFINITY;
    double best[k];
    *found = 0;
    for (int j = 0; j < nl; j++) /* (in increasing pool index: ties as fm_knn) */
        if (live[j] != self && lower[j] <= t)
            insert(best, out, found, k, exact_d2(entries[live[j]], q, dim), live[j]);
}

fm_status fm_knn_batch(const float *const *entries, int n, size_t dim, const int *selves, int m, int k, int *out,
                       int *found)
{
    memset(found, 0, sizeof(int) * (size_t)m);
    if (k <= 0 || m <= 0)
        return FM_OK;
    int *live = malloc(sizeof(int) * (size_t)(n > 0 ? n : 1)), nl = 0;
    for (int i = 0; live && i < n; i++)
        if (entries[i])
            live[nl++] = i;
    float *pool = malloc(sizeof(float) * dim * (size_t)(nl ? nl : 1));
    float *qs = malloc(sizeof(float) * dim * QUERY_BLOCK);
    float *g = malloc(sizeof(float) * QUERY_BLOCK * (size_t)(nl ? nl : 1));
    double *pp = malloc(sizeof(double) * (size_t)(nl ? nl : 1)), *lower = malloc(sizeof(double) * (size_t)(nl ? nl : 1));
    int *which = malloc(sizeof(int) * QUERY_BLOCK);
    fm_status st = live && pool && qs && g && pp && lower && which ? FM_OK : FM_ERR_NOMEM;
    for (int j = 0; st == FM_OK && j < nl; j++) {
        memcpy(pool + (size_t)j * dim, entries[live[j]], sizeof(float) * dim);
        pp[j] = sumsq(entries[live[j]], dim);
    }
    for (int q0 = 0; st == FM_OK && q0 < m; q0 += QUERY_BLOCK) {
        int b = 0;
        for (int q = q0; q < m && q < q0 + QUERY_BLOCK; q++)
            if (selves[q] >= 0 && selves[q] < n && entries[selves[q]]) {
                memcpy(qs + (size_t)b * dim, entries[selves[q]], sizeof(float) * dim);
                which[b++] = q;
            }
        fm_gemm(false, true, b, nl, (int)dim, 1.0f, qs, (int)dim, pool, (int)dim, 0.0f, g, nl);
        for (int r = 0; r < b; r++)
            one_query(entries, live, nl, dim, pp, g + (size_t)r * nl, lower, selves[which[r]], k,
                      out + (size_t)which[r] * k, &found[which[r]]);
    }
    free(live);
    free(pool);
    free(qs);
    free(g);
    free(pp);
    free(lower);
    free(which);
    return st;
}
