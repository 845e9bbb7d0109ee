/* The coordinator object driven in-process: messages injected as bytes, a fake
 * clock, replies captured from the send callback; a real SQLite file. No child
 * processes, no sockets: each case runs in milliseconds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator.h"
#include "fedmoe/clientdata.h"
#include "fedmoe/exchange.h"
#include "fedmoe/log.h"
#include "fedmoe/store.h"
#include "fedmoe/wire.h"
#include "procs.h"

static char dir[256];
static int db_seq;
static fm_run_spec_t run_spec; /* the spec of the newest small_config, as the clients know it */

/* ---- the outbox --------------------------------------------------------------- */

#define MAX_SENT 4096
typedef struct {
    char id[64];
    Fedmoe__Envelope *env;
} sent_t;
static sent_t sent[MAX_SENT];
static int nsent;

static fm_status capture(void *user, const char *id, const uint8_t *data, size_t len)
{
    (void)user;
    assert_true(nsent < MAX_SENT);
    snprintf(sent[nsent].id, 64, "%s", id);
    assert_int_equal(fm_wire_decode(data, len, (size_t)1 << 30, &sent[nsent].env), FM_OK);
    nsent++;
    return FM_OK;
}

static void clear_outbox(void)
{
    for (int i = 0; i < nsent; i++)
        fedmoe__envelope__free_unpacked(sent[i].env, NULL);
    nsent = 0;
}

/* How many messages of this kind went to id (NULL: anyone); *last gets the newest. */
static int count_sent(const char *id, Fedmoe__Envelope__BodyCase kind, Fedmoe__Envelope **last)
{
    int n = 0;
    for (int i = 0; i < nsent; i++)
        if ((!id || !strcmp(sent[i].id, id)) && sent[i].env->body_case == kind) {
            n++;
            if (last)
                *last = sent[i].env;
        }
    return n;
}

static uint32_t last_error_code(const char *id)
{
    Fedmoe__Envelope *e = NULL;
    return count_sent(id, FEDMOE__ENVELOPE__BODY_ERROR, &e) ? e->error->code : 0;
}

/* ---- a small run ---------------------------------------------------------------- */

static void small_config(fm_server_config_t *cfg, int clients, int quorum)
{
    fm_server_config_default(cfg);
    snprintf(cfg->db, sizeof cfg->db, "%s/coord-%d.db", dir, ++db_seq);
    cfg->rounds = 5;
    cfg->min_clients = quorum;
    cfg->round_timeout = 100.0;
    cfg->client_timeout = 15.0;
    cfg->spec.partition_count = clients;
    fm_model_config_t *m = &cfg->spec.model;
    m->d = 8;
    m->ffn_hidden = 8;
    m->text_hidden = 8;
    m->prompt_dim = 8;
    m->heads = 2;
    run_spec = cfg->spec;
}

static void inject(fm_coordinator_t *c, const char *id, Fedmoe__Envelope *env, double now)
{
    uint8_t *buf;
    size_t len;
    assert_int_equal(fm_wire_encode(env, &buf, &len), FM_OK);
    fm_coordinator_handle(c, id, buf, len, now);
    free(buf);
}

static void hello(fm_coordinator_t *c, const char *id, uint64_t samples, double now)
{
    Fedmoe__Envelope env;
    Fedmoe__Hello h;
    procs_hello(&env, &h, id, -1, samples);
    inject(c, id, &env, now);
}

static void heartbeat(fm_coordinator_t *c, const char *id, double now)
{
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    Fedmoe__Heartbeat hb = FEDMOE__HEARTBEAT__INIT;
    env.body_case = FEDMOE__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    inject(c, id, &env, now);
}

typedef enum { HONEST, SHORT, NOT_FINITE, REPLAYED, PERFECT_SCORE } fault_t;

/* The Update a client sends back for its newest Task: the task's model plus
 * delta in every value; SHORT sends a model one value short, NOT_FINITE one
 * with a NaN in it. */
static void update(fm_coordinator_t *c, const char *id, float delta, uint64_t samples, fault_t fault, double now)
{
    Fedmoe__Envelope *task = NULL;
    assert_true(count_sent(id, FEDMOE__ENVELOPE__BODY_TASK, &task) > 0);
    fm_exchange_dims_t d = fm_exchange_dims(&run_spec, task->task->model[0]->shape[1]);
    fm_task_in_t in;
    fm_wire_code code;
    assert_int_equal(fm_exchange_read_task(&run_spec, &d, task->task, &in, &code), FM_OK);
    for (size_t i = 0; i < d.nmodel; i++)
        in.model[i] += delta;
    if (fault == SHORT)
        d.nmodel--;
    if (fault == NOT_FINITE)
        in.model[d.nmodel / 2] = NAN;
    fm_update_t u = {.round = in.round, .train_samples = samples, .model = in.model, .prompt = in.prompt};
    memcpy(u.nonce, in.nonce, sizeof u.nonce);
    if (fault == REPLAYED) /* another round's capture, relabelled with this round's number */
        u.nonce[0] ^= 1;
    float acc;
    procs_fake_counts(samples, &u.metrics.val_samples, &u.metrics.test_samples, &u.metrics.test_correct, &acc);
    u.metrics.test_accuracy = fault == PERFECT_SCORE ? 1.0 : acc; /* not what its counts say */
    uint8_t *buf;
    size_t len;
    assert_int_equal(fm_exchange_encode_update(&run_spec, &d, &u, &buf, &len), FM_OK);
    fm_coordinator_handle(c, id, buf, len, now);
    free(buf);
    fm_exchange_task_free(&in);
}

static fm_coordinator_t *start(const fm_server_config_t *cfg)
{
    fm_coordinator_t *c = NULL;
    clear_outbox(); /* (what a failed case left) */
    assert_int_equal(fm_coordinator_new(&c, cfg, capture, NULL), FM_OK);
    return c;
}

static void finish(fm_coordinator_t **c)
{
    fm_coordinator_destroy(c);
    clear_outbox();
}

/* The status of client id in round r of the latest run. */
static void client_status(const char *db, int round, const char *id, char out[16])
{
    fm_store_t *s;
    fm_run_row_t run;
    bool found;
    assert_int_equal(fm_store_open(&s, db, true), FM_OK);
    assert_int_equal(fm_store_latest_run(s, &run, &found), FM_OK);
    fm_client_round_row_t *rows;
    int n;
    assert_int_equal(fm_store_list_client_rounds(s, run.id, round, &rows, &n), FM_OK);
    out[0] = 0;
    for (int i = 0; i < n; i++)
        if (!strcmp(rows[i].client_id, id))
            snprintf(out, 16, "%s", rows[i].status);
    free(rows);
    fm_store_run_clear(&run);
    fm_store_close(&s);
}

static int rounds_logged(const char *db) { return procs_committed_rounds(db); }

/* A coordinator for n clients (one partition each) that all say hello with
 * `samples` at time 0; the first round opened. */
static fm_coordinator_t *open_run(fm_server_config_t *cfg, const char *const *ids, int n, int quorum,
                                  uint64_t samples)
{
    small_config(cfg, n, quorum);
    fm_coordinator_t *c = start(cfg);
    for (int i = 0; i < n; i++)
        hello(c, ids[i], samples, 0.0);
    assert_int_equal(count_sent(NULL, FEDMOE__ENVELOPE__BODY_WELCOME, NULL), n);
    assert_int_equal(fm_coordinator_tick(c, 0.0), FM_OK);
    return c;
}

static void updates(fm_coordinator_t *c, const char *const *ids, int n, float delta, uint64_t samples, double now)
{
    for (int i = 0; i < n; i++)
        update(c, ids[i], delta, samples, HONEST, now);
}

/* A tick at now after which the run has `rounds` rounds logged. */
static void expect_rounds(fm_coordinator_t *c, const fm_server_config_t *cfg, double now, int rounds)
{
    assert_int_equal(fm_coordinator_tick(c, now), FM_OK);
    assert_int_equal(rounds_logged(cfg->db), rounds);
}

static void expect_status(const fm_server_config_t *cfg, int round, const char *id, const char *status)
{
    char st[16];
    client_status(cfg->db, round, id, st);
    assert_string_equal(st, status);
}

/* The model values of the k-th Task (1-based) sent to id. */
static const Fedmoe__Tensor *task_model(const char *id, int k)
{
    for (int i = 0; i < nsent; i++)
        if (!strcmp(sent[i].id, id) && sent[i].env->body_case == FEDMOE__ENVELOPE__BODY_TASK && --k == 0)
            return sent[i].env->task->model[0];
    fail();
    return NULL;
}

/* ---- cases ------------------------------------------------------------------- */

static void test_quorum_reached(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    const char *ids[] = {"a", "b", "c"};
    fm_coordinator_t *c = open_run(&cfg, ids, 3, 2, 100);
    assert_int_equal(count_sent(NULL, FEDMOE__ENVELOPE__BODY_TASK, NULL), 3);
    updates(c, ids, 3, 1.0f, 100, 1.0);
    assert_int_equal(fm_coordinator_round(c), 1);
    expect_rounds(c, &cfg, 1.1, 1); /* all in: commits without waiting */
    /* round 2 opened at once, its task carries the mean: old model + 1 */
    assert_int_equal(count_sent("a", FEDMOE__ENVELOPE__BODY_TASK, NULL), 2);
    const Fedmoe__Tensor *m1 = task_model("a", 1), *m2 = task_model("a", 2);
    assert_int_equal(m1->data.len, m2->data.len);
    for (size_t i = 0; i < m1->data.len / 4; i += 97) {
        float x, y;
        memcpy(&x, m1->data.data + 4 * i, 4);
        memcpy(&y, m2->data.data + 4 * i, 4);
        assert_true(fabsf(y - (x + 1.0f)) < 1e-5f);
    }
    finish(&c);
}

static void test_deadline_with_straggler(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    const char *ids[] = {"a", "b", "slow"};
    fm_coordinator_t *c = open_run(&cfg, ids, 3, 2, 100);
    updates(c, ids, 2, 0.5f, 100, 5.0);
    for (double t = 10.0; t < 100.0; t += 10.0) { /* the straggler is alive but never uploads */
        for (int i = 0; i < 3; i++)
            heartbeat(c, ids[i], t);
        expect_rounds(c, &cfg, t, 0);
    }
    expect_rounds(c, &cfg, 100.5, 1); /* the deadline */
    expect_status(&cfg, 1, "slow", "dropped");
    expect_status(&cfg, 1, "a", "completed");
    finish(&c);
}

/* An update refused for its contents (NaN, a short tensor) ends that client's
 * part: later updates are refused and the round does not wait for it. One
 * without its Task's nonce is refused too but ends nothing. */
static void test_refused_update_ends_its_part(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    const char *ids[] = {"a", "b", "bad", "nan"};
    fm_coordinator_t *c = open_run(&cfg, ids, 4, 2, 100);
    /* without its Task's nonce (a capture from another round relabelled with
     * this round's number): refused, changes nothing, a's part goes on */
    update(c, "a", 5.0f, 100, REPLAYED, 0.3);
    assert_int_equal(last_error_code("a"), FM_WIRE_WRONG_ROUND);
    update(c, "nan", 0.0f, 100, NOT_FINITE, 0.5);
    assert_int_equal(last_error_code("nan"), FM_WIRE_BAD_VALUE);
    update(c, "bad", 0.0f, 100, SHORT, 1.0); /* one value short */
    assert_int_equal(last_error_code("bad"), FM_WIRE_BAD_TENSOR);
    update(c, "bad", 0.0f, 100, HONEST, 1.5); /* too late: its part ended */
    assert_int_equal(last_error_code("bad"), FM_WIRE_WRONG_ROUND);
    updates(c, ids, 2, 0.0f, 100, 2.0);
    /* nobody is awaited any more: the round commits now, not at the deadline */
    expect_rounds(c, &cfg, 2.1, 1);
    expect_status(&cfg, 1, "bad", "rejected");
    expect_status(&cfg, 1, "nan", "rejected");
    expect_status(&cfg, 1, "a", "completed"); /* its real update, after the replay */
    finish(&c);
}

static void test_rehello_gets_task_again(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    const char *ids[] = {"a", "b"};
    fm_coordinator_t *c = open_run(&cfg, ids, 2, 2, 100);
    assert_int_equal(count_sent("b", FEDMOE__ENVELOPE__BODY_TASK, NULL), 1);
    update(c, "a", 0.0f, 100, HONEST, 1.0);
    /* b restarts mid-round, inside the client timeout: hello, then hello with its data */
    hello(c, "b", 0, 3.0);
    assert_int_equal(count_sent("b", FEDMOE__ENVELOPE__BODY_TASK, NULL), 1);
    hello(c, "b", 100, 4.0);
    assert_int_equal(count_sent("b", FEDMOE__ENVELOPE__BODY_TASK, NULL), 2);
    update(c, "b", 0.0f, 100, HONEST, 5.0);
    expect_rounds(c, &cfg, 5.1, 1);
    finish(&c);
}

/* Quorum 3 of 3 with one client that heartbeats but never uploads: the deadline
 * is extended FM_ROUND_MAX_EXTENSIONS times, then the client is dropped and the
 * round abandoned; after failing twice it sits out, and with a fourth client the
 * run goes on without waiting for it. */
static void test_silent_worker_capped(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    const char *ids[] = {"a", "b", "mute"};
    fm_coordinator_t *c = open_run(&cfg, ids, 3, 3, 100);
    double t = 0.0;
    for (int attempt = 0; attempt < 2; attempt++) {
        updates(c, ids, 2, 0.0f, 100, t + 1.0);
        double opened = t;
        while (fm_coordinator_round_open(c) && count_sent("mute", FEDMOE__ENVELOPE__BODY_TASK, NULL) == attempt + 1 &&
               t < opened + 1000.0) {
            t += 5.0;
            for (int i = 0; i < 3; i++)
                heartbeat(c, ids[i], t);
            expect_rounds(c, &cfg, t, 0);
        }
        /* each attempt took its timeout plus two extensions, not more */
        assert_true(t > opened + 3 * cfg.round_timeout - 10.0 && t <= opened + 3 * cfg.round_timeout + 5.0);
    }
    /* benched: only a and b are ready, short of the quorum, so no round opens */
    assert_false(fm_coordinator_round_open(c));
    assert_int_equal(count_sent("mute", FEDMOE__ENVELOPE__BODY_TASK, NULL), 2);
    finish(&c);
}

/* With a fourth client the run goes on without the one that never uploads. */
static void test_run_goes_on_without_silent_worker(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    const char *ids[] = {"a", "b", "d", "mute"};
    fm_coordinator_t *c = open_run(&cfg, ids, 4, 3, 100);
    double t = 0.0;
    for (int round = 1; round <= 3; round++) {
        updates(c, ids, 3, 0.0f, 100, t + 1.0);
        double opened = t;
        while (rounds_logged(cfg.db) < round && t < opened + 1000.0) {
            t += 5.0;
            for (int i = 0; i < 4; i++)
                heartbeat(c, ids[i], t);
            assert_int_equal(fm_coordinator_tick(c, t), FM_OK);
        }
        /* the first two rounds wait for it until their deadline; then it sits out */
        if (round <= 2)
            assert_true(t - opened >= cfg.round_timeout && t - opened < cfg.round_timeout + 10.0);
        else
            assert_true(t - opened <= 5.0);
    }
    expect_status(&cfg, 2, "mute", "dropped");
    expect_status(&cfg, 3, "mute", ""); /* not selected: no row */
    /* it sat out one round and is tried again in round 4 */
    Fedmoe__Envelope *last = NULL;
    assert_int_equal(count_sent("mute", FEDMOE__ENVELOPE__BODY_TASK, &last), 3);
    assert_int_equal(last->task->round, 4);
    finish(&c);
}

static void test_resume_from_checkpoint(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    const char *ids[] = {"a", "b"};
    fm_coordinator_t *c = open_run(&cfg, ids, 2, 2, 100);
    update(c, "a", 1.0f, 100, HONEST, 1.0);
    update(c, "b", 2.0f, 100, HONEST, 1.0);
    expect_rounds(c, &cfg, 1.0, 1);
    const Fedmoe__Tensor *t2 = task_model("a", 2);
    size_t n = t2->data.len;
    uint8_t *expect = malloc(n);
    memcpy(expect, t2->data.data, n);
    char run[64];
    snprintf(run, sizeof run, "%s", fm_coordinator_run_id(c));
    assert_int_equal(fm_coordinator_stop(c), FM_OK);
    assert_int_equal(count_sent("a", FEDMOE__ENVELOPE__BODY_SHUTDOWN, NULL), 1);
    finish(&c);
    /* a new coordinator on the same database resumes at round 2 with the same state */
    c = start(&cfg);
    assert_string_equal(fm_coordinator_run_id(c), run);
    assert_int_equal(fm_coordinator_round(c), 2);
    for (int i = 0; i < 2; i++)
        hello(c, ids[i], 100, 0.0);
    fm_coordinator_tick(c, 0.0);
    assert_int_equal(task_model("a", 1)->data.len, n);
    assert_memory_equal(task_model("a", 1)->data.data, expect, n);
    free(expect);
    finish(&c);
}

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

/* 200 Hellos that change nothing are all answered but cost no transaction (no
 * fsync each: a flood must not stall the coordinator); a Hello that changes the
 * client's counts is written at once. */
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
    assert_int_equal(count_sent("a", FEDMOE__ENVELOPE__BODY_WELCOME, NULL), 201);
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
    fm_data_spec_default(&ds);
    ds.count = 4;
    ds.part = cfg.spec.part;
    ds.seed = cfg.spec.seed;
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
    const Fedmoe__Tensor *m1 = task_model("a", 1), *m2 = task_model("a", 2);
    for (size_t i = 0; i < m1->data.len / 4; i += 97) {
        float x, y;
        memcpy(&x, m1->data.data + 4 * i, 4);
        memcpy(&y, m2->data.data + 4 * i, 4);
        assert_true(fabsf(y - (x + 1.75f)) < 1e-5f);
    }
    finish(&c);
}

/* The change from the k-th to the (k+1)-th Task of a, at value i. */
static float task_step(int k, size_t i)
{
    const Fedmoe__Tensor *t1 = task_model("a", k), *t2 = task_model("a", k + 1);
    float x, y;
    memcpy(&x, t1->data.data + 4 * i, 4);
    memcpy(&y, t2->data.data + 4 * i, 4);
    return y - x;
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
        assert_float_equal(task_step(1, i), (0.001 + 1.0 / sqrt(n)) / 2, 1e-5);
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
        assert_float_equal(task_step(1, i), (0.01 + 0.03 + 0.06) / 3, 1e-4);
        assert_float_equal(task_step(2, i), (0.01 + 0.06 + 0.01) / 3, 1e-4);
    }
    finish(&c);
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

int main(void)
{
    fm_log_set_level(FM_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quorum_reached),
        cmocka_unit_test(test_deadline_with_straggler),
        cmocka_unit_test(test_refused_update_ends_its_part),
        cmocka_unit_test(test_rehello_gets_task_again),
        cmocka_unit_test(test_silent_worker_capped),
        cmocka_unit_test(test_run_goes_on_without_silent_worker),
        cmocka_unit_test(test_resume_from_checkpoint),
        cmocka_unit_test(test_bad_bytes_and_unknown_clients),
        cmocka_unit_test(test_hello_flood_writes_nothing),
        cmocka_unit_test(test_weights_decided_by_coordinator),
        cmocka_unit_test(test_clip_bounds),
        cmocka_unit_test(test_partition_lease),
    };
    return procs_run_tests("coordinator", tests, sizeof tests / sizeof tests[0], dir, sizeof dir);
}
