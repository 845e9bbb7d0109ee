/* Client-level differential privacy's parts: the Rényi DP accountant against
 * published values (the expected numbers of TensorFlow Privacy's own tests of
 * its RDP accountant: compute_rdp and get_privacy_spent), the closed forms at
 * q = 1 and q = 0, composition by addition; clipping an update to its bound;
 * the noise's spread from the cryptographic generator. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/accountant.h"
#include "fedmoe/aggregate.h"
#include "fedmoe/dp.h"
#include "fedmoe/log.h"
#include "fedmoe/runspec.h"

/* Within rel relative (or abs absolute) of want. */
static void near(double got, double want, double rel, double abs_tol)
{
    if (!(fabs(got - want) <= abs_tol || fabs(got - want) <= rel * fabs(want)))
        fail_msg("got %.9g, want %.9g", got, want);
}

/* TensorFlow Privacy: compute_rdp(q=0.1, z=2, steps=10, order 5) = 0.07737, and
 * compute_rdp(0.01, 2.5, 50, [1.5, 2.5, 5, 50, 100]) = [0.00065, 0.001085,
 * 0.00218075, 0.023846, 167.416307] (to 1e-5): integer and fractional orders,
 * small and huge values. */
static void test_rdp_published(void **state)
{
    (void)state;
    near(10 * fm_rdp_sampled_gaussian(0.1, 2.0, 5.0), 0.07737, 0.0, 1e-5);
    const double ord[] = {1.5, 2.5, 5, 50, 100};
    const double want[] = {0.00065, 0.001085, 0.00218075, 0.023846, 167.416307};
    for (int i = 0; i < 5; i++)
        near(50 * fm_rdp_sampled_gaussian(0.01, 2.5, ord[i]), want[i], 0.01, 1e-5);
}

/* Without sampling the Gaussian mechanism's RDP is alpha / (2 z^2); nothing
 * sampled spends nothing; no noise is unbounded. */
static void test_rdp_closed_forms(void **state)
{
    (void)state;
    near(fm_rdp_sampled_gaussian(1.0, 10.0, 20.0), 0.1, 1e-12, 0.0);
    assert_true(fm_rdp_sampled_gaussian(0.0, 10.0, 20.0) == 0.0);
    assert_true(isinf(fm_rdp_sampled_gaussian(0.5, 0.0, 2.0)));
    /* sampling only helps, and more noise only helps */
    for (int i = 0; i < FM_RDP_ORDERS; i++) {
        double a = fm_rdp_orders()[i];
        assert_true(fm_rdp_sampled_gaussian(0.05, 1.0, a) <= fm_rdp_sampled_gaussian(1.0, 1.0, a));
        assert_true(fm_rdp_sampled_gaussian(0.05, 2.0, a) <= fm_rdp_sampled_gaussian(0.05, 1.0, a));
    }
}

/* TensorFlow Privacy's get_privacy_spent: a constant RDP of 1.1 at orders
 * 2..32 gives epsilon 1.32783806176 at delta 1e-5, at order 32; the Gaussian
 * mechanism with z = 4.530877117 (no sampling), over a fine grid of orders, is
 * (1, 1e-6)-DP. */
static void test_epsilon_published(void **state)
{
    (void)state;
    double ord[31], rdp[31], at;
    for (int i = 0; i < 31; i++) {
        ord[i] = 2 + i;
        rdp[i] = 1.1;
    }
    near(fm_rdp_epsilon(ord, rdp, 31, 1e-5, &at), 1.32783806176, 1e-9, 0.0);
    assert_true(at == 32.0);
    int n = 99000;
    double *o = malloc(sizeof *o * (size_t)n), *r = malloc(sizeof *r * (size_t)n);
    assert_non_null(o);
    assert_non_null(r);
    for (int i = 0; i < n; i++) {
        o[i] = 0.001 * (1000 + i);
        r[i] = fm_rdp_sampled_gaussian(1.0, 4.530877117, o[i]);
    }
    near(fm_rdp_epsilon(o, r, n, 1e-6, NULL), 1.0, 1e-6, 0.0);
    free(o);
    free(r);
}

/* Rounds compose by addition; epsilon grows with the rounds and falls with
 * the noise; bad arguments are refused. */
static void test_accountant_composes(void **state)
{
    (void)state;
    fm_accountant_t a, b, c;
    fm_accountant_init(&a);
    fm_accountant_init(&b);
    fm_accountant_init(&c);
    assert_int_equal(fm_accountant_add(&a, 0.1, 1.2, 50), FM_OK);
    assert_int_equal(fm_accountant_add(&a, 0.1, 1.2, 50), FM_OK);
    assert_int_equal(fm_accountant_add(&b, 0.1, 1.2, 100), FM_OK);
    assert_int_equal(fm_accountant_add(&c, 0.1, 1.2, 50), FM_OK);
    near(fm_accountant_epsilon(&a, 1e-5), fm_accountant_epsilon(&b, 1e-5), 1e-12, 0.0);
    assert_true(fm_accountant_epsilon(&c, 1e-5) < fm_accountant_epsilon(&b, 1e-5));
    fm_accountant_t d;
    fm_accountant_init(&d);
    assert_int_equal(fm_accountant_add(&d, 0.1, 3.0, 100), FM_OK);
    assert_true(fm_accountant_epsilon(&d, 1e-5) < fm_accountant_epsilon(&b, 1e-5));
    assert_int_equal(fm_accountant_add(&d, 1.5, 1.0, 1), FM_ERR_ARG);
    assert_int_equal(fm_accountant_add(&d, 0.1, -1.0, 1), FM_ERR_ARG);
    assert_int_equal(fm_accountant_add(&d, NAN, 1.0, 1), FM_ERR_ARG);
}

/* An update whose distance from the reference is above C is scaled to exactly
 * C (in direction kept); one below is left alone. */
static void test_clip_to_bound(void **state)
{
    (void)state;
    float ref[4] = {1, 2, 3, 4}, x[4] = {4, 6, 3, 4}, y[4] = {1.5f, 2, 3, 4};
    double before = fm_clip_to_norm(x, ref, 4, 2.0);
    near(before, 5.0, 1e-12, 0.0);
    near(x[0] - ref[0], 1.2, 1e-6, 0.0); /* (3, 4) scaled by 2/5 */
    near(x[1] - ref[1], 1.6, 1e-6, 0.0);
    assert_true(x[2] == 3 && x[3] == 4);
    near(fm_clip_to_norm(y, ref, 4, 2.0), 0.5, 1e-12, 0.0);
    assert_true(y[0] == 1.5f);
}

/* The noise has the asked standard deviation and mean 0 (200,000 draws: the
 * standard deviation within 1%), and two draws differ (not seeded). */
static void test_noise_spread(void **state)
{
    (void)state;
    size_t n = 200001;
    float *x = calloc(n, sizeof *x), *y = calloc(n, sizeof *y);
    assert_non_null(x);
    assert_non_null(y);
    assert_int_equal(fm_dp_add_noise(x, n, 0.7), FM_OK);
    assert_int_equal(fm_dp_add_noise(y, n, 0.7), FM_OK);
    double s = 0, s2 = 0;
    size_t same = 0;
    for (size_t i = 0; i < n; i++) {
        s += x[i];
        s2 += (double)x[i] * x[i];
        same += x[i] == y[i];
    }
    double mean = s / n, sd = sqrt(s2 / n - mean * mean);
    near(sd, 0.7, 0.01, 0.0);
    assert_true(fabs(mean) < 4 * 0.7 / sqrt((double)n));
    assert_true(same < 10);
    assert_int_equal(fm_dp_add_noise(x, n, -1.0), FM_ERR_ARG);
    assert_int_equal(fm_dp_add_noise(x, n, INFINITY), FM_ERR_ARG);
    free(x);
    free(y);
}

/* What differential privacy cannot be combined with is refused with one line
 * naming the flags; a valid run replaces --clip-norm's learned bound. */
static void test_dp_settings(void **state)
{
    (void)state;
    struct {
        fm_strategy strategy;
        double z, C, budget, clip_norm;
        fm_agg_rule rule;
        fm_dp_mode mode;
        const char *says; /* NULL: accepted */
    } t[] = {
        {FM_STRATEGY_COMIGS, 1.0, 0.5, 0.0, FM_CLIP_AUTO, FM_AGG_MEAN, FM_DP_CENTRAL, NULL},
        {FM_STRATEGY_FEDAVG, 1.0, 0.5, 8.0, 0.0, FM_AGG_MEAN, FM_DP_CENTRAL, NULL},
        {FM_STRATEGY_COMIGS, 1.0, 0.0, 0.0, FM_CLIP_AUTO, FM_AGG_MEAN, FM_DP_CENTRAL, "--dp-clip"},
        {FM_STRATEGY_COMIGS, 0.0, 0.5, 0.0, FM_CLIP_AUTO, FM_AGG_MEAN, FM_DP_CENTRAL, "--clip-norm"},
        {FM_STRATEGY_COMIGS, 0.0, 0.0, 3.0, FM_CLIP_AUTO, FM_AGG_MEAN, FM_DP_CENTRAL, "--dp-epsilon-budget needs"},
        {FM_STRATEGY_COMIGS, -2.0, 0.5, 0.0, FM_CLIP_AUTO, FM_AGG_MEAN, FM_DP_CENTRAL, "--dp-noise must"},
        {FM_STRATEGY_COMIGS, FM_DP_NOISE_AUTO, 0.5, 0.0, FM_CLIP_AUTO, FM_AGG_MEAN, FM_DP_CENTRAL, "auto needs"},
        {FM_STRATEGY_COMIGS, FM_DP_NOISE_AUTO, 0.5, 3.0, FM_CLIP_AUTO, FM_AGG_MEAN, FM_DP_CENTRAL, NULL},
        {FM_STRATEGY_FULL, FM_DP_NOISE_AUTO, 0.5, 3.0, FM_CLIP_AUTO, FM_AGG_MEAN, FM_DP_CENTRAL, "nearest peers"},
        {FM_STRATEGY_LOCAL, 1.0, 0.5, 0.0, FM_CLIP_AUTO, FM_AGG_MEAN, FM_DP_CENTRAL, "averages nothing"},
        {FM_STRATEGY_FULL, 1.0, 0.5, 0.0, FM_CLIP_AUTO, FM_AGG_MEAN, FM_DP_CENTRAL, "nearest peers"},
        {FM_STRATEGY_PFEDMOAP, 1.0, 0.5, 0.0, FM_CLIP_AUTO, FM_AGG_MEAN, FM_DP_CENTRAL, "nearest peers"},
        {FM_STRATEGY_COMIGS, 1.0, 0.5, 0.0, FM_CLIP_AUTO, FM_AGG_MEDIAN, FM_DP_CENTRAL, "--aggregate mean"},
        {FM_STRATEGY_COMIGS, 1.0, 0.5, 0.0, 2.0, FM_AGG_MEAN, FM_DP_CENTRAL, "--dp-clip alone"},
        {FM_STRATEGY_COMIGS, 1.0, 0.5, 0.0, FM_CLIP_AUTO, FM_AGG_MEAN, FM_DP_DISTRIBUTED, "needs --secure-aggregation"},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        fm_run_spec_t s;
        fm_run_spec_default(&s);
        s.strategy = t[i].strategy;
        s.dp.noise = t[i].z;
        s.dp.clip = t[i].C;
        s.dp.budget = t[i].budget;
        s.dp.mode = t[i].mode;
        s.clip_norm = t[i].clip_norm;
        s.aggregate.rule = t[i].rule;
        fm_status st = fm_run_spec_finish(&s);
        if (!t[i].says) {
            assert_int_equal(st, FM_OK);
            assert_true(s.clip_norm == 0.0); /* the DP clip bounds the updates, nothing learned from them */
            char json[8192];
            assert_true(fm_run_spec_json(&s, json, sizeof json) < sizeof json);
            assert_non_null(strstr(json, t[i].z == FM_DP_NOISE_AUTO ? "\"privacy\":{\"noise\":\"auto\",\"clip\":0.5,"
                                                                    : "\"privacy\":{\"noise\":1,\"clip\":0.5,"));
            continue;
        }
        assert_int_equal(st, FM_ERR_ARG);
        if (!strstr(fm_error_last(), t[i].says))
            fail_msg("case %zu: '%s' does not say '%s'", i, fm_error_last(), t[i].says);
    }
    fm_run_spec_t plain; /* without privacy the config text is as before: no "privacy" */
    fm_run_spec_default(&plain);
    assert_int_equal(fm_run_spec_finish(&plain), FM_OK);
    char json[8192];
    fm_run_spec_json(&plain, json, sizeof json);
    assert_null(strstr(json, "privacy"));
    assert_null(strstr(json, "secure_aggregation"));
}

/* --secure-aggregation: taken with fedavg and comigs under the mean (the
 * coordinator's clipping then off: it cannot see the updates; a --clip-norm
 * given becomes the clients' own bound, and differential privacy's noise is
 * theirs to add, --dp-mode distributed); refused, with the reason, where the
 * coordinator would need to see an update. */
static void test_secagg_settings(void **state)
{
    (void)state;
    const struct {
        fm_strategy strategy;
        fm_agg_rule rule;
        double clip_norm, z;
        fm_dp_mode mode;
        const char *says;          /* NULL: accepted, */
        double client_clip, client_z; /* with these bounds for the clients */
    } t[] = {
        {FM_STRATEGY_FEDAVG, FM_AGG_MEAN, FM_CLIP_AUTO, 0.0, FM_DP_CENTRAL, NULL, 0.0, 0.0},
        {FM_STRATEGY_COMIGS, FM_AGG_MEAN, 0.0, 0.0, FM_DP_CENTRAL, NULL, 0.0, 0.0},
        {FM_STRATEGY_FEDAVG, FM_AGG_MEAN, 2.0, 0.0, FM_DP_CENTRAL, NULL, 2.0, 0.0},
        {FM_STRATEGY_COMIGS, FM_AGG_MEAN, FM_CLIP_AUTO, 1.5, FM_DP_DISTRIBUTED, NULL, 0.5, 1.5},
        {FM_STRATEGY_LOCAL, FM_AGG_MEAN, FM_CLIP_AUTO, 0.0, FM_DP_CENTRAL, "averages nothing", 0, 0},
        {FM_STRATEGY_PFEDMOAP, FM_AGG_MEAN, FM_CLIP_AUTO, 0.0, FM_DP_CENTRAL, "nearest peers", 0, 0},
        {FM_STRATEGY_FULL, FM_AGG_MEAN, FM_CLIP_AUTO, 0.0, FM_DP_CENTRAL, "nearest peers", 0, 0},
        {FM_STRATEGY_FULL, FM_AGG_MEAN, FM_CLIP_AUTO, 1.0, FM_DP_DISTRIBUTED, "nearest peers", 0, 0},
        {FM_STRATEGY_FEDAVG, FM_AGG_MEDIAN, FM_CLIP_AUTO, 0.0, FM_DP_CENTRAL, "--aggregate mean", 0, 0},
        {FM_STRATEGY_FEDAVG, FM_AGG_MEAN, FM_CLIP_AUTO, 1.0, FM_DP_CENTRAL, "needs --dp-mode distributed", 0, 0},
        {FM_STRATEGY_FEDAVG, FM_AGG_MEAN, 2.0, 1.0, FM_DP_DISTRIBUTED, "--dp-clip alone", 0, 0},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        fm_run_spec_t s;
        fm_run_spec_default(&s);
        s.secure_aggregation = true;
        s.strategy = t[i].strategy;
        s.aggregate.rule = t[i].rule;
        s.clip_norm = t[i].clip_norm;
        s.dp.noise = t[i].z;
        s.dp.clip = t[i].z > 0 ? 0.5 : 0.0;
        s.dp.mode = t[i].mode;
        fm_status st = fm_run_spec_finish(&s);
        if (!t[i].says) {
            assert_int_equal(st, FM_OK);
            assert_true(fm_run_client_clip(&s) == t[i].client_clip);
            assert_true(fm_run_client_noise(&s) == t[i].client_z);
            char json[8192];
            fm_run_spec_json(&s, json, sizeof json);
            assert_non_null(strstr(json, ",\"secure_aggregation\":true}"));
            s.secure_aggregation = false; /* (the clients bound nothing without it) */
            assert_true(fm_run_client_clip(&s) == 0.0 && fm_run_client_noise(&s) == 0.0);
            continue;
        }
        assert_int_equal(st, FM_ERR_ARG);
        if (!strstr(fm_error_last(), t[i].says))
            fail_msg("case %zu: '%s' does not say '%s'", i, fm_error_last(), t[i].says);
    }
}

/* --prompt-pool off (no non-local prompt slots): pfedmoap and full send
 * nothing of one client to another, so both privacy modes take them (their
 * prompts averaged with the rest); with the pool on they are refused with a
 * line that names the way out. */
static void test_pool_off(void **state)
{
    (void)state;
    const fm_strategy pool[] = {FM_STRATEGY_PFEDMOAP, FM_STRATEGY_FULL};
    for (int i = 0; i < 2; i++)
        for (int mode = 0; mode < 2; mode++) { /* secure aggregation, central DP */
            fm_run_spec_t s;
            fm_run_spec_default(&s);
            s.strategy = pool[i];
            if (mode == 0) {
                s.secure_aggregation = true;
            } else {
                s.dp.noise = 1.0;
                s.dp.clip = 0.5;
            }
            assert_true(fm_run_uses_pool(&s));
            assert_int_equal(fm_run_spec_finish(&s), FM_ERR_ARG);
            assert_non_null(strstr(fm_error_last(), "--prompt-pool off"));
            s.model.max_nonlocal = 0;
            assert_false(fm_run_uses_pool(&s));
            assert_int_equal(fm_run_spec_finish(&s), FM_OK);
        }
}

/* A client's share of distributed noise: z C / sqrt(t), so that any t or more
 * of them sum to at least the central mode's z C. */
static void test_client_noise_share(void **state)
{
    (void)state;
    assert_float_equal(fm_dp_client_sd(2.0, 0.5, 4), 0.5, 1e-15);
    assert_float_equal(fm_dp_client_sd(1.0, 3.0, 9), 1.0, 1e-15);
    for (uint32_t t = 1; t < 50; t++)
        for (uint32_t k = t; k < 60; k++) /* k >= t shares: the sum's spread */
            assert_true(sqrt((double)k) * fm_dp_client_sd(1.3, 0.7, t) >= 1.3 * 0.7 * (1.0 - 1e-12));
}

/* The least noise for a budget: it spends at most epsilon, and 0.1% less
 * noise would spend more (the published setting above: q 0.01, 1000 steps). */
static void test_noise_for_budget(void **state)
{
    (void)state;
    const struct { double q; uint64_t steps; double eps; } t[] = {{1.0, 30, 1.0}, {1.0, 20, 8.0}, {0.01, 1000, 3.0}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        double z = fm_accountant_noise_for(t[i].q, t[i].steps, t[i].eps, 1e-5);
        assert_true(z > 0.0);
        fm_accountant_t a, b;
        fm_accountant_init(&a);
        fm_accountant_init(&b);
        assert_int_equal(fm_accountant_add(&a, t[i].q, z, t[i].steps), FM_OK);
        assert_int_equal(fm_accountant_add(&b, t[i].q, 0.999 * z, t[i].steps), FM_OK);
        assert_true(fm_accountant_epsilon(&a, 1e-5) <= t[i].eps);
        assert_true(fm_accountant_epsilon(&b, 1e-5) > t[i].eps);
    }
    assert_true(fm_accountant_noise_for(1.0, 10, 0.0, 1e-5) == 0.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rdp_published),
        cmocka_unit_test(test_rdp_closed_forms),
        cmocka_unit_test(test_epsilon_published),
        cmocka_unit_test(test_accountant_composes),
        cmocka_unit_test(test_clip_to_bound),
        cmocka_unit_test(test_noise_spread),
        cmocka_unit_test(test_dp_settings),
        cmocka_unit_test(test_noise_for_budget),
        cmocka_unit_test(test_secagg_settings),
        cmocka_unit_test(test_client_noise_share),
        cmocka_unit_test(test_pool_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
