/* End to end, with real processes on loopback and a real SQLite file:
 * fedmoe-sim with 4 clients for 3 rounds, then fedmoe-history on its database;
 * a coordinator stopped after round 2 of 4 and restarted; the coordinator's
 * aggregate against a weighted average of uploads made here, in two arrival
 * orders; an old database upgraded; bad arguments to every program. (A real
 * client against a fake coordinator: test_client.c.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "coordinator.h"
#include "fedmoe/clock.h"
#include "fedmoe/rng.h"
#include "fedmoe/store.h"
#include "fedmoe/runspec_wire.h"
#include "fedmoe/wire.h"

#include "procs.h"

static char dir[256];

/* fedmoe-history check: ok on db; on a copy (checkpointed into one file) with
 * bytes overwritten in the middle of its pages, the problems and exit 1. */
static void history_check(const char *db)
{
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd, "%s --db %s check", BIN("server/fedmoe-history"), db);
    assert_int_equal(procs_capture(cmd, &out), 0);
    assert_string_equal(out, "ok\n");
    free(out);
    char damaged[600];
    snprintf(damaged, sizeof damaged, "%s/damaged.db", dir);
    char cp[2600];
    snprintf(cp, sizeof cp, "cp %s %s && cp %s-wal %s-wal", db, damaged, db, damaged);
    assert_int_equal(system(cp), 0);
    fm_store_t *copy;
    assert_int_equal(fm_store_open(&copy, damaged, false), FM_OK);
    fm_store_close(&copy); /* (the last writer: folds the WAL into the file) */
    struct stat sb;
    assert_int_equal(stat(damaged, &sb), 0);
    int fd = open(damaged, O_WRONLY);
    assert_true(fd >= 0);
    char junk[3000];
    memset(junk, 0xab, sizeof junk);
    assert_int_equal(pwrite(fd, junk, sizeof junk, sb.st_size / 2), (ssize_t)sizeof junk);
    close(fd);
    snprintf(cmd, sizeof cmd, "%s --db %s check 2>&1", BIN("server/fedmoe-history"), damaged);
    assert_int_equal(procs_capture(cmd, &out), 1);
    assert_true(strncmp(out, "ok", 2) != 0);
    free(out);
}

/* follow, started after the run ended, waits for the next, unless --after
 * names a time before the run's end: then it shows this one. */
static void follow_after_the_end(const char *db, const fm_run_row_t *run)
{
    char cmd[2048], *out;
    snprintf(cmd, sizeof cmd, "timeout 2 %s --db %s follow", BIN("server/fedmoe-history"), db);
    assert_int_equal(procs_capture(cmd, &out), 124);
    free(out);
    char after[32];
    snprintf(after, sizeof after, "%.19sZ", run->started_at); /* (also the form without milliseconds) */
    snprintf(cmd, sizeof cmd, "timeout 20 %s --db %s follow --after %s", BIN("server/fedmoe-history"), db, after);
    assert_int_equal(procs_capture(cmd, &out), 0);
    assert_true(strstr(out, run->id) && strstr(out, "rounds                     3 of 3"));
    free(out);
    snprintf(cmd, sizeof cmd, "timeout 2 %s --db %s follow --after 2999-01-01T00:00:00Z", BIN("server/fedmoe-history"), db);
    assert_int_equal(procs_capture(cmd, &out), 124);
    free(out);
}

static void test_sim_and_history(void **state)
{
    (void)state;
    char db[512], cmd[2048], *out;
    snprintf(db, sizeof db, "%s/sim.db", dir);
    snprintf(cmd, sizeof cmd, "%s --clients 4 --rounds 3 --db %s --workdir %s/sim --round-timeout 120 2>&1",
             BIN("client/fedmoe-sim"), db, dir);
    int rc = procs_capture(cmd, &out);
    if (rc != 0)
        fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "final test accuracy"));
    free(out);
    /* the database: one run, 3 rounds, 12 client rows, plausible values */
    fm_store_t *st;
    assert_int_equal(fm_store_open(&st, db, true), FM_OK);
    fm_run_row_t *runs;
    int nruns;
    assert_int_equal(fm_store_list_runs(st, &runs, &nruns), FM_OK);
    assert_int_equal(nruns, 1);
    assert_string_equal(runs[0].status, "finished");
    assert_string_equal(runs[0].strategy, "full");
    assert_non_null(strstr(runs[0].config, "\"strategy\":\"full\""));
    fm_round_row_t *r;
    int n;
    assert_int_equal(fm_store_list_rounds(st, runs[0].id, &r, &n), FM_OK);
    assert_int_equal(n, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(r[i].round, i + 1);
        assert_int_equal(r[i].selected, 4);
        assert_int_equal(r[i].completed, 4);
        assert_true(r[i].test_accuracy > 0.5 && r[i].test_accuracy <= 1.0);
        assert_true(r[i].val_accuracy > 0.5 && r[i].val_accuracy <= 1.0);
        assert_true(r[i].train_loss > 0.0 && r[i].train_loss < 3.0);
        assert_true(r[i].bytes_up > 0 && r[i].bytes_down > 0);
        assert_int_equal(strlen(r[i].checkpoint_sha256), 64);
    }
    assert_true(r[2].train_loss < r[0].train_loss);
    fm_client_round_row_t *cr;
    assert_int_equal(fm_store_list_client_rounds(st, runs[0].id, -1, &cr, &n), FM_OK);
    assert_int_equal(n, 12);
    for (int i = 0; i < n; i++) {
        assert_string_equal(cr[i].status, "completed");
        assert_true(cr[i].train_samples > 100 && cr[i].test_samples > 0);
        assert_true(cr[i].test_correct <= cr[i].test_samples);
        /* validation is 20% of the train part: a quarter of the train split */
        assert_true(cr[i].val_samples > 0 && cr[i].val_correct <= cr[i].val_samples);
        assert_true(llabs(4 * cr[i].val_samples - cr[i].train_samples) <= 25); /* rounding per class */
        assert_true(cr[i].generalist_share >= 0.0 && cr[i].generalist_share <= 1.0);
    }
    free(cr);
    fm_client_row_t *cl;
    assert_int_equal(fm_store_list_clients(st, runs[0].id, &cl, &n), FM_OK);
    assert_int_equal(n, 4);
    int parts = 0;
    for (int i = 0; i < n; i++)
        parts |= 1 << cl[i].partition_index;
    assert_int_equal(parts, 0xf); /* partitions 0..3, each once */
    free(cl);
    /* fedmoe-history prints and exports them */
    snprintf(cmd, sizeof cmd, "%s --db %s rounds", BIN("server/fedmoe-history"), db);
    assert_int_equal(procs_capture(cmd, &out), 0);
    assert_int_equal(procs_count_lines(out), 2 + 3);
    assert_non_null(strstr(out, runs[0].id));
    free(out);
    snprintf(cmd, sizeof cmd, "%s --db %s clients 2", BIN("server/fedmoe-history"), db);
    assert_int_equal(procs_capture(cmd, &out), 0);
    assert_int_equal(procs_count_lines(out), 2 + 4);
    free(out);
    snprintf(cmd, sizeof cmd, "%s --db %s export --table clients", BIN("server/fedmoe-history"), db);
    assert_int_equal(procs_capture(cmd, &out), 0);
    assert_int_equal(procs_count_lines(out), 1 + 12);
    free(out);
    snprintf(cmd, sizeof cmd, "%s --db %s export --format json", BIN("server/fedmoe-history"), db);
    assert_int_equal(procs_capture(cmd, &out), 0);
    assert_non_null(strstr(out, "\"rounds\":[{\"round\":1"));
    assert_non_null(strstr(out, r[2].checkpoint_sha256));
    free(out);
    history_check(db);
    snprintf(cmd, sizeof cmd, "%s --db %s plot --out %s/plot.svg", BIN("server/fedmoe-history"), db, dir);
    assert_int_equal(procs_capture(cmd, &out), 0);
    free(out);
    char svg[512];
    snprintf(svg, sizeof svg, "%s/plot.svg", dir);
    FILE *f = fopen(svg, "r");
    assert_non_null(f);
    char head[64] = {0};
    assert_true(fread(head, 1, sizeof head - 1, f) > 0);
    fclose(f);
    assert_non_null(strstr(head, "<?xml"));
    follow_after_the_end(db, &runs[0]);
    free(r);
    fm_store_run_clear(&runs[0]);
    free(runs);
    fm_store_close(&st);
}

/* Client ci (i = first .. first + n - 1); extra: one more flag and its value, or NULL. */
static void start_clients(pid_t *pids, int first, int n, const char *endpoint, const char *tag, const char *extra,
                          const char *value)
{
    for (int i = first; i < first + n; i++) {
        char id[32], log[512];
        snprintf(id, sizeof id, "c%d", i);
        snprintf(log, sizeof log, "%s/%s-client%d.log", dir, tag, i);
        char *argv[] = {BIN("client/fedmoe-client"), "--connect", (char *)endpoint, "--id", id, "--state-dir", dir,
                        (char *)extra, (char *)value, NULL};
        pids[i] = procs_spawn_client(argv, log);
    }
}

/* The coordinator stopped (SIGTERM) mid-run and started again: the run resumes
 * from the database with the same client processes, which waited for it; a
 * client with --connect-timeout 2 gave up with a clear error meanwhile. */
static void test_resume_after_stop(void **state)
{
    (void)state;
    char db[512], log[512], endpoint[64];
    snprintf(db, sizeof db, "%s/resume.db", dir);
    snprintf(endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", procs_free_port());
    char *sargv[] = {BIN("server/fedmoe-server"), "--bind", endpoint, "--db", db, "--rounds", "4", "--min-clients", "3",
                     "--partitions", "3", "--round-timeout", "120", NULL};
    snprintf(log, sizeof log, "%s/resume-server1.log", dir);
    procs_client_keys("c", 3);
    pid_t server = procs_spawn_server(sargv, log);
    pid_t clients[3];
    start_clients(clients, 0, 2, endpoint, "first", NULL, NULL);
    start_clients(clients, 2, 1, endpoint, "first", "--connect-timeout", "2");
    for (int i = 0; i < 1200 && procs_committed_rounds(db) < 2; i++)
        usleep(50000);
    assert_true(procs_committed_rounds(db) >= 2);
    kill(server, SIGTERM);
    assert_int_equal(procs_wait(server, 30), 0); /* a clean stop exits 0 */
    int done_first = procs_committed_rounds(db);
    assert_true(done_first >= 2 && done_first < 4);
    /* gave up 2 s after it read the stop (after the round it was training) */
    assert_int_equal(procs_wait(clients[2], 120), 2);
    char clog[512];
    snprintf(clog, sizeof clog, "%s/first-client2.log", dir);
    assert_true(procs_log_has(clog, "did not come back within 2 s"));
    for (int i = 0; i < 2; i++)
        assert_int_equal(waitpid(clients[i], NULL, WNOHANG), 0); /* still running, waiting */
    /* the same settings on the same database: the run resumes and finishes */
    snprintf(log, sizeof log, "%s/resume-server2.log", dir);
    server = procs_spawn_server(sargv, log);
    start_clients(clients, 2, 1, endpoint, "second", NULL, NULL);
    assert_int_equal(procs_wait(server, 300), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(procs_wait(clients[i], 30), 0);
    snprintf(clog, sizeof clog, "%s/first-client0.log", dir);
    assert_true(procs_log_has(clog, "waiting for it"));
    fm_store_t *st;
    assert_int_equal(fm_store_open(&st, db, true), FM_OK);
    fm_run_row_t *runs;
    int nruns, n;
    assert_int_equal(fm_store_list_runs(st, &runs, &nruns), FM_OK);
    assert_int_equal(nruns, 1); /* resumed, not restarted */
    assert_string_equal(runs[0].status, "finished");
    fm_round_row_t *r;
    assert_int_equal(fm_store_list_rounds(st, runs[0].id, &r, &n), FM_OK);
    assert_int_equal(n, 4);
    for (int i = 0; i < 4; i++)
        assert_int_equal(r[i].round, i + 1);
    fm_client_round_row_t *cr;
    assert_int_equal(fm_store_list_client_rounds(st, runs[0].id, -1, &cr, &n), FM_OK);
    assert_int_equal(n, 12); /* 3 clients x 4 rounds, none missing or doubled (primary key) */
    for (int i = 0; i < n; i++)
        assert_int_equal(cr[i].round, 1 + i / 3);
    free(cr);
    free(r);
    fm_store_run_clear(&runs[0]);
    free(runs);
    fm_store_close(&st);
}

/* ---- the protocol spoken from here: fake clients with known uploads -------- */

typedef struct {
    void *sock;
    char id[16];
    uint8_t nonce[16]; /* of its Task */
} fake_t;

static Fedmoe__Envelope *recv_env(void *sock)
{
    int timeout = 20000;
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    uint8_t *m;
    size_t len;
    if (fm_wire_recv(sock, 0, 1u << 30, &m, &len) != FM_OK)
        return NULL;
    Fedmoe__Envelope *env = NULL;
    fm_wire_decode(m, len, 1u << 30, &env);
    free(m);
    return env;
}

/* Waits for a message of the given kind, skipping others. */
static Fedmoe__Envelope *expect(void *sock, Fedmoe__Envelope__BodyCase kind)
{
    for (int i = 0; i < 10; i++) {
        Fedmoe__Envelope *e = recv_env(sock);
        assert_non_null(e);
        if (e->body_case == kind)
            return e;
        fm_wire_free(e);
    }
    fail_msg("expected message kind %d", kind);
    return NULL;
}

static void send_env(void *sock, Fedmoe__Envelope *env) { assert_int_equal(procs_send_env(sock, env), 0); }

static void send_update(fake_t *f, uint32_t round, const float *vec, uint32_t n, const float *prompt, uint64_t samples)
{
    assert_int_equal(procs_send_update(f->sock, round, f->nonce, vec, n, prompt, samples), 0);
}

/* One run of one round with 3 fake clients uploading in `order`; returns the
 * checkpoint's global vector (malloc'd) and its length. */
static float *fake_round(const char *db, const int order[3], float *const vecs[3], const uint64_t samples[3],
                         size_t *nglobal, bool send_garbage)
{
    char endpoint[64], log[512];
    snprintf(endpoint, sizeof endpoint, "tcp://127.0.0.1:%d", procs_free_port());
    char *sargv[] = {BIN("server/fedmoe-server"), "--bind", endpoint, "--db", (char *)db, "--rounds", "1",
                     "--min-clients", "3", "--partitions", "3", "--strategy", "comigs", "--round-timeout", "60", NULL};
    snprintf(log, sizeof log, "%s.log", db);
    procs_client_keys("fake", 3);
    pid_t server = procs_spawn_server(sargv, log);
    void *ctx = zmq_ctx_new();
    fake_t f[3];
    uint32_t n = 0, round = 0;
    for (int i = 0; i < 3; i++) {
        f[i].sock = zmq_socket(ctx, ZMQ_DEALER);
        snprintf(f[i].id, sizeof f[i].id, "fake%d", i);
        zmq_setsockopt(f[i].sock, ZMQ_ROUTING_ID, f[i].id, strlen(f[i].id));
        procs_secure_client(f[i].sock, f[i].id);
        zmq_connect(f[i].sock, endpoint);
        Fedmoe__Envelope env;
        Fedmoe__Hello h;
        procs_hello(&env, &h, f[i].id, -1, samples[i]); /* ready: it has its data */
        send_env(f[i].sock, &env);
        Fedmoe__Envelope *w = expect(f[i].sock, FEDMOE__ENVELOPE__BODY_WELCOME);
        assert_string_equal(w->welcome->strategy, "comigs");
        fm_wire_free(w);
    }
    for (int i = 0; i < 3; i++) {
        Fedmoe__Envelope *t = expect(f[i].sock, FEDMOE__ENVELOPE__BODY_TASK);
        assert_int_equal(t->task->n_model, 1);
        n = t->task->model[0]->shape[1];
        round = t->task->round;
        assert_int_equal(t->task->nonce.len, 16);
        memcpy(f[i].nonce, t->task->nonce.data, 16);
        assert_int_equal(t->task->n_nonlocal_prompts, 0); /* comigs keeps no pool */
        assert_true(t->task->lr_scale == 1.0f);           /* set, also when constant */
        fm_wire_free(t);
    }
    assert_int_equal(round, 1);
    *nglobal = n;
    float prompt[256];
    for (int j = 0; j < 256; j++)
        prompt[j] = 0.01f * (float)j;
    if (send_garbage) {
        /* bad input in the same round: each gets an Error and changes nothing */
        const char junk[] = "\x08\x01\x12\xff\xff\xff\x0fnot protobuf";
        zmq_send(f[0].sock, junk, sizeof junk, 0);
        Fedmoe__Envelope *e = expect(f[0].sock, FEDMOE__ENVELOPE__BODY_ERROR);
        assert_int_equal(e->error->code, FM_WIRE_MALFORMED);
        fm_wire_free(e);
        /* (an update refused for its contents ends the client's part in the round:
         * test_coordinator covers those) */
        send_update(&f[0], 7, vecs[0], n, prompt, samples[0]); /* wrong round */
        e = expect(f[0].sock, FEDMOE__ENVELOPE__BODY_ERROR);
        assert_int_equal(e->error->code, FM_WIRE_WRONG_ROUND);
        fm_wire_free(e);
    }
    for (int k = 0; k < 3; k++) {
        int i = order[k];
        send_update(&f[i], 1, vecs[i], n, prompt, samples[i]);
        usleep(100000); /* let them arrive in this order */
        if (send_garbage && k == 0) { /* the same update again: refused, counted once */
            send_update(&f[i], 1, vecs[i], n, prompt, samples[i]);
            Fedmoe__Envelope *e = expect(f[i].sock, FEDMOE__ENVELOPE__BODY_ERROR);
            assert_int_equal(e->error->code, FM_WIRE_DUPLICATE);
            fm_wire_free(e);
        }
    }
    assert_int_equal(procs_wait(server, 60), 0);
    for (int i = 0; i < 3; i++) {
        int linger = 0;
        zmq_setsockopt(f[i].sock, ZMQ_LINGER, &linger, sizeof linger);
        zmq_close(f[i].sock);
    }
    zmq_ctx_term(ctx);
    fm_store_t *st;
    fm_run_row_t run;
    bool found;
    procs_open_latest(db, &st, &run);
    int rd;
    uint8_t *blob;
    size_t len;
    assert_int_equal(fm_store_latest_checkpoint(st, run.id, &rd, &blob, &len, &found), FM_OK);
    assert_true(found);
    assert_int_equal(rd, 1);
    fm_checkpoint_t ck;
    assert_int_equal(fm_checkpoint_decode(blob, len, &ck), FM_OK);
    assert_int_equal(ck.nglobal, n);
    for (size_t j = 0; j < ck.nprompt; j++)
        assert_float_equal(ck.prompt[j], prompt[j], 1e-6f); /* all uploaded the same prompt */
    float *g = ck.global;
    ck.global = NULL;
    fm_checkpoint_free(&ck);
    free(blob);
    fm_store_run_clear(&run);
    fm_store_close(&st);
    return g;
}

static void test_coordinator_average_any_order(void **state)
{
    (void)state;
    /* learn the vector size from a first run, then fill known uploads */
    const uint64_t samples[3] = {1000, 2500, 4321};
    fm_run_spec_t spec;
    fm_run_spec_default(&spec);
    spec.strategy = FM_STRATEGY_COMIGS;
    fm_run_spec_finish(&spec);
    fm_model_t *m;
    assert_int_equal(fm_model_new(&m, &spec.model, spec.seed, fm_rng_stream(FM_STREAM_INIT, 1)), FM_OK);
    size_t n = fm_federated_size(m, FM_STRATEGY_COMIGS);
    fm_model_destroy(&m);
    float *vecs[3];
    fm_rng_t r;
    fm_rng_init(&r, 5, 5);
    for (int i = 0; i < 3; i++) {
        vecs[i] = malloc(sizeof(float) * n);
        for (size_t j = 0; j < n; j++)
            vecs[i][j] = (float)fm_rng_normal(&r) * 0.3f;
    }
    char db1[512], db2[512];
    snprintf(db1, sizeof db1, "%s/agg1.db", dir);
    snprintf(db2, sizeof db2, "%s/agg2.db", dir);
    const int o1[3] = {0, 1, 2}, o2[3] = {2, 0, 1};
    size_t n1, n2;
    float *g1 = fake_round(db1, o1, vecs, samples, &n1, true);
    float *g2 = fake_round(db2, o2, vecs, samples, &n2, false);
    assert_int_equal(n1, n);
    assert_int_equal(n2, n);
    assert_memory_equal(g1, g2, sizeof(float) * n); /* bit-identical in either order */
    double total = (double)(samples[0] + samples[1] + samples[2]);
    for (size_t j = 0; j < n; j++) {
        double want = ((double)vecs[0][j] * samples[0] + (double)vecs[1][j] * samples[1] + (double)vecs[2][j] * samples[2]) / total;
        assert_true(fabs(g1[j] - want) <= 1e-6 * fabs(want) + 1e-7);
    }
    for (int i = 0; i < 3; i++)
        free(vecs[i]);
    free(g1);
    free(g2);
}

static void test_store_upgrades_old_database(void **state)
{
    (void)state;
    char db[512];
    snprintf(db, sizeof db, "%s/old.db", dir);
    sqlite3 *h;
    assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
    assert_int_equal(
        sqlite3_exec(h,
                     "CREATE TABLE runs (id TEXT PRIMARY KEY, started_at TEXT NOT NULL, finished_at TEXT,"
                     " config TEXT NOT NULL, seed INTEGER NOT NULL, strategy TEXT NOT NULL, status TEXT NOT NULL,"
                     " rounds_planned INTEGER NOT NULL);"
                     "CREATE TABLE rounds (run_id TEXT NOT NULL, round INTEGER NOT NULL, started_at TEXT,"
                     " finished_at TEXT, selected INTEGER, completed INTEGER, dropped INTEGER, train_loss REAL,"
                     " test_loss REAL, test_accuracy REAL, bytes_up INTEGER, bytes_down INTEGER, seconds REAL,"
                     " checkpoint_sha256 TEXT, PRIMARY KEY (run_id, round));"
                     "CREATE TABLE client_rounds (run_id TEXT NOT NULL, round INTEGER NOT NULL, client_id TEXT NOT"
                     " NULL, status TEXT NOT NULL, train_loss REAL, val_loss REAL, test_loss REAL, test_accuracy REAL,"
                     " generalist_share REAL, train_samples INTEGER, test_samples INTEGER, test_correct INTEGER,"
                     " seconds REAL, bytes_up INTEGER, bytes_down INTEGER, PRIMARY KEY (run_id, round, client_id));"
                     "INSERT INTO runs VALUES ('old', '2026-01-01T00:00:00Z', NULL, '{}', 1, 'full', 'finished', 1);"
                     "INSERT INTO rounds VALUES ('old', 1, '', '', 2, 2, 0, 0.5, 0.4, 0.875, 10, 10, 1.0, 'x');"
                     "INSERT INTO client_rounds VALUES ('old', 1, 'c1', 'completed', 0.5, 0.5, 0.4, 0.875, 0.5, 100,"
                     " 40, 35, 1.0, 5, 5);",
                     NULL, NULL, NULL),
        SQLITE_OK);
    sqlite3_close(h);
    for (int pass = 0; pass < 3; pass++) { /* read-only before, writable, read-only after */
        fm_store_t *st;
        assert_int_equal(fm_store_open(&st, db, pass != 1), FM_OK);
        fm_round_row_t *r;
        fm_client_round_row_t *cr;
        int n;
        assert_int_equal(fm_store_list_rounds(st, "old", &r, &n), FM_OK);
        assert_int_equal(n, 1);
        /* (a column the old log lacks: not logged then, NaN, never a made-up 0) */
        assert_true(r[0].test_accuracy == 0.875 && isnan(r[0].val_accuracy) && isnan(r[0].generalist_share));
        free(r);
        assert_int_equal(fm_store_list_client_rounds(st, "old", 1, &cr, &n), FM_OK);
        assert_int_equal(n, 1);
        assert_true(cr[0].test_correct == 35 && cr[0].val_samples == 0);
        free(cr);
        fm_store_close(&st);
    }
    assert_int_equal(sqlite3_open(db, &h), SQLITE_OK);
    sqlite3_stmt *q;
    assert_int_equal(sqlite3_prepare_v2(h, "SELECT val_accuracy FROM rounds", -1, &q, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_step(q), SQLITE_ROW);
    assert_int_equal(sqlite3_column_type(q, 0), SQLITE_NULL);
    sqlite3_finalize(q);
    sqlite3_close(h);
}

/* Every program: a bad argument gives one line on stderr and a non-zero exit. */
/* Differential privacy through the real programs: fedmoe-sim forwards the
 * flags to the coordinator, which picks the noise for the budget (auto);
 * every round logs its epsilon, the last at most the budget, and
 * fedmoe-history shows the column. */
static void test_sim_with_privacy(void **state)
{
    (void)state;
    char db[512], cmd[2048], *out;
    snprintf(db, sizeof db, "%s/dp.db", dir);
    snprintf(cmd, sizeof cmd,
             "%s --clients 2 --rounds 2 --strategy fedavg --client-examples 200 --local-steps 2 --dp-noise auto "
             "--dp-epsilon-budget 5 --dp-clip 1 --db %s --workdir %s/dp --round-timeout 120 2>&1",
             BIN("client/fedmoe-sim"), db, dir);
    int rc = procs_capture(cmd, &out);
    if (rc != 0)
        fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    free(out);
    fm_store_t *st;
    fm_run_row_t run;
    procs_open_latest(db, &st, &run);
    assert_string_equal(run.status, "finished");
    assert_non_null(strstr(run.config, "\"privacy\":{\"noise\":")); /* the number chosen, not "auto" */
    assert_null(strstr(run.config, "\"auto\""));
    fm_round_row_t *r;
    int n;
    assert_int_equal(fm_store_list_rounds(st, run.id, &r, &n), FM_OK);
    assert_int_equal(n, 2);
    assert_true(r[0].epsilon > 0.0 && r[0].epsilon < r[1].epsilon && r[1].epsilon <= 5.0 && r[1].epsilon > 4.99);
    free(r);
    fm_store_run_clear(&run);
    fm_store_close(&st);
    snprintf(cmd, sizeof cmd, "%s --db %s rounds 2>&1", BIN("server/fedmoe-history"), db);
    assert_int_equal(procs_capture(cmd, &out), 0);
    assert_non_null(strstr(out, "epsilon"));
    assert_non_null(strstr(out, "    5\n")); /* epsilon 5 after round 2 (%8.4g) */
    free(out);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    const char *cases[][2] = {
        {"server/fedmoe-server", "--rounds x"},       {"server/fedmoe-server", "--strategy nope"},
        {"server/fedmoe-server", "--bogus"},          {"server/fedmoe-server", "--fraction 2"},
        {"server/fedmoe-server", "--config /nonexistent.ini"},
        {"server/fedmoe-server", "--anchor 5000"},    {"client/fedmoe-sim", "--weight-decay -1"},
        {"server/fedmoe-server", "--generalists 65"}, {"client/fedmoe-sim", "--generalists x"},
        {"client/fedmoe-client", "--bogus"},          {"client/fedmoe-client", "--partition 5/3"},
        {"client/fedmoe-client", "--id 'bad id'"},    {"client/fedmoe-client", "--standalone --stem rnn"},
        {"client/fedmoe-sim", "--clients 0"},         {"client/fedmoe-sim", "--strategy x"},
        {"client/fedmoe-sim", "extra"},               {"server/fedmoe-history", "nosuchcommand"},
        {"server/fedmoe-history", "--db /nonexistent/x.db runs"}, {"server/fedmoe-history", "follow --after 2026-12-06"},
        {"server/fedmoe-history", "clients abc"},     {"bench/fedmoe-bench", "train --steps 0"},
        {"server/fedmoe-history", "check extra"},     {"server/fedmoe-history", "follow --resume-wait x"},
        {"server/fedmoe-server", "--db /tmp/unused.db"}, /* no keys and not --insecure */
        {"server/fedmoe-server", "--key /nonexistent.key --allow /tmp"},
        {"client/fedmoe-client", "--connect tcp://127.0.0.1:9"}, /* no keys */
        {"server/fedmoe-keygen", "'bad id'"},         {"server/fedmoe-keygen", ""},
        {"server/fedmoe-server", "--insecure --strategy comigs --dp-noise 1"}, /* no --dp-clip */
        {"server/fedmoe-server", "--insecure --strategy comigs --dp-noise auto --dp-clip 1"}, /* no budget */
        {"client/fedmoe-sim", "--dp-noise 1 --dp-clip 1"}, /* full: its prompt pool */
        {"client/fedmoe-sim", "--dp-noise x"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cmd[1024], *out;
        snprintf(cmd, sizeof cmd, "%s/%s %s 2>&1 >/dev/null", FM_BIN_DIR, cases[i][0], cases[i][1]);
        int rc = procs_capture(cmd, &out);
        if (rc == 0 || procs_count_lines(out) != 1)
            fprintf(stderr, "  %s %s -> %d: %s", cases[i][0], cases[i][1], rc, out);
        assert_int_not_equal(rc, 0);
        assert_int_equal(procs_count_lines(out), 1);
        free(out);
    }
    /* databases the coordinator cannot use: one line at start, non-zero exit */
    char garbage[512];
    snprintf(garbage, sizeof garbage, "%s/garbage.db", dir);
    FILE *g = fopen(garbage, "w");
    fprintf(g, "this is not a database\n");
    fclose(g);
    const char *dbs[] = {dir /* a folder */, "/nonexistent/folder/x.db", garbage};
    for (size_t i = 0; i < sizeof dbs / sizeof dbs[0]; i++) {
        char cmd2[1024], *o;
        snprintf(cmd2, sizeof cmd2, "%s --insecure --db %s 2>&1 >/dev/null", BIN("server/fedmoe-server"), dbs[i]);
        int rc = procs_capture(cmd2, &o);
        assert_int_not_equal(rc, 0);
        assert_int_equal(procs_count_lines(o), 1);
        free(o);
    }
    /* a full disk, when this machine lets the test mount a small tmpfs */
    char tiny[512], mnt[1200];
    snprintf(tiny, sizeof tiny, "%s/tiny", dir);
    snprintf(mnt, sizeof mnt, "mkdir -p %s && mount -t tmpfs -o size=2m tmpfs %s 2>/dev/null", tiny, tiny);
    if (system(mnt) == 0) {
        char cmd2[1024], *o;
        snprintf(cmd2, sizeof cmd2, "%s --insecure --db %s/x.db 2>&1 >/dev/null", BIN("server/fedmoe-server"),
                 tiny);
        int rc = procs_capture(cmd2, &o);
        assert_int_not_equal(rc, 0);
        assert_non_null(strstr(o, "MB free"));
        free(o);
        snprintf(mnt, sizeof mnt, "umount %s", tiny);
        assert_int_equal(system(mnt), 0);
    } else {
        fprintf(stderr, "  (no tmpfs mount here: the full-disk start check was not exercised)\n");
    }
    /* a job whose clients cannot load their data stops with the reason, not a
     * hang: client processes, and a virtual host */
    for (int hosted = 0; hosted < 2; hosted++) {
        char cmd2[1024], *o;
        snprintf(cmd2, sizeof cmd2,
                 "%s --clients 2 --rounds 1 --dataset fmnist:/nonexistent --db %s/nodata.db --hosting %s 2>&1",
                 BIN("client/fedmoe-sim"), dir, hosted ? "virtual" : "processes");
        int rc = procs_capture(cmd2, &o);
        assert_int_not_equal(rc, 0);
        assert_non_null(strstr(o, "No such file"));
        /* (processes: whichever client exits first is named) */
        assert_true(hosted ? strstr(o, "the virtual host of client-00000 exited") != NULL
                           : strstr(o, "client-000 exited") || strstr(o, "client-001 exited"));
        free(o);
    }
    /* a corrupt config file names the line */
    char ini[512], cmd[1024], *out;
    snprintf(ini, sizeof ini, "%s/bad.ini", dir);
    FILE *f = fopen(ini, "w");
    fprintf(f, "[server]\nrounds = 3\nmin-clients = many\n");
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s --config %s 2>&1", BIN("server/fedmoe-server"), ini);
    assert_int_equal(procs_capture(cmd, &out), 2);
    assert_non_null(strstr(out, ":3:"));
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_upgrades_old_database),
        cmocka_unit_test(test_sim_with_privacy),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_coordinator_average_any_order),
        cmocka_unit_test(test_sim_and_history),
        cmocka_unit_test(test_resume_after_stop),
    };
    return procs_run_tests("e2e", tests, sizeof tests / sizeof tests[0], dir, sizeof dir);
}
