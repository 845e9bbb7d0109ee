#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "procs.h"

#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

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

int procs_run_tests(const char *name, const struct CMUnitTest *tests, size_t n, char *dir, size_t dircap)
{
    snprintf(dir, dircap, "/tmp/fedmoe-test-%s-XXXXXX", name);
    if (!mkdtemp(dir))
        return 1;
    signal(SIGPIPE, SIG_IGN);
    int rc = _cmocka_run_group_tests(name, tests, n, NULL, NULL);
    kill_leftovers();
    if (rc == 0) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        if (system(cmd) != 0)
            rc = 1;
    } else {
        fprintf(stderr, "logs kept in %s\n", dir);
    }
    return rc;
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

int procs_send_update(void *sock, uint32_t round, const float *vec, uint32_t n, const float *prompt, uint64_t samples)
{
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    Fedmoe__Update up = FEDMOE__UPDATE__INIT;
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
    m.test_accuracy = 0.5f;
    m.test_samples = 10;
    m.test_correct = 5;
    up.metrics = &m;
    env.body_case = FEDMOE__ENVELOPE__BODY_UPDATE;
    env.update = &up;
    int rc = procs_send_env(sock, &env);
    fm_wire_tensor_clear(&t);
    fm_wire_tensor_clear(&p);
    return rc;
}
