#include "fedmoe/store.h"

#include <sqlite3.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fedmoe/clock.h"
#include "fedmoe/log.h"
#include "fedmoe/record.h"

/* The records with metrics (record.h): the rounds and client_rounds tables. */
static const fm_record_t *const RECORDS[] = {&fm_round_record, &fm_client_round_record};
enum { ROUNDS = 0, CLIENT_ROUNDS = 1, NRECORDS = 2 };

struct fm_store {
    sqlite3 *db;
    char path[1024];
    uint64_t absent[NRECORDS]; /* per record, bit i: field i's column is not in this file (a
                                  database older than the field, opened read-only) */
};

static const char *SCHEMA =
    "CREATE TABLE IF NOT EXISTS runs ("
    " id TEXT PRIMARY KEY, started_at TEXT NOT NULL, finished_at TEXT, config TEXT NOT NULL,"
    " seed INTEGER NOT NULL, strategy TEXT NOT NULL, status TEXT NOT NULL, rounds_planned INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS clients ("
    " run_id TEXT NOT NULL, id TEXT NOT NULL, first_seen TEXT NOT NULL, last_seen TEXT NOT NULL,"
    " specialists INTEGER, partition_index INTEGER, train_samples INTEGER, val_samples INTEGER,"
    " test_samples INTEGER, PRIMARY KEY (run_id, id));"
    "CREATE TABLE IF NOT EXISTS checkpoints ("
    " run_id TEXT NOT NULL, round INTEGER NOT NULL, state BLOB NOT NULL, sha256 TEXT NOT NULL,"
    " PRIMARY KEY (run_id, round));";

static bool column_exists(sqlite3 *db, const char *table, const char *column)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db, "SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2", -1, &st, NULL) != SQLITE_OK)
        return false;
    sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, column, -1, SQLITE_STATIC);
    bool found = sqlite3_step(st) == SQLITE_ROW;
    sqlite3_finalize(st);
    return found;
}

static const char *sql_type(fm_field_type t)
{
    return t == FM_FIELD_TEXT ? "TEXT" : t == FM_FIELD_REAL ? "REAL" : "INTEGER";
}

/* A record's table: run_id, then its fields in order; the key is run_id and
 * the key fields. */
static int create_table(sqlite3 *db, const fm_record_t *r, char **err)
{
    char sql[2048], key[256] = "run_id";
    size_t n = (size_t)snprintf(sql, sizeof sql, "CREATE TABLE IF NOT EXISTS %s (run_id TEXT NOT NULL", r->table);
    for (int i = 0; i < r->count && n < sizeof sql; i++) {
        const fm_field_t *f = &r->fields[i];
        n += (size_t)snprintf(sql + n, sizeof sql - n, ", %s %s%s", f->column, sql_type(f->type),
                              f->flags & (FM_FIELD_KEY | FM_FIELD_NOTNULL) ? " NOT NULL" : "");
        if (f->flags & FM_FIELD_KEY)
            snprintf(key + strlen(key), sizeof key - strlen(key), ", %s", f->column);
    }
    if (n < sizeof sql)
        snprintf(sql + n, sizeof sql - n, ", PRIMARY KEY (%s));", key);
    return sqlite3_exec(db, sql, NULL, NULL, err);
}

/* Columns added after the first schema: a database made before them gets them
 * (NULL in old rows) when the coordinator opens it. */
static int migrate(sqlite3 *db, char **err)
{
    for (int k = 0; k < NRECORDS; k++) {
        const fm_record_t *r = RECORDS[k];
        int rc = create_table(db, r, err);
        for (int i = 0; rc == SQLITE_OK && i < r->count; i++) {
            const fm_field_t *f = &r->fields[i];
            if (!(f->flags & FM_FIELD_ADDED) || column_exists(db, r->table, f->column))
                continue;
            char sql[256];
            snprintf(sql, sizeof sql, "ALTER TABLE %s ADD COLUMN %s %s", r->table, f->column, sql_type(f->type));
            rc = sqlite3_exec(db, sql, NULL, NULL, err);
        }
        if (rc != SQLITE_OK)
            return rc;
    }
    /* (a client's history across rounds: the browser view's drill-down) */
    return sqlite3_exec(db, "CREATE INDEX IF NOT EXISTS client_rounds_by_client ON client_rounds (run_id, client_id, round);",
                        NULL, NULL, err);
}

/* "INSERT INTO table (run_id, c1, ...) VALUES (?1, ?2, ...)" of record k: a
 * writer has every column (it migrated the file). */
static void insert_sql(int k, char *buf, size_t cap)
{
    const fm_record_t *r = RECORDS[k];
    size_t n = (size_t)snprintf(buf, cap, "INSERT INTO %s (run_id", r->table);
    for (int i = 0; i < r->count && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, ", %s", r->fields[i].column);
    for (int i = 0; i <= r->count && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s?%d", i ? ", " : ") VALUES (", i + 1);
    if (n < cap)
        snprintf(buf + n, cap - n, ")");
}

/* "c1, c2, ..." of a record's fields to read, NULL for those absent from the
 * file. */
static void column_list(const fm_store_t *s, int k, char *buf, size_t cap)
{
    const fm_record_t *r = RECORDS[k];
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < r->count && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "",
                              s->absent[k] >> i & 1 ? "NULL" : r->fields[i].column);
}

/* Reads a row of record k from a statement whose columns are column_list's:
 * NULL reads as NaN in an added real field (not logged then), 0 elsewhere. */
static void read_row(sqlite3_stmt *st, int k, void *row)
{
    const fm_record_t *r = RECORDS[k];
    memset(row, 0, r->row_size);
    for (int i = 0; i < r->count; i++) {
        const fm_field_t *f = &r->fields[i];
        char *p = (char *)row + f->offset;
        bool null = sqlite3_column_type(st, i) == SQLITE_NULL;
        switch (f->type) {
        case FM_FIELD_INT: *(int *)p = sqlite3_column_int(st, i); break;
        case FM_FIELD_INT64: *(int64_t *)p = sqlite3_column_int64(st, i); break;
        case FM_FIELD_REAL: *(double *)p = null && (f->flags & FM_FIELD_ADDED) ? NAN : sqlite3_column_double(st, i); break;
        case FM_FIELD_TEXT: {
            const unsigned char *t = sqlite3_column_text(st, i);
            snprintf(p, f->size, "%s", t ? (const char *)t : "");
            break;
        }
        }
    }
}

static void read_round(sqlite3_stmt *st, void *p) { read_row(st, ROUNDS, p); }
static void read_client_round(sqlite3_stmt *st, void *p) { read_row(st, CLIENT_ROUNDS, p); }

/* Binds run_id as ?1 and the row's fields as ?2.. */
static void bind_row(sqlite3_stmt *st, int k, const char *run_id, const void *row)
{
    const fm_record_t *r = RECORDS[k];
    sqlite3_bind_text(st, 1, run_id, -1, SQLITE_TRANSIENT);
    for (int i = 0; i < r->count; i++) {
        const fm_field_t *f = &r->fields[i];
        const char *p = (const char *)row + f->offset;
        switch (f->type) {
        case FM_FIELD_INT: sqlite3_bind_int(st, i + 2, *(const int *)p); break;
        case FM_FIELD_INT64: sqlite3_bind_int64(st, i + 2, *(const int64_t *)p); break;
        case FM_FIELD_REAL: sqlite3_bind_double(st, i + 2, *(const double *)p); break;
        case FM_FIELD_TEXT: sqlite3_bind_text(st, i + 2, p, -1, SQLITE_TRANSIENT); break;
        }
    }
}

static fm_status db_error(fm_store_t *s, const char *what)
{
    fm_error_set("%s: %s: %s", s->path, what, sqlite3_errmsg(s->db));
    return FM_ERR_IO;
}

/* Runs a statement that returns no rows, once, and finalizes it. */
static fm_status step_once(fm_store_t *s, sqlite3_stmt *st, const char *what)
{
    int rc = sqlite3_step(st);
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? FM_OK : db_error(s, what);
}

fm_status fm_store_open(fm_store_t **out, const char *path, bool readonly)
{
    *out = NULL;
    fm_store_t *s = calloc(1, sizeof *s);
    if (!s)
        return FM_ERR_NOMEM;
    snprintf(s->path, sizeof s->path, "%s", path);
    int flags = readonly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
    /* a new round log is the owner's alone (it holds every client's prompt and
     * metrics); SQLite gives its -wal and -shm files the same mode */
    int fd = readonly ? -1 : open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0)
        close(fd);
    if (sqlite3_open_v2(path, &s->db, flags, NULL) != SQLITE_OK) {
        fm_error_set("%s: cannot open database: %s", path, s->db ? sqlite3_errmsg(s->db) : "out of memory");
        fm_store_close(&s);
        return FM_ERR_IO;
    }
    sqlite3_busy_timeout(s->db, 5000);
    char *err = NULL;
    if (!readonly) {
        if (sqlite3_db_readonly(s->db, "main") == 1) {
            fm_error_set("%s: the database is read-only; the coordinator needs to write its round log", path);
            fm_store_close(&s);
            return FM_ERR_IO;
        }
        /* a write probe: catches read-only folders and files that are not databases */
        if (sqlite3_exec(s->db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;", NULL, NULL, &err) != SQLITE_OK ||
            sqlite3_exec(s->db, SCHEMA, NULL, NULL, &err) != SQLITE_OK || migrate(s->db, &err) != SQLITE_OK ||
            sqlite3_exec(s->db, "BEGIN IMMEDIATE; COMMIT;", NULL, NULL, &err) != SQLITE_OK) {
            fm_error_set("%s: cannot use it as the round log: %s", path, err ? err : "?");
            sqlite3_free(err);
            fm_store_close(&s);
            return FM_ERR_IO;
        }
    } else if (sqlite3_exec(s->db, "SELECT count(*) FROM runs", NULL, NULL, &err) != SQLITE_OK) {
        fm_error_set("%s: not a fedmoe database: %s", path, err ? err : "?");
        sqlite3_free(err);
        fm_store_close(&s);
        return FM_ERR_FORMAT;
    }
    for (int k = 0; k < NRECORDS; k++) /* (only a column added later can be missing) */
        for (int i = 0; i < RECORDS[k]->count; i++)
            if ((RECORDS[k]->fields[i].flags & FM_FIELD_ADDED) &&
                !column_exists(s->db, RECORDS[k]->table, RECORDS[k]->fields[i].column))
                s->absent[k] |= (uint64_t)1 << i;
    *out = s;
    return FM_OK;
}

void fm_store_close(fm_store_t **sp)
{
    if (!sp || !*sp)
        return;
    sqlite3_close((*sp)->db);
    free(*sp);
    *sp = NULL;
}

void fm_store_run_clear(fm_run_row_t *r)
{
    free(r->config);
    r->config = NULL;
}

static fm_status prepare(fm_store_t *s, sqlite3_stmt **st, const char *sql)
{
    if (sqlite3_prepare_v2(s->db, sql, -1, st, NULL) != SQLITE_OK)
        return db_error(s, "prepare");
    return FM_OK;
}

static void copy_text(char *dst, size_t cap, sqlite3_stmt *st, int col)
{
    const unsigned char *t = sqlite3_column_text(st, col);
    snprintf(dst, cap, "%s", t ? (const char *)t : "");
}

fm_status fm_store_create_run(fm_store_t *s, const char *run_id, const char *config_json, uint64_t seed,
                              const char *strategy, int rounds_planned)
{
    sqlite3_stmt *st;
    if (prepare(s, &st, "INSERT INTO runs (id, started_at, config, seed, strategy, status, rounds_planned)"
                        " VALUES (?, ?, ?, ?, ?, 'running', ?)") != FM_OK)
        return FM_ERR_IO;
    char now[32];
    fm_clock_utc(now);
    sqlite3_bind_text(st, 1, run_id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, now, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 3, config_json, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)seed);
    sqlite3_bind_text(st, 5, strategy, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, 6, rounds_planned);
    return step_once(s, st, "create run");
}

fm_status fm_store_set_run_status(fm_store_t *s, const char *run_id, const char *status)
{
    sqlite3_stmt *st;
    if (prepare(s, &st, "UPDATE runs SET status = ?, finished_at = CASE WHEN ? = 'running' THEN NULL ELSE ? END"
                        " WHERE id = ?") != FM_OK)
        return FM_ERR_IO;
    char now[32];
    fm_clock_utc(now);
    sqlite3_bind_text(st, 1, status, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, status, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 3, now, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 4, run_id, -1, SQLITE_TRANSIENT);
    return step_once(s, st, "set run status");
}

fm_status fm_store_upsert_client(fm_store_t *s, const char *run_id, const fm_client_row_t *c)
{
    sqlite3_stmt *st;
    if (prepare(s, &st, "INSERT INTO clients (run_id, id, first_seen, last_seen, specialists, partition_index,"
                        " train_samples, val_samples, test_samples) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                        " ON CONFLICT (run_id, id) DO UPDATE SET last_seen = excluded.last_seen,"
                        " specialists = excluded.specialists, partition_index = excluded.partition_index,"
                        " train_samples = excluded.train_samples, val_samples = excluded.val_samples,"
                        " test_samples = excluded.test_samples") != FM_OK)
        return FM_ERR_IO;
    sqlite3_bind_text(st, 1, run_id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, c->id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 3, c->first_seen, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 4, c->last_seen, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, 5, c->specialists);
    sqlite3_bind_int(st, 6, c->partition_index);
    sqlite3_bind_int64(st, 7, c->train_samples);
    sqlite3_bind_int64(st, 8, c->val_samples);
    sqlite3_bind_int64(st, 9, c->test_samples);
    return step_once(s, st, "record client");
}

fm_status fm_store_commit_round(fm_store_t *s, const char *run_id, const fm_round_row_t *r,
                                const fm_client_round_row_t *rows, int n, const uint8_t *ckpt, size_t ckpt_len)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_exec(s->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
        return db_error(s, "begin");
    fm_status status = FM_ERR_IO;
    const char *what = "log round";
    char sql[2048];
    insert_sql(ROUNDS, sql, sizeof sql);
    if (prepare(s, &st, sql) != FM_OK)
        goto rollback;
    bind_row(st, ROUNDS, run_id, r);
    if (sqlite3_step(st) != SQLITE_DONE)
        goto rollback;
    sqlite3_finalize(st);
    st = NULL;
    what = "log client rounds";
    insert_sql(CLIENT_ROUNDS, sql, sizeof sql);
    if (prepare(s, &st, sql) != FM_OK)
        goto rollback;
    for (int i = 0; i < n; i++) {
        fm_client_round_row_t c = rows[i];
        c.round = r->round; /* (a round's client rows are logged under its number) */
        sqlite3_reset(st);
        bind_row(st, CLIENT_ROUNDS, run_id, &c);
        if (sqlite3_step(st) != SQLITE_DONE)
            goto rollback;
    }
    sqlite3_finalize(st);
    st = NULL;
    if (ckpt) {
        what = "write checkpoint";
        if (prepare(s, &st, "DELETE FROM checkpoints WHERE run_id = ?") != FM_OK)
            goto rollback;
        sqlite3_bind_text(st, 1, run_id, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(st) != SQLITE_DONE)
            goto rollback;
        sqlite3_finalize(st);
        st = NULL;
        if (prepare(s, &st, "INSERT INTO checkpoints (run_id, round, state, sha256) VALUES (?, ?, ?, ?)") != FM_OK)
            goto rollback;
        sqlite3_bind_text(st, 1, run_id, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int(st, 2, r->round);
        sqlite3_bind_blob64(st, 3, ckpt, ckpt_len, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 4, r->checkpoint_sha256, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(st) != SQLITE_DONE)
            goto rollback;
        sqlite3_finalize(st);
        st = NULL;
    }
    if (sqlite3_exec(s->db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
        what = "commit";
        goto rollback;
    }
    return FM_OK;
rollback:
    status = db_error(s, what);
    if (st)
        sqlite3_finalize(st);
    sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    return status;
}

#define RUN_COLUMNS                                                                                 \
    "SELECT r.id, r.started_at, r.finished_at, r.strategy, r.status, r.seed, r.rounds_planned, "   \
    "(SELECT count(*) FROM rounds WHERE run_id = r.id), r.config FROM runs r "

static void read_run(sqlite3_stmt *st, fm_run_row_t *r)
{
    memset(r, 0, sizeof *r);
    copy_text(r->id, sizeof r->id, st, 0);
    copy_text(r->started_at, sizeof r->started_at, st, 1);
    copy_text(r->finished_at, sizeof r->finished_at, st, 2);
    copy_text(r->strategy, sizeof r->strategy, st, 3);
    copy_text(r->status, sizeof r->status, st, 4);
    r->seed = (uint64_t)sqlite3_column_int64(st, 5);
    r->rounds_planned = sqlite3_column_int(st, 6);
    r->rounds_done = sqlite3_column_int(st, 7);
    const unsigned char *cfg = sqlite3_column_text(st, 8);
    r->config = strdup(cfg ? (const char *)cfg : "{}");
}

static fm_status one_run(fm_store_t *s, const char *sql, const char *run_id, fm_run_row_t *out, bool *found)
{
    *found = false;
    sqlite3_stmt *st;
    if (prepare(s, &st, sql) != FM_OK)
        return FM_ERR_IO;
    if (run_id)
        sqlite3_bind_text(st, 1, run_id, -1, SQLITE_TRANSIENT);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        read_run(st, out);
        *found = true;
    }
    sqlite3_finalize(st);
    return rc == SQLITE_ROW || rc == SQLITE_DONE ? FM_OK : db_error(s, "read runs");
}

fm_status fm_store_latest_run(fm_store_t *s, fm_run_row_t *out, bool *found)
{
    return one_run(s, RUN_COLUMNS "ORDER BY r.started_at DESC, r.rowid DESC LIMIT 1", NULL, out, found);
}

fm_status fm_store_get_run(fm_store_t *s, const char *run_id, fm_run_row_t *out, bool *found)
{
    return one_run(s, RUN_COLUMNS "WHERE r.id = ?", run_id, out, found);
}

fm_status fm_store_check(fm_store_t *s, bool *ok, char *report, size_t cap)
{
    sqlite3_stmt *st;
    fm_status e = prepare(s, &st, "PRAGMA integrity_check(20)");
    if (e != FM_OK)
        return e;
    size_t used = 0;
    int rc;
    report[0] = 0;
    *ok = false;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *line = (const char *)sqlite3_column_text(st, 0);
        if (line && !strcmp(line, "ok") && used == 0)
            *ok = true;
        if (used < cap)
            used += (size_t)snprintf(report + used, cap - used, "%s%s", used ? "\n" : "", line ? line : "?");
    }
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? FM_OK : db_error(s, "integrity check");
}

/* Runs a query and reads every row with `read` into a growing array. */
static fm_status read_all(fm_store_t *s, sqlite3_stmt *st, void **rows, int *n, size_t size,
                          void (*read)(sqlite3_stmt *, void *))
{
    *rows = NULL;
    *n = 0;
    int cap = 0, rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            void *p = realloc(*rows, size * cap);
            if (!p) {
                sqlite3_finalize(st);
                return FM_ERR_NOMEM;
            }
            *rows = p;
        }
        read(st, (char *)*rows + size * (size_t)*n);
        (*n)++;
    }
    sqlite3_finalize(st);
    return rc == SQLITE_DONE ? FM_OK : db_error(s, "read");
}

static void read_run_v(sqlite3_stmt *st, void *p) { read_run(st, p); }

fm_status fm_store_list_runs(fm_store_t *s, fm_run_row_t **rows, int *n)
{
    sqlite3_stmt *st;
    if (prepare(s, &st, RUN_COLUMNS "ORDER BY r.started_at, r.rowid") != FM_OK)
        return FM_ERR_IO;
    return read_all(s, st, (void **)rows, n, sizeof **rows, read_run_v);
}

fm_status fm_store_list_rounds(fm_store_t *s, const char *run_id, fm_round_row_t **rows, int *n)
{
    return fm_store_list_rounds_since(s, run_id, 0, -1, rows, n);
}

fm_status fm_store_list_rounds_since(fm_store_t *s, const char *run_id, int since, int limit, fm_round_row_t **rows,
                                     int *n)
{
    sqlite3_stmt *st;
    char sql[1280];
    char cols[1024];
    column_list(s, ROUNDS, cols, sizeof cols);
    snprintf(sql, sizeof sql, "SELECT %s FROM rounds WHERE run_id = ? AND round > ? ORDER BY round LIMIT ?", cols);
    if (prepare(s, &st, sql) != FM_OK)
        return FM_ERR_IO;
    sqlite3_bind_text(st, 1, run_id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, 2, since);
    sqlite3_bind_int(st, 3, limit);
    return read_all(s, st, (void **)rows, n, sizeof **rows, read_round);
}

/* Client rows of run_id: of round `round` (< 0: every round), of client `client`
 * only (NULL: every client) from round since + 1 on, at most limit (< 0: all). */
static fm_status client_rounds(fm_store_t *s, const char *run_id, int round, const char *client, int since, int limit,
                               fm_client_round_row_t **rows, int *n)
{
    sqlite3_stmt *st;
    char sql[1280];
    /* (the conditions written only when they apply: an OR of "no round" and
     * "this round", or a range beside the round, kept SQLite from the
     * primary key: a scan of the run's log) */
    char cols[1024];
    column_list(s, CLIENT_ROUNDS, cols, sizeof cols);
    snprintf(sql, sizeof sql, "SELECT %s FROM client_rounds WHERE run_id = ?1%s%s ORDER BY round, client_id LIMIT ?5",
             cols, round >= 0 ? " AND round = ?2" : " AND round > ?4", client ? " AND client_id = ?3" : "");
    if (prepare(s, &st, sql) != FM_OK)
        return FM_ERR_IO;
    sqlite3_bind_text(st, 1, run_id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, 2, round);
    if (client)
        sqlite3_bind_text(st, 3, client, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, 4, since);
    sqlite3_bind_int(st, 5, limit);
    return read_all(s, st, (void **)rows, n, sizeof **rows, read_client_round);
}

fm_status fm_store_list_client_rounds(fm_store_t *s, const char *run_id, int round, fm_client_round_row_t **rows,
                                      int *n)
{
    return client_rounds(s, run_id, round, NULL, -1, -1, rows, n);
}

fm_status fm_store_client_history(fm_store_t *s, const char *run_id, const char *client, int since, int limit,
                                  fm_client_round_row_t **rows, int *n)
{
    return client_rounds(s, run_id, -1, client, since, limit, rows, n);
}

static void read_client(sqlite3_stmt *st, void *p)
{
    fm_client_row_t *c = p;
    memset(c, 0, sizeof *c);
    copy_text(c->id, sizeof c->id, st, 0);
    copy_text(c->first_seen, sizeof c->first_seen, st, 1);
    copy_text(c->last_seen, sizeof c->last_seen, st, 2);
    c->specialists = sqlite3_column_int(st, 3);
    c->partition_index = sqlite3_column_int(st, 4);
    c->train_samples = sqlite3_column_int64(st, 5);
    c->val_samples = sqlite3_column_int64(st, 6);
    c->test_samples = sqlite3_column_int64(st, 7);
}

fm_status fm_store_list_clients(fm_store_t *s, const char *run_id, fm_client_row_t **rows, int *n)
{
    sqlite3_stmt *st;
    if (prepare(s, &st, "SELECT id, first_seen, last_seen, specialists, partition_index, train_samples,"
                        " val_samples, test_samples FROM clients WHERE run_id = ? ORDER BY id") != FM_OK)
        return FM_ERR_IO;
    sqlite3_bind_text(st, 1, run_id, -1, SQLITE_TRANSIENT);
    return read_all(s, st, (void **)rows, n, sizeof **rows, read_client);
}

fm_status fm_store_latest_checkpoint(fm_store_t *s, const char *run_id, int *round, uint8_t **blob, size_t *len,
                                     bool *found)
{
    *found = false;
    *blob = NULL;
    *len = 0;
    sqlite3_stmt *st;
    if (prepare(s, &st, "SELECT round, state, sha256 FROM checkpoints WHERE run_id = ? ORDER BY round DESC LIMIT 1") != FM_OK)
        return FM_ERR_IO;
    sqlite3_bind_text(st, 1, run_id, -1, SQLITE_TRANSIENT);
    int rc = sqlite3_step(st);
    fm_status status = FM_OK;
    if (rc == SQLITE_ROW) {
        *round = sqlite3_column_int(st, 0);
        const void *b = sqlite3_column_blob(st, 1);
        size_t n = (size_t)sqlite3_column_bytes(st, 1);
        const unsigned char *want = sqlite3_column_text(st, 2);
        char got[65];
        fm_sha256_hex(b, n, got);
        if (!want || strcmp(got, (const char *)want) != 0) {
            fm_error_set("%s: checkpoint of run %s round %d fails its SHA-256 check", s->path, run_id, *round);
            status = FM_ERR_FORMAT;
        } else if ((*blob = malloc(n ? n : 1)) == NULL) {
            status = FM_ERR_NOMEM;
        } else {
            memcpy(*blob, b, n);
            *len = n;
            *found = true;
        }
    } else if (rc != SQLITE_DONE) {
        status = db_error(s, "read checkpoint");
    }
    sqlite3_finalize(st);
    return status;
}
