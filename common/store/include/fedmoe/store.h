/* store.h - the round log: one SQLite file in WAL mode (docs/architecture.md).
 *
 * The coordinator is the only writer; it commits each round (the round row, its
 * client rows and a checkpoint of the global state) in one transaction, so a
 * crash leaves the database at the last committed round. fedmoe-history and
 * fedmoe-sim read the same file while the daemon writes. Only the newest
 * checkpoint of a run is kept; every round row records its checkpoint's SHA-256. */
#ifndef FEDMOE_STORE_H
#define FEDMOE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fedmoe/status.h"

typedef struct fm_store fm_store_t;

/* Opens (creating the schema when writable). Caller closes. */
fm_status fm_store_open(fm_store_t **out, const char *path, bool readonly);
/* Closes the database and frees the store; sets *s to NULL; safe on NULL. */
void fm_store_close(fm_store_t **s);

typedef struct {
    char id[64];
    char started_at[32], finished_at[32];
    char strategy[16];
    char status[16];        /* running, finished, stopped */
    uint64_t seed;
    int rounds_planned;
    int rounds_done;        /* committed rounds */
    char *config;           /* JSON, malloc'd (free with fm_store_run_clear) */
} fm_run_row_t;
/* Frees what the row owns (config) and zeroes it; the row itself is the caller's. */
void fm_store_run_clear(fm_run_row_t *r);

/* The round log's two records with metrics, each written once: a list of its
 * fields, X(name, type, capacity, key, flags), from which come the struct, the
 * table's columns, the insert, the reads, the JSON and CSV of fedmoe-history
 * export and of the browser view's API (record.h). type: INT (int), INT64
 * (int64_t), REAL (double), TEXT (char[capacity]); key: the name in JSON and
 * CSV; flags: FM_FIELD_KEY (part of the row's key: NOT NULL), FM_FIELD_NOTNULL,
 * FM_FIELD_ADDED (added after the first schema: older databases get the column
 * when a coordinator opens them; NULL reads as NaN or 0). Adding a metric is
 * one line here and its computation. */
#define FM_ROUND_FIELDS(X) \
    X(round, INT, 0, "round", FM_FIELD_KEY) \
    X(started_at, TEXT, 32, "started_at", 0) \
    X(finished_at, TEXT, 32, "finished_at", 0) \
    X(selected, INT, 0, "selected", 0) \
    X(completed, INT, 0, "completed", 0) \
    X(dropped, INT, 0, "dropped", 0) \
    X(train_loss, REAL, 0, "train_loss", 0)   /* nats */ \
    X(test_loss, REAL, 0, "test_loss", 0) \
    X(test_accuracy, REAL, 0, "test_accuracy", 0) \
    X(bytes_up, INT64, 0, "bytes_up", 0) \
    X(bytes_down, INT64, 0, "bytes_down", 0) \
    X(seconds, REAL, 0, "seconds", 0) \
    X(checkpoint_sha256, TEXT, 65, "checkpoint_sha256", 0) \
    X(val_accuracy, REAL, 0, "val_accuracy", FM_FIELD_ADDED) /* total correct / total validation examples */ \
    X(generalist_share, REAL, 0, "generalist_share", FM_FIELD_ADDED) /* weighted by test examples */ \
    X(epsilon, REAL, 0, "epsilon", FM_FIELD_ADDED) /* differential privacy spent so far (--dp-noise); NULL: off */

#define FM_CLIENT_ROUND_FIELDS(X) \
    X(round, INT, 0, "round", FM_FIELD_KEY) \
    X(client_id, TEXT, 64, "client", FM_FIELD_KEY) \
    X(status, TEXT, 16, "status", FM_FIELD_NOTNULL) /* completed, rejected, dropped, awaited */ \
    X(train_loss, REAL, 0, "train_loss", 0) \
    X(val_loss, REAL, 0, "val_loss", 0) \
    X(test_loss, REAL, 0, "test_loss", 0) \
    X(test_accuracy, REAL, 0, "test_accuracy", 0) \
    X(generalist_share, REAL, 0, "generalist_share", 0) \
    X(train_samples, INT64, 0, "train_samples", 0) \
    X(test_samples, INT64, 0, "test_samples", 0) \
    X(test_correct, INT64, 0, "test_correct", 0) \
    X(seconds, REAL, 0, "seconds", 0) \
    X(bytes_up, INT64, 0, "bytes_up", 0) \
    X(bytes_down, INT64, 0, "bytes_down", 0) \
    X(val_samples, INT64, 0, "val_samples", FM_FIELD_ADDED) \
    X(val_correct, INT64, 0, "val_correct", FM_FIELD_ADDED)

#define FM_FIELD_KEY 1u
#define FM_FIELD_ADDED 2u
#define FM_FIELD_NOTNULL 4u
#define FM_FIELD_DECL_INT(name, cap) int name;
#define FM_FIELD_DECL_INT64(name, cap) int64_t name;
#define FM_FIELD_DECL_REAL(name, cap) double name;
#define FM_FIELD_DECL_TEXT(name, cap) char name[cap];
#define FM_FIELD_DECL(name, type, cap, key, flags) FM_FIELD_DECL_##type(name, cap)

typedef struct {
    FM_ROUND_FIELDS(FM_FIELD_DECL)
} fm_round_row_t;

typedef struct {
    FM_CLIENT_ROUND_FIELDS(FM_FIELD_DECL)
} fm_client_round_row_t;

typedef struct {
    char id[64];
    char first_seen[32], last_seen[32];
    int specialists, partition_index;
    int64_t train_samples, val_samples, test_samples;
} fm_client_row_t;

/* Writer side. Strings are copied; nothing passed in is kept. */
/* A new run row, status "running". */
fm_status fm_store_create_run(fm_store_t *s, const char *run_id, const char *config_json, uint64_t seed,
                              const char *strategy, int rounds_planned);
/* Sets a run's status (running, finished, stopped) and its finish time. */
fm_status fm_store_set_run_status(fm_store_t *s, const char *run_id, const char *status);
/* Inserts the client row or updates the one with its id (last_seen, counts). */
fm_status fm_store_upsert_client(fm_store_t *s, const char *run_id, const fm_client_row_t *c);
/* One transaction: the round row, its client rows, and the checkpoint (replacing
 * the run's older checkpoints). Fails without writing anything if the round is
 * already logged. */
fm_status fm_store_commit_round(fm_store_t *s, const char *run_id, const fm_round_row_t *r,
                                const fm_client_round_row_t *rows, int n, const uint8_t *ckpt, size_t ckpt_len);

/* Reader side */
/* The most recent run; *found false when there is none. */
fm_status fm_store_latest_run(fm_store_t *s, fm_run_row_t *out, bool *found);
/* The run with this id; *found false when there is none. out owns its config:
 * fm_store_run_clear it (likewise for fm_store_latest_run). */
fm_status fm_store_get_run(fm_store_t *s, const char *run_id, fm_run_row_t *out, bool *found);
/* All runs, oldest first; *rows malloc'd (clear each, then free). */
fm_status fm_store_list_runs(fm_store_t *s, fm_run_row_t **rows, int *n);
/* A run's rounds in order; *rows malloc'd, the caller frees it (NULL when *n is 0),
 * as for the two lists below. */
fm_status fm_store_list_rounds(fm_store_t *s, const char *run_id, fm_round_row_t **rows, int *n);
/* Its rounds after round `since`, at most limit of them (< 0: all). */
fm_status fm_store_list_rounds_since(fm_store_t *s, const char *run_id, int since, int limit, fm_round_row_t **rows,
                                     int *n);
/* One client's rows in a run, after round `since`, at most limit (< 0: all). */
fm_status fm_store_client_history(fm_store_t *s, const char *run_id, const char *client, int since, int limit,
                                  fm_client_round_row_t **rows, int *n);
/* Client rows of one round, or of every round with round < 0. */
fm_status fm_store_list_client_rounds(fm_store_t *s, const char *run_id, int round, fm_client_round_row_t **rows,
                                      int *n);
/* The clients that said Hello in a run. */
fm_status fm_store_list_clients(fm_store_t *s, const char *run_id, fm_client_row_t **rows, int *n);
/* The newest checkpoint of a run: its round and blob (malloc'd; the caller frees it). */
fm_status fm_store_latest_checkpoint(fm_store_t *s, const char *run_id, int *round, uint8_t **blob, size_t *len,
                                     bool *found);

/* SQLite's integrity_check of the whole file: *ok, and in report its first
 * problems ("ok" when none). */
fm_status fm_store_check(fm_store_t *s, bool *ok, char *report, size_t cap);

/* Lowercase hex SHA-256 of data. */
void fm_sha256_hex(const uint8_t *data, size_t len, char out[65]);

#endif
