/* Virtual clients (fedmoe-client --virtual N): N clients in one process, each
 * with its own CURVE key and connection to a real coordinator, one shared copy
 * of the dataset, two training at once. They are independent of each other:
 * a short run of 3 virtual clients, their models spilled to their state
 * files between rounds, gives, partition for partition, the same results as
 * 3 client processes (every client's per-round metrics equal, the
 * final global state bit-identical). A virtual host killed mid-round: its
 * clients are dropped from that round and the run goes on without them;
 * restarted, they come back from the state they spilled to their state files
 * between rounds. An idle client's state files hold its own state alone, and
 * fedmoe-sim runs many clients in virtual hosts. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <glob.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <sys/stat.h>
#include <string.h>
#include <unistd.h>

#include "coordinator.h"
#include "fedmoe/model.h"
#include "fedmoe/params.h"
#include "fedmoe/runspec.h"
#include "fedmoe/store.h"
#include "procs.h"

static char dir[256];

#define CLIENTS 3
#define ROUNDS "2"

static pid_t start_server(const char *tag, char *db, char *log)
{
    char ep[64], parts[8];
    procs_files(tag, db, log);
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", procs_free_port());
    snprintf(parts, sizeof parts, "%d", CLIENTS);
    char *argv[] = {BIN("server/fedmoe-server"), "--bind", ep, "--db", db, "--rounds", ROUNDS, "--partitions",
                    parts, "--min-clients", parts, "--strategy", "full", NULL};
    return procs_spawn_server(argv, log);
}

/* The endpoint a server started with start_server binds (from its argv in log). */
static void endpoint_of(const char *log, char *ep)
{
    for (int i = 0; i < 100 && !procs_log_has(log, "listening on "); i++)
        usleep(100000);
    FILE *f = fopen(log, "r");
    assert_non_null(f);
    char line[1024];
    ep[0] = 0;
    while (fgets(line, sizeof line, f) && !ep[0]) {
        char *at = strstr(line, "listening on ");
        if (at)
            sscanf(at + 13, "%63s", ep);
    }
    fclose(f);
    assert_true(ep[0] != 0);
}

static void test_virtual_clients_as_processes(void **state)
{
    (void)state;
    char key[512], pub[512], allow[512], db_p[512], log_p[512], db_v[512], log_v[512], ep[64], part[16];
    procs_server_keys(key, pub, allow);
    for (int i = 0; i < CLIENTS; i++) { /* every key before the coordinators read the list */
        char id[64], path[512];
        snprintf(id, sizeof id, "p%d", i);
        procs_client_key(id, path);
        snprintf(id, sizeof id, "vc-%05d", i);
        procs_client_key(id, path);
    }
    /* separate processes */
    pid_t server = start_server("procs", db_p, log_p);
    endpoint_of(log_p, ep);
    pid_t c[CLIENTS];
    for (int i = 0; i < CLIENTS; i++) {
        char id[16], clog[600];
        snprintf(id, sizeof id, "p%d", i);
        snprintf(part, sizeof part, "%d/%d", i, CLIENTS);
        snprintf(clog, sizeof clog, "%s/p%d.log", dir, i);
        char *argv[] = {BIN("client/fedmoe-client"), "--connect", ep, "--id", id, "--partition", part, NULL};
        c[i] = procs_spawn_client(argv, clog);
    }
    const char *ids[] = {"p0", "p1", "p2"};
    procs_assert_run_of(db_p, server, c, ids, CLIENTS, atoi(ROUNDS));
    /* one virtual host */
    server = start_server("virtual", db_v, log_v);
    endpoint_of(log_v, ep);
    char hlog[600], n[8];
    snprintf(hlog, sizeof hlog, "%s/host.log", dir);
    snprintf(n, sizeof n, "%d", CLIENTS);
    snprintf(part, sizeof part, "0/%d", CLIENTS);
    char sdir[600]; /* (with a state folder: between rounds each client's model is spilled to it) */
    snprintf(sdir, sizeof sdir, "%s/vc-state", dir);
    mkdir(sdir, 0700);
    char *hargv[] = {BIN("client/fedmoe-client"), "--connect", ep, "--id", "vc", "--virtual", n, "--keys", allow,
                     "--server-key", pub, "--partition", part, "--workers", "2", "--state-dir", sdir, NULL};
    pid_t host = procs_spawn(hargv, hlog);
    assert_int_equal(procs_wait(server, 300), 0);
    assert_int_equal(procs_wait(host, 30), 0);
    assert_true(procs_log_has(hlog, "loaded once"));
    /* the same, client for client (rows in id order: p0.. and vc-00000.. alike) */
    fm_round_row_t *rp, *rv;
    fm_client_round_row_t *cp, *cv;
    int nrp, nrv, ncp, ncv;
    procs_finished_run(db_p, &rp, &nrp, &cp, &ncp);
    procs_finished_run(db_v, &rv, &nrv, &cv, &ncv);
    assert_int_equal(ncp, CLIENTS * atoi(ROUNDS));
    assert_int_equal(ncv, ncp);
    for (int i = 0; i < ncp; i++) {
        char want[16];
        snprintf(want, sizeof want, "vc-%05d", i % CLIENTS);
        assert_string_equal(cv[i].client_id, want);
        assert_int_equal(cp[i].round, cv[i].round);
        assert_string_equal(cv[i].status, "completed");
        assert_true(cp[i].train_loss == cv[i].train_loss && cp[i].val_loss == cv[i].val_loss &&
                    cp[i].test_loss == cv[i].test_loss && cp[i].test_accuracy == cv[i].test_accuracy &&
                    cp[i].generalist_share == cv[i].generalist_share);
        assert_int_equal(cp[i].test_correct, cv[i].test_correct);
        assert_int_equal(cp[i].val_correct, cv[i].val_correct);
    }
    for (int r = 0; r < nrp; r++)
        assert_true(rp[r].test_accuracy == rv[r].test_accuracy && rp[r].train_loss == rv[r].train_loss);
    size_t lp, lv;
    uint8_t *sp = procs_final_state(db_p, &lp), *sv = procs_final_state(db_v, &lv);
    assert_int_equal(lp, lv);
    assert_memory_equal(sp, sv, lp);
    free(sp);
    free(sv);
    free(rp);
    free(rv);
    free(cp);
    free(cv);
}

/* Waits (up to 120 s) until log has text. */
static void wait_log(const char *log, const char *text)
{
    for (int i = 0; i < 1200 && !procs_log_has(log, text); i++)
        usleep(100000);
    assert_true(procs_log_has(log, text));
}

/* The round of log's n-th "round N/..." line that has text, 0 when none. */
static int round_with(const char *log, const char *text, int n)
{
    FILE *f = fopen(log, "r");
    if (!f)
        return 0;
    char line[1024];
    int round = 0;
    while (!round && fgets(line, sizeof line, f)) {
        const char *at = strstr(line, "round ");
        if (strstr(line, text) && at && --n == 0)
            round = atoi(at + 6);
    }
    fclose(f);
    return round;
}

static void test_killed_host_resumes_from_spilled_state(void **state)
{
    (void)state;
    char key[512], pub[512], allow[512], db[512], log[512], ep[64], sdir[600];
    procs_server_keys(key, pub, allow);
    const char *ids[] = {"k0", "k1", "vk-00002", "vk-00003"}; /* (numbered by partition) */
    for (int i = 0; i < 4; i++) {
        char path[512];
        procs_client_key(ids[i], path);
    }
    snprintf(sdir, sizeof sdir, "%s/vk-state", dir);
    mkdir(sdir, 0700);
    procs_files("killed", db, log);
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", procs_free_port());
    char *sargv[] = {BIN("server/fedmoe-server"), "--bind", ep, "--db", db, "--rounds", "8", "--partitions", "4",
                     "--min-clients", "2", "--client-timeout", "4", "--strategy", "comigs", NULL};
    pid_t server = procs_spawn_server(sargv, log);
    pid_t c[2];
    for (int i = 0; i < 2; i++) {
        char clog[600], part[16];
        snprintf(clog, sizeof clog, "%s/%s.log", dir, ids[i]);
        snprintf(part, sizeof part, "%d/4", i);
        char *argv[] = {BIN("client/fedmoe-client"), "--connect", ep, "--id", (char *)ids[i], "--partition", part,
                        NULL};
        c[i] = procs_spawn_client(argv, clog);
    }
    char h1[600], h2[600];
    snprintf(h1, sizeof h1, "%s/vk-1.log", dir);
    snprintf(h2, sizeof h2, "%s/vk-2.log", dir);
    char *hargv[] = {BIN("client/fedmoe-client"), "--connect", ep, "--id", "vk", "--virtual", "2", "--keys", allow,
                     "--server-key", pub, "--partition", "2/4", "--state-dir", sdir, NULL};
    pid_t host = procs_spawn(hargv, h1);
    /* the second round of all four: the host's clients have finished one and
     * are training the next */
    int killed = 0;
    for (int i = 0; i < 1200 && !(killed = round_with(log, "4 of 4 connected clients selected", 2)); i++)
        usleep(100000);
    assert_true(killed > 0);
    usleep(300000);
    kill(host, SIGKILL);
    assert_int_equal(procs_wait(host, 10), 128 + SIGKILL);
    char next[32];
    snprintf(next, sizeof next, "round %d/8", killed + 1);
    wait_log(log, next);
    host = procs_spawn(hargv, h2);
    assert_int_equal(procs_wait(server, 300), 0);
    assert_int_equal(procs_wait(host, 30), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(procs_wait(c[i], 30), 0);
    char restored[64];
    snprintf(restored, sizeof restored, "restored local state after round %d", killed - 1);
    assert_true(procs_log_has(h2, restored));
    fm_round_row_t *r;
    fm_client_round_row_t *cr;
    int nr, nc;
    procs_finished_run(db, &r, &nr, &cr, &nc);
    assert_int_equal(nr, 8);
    int dropped = 0, back[2] = {0, 0};
    for (int i = 0; i < nc; i++)
        for (int v = 0; v < 2; v++) {
            if (strcmp(cr[i].client_id, ids[2 + v]) != 0)
                continue;
            dropped += cr[i].round == killed && !strcmp(cr[i].status, "dropped");
            back[v] += cr[i].round > killed && !strcmp(cr[i].status, "completed");
        }
    assert_int_equal(dropped, 2);        /* both dropped from the round they were killed in */
    assert_true(back[0] > 0 && back[1] > 0); /* and both back later */
    for (int k = 0; k < nr; k++)
        assert_true(r[k].completed >= 2);
    free(r);
    free(cr);
}

/* The state files a virtual client keeps between its rounds: the weights a
 * Task does not bring (the strategy's federated ones come with every Task),
 * the moments and the generator, and the state from before its last round
 * only while that round may be run again. Four clients, two a round: at the
 * end, a .pre file is left by the final round's clients alone. */
static void test_idle_clients_keep_their_own_state(void **state)
{
    (void)state;
    char key[512], pub[512], allow[512], db[512], log[512], hlog[600], ep[64], sdir[600];
    procs_server_keys(key, pub, allow);
    for (int i = 0; i < 4; i++) {
        char id[16], path[512];
        snprintf(id, sizeof id, "vi-%05d", i);
        procs_client_key(id, path);
    }
    snprintf(sdir, sizeof sdir, "%s/vi-state", dir);
    mkdir(sdir, 0700);
    procs_files("idle", db, log);
    snprintf(hlog, sizeof hlog, "%s/vi.log", dir);
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%d", procs_free_port());
    char *sargv[] = {BIN("server/fedmoe-server"), "--bind", ep, "--db", db, "--rounds", "5", "--partitions", "4",
                     "--min-clients", "2", "--fraction", "0.5", "--strategy", "full", NULL};
    pid_t server = procs_spawn_server(sargv, log);
    char *hargv[] = {BIN("client/fedmoe-client"), "--connect", ep, "--id", "vi", "--virtual", "4", "--keys", allow,
                     "--server-key", pub, "--partition", "0/4", "--state-dir", sdir, NULL};
    pid_t host = procs_spawn(hargv, hlog);
    assert_int_equal(procs_wait(server, 300), 0);
    assert_int_equal(procs_wait(host, 30), 0);
    fm_round_row_t *r;
    fm_client_round_row_t *cr;
    int nr, nc;
    procs_finished_run(db, &r, &nr, &cr, &nc);
    assert_int_equal(nr, 5);
    bool trained[4] = {0}, last[4] = {0};
    for (int i = 0; i < nc; i++) {
        int who = atoi(cr[i].client_id + 3);
        assert_true(who >= 0 && who < 4);
        trained[who] |= !strcmp(cr[i].status, "completed");
        last[who] |= cr[i].round == 5 && !strcmp(cr[i].status, "completed");
    }
    /* a snapshot's size: every weight but the federated ones, and both moments */
    fm_run_spec_t spec;
    fm_run_spec_default(&spec);
    fm_model_t *m = NULL;
    assert_int_equal(fm_model_new(&m, &spec.model, 1, 0), FM_OK);
    size_t floats = 3 * fm_params_total(fm_model_params(m)) - fm_federated_size(m, FM_STRATEGY_FULL);
    fm_model_destroy(&m);
    int idle_before_last = 0;
    for (int i = 0; i < 4; i++) {
        char pattern[800];
        glob_t g;
        snprintf(pattern, sizeof pattern, "%s/run-*.vi-%05d.state", sdir, i);
        assert_int_equal(glob(pattern, 0, NULL, &g) == 0 ? (int)g.gl_pathc : 0, trained[i]);
        struct stat st;
        if (trained[i]) {
            assert_int_equal(stat(g.gl_pathv[0], &st), 0);
            assert_true((size_t)st.st_size >= 4 * floats && (size_t)st.st_size < 4 * floats + 4096);
        }
        globfree(&g);
        snprintf(pattern, sizeof pattern, "%s/run-*.vi-%05d.pre", sdir, i);
        assert_int_equal(glob(pattern, 0, NULL, &g) == 0 ? (int)g.gl_pathc : 0, last[i]);
        globfree(&g);
        idle_before_last += trained[i] && !last[i];
    }
    assert_true(idle_before_last > 0); /* (what the test is about happened) */
    free(r);
    free(cr);
}

/* fedmoe-sim with more clients than it runs as processes: a virtual host,
 * said so; its clients numbered by partition, each in the round log; the
 * client-wise Dirichlet partition gives every client the same count. */
static void test_sim_virtual_host(void **state)
{
    (void)state;
    char db[512], cmd[2048], *out;
    snprintf(db, sizeof db, "%s/simv.db", dir);
    snprintf(cmd, sizeof cmd,
             "%s --clients 40 --rounds 2 --fraction 0.25 --client-dirichlet 0.5 --db %s --workdir %s/simv "
             "--round-timeout 120 2>&1",
             BIN("client/fedmoe-sim"), db, dir);
    int rc = procs_capture(cmd, &out);
    if (rc != 0)
        fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "40 clients in 1 virtual host of up to 40"));
    assert_non_null(strstr(out, "more than 32 clients"));
    assert_non_null(strstr(out, "final test accuracy"));
    free(out);
    fm_store_t *st;
    assert_int_equal(fm_store_open(&st, db, true), FM_OK);
    fm_run_row_t *runs;
    int nruns, n;
    assert_int_equal(fm_store_list_runs(st, &runs, &nruns), FM_OK);
    assert_int_equal(nruns, 1);
    assert_string_equal(runs[0].status, "finished");
    fm_round_row_t *r;
    assert_int_equal(fm_store_list_rounds(st, runs[0].id, &r, &n), FM_OK);
    assert_int_equal(n, 2);
    for (int i = 0; i < 2; i++)
        assert_true(r[i].selected == 10 && r[i].completed == 10);
    fm_client_row_t *cl;
    assert_int_equal(fm_store_list_clients(st, runs[0].id, &cl, &n), FM_OK);
    assert_int_equal(n, 40);
    for (int i = 0; i < n; i++) {
        char want[32];
        snprintf(want, sizeof want, "client-%05d", cl[i].partition_index);
        assert_string_equal(cl[i].id, want);
    }
    free(cl);
    fm_client_round_row_t *cr;
    assert_int_equal(fm_store_list_client_rounds(st, runs[0].id, -1, &cr, &n), FM_OK);
    assert_int_equal(n, 20);
    for (int i = 0; i < n; i++) /* 70,000 / 40 each: 75% train (rounding per class) */
        assert_true(llabs((long long)(cr[i].train_samples + cr[i].val_samples) - 1312) <= 10);
    free(cr);
    free(r);
    fm_store_run_clear(&runs[0]);
    free(runs);
    fm_store_close(&st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_virtual_clients_as_processes),
        cmocka_unit_test(test_idle_clients_keep_their_own_state),
        cmocka_unit_test(test_sim_virtual_host),
        cmocka_unit_test(test_killed_host_resumes_from_spilled_state),
    };
    return procs_run_tests("virtual", tests, sizeof tests / sizeof tests[0], dir, sizeof dir);
}
