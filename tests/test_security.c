/* Attacks from the network on a real coordinator, with real CURVE keys on
 * loopback, while two honest clients train: a peer without a key, with a key not
 * in the allow-list, with an allowed key posing as another client (live or
 * gone), with a key revoked or replaced (SIGHUP) while connected, and one
 * flooding junk without reading are all refused, and the run finishes with the
 * honest clients' rounds. A real client refuses a coordinator that does not
 * hold the pinned key, and stops with a clear line when its own key keeps being
 * refused. Control characters cannot forge log lines. (Attacks on the
 * transport itself: test_transport.c.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <errno.h>
#include <signal.h>
#include <sys/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include "fedmoe/clock.h"
#include "fedmoe/keys.h"
#include "fedmoe/store.h"
#include "fedmoe/wire.h"

#include "peer.h"
#include "procs.h"

#define SEC_ROUNDS 30

static char dir[256];

/* ---- the attacks on a secure coordinator ------------------------------------ */

/* A peer with no key (plain NULL), and one with a key the coordinator does not
 * know: both refused at the handshake. */
static void attack_without_allowed_key(const char *ep)
{
    peer_t p = peer_new("nokey", 1);
    zmq_connect(p.sock, ep);
    int v, e = peer_event(&p, 10, &v);
    assert_true(e == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL || e == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL ||
                e == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
    assert_int_equal(peer_hello(p.sock, "nokey", 1.0), 0);
    peer_free(&p);

    p = peer_new("mallory", 2);
    fm_key_t mallory, server;
    char skey[512], spub[512], allow[512];
    procs_server_keys(skey, spub, allow);
    assert_int_equal(fm_key_generate(&mallory, "mallory"), FM_OK); /* not in the allow-list */
    assert_int_equal(fm_key_read(spub, false, &server), FM_OK);
    assert_int_equal(fm_key_apply_client(p.sock, &mallory, server.public_z85), FM_OK);
    zmq_connect(p.sock, ep);
    assert_int_equal(peer_event(&p, 10, &v), ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
    assert_int_equal(v, 400);
    peer_free(&p);
}

/* c2's key calling itself c0 (a live client) and c9 (no one), in its routing id
 * and its Hello: the handshake succeeds (the key is allowed), but the
 * coordinator knows the connection as c2, the key's id, and refuses a Hello
 * naming another; the live c0 goes on (the run finishes with its rounds). */
static void attack_impersonation(const char *ep, const char *log)
{
    const char *claims[] = {"c0", "c9"};
    for (int i = 0; i < 2; i++) {
        peer_t p = peer_new(claims[i], 3 + i); /* its routing id claims the id too */
        procs_secure_client(p.sock, "c2");
        zmq_connect(p.sock, ep);
        int v;
        assert_int_equal(peer_event(&p, 10, &v), ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
        /* it is c2, whatever it calls itself: a Hello naming another id is refused */
        assert_int_equal(peer_hello(p.sock, claims[i], 10.0), FEDMOE__ENVELOPE__BODY_ERROR);
        peer_free(&p);
        char line[128];
        snprintf(line, sizeof line, "hello names client '%s' but the socket identity is 'c2'", claims[i]);
        assert_true(procs_log_has(log, line));
    }
}

/* c4 sends 200,000 junk messages as fast as its socket takes them and never
 * reads: its first 4 are refused with an Error, then its key is held (its
 * connection closed, what it sent meanwhile dropped unread, its handshakes put
 * off), so the coordinator's memory stays flat (unbounded queues once grew by
 * 219 MB) and the log gets a few lines (the honest run finishes: below). */
static void attack_non_reading_peer(const char *ep, const char *log, const char *db, pid_t server)
{
    /* a steady baseline: once a round has run, the coordinator holds its round state */
    for (int i = 0; i < 600 && procs_committed_rounds(db) < 1; i++)
        usleep(100000);
    assert_true(procs_committed_rounds(db) >= 1);
    peer_t p = peer_new("c4", 8);
    int one = 1;
    zmq_setsockopt(p.sock, ZMQ_RCVHWM, &one, sizeof one); /* it reads next to nothing */
    procs_secure_client(p.sock, "c4");
    zmq_connect(p.sock, ep);
    int v;
    assert_int_equal(peer_event(&p, 10, &v), ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
    long before = procs_rss_kb(server);
    double t0 = fm_clock_seconds();
    int sent = 0;
    for (int i = 0; i < 200000 && fm_clock_seconds() - t0 < 10.0; i++) {
        if (zmq_send(p.sock, "junk", 4, ZMQ_DONTWAIT) == 4)
            sent++;
        else
            usleep(1000); /* (its queue full: the connection was closed) */
    }
    usleep(3000000); /* let it read them all */
    long after = procs_rss_kb(server);
    fprintf(stderr, "  non-reading peer: %d junk messages taken by its socket; coordinator RSS %ld -> %ld kB\n", sent,
            before, after);
    assert_true(sent >= 5); /* (its socket queues up to 1,000 whatever the coordinator does: the log says the rest) */
#ifndef __SANITIZE_ADDRESS__ /* (AddressSanitizer's quarantine and redzones make RSS no measure) */
    assert_true(before > 0 && after - before < 8 * 1024); /* no bound: +12.9 MB after 100,000 */
#endif
    peer_free(&p);
    assert_true(procs_log_has(log, "client c4 sent more messages that could not be read than it may: its key is held"));
    char cmd[700], *out;
    snprintf(cmd, sizeof cmd, "grep -c 'client c4' %s", log);
    assert_int_equal(procs_capture(cmd, &out), 0);
    /* its 4 refusals, the hold, and its connection closed */
    assert_true(atol(out) <= 8);
    free(out);
}

/* c2 connects with its key and is answered; its key is removed and the
 * coordinator told (SIGHUP): what the open connection sends is dropped, and a
 * new handshake is refused. Then c3's key is replaced by a new pair for c3: the
 * connection made with the old key is no longer heard. */
static void attack_revoked_key(const char *ep, const char *log, pid_t server)
{
    peer_t p = peer_new("c2", 5);
    procs_secure_client(p.sock, "c2");
    zmq_connect(p.sock, ep);
    int v;
    assert_int_equal(peer_event(&p, 10, &v), ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
    /* heard and answered (an Error: both partitions are taken by c0 and c1) */
    assert_int_equal(peer_hello(p.sock, "c2", 10.0), FEDMOE__ENVELOPE__BODY_ERROR);
    char skey[512], spub[512], allow[512], pub[600];
    procs_server_keys(skey, spub, allow);
    snprintf(pub, sizeof pub, "%s/c2.pub", allow);
    assert_int_equal(unlink(pub), 0);
    kill(server, SIGHUP);
    for (int i = 0; i < 100 && !procs_log_has(log, "reloaded: 4 client keys"); i++)
        usleep(100000);
    assert_true(procs_log_has(log, "reloaded: 4 client keys"));
    assert_int_equal(peer_hello(p.sock, "c2", 2.0), 0);
    assert_true(procs_log_has(log, "dropped a message from c2: its key was removed from the allow-list or replaced"));
    peer_free(&p);
    p = peer_new("c2", 6);
    procs_secure_client(p.sock, "c2");
    zmq_connect(p.sock, ep);
    assert_int_equal(peer_event(&p, 10, &v), ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
    peer_free(&p);
    /* c3's key replaced by a new pair for c3 (a stolen key): the connection made
     * with the old key is no longer heard */
    p = peer_new("c3", 9);
    procs_secure_client(p.sock, "c3");
    zmq_connect(p.sock, ep);
    assert_int_equal(peer_event(&p, 10, &v), ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
    assert_int_not_equal(peer_hello(p.sock, "c3", 10.0), 0);
    char key[600];
    snprintf(pub, sizeof pub, "%s/c3.pub", allow);
    snprintf(key, sizeof key, "%s/c3.key", allow);
    assert_int_equal(unlink(pub), 0);
    assert_int_equal(unlink(key), 0);
    fm_key_t fresh;
    assert_int_equal(fm_key_generate(&fresh, "c3"), FM_OK);
    assert_int_equal(fm_key_write(&fresh, allow), FM_OK);
    kill(server, SIGHUP);
    for (int i = 0; i < 100 && !procs_log_has(log, "reloaded: 4 client keys") ; i++)
        usleep(100000);
    usleep(300000);
    assert_int_equal(peer_hello(p.sock, "c3", 2.0), 0);
    assert_true(procs_log_has(log, "dropped a message from c3: its key was removed from the allow-list or replaced"));
    peer_free(&p);
}

static void test_attacks_refused_honest_run_finishes(void **state)
{
    (void)state;
    char db[512], log[512], ep[64];
    procs_files("sec", db, log);
    peer_endpoint(ep);
    procs_client_keys("c", 5); /* c0, c1 honest; c2-c4 used by the attacks */
    /* (30 rounds: the attacks must come while the run goes on; 12 were done
     * before the last attack on a fast CPU, the coordinator gone) */
    char *sargv[] = {BIN("server/fedmoe-server"), "--bind", ep, "--db", db, "--rounds", FM_STR(SEC_ROUNDS),
                     "--min-clients", "2", "--partitions", "2", NULL};
    pid_t server = procs_spawn_server(sargv, log);
    pid_t c[2];
    for (int i = 0; i < 2; i++) {
        char id[16], clog[512];
        snprintf(id, sizeof id, "c%d", i);
        snprintf(clog, sizeof clog, "%s/sec-c%d.log", dir, i);
        char *cargv[] = {BIN("client/fedmoe-client"), "--connect", ep, "--id", id, "--state-dir", dir, NULL};
        c[i] = procs_spawn_client(cargv, clog);
    }
    attack_without_allowed_key(ep);
    attack_impersonation(ep, log);
    attack_non_reading_peer(ep, log, db, server);
    attack_revoked_key(ep, log, server);
    assert_true(procs_committed_rounds(db) < SEC_ROUNDS); /* the attacks came while the run went on */
    const char *ids[] = {"c0", "c1"};
    procs_assert_run_of(db, server, c, ids, 2, SEC_ROUNDS); /* only the honest clients in its rounds */
}


/* A client that is gone (killed, silent past --client-timeout) cannot be taken
 * over: e2's key calling itself e0, in its routing id and Hello, is refused
 * while e0's partition waits for it; the real e0, restarted with its key, is
 * welcomed back and the run finishes with e0 and e1. */
static void test_dropped_client_cannot_be_taken(void **state)
{
    (void)state;
    char db[512], log[512], ep[64];
    procs_files("dropped", db, log);
    peer_endpoint(ep);
    procs_client_keys("e", 3); /* (the first test revoked c2) */
    char *sargv[] = {BIN("server/fedmoe-server"), "--bind", ep, "--db", db, "--rounds", "2", "--min-clients", "2",
                     "--partitions", "2", "--client-timeout", "2", NULL};
    pid_t server = procs_spawn_server(sargv, log);
    char clog[3][512];
    pid_t c[2];
    for (int i = 0; i < 3; i++)
        snprintf(clog[i], sizeof clog[i], "%s/dropped-e%d%s.log", dir, i % 2, i == 2 ? "-again" : "");
    char *c0argv[] = {BIN("client/fedmoe-client"), "--connect", ep, "--id", "e0", "--state-dir", dir, NULL};
    char *c1argv[] = {BIN("client/fedmoe-client"), "--connect", ep, "--id", "e1", "--state-dir", dir, NULL};
    c[0] = procs_spawn_client(c0argv, clog[0]);
    for (int i = 0; i < 300 && !procs_log_has(clog[0], "validation, "); i++) /* it has its data */
        usleep(100000);
    assert_true(procs_log_has(log, "client e0 joined"));
    usleep(500000); /* (and said it is ready) */
    kill(c[0], SIGKILL);
    procs_wait(c[0], 10);
    for (int i = 0; i < 300 && !procs_log_has(log, "client e0 silent for"); i++)
        usleep(100000);
    assert_true(procs_log_has(log, "client e0 silent for"));
    peer_t p = peer_new("e0", 11);
    procs_secure_client(p.sock, "e2");
    zmq_connect(p.sock, ep);
    int v;
    assert_int_equal(peer_event(&p, 10, &v), ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
    assert_int_equal(peer_hello(p.sock, "e0", 10.0), FEDMOE__ENVELOPE__BODY_ERROR);
    assert_true(procs_log_has(log, "hello names client 'e0' but the socket identity is 'e2'"));
    peer_free(&p);
    c[0] = procs_spawn_client(c0argv, clog[2]);
    c[1] = procs_spawn_client(c1argv, clog[1]);
    const char *ids[] = {"e0", "e1"};
    procs_assert_run_of(db, server, c, ids, 2, 2);
}

/* ---- the client's side ---------------------------------------------------------- */

/* A coordinator with another key pair answers a real client that pins the real
 * coordinator's key: the handshake never completes, the client says so and,
 * with a connect timeout, gives up with a clear line. A client whose own key is
 * not allowed stops at once with the reason. */
static void test_client_refuses_rogue_coordinator(void **state)
{
    (void)state;
    void *ctx = zmq_ctx_new(), *rogue = zmq_socket(ctx, ZMQ_ROUTER);
    fm_key_t other;
    assert_int_equal(fm_key_generate(&other, "coordinator"), FM_OK);
    assert_int_equal(fm_key_apply_server(rogue, &other), FM_OK);
    assert_int_equal(zmq_bind(rogue, "tcp://127.0.0.1:*"), 0);
    char ep[256];
    size_t eplen = sizeof ep;
    zmq_getsockopt(rogue, ZMQ_LAST_ENDPOINT, ep, &eplen);
    char cmd[2048], key[512], skey[512], spub[512], allow[512], *out;
    procs_server_keys(skey, spub, allow);
    procs_client_key("c0", key);
    snprintf(cmd, sizeof cmd, "%s --connect %s --key %s --server-key %s --connect-timeout 4 2>&1",
             BIN("client/fedmoe-client"), ep, key, spub);
    int rc = procs_capture(cmd, &out);
    assert_int_not_equal(rc, 0);
    assert_non_null(strstr(out, "the coordinator did not prove the key"));
    free(out);
    zmq_pollitem_t it = {rogue, 0, ZMQ_POLLIN, 0};
    assert_int_equal(zmq_poll(&it, 1, 0), 0); /* it never read a word from the client */
    zmq_close(rogue);
    zmq_ctx_term(ctx);

    /* the real coordinator, with c0's key not in the list: c0 stops, saying why */
    char db[512], log[512], ep2[64];
    procs_files("rogue", db, log);
    peer_endpoint(ep2);
    char *sargv[] = {BIN("server/fedmoe-server"), "--bind", ep2, "--db", db, "--rounds", "1", NULL};
    char pub[600];
    snprintf(pub, sizeof pub, "%s/c0.pub", allow);
    rename(pub, "/tmp/fedmoe-test-c0.pub.away");
    pid_t server = procs_spawn_server(sargv, log);
    usleep(500000);
    snprintf(cmd, sizeof cmd, "%s --connect %s --key %s --server-key %s --connect-timeout 4 2>&1",
             BIN("client/fedmoe-client"), ep2, key, spub);
    rc = procs_capture(cmd, &out);
    rename("/tmp/fedmoe-test-c0.pub.away", pub);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(out, "refused this client's key"));
    free(out);
    kill(server, SIGTERM);
    assert_int_equal(procs_wait(server, 30), 0);
}

/* A control character in a peer's id or text comes out as \xNN: one event,
 * one log line. */
static void test_log_lines_cannot_be_forged(void **state)
{
    (void)state;
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd, "%s --standalone --partition 0/2 --dataset 'csv:/nonexistent\n2026 INFO  forged' 2>&1",
             BIN("client/fedmoe-client"));
    int rc = procs_capture(cmd, &out);
    assert_int_not_equal(rc, 0);
    assert_null(strstr(out, "\n2026 INFO  forged"));
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attacks_refused_honest_run_finishes),
        cmocka_unit_test(test_dropped_client_cannot_be_taken),
        cmocka_unit_test(test_client_refuses_rogue_coordinator),
        cmocka_unit_test(test_log_lines_cannot_be_forged),
    };
    return procs_run_tests("security", tests, sizeof tests / sizeof tests[0], dir, sizeof dir);
}
