/* One allowed key against everyone else, on a real coordinator with real CURVE
 * keys on loopback, while two honest clients train (docs/security.md, "What one
 * key can do"): the key opens 84 connections (the cap is 74) that each say Hello and
 * heartbeat; it floods Error reports without ever saying Hello; it drips a
 * large message through a slow relay after its Hello; it sends messages built
 * to decode large. Each time the honest
 * clients' rounds go on (the run finishes), a new client with a key of its own
 * is welcomed during the attack, the coordinator's memory stays bounded and
 * its log grows by a few lines, not one a message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <math.h>
#include <poll.h>
#include <sqlite3.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <zmq.h>

#include "fedmoe/clock.h"
#include "fedmoe/keys.h"
#include "fedmoe/wire.h"
#include "fedmoe.pb-c.h"

#include "peer.h"
#include "procs.h"
#include "zmtp.h"

static char dir[256];

/* A judgement, skipped when only measuring (bench/hostile.sh runs this test
 * against older programs, which fail them). */
#define CHECK(x)                                                                                                       \
    do {                                                                                                               \
        bool check_ = (x); /* (evaluated either way: it may be an action) */                                          \
        if (!procs_measure_only())                                                                                     \
            assert_true(check_);                                                                                       \
    } while (0)

/* Lines of log that contain text. */
static long log_lines_with(const char *log, const char *text)
{
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd, "grep -c -- '%s' %s", text, log);
    procs_capture(cmd, &out);
    long n = atol(out);
    free(out);
    return n;
}

static long log_lines(const char *log) { return log_lines_with(log, ""); }

/* The median length in seconds of the rounds committed after round `after`
 * (0 when none). */
static double median_round(const char *db, int after)
{
    sqlite3 *h;
    sqlite3_stmt *q;
    double v[4096];
    int n = 0;
    if (sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK)
        return 0.0;
    if (sqlite3_prepare_v2(h, "SELECT seconds FROM rounds WHERE round > ? ORDER BY seconds", -1, &q, NULL) ==
        SQLITE_OK) {
        sqlite3_bind_int(q, 1, after);
        while (n < 4096 && sqlite3_step(q) == SQLITE_ROW)
            v[n++] = sqlite3_column_double(q, 0);
        sqlite3_finalize(q);
    }
    sqlite3_close(h);
    return n ? v[(n - 1) / 2] : 0.0;
}

/* The rounds committed since round *from, and their median length; *from
 * becomes the latest. When judged, the honest rounds went on within twice
 * their normal length (0.5 s more for a round's jitter). */
static void rounds_during(const char *db, int *from, double normal, bool judged)
{
    int now = procs_committed_rounds(db);
    double median = median_round(db, *from);
    fprintf(stderr, "    during it: %d rounds, median round %.2f s\n", now - *from, median);
    if (judged)
        CHECK(now > *from && median <= 2.0 * normal + 0.5);
    *from = now;
}

/* A client with a key of its own ("c5"), from another address (127.0.0.2), is
 * welcomed within seconds. */
static void newcomer_welcomed(const char *ep, int n, double seconds)
{
    peer_t p = peer_new("c5", n);
    procs_secure_client(p.sock, "c5");
    char from[96];
    snprintf(from, sizeof from, "tcp://127.0.0.2:0;%s", ep + strlen("tcp://"));
    zmq_connect(p.sock, from);
    double t0 = fm_clock_seconds();
    int kind = peer_hello(p.sock, "c5", seconds);
    fprintf(stderr, "  a newcomer: %s after %.1f s\n", kind == FEDMOE__ENVELOPE__BODY_WELCOME ? "welcomed" : "not welcomed",
            fm_clock_seconds() - t0);
    CHECK(kind == FEDMOE__ENVELOPE__BODY_WELCOME);
    peer_free(&p);
}

/* 84 connections of key c2, each saying Hello and heartbeating for 6 s: the
 * coordinator lets it hold 4 that speak (the oldest let go as new ones come)
 * and puts off its handshakes past 8 (the connections put off wait, tried
 * again, within the 64 one address may have waiting); a newcomer gets in
 * meanwhile. (On 2954e8c, 84 such sockets held every slot and shut others out
 * for 40 s.) */
static void attack_many_connections(const char *ep, const char *log, pid_t server, int base_fds)
{
    enum { N = 84 };
    static peer_t p[N];
    for (int i = 0; i < N; i++) {
        char rid[16]; /* (a routing id of its own: a ROUTER turns away a second connection with one in use) */
        snprintf(rid, sizeof rid, "c2-%d", i);
        p[i] = peer_new(rid, 100 + i);
        procs_secure_client(p[i].sock, "c2");
        zmq_connect(p[i].sock, ep);
    }
    int most = 0, late = 0; /* the most held at once, and over the last 3 s */
    double t0 = fm_clock_seconds();
    bool hello_sent[N] = {false};
    while (fm_clock_seconds() - t0 < 6.0) {
        for (int i = 0; i < N; i++) {
            if (!hello_sent[i]) {
                Fedmoe__Envelope env;
                Fedmoe__Hello h;
                procs_hello(&env, &h, "c2", -1, 0);
                hello_sent[i] = procs_send_env(p[i].sock, &env) == 0;
            } else {
                procs_heartbeat(p[i].sock);
            }
        }
        int fds = procs_fd_count(server);
        most = fds > most ? fds : most;
        if (fm_clock_seconds() - t0 > 3.0)
            late = fds > late ? fds : late;
        usleep(200000);
    }
    newcomer_welcomed(ep, 99, 5.0);
    fprintf(stderr, "  84 connections of one key (the cap is 74): coordinator descriptors %d before, at most %d during, %d over "
                    "its last 3 s\n", base_fds, most, late);
    for (int i = 0; i < N; i++)
        peer_free(&p[i]);
    /* every connection that has not sent a message (its handshake put off and
     * tried again) counts against its address's 64; those that have, against
     * its key's 4 */
    /* (and the newcomer, and some shut, not yet closed by libzmq: up to 8 in the
     * normal build, 9 or more under the sanitizers, which slow libzmq's closing) */
    CHECK(most <= base_fds + 64 + 4 + 16);
    CHECK(late <= base_fds + 64 + 4 + 16);
    CHECK(procs_log_has(log, "opened a connection beyond the 4 it may hold"));
}

/* Key c3, never saying Hello, sends 100,000 Error reports as fast as it can
 * (on 2954e8c: 1.79 M log lines in 8 s). Its log lines: 5, then one in 5 s,
 * and a summary every 10 s. */
static void attack_error_flood(const char *ep, const char *log, const char *db)
{
    peer_t p = peer_new("c3", 200);
    procs_secure_client(p.sock, "c3");
    zmq_connect(p.sock, ep);
    int v;
    CHECK(peer_event(&p, 10, &v) == ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
    long lines = log_lines(log);
    int rounds = procs_committed_rounds(db);
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    Fedmoe__Error e = FEDMOE__ERROR__INIT;
    e.code = 1;
    e.text = "flood";
    env.body_case = FEDMOE__ENVELOPE__BODY_ERROR;
    env.error = &e;
    double t0 = fm_clock_seconds();
    int sent = 0;
    for (int i = 0; i < 100000; i++)
        sent += procs_send_env(p.sock, &env) == 0;
    usleep(4000000); /* it reads them */
    newcomer_welcomed(ep, 201, 5.0);
    double seconds = fm_clock_seconds() - t0;
    long mine = log_lines_with(log, "client c3"), added = log_lines(log) - lines;
    fprintf(stderr, "  100,000 error reports in %.1f s: %ld log lines about c3, %ld in all; rounds %d -> %d\n",
            seconds, mine, added, rounds, procs_committed_rounds(db));
    peer_free(&p);
    CHECK(sent > 90000);
    CHECK(mine <= 5 + (long)(seconds / 5.0) + 1);
    CHECK(added <= 40 + (long)(seconds * 4.0)); /* the honest run's own lines and a summary */
    CHECK(procs_committed_rounds(db) > rounds); /* rounds went on meanwhile */
}

/* Key c6 sends messages just under the largest allowed, built to decode large
 * (a Heartbeat and ~930,000 unknown fields, 3 bytes each: 29x its size when
 * decoded), as fast as 4 connections take them for 6 s (on 2954e8c such
 * messages on 8 connections held +1.47 GB and stopped every round; on 8573f77,
 * refused unread, they slowed the rounds 2.5x: libzmq decrypted all it could
 * send). Its first 4 are refused, then its key is held: its connections
 * closed, the rest dropped unread. Rounds go on within twice their time;
 * memory stays flat. */
static void attack_costly_messages(const char *ep, const char *log, const char *db, pid_t server, double normal)
{
    enum { N = 4 };
    peer_t p[N];
    for (int i = 0; i < N; i++) {
        char rid[16];
        snprintf(rid, sizeof rid, "c6-%d", i);
        p[i] = peer_new(rid, 400 + i);
        procs_secure_client(p[i].sock, "c6");
        zmq_connect(p[i].sock, ep);
    }
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    Fedmoe__Heartbeat hb = FEDMOE__HEARTBEAT__INIT;
    env.body_case = FEDMOE__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    env.protocol_version = FM_PROTOCOL_VERSION;
    size_t big = 2800000, len = fedmoe__envelope__get_packed_size(&env);
    uint8_t *buf = malloc(big);
    fedmoe__envelope__pack(&env, buf);
    while (len + 3 <= big) { /* field 1000, varint 0 */
        buf[len++] = 0xc0;
        buf[len++] = 0x3e;
        buf[len++] = 0x00;
    }
    peer_t quiet = peer_new("c6-quiet", 404); /* (connected before the hold, silent until after it) */
    procs_secure_client(quiet.sock, "c6");
    zmq_connect(quiet.sock, ep);
    int ev;
    CHECK(peer_event(&quiet, 10, &ev) == ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
    int rounds = procs_committed_rounds(db);
    long rss0 = procs_rss_kb(server), peak = rss0;
    double t0 = fm_clock_seconds();
    long sent = 0;
    double window = normal * 4.0 > 6.0 ? normal * 4.0 : 6.0; /* (four ordinary rounds at least) */
    while (fm_clock_seconds() - t0 < window) {
        for (int i = 0; i < N; i++)
            sent += zmq_send(p[i].sock, buf, len, ZMQ_DONTWAIT) == (int)len;
        long now = procs_rss_kb(server);
        peak = now > peak ? now : peak;
        usleep(2000);
    }
    for (int i = 0; i < 20; i++) {
        long now = procs_rss_kb(server);
        peak = now > peak ? now : peak;
        usleep(100000);
    }
    /* a connection of the key that had not spoken when the hold began: its
     * first message is dropped and the connection closed */
    for (int i = 0; i < 20; i++)
        zmq_send(quiet.sock, buf, len, ZMQ_DONTWAIT);
    bool quiet_closed = false;
    for (int i = 0; i < 100 && !(quiet_closed = procs_log_has(log, "its key is held: it sent messages")); i++)
        usleep(100000);
    peer_free(&quiet);
    newcomer_welcomed(ep, 410, 10.0);
    int after = procs_committed_rounds(db);
    fprintf(stderr, "  %ld costly messages of 2.8 MB on 4 connections in %.0f s: coordinator RSS %ld -> peak %ld kB; "
                    "rounds %d -> %d\n", sent, window, rss0, peak, rounds, after);
    for (int i = 0; i < N; i++)
        peer_free(&p[i]);
    free(buf);
    double during = median_round(db, rounds);
    fprintf(stderr, "  rounds during it: median %.2f s (%.1fx the %.2f s before the attacks)\n", during,
            normal > 0 ? during / normal : 0.0, normal);
    CHECK(procs_log_has(log, "would take"));
    CHECK(procs_log_has(log, "client c6 sent more messages that could not be read than it may: its key is held"));
    CHECK(quiet_closed);
    CHECK(after > rounds);
    CHECK(during <= 2.0 * normal + 0.5); /* (the goal: within twice their normal time; 0.5 s for a round's jitter) */
#ifndef __SANITIZE_ADDRESS__ /* (AddressSanitizer's quarantine makes RSS no measure) */
    CHECK(peak - rss0 < 256 * 1024);
#endif
}

/* Key `id` opens 16 connections by hand (zmtp.h: libzmq never sends part
 * of a message) and on each sends 256 KiB frames of one message, never its
 * last, up to just under what one connection may hold undelivered; with
 * `hello`, each says Hello first. (On 2954e8c, 40 such connections held +238
 * MB; 16 would hold 100 MB.) What the coordinator holds stays within what one
 * key's connections may hold: 4 that have spoken, or as many as want of those
 * that have not, from one address, together as much as 4; rounds go on. */
static void attack_unfinished_multipart(const char *ep, const char *log, const char *db, pid_t server,
                                        const char *id, bool hello)
{
    enum { N = 16 };
    char path[512], skey[512], spub[512], allow[512];
    fm_key_t own, coord;
    procs_server_keys(skey, spub, allow);
    CHECK(fm_key_read(procs_client_key(id, path), true, &own) == FM_OK);
    CHECK(fm_key_read(spub, false, &coord) == FM_OK);
    int port = atoi(strrchr(ep, ':') + 1);
    long backlog = 2 * procs_max_message(log) + (1L << 20), each = backlog - (512L << 10);
    CHECK(backlog > (1L << 20)); /* (the log said its largest message) */
    size_t frame = 256u << 10;
    uint8_t *junk = calloc(1, frame);
    static zmtp_curve_t z[N];
    int rounds = procs_committed_rounds(db), made = 0;
    long rss0 = procs_rss_kb(server), peak = rss0;
    long long sent = 0;
    double t0 = fm_clock_seconds();
    for (int i = 0; i < N; i++) {
        char rid[16];
        snprintf(rid, sizeof rid, "%s-%d", id, i);
        /* (a key's handshakes past 8 are put off, one let through in 2 s: tried again) */
        bool up = false;
        for (double w = fm_clock_seconds(); !up && fm_clock_seconds() - w < 10.0;)
            if (!(up = zmtp_curve_connect(&z[i], port, rid, own.public_z85, own.secret_z85, coord.public_z85)))
                usleep(500000);
        if (!up)
            continue;
        made++;
        struct timeval tv = {2, 0}; /* (a send that waits longer: the connection was shut) */
        setsockopt(z[i].fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (hello) {
            Fedmoe__Envelope env;
            Fedmoe__Hello h;
            procs_hello(&env, &h, id, -1, 0);
            env.protocol_version = FM_PROTOCOL_VERSION;
            size_t len = fedmoe__envelope__get_packed_size(&env);
            uint8_t *buf = malloc(len);
            fedmoe__envelope__pack(&env, buf);
            zmtp_curve_send(&z[i], buf, len, false);
            free(buf);
            usleep(20000); /* (its Hello read before its parts arrive) */
        }
        for (long part = 0; part + (long)frame <= each && zmtp_curve_send(&z[i], junk, frame, true); part += frame)
            sent += frame;
        long now = procs_rss_kb(server);
        peak = now > peak ? now : peak;
    }
    for (int i = 0; i < 20; i++) { /* (the checks run every 50 ms) */
        long now = procs_rss_kb(server);
        peak = now > peak ? now : peak;
        usleep(100000);
    }
    newcomer_welcomed(ep, hello ? 720 : 710, 10.0);
    for (int w = 0; w < 100 && procs_committed_rounds(db) <= rounds; w++)
        usleep(100000);
    int after = procs_committed_rounds(db);
    fprintf(stderr, "  16 connections of one key%s, each with an unfinished message of %ld kB: %d made, %lld MB sent in "
                    "%.1f s; coordinator RSS %ld -> peak %ld kB (one connection may hold %ld kB); rounds %d -> %d\n",
            hello ? " after a Hello" : "", each >> 10, made, sent >> 20, fm_clock_seconds() - t0, rss0, peak,
            backlog >> 10, rounds, after);
    for (int i = 0; i < N; i++)
        zmtp_curve_close(&z[i]);
    free(junk);
    CHECK(made >= 12);
    CHECK(after > rounds);
#ifndef __SANITIZE_ADDRESS__ /* (AddressSanitizer's quarantine makes RSS no measure) */
    /* 4 connections' worth, one more arriving between two checks, and slack
     * (16 connections unbounded: 16 of them) */
    CHECK((peak - rss0) * 1024 < 5 * backlog + (16L << 20));
#endif
}

/* Messages waiting on sock, read without waiting; the Tasks among them counted. */
static int tasks_waiting(void *sock)
{
    int tasks = 0;
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    while (zmq_poll(&it, 1, 0) > 0) {
        uint8_t *m;
        size_t len;
        Fedmoe__Envelope *e = NULL;
        if (fm_wire_recv(sock, 0, 1u << 30, &m, &len) != FM_OK)
            break;
        fm_wire_decode(m, len, 1u << 30, &e);
        free(m);
        tasks += e && e->body_case == FEDMOE__ENVELOPE__BODY_TASK;
        if (e)
            fm_wire_free(e);
    }
    return tasks;
}

/* Key c7, on data of its own, is selected and never uploads, saying Hello
 * every 0.2 s and heartbeating for 30 s (on 2954e8c each Hello sent its whole
 * Task again, and cancelled its sitting out: 8 of 16 rounds waited the full
 * timeout). Its Task goes again at most once a round; after two rounds that
 * waited for it, it sits out. */
static void attack_silent_participant(const char *ep, const char *db, double timeout, double normal)
{
    peer_t p = peer_new("c7", 500);
    procs_secure_client(p.sock, "c7");
    zmq_connect(p.sock, ep);
    int r0 = procs_committed_rounds(db), tasks = 0;
    double t0 = fm_clock_seconds(), window = normal * 20.0 > 30.0 ? normal * 20.0 : 30.0;
    while (fm_clock_seconds() - t0 < window) {
        Fedmoe__Envelope env;
        Fedmoe__Hello h;
        procs_hello(&env, &h, "c7", -1, 300);
        procs_send_env(p.sock, &env);
        procs_heartbeat(p.sock);
        usleep(200000);
        tasks += tasks_waiting(p.sock);
    }
    int r1 = procs_committed_rounds(db), waited = 0;
    sqlite3 *h;
    sqlite3_stmt *q;
    if (sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
        sqlite3_prepare_v2(h, "SELECT COUNT(*) FROM rounds WHERE round > ? AND round <= ? AND seconds >= ?", -1, &q,
                           NULL) == SQLITE_OK) {
        sqlite3_bind_int(q, 1, r0);
        sqlite3_bind_int(q, 2, r1);
        sqlite3_bind_double(q, 3, timeout - 0.5);
        if (sqlite3_step(q) == SQLITE_ROW)
            waited = sqlite3_column_int(q, 0);
        sqlite3_finalize(q);
    }
    sqlite3_close(h);
    fprintf(stderr, "  a participant that never uploads, saying Hello every 0.2 s for %.0f s: %d Tasks sent to it; "
                    "%d of %d rounds waited the full %.0f s for it\n",
            window, tasks, waited, r1 - r0, timeout);
    peer_free(&p);
    CHECK(tasks <= 2 * (r1 - r0) + 2);
    /* two, then it sits out 1, 2, 4 ... rounds (its Hellos do not end that) */
    CHECK(waited <= 3 + (int)log2(r1 - r0 + 1.0));
    CHECK(r1 - r0 >= waited + 2); /* and rounds went on without it */
}

/* Key c8 says Hello 20 times a second for 10 s, alternating between two
 * partitions (on 2954e8c: 0 of 6 rounds in 90 s, 583 k log lines): two
 * changes a minute are taken; the honest rounds go on; a few log lines. */
static void attack_alternating_hellos(const char *ep, const char *log, const char *db, double normal)
{
    peer_t p = peer_new("c8", 600);
    procs_secure_client(p.sock, "c8");
    zmq_connect(p.sock, ep);
    long lines = log_lines(log);
    int r0 = procs_committed_rounds(db);
    double t0 = fm_clock_seconds(), window = normal * 4.0 > 10.0 ? normal * 4.0 : 10.0;
    for (int i = 0; fm_clock_seconds() - t0 < window; i++) {
        Fedmoe__Envelope env;
        Fedmoe__Hello h;
        procs_hello(&env, &h, "c8", 6 + i % 2, 0);
        procs_send_env(p.sock, &env);
        usleep(50000);
        tasks_waiting(p.sock);
    }
    long mine = log_lines_with(log, "client c8"), added = log_lines(log) - lines;
    int r1 = procs_committed_rounds(db);
    fprintf(stderr, "  Hellos alternating between two partitions, 20 a second for %.0f s: %ld log lines about c8, %ld in "
                    "all; rounds %d -> %d\n",
            window, mine, added, r0, r1);
    peer_free(&p);
    CHECK(mine <= 3 + 5 + (long)(window / 5.0) + 2); /* joined, two changes; refusals: 5, then one in 5 s */
    CHECK(r1 > r0);
}

/* Key c9, on data of its own, declares 2^40 test examples and reports every one
 * right (on 2954e8c the logged round accuracy became 100%, the honest 18.4%):
 * in the round's sums it weighs --max-weight examples at most (by default the
 * run's largest partition, here under twice the honest clients' own). */
static void attack_forged_counts(const char *ep, const char *db)
{
    peer_t p = peer_new("c9", 700);
    procs_secure_client(p.sock, "c9");
    zmq_connect(p.sock, ep);
    Fedmoe__Envelope env, *e = NULL;
    Fedmoe__Hello h;
    procs_hello(&env, &h, "c9", -1, 300);
    h.val_samples = 75;
    h.test_samples = 1ull << 40;
    procs_send_env(p.sock, &env);
    for (double t0 = fm_clock_seconds(); !e && fm_clock_seconds() - t0 < 30.0;) {
        procs_heartbeat(p.sock);
        e = procs_recv_kind(p.sock, FEDMOE__ENVELOPE__BODY_TASK, 0.5, NULL, NULL);
    }
    CHECK(e != NULL);
    if (!e) {
        peer_free(&p);
        return;
    }
    uint32_t n = e->task->model[0]->shape[1], round = e->task->round;
    float *vec = malloc(sizeof(float) * n), prompt[256] = {0};
    CHECK(fm_wire_tensor_get(e->task->model[0], "model", 1, n, vec) == FM_OK);
    Fedmoe__Metrics m = FEDMOE__METRICS__INIT;
    m.train_loss = 1.0f;
    m.val_samples = m.val_correct = 75;
    m.test_samples = m.test_correct = 1ull << 40;
    m.test_accuracy = 1.0f;
    CHECK(procs_send_update_metrics(p.sock, round, e->task->nonce.data, vec, n, prompt, 300, &m) == 0);
    free(vec);
    fm_wire_free(e);
    for (double t0 = fm_clock_seconds(); procs_committed_rounds(db) < (int)round && fm_clock_seconds() - t0 < 30.0;)
        usleep(100000);
    peer_free(&p); /* (gone: the rounds it is chosen for wait the client timeout, then it sits out) */
    /* the round's logged accuracy, its honest clients' counts, and the largest honest partition */
    double acc = -1.0, hc = 0.0, ht = 0.0, largest = 0.0;
    char c9[16] = "";
    sqlite3 *db3;
    sqlite3_stmt *q;
    if (sqlite3_open_v2(db, &db3, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK) {
        if (sqlite3_prepare_v2(db3, "SELECT test_accuracy FROM rounds WHERE round = ?", -1, &q, NULL) == SQLITE_OK) {
            sqlite3_bind_int(q, 1, (int)round);
            if (sqlite3_step(q) == SQLITE_ROW)
                acc = sqlite3_column_double(q, 0);
            sqlite3_finalize(q);
        }
        if (sqlite3_prepare_v2(db3, "SELECT client_id, status, test_correct, test_samples FROM client_rounds WHERE round = ?",
                               -1, &q, NULL) == SQLITE_OK) {
            sqlite3_bind_int(q, 1, (int)round);
            while (sqlite3_step(q) == SQLITE_ROW) {
                const char *id = (const char *)sqlite3_column_text(q, 0);
                if (!strcmp(id, "c9"))
                    snprintf(c9, sizeof c9, "%s", (const char *)sqlite3_column_text(q, 1));
                else if (!strcmp((const char *)sqlite3_column_text(q, 1), "completed")) {
                    hc += sqlite3_column_double(q, 2);
                    ht += sqlite3_column_double(q, 3);
                }
            }
            sqlite3_finalize(q);
        }
        if (sqlite3_prepare_v2(db3, "SELECT MAX(train_samples) FROM clients WHERE id IN ('c0', 'c1')", -1, &q,
                               NULL) == SQLITE_OK) {
            if (sqlite3_step(q) == SQLITE_ROW)
                largest = sqlite3_column_double(q, 0);
            sqlite3_finalize(q);
        }
        sqlite3_close(db3);
    }
    double cap = 2.0 * largest, bound = ht + cap > 0 ? (hc + cap) / (ht + cap) : 1.0;
    fprintf(stderr, "  2^40 test examples declared, all right: round %u logged %.2f%% (its update %s; the honest "
                    "clients %.2f%%; at most %.2f%% if it weighs twice their largest partition)\n",
            round, 100.0 * acc, c9[0] ? c9 : "not logged", ht > 0 ? 100.0 * hc / ht : 0.0, 100.0 * bound);
    CHECK(!strcmp(c9, "completed"));
    CHECK(acc >= 0.0 && acc <= bound + 1e-9 && acc < 0.995);
}

/* A relay that passes what the coordinator sends at once and what its client
 * sends at `rate` bytes a second after the first `fast` bytes (the handshake
 * and the Hello): a drip, from an allowed key. */
typedef struct {
    int listen_fd, port, target_port;
    size_t fast;
    double rate;
    volatile int stop;
} relay_t;

static void *relay_run(void *arg)
{
    relay_t *r = arg;
    int a = accept(r->listen_fd, NULL, NULL);
    int b = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)r->target_port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (a < 0 || b < 0 || connect(b, (struct sockaddr *)&sa, sizeof sa) != 0)
        return NULL;
    size_t up = 0;
    double t0 = 0.0;
    char buf[65536];
    while (!r->stop) {
        struct pollfd pf[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
        if (poll(pf, 2, 20) < 0)
            break;
        if (pf[1].revents & (POLLIN | POLLHUP | POLLERR)) {
            ssize_t n = recv(b, buf, sizeof buf, 0);
            if (n <= 0)
                break; /* the coordinator shut it */
            if (send(a, buf, (size_t)n, MSG_NOSIGNAL) != n)
                break;
        }
        if (pf[0].revents & POLLIN) {
            size_t room = sizeof buf;
            if (up >= r->fast) {
                if (t0 == 0.0)
                    t0 = fm_clock_seconds();
                double allowed = r->fast + (fm_clock_seconds() - t0) * r->rate;
                room = allowed > (double)up ? (size_t)(allowed - (double)up) : 0;
                room = room > sizeof buf ? sizeof buf : room;
            } else {
                room = r->fast - up < room ? r->fast - up : room;
            }
            if (room == 0)
                continue;
            ssize_t n = recv(a, buf, room, 0);
            if (n <= 0 || send(b, buf, (size_t)n, MSG_NOSIGNAL) != n)
                break;
            up += (size_t)n;
        }
    }
    close(a);
    close(b);
    return NULL;
}

/* Key c4 says Hello, then sends a 1 MB message at 2 KB/s through the relay (on
 * 2954e8c such drips were never dropped, 72 of them stopped every round): the
 * coordinator shuts the connection once it has gone past its silence limit
 * without a complete message. */
static void attack_drip(const char *ep, const char *log)
{
    relay_t r = {.fast = 16384, .rate = 2048.0, .target_port = atoi(strrchr(ep, ':') + 1)};
    r.listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sa;
    assert_int_equal(bind(r.listen_fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(r.listen_fd, 4), 0);
    getsockname(r.listen_fd, (struct sockaddr *)&sa, &sl);
    r.port = ntohs(sa.sin_port);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, relay_run, &r), 0);
    peer_t p = peer_new("c4", 300);
    int never = 0;
    zmq_setsockopt(p.sock, ZMQ_RECONNECT_IVL, &never, sizeof never);
    procs_secure_client(p.sock, "c4");
    char rep[64];
    snprintf(rep, sizeof rep, "tcp://127.0.0.1:%d", r.port);
    zmq_connect(p.sock, rep);
    CHECK(peer_hello(p.sock, "c4", 10.0) == FEDMOE__ENVELOPE__BODY_WELCOME);
    size_t big = 1u << 20; /* (under the largest message: a larger frame is shut by libzmq at its header) */
    uint8_t *junk = calloc(1, big);
    zmq_send(p.sock, junk, big, ZMQ_DONTWAIT);
    free(junk);
    double t0 = fm_clock_seconds(), cut = 0.0;
    while (cut == 0.0 && fm_clock_seconds() - t0 < 60.0) {
        if (procs_log_has(log, "without a complete message (a message must arrive"))
            cut = fm_clock_seconds() - t0;
        usleep(200000);
    }
    if (cut > 0.0)
        fprintf(stderr, "  a drip at 2 KB/s after a Hello: connection shut after %.1f s\n", cut);
    else
        fprintf(stderr, "  a drip at 2 KB/s after a Hello: connection not shut in 60 s\n");
    r.stop = 1;
    pthread_join(th, NULL);
    close(r.listen_fd);
    peer_free(&p);
    CHECK(cut > 0.0 && cut < 30.0);
}

static void test_one_key_against_everyone(void **state)
{
    (void)state;
    char db[512], log[512], ep[64];
    procs_files("hostile", db, log);
    peer_endpoint(ep);
    procs_client_keys("c", 12); /* c0, c1 honest; c2-c4, c6-c11 attack; c5 a newcomer */
    /* (a run that outlasts the attacks; stopped at the end) */
    char *sargv[] = {BIN("server/fedmoe-server"), "--bind", ep, "--db", db, "--rounds", "1000", "--min-clients", "2",
                     "--partitions", "9", "--client-timeout", "5", "--round-timeout", "5", NULL};
    pid_t server = procs_spawn_server(sargv, log);
    for (int i = 0; i < 100 && !procs_log_has(log, "listening on"); i++)
        usleep(50000);
    pid_t c[2];
    for (int i = 0; i < 2; i++) {
        char id[16], clog[512];
        snprintf(id, sizeof id, "c%d", i);
        snprintf(clog, sizeof clog, "%s/hostile-c%d.log", dir, i);
        char *cargv[] = {BIN("client/fedmoe-client"), "--connect", ep, "--id", id, "--state-dir", dir, NULL};
        c[i] = procs_spawn_client(cargv, clog);
    }
    for (int i = 0; i < 200 && procs_committed_rounds(db) < 1; i++)
        usleep(100000);
    for (int i = 0; i < 200 && procs_committed_rounds(db) < 3; i++)
        usleep(100000);
    int base = procs_fd_count(server), r = procs_committed_rounds(db);
    long rss0 = procs_rss_kb(server);
    double normal = median_round(db, 0);
    fprintf(stderr, "  before the attacks: %d rounds, median round %.2f s\n", r, normal);
    attack_many_connections(ep, log, server, base);
    rounds_during(db, &r, normal, true);
    attack_error_flood(ep, log, db);
    rounds_during(db, &r, normal, true);
    attack_drip(ep, log);
    rounds_during(db, &r, normal, true);
    attack_costly_messages(ep, log, db, server, normal);
    rounds_during(db, &r, normal, true);
    attack_unfinished_multipart(ep, log, db, server, "c10", false);
    rounds_during(db, &r, normal, true);
    attack_unfinished_multipart(ep, log, db, server, "c11", true);
    rounds_during(db, &r, normal, true);
    attack_silent_participant(ep, db, 5.0, normal);
    rounds_during(db, &r, normal, false); /* (it makes rounds wait for it: judged above) */
    attack_alternating_hellos(ep, log, db, normal);
    rounds_during(db, &r, normal, true);
    attack_forged_counts(ep, db);
    rounds_during(db, &r, normal, true);
    long rss1 = procs_rss_kb(server);
    fprintf(stderr, "  coordinator RSS %ld -> %ld kB over the attacks\n", rss0, rss1);
#ifndef __SANITIZE_ADDRESS__ /* (AddressSanitizer's quarantine makes RSS no measure) */
    CHECK(rss1 - rss0 < 64 * 1024);
#endif
    int rounds = procs_committed_rounds(db);
    fprintf(stderr, "  rounds committed during the attacks: %d\n", rounds);
    /* stopped (resumable): the coordinator exits 0; the clients would wait for it */
    kill(server, SIGTERM);
    int server_exit = procs_wait(server, 60);
    for (int i = 0; i < 2; i++) {
        kill(c[i], SIGTERM);
        procs_wait(c[i], 30);
    }
    if (procs_measure_only())
        return;
    assert_int_equal(server_exit, 0);
    assert_true(rounds > 20 && rounds < 1000); /* the run went on through the attacks */
    /* both honest clients completed every committed round; the only others in
     * the rounds are c7 (selected, silent) and c9 (its forged counts, then gone) */
    sqlite3 *h;
    sqlite3_stmt *q;
    assert_int_equal(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(h, "SELECT client_id, status FROM client_rounds", -1, &q, NULL), SQLITE_OK);
    int honest = 0, committed = procs_committed_rounds(db);
    while (sqlite3_step(q) == SQLITE_ROW) {
        const char *id = (const char *)sqlite3_column_text(q, 0), *status = (const char *)sqlite3_column_text(q, 1);
        if (!strcmp(id, "c0") || !strcmp(id, "c1")) {
            assert_string_equal(status, "completed");
            honest++;
        } else {
            assert_true(!strcmp(id, "c7") || !strcmp(id, "c9"));
        }
    }
    sqlite3_finalize(q);
    sqlite3_close(h);
    assert_int_equal(honest, 2 * committed);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_key_against_everyone),
    };
    return procs_run_tests("hostile", tests, sizeof tests / sizeof tests[0], dir, sizeof dir);
}
