/* Partitions: deterministic from the seed, disjoint, covering, skewed as asked;
 * splits stratified. Labels are synthetic (balanced, 10 classes) so the test is
 * fast; the partitioner sees only labels. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/partition.h"

#define N 70000
#define C 10

static uint8_t labels[N];

static void check_disjoint_cover(const fm_partition_t *p, bool must_cover)
{
    static uint8_t seen[N];
    memset(seen, 0, sizeof seen);
    for (int j = 0; j < p->clients; j++)
        for (size_t i = p->offset[j]; i < p->offset[j + 1]; i++) {
            assert_true(p->index[i] < N);
            assert_int_equal(seen[p->index[i]], 0);
            seen[p->index[i]] = 1;
        }
    if (must_cover)
        for (int i = 0; i < N; i++)
            assert_int_equal(seen[i], 1);
}

/* Number of classes that hold at least 5% of a client's examples, averaged. */
static double mean_major_classes(const fm_partition_t *p)
{
    double total = 0;
    for (int j = 0; j < p->clients; j++) {
        size_t cnt[C] = {0}, n = p->offset[j + 1] - p->offset[j];
        for (size_t i = p->offset[j]; i < p->offset[j + 1]; i++)
            cnt[labels[p->index[i]]]++;
        for (int c = 0; c < C; c++)
            total += cnt[c] * 20 >= n;
    }
    return total / p->clients;
}

static void test_dirichlet(void **state)
{
    (void)state;
    fm_partition_config_t cfg;
    fm_partition_config_default(&cfg);
    cfg.alpha = 0.1;
    fm_partition_t a, b, c;
    assert_int_equal(fm_partition_make(&a, labels, N, C, 20, 1, &cfg), FM_OK);
    assert_int_equal(fm_partition_make(&b, labels, N, C, 20, 1, &cfg), FM_OK);
    assert_int_equal(fm_partition_make(&c, labels, N, C, 20, 2, &cfg), FM_OK);
    check_disjoint_cover(&a, true);
    /* same seed: identical; other seed: different */
    assert_memory_equal(a.offset, b.offset, sizeof(size_t) * 21);
    assert_memory_equal(a.index, b.index, sizeof(uint32_t) * N);
    assert_true(memcmp(a.index, c.index, sizeof(uint32_t) * N) != 0);
    for (int j = 0; j < 20; j++)
        assert_true(a.offset[j + 1] - a.offset[j] >= cfg.min_samples);
    /* small alpha: few classes per client; large alpha: nearly all */
    double skewed = mean_major_classes(&a);
    cfg.alpha = 100.0;
    fm_partition_t d;
    assert_int_equal(fm_partition_make(&d, labels, N, C, 20, 1, &cfg), FM_OK);
    check_disjoint_cover(&d, true);
    double flat = mean_major_classes(&d);
    assert_true(skewed < 4.0);
    assert_true(flat > 9.0);
    fm_partition_free(&a);
    fm_partition_free(&b);
    fm_partition_free(&c);
    fm_partition_free(&d);
}

static void test_dirichlet_minimum_unreachable(void **state)
{
    (void)state;
    fm_partition_config_t cfg;
    fm_partition_config_default(&cfg);
    cfg.min_samples = N; /* impossible with 2 clients */
    fm_partition_t p;
    assert_int_equal(fm_partition_make(&p, labels, N, C, 2, 1, &cfg), FM_ERR_ARG);
    assert_null(p.index);
}

/* Client-wise: every client n/clients (sizes differ by at most one), for
 * thousands of clients; skewed by alpha; deterministic from the seed. */
static void test_client_dirichlet(void **state)
{
    (void)state;
    fm_partition_config_t cfg;
    fm_partition_config_default(&cfg);
    cfg.kind = FM_PARTITION_CLIENT_DIRICHLET;
    cfg.alpha = 0.1;
    cfg.min_samples = 1000; /* the class-wise minimum: not this scheme's */
    fm_partition_t a, b, many;
    assert_int_equal(fm_partition_make(&a, labels, N, C, 20, 1, &cfg), FM_OK);
    assert_int_equal(fm_partition_make(&b, labels, N, C, 20, 1, &cfg), FM_OK);
    check_disjoint_cover(&a, true);
    assert_memory_equal(a.index, b.index, sizeof(uint32_t) * N);
    for (int j = 0; j < 20; j++)
        assert_int_equal(a.offset[j + 1] - a.offset[j], N / 20);
    assert_true(mean_major_classes(&a) < 4.0);
    assert_int_equal(fm_partition_make(&many, labels, N, C, 9999, 1, &cfg), FM_OK);
    check_disjoint_cover(&many, true);
    for (int j = 0; j < 9999; j++) {
        size_t n = many.offset[j + 1] - many.offset[j];
        assert_true(n == N / 9999 || n == N / 9999 + 1);
    }
    fm_partition_free(&b);
    cfg.alpha = 100.0;
    assert_int_equal(fm_partition_make(&b, labels, N, C, 20, 1, &cfg), FM_OK);
    assert_true(mean_major_classes(&b) > 9.0);
    fm_partition_free(&a);
    fm_partition_free(&b);
    fm_partition_free(&many);
}

static void test_pathological(void **state)
{
    (void)state;
    fm_partition_config_t cfg;
    fm_partition_config_default(&cfg);
    cfg.kind = FM_PARTITION_PATHOLOGICAL;
    cfg.classes_per_client = 2;
    fm_partition_t p;
    assert_int_equal(fm_partition_make(&p, labels, N, C, 20, 3, &cfg), FM_OK);
    check_disjoint_cover(&p, true);
    for (int j = 0; j < 20; j++) {
        int present[C] = {0}, k = 0;
        for (size_t i = p.offset[j]; i < p.offset[j + 1]; i++)
            present[labels[p.index[i]]] = 1;
        for (int c = 0; c < C; c++)
            k += present[c];
        assert_int_equal(k, 2);
        /* each of the 10 classes is held by 4 clients: 7000 / 4 examples each */
        assert_int_equal(p.offset[j + 1] - p.offset[j], 3500);
    }
    fm_partition_free(&p);
}

static void test_iid_and_bad_arguments(void **state)
{
    (void)state;
    fm_partition_config_t cfg;
    fm_partition_config_default(&cfg);
    cfg.kind = FM_PARTITION_IID;
    fm_partition_t p;
    assert_int_equal(fm_partition_make(&p, labels, N, C, 7, 3, &cfg), FM_OK);
    check_disjoint_cover(&p, true);
    fm_partition_free(&p);
    assert_int_equal(fm_partition_make(&p, labels, N, C, 0, 3, &cfg), FM_ERR_ARG);
    cfg.kind = FM_PARTITION_DIRICHLET;
    cfg.alpha = 0.0;
    assert_int_equal(fm_partition_make(&p, labels, N, C, 5, 3, &cfg), FM_ERR_ARG);
    cfg.kind = FM_PARTITION_CLIENT_DIRICHLET;
    assert_int_equal(fm_partition_make(&p, labels, N, C, 5, 3, &cfg), FM_ERR_ARG);
    cfg.alpha = 0.1;
    assert_int_equal(fm_partition_make(&p, labels, N, C, N + 1, 3, &cfg), FM_ERR_ARG);
    cfg.kind = FM_PARTITION_PATHOLOGICAL;
    cfg.classes_per_client = 11;
    assert_int_equal(fm_partition_make(&p, labels, N, C, 5, 3, &cfg), FM_ERR_ARG);
}

static void test_split_is_stratified(void **state)
{
    (void)state;
    fm_partition_config_t cfg;
    fm_partition_config_default(&cfg);
    fm_partition_t p;
    assert_int_equal(fm_partition_make(&p, labels, N, C, 10, 5, &cfg), FM_OK);
    for (int j = 0; j < 10; j++) {
        const uint32_t *idx = p.index + p.offset[j];
        size_t n = p.offset[j + 1] - p.offset[j];
        fm_split_t s, s2;
        assert_int_equal(fm_split_make(&s, idx, n, labels, C, 5, j, 0.25, 0.2), FM_OK);
        assert_int_equal(fm_split_make(&s2, idx, n, labels, C, 5, j, 0.25, 0.2), FM_OK);
        assert_int_equal(s.n_train + s.n_val + s.n_test, n);
        assert_memory_equal(s.test, s2.test, sizeof(uint32_t) * s.n_test);
        size_t cls[C] = {0}, tst[C] = {0}, val[C] = {0}, trn[C] = {0};
        for (size_t i = 0; i < n; i++)
            cls[labels[idx[i]]]++;
        for (size_t i = 0; i < s.n_test; i++)
            tst[labels[s.test[i]]]++;
        for (size_t i = 0; i < s.n_val; i++)
            val[labels[s.val[i]]]++;
        for (size_t i = 0; i < s.n_train; i++)
            trn[labels[s.train[i]]]++;
        for (int c = 0; c < C; c++) {
            assert_int_equal(tst[c], (size_t)llround(cls[c] * 0.25));
            assert_int_equal(val[c], (size_t)llround((cls[c] - tst[c]) * 0.2));
            assert_int_equal(trn[c] + val[c] + tst[c], cls[c]);
        }
        /* the three parts are disjoint subsets of the client's examples */
        static uint8_t mark[N];
        memset(mark, 0, sizeof mark);
        for (size_t i = 0; i < n; i++)
            mark[idx[i]] = 1;
        const uint32_t *parts[3] = {s.train, s.val, s.test};
        size_t sizes[3] = {s.n_train, s.n_val, s.n_test};
        for (int q = 0; q < 3; q++)
            for (size_t i = 0; i < sizes[q]; i++) {
                assert_int_equal(mark[parts[q][i]], 1);
                mark[parts[q][i]] = 2;
            }
        /* a holdout split re-splits train + validation alone: the test examples
         * are nowhere in it, and nothing else is lost */
        assert_int_equal(fm_split_holdout(&s2, labels, C, 5, j, 0.25, 0.2), FM_OK);
        assert_int_equal(s2.n_train + s2.n_val + s2.n_test, s.n_train + s.n_val);
        assert_true(s2.n_test > 0 || s.n_train + s.n_val < 4);
        for (size_t i = 0; i < s.n_test; i++)
            mark[s.test[i]] = 3;
        const uint32_t *hparts[3] = {s2.train, s2.val, s2.test};
        size_t hsizes[3] = {s2.n_train, s2.n_val, s2.n_test};
        for (int q = 0; q < 3; q++)
            for (size_t i = 0; i < hsizes[q]; i++) {
                assert_int_equal(mark[hparts[q][i]], 2); /* train or validation before, once */
                mark[hparts[q][i]] = 4;
            }
        fm_split_free(&s);
        fm_split_free(&s2);
    }
    fm_partition_free(&p);
}

int main(void)
{
    for (int i = 0; i < N; i++)
        labels[i] = (uint8_t)((i * 7919) % C);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dirichlet),
        cmocka_unit_test(test_dirichlet_minimum_unreachable),
        cmocka_unit_test(test_client_dirichlet),
        cmocka_unit_test(test_pathological),
        cmocka_unit_test(test_iid_and_bad_arguments),
        cmocka_unit_test(test_split_is_stratified),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
