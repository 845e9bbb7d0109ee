/* The client session object in-process: no sockets, no threads, a fake clock.
 * Sessions and the real coordinator object are wired by memory (what one sends
 * the other handles), the jobs run inline where a host would hand them to a
 * worker; real Fashion-MNIST, a real SQLite file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord_harness.h"
#include "coordinator.h"
#include "fedmoe/log.h"
#include "fedmoe/runspec_wire.h"
#include "fedmoe/wire.h"
#include "procs.h"
#include "session.h"

/* ---- a network in memory ---- */

#define MAX_CLIENTS 4
#define MAX_MSGS 4096

typedef struct {
    int to;        /* a client's index, or -1: the coordinator */
    int from;      /* the sending client's index (to the coordinator) */
    uint8_t *buf;
    size_t len;
} msg_t;

static msg_t q[MAX_MSGS];
static int nq;
static fm_session_t *sess[MAX_CLIENTS];
static char ids[MAX_CLIENTS][64];
static int nclients;
static int sent_by[MAX_CLIENTS][16]; /* messages of each kind each client sent */
static bool drop_to_coordinator;     /* a coordinator that is away */

static void push(int to, int from, const uint8_t *buf, size_t len)
{
    assert_true(nq < MAX_MSGS);
    q[nq] = (msg_t){to, from, malloc(len ? len : 1), len};
    memcpy(q[nq].buf, buf, len);
    nq++;
}

static fm_status client_send(void *user, const uint8_t *msg, size_t len)
{
    int i = (int)(intptr_t)user;
    Fedmoe__Envelope *env = NULL;
    assert_int_equal(fm_wire_decode(msg, len, (size_t)1 << 30, &env), FM_OK);
    sent_by[i][env->body_case]++;
    fm_wire_free(env);
    if (!drop_to_coordinator)
        push(-1, i, msg, len);
    return FM_OK;
}

static fm_status coord_send(void *user, const char *id, const fm_frame_t *f, int n)
{
    (void)user;
    size_t len;
    uint8_t *data = fm_frames_join(f, n, &len);
    assert_non_null(data);
    for (int i = 0; i < nclients; i++)
        if (!strcmp(ids[i], id))
            push(i, -1, data, len);
    free(data);
    return FM_OK;
}

static const fm_session_ops_t *ops_of(int i)
{
    static fm_session_ops_t ops[MAX_CLIENTS];
    ops[i] = (fm_session_ops_t){.send = client_send, .user = (void *)(intptr_t)i};
    return &ops[i];
}

static fm_session_config_t scfg;

static void new_clients(int n)
{
    fm_session_config_default(&scfg);
    scfg.insecure = true;
    nclients = n;
    memset(sent_by, 0, sizeof sent_by);
    for (int i = 0; i < n; i++) {
        snprintf(ids[i], sizeof ids[i], "c%d", i);
        assert_int_equal(fm_session_new(&sess[i], &scfg, ids[i], -1, ops_of(i)), FM_OK);
    }
}

static void end_clients(void)
{
    for (int i = 0; i < nclients; i++)
        fm_session_destroy(&sess[i]);
    for (int k = 0; k < nq; k++)
        free(q[k].buf);
    nq = 0;
    nclients = 0;
}

static volatile sig_atomic_t no_stop;

/* Delivers what waits (a busy session's messages wait, as in its socket), runs
 * the jobs handed out, until nothing moves; every session's status FM_OK. */
static void pump(fm_coordinator_t *c, double now)
{
    for (int moved = 1; moved;) {
        moved = 0;
        for (int k = 0; k < nq; k++) {
            msg_t m = q[k];
            if (m.to >= 0 && (!sess[m.to] || fm_session_job_waiting(sess[m.to])))
                continue;
            memmove(q + k, q + k + 1, sizeof *q * (size_t)(nq - k - 1));
            nq--;
            k--;
            moved = 1;
            if (m.to < 0)
                fm_coordinator_handle(c, ids[m.from], m.buf, m.len, now);
            else
                assert_int_equal(fm_session_handle(sess[m.to], m.buf, m.len, now), FM_OK);
            free(m.buf);
        }
        for (int i = 0; i < nclients; i++)
            if (sess[i] && fm_session_job_waiting(sess[i])) {
                fm_session_work(sess[i], &no_stop);
                assert_int_equal(fm_session_work_done(sess[i], now), FM_OK);
                moved = 1;
            }
    }
}

/* The coordinator's leave to upload round `round`, to client i. */
static void grant(int i, uint32_t round, double now)
{
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    Fedmoe__Grant g = FEDMOE__GRANT__INIT;
    g.round = round;
    env.body_case = FEDMOE__ENVELOPE__BODY_GRANT;
    env.grant = &g;
    uint8_t *buf;
    size_t len;
    assert_int_equal(fm_wire_encode(&env, &buf, &len), FM_OK);
    assert_int_equal(fm_session_handle(sess[i], buf, len, now), FM_OK);
    free(buf);
}

/* Delivers what waits until a session has a job waiting (left waiting). */
static void pump_until_job(fm_coordinator_t *c, double now)
{
    for (int k = 0; k < nq; k++) {
        msg_t m = q[k];
        if (m.to >= 0 && fm_session_job_waiting(sess[m.to]))
            continue;
        memmove(q + k, q + k + 1, sizeof *q * (size_t)(nq - k - 1));
        nq--;
        k = -1;
        if (m.to < 0)
            fm_coordinator_handle(c, ids[m.from], m.buf, m.len, now);
        else
            assert_int_equal(fm_session_handle(sess[m.to], m.buf, m.len, now), FM_OK);
        free(m.buf);
    }
    bool waiting = false;
    for (int i = 0; i < nclients; i++)
        waiting |= fm_session_job_waiting(sess[i]);
    assert_true(waiting);
}

static void tick_all(fm_coordinator_t *c, double now)
{
    for (int i = 0; i < nclients; i++)
        assert_int_equal(fm_session_tick(sess[i], now), FM_OK);
    assert_int_equal(fm_coordinator_tick(c, now), FM_OK);
}

/* A small coordinator for n clients: the harness's small model, 200 examples a
 * client, quorum n. */
static fm_coordinator_t *coordinator(fm_server_config_t *cfg, int n, int rounds)
{
    small_config(cfg, n, n);
    cfg->rounds = rounds;
    assert_int_equal(fm_cap_parse("--client-examples", "200", &cfg->spec.regime.examples), FM_OK);
    fm_coordinator_t *c = NULL;
    assert_int_equal(fm_coordinator_new(&c, cfg, coord_send, NULL), FM_OK);
    return c;
}

/* ---- tests ---- */

/* Three sessions and the coordinator run two rounds to the end: Hello,
 * Welcome, Tasks trained as jobs, Updates, Shutdown; both rounds logged. */
static void test_a_run_in_process(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    fm_coordinator_t *c = coordinator(&cfg, 3, 2);
    new_clients(3);
    double now = 0.0;
    for (int step = 0; step < 400 && !fm_coordinator_finished(c); step++, now += 0.5) {
        tick_all(c, now);
        pump(c, now);
    }
    assert_true(fm_coordinator_finished(c));
    assert_int_equal(rounds_logged(cfg.db), 2);
    for (int i = 0; i < 3; i++) {
        pump(c, now);
        assert_true(fm_session_ended(sess[i]));
        assert_int_equal(sent_by[i][FEDMOE__ENVELOPE__BODY_UPDATE], 2);
        assert_true(sent_by[i][FEDMOE__ENVELOPE__BODY_HEARTBEAT] > 0);
    }
    end_clients();
    fm_coordinator_destroy(&c);
}

/* Hello until welcomed, every 3 s of the fake clock; then heartbeats at the
 * Welcome's pace (a quarter of the client timeout), also while a job is out;
 * no welcome within --connect-timeout ends the session with the reason. */
static void test_timers_follow_the_clock(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    fm_coordinator_t *c = coordinator(&cfg, 1, 1);
    new_clients(1);
    drop_to_coordinator = true;
    assert_int_equal(fm_session_tick(sess[0], 0.0), FM_OK);
    assert_int_equal(fm_session_tick(sess[0], 2.9), FM_OK);
    assert_int_equal(sent_by[0][FEDMOE__ENVELOPE__BODY_HELLO], 1);
    assert_int_equal(fm_session_tick(sess[0], 3.1), FM_OK);
    assert_int_equal(sent_by[0][FEDMOE__ENVELOPE__BODY_HELLO], 2);
    drop_to_coordinator = false;
    assert_int_equal(fm_session_tick(sess[0], 6.2), FM_OK);
    pump(c, 6.2);
    assert_true(fm_session_welcomed(sess[0]));
    assert_int_equal(fm_session_tick(sess[0], 6.3), FM_OK); /* (the first at once) */
    int beats = sent_by[0][FEDMOE__ENVELOPE__BODY_HEARTBEAT];
    assert_true(beats >= 1);
    double every = cfg.client_timeout / 4; /* (the Welcome's heartbeat_ms) */
    assert_int_equal(fm_session_tick(sess[0], 6.3 + every - 0.1), FM_OK);
    assert_int_equal(sent_by[0][FEDMOE__ENVELOPE__BODY_HEARTBEAT], beats);
    assert_int_equal(fm_session_tick(sess[0], 6.3 + every + 0.1), FM_OK);
    assert_int_equal(sent_by[0][FEDMOE__ENVELOPE__BODY_HEARTBEAT], beats + 1);
    /* a Task taken: said at once, and the beats go on while its job is out */
    tick_all(c, 20.0);
    pump_until_job(c, 20.0);
    int taken = sent_by[0][FEDMOE__ENVELOPE__BODY_HEARTBEAT];
    assert_true(taken > beats + 1);
    assert_int_equal(fm_session_tick(sess[0], 20.0 + every + 0.1), FM_OK);
    assert_int_equal(sent_by[0][FEDMOE__ENVELOPE__BODY_HEARTBEAT], taken + 1);
    fm_session_work(sess[0], &no_stop);
    assert_int_equal(fm_session_work_done(sess[0], 25.0), FM_OK);
    assert_int_equal(sent_by[0][FEDMOE__ENVELOPE__BODY_UPDATE], 0); /* (waiting for its Grant) */
    assert_int_equal(sent_by[0][FEDMOE__ENVELOPE__BODY_HEARTBEAT], taken + 2);
    grant(0, 1, 25.5);
    assert_int_equal(sent_by[0][FEDMOE__ENVELOPE__BODY_UPDATE], 1);
    end_clients();
    fm_coordinator_destroy(&c);

    new_clients(1);
    scfg.connect_timeout = 5.0;
    assert_int_equal(fm_session_tick(sess[0], 100.0), FM_OK);
    assert_int_equal(fm_session_tick(sess[0], 104.0), FM_OK);
    assert_int_equal(fm_session_tick(sess[0], 105.5), FM_ERR_IO);
    assert_non_null(strstr(fm_error_last(), "no welcome"));
    end_clients();
}

/* The last message client 0 sent, decoded (the caller frees it). */
static Fedmoe__Envelope *last_sent(void)
{
    assert_true(nq > 0);
    Fedmoe__Envelope *e = NULL;
    assert_int_equal(fm_wire_decode(q[nq - 1].buf, q[nq - 1].len, (size_t)1 << 30, &e), FM_OK);
    return e;
}

static void clear_queue(void)
{
    for (int k = 0; k < nq; k++)
        free(q[k].buf);
    nq = 0;
}

/* Trains `task` in session 0 (granted at once): the Update's bytes. */
static uint8_t *train_task(const uint8_t *task, size_t task_len, double now, size_t *len)
{
    clear_queue();
    int before = sent_by[0][FEDMOE__ENVELOPE__BODY_UPDATE];
    assert_int_equal(fm_session_handle(sess[0], task, task_len, now), FM_OK);
    assert_true(fm_session_job_waiting(sess[0]));
    fm_session_work(sess[0], &no_stop);
    assert_int_equal(fm_session_work_done(sess[0], now), FM_OK);
    if (sent_by[0][FEDMOE__ENVELOPE__BODY_UPDATE] == before)
        grant(0, 1, now);
    assert_int_equal(sent_by[0][FEDMOE__ENVELOPE__BODY_UPDATE], before + 1);
    uint8_t *out = malloc(q[nq - 1].len);
    memcpy(out, q[nq - 1].buf, q[nq - 1].len);
    *len = q[nq - 1].len;
    return out;
}

/* The first message of `kind` the coordinator sent to client 0 (kept in
 * *out); the others are handled by the session. */
static void run_until(fm_coordinator_t *c, int kind, uint8_t **out, size_t *len, uint8_t **welcome, size_t *wlen)
{
    for (int step = 0; step < 20 && !*out; step++) {
        for (int k = 0; k < nq; k++) {
            if (q[k].to < 0) {
                fm_coordinator_handle(c, ids[q[k].from], q[k].buf, q[k].len, 3.5);
                continue;
            }
            Fedmoe__Envelope *e = NULL;
            assert_int_equal(fm_wire_decode(q[k].buf, q[k].len, (size_t)1 << 30, &e), FM_OK);
            uint8_t **keep = (int)e->body_case == kind && !*out ? out
                             : e->body_case == FEDMOE__ENVELOPE__BODY_WELCOME && !*welcome ? welcome : NULL;
            if (keep) {
                *keep = malloc(q[k].len);
                memcpy(*keep, q[k].buf, q[k].len);
                *(keep == out ? len : wlen) = q[k].len;
            }
            if (keep != out)
                assert_int_equal(fm_session_handle(sess[0], q[k].buf, q[k].len, 3.5), FM_OK);
            fm_wire_free(e);
        }
        clear_queue();
        fm_coordinator_tick(c, 3.5 + step);
    }
    assert_non_null(*out);
}

/* Two encoded Updates carry the same model, prompt and scores (not the
 * same seconds: a measurement). */
static void same_update(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
    Fedmoe__Envelope *x = NULL, *y = NULL;
    assert_int_equal(fm_wire_decode(a, alen, (size_t)1 << 30, &x), FM_OK);
    assert_int_equal(fm_wire_decode(b, blen, (size_t)1 << 30, &y), FM_OK);
    const Fedmoe__Update *u = x->update, *v = y->update;
    assert_int_equal(u->n_model, v->n_model);
    assert_true(u->n_model > 0);
    for (size_t i = 0; i < u->n_model; i++) {
        assert_int_equal(u->model[i]->data.len, v->model[i]->data.len);
        assert_memory_equal(u->model[i]->data.data, v->model[i]->data.data, u->model[i]->data.len);
    }
    assert_int_equal(u->prompt->data.len, v->prompt->data.len);
    assert_memory_equal(u->prompt->data.data, v->prompt->data.data, u->prompt->data.len);
    assert_true(u->metrics->train_loss == v->metrics->train_loss);
    assert_true(u->metrics->test_loss == v->metrics->test_loss);
    fm_wire_free(x);
    fm_wire_free(y);
}

/* A job stopped mid-round sends nothing, puts the state back as before the
 * round and says the Task is not held (so the coordinator may send it again);
 * trained afterwards, its Update is the one a session never stopped makes. A
 * Task sent again after its Update is answered with the same bytes, not
 * trained again. */
static void test_repeated_task_and_stop(void **state)
{
    (void)state;
    fm_server_config_t cfg;
    fm_coordinator_t *c = coordinator(&cfg, 1, 3);
    new_clients(1);
    uint8_t *task = NULL, *welcome = NULL;
    size_t task_len = 0, welcome_len = 0;
    fm_session_tick(sess[0], 3.5);
    run_until(c, FEDMOE__ENVELOPE__BODY_TASK, &task, &task_len, &welcome, &welcome_len);
    assert_non_null(welcome);

    volatile sig_atomic_t stop = 1;
    assert_int_equal(fm_session_handle(sess[0], task, task_len, 4.0), FM_OK);
    assert_int_equal(fm_session_handle(sess[0], task, task_len, 4.0), FM_ERR_STATE); /* (one job at a time) */
    fm_session_work(sess[0], &stop);
    assert_int_equal(fm_session_work_done(sess[0], 4.0), FM_OK);
    assert_int_equal(sent_by[0][FEDMOE__ENVELOPE__BODY_UPDATE], 0);
    Fedmoe__Envelope *hb = last_sent();
    assert_int_equal(hb->body_case, FEDMOE__ENVELOPE__BODY_HEARTBEAT);
    assert_int_equal(hb->heartbeat->task_round, 0);
    fm_wire_free(hb);

    size_t first_len, again_len, fresh_len;
    uint8_t *first = train_task(task, task_len, 5.0, &first_len);
    uint8_t *again = train_task(task, task_len, 6.0, &again_len); /* (sent again, not trained) */
    assert_int_equal(again_len, first_len);
    assert_memory_equal(again, first, first_len);
    end_clients();
    new_clients(1); /* never stopped */
    assert_int_equal(fm_session_handle(sess[0], welcome, welcome_len, 7.0), FM_OK);
    uint8_t *fresh = train_task(task, task_len, 8.0, &fresh_len);
    same_update(fresh, fresh_len, first, first_len);
    free(first);
    free(again);
    free(fresh);
    free(task);
    free(welcome);
    end_clients();
    fm_coordinator_destroy(&c);
}

/* Bad bytes are warned about and dropped; a rejection ends the session with
 * the coordinator's reason. */
static void test_bad_messages(void **state)
{
    (void)state;
    new_clients(1);
    const uint8_t junk[] = {0xff, 0xff, 0xff, 0x07, 0x01};
    assert_int_equal(fm_session_handle(sess[0], junk, sizeof junk, 0.0), FM_OK);
    assert_false(fm_session_ended(sess[0]));
    uint8_t *buf;
    size_t len;
    assert_int_equal(fm_wire_encode_error(FM_WIRE_REJECTED, "not in the allow-list", &buf, &len), FM_OK);
    assert_int_equal(fm_session_handle(sess[0], buf, len, 0.0), FM_ERR_ARG);
    assert_non_null(strstr(fm_error_last(), "not in the allow-list"));
    free(buf);
    end_clients();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_run_in_process),
        cmocka_unit_test(test_timers_follow_the_clock),
        cmocka_unit_test(test_repeated_task_and_stop),
        cmocka_unit_test(test_bad_messages),
    };
    return procs_run_tests("session", tests, sizeof tests / sizeof tests[0], coord_dir, sizeof coord_dir);
}
