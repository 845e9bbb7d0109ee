/* report.h - a run's progress and summary as the round log shows them: the
 * lines fedmoe-sim prints while its job runs and at its end, and the same
 * lines `fedmoe-history follow` prints for a run elsewhere (a container, another
 * machine). Written once, read from the database only. */
#ifndef FEDMOE_REPORT_H
#define FEDMOE_REPORT_H

#include <stdbool.h>
#include <stddef.h>

#include "fedmoe/store.h"

typedef struct {
    char db[4096];
    fm_store_t *store;  /* opened read-only once the database exists */
    char before[64];    /* the latest run when the report began: not the one to follow */
    char run_id[64];    /* the run followed ("" until it appears) */
    char after[32];     /* also the latest run if it ended at or after this UTC time
                         * (fm_clock_utc's form; "" for none): a run that began and
                         * ended before the report first looked */
    bool headed;        /* the run's header is printed */
    int shown;          /* rounds printed */
    double t0;          /* when the report began (the wall time of the summary) */
    double unit;        /* losses shown times this: 1, or 1/ln 2 for text (bits per byte) */
} fm_report_t;

/* From a run's config: a holdout run (its test columns are on held-out train and
 * validation data); a text run, whose losses (nats a byte in the log) are
 * shown in bits per byte: multiplied by fm_run_loss_unit, under the names
 * "train_bpb", "val_bpb", "test_bpb" instead of "train_loss" ... */
bool fm_run_holdout(const fm_run_row_t *run);
bool fm_run_text(const fm_run_row_t *run);
double fm_run_loss_unit(const fm_run_row_t *run);
/* "train_loss" or "train_bpb" for which = "train" (also "val", "test"), in buf. */
const char *fm_run_loss_name(const fm_run_row_t *run, const char *which, char *buf, size_t cap);

/* Starts a report on database db: follows `run` when given; else, with
 * running_is_it, the latest run if it is still running; else the first run
 * that is newer than the latest one now (the job's run). */
void fm_report_begin(fm_report_t *r, const char *db, const char *run, bool running_is_it);
/* Prints the run's header once it appears, then every round committed since
 * the last call (stdout, flushed). */
void fm_report_progress(fm_report_t *r);
/* The run's status ("running", "finished", "stopped"), or "" while it has not
 * appeared. */
void fm_report_status(fm_report_t *r, char status[16]);
/* Prints the rounds not yet shown and the summary table (strategy, partition,
 * rounds, accuracies, losses, times, traffic, the last round's clients).
 * Returns 0, or 1 (with a line on stderr) when the run or its rounds are
 * missing. */
int fm_report_summary(fm_report_t *r);
/* Closes the database. */
void fm_report_end(fm_report_t *r);

#endif
