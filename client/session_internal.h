/* session_internal.h - a client session's state (session.c) and what keeps it
 * across round re-runs and restarts (session_state.c: the snapshot from before
 * a round, the state file in --state-dir). */
#ifndef FEDMOE_SESSION_INTERNAL_H
#define FEDMOE_SESSION_INTERNAL_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "fedmoe/clientdata.h"
#include "fedmoe/exchange.h"
#include "fedmoe/rng.h"
#include "fedmoe/secagg.h"
#include "fedmoe/runspec.h"
#include "fedmoe/train.h"
#include "fedmoe/wire.h"
#include "session.h"

typedef struct {
    int round;              /* -1: empty */
    float *a[FM_GROUP_COUNT][3];
    int64_t steps[2];
    fm_rng_t rng;
} snapshot_t;

/* What a job brings back to the session's thread (session.c work_done). */
typedef struct {
    fm_status st;           /* a failure that ends the session, with why */
    char why[512];
    fm_wire_code code;      /* an Error to reply with text why (a Task refused), or FM_WIRE_OK */
    bool resend;            /* the same Task again: the kept Update again */
    bool waiting;           /* the same Task again, its Update still waiting for its Grant */
    uint8_t *bytes;         /* a new Update, encoded, of round `round` for `nonce` */
    size_t len;
    uint32_t round;
    uint8_t nonce[FM_NONCE_BYTES];
    bool trained;           /* a round was trained (the state file written) */
    bool masking;           /* secure aggregation: the trained values wait in s->sa for the phases */
    bool masked;            /* secure aggregation: phase 1 or 2 was the job (bytes: the sealed shares, or the
                               masked Update) */
    bool abandoned;         /* stopped mid-round: the state as before it, the Task not held */
} job_result_t;

struct fm_session {
    const fm_session_config_t *cfg;
    fm_session_ops_t ops;
    char id[64];
    int own_partition;      /* the partition asked for (-1: assigned) */
    volatile sig_atomic_t *stop; /* the job's: leave, even mid-training */
    char run_id[64];
    fm_run_spec_t spec;
    int partition;
    fm_client_data_t data;
    bool have_data;
    fm_model_t *model;
    fm_trainer_t *trainer;
    fm_exchange_dims_t dims;
    float *vec;             /* federated vector scratch */
    int last_round;         /* last round trained (0: none) */
    snapshot_t pre;         /* the state from before round pre.round (last_round, or the next one begun
                               and stopped) */
    double started;         /* the first tick (< 0: none yet) */
    double last_beat, heartbeat_s; /* the last Heartbeat, and how often (the Welcome's) */
    double away_since;      /* > 0: the coordinator stopped mid-run then (waiting for it) */
    double last_hello;
    double now;             /* the time of the call being served */
    uint32_t task_round;    /* the round of the newest Task taken (0: none), for heartbeats */
    bool hello_due;         /* a restarted coordinator asked who we are: a Hello, rate-limited */
    bool hello_unsent;      /* the last Hello found no connection (said once until one goes) */
    bool welcomed;          /* a Welcome has come (the way in is through) */
    bool ended;             /* Shutdown */
    bool pre_on_disk;       /* the .pre state file exists (sess_save_state, sess_drop_pre) */
    struct {                /* the last update sent, as sent: a repeated task gets it again */
        uint8_t *bytes;
        size_t len;
        uint32_t round;
        uint8_t nonce[FM_NONCE_BYTES];
        bool waiting;       /* not sent yet: waiting for its Grant */
    } sent;
    struct {                /* secure aggregation of the round trained last (session.c; sa NULL: none) */
        fm_sa_client_t *sa;
        fm_sa_setup_t setup;
        uint32_t round;
        uint8_t nonce[FM_NONCE_BYTES];
        int phase;          /* the phase it answers next (1 share, 2 masked input, 3 unmask) */
        Fedmoe__Envelope *env; /* phase 2's message, owned: masking is the job (as training is) */
        float *x;           /* the trained values, model then prompt: masked, never sent plain */
        size_t nx;
        fm_metrics_t metrics;
        uint64_t train_samples;
    } sa;
    bool grants;            /* the coordinator grants uploads (its Welcome said so) */
    bool spilled;           /* model and trainer freed between rounds: rebuilt from the state file */
    bool loaded;            /* the state file was read since the welcome */
    Fedmoe__Task *task;     /* the job's Task (its envelope, owned): non-NULL from the Task's handling to
                               work_done, the job out */
    Fedmoe__Envelope *task_env;
    job_result_t result;
};
typedef struct fm_session session_t;

/* Everything a round changes on a client: every group's weights and moments,
 * the AdamW step counts and the shuffling generator. */
void sess_snap_free(snapshot_t *n);
/* Copies the model's state as of before round `round` into n. */
fm_status sess_snap_take(session_t *s, snapshot_t *n, int round);
/* Puts n back into the model and trainer. */
void sess_snap_restore(session_t *s, const snapshot_t *n);
/* Writes the state files (.pre: s->pre, when taken; then .state: the state
 * now), each atomically; a failure is logged, not fatal. */
void sess_save_state(session_t *s);
/* Reads the state file of this run and client, if any and usable (said at
 * info level when `restart`, at debug level when a spilled client comes back). */
void sess_load_state(session_t *s, bool restart);
/* Removes the .pre state file: its round is over, it will not be run again. */
void sess_drop_pre(session_t *s);

#endif
