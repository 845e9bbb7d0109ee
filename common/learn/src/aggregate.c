#include "fedmoe/aggregate.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fedmoe/log.h"

#define FIXED_BITS FM_AGG_FIXED_BITS

struct fm_aggregator {
    size_t n;
    __int128 *acc;
    uint64_t total;
    int count;
    fm_agg_spec_t spec;
    bool keep;      /* mean: keep the updates and sum them at the end (fm_aggregator_keep) */
    /* robust rules and keep: the updates added (count rows of n), the first
     * mem_rows in memory, the rest in an unlinked temporary file */
    float *rows;
    int rows_cap;   /* rows allocated in memory (at most mem_rows) */
    int mem_rows;
    size_t memory;  /* bytes of kept rows held in memory at most */
    int fd;         /* the spill file, -1: none yet */
    uint64_t *wts;  /* the kept rows' weights */
    int wts_cap;
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
    a->fd = -1;
    fm_aggregator_set_memory(a, FM_AGG_MEMORY);
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
    if ((*ap)->fd >= 0)
        close((*ap)->fd);
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

/* The memory and the file of kept rows go back. */
static void drop_rows(fm_aggregator_t *a)
{
    free(a->rows);
    a->rows = NULL;
    a->rows_cap = 0;
    if (a->fd >= 0)
        close(a->fd);
    a->fd = -1;
}

void fm_aggregator_keep(fm_aggregator_t *a, bool keep)
{
    a->keep = keep;
    fm_aggregator_reset(a);
    if (!keeps_rows(a))
        drop_rows(a);
}

void fm_aggregator_set_memory(fm_aggregator_t *a, size_t bytes)
{
    size_t row = sizeof(float) * (a->n ? a->n : 1), k = bytes / row;
    a->memory = bytes;
    a->mem_rows = k < 1 ? 1 : k > (size_t)1 << 30 ? 1 << 30 : (int)k;
}


/* ---- kept rows: in memory, then in the spill file ---- */

static size_t row_bytes(const fm_aggregator_t *a) { return sizeof(float) * a->n; }

static fm_status spill_open(fm_aggregator_t *a)
{
    if (a->fd >= 0)
        return FM_OK;
    const char *dir = getenv("TMPDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/fedmoe-updates-XXXXXX", dir && *dir ? dir : "/tmp");
    a->fd = mkstemp(path);
    if (a->fd < 0) {
        fm_error_set("cannot make a file for kept updates in %s: %s", dir && *dir ? dir : "/tmp", strerror(errno));
        return FM_ERR_IO;
    }
    unlink(path);
    return FM_OK;
}

/* Reads or writes len floats at offset off of kept row i. */
static fm_status row_io(const fm_aggregator_t *a, int i, size_t off, size_t len, float *buf, bool write)
{
    if (i < a->mem_rows) {
        float *r = a->rows + (size_t)i * a->n + off;
        memcpy(write ? r : buf, write ? buf : r, sizeof(float) * len);
        return FM_OK;
    }
    off_t at = (off_t)((size_t)(i - a->mem_rows) * row_bytes(a) + sizeof(float) * off);
    size_t want = sizeof(float) * len, done = 0;
    while (done < want) {
        ssize_t k = write ? pwrite(a->fd, (const char *)buf + done, want - done, at + (off_t)done)
                          : pread(a->fd, (char *)buf + done, want - done, at + (off_t)done);
        if (k <= 0 && !(k < 0 && errno == EINTR)) {
            fm_error_set("kept updates: %s", k < 0 ? strerror(errno) : "short read");
            return FM_ERR_IO;
        }
        done += k > 0 ? (size_t)k : 0;
    }
    return FM_OK;
}

fm_status fm_aggregator_reserve(fm_aggregator_t *a, int k)
{
    if (!keeps_rows(a))
        return FM_OK;
    if (k > a->wts_cap) {
        uint64_t *w = realloc(a->wts, sizeof(uint64_t) * (size_t)k);
        if (!w) {
            fm_error_set("out of memory keeping %d updates", k);
            return FM_ERR_NOMEM;
        }
        a->wts = w;
        a->wts_cap = k;
    }
    int m = k < a->mem_rows ? k : a->mem_rows;
    if (m > a->rows_cap) {
        float *r = realloc(a->rows, row_bytes(a) * (size_t)m);
        if (!r) {
            fm_error_set("out of memory keeping %d updates of %zu values", m, a->n);
            return FM_ERR_NOMEM;
        }
        a->rows = r;
        a->rows_cap = m;
    }
    return k > a->mem_rows ? spill_open(a) : FM_OK;
}

/* The kept rows' exact weighted sums into acc (the rows are not changed). */
static fm_status sum_rows(const fm_aggregator_t *a, __int128 *acc)
{
    float *x = malloc(row_bytes(a) ? row_bytes(a) : 1);
    fm_status st = x ? FM_OK : FM_ERR_NOMEM;
    for (int i = 0; st == FM_OK && i < a->count; i++) {
        if ((st = row_io(a, i, 0, a->n, x, false)) != FM_OK)
            break;
        for (size_t j = 0; j < a->n; j++)
            acc[j] += fm_agg_fixed(x[j], (double)a->wts[i]);
    }
    free(x);
    return st;
}

void fm_aggregator_fold(fm_aggregator_t *a)
{
    if (!a->keep || a->spec.rule != FM_AGG_MEAN)
        return;
    if (sum_rows(a, a->acc) != FM_OK)
        return; /* (out of memory for one row, or the file unreadable: they stay kept) */
    a->keep = false;
    drop_rows(a);
}

bool fm_aggregator_spilled(const fm_aggregator_t *a) { return a->fd >= 0; }

int fm_aggregator_held(const fm_aggregator_t *a) { return keeps_rows(a) ? a->count : 0; }

int fm_aggregator_clip_rows(fm_aggregator_t *a, const float *ref, double bound)
{
    int clipped = 0;
    float *x = keeps_rows(a) && a->count ? malloc(row_bytes(a)) : NULL;
    for (int i = 0; x && i < a->count; i++) {
        if (row_io(a, i, 0, a->n, x, false) != FM_OK)
            break;
        if (fm_clip_to_norm(x, ref, a->n, bound) > bound) {
            clipped++;
            row_io(a, i, 0, a->n, x, true);
        }
    }
    free(x);
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

fm_status fm_aggregator_add(fm_aggregator_t *a, const float *x, uint64_t weight)
{
    fm_status st = fm_aggregator_check(a, x, weight);
    if (st != FM_OK)
        return st;
    if (keeps_rows(a)) {
        if (a->count == a->wts_cap && (st = fm_aggregator_reserve(a, a->wts_cap ? 2 * a->wts_cap : 8)) != FM_OK)
            return st;
        if ((st = row_io(a, a->count, 0, a->n, (float *)x, true)) != FM_OK)
            return st;
        a->wts[a->count] = weight;
        a->total += weight;
        a->count++;
        return FM_OK;
    }
    double w = (double)weight;
    for (size_t i = 0; i < a->n; i++)
        a->acc[i] += fm_agg_fixed(x[i], w);
    a->total += weight;
    a->count++;
    return FM_OK;
}

fm_status fm_aggregator_add_sum(fm_aggregator_t *a, const __int128 *sum, uint64_t total_weight, int count)
{
    if (keeps_rows(a) || count < 1 || total_weight == 0 || a->total + total_weight < a->total) {
        fm_error_set("a sum of updates is taken only by the mean, not keeping rows, with weight and count");
        return FM_ERR_STATE;
    }
    for (size_t i = 0; i < a->n; i++)
        a->acc[i] += sum[i];
    a->total += total_weight;
    a->count += count;
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
    /* coordinates in blocks of b: every row's slice of the block read at once */
    size_t b = a->memory / (sizeof(float) * (size_t)k);
    b = b < 1 ? 1 : b > a->n ? a->n : b;
    float *col = malloc(sizeof(float) * (size_t)k), *block = malloc(sizeof(float) * (size_t)k * b);
    fm_status st = col && block ? FM_OK : FM_ERR_NOMEM;
    if (a->spec.rule == FM_AGG_TRIMMED_MEAN) {
        cut = (int)floor(a->spec.trim * k);
        cut = k - 2 * cut >= 1 ? cut : (k - 1) / 2;
    }
    for (size_t j = 0; st == FM_OK && j < a->n; j++) {
        size_t at = j % b, len = a->n - (j - at) < b ? a->n - (j - at) : b;
        for (int i = 0; at == 0 && st == FM_OK && i < k; i++)
            st = row_io(a, i, j, len, block + (size_t)i * len, false);
        for (int i = 0; i < k; i++)
            col[i] = block[(size_t)i * len + at];
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
    free(block);
    if (st == FM_ERR_NOMEM)
        fm_error_set("out of memory");
    return st;
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
    if (a->keep) { /* the same exact sums, over the kept rows, a row at a time */
        __int128 *s = calloc(a->n ? a->n : 1, sizeof(__int128));
        fm_status st = s ? sum_rows(a, s) : FM_ERR_NOMEM;
        for (size_t j = 0; st == FM_OK && j < a->n; j++)
            out[j] = (float)(ldexp((double)s[j], -FIXED_BITS) * inv);
        free(s);
        return st;
    }
    for (size_t i = 0; i < a->n; i++)
        out[i] = (float)(ldexp((double)a->acc[i], -FIXED_BITS) * inv);
    return FM_OK;
}

size_t fm_aggregator_size(const fm_aggregator_t *a) { return a->n; }
uint64_t fm_aggregator_total_weight(const fm_aggregator_t *a) { return a->total; }
int fm_aggregator_count(const fm_aggregator_t *a) { return a->count; }

double fm_distance(const float *x, const float *ref, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - ref[i];
        s += d * d;
    }
    return sqrt(s);
}

void fm_scale_toward(float *x, const float *ref, size_t n, double f)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(ref[i] + ((double)x[i] - ref[i]) * f);
}

double fm_clip_to_norm(float *x, const float *ref, size_t n, double bound)
{
    double norm = fm_distance(x, ref, n);
    if (bound > 0.0 && norm > bound)
        fm_scale_toward(x, ref, n, bound / norm);
    return norm;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

double fm_lower_median(double *v, int n)
{
    if (n <= 0)
        return 0.0;
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return v[(n - 1) / 2];
}
