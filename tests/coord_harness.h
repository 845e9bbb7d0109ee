/* coord_harness.h - the coordinator object driven in-process (coord_harness.c):
 * messages injected as bytes, a fake clock, replies captured in an outbox, a
 * real SQLite file in the test's scratch folder. Used by test_coordinator (the
 * round logic) and test_defences (what it refuses and bounds). */
#ifndef FEDMOE_TEST_COORD_HARNESS_H
#define FEDMOE_TEST_COORD_HARNESS_H

#include <stdint.h>

#include "coordinator.h"
#include "fedmoe/store.h"
#include "fedmoe/wire.h"

extern char coord_dir[256];   /* procs_run_tests fills it */
extern fm_run_spec_t run_spec; /* the spec of the newest small_config, as clients know it */

/* The outbox: what the coordinator sent. */
void clear_outbox(void);
/* Messages of kind sent to id (any id when NULL); the last one in *last. */
int count_sent(const char *id, Fedmoe__Envelope__BodyCase kind, Fedmoe__Envelope **last);
/* The code of the last Error sent to id, 0 when none. */
uint32_t last_error_code(const char *id);
/* The model values of the k-th Task (1-based) sent to id. */
const Fedmoe__Tensor *task_model(const char *id, int k);
/* Value i of id's (k+1)-th Task minus that of its k-th: the round's step. */
float task_step(const char *id, int k, size_t i);

/* A small model over `clients` partitions, quorum `quorum`, its own database. */
void small_config(fm_server_config_t *cfg, int clients, int quorum);
fm_coordinator_t *start(const fm_server_config_t *cfg);
void finish(fm_coordinator_t **c);
/* A coordinator for n clients that all say hello with `samples` at time 0; the
 * first round opened. */
fm_coordinator_t *open_run(fm_server_config_t *cfg, const char *const *ids, int n, int quorum, uint64_t samples);

/* Messages from a client, at time now. */
void inject(fm_coordinator_t *c, const char *id, Fedmoe__Envelope *env, double now);
void hello(fm_coordinator_t *c, const char *id, uint64_t samples, double now);
void heartbeat(fm_coordinator_t *c, const char *id, double now);
/* A heartbeat that reports the client's progress (the newest Task and Update rounds). */
void heartbeat_progress(fm_coordinator_t *c, const char *id, uint32_t task_round, uint32_t sent_round, double now);
typedef enum { HONEST, SHORT, NOT_FINITE, REPLAYED, PERFECT_SCORE, ALL_CORRECT } fault_t;
/* The Update for id's newest Task: its model plus delta in every value, with
 * procs_fake_counts(samples); the fault changes one thing (one value short, a
 * NaN, another task's nonce, a 100% accuracy its counts do not give, every
 * test and validation example right: a lie the coordinator cannot see). */
void update(fm_coordinator_t *c, const char *id, float delta, uint64_t samples, fault_t fault, double now);
/* An honest Update of 100 samples whose prompt is `fill` in every value. */
void update_prompt(fm_coordinator_t *c, const char *id, float fill, double now);
void updates(fm_coordinator_t *c, const char *const *ids, int n, float delta, uint64_t samples, double now);

/* The round log. */
int rounds_logged(const char *db);
/* Round r of the latest run as logged, and its test accuracy. */
fm_round_row_t logged_round(const char *db, int r);
double round_accuracy(const char *db, int r);
void client_status(const char *db, int round, const char *id, char out[16]);
/* A tick at now after which the run has `rounds` rounds logged. */
void expect_rounds(fm_coordinator_t *c, const fm_server_config_t *cfg, double now, int rounds);
void expect_status(const fm_server_config_t *cfg, int round, const char *id, const char *status);

#endif
