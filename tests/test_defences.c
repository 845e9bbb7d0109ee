/* What the coordinator refuses and bounds, in-process (coord_harness.h): bad
 * bytes and unknown clients, Hello floods, made-up counts and weights, update
 * clipping, partition squatting. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord_harness.h"
#include "coordinator_internal.h"
#include "fedmoe/clientdata.h"
#include "fedmoe/log.h"
#include "procs.h"

static void test_bad_bytes_and_unknown_clients(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    small_config(&cfg, 2, 2);
    fm_coordinator_t *c = start(&cfg);
    fm_coordinator_handle(c, "x", (const uint8_t *)"\xff\xff\xff", 3, 0.0);
    assert_int_equal(last_error_code("x"), FM_WIRE_MALFORMED);
    heartbeat(c, "y", 0.0);
    assert_int_equal(last_error_code("y"), FM_WIRE_UNKNOWN_CLIENT);
    hello(c, "a", 100, 0.0);
    hello(c, "b", 100, 0.0);
    hello(c, "c", 100, 0.0); /* two partitions only */
    assert_int_equal(last_error_code("c"), FM_WIRE_REJECTED);
    finish(&c);
}

/* SQLite's data_version of db as another connection sees it: it changes when
 * the coordinator commits anything. */
static int64_t data_version(sqlite3 *h)
{
    sqlite3_stmt *q;
    assert_int_equal(sqlite3_prepare_v2(h, "PRAGMA data_version", -1, &q, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    int64_t v = sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
    return v;
}

/* 200 Hellos in 20 s that change nothing cost no transaction (no fsync each: a
 * flood must not stall the coordinator) and draw a Welcome about once a second;
 * a Hello that changes the client's counts is written at once. */
static void test_hello_flood_writes_nothing(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    small_config(&cfg, 2, 2);
    fm_coordinator_t *c = start(&cfg);
    hello(c, "a", 100, 0.0);
    sqlite3 *h;
    assert_int_equal(sqlite3_open_v2(cfg.db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    int64_t v0 = data_version(h);
    for (int i = 0; i < 200; i++)
        hello(c, "a", 100, 0.1 * i);
    /* answered about once a second (bursts of 4), not 200 times */
    int welcomes = count_sent("a", FEDMOE__ENVELOPE__BODY_WELCOME, NULL);
    assert_true(welcomes >= 20 && welcomes <= 26);
    assert_true(data_version(h) == v0);
    hello(c, "a", 120, 21.0); /* new counts */
    assert_true(data_version(h) != v0);
    sqlite3_close(h);
    finish(&c);
}

/* The averaging weights are the coordinator's: a client on the run's dataset
 * must declare its partition's real split sizes (which the coordinator computes
 * from the dataset's labels) and weighs its training examples; one on data of
 * its own declaring 2^29 examples weighs --max-weight; an update whose counts
 * differ from its hello's, or whose accuracy is not its counts' ratio, is
 * refused. */
static void test_weights_decided_by_coordinator(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    small_config(&cfg, 4, 2);
    cfg.max_weight = 300;
    fm_coordinator_t *c = start(&cfg);
    Fedmoe__Envelope env;
    Fedmoe__Hello h;
    procs_hello(&env, &h, "liar", 3, 5000); /* the run's data, made-up counts */
    h.own_data = false;
    inject(c, "liar", &env, 0.0);
    assert_int_equal(last_error_code("liar"), FM_WIRE_REJECTED);
    fm_split_sizes_t z[4];
    fm_data_spec_t ds;
    fm_run_spec_data(&cfg.spec, &ds); /* 4 partitions */
    assert_int_equal(fm_client_data_sizes(&ds, z), FM_OK);
    procs_hello(&env, &h, "liar", 3, z[3].train); /* its real counts */
    h.own_data = false;
    h.val_samples = z[3].val;
    h.test_samples = z[3].test;
    inject(c, "liar", &env, 0.0);
    assert_int_equal(count_sent("liar", FEDMOE__ENVELOPE__BODY_WELCOME, NULL), 1);
    hello(c, "a", 100, 0.0);
    hello(c, "big", 1ull << 29, 0.0); /* data of its own: weight capped at 300 */
    hello(c, "acc", 100, 0.0);
    assert_int_equal(fm_coordinator_tick(c, 0.0), FM_OK);
    update(c, "acc", 1.0f, 100, PERFECT_SCORE, 1.0);
    assert_int_equal(last_error_code("acc"), FM_WIRE_BAD_VALUE);
    update(c, "a", 1.0f, 100, HONEST, 1.0);
    update(c, "big", 2.0f, 1ull << 28, HONEST, 1.0); /* not the count it declared */
    assert_int_equal(last_error_code("big"), FM_WIRE_BAD_VALUE);
    finish(&c);

    /* the weighted mean: (100 x 1 + 300 x 2) / 400 */
    small_config(&cfg, 2, 2);
    cfg.max_weight = 300;
    c = start(&cfg);
    hello(c, "a", 100, 0.0);
    hello(c, "big", 1ull << 29, 0.0);
    assert_int_equal(fm_coordinator_tick(c, 0.0), FM_OK);
    update(c, "a", 1.0f, 100, HONEST, 1.0);
    update(c, "big", 2.0f, 1ull << 29, HONEST, 1.0);
    expect_rounds(c, &cfg, 1.0, 1);
    for (size_t i = 0; i < task_model("a", 1)->data.len / 4; i += 97)
        assert_float_equal(task_step("a", 1, i), 1.75f, 1e-5);
    finish(&c);
}

/* --clip-norm: a fixed bound shrinks a long update to the bound and keeps its
 * direction; auto learns the bound (2x the median distance) from the round
 * itself in round 1 and from the previous round after. */
static void test_clip_bounds(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    small_config(&cfg, 2, 2);
    cfg.spec.clip_norm = 1.0;
    fm_coordinator_t *c = start(&cfg);
    hello(c, "a", 100, 0.0);
    hello(c, "b", 100, 0.0);
    assert_int_equal(fm_coordinator_tick(c, 0.0), FM_OK);
    const Fedmoe__Tensor *t = task_model("a", 1);
    double n = (double)(t->data.len / 4);
    update(c, "a", 0.001f, 100, HONEST, 1.0); /* distance 0.001 sqrt(n): within 1 */
    update(c, "b", 1.0f, 100, HONEST, 1.0);   /* distance sqrt(n): clipped to 1 */
    expect_rounds(c, &cfg, 1.0, 1);
    for (size_t i = 0; i < (size_t)n; i += 101)
        assert_float_equal(task_step("a", 1, i), (0.001 + 1.0 / sqrt(n)) / 2, 1e-5);
    finish(&c);

    small_config(&cfg, 3, 3); /* auto, the default */
    assert_true(cfg.spec.clip_norm == FM_CLIP_AUTO);
    c = start(&cfg);
    hello(c, "a", 100, 0.0);
    hello(c, "b", 100, 0.0);
    hello(c, "x", 100, 0.0);
    assert_int_equal(fm_coordinator_tick(c, 0.0), FM_OK);
    /* round 1 learns its bound from its own updates: 2 x median(0.01, 0.03, 1) sqrt(n) */
    update(c, "a", 0.01f, 100, HONEST, 1.0);
    update(c, "x", 1.0f, 100, HONEST, 1.0);
    update(c, "b", 0.03f, 100, HONEST, 1.0);
    expect_rounds(c, &cfg, 1.0, 1);
    /* round 2: the bound learned in round 1 (0.06 sqrt(n)) applies as updates come */
    update(c, "a", 0.01f, 100, HONEST, 2.0);
    update(c, "b", 1.0f, 100, HONEST, 2.0);
    update(c, "x", 0.01f, 100, HONEST, 2.0);
    expect_rounds(c, &cfg, 2.0, 2);
    for (size_t i = 0; i < (size_t)n; i += 101) {
        assert_float_equal(task_step("a", 1, i), (0.01 + 0.03 + 0.06) / 3, 1e-4);
        assert_float_equal(task_step("a", 2, i), (0.01 + 0.06 + 0.01) / 3, 1e-4);
    }
    finish(&c);
}

/* A selected client repeating its Hello (85 MB of Hellos drew 8.4 GB of Tasks):
 * its Task goes again once a round after a Hello, and after that only when its
 * heartbeat shows it lacks it, TASK_LOST_S apart. */
static void test_repeated_hello_resends_task_once(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    const char *ids[] = {"a", "b"};
    fm_coordinator_t *c = open_run(&cfg, ids, 2, 2, 100);
    assert_int_equal(count_sent("a", FEDMOE__ENVELOPE__BODY_TASK, NULL), 1);
    for (int i = 0; i < 500; i++) {
        hello(c, "a", 100, 1.0 + 0.01 * i);
        heartbeat(c, "b", 1.0 + 0.01 * i);
    }
    assert_int_equal(count_sent("a", FEDMOE__ENVELOPE__BODY_TASK, NULL), 2);
    heartbeat_progress(c, "a", 0, 0, 20.0); /* it really lacks it */
    assert_int_equal(count_sent("a", FEDMOE__ENVELOPE__BODY_TASK, NULL), 3);
    heartbeat_progress(c, "a", 0, 0, 21.0); /* just sent */
    assert_int_equal(count_sent("a", FEDMOE__ENVELOPE__BODY_TASK, NULL), 3);
    updates(c, ids, 2, 0.0f, 100, 22.0);
    expect_rounds(c, &cfg, 22.0, 1);
    finish(&c);
}

/* A key alternating its Hello between two partitions (0 of 6 rounds in 90 s,
 * 583 k log lines): two changes a minute are taken, the rest refused without a
 * transaction; the honest clients' round still commits. */
static void test_alternating_partitions_refused(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    small_config(&cfg, 4, 2);
    fm_coordinator_t *c = start(&cfg);
    hello(c, "a", 100, 0.0);
    hello(c, "b", 100, 0.0);
    Fedmoe__Envelope env;
    Fedmoe__Hello h;
    procs_hello(&env, &h, "x", 2, 100);
    inject(c, "x", &env, 0.0);
    sqlite3 *db;
    assert_int_equal(sqlite3_open_v2(cfg.db, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    int64_t v = data_version(db);
    int versions = 0;
    for (int i = 1; i <= 400; i++) {
        procs_hello(&env, &h, "x", 2 + i % 2, 100);
        inject(c, "x", &env, 0.05 * i);
        int64_t now_v = data_version(db);
        versions += now_v != v;
        v = now_v;
    }
    assert_true(versions <= 2);
    /* the Hellos naming the partition it kept are answered, about once a second */
    assert_true(count_sent("x", FEDMOE__ENVELOPE__BODY_WELCOME, NULL) <= 3 + 4 + 20);
    assert_int_equal(last_error_code("x"), FM_WIRE_REJECTED);
    heartbeat(c, "a", 20.0);
    heartbeat(c, "b", 20.0);
    assert_int_equal(fm_coordinator_tick(c, 20.0), FM_OK);
    assert_true(fm_coordinator_round_open(c));
    sqlite3_close(db);
    finish(&c);
}

/* Error reports and junk from a key that never said Hello (1.79 M log lines in
 * 8 s): 20,000 of each in 10 s cost a few dozen log lines and Error replies. */
static void test_error_flood_bounded(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    small_config(&cfg, 2, 2);
    fm_coordinator_t *c = start(&cfg);
    fm_log_set_level(FM_LOG_INFO);
    unsigned long lines = fm_log_lines();
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    Fedmoe__Error e = FEDMOE__ERROR__INIT;
    e.code = 1;
    e.text = "flood";
    env.body_case = FEDMOE__ENVELOPE__BODY_ERROR;
    env.error = &e;
    for (int i = 0; i < 20000; i++) {
        double t = 0.0005 * i;
        inject(c, "ghost", &env, t);
        fm_coordinator_handle(c, "ghost", (const uint8_t *)"\xff\xff\xff", 3, t);
        heartbeat(c, "ghost", t);
        if (i % 100 == 0)
            assert_int_equal(fm_coordinator_tick(c, t), FM_OK);
    }
    assert_int_equal(fm_coordinator_tick(c, 12.0), FM_OK); /* the summaries */
    unsigned long logged = fm_log_lines() - lines;
    fm_log_set_level(FM_LOG_ERROR);
    assert_true(logged <= 60);
    int replies = count_sent("ghost", FEDMOE__ENVELOPE__BODY_ERROR, NULL);
    assert_true(replies >= 20 && replies <= 130); /* 20 at once, then 10 a second */
    hello(c, "a", 100, 12.0); /* others are answered */
    assert_int_equal(count_sent("a", FEDMOE__ENVELOPE__BODY_WELCOME, NULL), 1);
    finish(&c);
}

/* A client on data of its own declaring 2^40 test examples, all right (the
 * logged accuracy became 100%, the honest 18.4%): in the round's sums it weighs
 * at most --max-weight examples, like its averaging weight. */
static void test_forged_counts_bounded(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    small_config(&cfg, 2, 2);
    cfg.max_weight = 100;
    fm_coordinator_t *c = start(&cfg);
    hello(c, "a", 300, 0.0); /* 100 test examples, 50 right */
    hello(c, "liar", 1ull << 40, 0.0);
    assert_int_equal(fm_coordinator_tick(c, 0.0), FM_OK);
    update(c, "a", 0.0f, 300, HONEST, 1.0);
    update(c, "liar", 0.0f, 1ull << 40, ALL_CORRECT, 1.0);
    expect_rounds(c, &cfg, 1.0, 1);
    assert_float_equal(round_accuracy(cfg.db, 1), (50.0 + 100.0) / (100.0 + 100.0), 1e-9);
    finish(&c);
}

/* --clip-norm auto with two updates a round: the bound is twice the smaller
 * distance, so one poisoned update of two moves the model by at most twice the
 * honest step (with the mean of the two it passed whole). */
static void test_clip_two_updates(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    small_config(&cfg, 2, 2); /* auto, the default */
    fm_coordinator_t *c = start(&cfg);
    hello(c, "a", 100, 0.0);
    hello(c, "x", 100, 0.0);
    assert_int_equal(fm_coordinator_tick(c, 0.0), FM_OK);
    size_t n = task_model("a", 1)->data.len / 4;
    update(c, "a", 0.01f, 100, HONEST, 1.0);
    update(c, "x", 1.0f, 100, HONEST, 1.0);
    expect_rounds(c, &cfg, 1.0, 1);
    update(c, "a", 0.01f, 100, HONEST, 2.0); /* round 2: the bound from round 1 */
    update(c, "x", 1.0f, 100, HONEST, 2.0);
    expect_rounds(c, &cfg, 2.0, 2);
    for (size_t i = 0; i < n; i += 101) {
        assert_float_equal(task_step("a", 1, i), (0.01 + 0.02) / 2, 1e-4);
        assert_float_equal(task_step("a", 2, i), (0.01 + 0.02) / 2, 1e-4);
    }
    finish(&c);
}

/* Local inputs as well as remote ones: a --max-message below the run's
 * messages, and a checkpoint that is not the round it is filed under or is past
 * the run's rounds (a database changed outside fedmoe), are refused at start
 * with one line. */
static void test_local_inputs_refused(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    small_config(&cfg, 2, 2);
    cfg.max_message = 1024;
    fm_coordinator_t *c = NULL;
    assert_int_equal(fm_coordinator_new(&c, &cfg, NULL, NULL), FM_ERR_ARG);
    assert_non_null(strstr(fm_error_last(), "--max-message 1024 is smaller than this run's messages"));

    const char *ids[] = {"a", "b"};
    c = open_run(&cfg, ids, 2, 2, 100);
    updates(c, ids, 2, 0.0f, 100, 1.0);
    expect_rounds(c, &cfg, 1.0, 1);
    finish(&c);
    sqlite3 *h;
    assert_int_equal(sqlite3_open(cfg.db, &h), SQLITE_OK);
    assert_int_equal(sqlite3_exec(h, "UPDATE checkpoints SET round = 4", NULL, NULL, NULL), SQLITE_OK);
    assert_int_equal(fm_coordinator_new(&c, &cfg, NULL, NULL), FM_ERR_FORMAT);
    assert_non_null(strstr(fm_error_last(), "is of round 1 (its row says 4), not the round it is filed under"));
    /* a well-formed checkpoint of round 9 in a run of 5 */
    sqlite3_stmt *q;
    assert_int_equal(sqlite3_prepare_v2(h, "SELECT state FROM checkpoints", -1, &q, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    fm_checkpoint_t ck;
    assert_int_equal(fm_checkpoint_decode(sqlite3_column_blob(q, 0), (size_t)sqlite3_column_bytes(q, 0), &ck), FM_OK);
    sqlite3_finalize(q);
    ck.round = 9;
    uint8_t *blob;
    size_t len;
    assert_int_equal(fm_checkpoint_encode(&ck, &blob, &len), FM_OK);
    fm_checkpoint_free(&ck);
    char sha[65];
    fm_sha256_hex(blob, len, sha);
    assert_int_equal(sqlite3_prepare_v2(h, "UPDATE checkpoints SET round = 9, state = ?, sha256 = ?", -1, &q, NULL),
                     SQLITE_OK);
    sqlite3_bind_blob(q, 1, blob, (int)len, SQLITE_TRANSIENT);
    sqlite3_bind_text(q, 2, sha, -1, SQLITE_TRANSIENT);
    assert_int_equal(sqlite3_step(q), SQLITE_DONE);
    sqlite3_finalize(q);
    free(blob);
    sqlite3_close(h);
    assert_int_equal(fm_coordinator_new(&c, &cfg, NULL, NULL), FM_ERR_FORMAT);
    assert_non_null(strstr(fm_error_last(), "is of round 9 (its row says 9), past the run's rounds"));
}

/* Partition squatting: two ids take both partitions with a Hello and leave.
 * An honest client is refused while their leases run, and given a partition
 * once they have been gone past --partition-lease. */
static void test_partition_lease(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    small_config(&cfg, 2, 2);
    cfg.partition_lease = 30.0;
    fm_coordinator_t *c = start(&cfg);
    hello(c, "s1", 0, 0.0);
    hello(c, "s2", 0, 0.0);
    assert_int_equal(count_sent(NULL, FEDMOE__ENVELOPE__BODY_WELCOME, NULL), 2);
    assert_int_equal(fm_coordinator_tick(c, 20.0), FM_OK); /* silent past the client timeout */
    hello(c, "honest", 0, 25.0);
    assert_int_equal(last_error_code("honest"), FM_WIRE_REJECTED); /* leases still running */
    hello(c, "honest", 0, 31.0);
    assert_int_equal(count_sent("honest", FEDMOE__ENVELOPE__BODY_WELCOME, NULL), 1);
    hello(c, "s1", 0, 32.0); /* back: the other released partition */
    assert_int_equal(count_sent("s1", FEDMOE__ENVELOPE__BODY_WELCOME, NULL), 2);
    hello(c, "late", 0, 33.0);
    assert_int_equal(last_error_code("late"), FM_WIRE_REJECTED); /* both held by clients present */
    finish(&c);
}

/* --clip-norm auto in a round without a learned bound, with more updates than
 * its sample: the first FM_CLIP_SAMPLE (32) set the bound (2x their lower
 * median), are clipped by it and summed, and every later update is clipped by
 * it as it comes; the round holds at most 32 updates (it held them all, 4.7 GB
 * spilled at 5,000 clients). The next round's bound comes from every distance.
 * (With 32 or fewer the rule is the old one: test_clip_bounds.) */
static double lower_median_of(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v[(n - 1) / 2];
}

static void test_clip_sample(void **state)
{
    (void)state;
    enum { S = FM_CLIP_SAMPLE, N = FM_CLIP_SAMPLE + 8 };
    char names[N][16];
    const char *ids[N];
    double delta[N], sorted[N];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "c%02d", i);
        ids[i] = names[i];
        /* the sample: one long update (1.0) and 0.01 .. 0.01 (S - 1); the rest
         * 0.02, and one more long one */
        delta[i] = i == 0 || i == N - 1 ? 1.0 : i < S ? 0.01 * i : 0.02;
    }
    memcpy(sorted, delta, sizeof sorted);
    double sample_bound = 2 * lower_median_of(sorted, S);
    memcpy(sorted, delta, sizeof sorted);
    double next_bound = 2 * lower_median_of(sorted, N);
    fm_server_config_t cfg;
    fm_coordinator_t *c = open_run(&cfg, ids, N, N, 100); /* auto, the default */
    assert_true(cfg.spec.clip_norm == FM_CLIP_AUTO);
    size_t n = task_model("c00", 1)->data.len / 4;
    double sum1 = 0.0;
    for (int i = 0; i < N; i++) {
        update(c, ids[i], (float)delta[i], 100, HONEST, 1.0);
        sum1 += delta[i] < sample_bound ? delta[i] : sample_bound;
        assert_int_equal(fm_aggregator_held(c->agg_model), i < S - 1 ? i + 1 : 0);
        if (i == S - 1)
            assert_float_equal(c->sampled[0], sample_bound * sqrt((double)n), 1e-3 * sqrt((double)n));
        assert_false(fm_aggregator_spilled(c->agg_model)); /* (the sample stays in memory: no spill file) */
    }
    expect_rounds(c, &cfg, 1.0, 1);
    for (int i = 0; i < N; i++)
        update(c, ids[i], i == 0 ? 1.0f : 0.0f, 100, HONEST, 2.0);
    expect_rounds(c, &cfg, 2.0, 2);
    for (size_t i = 0; i < n; i += 101) {
        assert_float_equal(task_step("c00", 1, i), sum1 / N, 1e-4);
        assert_float_equal(task_step("c00", 2, i), next_bound / N, 1e-5);
    }
    finish(&c);
}

int main(void)
{
    fm_log_set_level(FM_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_bytes_and_unknown_clients),
        cmocka_unit_test(test_hello_flood_writes_nothing),
        cmocka_unit_test(test_weights_decided_by_coordinator),
        cmocka_unit_test(test_clip_bounds),
        cmocka_unit_test(test_partition_lease),
        cmocka_unit_test(test_repeated_hello_resends_task_once),
        cmocka_unit_test(test_alternating_partitions_refused),
        cmocka_unit_test(test_error_flood_bounded),
        cmocka_unit_test(test_forged_counts_bounded),
        cmocka_unit_test(test_clip_two_updates),
        cmocka_unit_test(test_clip_sample),
        cmocka_unit_test(test_local_inputs_refused),
    };
    return procs_run_tests("defences", tests, sizeof tests / sizeof tests[0], coord_dir, sizeof coord_dir);
}
