/* Philox known answers, determinism, and the distributions partitions rely on. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>

#include "fedmoe/rng.h"

static void test_philox_known_answers(void **state)
{
    (void)state;
    /* Random123's kat_vectors for philox4x32_10: counter, key, output */
    static const struct {
        uint32_t c[4], k[2], want[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
        {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
         {0xffffffffu, 0xffffffffu},
         {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
        {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
         {0xa4093822u, 0x299f31d0u},
         {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
    };
    for (size_t i = 0; i < sizeof kat / sizeof kat[0]; i++) {
        uint32_t out[4];
        fm_philox4x32_10(kat[i].c, kat[i].k, out);
        for (int j = 0; j < 4; j++)
            assert_int_equal(out[j], kat[i].want[j]);
    }
}

static void test_streams_are_deterministic_and_distinct(void **state)
{
    (void)state;
    fm_rng_t a, b, c;
    fm_rng_init(&a, 42, 7);
    fm_rng_init(&b, 42, 7);
    fm_rng_init(&c, 42, 8);
    int same_c = 0;
    for (int i = 0; i < 1000; i++) {
        uint32_t x = fm_rng_u32(&a);
        assert_int_equal(x, fm_rng_u32(&b));
        same_c += x == fm_rng_u32(&c);
    }
    assert_true(same_c < 3);
}

/* The stream table: fm_rng_stream has a left inverse (purpose, index) over every
 * purpose and the full index range, so it is injective: no two (purpose, index)
 * pairs share a stream. Checked at both ends of the range, at every power of two
 * and at random indices; and the old collision (a client's split stream equal to
 * another purpose's stream) cannot recur. */
static void test_stream_table_is_injective(void **state)
{
    (void)state;
    fm_rng_t r;
    fm_rng_init(&r, 4, fm_rng_stream(FM_STREAM_TEST, 0));
    for (int p = 1; p < FM_STREAM_PURPOSES; p++) {
        uint64_t probe[64 + 3 + 1000];
        int n = 0;
        probe[n++] = 0;
        probe[n++] = FM_STREAM_INDEX_MAX;
        probe[n++] = FM_STREAM_INDEX_MAX - 1;
        for (int b = 0; b < 56; b++)
            probe[n++] = 1ull << b;
        for (int i = 0; i < 1000; i++)
            probe[n++] = fm_rng_u64(&r) & FM_STREAM_INDEX_MAX;
        for (int i = 0; i < n; i++) {
            uint64_t id = fm_rng_stream((fm_stream_purpose)p, probe[i]);
            assert_int_equal(fm_rng_stream_purpose(id), p);
            assert_true(fm_rng_stream_index(id) == probe[i]);
        }
    }
    /* streams of different purposes differ even at equal indices, and two clients'
     * streams of one purpose differ */
    for (uint64_t i = 0; i < 70000; i += 97)
        for (int p = 1; p < FM_STREAM_PURPOSES; p++)
            for (int q = p + 1; q < FM_STREAM_PURPOSES; q++) {
                assert_true(fm_rng_stream((fm_stream_purpose)p, i) != fm_rng_stream((fm_stream_purpose)q, i));
                assert_true(fm_rng_stream((fm_stream_purpose)p, i) != fm_rng_stream((fm_stream_purpose)q, i + 65284));
            }
    assert_true(fm_rng_stream(FM_STREAM_LOCAL, 3) != fm_rng_stream(FM_STREAM_SHUFFLE, 3));
    assert_true(fm_rng_stream(FM_STREAM_LOCAL, 3) != fm_rng_stream(FM_STREAM_LOCAL, 4));
}

static void test_distributions(void **state)
{
    (void)state;
    fm_rng_t r;
    fm_rng_init(&r, 1, 1);
    const int n = 200000;
    double su = 0, sn = 0, sn2 = 0, sg = 0;
    int below[10] = {0};
    for (int i = 0; i < n; i++) {
        float u = fm_rng_uniform(&r);
        assert_true(u >= 0.0f && u < 1.0f);
        su += u;
        double z = fm_rng_normal(&r);
        sn += z;
        sn2 += z * z;
        sg += fm_rng_gamma(&r, 0.3);
        below[fm_rng_below(&r, 10)]++;
    }
    assert_true(fabs(su / n - 0.5) < 0.01);
    assert_true(fabs(sn / n) < 0.01);
    assert_true(fabs(sn2 / n - 1.0) < 0.02);
    assert_true(fabs(sg / n - 0.3) < 0.01); /* E[Gamma(a)] = a */
    for (int i = 0; i < 10; i++)
        assert_true(abs(below[i] - n / 10) < n / 100);
}

static void test_shuffle_is_permutation(void **state)
{
    (void)state;
    fm_rng_t r;
    fm_rng_init(&r, 3, 3);
    uint32_t a[1000];
    for (int i = 0; i < 1000; i++)
        a[i] = (uint32_t)i;
    fm_rng_shuffle(&r, a, 1000);
    int seen[1000] = {0}, moved = 0;
    for (int i = 0; i < 1000; i++) {
        seen[a[i]]++;
        moved += a[i] != (uint32_t)i;
    }
    for (int i = 0; i < 1000; i++)
        assert_int_equal(seen[i], 1);
    assert_true(moved > 900);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_known_answers),
        cmocka_unit_test(test_streams_are_deterministic_and_distinct),
        cmocka_unit_test(test_stream_table_is_injective),
        cmocka_unit_test(test_distributions),
        cmocka_unit_test(test_shuffle_is_permutation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
