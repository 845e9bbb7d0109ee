/* Data regimes: caps, domains and concept groups. Caps are deterministic from
 * the seed, nested, and never move an example between splits; the transforms
 * are pinned by known answers on 3x3 images; label maps are bijections; and a
 * client's data under a regime is its plain data capped, transformed and
 * relabelled, on both loading paths (a client process and a virtual host). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/clientdata.h"
#include "fedmoe/log.h"
#include "fedmoe/regime.h"
#include "fedmoe/runspec.h"
#include "fedmoe/runspec_wire.h"

static void test_cap_parse_and_names(void **state)
{
    (void)state;
    const char *good[][2] = {{"off", "off"}, {"", "off"}, {"100", "100"}, {"25,100,400", "25,100,400"},
                             {"25..1000", "25..1000"}, {"7..7", "7..7"}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        fm_cap_t c;
        char name[128];
        assert_int_equal(fm_cap_parse("--client-examples", good[i][0], &c), FM_OK);
        fm_cap_name(&c, name, sizeof name);
        assert_string_equal(name, good[i][1]);
        fm_cap_t back;
        assert_int_equal(fm_cap_parse("x", name, &back), FM_OK);
        assert_true(fm_cap_same(&c, &back));
    }
    const char *bad[] = {"0", "abc", "5..2", "1,,2", "-3", "1,", "..5", "1..", "+4", "2000000000000", "3 "};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fm_cap_t c = {.kind = FM_CAP_FIXED, .n = 1, .v = {9}};
        assert_int_equal(fm_cap_parse("--client-examples", bad[i], &c), FM_ERR_ARG);
        assert_non_null(strstr(fm_error_last(), "--client-examples"));
        assert_int_equal(c.v[0], 9); /* untouched */
    }
    char many[400] = "1";
    for (int i = 0; i < FM_CAP_MAX_VALUES; i++)
        strcat(many, ",2");
    fm_cap_t c;
    assert_int_equal(fm_cap_parse("f", many, &c), FM_ERR_ARG);
    /* each client's cap */
    assert_int_equal(fm_cap_parse("f", "off", &c), FM_OK);
    assert_int_equal(fm_cap_of(&c, 1, 5), 0);
    assert_int_equal(fm_cap_parse("f", "40", &c), FM_OK);
    assert_int_equal(fm_cap_of(&c, 1, 5), 40);
    assert_int_equal(fm_cap_parse("f", "10,20,30", &c), FM_OK);
    assert_int_equal(fm_cap_of(&c, 1, 0), 10);
    assert_int_equal(fm_cap_of(&c, 1, 4), 20);
    assert_int_equal(fm_cap_of(&c, 1, 8), 30);
    assert_int_equal(fm_cap_parse("f", "25..1000", &c), FM_OK);
    int below_geo = 0, distinct = 0;
    uint64_t prev = 0;
    for (int i = 0; i < 400; i++) {
        uint64_t v = fm_cap_of(&c, 3, i);
        assert_true(v >= 25 && v <= 1000);
        assert_int_equal(v, fm_cap_of(&c, 3, i)); /* from (seed, client) alone */
        below_geo += v < 158;                     /* sqrt(25 x 1000): half of a log-uniform draw */
        distinct += v != prev;
        prev = v;
    }
    assert_true(below_geo > 150 && below_geo < 250);
    assert_true(distinct > 300);
}

static bool contains(const uint32_t *a, size_t n, uint32_t v)
{
    for (size_t i = 0; i < n; i++)
        if (a[i] == v)
            return true;
    return false;
}

/* train = 0..99 and val = 100..124 of a client, capped. */
static void capped(uint64_t limit, uint64_t seed, const uint64_t *cost, uint32_t *train, size_t *nt, uint32_t *val,
                   size_t *nv)
{
    for (uint32_t i = 0; i < 100; i++)
        train[i] = i;
    for (uint32_t i = 0; i < 25; i++)
        val[i] = 100 + i;
    *nt = 100;
    *nv = 25;
    fm_cap_apply(limit, 0.2, seed, 4, cost, train, nt, val, nv);
}

static void test_cap_keeps_a_nested_subset_of_each_split(void **state)
{
    (void)state;
    uint32_t t30[100], v30[25], t50[100], v50[25], again[100], va[25];
    size_t nt30, nv30, nt50, nv50, na, nva;
    capped(30, 1, NULL, t30, &nt30, v30, &nv30);
    assert_int_equal(nt30, 24);
    assert_int_equal(nv30, 6);
    for (size_t i = 0; i < nt30; i++) /* never moved between splits, in their order */
        assert_true(t30[i] < 100 && (i == 0 || t30[i] > t30[i - 1]));
    for (size_t i = 0; i < nv30; i++)
        assert_true(v30[i] >= 100 && v30[i] < 125 && (i == 0 || v30[i] > v30[i - 1]));
    capped(30, 1, NULL, again, &na, va, &nva); /* deterministic */
    assert_int_equal(na, nt30);
    assert_memory_equal(again, t30, sizeof(uint32_t) * nt30);
    assert_memory_equal(va, v30, sizeof(uint32_t) * nv30);
    capped(50, 1, NULL, t50, &nt50, v50, &nv50); /* nested in a larger cap */
    assert_int_equal(nt50, 40);
    assert_int_equal(nv50, 10);
    for (size_t i = 0; i < nt30; i++)
        assert_true(contains(t50, nt50, t30[i]));
    for (size_t i = 0; i < nv30; i++)
        assert_true(contains(v50, nv50, v30[i]));
    capped(30, 2, NULL, again, &na, va, &nva); /* another seed, another subset */
    assert_memory_not_equal(again, t30, sizeof(uint32_t) * nt30);
    capped(1000, 1, NULL, again, &na, va, &nva); /* more than there is: everything */
    assert_int_equal(na, 100);
    assert_int_equal(nva, 25);
    capped(0, 1, NULL, again, &na, va, &nva); /* no cap */
    assert_int_equal(na, 100);
    capped(2, 1, NULL, again, &na, va, &nva); /* at least one of each */
    assert_int_equal(na, 1);
    assert_int_equal(nva, 1);
    /* sizes (text: bytes): the kept total fits, at least one even if too big */
    uint64_t cost[125];
    for (int i = 0; i < 125; i++)
        cost[i] = 10 + (uint64_t)(i * 7 % 50);
    capped(500, 1, cost, again, &na, va, &nva);
    uint64_t sum = 0, vsum = 0;
    for (size_t i = 0; i < na; i++)
        sum += cost[again[i]];
    for (size_t i = 0; i < nva; i++)
        vsum += cost[va[i]];
    assert_true(sum <= 400 && sum > 400 - 60);
    assert_true(vsum <= 100 && nva >= 1);
    capped(3, 1, cost, again, &na, va, &nva);
    assert_int_equal(na, 1);
    assert_int_equal(nva, 1);
}

static void test_transforms_known_answers(void **state)
{
    (void)state;
    const float img[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    const float want[4][9] = {
        {1, 2, 3, 4, 5, 6, 7, 8, 9}, /* identity */
        {7, 4, 1, 8, 5, 2, 9, 6, 3}, /* a quarter turn clockwise: the left column becomes the top row */
        {9, 8, 7, 6, 5, 4, 3, 2, 1},
        {3, 6, 9, 2, 5, 8, 1, 4, 7},
    };
    float x[64], scratch[64];
    for (int k = 0; k < 4; k++) {
        memcpy(x, img, sizeof img);
        fm_domain_apply((fm_domain_kind)k, x, 3, 3, 1, 0, scratch);
        assert_memory_equal(x, want[k], sizeof img);
    }
    memcpy(x, img, sizeof img);
    fm_domain_apply(FM_DOMAIN_INVERT, x, 3, 3, 1, 0, scratch);
    for (int i = 0; i < 9; i++)
        assert_true(x[i] == 1.0f - img[i]);
    /* blur: (1 4 6 4 1)/16 each way, edges repeated; an impulse in the middle */
    const float impulse[9] = {0, 0, 0, 0, 1, 0, 0, 0, 0};
    memcpy(x, impulse, sizeof impulse);
    fm_domain_apply(FM_DOMAIN_BLUR, x, 3, 3, 1, 0, scratch);
    const float row[3] = {4.0f / 16, 6.0f / 16, 4.0f / 16};
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 3; c++)
            assert_float_equal(x[r * 3 + c], row[r] * row[c], 1e-7);
    /* a constant image stays constant (edges repeated, weights summing to one) */
    for (int i = 0; i < 9; i++)
        x[i] = 0.25f;
    fm_domain_apply(FM_DOMAIN_BLUR, x, 3, 3, 1, 0, scratch);
    for (int i = 0; i < 9; i++)
        assert_float_equal(x[i], 0.25f, 1e-7);
    /* noise: fixed per example (its key), different between examples */
    float a[64] = {0}, b[64] = {0}, c[64] = {0};
    fm_domain_apply(FM_DOMAIN_NOISE, a, 8, 8, 1, 17, scratch);
    fm_domain_apply(FM_DOMAIN_NOISE, b, 8, 8, 1, 17, scratch);
    fm_domain_apply(FM_DOMAIN_NOISE, c, 8, 8, 1, 18, scratch);
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, c, sizeof a);
    double s2 = 0;
    for (int i = 0; i < 64; i++)
        s2 += (double)a[i] * a[i];
    assert_true(sqrt(s2 / 64) > 0.5 * FM_DOMAIN_NOISE_SD && sqrt(s2 / 64) < 1.5 * FM_DOMAIN_NOISE_SD);
    /* patches: 8x8 in a 4x4 grid of 2x2 tiles; every tile of the output is a
     * whole tile of the input, each used once, and not all in place */
    float src[64];
    for (int i = 0; i < 64; i++)
        src[i] = (float)i;
    memcpy(x, src, sizeof src);
    fm_domain_apply(FM_DOMAIN_PATCHES, x, 8, 8, 1, 0, scratch);
    bool used[16] = {false};
    int moved = 0;
    for (int t = 0; t < 16; t++) {
        int r0 = t / 4 * 2, c0 = t % 4 * 2;
        int from = (int)x[r0 * 8 + c0], fr = from / 8, fc = from % 8;
        assert_true(fr % 2 == 0 && fc % 2 == 0);
        int s = fr / 2 * 4 + fc / 2;
        assert_false(used[s]);
        used[s] = true;
        moved += s != t;
        for (int y = 0; y < 2; y++)
            for (int z = 0; z < 2; z++)
                assert_true(x[(r0 + y) * 8 + c0 + z] == src[(fr + y) * 8 + fc + z]);
    }
    assert_true(moved > 0);
}

static void test_domains_parse_and_check(void **state)
{
    (void)state;
    fm_domains_t d;
    char name[256];
    assert_int_equal(fm_domains_parse("--domains", "rotate,invert", &d), FM_OK);
    assert_int_equal(d.n, 5);
    fm_domains_name(&d, name, sizeof name);
    assert_string_equal(name, "identity,rotate90,rotate180,rotate270,invert");
    assert_int_equal(fm_domain_of(&d, 6), FM_DOMAIN_ROTATE90);
    assert_int_equal(fm_domain_of(&d, 9), FM_DOMAIN_INVERT);
    fm_domains_t back;
    assert_int_equal(fm_domains_parse("x", name, &back), FM_OK);
    assert_true(fm_domains_same(&d, &back));
    assert_int_equal(fm_domains_parse("--domains", "all", &d), FM_OK);
    assert_int_equal(d.n, FM_DOMAIN_KINDS);
    assert_int_equal(fm_domains_parse("--domains", "off", &d), FM_OK);
    assert_int_equal(d.n, 0);
    assert_int_equal(fm_domain_of(&d, 3), FM_DOMAIN_IDENTITY);
    assert_int_equal(fm_domains_parse("--domains", "blur,sepia", &d), FM_ERR_ARG);
    assert_non_null(strstr(fm_error_last(), "'sepia' is not a domain"));
    assert_int_equal(fm_domains_parse("--domains", "all,all,all", &d), FM_ERR_ARG);
    assert_int_equal(fm_domains_parse("--domains", "blur,", &d), FM_ERR_ARG);
    assert_int_equal(fm_domains_parse("--domains", "rotate90", &d), FM_OK);
    assert_int_equal(fm_domains_check(&d, 28, 28), FM_OK);
    assert_int_equal(fm_domains_check(&d, 28, 32), FM_ERR_ARG);
    assert_int_equal(fm_domains_check(&d, 0, 0), FM_ERR_ARG); /* CSV rows */
    assert_int_equal(fm_domains_parse("--domains", "patches", &d), FM_OK);
    assert_int_equal(fm_domains_check(&d, 30, 30), FM_ERR_ARG);
}

static void test_concept_maps_are_bijections(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 5; seed++)
        for (int g = 0; g < 6; g++) {
            uint8_t map[10], again[10];
            fm_concept_map(seed, g, 10, map);
            fm_concept_map(seed, g, 10, again);
            assert_memory_equal(map, again, sizeof map);
            bool hit[10] = {false};
            for (int c = 0; c < 10; c++) {
                assert_true(map[c] < 10);
                assert_false(hit[map[c]]);
                hit[map[c]] = true;
                assert_true(g == 0 ? map[c] == c : map[c] != c);
            }
        }
    uint8_t m1[10], m2[10];
    fm_concept_map(1, 1, 10, m1);
    fm_concept_map(1, 2, 10, m2);
    assert_memory_not_equal(m1, m2, sizeof m1);
    fm_concept_map(1, 1, 2, m1);
    assert_true(m1[0] == 1 && m1[1] == 0);
}

/* Whether row x (dim floats) is among the rows of ds. */
static bool has_row(const fm_dataset_t *ds, const float *x, uint8_t y)
{
    for (size_t i = 0; i < ds->n; i++)
        if (ds->y[i] == y && !memcmp(ds->x + i * (size_t)ds->dim, x, sizeof(float) * (size_t)ds->dim))
            return true;
    return false;
}

static void load(fm_client_data_t *cd, fm_data_spec_t *spec, int index)
{
    spec->index = index;
    fm_status st = fm_client_data_load(cd, spec);
    if (st != FM_OK)
        fail_msg("Fashion-MNIST not loadable (install dataset-fashion-mnist): %s", fm_error_last());
}

/* A client's data under a cap: a subset of its plain train and validation
 * splits, its test split whole; what the coordinator sizes; the same from a
 * virtual host's shared copy. */
static void test_client_data_capped(void **state)
{
    (void)state;
    fm_data_spec_t spec;
    fm_data_spec_default(&spec);
    spec.count = 10;
    spec.part.kind = FM_PARTITION_DIRICHLET;
    spec.part.alpha = 0.1;
    fm_client_data_t plain, cap;
    load(&plain, &spec, 3);
    assert_int_equal(fm_cap_parse("--client-examples", "50", &spec.regime.examples), FM_OK);
    load(&cap, &spec, 3);
    assert_int_equal(cap.train.n, 40);
    assert_int_equal(cap.val.n, 10);
    for (size_t i = 0; i < cap.train.n; i++)
        assert_true(has_row(&plain.train, cap.train.x + i * 784, cap.train.y[i]));
    for (size_t i = 0; i < cap.val.n; i++)
        assert_true(has_row(&plain.val, cap.val.x + i * 784, cap.val.y[i]));
    assert_int_equal(cap.test.n, plain.test.n);
    assert_memory_equal(cap.test.x, plain.test.x, sizeof(float) * 784 * plain.test.n);
    fm_client_data_free(&plain);
    /* the coordinator's sizes, and a virtual host's copy */
    fm_split_sizes_t sizes[10];
    assert_int_equal(fm_client_data_sizes(&spec, sizes), FM_OK);
    assert_int_equal(sizes[3].train, 40);
    assert_int_equal(sizes[3].val, 10);
    assert_int_equal(sizes[3].test, cap.test.n);
    fm_data_cache_t cache;
    assert_int_equal(fm_data_cache_load(&cache, &spec), FM_OK);
    fm_client_data_t shared;
    assert_int_equal(fm_client_data_from_cache(&shared, &cache, 3), FM_OK);
    assert_int_equal(shared.train.n, cap.train.n);
    assert_memory_equal(shared.train.x, cap.train.x, sizeof(float) * 784 * cap.train.n);
    assert_memory_equal(shared.val.y, cap.val.y, cap.val.n);
    fm_client_data_free(&shared);
    fm_data_spec_t other = spec;
    other.regime.examples.v[0] = 60;
    assert_false(fm_data_cache_serves(&cache, &other));
    fm_data_cache_free(&cache);
    fm_client_data_free(&cap);
    /* a range: every client's cap in it, train + validation = its cap */
    assert_int_equal(fm_cap_parse("--client-examples", "30..300", &spec.regime.examples), FM_OK);
    assert_int_equal(fm_client_data_sizes(&spec, sizes), FM_OK);
    for (int c = 0; c < 10; c++)
        assert_int_equal(sizes[c].train + sizes[c].val, fm_cap_of(&spec.regime.examples, spec.seed, c));
}

/* Domains and label maps: client i's rows are its plain rows transformed by
 * domain (i mod n) and relabelled by group (i mod G), on all three splits. */
static void test_client_data_domains_and_concepts(void **state)
{
    (void)state;
    fm_data_spec_t spec;
    fm_data_spec_default(&spec);
    spec.count = 8;
    spec.part.kind = FM_PARTITION_IID;
    assert_int_equal(fm_cap_parse("--client-examples", "40", &spec.regime.examples), FM_OK);
    fm_client_data_t plain[3];
    for (int i = 0; i < 3; i++)
        load(&plain[i], &spec, i);
    assert_int_equal(fm_domains_parse("--domains", "invert,rotate90", &spec.regime.domains), FM_OK);
    spec.regime.concept_groups = 3;
    uint8_t map[3][10];
    for (int g = 0; g < 3; g++)
        fm_concept_map(spec.seed, g, 10, map[g]);
    float scratch[784], raw[784];
    for (int i = 0; i < 3; i++) {
        fm_client_data_t cd;
        load(&cd, &spec, i);
        fm_domain_kind k = i % 2 ? FM_DOMAIN_ROTATE90 : FM_DOMAIN_INVERT;
        const fm_dataset_t *got[3] = {&cd.train, &cd.val, &cd.test}, *was[3] = {&plain[i].train, &plain[i].val,
                                                                                &plain[i].test};
        for (int s = 0; s < 3; s++) {
            assert_int_equal(got[s]->n, was[s]->n);
            for (size_t e = 0; e < got[s]->n; e++) {
                assert_int_equal(got[s]->y[e], map[i][was[s]->y[e]]); /* its own map, test labels too */
                const float *x0 = was[s]->x + e * 784;
                for (int j = 0; j < 784; j++)
                    raw[j] = x0[j] / was[s]->inv_std + was[s]->mean;
                fm_domain_apply(k, raw, 28, 28, spec.seed, 0, scratch);
                for (int j = 0; j < 784; j++)
                    assert_float_equal(got[s]->x[e * 784 + j], (raw[j] - was[s]->mean) * was[s]->inv_std, 1e-4);
            }
        }
        fm_client_data_free(&cd);
        fm_client_data_free(&plain[i]);
    }
}

/* Text: a cap in bytes keeps whole documents within it. */
static void test_text_capped_in_bytes(void **state)
{
    (void)state;
    fm_data_spec_t spec;
    fm_data_spec_default(&spec);
    spec.dataset = "fortunes:eo";
    spec.context = 32;
    fm_client_data_t plain, cap;
    if (fm_client_data_load(&plain, &spec) != FM_OK)
        fail_msg("fortunes-eo not loadable: %s", fm_error_last());
    assert_int_equal(fm_cap_parse("--client-bytes", "8192", &spec.regime.bytes), FM_OK);
    assert_int_equal(fm_client_data_load(&cap, &spec), FM_OK);
    /* windows of context bytes cover the kept documents' bytes */
    assert_true(cap.train.n > 0 && cap.train.n * 32 <= 8192 - 1638 + 32);
    assert_true(cap.train.n * 32 > (8192 - 1638) / 2);
    assert_true(cap.val.n > 0 && cap.val.n * 32 <= 1638 + 32);
    assert_int_equal(cap.test.n, plain.test.n);
    assert_memory_equal(cap.test.tok, plain.test.tok, plain.test.n * 33);
    assert_true(plain.train.n > 4 * cap.train.n);
    fm_client_data_free(&plain);
    fm_client_data_free(&cap);
}

/* The regime travels in the Welcome and is checked against the task. */
static void test_run_spec_carries_and_checks_the_regime(void **state)
{
    (void)state;
    fm_run_spec_t s, back;
    fm_run_spec_default(&s);
    assert_int_equal(fm_cap_parse("f", "25..1000", &s.regime.examples), FM_OK);
    assert_int_equal(fm_domains_parse("f", "rotate,noise", &s.regime.domains), FM_OK);
    s.regime.concept_groups = 2;
    assert_int_equal(fm_run_spec_finish(&s), FM_OK);
    fm_welcome_pb_t w;
    fm_run_spec_welcome(&s, "run-x", 0, 1, &w);
    assert_string_equal(w.data.client_examples, "25..1000");
    assert_int_equal(fm_run_spec_from_welcome(&back, &w.welcome, s.model.specialists), FM_OK);
    assert_true(fm_regime_same(&s.regime, &back.regime));
    char json[4096];
    fm_run_spec_json(&s, json, sizeof json);
    assert_non_null(strstr(json, "\"regime\":{\"client_examples\":\"25..1000\",\"client_bytes\":\"off\","
                                 "\"domains\":\"identity,rotate90,rotate180,rotate270,noise\",\"concept_groups\":2}}"));
    /* a bad regime from the network is refused, not applied */
    w.data.domains = "rotate,warp";
    assert_int_equal(fm_run_spec_from_welcome(&back, &w.welcome, s.model.specialists), FM_ERR_FORMAT);
    /* runs without a regime keep their config text (resume across versions) */
    fm_run_spec_t plain;
    fm_run_spec_default(&plain);
    fm_run_spec_json(&plain, json, sizeof json);
    assert_null(strstr(json, "regime"));
    /* units follow the task */
    s.regime.examples.kind = FM_CAP_NONE;
    assert_int_equal(fm_cap_parse("f", "4096", &s.regime.bytes), FM_OK);
    assert_int_equal(fm_run_spec_finish(&s), FM_ERR_ARG);
    assert_non_null(strstr(fm_error_last(), "--client-examples"));
    fm_model_config_text(&s.model);
    s.strategy = FM_STRATEGY_COMIGS;
    s.regime.domains.n = 0;
    s.regime.concept_groups = 0;
    assert_int_equal(fm_run_spec_finish(&s), FM_OK);
    s.regime.concept_groups = 2;
    assert_int_equal(fm_run_spec_finish(&s), FM_ERR_ARG);
}

/* --data-seed: the run's data follows it and not the run seed (runs on one
 * partition differing only in training seed); it travels in the Welcome and
 * shows in the config text only when set. */
static void test_data_seed_keys_the_data_alone(void **state)
{
    (void)state;
    fm_run_spec_t s;
    fm_run_spec_default(&s);
    s.partition_count = 10;
    s.part.kind = FM_PARTITION_DIRICHLET;
    s.part.alpha = 0.1;
    assert_int_equal(fm_cap_parse("f", "30..300", &s.regime.examples), FM_OK);
    assert_int_equal(fm_run_spec_finish(&s), FM_OK);
    fm_data_spec_t d;
    fm_split_sizes_t base[10], other[10];
    fm_run_spec_data(&s, &d);
    assert_int_equal(fm_client_data_sizes(&d, base), FM_OK);
    /* another run seed, the same data seed: the same sizes and the same rows */
    fm_run_spec_t t = s;
    t.data_seed = s.seed;
    t.seed = 7;
    fm_run_spec_data(&t, &d);
    assert_int_equal(fm_client_data_sizes(&d, other), FM_OK);
    assert_memory_equal(base, other, sizeof base);
    fm_client_data_t a, b;
    load(&a, &d, 4);
    fm_run_spec_data(&s, &d);
    load(&b, &d, 4);
    assert_int_equal(a.train.n, b.train.n);
    assert_memory_equal(a.train.y, b.train.y, a.train.n);
    assert_memory_equal(a.test.x, b.test.x, sizeof(float) * 784 * a.test.n);
    fm_client_data_free(&a);
    fm_client_data_free(&b);
    /* another data seed: other partitions and caps */
    t.data_seed = 2;
    fm_run_spec_data(&t, &d);
    assert_int_equal(fm_client_data_sizes(&d, other), FM_OK);
    assert_memory_not_equal(base, other, sizeof base);
    /* on the wire and in the config text */
    fm_welcome_pb_t w;
    fm_run_spec_t back;
    fm_run_spec_welcome(&t, "run-x", 0, 1, &w);
    assert_int_equal(fm_run_spec_from_welcome(&back, &w.welcome, t.model.specialists), FM_OK);
    assert_int_equal(back.seed, 7);
    assert_int_equal(fm_run_spec_data_seed(&back), 2);
    char json[4096];
    fm_run_spec_json(&t, json, sizeof json);
    assert_non_null(strstr(json, "\"holdout\":false,\"data_seed\":2}"));
    fm_run_spec_json(&s, json, sizeof json);
    assert_null(strstr(json, "data_seed"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cap_parse_and_names),
        cmocka_unit_test(test_cap_keeps_a_nested_subset_of_each_split),
        cmocka_unit_test(test_transforms_known_answers),
        cmocka_unit_test(test_domains_parse_and_check),
        cmocka_unit_test(test_concept_maps_are_bijections),
        cmocka_unit_test(test_client_data_capped),
        cmocka_unit_test(test_client_data_domains_and_concepts),
        cmocka_unit_test(test_text_capped_in_bytes),
        cmocka_unit_test(test_run_spec_carries_and_checks_the_regime),
        cmocka_unit_test(test_data_seed_keys_the_data_alone),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
