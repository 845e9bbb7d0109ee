/* Faults, with real processes: a client killed mid-round and restarted, a client
 * that stalls past the deadline and then sends a late update, and a coordinator
 * killed (SIGKILL) at several points and restarted, whose final global model must
 * be bit-identical to an uninterrupted run's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "fedmoe/store.h"
#include "fedmoe/wire.h"
#include "procs.h"

static char dir[256];

static pid_t start_client(const char *endpoint, int i, int n, const char *tag, bool own_partition)
{
    char id[16], part[16], log[512], state[512];
    snprintf(id, sizeof id, "c%d", i);
    snprintf(part, sizeof part, "%d/%d", i, n);
    snprintf(log, sizeof log, "%s/%s-c%d.log", dir, tag, i);
    snprintf(state, sizeof state, "%s/%s-state", dir, tag);
    char mk[600];
    snprintf(mk, sizeof mk, "mkdir -p %s", state);
    if (system(mk) != 0)
        return -1;
    char *argv[] = {BIN("client/fedmoe-client"), "--connect", (char *)endpoint, "--id", id, "--state-dir", state,
                    own_partition ? "--partition" : NULL, part, NULL};
    return procs_spawn_client(argv, log);
}

static void send_env(void *sock, Fedmoe__Envelope *env) { assert_int_equal(procs_send_env(sock, env), 0); }

static Fedmoe__Envelope *recv_kind(void *sock, Fedmoe__Envelope__BodyCase kind, int timeout_ms)
{
    return procs_recv_kind(sock, (int)kind, timeout_ms / 1000.0, NULL, NULL);
}

/* A fifth client joins once the run is under way and stalls: it heartbeats but
 * never uploads. Returns the round it was given; the round closes without it and
 * its late update is refused by the round number. */
static uint32_t join_and_stall(const char *endpoint, const char *db)
{
    void *ctx = zmq_ctx_new(), *staller = zmq_socket(ctx, ZMQ_DEALER);
    zmq_setsockopt(staller, ZMQ_ROUTING_ID, "staller", 7);
    procs_secure_client(staller, "staller");
    zmq_connect(staller, endpoint);
    Fedmoe__Envelope env;
    Fedmoe__Hello h;
    procs_hello(&env, &h, "staller", 4, 100); /* ready at once: it has (pretends to have) its data */
    send_env(staller, &env);
    Fedmoe__Envelope *w = recv_kind(staller, FEDMOE__ENVELOPE__BODY_WELCOME, 20000);
    assert_non_null(w);
    fm_wire_free(w);
    Fedmoe__Envelope *task = NULL;
    for (int i = 0; i < 120 && !task; i++) { /* alive while it waits */
        procs_heartbeat(staller);
        task = recv_kind(staller, FEDMOE__ENVELOPE__BODY_TASK, 500);
    }
    assert_non_null(task);
    uint32_t stalled_round = task->task->round, n = task->task->model[0]->shape[1];
    uint8_t nonce[16];
    assert_int_equal(task->task->nonce.len, 16);
    memcpy(nonce, task->task->nonce.data, 16);
    fm_wire_free(task);
    /* stall, alive, until the round closes without it: at its deadline once the
     * quorum is in (later than the deadline on a loaded machine, where the round
     * is extended while the real clients still train) */
    for (int i = 0; i < 400 && procs_committed_rounds(db) < (int)stalled_round; i++) {
        procs_heartbeat(staller);
        usleep(500000);
    }
    assert_true(procs_committed_rounds(db) >= (int)stalled_round);
    float *vec = calloc(n, sizeof(float)), prompt[256] = {0};
    assert_int_equal(procs_send_update(staller, stalled_round, nonce, vec, n, prompt, 100), 0);
    Fedmoe__Envelope *err = recv_kind(staller, FEDMOE__ENVELOPE__BODY_ERROR, 20000);
    assert_non_null(err);
    assert_int_equal(err->error->code, FM_WIRE_WRONG_ROUND);
    fm_wire_free(err);
    free(vec);
    int linger = 0;
    zmq_setsockopt(staller, ZMQ_LINGER, &linger, sizeof linger);
    zmq_close(staller); /* and now it is gone for good */
    zmq_ctx_term(ctx);
    return stalled_round;
}

/* Rounds of the killed-and-stalled run: the killed client is restarted after
 * about round 5 and needs ~2.5 s (rounds take ~1.2 s) to load its data before
 * it can be selected again, so the run leaves it several rounds to come back. */
#define FAULT_ROUNDS 12

/* The round log of the run: FAULT_ROUNDS rounds, each with its quorum; the staller dropped
 * in its round, client c3 dropped in the round it was killed in and completing
 * rounds after it came back. */
static void check_dropped_and_back(const char *db, uint32_t stalled_round, int killed_in)
{
    fm_round_row_t *r;
    fm_client_round_row_t *cr;
    int nr, nc;
    procs_finished_run(db, &r, &nr, &cr, &nc);
    assert_int_equal(nr, FAULT_ROUNDS);
    bool staller_dropped = false, c3_dropped = false, c3_back = false;
    for (int i = 0; i < nc; i++) {
        if (!strcmp(cr[i].client_id, "staller") && cr[i].round == (int)stalled_round)
            staller_dropped = !strcmp(cr[i].status, "dropped");
        if (!strcmp(cr[i].client_id, "c3") && cr[i].round == killed_in)
            c3_dropped = !strcmp(cr[i].status, "dropped");
        if (!strcmp(cr[i].client_id, "c3") && cr[i].round > killed_in && !strcmp(cr[i].status, "completed"))
            c3_back = true;
    }
    assert_true(staller_dropped);
    assert_true(c3_dropped);
    assert_true(c3_back);
    for (int i = 0; i < nr; i++) {
        assert_int_equal(r[i].round, i + 1);
        assert_true(r[i].completed >= 3);
        assert_int_equal(r[i].completed + r[i].dropped, r[i].selected);
    }
    free(cr);
    free(r);
}

static void test_killed_and_stalled_clients(void **state)
{
    (void)state;
    char db[512], log[512], endpoint[64];
    procs_files("clients", db, log);
    snprintf(endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", procs_free_port());
    char *sargv[] = {BIN("server/fedmoe-server"), "--bind", endpoint, "--db", db, "--rounds", FM_STR(FAULT_ROUNDS),
                     "--min-clients", "3", "--partitions", "5", "--round-timeout", "20", "--client-timeout", "4", NULL};
    char staller_key[512];
    procs_client_keys("c", 4);
    procs_client_key("staller", staller_key);
    pid_t server = procs_spawn_server(sargv, log);
    assert_true(server > 0);
    pid_t c[4];
    for (int i = 0; i < 4; i++)
        c[i] = start_client(endpoint, i, 5, "clients", true);
    for (int i = 0; i < 2400 && procs_committed_rounds(db) < 1; i++)
        usleep(25000);
    uint32_t stalled_round = join_and_stall(endpoint, db);
    /* kill a client in the middle of a round */
    int before = procs_committed_rounds(db);
    while (procs_committed_rounds(db) == before)
        usleep(20000);
    int killed_in = procs_committed_rounds(db) + 1;
    usleep(200000);
    kill(c[3], SIGKILL);
    procs_wait(c[3], 10);
    /* the round closes with the others; then the client comes back */
    for (int i = 0; i < 600 && procs_committed_rounds(db) < killed_in; i++)
        usleep(50000);
    assert_true(procs_committed_rounds(db) >= killed_in);
    fprintf(stderr, "  staller stalled in round %u; c3 killed in round %d, restarted after %d rounds\n", stalled_round,
            killed_in, procs_committed_rounds(db));
    c[3] = start_client(endpoint, 3, 5, "clients", true);
    assert_int_equal(procs_wait(server, 240), 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(procs_wait(c[i], 30), 0);
    check_dropped_and_back(db, stalled_round, killed_in);
    assert_true(procs_integrity_ok(db));
}

/* A kill: once `after_round` rounds are committed, wait delay_ms, SIGKILL. */
typedef struct {
    int after_round, delay_ms;
} kill_t;

/* Runs 3 clients with their own partitions against a coordinator on db; kills
 * the coordinator (SIGKILL) at each point of kills and restarts it. */
static void crash_run(const char *tag, const kill_t *kills, int nkills, char sha[65])
{
    char db[512], log[512], endpoint[64];
    procs_files(tag, db, log);
    snprintf(endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", procs_free_port());
    char *sargv[] = {BIN("server/fedmoe-server"), "--bind", endpoint, "--db", db, "--rounds", "5", "--min-clients", "3",
                     "--partitions", "3", "--seed", "7", "--round-timeout", "120", NULL};
    procs_client_keys("c", 3);
    pid_t server = procs_spawn_server(sargv, log);
    pid_t c[3];
    for (int i = 0; i < 3; i++)
        c[i] = start_client(endpoint, i, 3, tag, true);
    for (int k = 0; k < nkills; k++) {
        for (int i = 0; i < 2400 && procs_committed_rounds(db) < kills[k].after_round; i++)
            usleep(25000);
        usleep((useconds_t)kills[k].delay_ms * 1000);
        kill(server, SIGKILL);
        procs_wait(server, 10);
        fprintf(stderr, "  %s: coordinator killed %d ms after round %d, %d rounds committed\n", tag, kills[k].delay_ms,
                kills[k].after_round, procs_committed_rounds(db));
        assert_true(procs_integrity_ok(db));
        server = procs_spawn_server(sargv, log);
    }
    assert_int_equal(procs_wait(server, 300), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(procs_wait(c[i], 30), 0);
    assert_true(procs_last_checkpoint_sha(db, sha));
    assert_true(procs_integrity_ok(db));
    fm_store_t *st;
    assert_int_equal(fm_store_open(&st, db, true), FM_OK);
    fm_run_row_t *runs;
    int nruns, n;
    assert_int_equal(fm_store_list_runs(st, &runs, &nruns), FM_OK);
    assert_int_equal(nruns, 1);
    fm_round_row_t *r;
    assert_int_equal(fm_store_list_rounds(st, runs[0].id, &r, &n), FM_OK);
    assert_int_equal(n, 5);
    for (int i = 0; i < n; i++)
        assert_int_equal(r[i].round, i + 1);
    free(r);
    fm_store_run_clear(&runs[0]);
    free(runs);
    fm_store_close(&st);
}

static void test_coordinator_crash_is_bit_identical(void **state)
{
    (void)state;
    char clean[65], crashed[65];
    crash_run("clean", NULL, 0, clean);
    /* kills spread over the run: before any round, mid-round, right at a commit,
     * late in a round (aggregation and the database commit) */
    const kill_t kills[] = {{0, 1500}, {1, 400}, {2, 0}, {3, 900}, {3, 1300}};
    crash_run("crashed", kills, 5, crashed);
    fprintf(stderr, "  final checkpoint: clean %.16s..., crashed %.16s...\n", clean, crashed);
    assert_string_equal(clean, crashed);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_coordinator_crash_is_bit_identical),
        cmocka_unit_test(test_killed_and_stalled_clients),
    };
    return procs_run_tests("faults", tests, sizeof tests / sizeof tests[0], dir, sizeof dir);
}
