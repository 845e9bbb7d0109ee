/* A real fedmoe-client process against a fake coordinator (a ROUTER socket in
 * this test, speaking the wire protocol by hand): a Task it must refuse is
 * refused with BAD_VALUE and nothing is trained, a good one is trained and
 * answered; a repeated one gets the same update again; a client stopped in the
 * middle of training stops at once, keeps heartbeating while it trains and
 * leaves no partial update; a restarted coordinator is greeted once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "fedmoe/clock.h"
#include "fedmoe/runspec_wire.h"
#include "fedmoe/wire.h"

#include "procs.h"

static char dir[256];

/* The routing id of the client's connection, as the fake coordinator last saw
 * it (a CURVE client sets none: libzmq gives it a random one). */
static uint8_t g_rid[256];
static int g_ridn;

/* Sends env to the client's connection. */
static void to_client(void *sock, Fedmoe__Envelope *env)
{
    uint8_t *buf;
    size_t len;
    assert_int_equal(fm_wire_encode(env, &buf, &len), FM_OK);
    assert_int_equal(zmq_send(sock, g_rid, (size_t)g_ridn, ZMQ_SNDMORE), g_ridn);
    assert_int_equal(zmq_send(sock, buf, len, 0), (int)len);
    free(buf);
}

/* What a fake coordinator's ROUTER receives next of the given kind (heartbeats
 * and other kinds skipped), within 60 s; the sender's routing id into g_rid
 * (and, printable or not, into id). */
static Fedmoe__Envelope *router_expect(void *sock, char id[64], int kind)
{
    Fedmoe__Envelope *e = procs_recv_kind(sock, kind, 60.0, g_rid, &g_ridn);
    if (!e)
        fail_msg("nothing of kind %d within 60 s", kind);
    memcpy(id, g_rid, (size_t)(g_ridn < 63 ? g_ridn : 63));
    id[g_ridn < 63 ? g_ridn : 63] = 0;
    return e;
}

/* A real client, id c1, welcomed by a fake coordinator on sock into a run of spec
 * (partition 3); returns once the client has its data (its second Hello). */
static pid_t fake_coordinated_client(void *sock, const char *name, const fm_run_spec_t *spec)
{
    char ep[256], wd[512], log[600], id[64];
    size_t eplen = sizeof ep;
    zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, ep, &eplen);
    snprintf(wd, sizeof wd, "%s/%s", dir, name);
    snprintf(log, sizeof log, "%s.log", wd);
    char *argv[] = {BIN("client/fedmoe-client"), "--connect", ep, "--id", "c1", "--state-dir", wd, NULL};
    pid_t pid = procs_spawn_client(argv, log);
    Fedmoe__Envelope *e = router_expect(sock, id, FEDMOE__ENVELOPE__BODY_HELLO);
    assert_string_equal(e->hello->client_id, "c1"); /* its key's id */
    fm_wire_free(e);
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    fm_welcome_pb_t w;
    fm_run_spec_welcome(spec, "run-fake", 3, 1, &w);
    env.body_case = FEDMOE__ENVELOPE__BODY_WELCOME;
    env.welcome = &w.welcome;
    to_client(sock, &env);
    e = router_expect(sock, id, FEDMOE__ENVELOPE__BODY_HELLO); /* again, with its sample counts */
    assert_true(e->hello->train_samples > 0);
    fm_wire_free(e);
    return pid;
}

static void *router_on_loopback(void *ctx)
{
    void *sock = zmq_socket(ctx, ZMQ_ROUTER);
    procs_secure_server(sock); /* a fake coordinator with the real key: CURVE, no allow-list */
    assert_int_equal(zmq_bind(sock, "tcp://127.0.0.1:*"), 0);
    return sock;
}

static void router_close(void *sock)
{
    int linger = 0;
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_close(sock);
}

/* A task without its nonce gets MALFORMED, one whose lr_scale is out of range
 * BAD_VALUE, and neither is trained; a good one is trained and answered with its
 * nonce echoed. Then the state file it wrote is damaged in place: the restarted
 * client refuses it and starts fresh. */
static void test_client_checks_tasks(void **state)
{
    (void)state;
    void *ctx = zmq_ctx_new(), *sock = router_on_loopback(ctx);
    char id[64];
    fm_run_spec_t spec;
    fm_run_spec_default(&spec);
    spec.strategy = FM_STRATEGY_LOCAL;
    assert_int_equal(fm_run_spec_finish(&spec), FM_OK);
    char wd[600];
    snprintf(wd, sizeof wd, "%s/fakecoord", dir);
    assert_int_equal(mkdir(wd, 0700), 0); /* where its state file goes */
    pid_t pid = fake_coordinated_client(sock, "fakecoord", &spec);
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT, *e;
    const float bad[] = {-1.0f, NAN, INFINITY, 11.0f};
    Fedmoe__Task task = FEDMOE__TASK__INIT;
    task.round = 1;
    env.body_case = FEDMOE__ENVELOPE__BODY_TASK;
    env.task = &task;
    /* without its nonce: refused */
    to_client(sock, &env);
    e = router_expect(sock, id, FEDMOE__ENVELOPE__BODY_ERROR);
    assert_int_equal(e->error->code, FM_WIRE_MALFORMED);
    assert_non_null(strstr(e->error->text, "nonce"));
    fm_wire_free(e);
    uint8_t nonce[16] = {7, 7, 7, 7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    task.nonce.data = nonce;
    task.nonce.len = sizeof nonce;
    for (int i = 0; i < 4; i++) {
        task.lr_scale = bad[i];
        to_client(sock, &env);
        e = router_expect(sock, id, FEDMOE__ENVELOPE__BODY_ERROR);
        assert_int_equal(e->error->code, FM_WIRE_BAD_VALUE);
        assert_non_null(strstr(e->error->text, "lr_scale"));
        fm_wire_free(e);
    }
    task.lr_scale = 0.5f;
    to_client(sock, &env);
    e = router_expect(sock, id, FEDMOE__ENVELOPE__BODY_UPDATE);
    assert_int_equal(e->update->round, 1);
    assert_int_equal(e->update->nonce.len, 16); /* its Task's, echoed */
    assert_memory_equal(e->update->nonce.data, nonce, 16);
    assert_true(e->update->metrics->val_samples > 0);
    assert_true(e->update->metrics->val_correct <= e->update->metrics->val_samples);
    fm_wire_free(e);
    Fedmoe__Shutdown sd = FEDMOE__SHUTDOWN__INIT;
    Fedmoe__Envelope stop = FEDMOE__ENVELOPE__INIT;
    stop.body_case = FEDMOE__ENVELOPE__BODY_SHUTDOWN;
    stop.shutdown = &sd;
    to_client(sock, &stop);
    assert_int_equal(procs_wait(pid, 30), 0);
    /* its state file, damaged in place (one byte, the same size, as a NaN
     * written over a value would be): refused at the restart, which starts
     * fresh and trains finite numbers */
    char path[700], cmd[800], *out;
    snprintf(path, sizeof path, "%s/fakecoord/run-fake.c1.state", dir);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long size = ftell(f);
    assert_int_equal(fseek(f, size / 2, SEEK_SET), 0);
    int ch = fgetc(f);
    assert_int_equal(fseek(f, size / 2, SEEK_SET), 0);
    fputc(ch ^ 0x7f, f);
    fclose(f);
    pid = fake_coordinated_client(sock, "fakecoord", &spec);
    task.round = 2;
    to_client(sock, &env);
    e = router_expect(sock, id, FEDMOE__ENVELOPE__BODY_UPDATE);
    assert_true(isfinite(e->update->metrics->train_loss) && isfinite(e->update->metrics->test_loss));
    fm_wire_free(e);
    to_client(sock, &stop);
    assert_int_equal(procs_wait(pid, 30), 0);
    snprintf(cmd, sizeof cmd, "grep -c 'not a usable state file for this run' %s/fakecoord.log", dir);
    procs_capture(cmd, &out);
    assert_int_equal(atoi(out), 1);
    free(out);
    router_close(sock);
    zmq_ctx_term(ctx);
}

/* The same Task twice (a client that said hello again, an update lost on the
 * way): the update it sent is sent again, not retrained. A restarted
 * coordinator answers each heartbeat queued while it was away with
 * UNKNOWN_CLIENT: one Hello, not one per error. A resumable Shutdown (the
 * coordinator stopping mid-run) leaves it waiting; a final one ends it. */
static void test_client_repeats_and_restarts(void **state)
{
    (void)state;
    void *ctx = zmq_ctx_new(), *sock = router_on_loopback(ctx);
    char id[64], log[600];
    fm_run_spec_t spec;
    fm_run_spec_default(&spec);
    spec.strategy = FM_STRATEGY_LOCAL;
    assert_int_equal(fm_run_spec_finish(&spec), FM_OK);
    pid_t pid = fake_coordinated_client(sock, "repeat", &spec);
    snprintf(log, sizeof log, "%s/repeat.log", dir);
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT, *e;
    Fedmoe__Task task = FEDMOE__TASK__INIT;
    uint8_t nonce[16] = {3, 1, 4, 1, 5};
    task.round = 1;
    task.nonce.data = nonce;
    task.nonce.len = sizeof nonce;
    task.lr_scale = 1.0f;
    env.body_case = FEDMOE__ENVELOPE__BODY_TASK;
    env.task = &task;
    to_client(sock, &env);
    e = router_expect(sock, id, FEDMOE__ENVELOPE__BODY_UPDATE);
    double seconds = e->update->metrics->seconds;
    fm_wire_free(e);
    to_client(sock, &env);
    e = router_expect(sock, id, FEDMOE__ENVELOPE__BODY_UPDATE);
    assert_int_equal(e->update->round, 1);
    assert_true(e->update->metrics->seconds == seconds); /* the same bytes: not trained again */
    fm_wire_free(e);
    assert_true(procs_log_has(log, "the same task again"));
    /* a burst of UNKNOWN_CLIENT: one Hello */
    Fedmoe__Error err = FEDMOE__ERROR__INIT;
    err.code = FM_WIRE_UNKNOWN_CLIENT;
    err.text = "heartbeat before hello";
    Fedmoe__Envelope eenv = FEDMOE__ENVELOPE__INIT;
    eenv.body_case = FEDMOE__ENVELOPE__BODY_ERROR;
    eenv.error = &err;
    for (int i = 0; i < 10; i++)
        to_client(sock, &eenv);
    e = router_expect(sock, id, FEDMOE__ENVELOPE__BODY_HELLO);
    fm_wire_free(e);
    fm_welcome_pb_t w; /* welcomed back */
    fm_run_spec_welcome(&spec, "run-fake", 3, 1, &w);
    Fedmoe__Envelope wenv = FEDMOE__ENVELOPE__INIT;
    wenv.body_case = FEDMOE__ENVELOPE__BODY_WELCOME;
    wenv.welcome = &w.welcome;
    to_client(sock, &wenv);
    e = procs_recv_kind(sock, FEDMOE__ENVELOPE__BODY_HELLO, 4.0, g_rid, &g_ridn);
    assert_null(e);
    /* resumable: it stays; final: it leaves */
    Fedmoe__Shutdown sd = FEDMOE__SHUTDOWN__INIT;
    sd.reason = "stopping";
    sd.resumable = true;
    Fedmoe__Envelope stop = FEDMOE__ENVELOPE__INIT;
    stop.body_case = FEDMOE__ENVELOPE__BODY_SHUTDOWN;
    stop.shutdown = &sd;
    to_client(sock, &stop);
    e = router_expect(sock, id, FEDMOE__ENVELOPE__BODY_HEARTBEAT); /* still beating */
    fm_wire_free(e);
    usleep(500000);
    assert_int_equal(waitpid(pid, NULL, WNOHANG), 0);
    sd.resumable = false;
    to_client(sock, &stop);
    assert_int_equal(procs_wait(pid, 30), 0);
    router_close(sock);
    zmq_ctx_term(ctx);
}

/* SIGTERM while a long local step runs: the client leaves within seconds, with
 * status 0, sends no update, and writes no state for the unfinished round. */
static void test_client_stops_mid_training(void **state)
{
    (void)state;
    void *ctx = zmq_ctx_new(), *sock = router_on_loopback(ctx);
    char id[64], path[600];
    fm_run_spec_t spec;
    fm_run_spec_default(&spec);
    spec.strategy = FM_STRATEGY_LOCAL;
    spec.local_epochs = 1000; /* minutes of training */
    assert_int_equal(fm_run_spec_finish(&spec), FM_OK);
    snprintf(path, sizeof path, "%s/stopme", dir);
    assert_int_equal(mkdir(path, 0755), 0); /* so that a state file could be written */
    pid_t pid = fake_coordinated_client(sock, "stopme", &spec);
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT, *e;
    Fedmoe__Task task = FEDMOE__TASK__INIT;
    task.round = 1;
    uint8_t nonce[16] = {1};
    task.nonce.data = nonce;
    task.nonce.len = sizeof nonce;
    env.body_case = FEDMOE__ENVELOPE__BODY_TASK;
    env.task = &task;
    to_client(sock, &env);
    for (int beats = 0; beats < 2; beats++) { /* heartbeats come from inside the local step */
        e = router_expect(sock, id, FEDMOE__ENVELOPE__BODY_HEARTBEAT);
        fm_wire_free(e);
    }
    double t0 = fm_clock_seconds();
    kill(pid, SIGTERM);
    assert_int_equal(procs_wait(pid, 10), 0);
    assert_true(fm_clock_seconds() - t0 < 5.0);
    int timeout = 200;
    zmq_setsockopt(sock, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    for (;;) { /* whatever it sent before leaving: no update among it */
        zmq_msg_t m;
        zmq_msg_init(&m);
        int got = zmq_msg_recv(&m, sock, 0);
        if (got >= 0 && !zmq_msg_more(&m)) {
            Fedmoe__Envelope *left = NULL;
            if (fm_wire_decode(zmq_msg_data(&m), zmq_msg_size(&m), 1u << 30, &left) == FM_OK) {
                assert_int_not_equal(left->body_case, FEDMOE__ENVELOPE__BODY_UPDATE);
                fm_wire_free(left);
            }
        }
        zmq_msg_close(&m);
        if (got < 0)
            break;
    }
    char cmd[700], *out;
    snprintf(cmd, sizeof cmd, "ls -A %s", path);
    assert_int_equal(procs_capture(cmd, &out), 0);
    assert_string_equal(out, ""); /* no state file: no round finished */
    free(out);
    router_close(sock);
    zmq_ctx_term(ctx);
}

/* A round log written before the validation columns existed: readers still read
 * it, and the coordinator's store adds the columns (NULL in old rows). */

/* A coordinator that names a file as the run's data (here /dev/zero, which once
 * made a client read 1.5 GB) is refused: the client exits 2 saying it takes only
 * a named dataset from the network, and reads nothing. */
static void test_client_refuses_data_paths(void **state)
{
    (void)state;
    void *ctx = zmq_ctx_new(), *sock = router_on_loopback(ctx);
    char ep[256], log[512], id[64];
    size_t eplen = sizeof ep;
    zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, ep, &eplen);
    snprintf(log, sizeof log, "%s/datapath.log", dir);
    char *argv[] = {BIN("client/fedmoe-client"), "--connect", ep, "--id", "c1", NULL};
    pid_t pid = procs_spawn_client(argv, log);
    Fedmoe__Envelope *e = router_expect(sock, id, FEDMOE__ENVELOPE__BODY_HELLO);
    fm_wire_free(e);
    fm_run_spec_t spec;
    fm_run_spec_default(&spec);
    snprintf(spec.dataset, sizeof spec.dataset, "csv:/dev/zero");
    assert_int_equal(fm_run_spec_finish(&spec), FM_OK);
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    fm_welcome_pb_t w;
    fm_run_spec_welcome(&spec, "run-fake", 0, 1, &w);
    env.body_case = FEDMOE__ENVELOPE__BODY_WELCOME;
    env.welcome = &w.welcome;
    to_client(sock, &env);
    assert_int_equal(procs_wait(pid, 30), 2);
    char cmd[700], *out;
    snprintf(cmd, sizeof cmd, "grep -c 'takes only a named dataset' %s", log);
    assert_int_equal(procs_capture(cmd, &out), 0);
    free(out);
    router_close(sock);
    zmq_ctx_term(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_client_checks_tasks),
        cmocka_unit_test(test_client_stops_mid_training),
        cmocka_unit_test(test_client_repeats_and_restarts),
        cmocka_unit_test(test_client_refuses_data_paths),
    };
    return procs_run_tests("client", tests, sizeof tests / sizeof tests[0], dir, sizeof dir);
}
