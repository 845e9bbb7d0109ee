/* Secure aggregation's masking (secagg.h), the four phases run in memory with
 * real keys and real ciphers: whoever drops between phases, the coordinator's
 * unmasked sum is bit for bit the plaintext fixed-point sum of the clients
 * that sent masked inputs, and the aggregator fed that sum gives the same
 * floats as one fed their updates; below the threshold the round cannot be
 * unmasked; a tampered sealed share is found by GCM and its sender named,
 * the sum still exact while enough others hold that sender's shares, the
 * round abandoned (the sender named) when too few do. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/aggregate.h"
#include "fedmoe/log.h"
#include "fedmoe/rng.h"
#include "fedmoe/secagg.h"

enum { N = 10, T = 6, D = 3000 };
#define ROUND 7u

typedef enum { NONE, AFTER_KEYS, AFTER_SHARES, AFTER_MASKED, IN_UNMASK } drop_at;

typedef struct {
    int liar; /* 1-based: this client's answers in phase 3 are wrong (0: none) */
    int tamperer, tampered; /* 1-based: this client's shares for the first `tampered` others are changed */
    uint32_t unbuilt;       /* the coordinator's: whose secret could not be rebuilt (0: none) */
    float x[N][D];
    uint64_t w[N];
    fm_sa_client_t *c[N];
    bool gone[N]; /* dropped so far */
} world_t;

static void make_world(world_t *wd, uint64_t seed)
{
    fm_rng_t r;
    fm_rng_init(&r, seed, fm_rng_stream(FM_STREAM_TEST, 31));
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < D; j++)
            wd->x[i][j] = (float)fm_rng_normal(&r) * (j % 7 == 0 ? 100.0f : 0.01f);
        wd->w[i] = 1 + fm_rng_u32(&r) % 5000;
        assert_int_equal(fm_sa_client_new(&wd->c[i], (uint32_t)i + 1, N, T, ROUND), FM_OK);
        wd->gone[i] = false;
    }
    wd->liar = 0;
    wd->tamperer = wd->tampered = 0;
    wd->unbuilt = 0;
}

static void drop(world_t *wd, int count, int first)
{
    for (int i = first; i < first + count; i++)
        wd->gone[i] = true;
}

/* Runs the round with `count` clients (from `first`) dropping at `when`;
 * returns the status of the coordinator's unmasking and the sum in *sum
 * (d + 1 values), the survivors of the masked phase in in3. */
static fm_status run_round(world_t *wd, drop_at when, int count, int first, fm_u128 *sum, bool in3[N])
{
    /* phase 0 */
    fm_sa_keys_t u1[N];
    uint32_t k1 = 0;
    if (when == AFTER_KEYS)
        drop(wd, count, first); /* (they never advertise) */
    for (int i = 0; i < N; i++)
        if (!wd->gone[i])
            fm_sa_client_keys(wd->c[i], &u1[k1++]);
    /* phase 1: every client of U1 seals its shares; the coordinator relays */
    static fm_sa_sealed_t sealed[N][N];
    bool shared[N] = {false};
    for (int i = 0; i < N; i++)
        if (!wd->gone[i]) {
            fm_status st = fm_sa_client_share(wd->c[i], u1, k1, sealed[i]);
            if (st != FM_OK)
                return st;
            shared[i] = true;
        }
    for (int m = 0; wd->tamperer && m < wd->tampered; m++)
        sealed[wd->tamperer - 1][m].sealed[5] ^= 1;
    if (when == AFTER_SHARES) /* they shared, then dropped: their pair masks must come off */
        drop(wd, count, first);
    fm_sa_keys_t u2[N];
    uint32_t k2 = 0;
    for (int i = 0; i < N; i++)
        if (shared[i])
            fm_sa_client_keys(wd->c[i], &u2[k2++]);
    /* phase 2: each client still here opens what was sealed for it (from U2) and masks */
    memset(sum, 0, sizeof(fm_u128) * (D + 1));
    static fm_u128 y[D + 1];
    for (int i = 0; i < N; i++) {
        in3[i] = false;
        if (wd->gone[i] || !shared[i])
            continue;
        fm_sa_sealed_t mine[N];
        uint32_t k = 0;
        for (int j = 0; j < N; j++)
            for (uint32_t m = 0; shared[j] && j != i && m < k1 - 1; m++)
                if (sealed[j][m].to == (uint32_t)i + 1)
                    mine[k++] = sealed[j][m];
        fm_status st = fm_sa_client_mask(wd->c[i], mine, k, wd->x[i], D, wd->w[i], y);
        if (st != FM_OK)
            return st;
        fm_sa_sum_add(sum, y, D);
        in3[i] = true;
    }
    if (when == AFTER_MASKED) { /* their inputs are in the sum; they answer nothing more */
        drop(wd, count, first);
    }
    uint32_t u3[N], k3 = 0;
    for (int i = 0; i < N; i++)
        if (in3[i])
            u3[k3++] = (uint32_t)i + 1;
    /* phase 3 */
    if (when == IN_UNMASK)
        drop(wd, count, first);
    static fm_sa_share_t shares[N * N];
    uint32_t ns = 0;
    for (int i = 0; i < N; i++) {
        if (wd->gone[i] || !in3[i])
            continue;
        uint32_t got;
        fm_status st = fm_sa_client_unmask(wd->c[i], u3, k3, shares + ns, &got);
        if (st != FM_OK)
            return st;
        for (uint32_t m = 0; wd->liar == i + 1 && m < got; m++)
            shares[ns + m].y[40] ^= 0x5a; /* every share it gives is wrong */
        ns += got;
    }
    return fm_sa_unmask(sum, D, T, ROUND, u2, k2, u3, k3, shares, ns, &wd->unbuilt);
}

static void check_sum(const world_t *wd, const fm_u128 *sum, const bool in3[N])
{
    static fm_u128 plain[D + 1], one[D + 1];
    memset(plain, 0, sizeof plain);
    fm_aggregator_t *a, *b;
    assert_int_equal(fm_aggregator_new(&a, D), FM_OK);
    assert_int_equal(fm_aggregator_new(&b, D), FM_OK);
    int k = 0;
    for (int i = 0; i < N; i++)
        if (in3[i]) {
            fm_sa_encode(wd->x[i], D, wd->w[i], one);
            fm_sa_sum_add(plain, one, D);
            assert_int_equal(fm_aggregator_add(a, wd->x[i], wd->w[i]), FM_OK);
            k++;
        }
    assert_memory_equal(sum, plain, sizeof plain); /* bit for bit */
    assert_int_equal(fm_aggregator_add_sum(b, (const __int128 *)sum, (uint64_t)sum[D], k), FM_OK);
    static float ra[D], rb[D];
    assert_int_equal(fm_aggregator_result(a, ra), FM_OK);
    assert_int_equal(fm_aggregator_result(b, rb), FM_OK);
    assert_memory_equal(ra, rb, sizeof ra);
    assert_int_equal(fm_aggregator_total_weight(a), fm_aggregator_total_weight(b));
    fm_aggregator_destroy(&a);
    fm_aggregator_destroy(&b);
}

static void free_world(world_t *wd)
{
    for (int i = 0; i < N; i++)
        fm_sa_client_destroy(&wd->c[i]);
}

/* 0%, 10% and 30% of the clients dropping at each phase: the sum of those
 * whose masked input came, exactly. */
static void test_dropouts_at_each_phase(void **state)
{
    (void)state;
    static world_t wd;
    static fm_u128 sum[D + 1];
    const drop_at phases[] = {AFTER_KEYS, AFTER_SHARES, AFTER_MASKED, IN_UNMASK};
    const int counts[] = {0, 1, 3};
    for (size_t p = 0; p < 4; p++)
        for (size_t q = 0; q < 3; q++) {
            make_world(&wd, 100 + 10 * p + q);
            bool in3[N];
            fm_status st = run_round(&wd, phases[p], counts[q], 2, sum, in3);
            if (st != FM_OK)
                fail_msg("phase %zu, %d dropped: %s", p, counts[q], fm_error_last());
            int k = 0;
            for (int i = 0; i < N; i++)
                k += in3[i];
            assert_int_equal(k, phases[p] <= AFTER_SHARES ? N - counts[q] : N);
            check_sum(&wd, sum, in3);
            free_world(&wd);
        }
}

/* Fewer than t left: abandoned, at whichever phase it happens. */
static void test_below_threshold(void **state)
{
    (void)state;
    static world_t wd;
    static fm_u128 sum[D + 1];
    bool in3[N];
    const drop_at phases[] = {AFTER_KEYS, AFTER_SHARES, IN_UNMASK};
    for (size_t p = 0; p < 3; p++) {
        make_world(&wd, 200 + p);
        assert_int_equal(run_round(&wd, phases[p], N - T + 1, 0, sum, in3), FM_ERR_STATE);
        free_world(&wd);
    }
}

/* Sealed shares changed on the way (by the coordinator that relays them, or
 * sealed wrong by their sender): GCM finds them, the receiver names the
 * sender and masks all the same. With one of client 3's shares spoiled the
 * others still hold enough to rebuild its secret: the sum is exact. With
 * N - T + 1 spoiled, fewer than T are left: the round is abandoned, client 3
 * named as the one whose secret could not be rebuilt. */
static void test_tampered_share(void **state)
{
    (void)state;
    static world_t wd;
    static fm_u128 sum[D + 1];
    bool in3[N];
    make_world(&wd, 300);
    wd.tamperer = 3;
    wd.tampered = 1;
    assert_int_equal(run_round(&wd, NONE, 0, 0, sum, in3), FM_OK);
    uint32_t who[N];
    int named = 0;
    for (int i = 0; i < N; i++) {
        uint32_t k = fm_sa_client_unopened(wd.c[i], who, N);
        assert_true(k <= 1);
        named += k == 1 && who[0] == 3;
    }
    assert_int_equal(named, 1);
    assert_int_equal(wd.unbuilt, 0);
    check_sum(&wd, sum, in3);
    free_world(&wd);
    make_world(&wd, 301);
    wd.tamperer = 3;
    wd.tampered = N - T + 1;
    assert_int_equal(run_round(&wd, NONE, 0, 0, sum, in3), FM_ERR_STATE);
    assert_int_equal(wd.unbuilt, 3);
    free_world(&wd);
}

/* A malicious client that answers wrong shares in the last phase: the
 * coordinator rebuilds every secret from other choices of t shares (checked
 * against what each owner advertised) and the sum is still exact; with only
 * t answers, one of them wrong, the round is abandoned, never unmasked wrong. */
static void test_wrong_shares(void **state)
{
    (void)state;
    static world_t wd;
    static fm_u128 sum[D + 1];
    bool in3[N];
    make_world(&wd, 400);
    wd.liar = 1; /* (the first holder: every choice of t in order would take it first) */
    assert_int_equal(run_round(&wd, AFTER_SHARES, 2, 6, sum, in3), FM_OK); /* (2 dropped: their s keys rebuilt too) */
    check_sum(&wd, sum, in3);
    free_world(&wd);
    make_world(&wd, 401);
    wd.liar = 1;
    assert_int_equal(run_round(&wd, IN_UNMASK, N - T, 4, sum, in3), FM_ERR_STATE); /* t answers, one a liar */
    assert_non_null(strstr(fm_error_last(), "rebuilds it"));
    free_world(&wd);
}

/* What each side refuses: a threshold that is not a majority; a value that
 * is not finite or beyond the aggregator's bound; a second masked input or
 * unmasking (a second U3 could ask for both secrets of a client); a U3
 * without the client; on the coordinator a U3 outside U2 or a U2 with a
 * repeated client. */
static void test_refusals(void **state)
{
    (void)state;
    fm_sa_client_t *c = NULL;
    assert_int_equal(fm_sa_client_new(&c, 1, 10, 5, ROUND), FM_ERR_ARG);
    assert_null(c);
    static world_t wd;
    make_world(&wd, 500);
    fm_sa_keys_t u1[N];
    for (int i = 0; i < N; i++)
        fm_sa_client_keys(wd.c[i], &u1[i]);
    static fm_sa_sealed_t sealed[N][N - 1];
    for (int i = 0; i < N; i++)
        assert_int_equal(fm_sa_client_share(wd.c[i], u1, N, sealed[i]), FM_OK);
    fm_sa_sealed_t mine[N - 1];
    uint32_t k = 0;
    for (int j = 1; j < N; j++)
        for (int m = 0; m < N - 1; m++)
            if (sealed[j][m].to == 1)
                mine[k++] = sealed[j][m];
    static fm_u128 y[D + 1];
    float keep = wd.x[0][7];
    wd.x[0][7] = NAN;
    assert_int_equal(fm_sa_client_mask(wd.c[0], mine, k, wd.x[0], D, wd.w[0], y), FM_ERR_ARG);
    wd.x[0][7] = 2e9f;
    assert_int_equal(fm_sa_client_mask(wd.c[0], mine, k, wd.x[0], D, wd.w[0], y), FM_ERR_ARG);
    wd.x[0][7] = keep;
    uint32_t all3[N], got;
    for (int i = 0; i < N; i++)
        all3[i] = (uint32_t)i + 1;
    static fm_sa_share_t out[N];
    assert_int_equal(fm_sa_client_unmask(wd.c[0], all3, N, out, &got), FM_ERR_STATE); /* not masked yet */
    fm_sa_sealed_t bad_last[N - 1]; /* a refused call changes nothing: the last share not its own, then all good */
    memcpy(bad_last, mine, sizeof(fm_sa_sealed_t) * k);
    bad_last[k - 1].to = 2;
    assert_int_equal(fm_sa_client_mask(wd.c[0], bad_last, k, wd.x[0], D, wd.w[0], y), FM_ERR_FORMAT);
    assert_int_equal(fm_sa_client_mask(wd.c[0], mine, k, wd.x[0], D, wd.w[0], y), FM_OK);
    assert_int_equal(fm_sa_client_mask(wd.c[0], mine, k, wd.x[0], D, wd.w[0], y), FM_ERR_STATE); /* a second masked input */
    assert_int_equal(fm_sa_client_unmask(wd.c[0], all3 + 1, N - 1, out, &got), FM_ERR_STATE); /* U3 without it */
    assert_int_equal(fm_sa_client_unmask(wd.c[0], all3, N, out, &got), FM_OK);
    assert_int_equal(got, N);
    assert_int_equal(fm_sa_client_unmask(wd.c[0], all3, T, out, &got), FM_ERR_STATE); /* a second U3 */
    static fm_u128 sum[D + 1];
    fm_sa_keys_t twice[N];
    memcpy(twice, u1, sizeof twice);
    twice[1] = twice[0];
    uint32_t unbuilt;
    assert_int_equal(fm_sa_unmask(sum, D, T, ROUND, twice, N, all3, N, out, got, &unbuilt), FM_ERR_FORMAT);
    uint32_t outside[T] = {1, 2, 3, 4, 5, 11};
    assert_int_equal(fm_sa_unmask(sum, D, T, ROUND, u1, N, outside, T, out, got, &unbuilt), FM_ERR_FORMAT);
    free_world(&wd);
}

int main(void)
{
    fm_log_set_level(FM_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dropouts_at_each_phase),
        cmocka_unit_test(test_below_threshold),
        cmocka_unit_test(test_tampered_share),
        cmocka_unit_test(test_wrong_shares),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
