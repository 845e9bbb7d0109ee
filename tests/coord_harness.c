/* The coordinator object driven in-process, for test_coordinator and
 * test_defences: messages injected as bytes, a fake clock, replies captured from
 * the send callback; a real SQLite file. */
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
#include "coord_harness.h"
#include "procs.h"

char coord_dir[256]; /* the test run's scratch folder (procs_run_tests) */
static int db_seq;
fm_run_spec_t run_spec; /* the spec of the newest small_config, as the clients know it */

/* ---- the outbox --------------------------------------------------------------- */

#define MAX_SENT 4096
typedef struct {
    char id[64];
    Fedmoe__Envelope *env;
} sent_t;
static sent_t sent[MAX_SENT];
static int nsent;

static fm_status capture(void *user, const char *id, const fm_frame_t *f, int n)
{
    (void)user;
    assert_true(nsent < MAX_SENT);
    snprintf(sent[nsent].id, 64, "%s", id);
    size_t len;
    uint8_t *data = fm_frames_join(f, n, &len); /* (as a client's fm_wire_recv joins them) */
    assert_non_null(data);
    assert_int_equal(fm_wire_decode(data, len, (size_t)1 << 30, &sent[nsent].env), FM_OK);
    free(data);
    nsent++;
    return FM_OK;
}

void clear_outbox(void)
{
    for (int i = 0; i < nsent; i++)
        fm_wire_free(sent[i].env);
    nsent = 0;
}

/* How many messages of this kind went to id (NULL: anyone); *last gets the newest. */
int count_sent(const char *id, Fedmoe__Envelope__BodyCase kind, Fedmoe__Envelope **last)
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

uint32_t last_error_code(const char *id)
{
    Fedmoe__Envelope *e = NULL;
    return count_sent(id, FEDMOE__ENVELOPE__BODY_ERROR, &e) ? e->error->code : 0;
}

/* ---- a small run ---------------------------------------------------------------- */

void small_config(fm_server_config_t *cfg, int clients, int quorum)
{
    fm_server_config_default(cfg);
    snprintf(cfg->db, sizeof cfg->db, "%s/coord-%d.db", coord_dir, ++db_seq);
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

void inject(fm_coordinator_t *c, const char *id, Fedmoe__Envelope *env, double now)
{
    uint8_t *buf;
    size_t len;
    assert_int_equal(fm_wire_encode(env, &buf, &len), FM_OK);
    fm_coordinator_handle(c, id, buf, len, now);
    free(buf);
}

void hello(fm_coordinator_t *c, const char *id, uint64_t samples, double now)
{
    Fedmoe__Envelope env;
    Fedmoe__Hello h;
    procs_hello(&env, &h, id, -1, samples);
    inject(c, id, &env, now);
}

void heartbeat(fm_coordinator_t *c, const char *id, double now)
{
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    Fedmoe__Heartbeat hb = FEDMOE__HEARTBEAT__INIT;
    env.body_case = FEDMOE__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    inject(c, id, &env, now);
}

void heartbeat_progress(fm_coordinator_t *c, const char *id, uint32_t task_round, uint32_t sent_round, double now)
{
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    Fedmoe__Heartbeat hb = FEDMOE__HEARTBEAT__INIT;
    hb.progress = true;
    hb.task_round = task_round;
    hb.sent_round = sent_round;
    env.body_case = FEDMOE__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    inject(c, id, &env, now);
}

/* The Update a client sends back for its newest Task: the task's model plus
 * delta in every value; SHORT sends a model one value short, NOT_FINITE one
 * with a NaN in it. */
static void update_with(fm_coordinator_t *c, const char *id, float delta, uint64_t samples, fault_t fault,
                        const float *prompt_fill, double now)
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
    for (size_t i = 0; prompt_fill && i < d.nprompt; i++)
        in.prompt[i] = *prompt_fill;
    fm_update_t u = {.round = in.round, .train_samples = samples, .model = in.model, .prompt = in.prompt};
    memcpy(u.nonce, in.nonce, sizeof u.nonce);
    if (fault == REPLAYED) /* another round's capture, relabelled with this round's number */
        u.nonce[0] ^= 1;
    float acc;
    procs_fake_counts(samples, &u.metrics.val_samples, &u.metrics.test_samples, &u.metrics.test_correct, &acc);
    u.metrics.test_accuracy = fault == PERFECT_SCORE ? 1.0 : acc; /* not what its counts say */
    if (fault == ALL_CORRECT) {
        u.metrics.test_correct = u.metrics.test_samples;
        u.metrics.val_correct = u.metrics.val_samples;
        u.metrics.test_accuracy = 1.0f;
    }
    uint8_t *buf;
    size_t len;
    assert_int_equal(fm_exchange_encode_update(&run_spec, &d, &u, &buf, &len), FM_OK);
    fm_coordinator_handle(c, id, buf, len, now);
    free(buf);
    fm_exchange_task_free(&in);
}

void update(fm_coordinator_t *c, const char *id, float delta, uint64_t samples, fault_t fault, double now)
{
    update_with(c, id, delta, samples, fault, NULL, now);
}

void update_prompt(fm_coordinator_t *c, const char *id, float fill, double now)
{
    update_with(c, id, 0.0f, 100, HONEST, &fill, now);
}

fm_coordinator_t *start(const fm_server_config_t *cfg)
{
    fm_coordinator_t *c = NULL;
    clear_outbox(); /* (what a failed case left) */
    assert_int_equal(fm_coordinator_new(&c, cfg, capture, NULL), FM_OK);
    return c;
}

void finish(fm_coordinator_t **c)
{
    fm_coordinator_destroy(c);
    clear_outbox();
}

/* The status of client id in round r of the latest run. */
void client_status(const char *db, int round, const char *id, char out[16])
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

int rounds_logged(const char *db) { return procs_committed_rounds(db); }

fm_round_row_t logged_round(const char *db, int r)
{
    fm_store_t *s;
    fm_run_row_t run;
    procs_open_latest(db, &s, &run);
    fm_round_row_t *rows = NULL, out;
    int n = 0, found = 0;
    assert_int_equal(fm_store_list_rounds(s, run.id, &rows, &n), FM_OK);
    for (int i = 0; i < n; i++)
        if (rows[i].round == r) {
            out = rows[i];
            found = 1;
        }
    free(rows);
    fm_store_run_clear(&run);
    fm_store_close(&s);
    assert_true(found);
    return out;
}

double round_accuracy(const char *db, int r) { return logged_round(db, r).test_accuracy; }

/* A coordinator for n clients (one partition each) that all say hello with
 * `samples` at time 0; the first round opened. */
fm_coordinator_t *open_run(fm_server_config_t *cfg, const char *const *ids, int n, int quorum, uint64_t samples)
{
    small_config(cfg, n, quorum);
    fm_coordinator_t *c = start(cfg);
    for (int i = 0; i < n; i++)
        hello(c, ids[i], samples, 0.0);
    assert_int_equal(count_sent(NULL, FEDMOE__ENVELOPE__BODY_WELCOME, NULL), n);
    assert_int_equal(fm_coordinator_tick(c, 0.0), FM_OK);
    return c;
}

void updates(fm_coordinator_t *c, const char *const *ids, int n, float delta, uint64_t samples, double now)
{
    for (int i = 0; i < n; i++)
        update(c, ids[i], delta, samples, HONEST, now);
}

/* A tick at now after which the run has `rounds` rounds logged. */
void expect_rounds(fm_coordinator_t *c, const fm_server_config_t *cfg, double now, int rounds)
{
    assert_int_equal(fm_coordinator_tick(c, now), FM_OK);
    assert_int_equal(rounds_logged(cfg->db), rounds);
}

void expect_status(const fm_server_config_t *cfg, int round, const char *id, const char *status)
{
    char st[16];
    client_status(cfg->db, round, id, st);
    assert_string_equal(st, status);
}

/* The model values of the k-th Task (1-based) sent to id. */
const Fedmoe__Tensor *task_model(const char *id, int k)
{
    for (int i = 0; i < nsent; i++)
        if (!strcmp(sent[i].id, id) && sent[i].env->body_case == FEDMOE__ENVELOPE__BODY_TASK && --k == 0)
            return sent[i].env->task->model[0];
    fail();
    return NULL;
}


float task_step(const char *id, int k, size_t i)
{
    const Fedmoe__Tensor *t1 = task_model(id, k), *t2 = task_model(id, k + 1);
    float x, y;
    memcpy(&x, t1->data.data + 4 * i, 4);
    memcpy(&y, t2->data.data + 4 * i, 4);
    return y - x;
}
