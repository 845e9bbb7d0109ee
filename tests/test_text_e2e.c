/* The text task through the real programs: a federated run of 3 clients x 2
 * rounds (fedmoe-sim --task text: a real coordinator, CURVE, client
 * processes or, for local, a virtual host, the fortune packages), each of
 * local, fedavg and comigs (and comigs sharing the generalist experts only); a
 * standalone client learning on its defaults; and the refusals (a strategy
 * with the prompt head, image data for the text model, text for the image
 * model, a missing language or folder), each one clear line. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/model.h"
#include "fedmoe/runspec.h"
#include "fedmoe/store.h"
#include "procs.h"

static char dir[256];

/* A small run: the Irish and Esperanto fortunes (the smallest packages), windows of 32 bytes. */
#define SMALL "--dataset fortunes:ga,eo --context 32 --batch 8"

/* Fails unless the configuration the latest run of db logged contains want. */
static void assert_config_has(const char *db, const char *want)
{
    fm_store_t *st;
    fm_run_row_t run;
    procs_open_latest(db, &st, &run);
    if (!strstr(run.config, want))
        fail_msg("%s's run config lacks %s: %s", db, want, run.config);
    fm_store_run_clear(&run);
    fm_store_close(&st);
}

/* Runs strategy for `rounds` rounds (with the further flags `extra`), its
 * round log and working folder named by strategy and tag; the log's path into
 * db (512 bytes); the first round's test loss (nats a byte) into *loss1. */
static void run_strategy(const char *strategy, const char *tag, int rounds, const char *extra, char *db,
                         double *loss1)
{
    char cmd[2048], *out;
    snprintf(db, 512, "%s/text-%s%s.db", dir, strategy, tag);
    snprintf(cmd, sizeof cmd, "%s --task text " SMALL " --strategy %s --clients 3 --rounds %d --db %s --workdir %s/%s%s "
             "--round-timeout 120 %s 2>&1", BIN("client/fedmoe-sim"), strategy, rounds, db, dir, strategy, tag, extra);
    int rc = procs_capture(cmd, &out);
    if (rc != 0)
        fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    fm_round_row_t *r;
    fm_client_round_row_t *cr;
    int nr, nc;
    procs_finished_run(db, &r, &nr, &cr, &nc);
    assert_int_equal(nr, rounds);
    /* the summary leads with the last round's test bits per byte and its perplexity */
    const char *fin = strstr(out, "final test bits/byte");
    double bpb = 0, ppl = 0;
    assert_non_null(fin);
    assert_int_equal(sscanf(fin, "final test bits/byte %lf (perplexity %lf", &bpb, &ppl), 2);
    assert_true(fabs(bpb - r[nr - 1].test_loss / log(2.0)) < 1e-3 && fabs(ppl - pow(2.0, bpb)) < 0.01 * ppl);
    free(out);
    assert_int_equal(nc, 3 * rounds);
    for (int i = 0; i < nr; i++) {
        assert_int_equal(r[i].completed, 3);
        /* bits per byte: below the 8 of knowing nothing, and learning */
        assert_true(r[i].test_loss / log(2.0) < 8.0 && r[i].test_accuracy > 0.0 && r[i].test_accuracy < 1.0);
    }
    assert_true(r[1].test_loss < r[0].test_loss);
    *loss1 = r[0].test_loss;
    for (int i = 0; i < nc; i++) {
        assert_string_equal(cr[i].status, "completed");
        assert_true(cr[i].train_samples > 0);
        assert_int_equal(cr[i].test_samples % 32, 0); /* predictions: 32 a window */
        assert_true(cr[i].test_correct <= cr[i].test_samples);
    }
    free(r);
    free(cr);
    assert_config_has(db, "\"family\":\"text\",\"context\":32");
}

/* A client's upload in round 1 of the run logged in db, in bytes. */
static double upload_per_client(const char *db)
{
    fm_round_row_t *r;
    fm_client_round_row_t *cr;
    int nr, nc;
    procs_finished_run(db, &r, &nr, &cr, &nc);
    double up = (double)r[0].bytes_up / r[0].completed;
    free(r);
    free(cr);
    return up;
}

/* The floats comigs averages for the test's model when its shared group holds `shared`. */
static size_t comigs_floats(fm_shared_kind shared)
{
    fm_model_config_t c;
    fm_model_config_default(&c);
    fm_model_config_text(&c);
    c.context = 32;
    c.shared = shared;
    fm_model_t *m = NULL;
    assert_int_equal(fm_model_new(&m, &c, 1, 0), FM_OK);
    size_t n = fm_federated_size(m, FM_STRATEGY_COMIGS);
    fm_model_destroy(&m);
    return n;
}

/* --shared experts: comigs averages the generalist experts only; the uploads
 * carry exactly those floats (plus the message's few hundred bytes), less than
 * half of what the default grouping sends, and the run learns. */
static void check_experts_only(const char *all)
{
    char experts[512];
    double loss1;
    run_strategy("comigs", "-experts", 2, "--shared experts", experts, &loss1);
    assert_config_has(experts, "\"shared\":\"experts\"");
    size_t n_all = comigs_floats(FM_SHARED_ALL), n_experts = comigs_floats(FM_SHARED_EXPERTS);
    assert_true(n_experts < n_all / 2);
    double up_all = upload_per_client(all), up_experts = upload_per_client(experts);
    if (up_all < 4.0 * n_all || up_all > 4.0 * n_all + 4096 || up_experts < 4.0 * n_experts ||
        up_experts > 4.0 * n_experts + 4096)
        fail_msg("uploads of %.0f / %.0f bytes a client for %zu / %zu averaged floats", up_all, up_experts, n_all,
                 n_experts);
}

static void test_federated_comigs(void **state)
{
    (void)state;
    char db[512], cmd[1024], *out;
    double loss1;
    run_strategy("comigs", "", 2, "", db, &loss1);
    /* fedmoe-history shows the losses of a text run in bits per byte */
    snprintf(cmd, sizeof cmd, "%s --db %s rounds", BIN("server/fedmoe-history"), db);
    assert_int_equal(procs_capture(cmd, &out), 0);
    assert_non_null(strstr(out, "train_bpb"));
    const char *row = strstr(out, "\n    1 ");
    assert_non_null(row);
    int round, sel, comp, drop;
    double train, test;
    assert_int_equal(sscanf(row, "%d %d %d %d %lf %lf", &round, &sel, &comp, &drop, &train, &test), 6);
    assert_true(fabs(test - loss1 / log(2.0)) < 1e-3);
    free(out);
    check_experts_only(db);
}

static void test_federated_fedavg_and_local(void **state)
{
    (void)state;
    char db[512];
    double loss1;
    /* rounds before the last evaluate 5 windows of each split; the last, all */
    run_strategy("fedavg", "", 3, "--eval-sample 5", db, &loss1);
    fm_round_row_t *r;
    fm_client_round_row_t *cr;
    int nr, nc;
    procs_finished_run(db, &r, &nr, &cr, &nc);
    for (int i = 0; i < nc; i++) {
        bool last = cr[i].round == 3;
        if (!last && (cr[i].test_samples != 5 * 32 || cr[i].val_samples != 5 * 32))
            fail_msg("round %d of %s evaluated %lld/%lld bytes, not 5 windows", cr[i].round, cr[i].client_id,
                     (long long)cr[i].test_samples, (long long)cr[i].val_samples);
        if (last && (cr[i].test_samples <= 5 * 32 || cr[i].val_samples <= 5 * 32))
            fail_msg("the last round of %s evaluated only %lld/%lld bytes", cr[i].client_id,
                     (long long)cr[i].test_samples, (long long)cr[i].val_samples);
    }
    free(r);
    free(cr);
    run_strategy("local", "", 2, "--hosting virtual", db, &loss1); /* (text in a virtual host: one corpus for its clients) */
}

static void test_standalone(void **state)
{
    (void)state;
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd, "%s --standalone --task text " SMALL " --epochs 2 2>/dev/null",
             BIN("client/fedmoe-client"));
    assert_int_equal(procs_capture(cmd, &out), 0);
    assert_non_null(strstr(out, "test_bpb"));
    double bpb[2] = {0, 0};
    int ep;
    for (const char *line = strstr(out, "\n"); line && *line; line = strchr(line + 1, '\n')) {
        double tr, v, va, te;
        if (sscanf(line + 1, "%d %lf %lf %lf%% %lf", &ep, &tr, &v, &va, &te) == 5 && ep >= 1 && ep <= 2)
            bpb[ep - 1] = te;
    }
    free(out);
    assert_true(bpb[0] > 0.0 && bpb[0] < 8.0);
    assert_true(bpb[1] < bpb[0]);
}

static void test_refusals(void **state)
{
    (void)state;
    char a[1024];
    snprintf(a, sizeof a, "%s --task text --strategy full --insecure --partitions 3 --db %s/r.db", BIN("server/fedmoe-server"), dir);
    procs_expect_refusal(a, "needs the prompt head");
    snprintf(a, sizeof a, "%s --task text --strategy fedavg --shared experts --insecure --partitions 3 --db %s/r.db",
             BIN("server/fedmoe-server"), dir);
    procs_expect_refusal(a, "--shared experts changes what comigs and full average; strategy fedavg averages every");
    snprintf(a, sizeof a, "%s --standalone --task text --dataset fmnist --epochs 1", BIN("client/fedmoe-client"));
    procs_expect_refusal(a, "reads text");
    snprintf(a, sizeof a, "%s --standalone --dataset fortunes:ga --epochs 1", BIN("client/fedmoe-client"));
    procs_expect_refusal(a, "--task text");
    snprintf(a, sizeof a, "%s --standalone --task text --dataset fortunes:xx --epochs 1", BIN("client/fedmoe-client"));
    procs_expect_refusal(a, "no language 'xx'");
    snprintf(a, sizeof a, "%s --standalone --task text --dataset text:%s/none --epochs 1", BIN("client/fedmoe-client"), dir);
    procs_expect_refusal(a, "cannot open the folder");
    snprintf(a, sizeof a, "%s --standalone --task speech", BIN("client/fedmoe-client"));
    procs_expect_refusal(a, "--task");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_federated_comigs), cmocka_unit_test(test_federated_fedavg_and_local),
        cmocka_unit_test(test_standalone),       cmocka_unit_test(test_refusals),
    };
    return procs_run_tests("text_e2e", tests, sizeof tests / sizeof tests[0], dir, sizeof dir);
}
