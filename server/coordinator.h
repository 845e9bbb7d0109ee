/* coordinator.h - the coordinator daemon's core: one thread, one ROUTER socket,
 * one zmq_poll loop with timers (DESIGN sections 4, 6, 7).
 *
 * It registers clients (Hello / Welcome, assigning partitions), runs rounds
 * (selection, tasks, deadline and quorum), aggregates as updates arrive (exact,
 * order-independent), keeps the prompt pool and picks each client's K nearest
 * prompts, and commits every round to the SQLite log with a checkpoint. Given a
 * database whose latest run is unfinished, it resumes that run. */
#ifndef FEDMOE_COORDINATOR_H
#define FEDMOE_COORDINATOR_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

#include "fedmoe/runspec.h"
#include "fedmoe/status.h"

typedef struct {
    char bind[256];        /* ZeroMQ endpoint, default tcp://0.0.0.0:5555 style */
    char db[1024];         /* fedmoe.db */
    int rounds;            /* rounds in the run (20) */
    int min_clients;       /* clients a round needs, and its quorum (2) */
    double fraction;       /* fraction of connected clients selected per round (1.0) */
    double round_timeout;  /* seconds from tasks to deadline (600) */
    double client_timeout; /* seconds without a message before a client is taken as gone (15) */
    bool new_run;          /* start a new run even if the latest one is unfinished */
    size_t max_message;    /* bytes; 0 = derived from the model size */
    fm_run_spec_t spec;
} fm_server_config_t;

void fm_server_config_default(fm_server_config_t *c);

/* Runs until the run's rounds are done (FM_OK), *stop becomes non-zero (FM_OK,
 * the run left resumable), or a fatal error (database, socket) with a reason. */
fm_status fm_coordinator_run(const fm_server_config_t *cfg, volatile sig_atomic_t *stop);

/* Checkpoint blobs: magic "FMCK", version 1, round, global vector, global prompt,
 * prompt pool. Exposed for tests and tools. */
typedef struct {
    int round;
    float *global;
    size_t nglobal;
    float *prompt;
    size_t nprompt;
    int pool_count;
    char (*pool_ids)[64];
    float *pool;           /* pool_count * nprompt */
} fm_checkpoint_t;

fm_status fm_checkpoint_decode(const uint8_t *blob, size_t len, fm_checkpoint_t *out);
void fm_checkpoint_free(fm_checkpoint_t *c);

#endif
