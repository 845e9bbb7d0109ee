#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "procs.h"

#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include "coordinator.h"
#include "fedmoe/clock.h"
#include "fedmoe/keys.h"
#include "fedmoe/spawn.h"
#include "fedmoe/store.h"
#include "fedmoe/wire.h"


/* Every process a test started, so that none outlives a failed assertion. */
static pid_t g_started[1024];
static int g_nstarted;

static void kill_leftovers(void)
{
    for (int i = 0; i < g_nstarted; i++)
        if (g_started[i] > 0 && kill(g_started[i], SIGKILL) == 0)
            waitpid(g_started[i], NULL, 0);
    g_nstarted = 0;
}

pid_t procs_spawn(char *const argv[], const char *log)
{
    pid_t pid = fm_spawn_logged(argv, log, true);
    if (pid < 0)
        return -1;
    if (g_nstarted < (int)(sizeof g_started / sizeof g_started[0]))
        g_started[g_nstarted++] = pid;
    return pid;
}

static void forget(pid_t pid)
{
    for (int i = 0; i < g_nstarted; i++)
        if (g_started[i] == pid)
            g_started[i] = 0;
}

int procs_wait(pid_t pid, double seconds)
{
    forget(pid); /* reaped here either way: never signal a recycled pid */
    for (int i = 0; i < (int)(seconds * 20); i++) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        usleep(50000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

int procs_capture(const char *cmd, char **out)
{
    FILE *p = popen(cmd, "r");
    if (!p) {
        *out = strdup("");
        return -1;
    }
    size_t cap = 1 << 16, n = 0, got;
    *out = malloc(cap);
    while ((got = fread(*out + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (n + 1 == cap)
            *out = realloc(*out, cap *= 2);
    }
    (*out)[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int procs_count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

void procs_expect_refusal(const char *command, const char *says)
{
    char cmd[4096], *out;
    snprintf(cmd, sizeof cmd, "%s 2>&1", command);
    int rc = procs_capture(cmd, &out);
    if (rc == 0 || !strstr(out, says))
        fail_msg("'%s' exited %d saying: %s (expected: %s)", command, rc, out, says);
    assert_int_equal(procs_count_lines(out), 1);
    free(out);
}

int procs_committed_rounds(const char *db)
{
    fm_store_t *st;
    if (access(db, F_OK) != 0 || fm_store_open(&st, db, true) != FM_OK)
        return 0;
    fm_run_row_t run;
    bool found = false;
    int n = 0;
    if (fm_store_latest_run(st, &run, &found) == FM_OK && found) {
        n = run.rounds_done;
        fm_store_run_clear(&run);
    }
    fm_store_close(&st);
    return n;
}

bool procs_last_checkpoint_sha(const char *db, char out[65])
{
    fm_store_t *st;
    if (fm_store_open(&st, db, true) != FM_OK)
        return false;
    fm_run_row_t run;
    bool found = false, ok = false;
    if (fm_store_latest_run(st, &run, &found) == FM_OK && found) {
        fm_round_row_t *r;
        int n;
        if (fm_store_list_rounds(st, run.id, &r, &n) == FM_OK) {
            if (n > 0) {
                memcpy(out, r[n - 1].checkpoint_sha256, 65);
                ok = true;
            }
            free(r);
        }
        fm_store_run_clear(&run);
    }
    fm_store_close(&st);
    return ok;
}

static int on_row(void *user, int n, char **vals, char **cols)
{
    (void)cols;
    bool *ok = user;
    *ok = n == 1 && vals[0] && strcmp(vals[0], "ok") == 0;
    return 0;
}

bool procs_integrity_ok(const char *db)
{
    sqlite3 *h;
    if (sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        sqlite3_close(h);
        return false;
    }
    bool ok = false;
    sqlite3_exec(h, "PRAGMA integrity_check", on_row, &ok, NULL);
    sqlite3_close(h);
    return ok;
}

static char g_dir[256];

/* DIR/keys/SUB/ID.key, made (with its .pub) if missing. */
static const char *key_file(const char *sub, const char *id, char *out)
{
    char d[400];
    snprintf(d, sizeof d, "%s/keys", g_dir);
    mkdir(d, 0700);
    if (sub[0]) {
        snprintf(d, sizeof d, "%s/keys/%s", g_dir, sub);
        mkdir(d, 0700);
    }
    snprintf(out, 512, "%s/%s.key", d, id);
    fm_key_t k;
    if (access(out, F_OK) != 0) {
        assert_int_equal(fm_key_generate(&k, id), FM_OK);
        assert_int_equal(fm_key_write(&k, d), FM_OK);
    }
    return out;
}

const char *procs_client_key(const char *id, char *out) { return key_file("clients", id, out); }

void procs_client_keys(const char *prefix, int n)
{
    for (int i = 0; i < n; i++) {
        char id[64], path[512];
        snprintf(id, sizeof id, "%s%d", prefix, i);
        procs_client_key(id, path);
    }
}

void procs_server_keys(char *key, char *pub, char *allow)
{
    key_file("", "coordinator", key);
    snprintf(pub, 512, "%s/keys/coordinator.pub", g_dir);
    snprintf(allow, 512, "%s/keys/clients", g_dir);
    mkdir(allow, 0700);
}

void procs_secure_client(void *sock, const char *id)
{
    char path[512], skey[512], spub[512], allow[512];
    fm_key_t own, server;
    procs_server_keys(skey, spub, allow);
    assert_int_equal(fm_key_read(procs_client_key(id, path), true, &own), FM_OK);
    assert_int_equal(fm_key_read(spub, false, &server), FM_OK);
    assert_int_equal(fm_key_apply_client(sock, &own, server.public_z85), FM_OK);
}

void procs_secure_server(void *sock)
{
    char skey[512], spub[512], allow[512];
    fm_key_t own;
    procs_server_keys(skey, spub, allow);
    assert_int_equal(fm_key_read(skey, true, &own), FM_OK);
    assert_int_equal(fm_key_apply_server(sock, &own), FM_OK);
}

/* argv, then extra (both NULL-terminated), spawned. */
static pid_t spawn_with(char *const argv[], char *const extra[], const char *log)
{
    char *all[64];
    int n = 0;
    for (int i = 0; argv[i] && n < 48; i++)
        all[n++] = argv[i];
    for (int i = 0; extra[i] && n < 63; i++)
        all[n++] = extra[i];
    all[n] = NULL;
    return procs_spawn(all, log);
}

pid_t procs_spawn_server(char *const argv[], const char *log)
{
    char key[512], pub[512], allow[512];
    procs_server_keys(key, pub, allow);
    char *extra[] = {"--key", key, "--allow", allow, NULL};
    return spawn_with(argv, extra, log);
}

pid_t procs_spawn_client(char *const argv[], const char *log)
{
    const char *id = NULL;
    for (int i = 1; argv[i] && argv[i + 1]; i++)
        if (!strcmp(argv[i], "--id"))
            id = argv[i + 1];
    assert_non_null(id);
    char key[512], skey[512], pub[512], allow[512];
    procs_server_keys(skey, pub, allow);
    procs_client_key(id, key);
    char *extra[] = {"--key", key, "--server-key", pub, NULL};
    return spawn_with(argv, extra, log);
}

int procs_run_tests(const char *name, const struct CMUnitTest *tests, size_t n, char *dir, size_t dircap)
{
    snprintf(dir, dircap, "/tmp/fedmoe-test-%s-XXXXXX", name);
    if (!mkdtemp(dir))
        return 1;
    snprintf(g_dir, sizeof g_dir, "%s", dir);
    signal(SIGPIPE, SIG_IGN);
    if (getenv("FM_TEST_ONLY")) /* FM_TEST_ONLY=PATTERN runs the tests whose names match (cmocka's * and ?) */
        cmocka_set_test_filter(getenv("FM_TEST_ONLY"));
    int rc = _cmocka_run_group_tests(name, tests, n, NULL, NULL);
    kill_leftovers();
    if (rc == 0 && !getenv("FM_TEST_KEEP")) { /* FM_TEST_KEEP=1 keeps the logs of a passing run */
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0)
            rc = 1;
    } else {
        fprintf(stderr, "logs kept in %s\n", dir);
    }
    return rc;
}

void procs_heartbeat(void *sock)
{
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    Fedmoe__Heartbeat hb = FEDMOE__HEARTBEAT__INIT;
    env.body_case = FEDMOE__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    procs_send_env(sock, &env);
}

bool procs_log_has(const char *log, const char *text)
{
    FILE *f = fopen(log, "r");
    if (!f)
        return false;
    char line[2048];
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, text) != NULL;
    fclose(f);
    return found;
}

int procs_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    assert_true(port > 0);
    return port;
}

int procs_send_env(void *sock, Fedmoe__Envelope *env)
{
    uint8_t *buf;
    size_t len;
    if (fm_wire_encode(env, &buf, &len) != FM_OK)
        return -1;
    int rc = zmq_send(sock, buf, len, 0) == (int)len ? 0 : -1;
    free(buf);
    return rc;
}

Fedmoe__Envelope *procs_recv_kind(void *sock, int kind, double seconds, uint8_t *rid, int *ridn)
{
    double end = fm_clock_seconds() + seconds;
    while (fm_clock_seconds() < end) {
        zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 100) <= 0)
            continue;
        if (rid) {
            int n = zmq_recv(sock, rid, 256, 0);
            assert_true(n > 0 && n <= 255);
            *ridn = n;
        }
        uint8_t *m;
        size_t len;
        Fedmoe__Envelope *e = NULL;
        if (fm_wire_recv(sock, 0, 1u << 30, &m, &len) == FM_OK) {
            fm_wire_decode(m, len, 1u << 30, &e);
            free(m);
        }
        if (e && (kind == 0 || (int)e->body_case == kind))
            return e;
        if (e)
            fm_wire_free(e);
    }
    return NULL;
}

void procs_fake_counts(uint64_t train, uint64_t *val, uint64_t *test, uint64_t *correct, float *accuracy)
{
    *val = train / 4;
    *test = train / 3;
    *correct = *test / 2;
    *accuracy = *test ? (float)((double)*correct / (double)*test) : 0.0f;
}

void procs_hello(Fedmoe__Envelope *env, Fedmoe__Hello *h, const char *id, int partition, uint64_t train_samples)
{
    fedmoe__envelope__init(env);
    fedmoe__hello__init(h);
    h->client_id = (char *)id;
    h->protocol_version = FM_PROTOCOL_VERSION;
    h->specialists = 2;
    h->partition_index = partition;
    h->train_samples = train_samples;
    uint64_t correct;
    float acc;
    procs_fake_counts(train_samples, &h->val_samples, &h->test_samples, &correct, &acc);
    h->own_data = true; /* the coordinator cannot check its counts, only cap its weight */
    env->body_case = FEDMOE__ENVELOPE__BODY_HELLO;
    env->hello = h;
}

void procs_open_latest(const char *db, fm_store_t **st, fm_run_row_t *run)
{
    bool found;
    assert_int_equal(fm_store_open(st, db, true), FM_OK);
    assert_int_equal(fm_store_latest_run(*st, run, &found), FM_OK);
    assert_true(found);
}

void procs_files(const char *tag, char *db, char *log)
{
    snprintf(db, 512, "%s/%s.db", g_dir, tag);
    snprintf(log, 512, "%s/%s-server.log", g_dir, tag);
}

void procs_finished_run(const char *db, fm_round_row_t **rounds, int *nr, fm_client_round_row_t **rows, int *nc)
{
    fm_store_t *st;
    fm_run_row_t run;
    procs_open_latest(db, &st, &run);
    assert_string_equal(run.status, "finished");
    assert_int_equal(fm_store_list_rounds(st, run.id, rounds, nr), FM_OK);
    assert_int_equal(fm_store_list_client_rounds(st, run.id, -1, rows, nc), FM_OK);
    fm_store_run_clear(&run);
    fm_store_close(&st);
}

int procs_send_update(void *sock, uint32_t round, const uint8_t *nonce, const float *vec, uint32_t n, const float *prompt,
                      uint64_t samples)
{
    return procs_send_update_metrics(sock, round, nonce, vec, n, prompt, samples, NULL);
}

int procs_send_update_metrics(void *sock, uint32_t round, const uint8_t *nonce, const float *vec, uint32_t n,
                              const float *prompt, uint64_t samples, const Fedmoe__Metrics *metrics)
{
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    Fedmoe__Update up = FEDMOE__UPDATE__INIT;
    if (nonce) {
        up.nonce.data = (uint8_t *)nonce;
        up.nonce.len = 16;
    }
    Fedmoe__Metrics m = FEDMOE__METRICS__INIT;
    Fedmoe__Tensor t, p, *list[1];
    if (fm_wire_tensor_set(&t, "model", vec, 1, n) != FM_OK)
        return -1;
    if (fm_wire_tensor_set(&p, "prompt", prompt, 4, 64) != FM_OK) {
        fm_wire_tensor_clear(&t);
        return -1;
    }
    list[0] = &t;
    up.round = round;
    up.model = list;
    up.n_model = 1;
    up.prompt = &p;
    up.train_samples = samples;
    m.train_loss = 1.0f;
    procs_fake_counts(samples, &m.val_samples, &m.test_samples, &m.test_correct, &m.test_accuracy);
    if (metrics)
        m = *metrics;
    up.metrics = &m;
    env.body_case = FEDMOE__ENVELOPE__BODY_UPDATE;
    env.update = &up;
    int rc = procs_send_env(sock, &env);
    fm_wire_tensor_clear(&t);
    fm_wire_tensor_clear(&p);
    return rc;
}

long procs_rss_kb(pid_t pid)
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

int procs_fd_count(pid_t pid)
{
    char cmd[128], *out;
    snprintf(cmd, sizeof cmd, "ls /proc/%d/fd | wc -l", (int)pid);
    procs_capture(cmd, &out);
    int n = atoi(out);
    free(out);
    return n;
}

void procs_assert_run_of(const char *db, pid_t server, const pid_t *clients, const char *const *ids, int n,
                         int rounds)
{
    assert_int_equal(procs_wait(server, 300), 0);
    for (int i = 0; i < n; i++)
        assert_int_equal(procs_wait(clients[i], 30), 0);
    fm_round_row_t *r;
    fm_client_round_row_t *cr;
    int nr, nc;
    procs_finished_run(db, &r, &nr, &cr, &nc);
    assert_int_equal(nr, rounds);
    assert_int_equal(nc, rounds * n);
    for (int i = 0; i < nc; i++) {
        bool known = false;
        for (int k = 0; k < n; k++)
            known |= !strcmp(cr[i].client_id, ids[k]);
        assert_true(known);
        assert_string_equal(cr[i].status, "completed");
    }
    free(r);
    free(cr);
}

void procs_latest_checkpoint(const char *db, fm_checkpoint_t *ck, int *round)
{
    fm_store_t *st;
    fm_run_row_t run;
    procs_open_latest(db, &st, &run);
    uint8_t *blob;
    size_t len;
    bool found;
    assert_int_equal(fm_store_latest_checkpoint(st, run.id, round, &blob, &len, &found), FM_OK);
    assert_true(found);
    assert_int_equal(fm_checkpoint_decode(blob, len, ck), FM_OK);
    free(blob);
    fm_store_run_clear(&run);
    fm_store_close(&st);
}

uint8_t *procs_final_state(const char *db, size_t *len)
{
    fm_checkpoint_t ck;
    int round;
    procs_latest_checkpoint(db, &ck, &round);
    *len = sizeof(float) * (ck.nglobal + ck.nprompt);
    uint8_t *out = malloc(*len);
    memcpy(out, ck.global, sizeof(float) * ck.nglobal);
    memcpy(out + sizeof(float) * ck.nglobal, ck.prompt, sizeof(float) * ck.nprompt);
    fm_checkpoint_free(&ck);
    return out;
}

char *procs_bin(const char *name)
{
    /* one path a program, kept for the test's life (argv arrays point at it) */
    static char paths[32][512];
    static int n;
    const char *dir = getenv("FEDMOE_BIN_DIR");
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir && *dir ? dir : FM_BIN_DIR, name);
    for (int i = 0; i < n; i++)
        if (!strcmp(paths[i], path))
            return paths[i];
    assert_true(n < 32);
    snprintf(paths[n], sizeof paths[n], "%s", path);
    return paths[n++];
}

bool procs_measure_only(void) { return getenv("FEDMOE_MEASURE_ONLY") != NULL; }

long procs_max_message(const char *log)
{
    char cmd[700], *out;
    snprintf(cmd, sizeof cmd, "sed -n 's/.*messages up to \\([0-9]*\\) bytes.*/\\1/p' %s", log);
    long n = procs_capture(cmd, &out) == 0 ? atol(out) : 0;
    free(out);
    return n;
}
