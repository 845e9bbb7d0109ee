/* Aggregation: the average equals a weighted average computed here; the same
 * updates in any order give bit-identical results; bad updates change nothing.
 * K-nearest: the right prompts on a constructed pool, never the client's own. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/aggregate.h"
#include "fedmoe/knn.h"
#include "fedmoe/rng.h"

#define N 5000
#define CLIENTS 7

static void test_weighted_mean_and_order(void **state)
{
    (void)state;
    fm_rng_t r;
    fm_rng_init(&r, 1, 1);
    float *x[CLIENTS];
    uint64_t w[CLIENTS];
    for (int c = 0; c < CLIENTS; c++) {
        x[c] = malloc(sizeof(float) * N);
        for (int i = 0; i < N; i++)
            x[c][i] = (float)(fm_rng_normal(&r) * pow(10.0, (double)fm_rng_below(&r, 7) - 4.0));
        w[c] = 1 + fm_rng_below(&r, 60000);
    }
    fm_aggregator_t *a = NULL;
    assert_int_equal(fm_aggregator_new(&a, N), FM_OK);
    float *m1 = malloc(sizeof(float) * N), *m2 = malloc(sizeof(float) * N);
    for (int c = 0; c < CLIENTS; c++)
        assert_int_equal(fm_aggregator_add(a, x[c], w[c]), FM_OK);
    assert_int_equal(fm_aggregator_result(a, m1), FM_OK);
    assert_int_equal(fm_aggregator_count(a), CLIENTS);
    /* against a weighted average computed here in long double */
    for (int i = 0; i < N; i++) {
        long double s = 0, sw = 0;
        for (int c = 0; c < CLIENTS; c++) {
            s += (long double)x[c][i] * w[c];
            sw += w[c];
        }
        double ref = (double)(s / sw);
        assert_true(fabs(m1[i] - ref) <= 1e-6 * fabs(ref) + 1e-9);
    }
    /* many other orders: bit-identical */
    int order[CLIENTS];
    for (int trial = 0; trial < 20; trial++) {
        uint32_t perm[CLIENTS];
        for (int c = 0; c < CLIENTS; c++)
            perm[c] = (uint32_t)c;
        fm_rng_shuffle(&r, perm, CLIENTS);
        for (int c = 0; c < CLIENTS; c++)
            order[c] = (int)perm[c];
        fm_aggregator_reset(a);
        for (int c = 0; c < CLIENTS; c++)
            assert_int_equal(fm_aggregator_add(a, x[order[c]], w[order[c]]), FM_OK);
        assert_int_equal(fm_aggregator_result(a, m2), FM_OK);
        assert_memory_equal(m1, m2, sizeof(float) * N);
    }
    /* a naive float sum is not order-independent on the same data (the property is not free) */
    int differs = 0;
    for (int i = 0; i < N && !differs; i++) {
        float f1 = 0, f2 = 0;
        for (int c = 0; c < CLIENTS; c++)
            f1 += x[c][i] * (float)w[c];
        for (int c = CLIENTS - 1; c >= 0; c--)
            f2 += x[c][i] * (float)w[c];
        differs = f1 != f2;
    }
    assert_true(differs);
    for (int c = 0; c < CLIENTS; c++)
        free(x[c]);
    free(m1);
    free(m2);
    fm_aggregator_destroy(&a);
    assert_null(a);
}

static void test_bad_updates_change_nothing(void **state)
{
    (void)state;
    fm_aggregator_t *a = NULL;
    assert_int_equal(fm_aggregator_new(&a, 3), FM_OK);
    float m[3];
    assert_int_equal(fm_aggregator_result(a, m), FM_ERR_STATE);
    float good[3] = {1, 2, 3}, nan_[3] = {1, NAN, 3}, inf_[3] = {INFINITY, 0, 0}, huge[3] = {0, 3e9f, 0};
    assert_int_equal(fm_aggregator_add(a, good, 2), FM_OK);
    assert_int_equal(fm_aggregator_add(a, nan_, 2), FM_ERR_ARG);
    assert_int_equal(fm_aggregator_add(a, inf_, 2), FM_ERR_ARG);
    assert_int_equal(fm_aggregator_add(a, huge, 2), FM_ERR_ARG);
    assert_int_equal(fm_aggregator_add(a, good, 0), FM_ERR_ARG);
    assert_int_equal(fm_aggregator_add(a, good, FM_AGG_MAX_WEIGHT + 1), FM_ERR_ARG);
    assert_int_equal(fm_aggregator_count(a), 1);
    assert_int_equal(fm_aggregator_total_weight(a), 2);
    assert_int_equal(fm_aggregator_result(a, m), FM_OK);
    assert_float_equal(m[1], 2.0f, 0);
    fm_aggregator_destroy(&a);
}

/* The robust rules against a per-coordinate sort done here: 7 honest updates
 * near 1 and 2 attackers at +-1e8; the median and the 0.25-trimmed mean stay
 * near 1 while the mean is ruined; any arrival order gives the same bits. */
static void test_robust_rules(void **state)
{
    (void)state;
    enum { K = 9, M = 1000 };
    fm_rng_t r;
    fm_rng_init(&r, 3, 1);
    float *x[K];
    for (int c = 0; c < K; c++) {
        x[c] = malloc(sizeof(float) * M);
        for (int i = 0; i < M; i++)
            x[c][i] = c < 7 ? 1.0f + 0.1f * (float)fm_rng_normal(&r) : (c == 7 ? 1e8f : -3e8f);
    }
    const char *names[] = {"median", "trimmed-mean:0.25", "mean"};
    float out[3][M], again[M];
    for (int rule = 0; rule < 3; rule++) {
        fm_agg_spec_t s;
        assert_int_equal(fm_agg_spec_parse("--aggregate", names[rule], &s), FM_OK);
        char back[64];
        fm_agg_spec_name(&s, back, sizeof back);
        assert_string_equal(back, names[rule]);
        fm_aggregator_t *a = NULL;
        assert_int_equal(fm_aggregator_new(&a, M), FM_OK);
        fm_aggregator_set_rule(a, &s);
        for (int c = 0; c < K; c++)
            assert_int_equal(fm_aggregator_add(a, x[c], 1 + (uint64_t)c * 1000), FM_OK);
        assert_int_equal(fm_aggregator_result(a, out[rule]), FM_OK);
        for (int trial = 0; trial < 5; trial++) {
            uint32_t perm[K];
            for (int c = 0; c < K; c++)
                perm[c] = (uint32_t)c;
            fm_rng_shuffle(&r, perm, K);
            fm_aggregator_reset(a);
            for (int c = 0; c < K; c++)
                assert_int_equal(fm_aggregator_add(a, x[perm[c]], 1 + (uint64_t)perm[c] * 1000), FM_OK);
            assert_int_equal(fm_aggregator_result(a, again), FM_OK);
            assert_memory_equal(out[rule], again, sizeof again);
        }
        fm_aggregator_destroy(&a);
    }
    for (int i = 0; i < M; i++) {
        float col[K];
        for (int c = 0; c < K; c++)
            col[c] = x[c][i];
        for (int p = 1; p < K; p++) /* sort here */
            for (int q = p; q > 0 && col[q - 1] > col[q]; q--) {
                float t = col[q];
                col[q] = col[q - 1];
                col[q - 1] = t;
            }
        assert_float_equal(out[0][i], col[4], 0);
        double trimmed = 0; /* floor(0.25 x 9) = 2 cut at each end */
        for (int c = 2; c < K - 2; c++)
            trimmed += col[c];
        assert_float_equal(out[1][i], (float)(trimmed / 5), 1e-6);
        assert_true(fabsf(out[0][i] - 1.0f) < 0.5f && fabsf(out[1][i] - 1.0f) < 0.5f);
        assert_true(fabsf(out[2][i]) > 1e6f); /* the weighted mean is the attackers' */
    }
    fm_agg_spec_t s;
    assert_int_equal(fm_agg_spec_parse("--aggregate", "trimmed-mean:0.5", &s), FM_ERR_ARG);
    assert_int_equal(fm_agg_spec_parse("--aggregate", "trimmed-mean:", &s), FM_ERR_ARG);
    assert_int_equal(fm_agg_spec_parse("--aggregate", "krum", &s), FM_ERR_ARG);
    for (int c = 0; c < K; c++)
        free(x[c]);
}

/* Clipping bounds the distance from the reference and keeps the direction;
 * an update within the bound, or no bound, is left as it is. */
/* Kept updates beyond the memory budget go to a file: with a budget of 2 rows
 * (the rest spilled) every rule, clipping and the kept mean give bit-identical
 * results to an aggregator holding everything in memory. */
static void test_spilled_rows_same_results(void **state)
{
    (void)state;
    const fm_agg_spec_t rules[] = {{FM_AGG_MEAN, 0.0}, {FM_AGG_MEDIAN, 0.0}, {FM_AGG_TRIMMED_MEAN, 0.2}};
    fm_rng_t r;
    fm_rng_init(&r, 5, 5);
    float *x = malloc(sizeof(float) * N * 9), *ref = calloc(N, sizeof(float));
    for (int i = 0; i < N * 9; i++)
        x[i] = (float)fm_rng_normal(&r);
    float *want = malloc(sizeof(float) * N), *got = malloc(sizeof(float) * N);
    for (size_t q = 0; q < sizeof rules / sizeof rules[0]; q++) {
        fm_aggregator_t *mem = NULL, *disk = NULL;
        assert_int_equal(fm_aggregator_new(&mem, N), FM_OK);
        assert_int_equal(fm_aggregator_new(&disk, N), FM_OK);
        fm_aggregator_set_memory(disk, sizeof(float) * N * 2 + 7);
        fm_aggregator_t *both[2] = {mem, disk};
        for (int k = 0; k < 2; k++) {
            fm_aggregator_set_rule(both[k], &rules[q]);
            fm_aggregator_keep(both[k], true);
            assert_int_equal(fm_aggregator_reserve(both[k], 4), FM_OK); /* fewer than will come: grows */
            for (int c = 0; c < 9; c++)
                assert_int_equal(fm_aggregator_add(both[k], x + (size_t)c * N, 1 + (uint64_t)c * 7), FM_OK);
        }
        int clipped = fm_aggregator_clip_rows(mem, ref, 70.5); /* (norms are about sqrt(N) = 70.7) */
        assert_true(clipped > 0 && clipped < 9);
        assert_int_equal(fm_aggregator_clip_rows(disk, ref, 70.5), clipped);
        assert_int_equal(fm_aggregator_result(mem, want), FM_OK);
        assert_int_equal(fm_aggregator_result(disk, got), FM_OK);
        assert_memory_equal(want, got, sizeof(float) * N);
        fm_aggregator_destroy(&mem);
        fm_aggregator_destroy(&disk);
    }
    free(x);
    free(ref);
    free(want);
    free(got);
}

/* Folding: kept rows summed into the running mean, later ones summed as they
 * come, holding none: the same exact weighted mean, bit for bit, as summing
 * everything as it came, from memory or from the file; robust rules do not
 * fold. */
static void test_fold_same_mean(void **state)
{
    (void)state;
    fm_rng_t r;
    fm_rng_init(&r, 6, 6);
    float *x = malloc(sizeof(float) * N * 8);
    for (int i = 0; i < N * 8; i++)
        x[i] = (float)fm_rng_normal(&r);
    float *want = malloc(sizeof(float) * N), *got = malloc(sizeof(float) * N);
    fm_aggregator_t *plain = NULL;
    assert_int_equal(fm_aggregator_new(&plain, N), FM_OK);
    for (int c = 0; c < 8; c++)
        assert_int_equal(fm_aggregator_add(plain, x + (size_t)c * N, 3 + (uint64_t)c), FM_OK);
    assert_int_equal(fm_aggregator_result(plain, want), FM_OK);
    for (int spill = 0; spill < 2; spill++) {
        fm_aggregator_t *a = NULL;
        assert_int_equal(fm_aggregator_new(&a, N), FM_OK);
        if (spill)
            fm_aggregator_set_memory(a, sizeof(float) * N * 2);
        fm_aggregator_keep(a, true);
        assert_int_equal(fm_aggregator_reserve(a, 5), FM_OK);
        for (int c = 0; c < 5; c++)
            assert_int_equal(fm_aggregator_add(a, x + (size_t)c * N, 3 + (uint64_t)c), FM_OK);
        assert_int_equal(fm_aggregator_held(a), 5);
        fm_aggregator_fold(a);
        assert_int_equal(fm_aggregator_held(a), 0);
        for (int c = 5; c < 8; c++)
            assert_int_equal(fm_aggregator_add(a, x + (size_t)c * N, 3 + (uint64_t)c), FM_OK);
        assert_int_equal(fm_aggregator_held(a), 0);
        assert_int_equal(fm_aggregator_count(a), 8);
        assert_int_equal(fm_aggregator_result(a, got), FM_OK);
        assert_memory_equal(want, got, sizeof(float) * N);
        fm_aggregator_destroy(&a);
    }
    fm_aggregator_t *med = NULL;
    fm_agg_spec_t median = {FM_AGG_MEDIAN, 0.0};
    assert_int_equal(fm_aggregator_new(&med, N), FM_OK);
    fm_aggregator_set_rule(med, &median);
    for (int c = 0; c < 3; c++)
        assert_int_equal(fm_aggregator_add(med, x + (size_t)c * N, 1), FM_OK);
    fm_aggregator_fold(med);
    assert_int_equal(fm_aggregator_held(med), 3);
    fm_aggregator_destroy(&med);
    fm_aggregator_destroy(&plain);
    free(x);
    free(want);
    free(got);
}

static void test_clip_to_norm(void **state)
{
    (void)state;
    float ref[4] = {1, 1, 1, 1}, x[4] = {4, 5, 1, 1}; /* distance 5 */
    assert_float_equal(fm_clip_to_norm(x, ref, 4, 10.0), 5.0, 1e-12);
    assert_float_equal(x[0], 4.0f, 0);
    assert_float_equal(fm_clip_to_norm(x, ref, 4, 0.0), 5.0, 1e-12);
    assert_float_equal(x[1], 5.0f, 0);
    assert_float_equal(fm_clip_to_norm(x, ref, 4, 1.0), 5.0, 1e-12);
    assert_float_equal(x[0], 1.6f, 1e-6); /* 1 + 3/5 */
    assert_float_equal(x[1], 1.8f, 1e-6); /* 1 + 4/5 */
    assert_float_equal(x[2], 1.0f, 0);
    assert_float_equal(fm_clip_to_norm(x, ref, 4, 1.0), 1.0, 1e-6);
    double v[4] = {7, 1, 3, 100};
    assert_float_equal(fm_lower_median(v, 4), 3.0, 0); /* 1 3 7 100: the second, not the 5 between */
    assert_float_equal(fm_lower_median(v, 3), 3.0, 0); /* the sorted first three: 1 3 7 */
    double two[2] = {1e6, 2};
    assert_float_equal(fm_lower_median(two, 2), 2.0, 0); /* one of two cannot set it */
}

static void test_knn(void **state)
{
    (void)state;
    /* points on a line at 0, 1, 3, 4.5, 10; entry 2 missing */
    float p[5][2] = {{0, 0}, {1, 0}, {3, 0}, {4.5f, 0}, {10, 0}};
    const float *entries[5] = {p[0], p[1], NULL, p[3], p[4]};
    int out[4];
    assert_int_equal(fm_knn(entries, 5, 2, 1, 2, out), 2);
    assert_int_equal(out[0], 0);
    assert_int_equal(out[1], 3);
    assert_int_equal(fm_knn(entries, 5, 2, 4, 4, out), 3); /* only 3 others exist */
    assert_int_equal(out[0], 3);
    assert_int_equal(out[1], 1);
    assert_int_equal(out[2], 0);
    for (int self = 0; self < 5; self++) {
        int k = fm_knn(entries, 5, 2, self, 4, out);
        for (int i = 0; i < k; i++) {
            assert_int_not_equal(out[i], self);
            assert_int_not_equal(out[i], 2);
        }
    }
    assert_int_equal(fm_knn(entries, 5, 2, 2, 2, out), 0); /* no own entry: no neighbours */
    /* ties go to the lower index */
    float q[4][1] = {{5}, {4}, {6}, {4}};
    const float *e2[4] = {q[0], q[1], q[2], q[3]};
    assert_int_equal(fm_knn(e2, 4, 1, 0, 3, out), 3);
    assert_int_equal(out[0], 1);
    assert_int_equal(out[1], 2);
    assert_int_equal(out[2], 3);
}

/* The batched search (one GEMM per block of queries, then the exact distance
 * for the entries its error bound cannot rule out) gives fm_knn's answer for
 * every query: on pools with missing entries, exact duplicates (ties),
 * near-ties a few ulps apart, clusters far from the origin (where |q|^2 + |p|^2
 * - 2 q.p cancels), and more queries than one block. */
static void test_knn_batch_is_exact(void **state)
{
    (void)state;
    enum { POOL = 300, DIM = 37, K = 5 };
    fm_rng_t r;
    fm_rng_init(&r, 9, 9);
    float *p = malloc(sizeof(float) * POOL * DIM);
    for (int shape = 0; shape < 3; shape++) {
        for (int i = 0; i < POOL; i++)
            for (int j = 0; j < DIM; j++) {
                float *x = &p[i * DIM + j];
                if (shape == 0)
                    *x = (float)fm_rng_normal(&r);
                else if (shape == 1) /* a far cluster, small spread */
                    *x = 1000.0f + (float)(1e-3 * fm_rng_normal(&r));
                else /* few distinct values: many exact ties */
                    *x = (float)fm_rng_below(&r, 3);
            }
        for (int i = 0; i < POOL; i += 17) { /* duplicates and near-duplicates */
            memcpy(&p[(i + 1) % POOL * DIM], &p[i * DIM], sizeof(float) * DIM);
            p[(i + 2) % POOL * DIM] = nextafterf(p[i * DIM], INFINITY);
        }
        const float *entries[POOL];
        int selves[POOL];
        for (int i = 0; i < POOL; i++) {
            entries[i] = i % 23 == 5 ? NULL : &p[i * DIM];
            selves[i] = (i * 7) % POOL;
        }
        int out[POOL * K], found[POOL], want[K];
        assert_int_equal(fm_knn_batch(entries, POOL, DIM, selves, POOL, K, out, found), FM_OK);
        for (int q = 0; q < POOL; q++) {
            int n = fm_knn(entries, POOL, DIM, selves[q], K, want);
            assert_int_equal(found[q], n);
            assert_memory_equal(out + q * K, want, sizeof(int) * (size_t)n);
        }
    }
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_weighted_mean_and_order),
        cmocka_unit_test(test_bad_updates_change_nothing),
        cmocka_unit_test(test_robust_rules),
        cmocka_unit_test(test_spilled_rows_same_results),
        cmocka_unit_test(test_clip_to_norm),
        cmocka_unit_test(test_fold_same_mean),
        cmocka_unit_test(test_knn),
        cmocka_unit_test(test_knn_batch_is_exact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
