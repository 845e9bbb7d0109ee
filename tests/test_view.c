/* The browser view's JSON API (fedmoe-history serve, docs/http.md) over real
 * HTTP against round logs made by real runs: every endpoint, pagination and
 * sorting, a run still being written (rounds appear through ?since= while the
 * coordinator commits them), bad parameters (400s naming the parameter),
 * unknown runs, rounds, clients and paths (404s), writes refused (405), a
 * token required beyond loopback (401 without it), a missing database, a
 * non-loopback address without a token and an unfit token file refused at
 * start in one line. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "procs.h"

static char dir[256];
static const char *auth; /* a header line every request carries, or NULL */

/* GET (or another method) path from 127.0.0.1:port: the body (malloc'd;
 * NULL when nothing answers) and the status (0 when nothing answers) */
static char *http(int port, const char *method, const char *path, int *status)
{
    *status = 0;
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
        if (s >= 0)
            close(s);
        return NULL;
    }
    char req[1024];
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.0\r\nHost: localhost\r\n%s%s\r\n", method, path,
                     auth ? auth : "", auth ? "\r\n" : "");
    assert_int_equal(write(s, req, (size_t)n), n);
    size_t len = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    ssize_t got;
    while ((got = read(s, buf + len, cap - len - 1)) > 0) {
        len += (size_t)got;
        if (len + 1 == cap)
            buf = realloc(buf, cap *= 2);
    }
    close(s);
    buf[len] = 0;
    sscanf(buf, "HTTP/1.%*d %d", status);
    char *start = strstr(buf, "\r\n\r\n");
    char *body = strdup(start ? start + 4 : "");
    free(buf);
    return body;
}

/* GET path expecting status; the body (the caller frees it). */
static char *get(int port, const char *path, int status)
{
    int got;
    char *body = http(port, "GET", path, &got);
    if (got != status)
        fail_msg("GET %s: %d (expected %d): %s", path, got, status, body ? body : "");
    return body;
}

static int count(const char *s, const char *what)
{
    int n = 0;
    for (const char *p = strstr(s, what); p; p = strstr(p + 1, what))
        n++;
    return n;
}

/* The value of the first "key": number after from. */
static double num(const char *from, const char *key)
{
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(from, k);
    assert_non_null(p);
    return strtod(p + strlen(k), NULL);
}

/* fedmoe-history serve of db on port (on all addresses with token_file) */
static pid_t serve_with(const char *db, int port, const char *token_file)
{
    char listen[64], log[512];
    snprintf(listen, sizeof listen, "%s:%d", token_file ? "0.0.0.0" : "127.0.0.1", port);
    snprintf(log, sizeof log, "%s/serve-%d.log", dir, port);
    char *argv[] = {BIN("server/fedmoe-history"), "--db", (char *)db, "serve", "--listen", listen,
                    token_file ? "--token-file" : NULL, (char *)token_file, NULL};
    pid_t pid = procs_spawn(argv, log);
    for (int i = 0; i < 100; i++) {
        int status;
        char *body = http(port, "GET", "/api/runs", &status);
        free(body);
        if (status)
            break;
        usleep(50 * 1000);
    }
    return pid;
}

static pid_t serve(const char *db, int port) { return serve_with(db, port, NULL); }

static void stop(pid_t pid)
{
    kill(pid, SIGTERM);
    assert_int_equal(procs_wait(pid, 10.0), 0);
}

static void sim(const char *db, const char *strategy, int rounds, const char *tag)
{
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd, "%s --clients 3 --rounds %d --strategy %s --db %s --workdir %s/%s 2>&1",
             BIN("client/fedmoe-sim"), rounds, strategy, db, dir, tag);
    int rc = procs_capture(cmd, &out);
    if (rc != 0)
        fail_msg("%s", out);
    free(out);
}

/* Bad parameters (400 naming them), unknown things (404), writes (405). */
static void refusals(int port, const char *run)
{
    char path[512];
    char *b;
    const char *bad[][2] = {{"rounds?since=-1", "since"},          {"rounds?limit=0", "limit"},
                            {"rounds?limit=100000", "limit"},      {"rounds?since=2x", "since"},
                            {"rounds/2/clients?sort=zz", "sort"},  {"rounds/2/clients?order=up", "order"},
                            {"rounds/2/clients?offset=-3", "offset"}, {"rounds/abc/clients", "round"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(path, sizeof path, "/api/runs/%s/%s", run, bad[i][0]);
        b = get(port, path, 400);
        assert_non_null(strstr(b, bad[i][1]));
        free(b);
    }
    /* unknown things: 404 */
    const char *missing[] = {"/api/runs/run-none", "/api/runs/RUN/rounds/9/clients", "/api/runs/RUN/clients/nobody",
                             "/api/runs/RUN/teapot", "/etc/passwd", "/api/runs//rounds"};
    for (size_t i = 0; i < sizeof missing / sizeof missing[0]; i++) {
        char p[512];
        const char *r = strstr(missing[i], "RUN");
        if (r)
            snprintf(p, sizeof p, "%.*s%s%s", (int)(r - missing[i]), missing[i], run, r + 3);
        else
            snprintf(p, sizeof p, "%s", missing[i]);
        free(get(port, p, 404));
    }
    /* read-only */
    int status;
    free(http(port, "POST", "/api/runs", &status));
    assert_int_equal(status, 405);
    free(http(port, "DELETE", path, &status));
    assert_int_equal(status, 405);
}

static void test_endpoints(void **state)
{
    (void)state;
    char db[512], path[512], run[64];
    snprintf(db, sizeof db, "%s/view.db", dir);
    sim(db, "fedavg", 2, "a");
    sim(db, "comigs", 3, "b");
    int port = procs_free_port();
    pid_t srv = serve(db, port);
    char *b = get(port, "/api/runs", 200);
    assert_int_equal(count(b, "\"id\":"), 2);
    assert_non_null(strstr(b, "\"strategy\":\"fedavg\""));
    assert_int_equal(count(b, "\"status\":\"finished\""), 2);
    const char *second = strstr(b, "\"strategy\":\"comigs\"");
    assert_non_null(second);
    assert_int_equal((int)num(second, "round"), 3); /* its last round */
    const char *id = strstr(second - 200 > b ? second - 200 : b, "\"id\":\"run-");
    while (strstr(id + 1, "\"id\":\"run-") && strstr(id + 1, "\"id\":\"run-") < second)
        id = strstr(id + 1, "\"id\":\"run-");
    assert_int_equal(sscanf(id, "\"id\":\"%63[^\"]", run), 1);
    free(b);
    /* the run and its config */
    snprintf(path, sizeof path, "/api/runs/%s", run);
    b = get(port, path, 200);
    assert_non_null(strstr(b, "\"config\":{\"strategy\":\"comigs\""));
    free(b);
    /* rounds, incrementally and in pages */
    snprintf(path, sizeof path, "/api/runs/%s/rounds", run);
    b = get(port, path, 200);
    assert_int_equal(count(b, "\"round\":"), 3);
    assert_int_equal((int)num(b, "next_since"), 3);
    assert_non_null(strstr(b, "\"more\":false"));
    free(b);
    snprintf(path, sizeof path, "/api/runs/%s/rounds?since=1&limit=1", run);
    b = get(port, path, 200);
    assert_int_equal(count(b, "\"round\":"), 1);
    assert_int_equal((int)num(b, "round"), 2);
    assert_non_null(strstr(b, "\"more\":true"));
    free(b);
    /* a round's clients, sorted, in pages */
    snprintf(path, sizeof path, "/api/runs/%s/rounds/2/clients?sort=test_accuracy&order=desc", run);
    b = get(port, path, 200);
    assert_int_equal((int)num(b, "total"), 3);
    assert_int_equal(count(b, "\"client\":"), 3);
    double prev = 2.0;
    for (const char *p = strstr(b, "\"test_accuracy\":"); p; p = strstr(p + 1, "\"test_accuracy\":")) {
        double v = num(p, "test_accuracy");
        assert_true(v <= prev);
        prev = v;
    }
    /* the round's generalist share: its clients' weighted by their test examples */
    double gs = 0, gn = 0;
    for (const char *p = strstr(b, "{\"round\":"); p; p = strstr(p + 1, "{\"round\":")) {
        gs += num(p, "generalist_share") * num(p, "test_samples");
        gn += num(p, "test_samples");
    }
    free(b);
    snprintf(path, sizeof path, "/api/runs/%s/rounds?since=1&limit=1", run);
    b = get(port, path, 200);
    double share = num(b, "generalist_share");
    assert_true(gn > 0 && share > 0.0 && share < 1.0 && fabs(share - gs / gn) < 1e-6);
    free(b);
    snprintf(path, sizeof path, "/api/runs/%s/rounds/2/clients?offset=2&limit=5", run);
    b = get(port, path, 200);
    assert_int_equal(count(b, "\"client\":"), 1);
    assert_non_null(strstr(b, "\"client\":\"client-002\"")); /* (by client, ascending) */
    free(b);
    /* a client's history */
    snprintf(path, sizeof path, "/api/runs/%s/clients/client-001", run);
    b = get(port, path, 200);
    assert_int_equal(count(b, "\"status\":\"completed\""), 3);
    free(b);
    refusals(port, run);
    stop(srv);
}

/* A run being written: its rounds come through ?since= as they commit. */
static void test_live_run(void **state)
{
    (void)state;
    char db[512], cmd[1024], log[512], path[512], run[64] = "";
    snprintf(db, sizeof db, "%s/live.db", dir);
    snprintf(cmd, sizeof cmd, "%s/live", dir);
    snprintf(log, sizeof log, "%s/live-sim.log", dir);
    char *argv[] = {BIN("client/fedmoe-sim"), "--clients", "3", "--rounds", "6", "--db", db, "--workdir", cmd, NULL};
    pid_t simp = procs_spawn(argv, log);
    for (int i = 0; i < 600 && procs_committed_rounds(db) < 1; i++)
        usleep(50 * 1000);
    int port = procs_free_port();
    pid_t srv = serve(db, port);
    char *b = get(port, "/api/runs", 200);
    assert_int_equal(sscanf(strstr(b, "\"id\":\""), "\"id\":\"%63[^\"]", run), 1);
    assert_non_null(strstr(b, "\"status\":\"running\""));
    free(b);
    int since = 0, seen = 0, polls = 0;
    bool finished = false;
    while (!finished && polls++ < 1200) {
        snprintf(path, sizeof path, "/api/runs/%s/rounds?since=%d", run, since);
        b = get(port, path, 200);
        int n = count(b, "\"round\":");
        if (n > 0) {
            assert_int_equal((int)num(b, "round"), since + 1); /* the next round, none again */
            since = (int)num(b, "next_since");
            seen += n;
        }
        finished = strstr(b, "\"status\":\"finished\"") != NULL && n == 0;
        free(b);
        usleep(100 * 1000);
    }
    assert_true(finished);
    assert_int_equal(seen, 6);
    assert_int_equal(procs_wait(simp, 60.0), 0);
    stop(srv);
}

/* Beyond loopback only with a token: the API answers only requests that carry it. */
static void test_token(void **state)
{
    (void)state;
    char db[512], tok[512], cmd[1200];
    snprintf(db, sizeof db, "%s/view.db", dir);
    snprintf(tok, sizeof tok, "%s/token", dir);
    const char *token = "0123456789abcdef0123456789abcdef";
    FILE *f = fopen(tok, "w");
    assert_non_null(f);
    fprintf(f, "%s\n", token);
    fclose(f);
    /* a token file others can read is refused */
    assert_int_equal(chmod(tok, 0644), 0);
    snprintf(cmd, sizeof cmd, "%s --db %s serve --listen 0.0.0.0:%d --token-file %s", BIN("server/fedmoe-history"),
             db, procs_free_port(), tok);
    procs_expect_refusal(cmd, "readable by others");
    assert_int_equal(chmod(tok, 0600), 0);
    int port = procs_free_port();
    pid_t srv = serve_with(db, port, tok);
    int status;
    char *b = http(port, "GET", "/api/runs", &status);
    assert_int_equal(status, 401);
    assert_non_null(strstr(b, "token"));
    free(b);
    char path[256];
    snprintf(path, sizeof path, "/api/runs?token=%s", token);
    free(get(port, path, 200));
    snprintf(path, sizeof path, "/api/runs?token=%.31s", token); /* (one character short) */
    free(get(port, path, 401));
    free(get(port, "/", 200)); /* (the page itself holds no data) */
    char header[128];
    snprintf(header, sizeof header, "Authorization: Bearer %s", token);
    auth = header;
    b = get(port, "/api/runs", 200);
    assert_non_null(strstr(b, "\"runs\":["));
    free(b);
    auth = "Authorization: Bearer 0123456789abcdef0123456789abcdeX";
    free(get(port, "/api/runs", 401));
    auth = NULL;
    stop(srv);
}

static void test_refused_at_start(void **state)
{
    (void)state;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s --db %s/none.db serve", BIN("server/fedmoe-history"), dir);
    procs_expect_refusal(cmd, "no such database");
    snprintf(cmd, sizeof cmd, "%s --db %s/view.db serve --listen 0.0.0.0:%d", BIN("server/fedmoe-history"), dir,
             procs_free_port());
    procs_expect_refusal(cmd, "loopback only");
    snprintf(cmd, sizeof cmd, "%s --db %s/view.db serve --listen 127.0.0.1:99999", BIN("server/fedmoe-history"), dir);
    procs_expect_refusal(cmd, "port");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_endpoints),
        cmocka_unit_test(test_live_run),
        cmocka_unit_test(test_token),
        cmocka_unit_test(test_refused_at_start),
    };
    return procs_run_tests("view", tests, sizeof tests / sizeof tests[0], dir, sizeof dir);
}
