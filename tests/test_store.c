/* The round log on a real SQLite file: commit, refusal without a trace, what a
 * resume reads, and an older schema upgraded in place. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fedmoe/log.h"
#include "fedmoe/record.h"
#include "fedmoe/store.h"

#include "procs.h"

static char dir[64];
static int seq;

static void db_path(char *out, size_t cap) { snprintf(out, cap, "%s/log-%d.db", dir, ++seq); }

static fm_round_row_t round_row(int round)
{
    fm_round_row_t r = {0};
    r.round = round;
    r.selected = 3;
    r.completed = 2;
    r.dropped = 1;
    r.test_accuracy = 0.5 + 0.01 * round;
    r.val_accuracy = 0.4;
    return r;
}

static void commit(fm_store_t *s, const char *run, int round, fm_status expect)
{
    fm_round_row_t r = round_row(round);
    fm_client_round_row_t rows[2] = {0};
    snprintf(rows[0].client_id, 64, "a");
    snprintf(rows[0].status, 16, "completed");
    rows[0].val_samples = 10;
    rows[0].val_correct = 4;
    snprintf(rows[1].client_id, 64, "b");
    snprintf(rows[1].status, 16, "dropped");
    uint8_t ckpt[4] = {1, 2, 3, (uint8_t)round};
    fm_sha256_hex(ckpt, sizeof ckpt, r.checkpoint_sha256);
    assert_int_equal(fm_store_commit_round(s, run, &r, rows, 2, ckpt, sizeof ckpt), expect);
}

static void test_commit_and_resume_reads(void **state)
{
    (void)state;
    char path[128];
    db_path(path, sizeof path);
    fm_store_t *s;
    umask(022); /* the usual umask would give 0644 */
    assert_int_equal(fm_store_open(&s, path, false), FM_OK);
    struct stat sb; /* a new round log is its owner's alone */
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    assert_int_equal(fm_store_create_run(s, "run-1", "{\"x\":1}", 7, "full", 10), FM_OK);
    char wal[160];
    snprintf(wal, sizeof wal, "%s-wal", path);
    assert_int_equal(stat(wal, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    fm_client_row_t c = {.specialists = 2, .partition_index = 3, .train_samples = 100};
    snprintf(c.id, sizeof c.id, "a");
    snprintf(c.first_seen, sizeof c.first_seen, "2026-01-01T00:00:00.000Z");
    snprintf(c.last_seen, sizeof c.last_seen, "2026-01-01T00:00:01.000Z");
    assert_int_equal(fm_store_upsert_client(s, "run-1", &c), FM_OK);
    commit(s, "run-1", 1, FM_OK);
    commit(s, "run-1", 2, FM_OK);
    commit(s, "run-1", 2, FM_ERR_IO); /* already logged: refused, nothing written */
    /* a commit that fails half-way (a client row twice) leaves no round row behind */
    fm_round_row_t r = round_row(3);
    fm_client_round_row_t twice[2] = {0};
    snprintf(twice[0].client_id, 64, "a");
    snprintf(twice[1].client_id, 64, "a");
    uint8_t ck[1] = {9};
    assert_int_equal(fm_store_commit_round(s, "run-1", &r, twice, 2, ck, 1), FM_ERR_IO);
    assert_int_equal(fm_store_set_run_status(s, "run-1", "stopped"), FM_OK);
    fm_store_close(&s);

    /* what a resume reads, from a second connection */
    assert_int_equal(fm_store_open(&s, path, true), FM_OK);
    fm_run_row_t run;
    bool found = false;
    assert_int_equal(fm_store_latest_run(s, &run, &found), FM_OK);
    assert_true(found);
    assert_string_equal(run.id, "run-1");
    assert_string_equal(run.status, "stopped");
    assert_string_equal(run.config, "{\"x\":1}");
    assert_int_equal(run.rounds_done, 2);
    assert_int_equal(run.rounds_planned, 10);
    fm_store_run_clear(&run);
    fm_round_row_t *rounds;
    int n;
    assert_int_equal(fm_store_list_rounds(s, "run-1", &rounds, &n), FM_OK);
    assert_int_equal(n, 2);
    assert_int_equal(rounds[1].round, 2);
    assert_true(rounds[1].val_accuracy == 0.4);
    free(rounds);
    fm_client_round_row_t *rows;
    assert_int_equal(fm_store_list_client_rounds(s, "run-1", 2, &rows, &n), FM_OK);
    assert_int_equal(n, 2);
    assert_string_equal(rows[1].status, "dropped");
    assert_int_equal(rows[0].val_correct, 4);
    free(rows);
    fm_client_row_t *clients;
    assert_int_equal(fm_store_list_clients(s, "run-1", &clients, &n), FM_OK);
    assert_int_equal(n, 1);
    assert_int_equal(clients[0].partition_index, 3);
    free(clients);
    int round = 0;
    uint8_t *blob;
    size_t len;
    assert_int_equal(fm_store_latest_checkpoint(s, "run-1", &round, &blob, &len, &found), FM_OK);
    assert_true(found);
    assert_int_equal(round, 2);
    assert_int_equal(len, 4);
    assert_int_equal(blob[3], 2);
    free(blob);
    assert_int_equal(fm_store_latest_checkpoint(s, "run-none", &round, &blob, &len, &found), FM_OK);
    assert_false(found);
    fm_store_close(&s);
}

/* A database made before the validation columns: readable as it is, and
 * upgraded in place when a writer opens it. */
static void test_older_schema_upgrade(void **state)
{
    (void)state;
    char path[128];
    db_path(path, sizeof path);
    sqlite3 *db;
    assert_int_equal(sqlite3_open(path, &db), SQLITE_OK);
    const char *old =
        "CREATE TABLE runs (id TEXT PRIMARY KEY, started_at TEXT NOT NULL, finished_at TEXT, config TEXT NOT NULL,"
        " seed INTEGER NOT NULL, strategy TEXT NOT NULL, status TEXT NOT NULL, rounds_planned INTEGER NOT NULL);"
        "CREATE TABLE clients (run_id TEXT NOT NULL, id TEXT NOT NULL, first_seen TEXT NOT NULL, last_seen TEXT"
        " NOT NULL, specialists INTEGER, partition_index INTEGER, train_samples INTEGER, val_samples INTEGER,"
        " test_samples INTEGER, PRIMARY KEY (run_id, id));"
        "CREATE TABLE rounds (run_id TEXT NOT NULL, round INTEGER NOT NULL, started_at TEXT, finished_at TEXT,"
        " selected INTEGER, completed INTEGER, dropped INTEGER, train_loss REAL, test_loss REAL, test_accuracy REAL,"
        " bytes_up INTEGER, bytes_down INTEGER, seconds REAL, checkpoint_sha256 TEXT, PRIMARY KEY (run_id, round));"
        "CREATE TABLE client_rounds (run_id TEXT NOT NULL, round INTEGER NOT NULL, client_id TEXT NOT NULL,"
        " status TEXT NOT NULL, train_loss REAL, val_loss REAL, test_loss REAL, test_accuracy REAL,"
        " generalist_share REAL, train_samples INTEGER, test_samples INTEGER, test_correct INTEGER, seconds REAL,"
        " bytes_up INTEGER, bytes_down INTEGER, PRIMARY KEY (run_id, round, client_id));"
        "CREATE TABLE checkpoints (run_id TEXT NOT NULL, round INTEGER NOT NULL, state BLOB NOT NULL,"
        " sha256 TEXT NOT NULL, PRIMARY KEY (run_id, round));"
        "INSERT INTO runs VALUES ('old', '2025-01-01', NULL, '{}', 1, 'comigs', 'running', 5);"
        "INSERT INTO rounds (run_id, round, test_accuracy) VALUES ('old', 1, 0.75);";
    assert_int_equal(sqlite3_exec(db, old, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    fm_store_t *s;
    fm_round_row_t *rounds;
    int n;
    assert_int_equal(fm_store_open(&s, path, true), FM_OK); /* a reader does not change it */
    assert_int_equal(fm_store_list_rounds(s, "old", &rounds, &n), FM_OK);
    assert_int_equal(n, 1);
    assert_true(rounds[0].test_accuracy == 0.75);
    free(rounds);
    fm_store_close(&s);
    assert_int_equal(fm_store_open(&s, path, false), FM_OK);
    commit(s, "old", 2, FM_OK);
    assert_int_equal(fm_store_list_rounds(s, "old", &rounds, &n), FM_OK);
    assert_int_equal(n, 2);
    assert_true(rounds[1].val_accuracy == 0.4);
    free(rounds);
    fm_client_round_row_t *rows;
    assert_int_equal(fm_store_list_client_rounds(s, "old", 2, &rows, &n), FM_OK);
    assert_int_equal(rows[0].val_samples, 10);
    free(rows);
    fm_store_close(&s);
}

static void test_missing_folder_refused(void **state)
{
    (void)state;
    fm_store_t *s = NULL;
    assert_int_not_equal(fm_store_open(&s, "/nonexistent-dir/x/log.db", false), FM_OK);
    assert_null(s);
    assert_true(strlen(fm_error_last()) > 0);
}

/* Gives every field of a record a value of its own (field i: i + 1.25, or the
 * text "vI"); the key fields a and b. */
static void fill(const fm_record_t *r, void *row, int round, const char *client)
{
    memset(row, 0, r->row_size);
    for (int i = 0; i < r->count; i++) {
        const fm_field_t *f = &r->fields[i];
        char *p = (char *)row + f->offset;
        switch (f->type) {
        case FM_FIELD_INT: *(int *)p = i + 1; break;
        case FM_FIELD_INT64: *(int64_t *)p = ((int64_t)1 << 40) + i; break;
        case FM_FIELD_REAL: *(double *)p = i + 1.25; break;
        case FM_FIELD_TEXT: snprintf(p, f->size, "v%d", i); break;
        }
    }
    *(int *)((char *)row + fm_record_field(r, "round")->offset) = round;
    if (client)
        snprintf((char *)row + fm_record_field(r, "client")->offset, 64, "%s", client);
}

/* Every field of the round and client records, whatever it is, goes into the
 * log and comes back out as it went in, and into the JSON and CSV the export
 * and the view write: adding a field to store.h's lists is all it takes. */
static void test_every_field_round_trips(void **state)
{
    (void)state;
    char path[256];
    db_path(path, sizeof path);
    fm_store_t *s;
    assert_int_equal(fm_store_open(&s, path, false), FM_OK);
    assert_int_equal(fm_store_create_run(s, "r1", "{}", 1, "full", 5), FM_OK);
    fm_round_row_t r;
    fm_client_round_row_t c;
    fill(&fm_round_record, &r, 3, NULL);
    fill(&fm_client_round_record, &c, 3, "c1");
    assert_int_equal(fm_store_commit_round(s, "r1", &r, &c, 1, NULL, 0), FM_OK);
    fm_round_row_t *rr;
    fm_client_round_row_t *cr;
    int n;
    assert_int_equal(fm_store_list_rounds(s, "r1", &rr, &n), FM_OK);
    assert_int_equal(n, 1);
    assert_memory_equal(rr, &r, sizeof r);
    assert_int_equal(fm_store_list_client_rounds(s, "r1", 3, &cr, &n), FM_OK);
    assert_int_equal(n, 1);
    assert_memory_equal(cr, &c, sizeof c);
    const fm_record_t *recs[2] = {&fm_round_record, &fm_client_round_record};
    const void *rows[2] = {rr, cr};
    for (int k = 0; k < 2; k++) {
        char json[4096], csv[4096];
        FILE *f = fmemopen(json, sizeof json, "w");
        fm_record_json(f, recs[k], rows[k], NULL);
        fclose(f);
        f = fmemopen(csv, sizeof csv, "w");
        fm_record_csv_header(f, recs[k], "run");
        fm_record_csv(f, recs[k], rows[k], "r1");
        fclose(f);
        for (int i = 0; i < recs[k]->count; i++) {
            char want[96];
            snprintf(want, sizeof want, "\"%s\":", recs[k]->fields[i].key);
            assert_non_null(strstr(json, want));
            assert_non_null(strstr(csv, recs[k]->fields[i].key));
            const char *text = fm_field_text(&recs[k]->fields[i], rows[k]);
            if (text)
                snprintf(want, sizeof want, "\"%s\":\"%s\"", recs[k]->fields[i].key, text);
            else
                snprintf(want, sizeof want, "\"%s\":%.9g", recs[k]->fields[i].key,
                         fm_field_num(&recs[k]->fields[i], rows[k]));
            if (recs[k]->fields[i].type != FM_FIELD_INT64) /* (printed as integers, not %.9g) */
                assert_non_null(strstr(json, want));
        }
    }
    free(rr);
    free(cr);
    fm_store_close(&s);
}

int main(void)
{
    fm_log_set_level(FM_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_commit_and_resume_reads),
        cmocka_unit_test(test_older_schema_upgrade),
        cmocka_unit_test(test_missing_folder_refused),
        cmocka_unit_test(test_every_field_round_trips),
    };
    return procs_run_tests("store", tests, sizeof tests / sizeof tests[0], dir, sizeof dir);
}
