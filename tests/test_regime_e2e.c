/* The data regimes through the real programs (fedmoe-sim: a real coordinator,
 * CURVE, client processes or a virtual host): scarce data with a cap drawn per
 * client, feature shift (every domain) with concept shift on top, and text
 * capped in bytes. Each run finishes; every client trains on exactly the data
 * the coordinator sized for its partition under the cap; the run's logged
 * configuration names the regime; a standalone client caps its partition
 * too; and the refusals are one clear line. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/clientdata.h"
#include "fedmoe/runspec.h"
#include "fedmoe/store.h"
#include "procs.h"

static char dir[256];

/* Runs fedmoe-sim with flags for `rounds` rounds into DIR/tag.db (db: 512
 * bytes); fails unless it finishes with every client completing every round. */
static void run(const char *tag, const char *flags, int clients, int rounds, char *db)
{
    char cmd[2048], *out;
    snprintf(db, 512, "%s/%s.db", dir, tag);
    snprintf(cmd, sizeof cmd, "%s %s --clients %d --rounds %d --db %s --workdir %s/%s --round-timeout 120 2>&1",
             BIN("client/fedmoe-sim"), flags, clients, rounds, db, dir, tag);
    int rc = procs_capture(cmd, &out);
    if (rc != 0)
        fprintf(stderr, "%s\n", out);
    assert_int_equal(rc, 0);
    free(out);
    fm_round_row_t *r;
    fm_client_round_row_t *cr;
    int nr, nc;
    procs_finished_run(db, &r, &nr, &cr, &nc);
    assert_int_equal(nr, rounds);
    assert_int_equal(nc, clients * rounds);
    for (int i = 0; i < nr; i++)
        assert_int_equal(r[i].completed, clients);
    for (int i = 0; i < nc; i++)
        assert_string_equal(cr[i].status, "completed");
    free(r);
    free(cr);
}

/* Every client of db's latest run trained on its partition's capped splits, as
 * spec sizes them (and no more than `cap` examples with validation). */
static void check_sizes(const char *db, const fm_data_spec_t *spec, uint64_t cap, const char *config)
{
    fm_store_t *st;
    fm_run_row_t run;
    procs_open_latest(db, &st, &run);
    if (!strstr(run.config, config))
        fail_msg("the run's config lacks %s: %s", config, run.config);
    fm_client_row_t *rows;
    int n;
    assert_int_equal(fm_store_list_clients(st, run.id, &rows, &n), FM_OK);
    assert_int_equal(n, spec->count);
    fm_split_sizes_t sizes[64];
    assert_int_equal(fm_client_data_sizes(spec, sizes), FM_OK);
    for (int i = 0; i < n; i++) {
        int p = rows[i].partition_index;
        assert_true(p >= 0 && p < spec->count);
        assert_int_equal(rows[i].train_samples, (int64_t)sizes[p].train);
        assert_int_equal(rows[i].val_samples, (int64_t)sizes[p].val);
        assert_int_equal(rows[i].test_samples, (int64_t)sizes[p].test);
        if (cap)
            assert_true(sizes[p].train + sizes[p].val <= cap);
    }
    free(rows);
    fm_store_run_clear(&run);
    fm_store_close(&st);
}

static void test_scarce_images(void **state)
{
    (void)state;
    char db[512];
    run("scarce", "--strategy full --dirichlet 0.3 --client-examples 20..200 --seed 4", 4, 2, db);
    fm_data_spec_t spec;
    fm_data_spec_default(&spec);
    spec.count = 4;
    spec.seed = 4;
    spec.part.alpha = 0.3;
    assert_int_equal(fm_cap_parse("x", "20..200", &spec.regime.examples), FM_OK);
    check_sizes(db, &spec, 200, "\"client_examples\":\"20..200\"");
}

static void test_domains_and_concepts(void **state)
{
    (void)state;
    char db[512];
    run("shift", "--strategy full --iid --client-examples 50 --domains all --concept-groups 2 --hosting virtual", 8, 2,
        db);
    fm_data_spec_t spec;
    fm_data_spec_default(&spec);
    spec.count = 8;
    spec.part.kind = FM_PARTITION_IID;
    assert_int_equal(fm_cap_parse("x", "50", &spec.regime.examples), FM_OK);
    check_sizes(db, &spec, 50,
                "\"domains\":\"identity,rotate90,rotate180,rotate270,invert,blur,noise,patches\",\"concept_groups\":2");
}

static void test_text_in_bytes(void **state)
{
    (void)state;
    char db[512];
    run("text-bytes", "--task text --dataset fortunes:ga,eo --context 32 --batch 8 --local-steps 4 "
                      "--client-bytes 8192",
        2, 2, db);
    fm_store_t *st;
    fm_run_row_t run;
    procs_open_latest(db, &st, &run);
    assert_non_null(strstr(run.config, "\"client_bytes\":\"8192\""));
    fm_client_row_t *rows;
    int n;
    assert_int_equal(fm_store_list_clients(st, run.id, &rows, &n), FM_OK);
    assert_int_equal(n, 2);
    for (int i = 0; i < n; i++) /* windows of 32 bytes: at most the bytes of the cap */
        assert_true(rows[i].train_samples > 0 && (rows[i].train_samples + rows[i].val_samples) * 32 <= 8192 + 64);
    free(rows);
    fm_store_run_clear(&run);
    fm_store_close(&st);
}

/* A standalone client applies the regime to its partition too. */
static void test_standalone(void **state)
{
    (void)state;
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd, "%s --standalone --partition 3/10 --client-examples 50 --domains invert "
             "--concept-groups 2 --epochs 1 2>&1", BIN("client/fedmoe-client"));
    assert_int_equal(procs_capture(cmd, &out), 0);
    if (!strstr(out, "client 3/10: 40 train, 10 validation,"))
        fail_msg("the standalone client did not cap its data: %s", out);
    free(out);
}

/* fedmoe-domains draws a PNG of a row a class and a column a domain. */
static void test_domains_picture(void **state)
{
    (void)state;
    char cmd[1024], png[512], *out;
    snprintf(png, sizeof png, "%s/domains.png", dir);
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", BIN("bench/fedmoe-domains"), png);
    assert_int_equal(procs_capture(cmd, &out), 0);
    free(out);
    FILE *f = fopen(png, "rb");
    assert_non_null(f);
    unsigned char h[24];
    assert_int_equal(fread(h, 1, sizeof h, f), sizeof h);
    fclose(f);
    assert_memory_equal(h, "\x89PNG\r\n\x1a\n", 8);
    unsigned w = (unsigned)h[16] << 24 | h[17] << 16 | h[18] << 8 | h[19];
    unsigned ht = (unsigned)h[20] << 24 | h[21] << 16 | h[22] << 8 | h[23];
    assert_int_equal(w, FM_DOMAIN_KINDS * (28 * 2 + 4) + 4); /* 8 domains of 28 pixels, twice their size */
    assert_int_equal(ht, 10 * (28 * 2 + 4) + 4);               /* 10 classes */
}

static void test_refusals(void **state)
{
    (void)state;
    static const char *const cases[][3] = { /* program, flags, what the one line says */
        {"client/fedmoe-sim", "--client-bytes 4096 --rounds 1", "--client-bytes caps text"},
        {"server/fedmoe-server", "--insecure --task text --client-examples 100", "text is capped in bytes"},
        {"client/fedmoe-sim", "--task text --domains rotate --rounds 1", "not text"},
        {"client/fedmoe-sim", "--domains swirl", "'swirl' is not a domain"},
        {"server/fedmoe-server", "--insecure --client-examples 0", "--client-examples"},
        {"server/fedmoe-server", "--insecure --concept-groups 65", "--concept-groups"},
        {"client/fedmoe-client", "--standalone --client-bytes 50 --epochs 1", "image data is capped in examples"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "%s/%s %s", FM_BIN_DIR, cases[i][0], cases[i][1]);
        procs_expect_refusal(cmd, cases[i][2]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_standalone),
        cmocka_unit_test(test_domains_picture),
        cmocka_unit_test(test_scarce_images),
        cmocka_unit_test(test_domains_and_concepts),
        cmocka_unit_test(test_text_in_bytes),
    };
    return procs_run_tests("regime_e2e", tests, sizeof tests / sizeof tests[0], dir, sizeof dir);
}
