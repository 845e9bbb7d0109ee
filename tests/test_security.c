/* Attacks from the network on a real coordinator, with real CURVE keys on
 * loopback, while two honest clients train: a peer without a key, with a key not
 * in the allow-list, with an allowed key posing as another client, with a key
 * revoked or replaced (SIGHUP) while connected, and one flooding junk without
 * reading are all refused, and the run finishes with the honest clients'
 * rounds. A real client refuses a coordinator that does not hold the pinned
 * key, and stops with a clear line when its own key keeps being refused.
 * Against a plain (--insecure) coordinator: two connections with one routing
 * id, each sending a frame, then a TCP reset, repeated (the libzmq 4.3.4 abort
 * that ZMQ_ROUTER_HANDOVER allowed) leave it running. Control characters cannot
 * forge log lines; the open-file limit is raised and checked. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
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

#include "procs.h"

static char dir[256];

/* ---- a peer's view of its handshake ------------------------------------------- */

typedef struct {
    void *ctx, *sock, *mon;
} peer_t;

/* A DEALER with routing id `id`, its handshake events watched. */
static peer_t peer_new(const char *id, int n)
{
    peer_t p = {.ctx = zmq_ctx_new()};
    p.sock = zmq_socket(p.ctx, ZMQ_DEALER);
    zmq_setsockopt(p.sock, ZMQ_ROUTING_ID, id, strlen(id));
    int linger = 0;
    zmq_setsockopt(p.sock, ZMQ_LINGER, &linger, sizeof linger);
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://mon-%d", n);
    assert_int_equal(zmq_socket_monitor(p.sock, ep,
                                        ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                                            ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                            ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL),
                     0);
    p.mon = zmq_socket(p.ctx, ZMQ_PAIR);
    assert_int_equal(zmq_connect(p.mon, ep), 0);
    return p;
}

static void peer_free(peer_t *p)
{
    zmq_close(p->mon);
    zmq_close(p->sock);
    zmq_ctx_term(p->ctx);
}

/* The first handshake event within seconds (0 when none); its value in *value. */
static int handshake_event(peer_t *p, double seconds, int *value)
{
    zmq_pollitem_t it = {p->mon, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, (long)(seconds * 1000)) <= 0)
        return 0;
    uint8_t ev[6];
    char addr[256];
    int n = zmq_recv(p->mon, ev, sizeof ev, 0);
    zmq_recv(p->mon, addr, sizeof addr, 0);
    assert_int_equal(n, 6);
    uint16_t e;
    uint32_t v;
    memcpy(&e, ev, 2);
    memcpy(&v, ev + 2, 4);
    *value = (int)v;
    return e;
}

/* Sends a Hello as id; returns the kind of the coordinator's first answer
 * within seconds (Welcome, or Error when it was heard and refused), 0 when it
 * did not answer. */
static int hello_answer(void *sock, const char *id, double seconds)
{
    Fedmoe__Envelope env;
    Fedmoe__Hello h;
    procs_hello(&env, &h, id, -1, 0);
    int ms = 1000; /* a DEALER with no connection would wait to send for ever */
    zmq_setsockopt(sock, ZMQ_SNDTIMEO, &ms, sizeof ms);
    if (procs_send_env(sock, &env) != 0)
        return 0;
    Fedmoe__Envelope *e = procs_recv_kind(sock, 0, seconds, NULL, NULL);
    int kind = e ? (int)e->body_case : 0;
    if (e)
        fedmoe__envelope__free_unpacked(e, NULL);
    return kind;
}

/* ---- the attacks on a secure coordinator ------------------------------------ */

static const char *endpoint_of(char *buf)
{
    snprintf(buf, 64, "tcp://127.0.0.1:%d", procs_free_port());
    return buf;
}

/* A peer with no key (plain NULL), and one with a key the coordinator does not
 * know: both refused at the handshake. */
static void attack_without_allowed_key(const char *ep)
{
    peer_t p = peer_new("nokey", 1);
    zmq_connect(p.sock, ep);
    int v, e = handshake_event(&p, 10, &v);
    assert_true(e == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL || e == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL ||
                e == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
    assert_int_equal(hello_answer(p.sock, "nokey", 1.0), 0);
    peer_free(&p);

    p = peer_new("mallory", 2);
    fm_key_t mallory, server;
    char skey[512], spub[512], allow[512];
    procs_server_keys(skey, spub, allow);
    assert_int_equal(fm_key_generate(&mallory, "mallory"), FM_OK); /* not in the allow-list */
    assert_int_equal(fm_key_read(spub, false, &server), FM_OK);
    assert_int_equal(fm_key_apply_client(p.sock, &mallory, server.public_z85), FM_OK);
    zmq_connect(p.sock, ep);
    assert_int_equal(handshake_event(&p, 10, &v), ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
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
        assert_int_equal(handshake_event(&p, 10, &v), ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
        /* it is c2, whatever it calls itself: a Hello naming another id is refused */
        assert_int_equal(hello_answer(p.sock, claims[i], 10.0), FEDMOE__ENVELOPE__BODY_ERROR);
        peer_free(&p);
        char line[128];
        snprintf(line, sizeof line, "hello names client '%s' but the socket identity is 'c2'", claims[i]);
        assert_true(procs_log_has(log, line));
    }
}

/* The coordinator's resident memory in kB. */
static long rss_kb(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6))
            kb = atol(line + 6);
    if (f)
        fclose(f);
    return kb;
}

/* c3 sends 200,000 junk messages as fast as it can and never reads: every one
 * is refused with an Error, the replies it does not read are dropped past the
 * high-water mark, so the coordinator's memory stays flat (unbounded queues
 * once grew by 219 MB), and the log gets a bounded number of lines. */
static void attack_non_reading_peer(const char *ep, const char *log, const char *db, pid_t server)
{
    /* a steady baseline: once a round has run, the coordinator holds its round state */
    for (int i = 0; i < 600 && procs_committed_rounds(db) < 1; i++)
        usleep(100000);
    assert_true(procs_committed_rounds(db) >= 1);
    peer_t p = peer_new("c3", 8);
    int one = 1;
    zmq_setsockopt(p.sock, ZMQ_RCVHWM, &one, sizeof one); /* it reads next to nothing */
    procs_secure_client(p.sock, "c3");
    zmq_connect(p.sock, ep);
    int v;
    assert_int_equal(handshake_event(&p, 10, &v), ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
    long before = rss_kb(server);
    double t0 = fm_clock_seconds();
    int sent = 0;
    for (int i = 0; i < 200000; i++)
        sent += zmq_send(p.sock, "junk", 4, 0) == 4;
    assert_int_equal(sent, 200000);
    usleep(3000000); /* let it read them all */
    double seconds = fm_clock_seconds() - t0;
    long after = rss_kb(server);
    fprintf(stderr, "  non-reading peer: coordinator RSS %ld -> %ld kB\n", before, after);
#ifndef __SANITIZE_ADDRESS__ /* (AddressSanitizer's quarantine and redzones make RSS no measure) */
    assert_true(before > 0 && after - before < 8 * 1024); /* no bound: +12.9 MB after 100,000 */
#endif
    peer_free(&p);
    char cmd[700], *out;
    snprintf(cmd, sizeof cmd, "grep -c 'client c3:' %s", log);
    assert_int_equal(procs_capture(cmd, &out), 0);
    /* at most 20 a second over the flood (and the seconds it straddles) */
    assert_true(atol(out) <= (long)((seconds + 2.0) * 20.0));
    free(out);
    assert_true(procs_log_has(log, "more refusals in the last second were not logged"));
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
    assert_int_equal(handshake_event(&p, 10, &v), ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
    /* heard and answered (an Error: both partitions are taken by c0 and c1) */
    assert_int_equal(hello_answer(p.sock, "c2", 10.0), FEDMOE__ENVELOPE__BODY_ERROR);
    char skey[512], spub[512], allow[512], pub[600];
    procs_server_keys(skey, spub, allow);
    snprintf(pub, sizeof pub, "%s/c2.pub", allow);
    assert_int_equal(unlink(pub), 0);
    kill(server, SIGHUP);
    for (int i = 0; i < 100 && !procs_log_has(log, "reloaded: 3 client keys"); i++)
        usleep(100000);
    assert_true(procs_log_has(log, "reloaded: 3 client keys"));
    assert_int_equal(hello_answer(p.sock, "c2", 2.0), 0);
    assert_true(procs_log_has(log, "dropped a message from c2: its key was removed from the allow-list or replaced"));
    peer_free(&p);
    p = peer_new("c2", 6);
    procs_secure_client(p.sock, "c2");
    zmq_connect(p.sock, ep);
    assert_int_equal(handshake_event(&p, 10, &v), ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
    peer_free(&p);
    /* c3's key replaced by a new pair for c3 (a stolen key): the connection made
     * with the old key is no longer heard */
    p = peer_new("c3", 9);
    procs_secure_client(p.sock, "c3");
    zmq_connect(p.sock, ep);
    assert_int_equal(handshake_event(&p, 10, &v), ZMQ_EVENT_HANDSHAKE_SUCCEEDED);
    assert_int_not_equal(hello_answer(p.sock, "c3", 10.0), 0);
    char key[600];
    snprintf(pub, sizeof pub, "%s/c3.pub", allow);
    snprintf(key, sizeof key, "%s/c3.key", allow);
    assert_int_equal(unlink(pub), 0);
    assert_int_equal(unlink(key), 0);
    fm_key_t fresh;
    assert_int_equal(fm_key_generate(&fresh, "c3"), FM_OK);
    assert_int_equal(fm_key_write(&fresh, allow), FM_OK);
    kill(server, SIGHUP);
    for (int i = 0; i < 100 && !procs_log_has(log, "reloaded: 3 client keys") ; i++)
        usleep(100000);
    usleep(300000);
    assert_int_equal(hello_answer(p.sock, "c3", 2.0), 0);
    assert_true(procs_log_has(log, "dropped a message from c3: its key was removed from the allow-list or replaced"));
    peer_free(&p);
}

static void test_attacks_refused_honest_run_finishes(void **state)
{
    (void)state;
    char db[512], log[512], ep[64];
    procs_files("sec", db, log);
    endpoint_of(ep);
    procs_client_keys("c", 4); /* c0, c1 honest; c2, c3 used by the attacks */
    char *sargv[] = {BIN("server/fedmoe-server"), "--bind", ep, "--db", db, "--rounds", "12", "--min-clients", "2",
                     "--partitions", "2", NULL};
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
    assert_true(procs_committed_rounds(db) < 12); /* the attacks came while the run went on */
    assert_int_equal(procs_wait(server, 300), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(procs_wait(c[i], 30), 0);
    /* the run: 12 rounds, only the honest clients in them */
    fm_round_row_t *r;
    fm_client_round_row_t *cr;
    int nr, nc;
    procs_finished_run(db, &r, &nr, &cr, &nc);
    assert_int_equal(nr, 12);
    assert_int_equal(nc, 24);
    for (int i = 0; i < nc; i++) {
        assert_true(!strcmp(cr[i].client_id, "c0") || !strcmp(cr[i].client_id, "c1"));
        assert_string_equal(cr[i].status, "completed");
    }
    free(r);
    free(cr);
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
    endpoint_of(ep2);
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

/* ---- a plain coordinator under the handover attack ------------------------------ */

/* A ZMTP 3.0 peer written by hand on a raw TCP socket: NULL greeting, READY as a
 * DEALER with routing id `id`, one message frame. Returns the fd (or -1). */
static int zmtp_null_peer(int port, const char *id)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    uint8_t greet[64] = {0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0, 'N', 'U', 'L', 'L'};
    uint8_t cmd[128], *p = cmd + 2;
    size_t idn = strlen(id);
    *p++ = 5;
    memcpy(p, "READY", 5), p += 5;
    *p++ = 11;
    memcpy(p, "Socket-Type", 11), p += 11;
    *p++ = 0, *p++ = 0, *p++ = 0, *p++ = 6;
    memcpy(p, "DEALER", 6), p += 6;
    *p++ = 8;
    memcpy(p, "Identity", 8), p += 8;
    *p++ = 0, *p++ = 0, *p++ = 0, *p++ = (uint8_t)idn;
    memcpy(p, id, idn), p += idn;
    cmd[0] = 0x04;
    cmd[1] = (uint8_t)(p - cmd - 2);
    uint8_t msg[] = {0x00, 3, 'a', 'b', 'c'};
    uint8_t peer_greet[64];
    bool ok = write(fd, greet, sizeof greet) == (ssize_t)sizeof greet &&
              recv(fd, peer_greet, sizeof peer_greet, MSG_WAITALL) == (ssize_t)sizeof peer_greet &&
              write(fd, cmd, (size_t)(p - cmd)) == p - cmd && write(fd, msg, sizeof msg) == (ssize_t)sizeof msg;
    if (!ok) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Closes fd with a TCP reset. */
static void reset_close(int fd)
{
    struct linger l = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close(fd);
}

static void test_same_id_connections_with_resets(void **state)
{
    (void)state;
    char db[512], log[512], ep[64];
    procs_files("handover", db, log);
    int port = procs_free_port();
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", port);
    char *sargv[] = {BIN("server/fedmoe-server"), "--insecure", "--bind", ep, "--db", db, "--rounds", "1", NULL};
    pid_t server = procs_spawn(sargv, log);
    usleep(500000);
    int made = 0;
    for (int round = 0; round < 30; round++) {
        int a = zmtp_null_peer(port, "twin"), b = zmtp_null_peer(port, "twin");
        made += (a >= 0) + (b >= 0);
        usleep(20000);
        if (a >= 0)
            reset_close(a);
        usleep(5000);
        if (b >= 0)
            reset_close(b);
    }
    assert_true(made >= 50); /* the attack reached it */
    usleep(500000);
    assert_int_equal(kill(server, 0), 0); /* alive */
    /* and it serves: a client (plain, like the coordinator) is welcomed */
    peer_t p = peer_new("after", 7);
    zmq_connect(p.sock, ep);
    assert_int_equal(hello_answer(p.sock, "after", 10.0), FEDMOE__ENVELOPE__BODY_WELCOME);
    peer_free(&p);
    assert_true(procs_log_has(log, "INSECURE"));
    kill(server, SIGTERM);
    assert_int_equal(procs_wait(server, 30), 0);
}

/* Each connection holds a file descriptor: the coordinator raises its soft limit
 * to the hard one, and says so when even that is too low for the run. */
static void test_fd_limit_raised_and_checked(void **state)
{
    (void)state;
    const char *cases[][2] = {{"ulimit -Sn 100", "no warning"}, {"ulimit -n 100", "only 100 file descriptors"}};
    for (int i = 0; i < 2; i++) {
        char db[512], log[512], cmd[2048], *out;
        char tag[16];
        snprintf(tag, sizeof tag, "fd%d", i);
        procs_files(tag, db, log);
        snprintf(cmd, sizeof cmd,
                 "sh -c '%s; exec timeout -s TERM 2 %s --insecure --bind tcp://127.0.0.1:* --db %s --partitions 200' "
                 "2>&1",
                 cases[i][0], BIN("server/fedmoe-server"), db);
        procs_capture(cmd, &out);
        if (i == 0)
            assert_null(strstr(out, "file descriptors"));
        else
            assert_non_null(strstr(out, cases[i][1]));
        assert_non_null(strstr(out, "listening on")); /* it starts either way */
        free(out);
    }
}

/* The coordinator's open file descriptors. */
static int fd_count(pid_t pid)
{
    char cmd[128], *out;
    snprintf(cmd, sizeof cmd, "ls /proc/%d/fd | wc -l", (int)pid);
    procs_capture(cmd, &out);
    int n = atoi(out);
    free(out);
    return n;
}

/* A connection flood: 1,000 TCP connections that never say a word, against a
 * coordinator with --max-connections 100. Those past the cap are shut at once;
 * the rest hold a descriptor only until their handshake times out
 * (FM_WIRE_HANDSHAKE_MS); an allowed client is welcomed (once room frees). */
static void test_connection_flood(void **state)
{
    (void)state;
    char db[512], log[512], ep[64];
    procs_files("flood", db, log);
    endpoint_of(ep);
    procs_client_keys("c", 1);
    char *sargv[] = {BIN("server/fedmoe-server"), "--bind", ep, "--db", db, "--partitions", "2",
                     "--max-connections", "100", NULL};
    pid_t server = procs_spawn_server(sargv, log);
    int port = atoi(strrchr(ep, ':') + 1), base = 0;
    for (int i = 0; i < 100 && !procs_log_has(log, "listening on"); i++)
        usleep(50000);
    base = fd_count(server);
    enum { N = 1000 };
    static int fds[N];
    int open_n = 0;
    for (int i = 0; i < N; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        open_n += fds[i] >= 0 && connect(fds[i], (struct sockaddr *)&a, sizeof a) == 0;
    }
    assert_int_equal(open_n, N);
    int during = base; /* the most held at once (libzmq accepts them at its pace) */
    for (int i = 0; i < 20; i++) {
        usleep(100000);
        int now = fd_count(server);
        during = now > during ? now : during;
    }
    peer_t p = peer_new("c0", 40);
    procs_secure_client(p.sock, "c0");
    zmq_connect(p.sock, ep);
    assert_int_equal(hello_answer(p.sock, "c0", 15.0), FEDMOE__ENVELOPE__BODY_WELCOME);
    peer_free(&p);
    int after = during;
    for (int i = 0; i < 80 && after > base + 50; i++) {
        usleep(250000);
        after = fd_count(server);
    }
    fprintf(stderr, "  coordinator descriptors: %d before, at most %d with 1,000 silent connections, %d after the "
                    "handshake timeout\n",
            base, during, after);
    assert_true(during >= base + 50 && during <= base + 100 + 20); /* they held descriptors, up to the cap */
    assert_true(after <= base + 50); /* and were closed, while the peers kept them open */
    assert_true(procs_log_has(log, "refused: 100 connections open"));
    /* the count came back down with them: a new connection is let in at once */
    p = peer_new("c0", 41);
    procs_secure_client(p.sock, "c0");
    zmq_connect(p.sock, ep);
    assert_int_equal(hello_answer(p.sock, "c0", 3.0), FEDMOE__ENVELOPE__BODY_WELCOME);
    peer_free(&p);
    for (int i = 0; i < N; i++)
        close(fds[i]);
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
        cmocka_unit_test(test_client_refuses_rogue_coordinator),
        cmocka_unit_test(test_same_id_connections_with_resets),
        cmocka_unit_test(test_log_lines_cannot_be_forged),
        cmocka_unit_test(test_fd_limit_raised_and_checked),
        cmocka_unit_test(test_connection_flood),
    };
    return procs_run_tests("security", tests, sizeof tests / sizeof tests[0], dir, sizeof dir);
}
