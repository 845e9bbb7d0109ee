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
#include "fedmoe/runspec.h"
#include "fedmoe/train.h"
#include "link.h"
#include "session.h"

typedef struct {
    int round;              /* -1: empty */
    float *a[FM_GROUP_COUNT][3];
    int64_t steps[2];
    fm_rng_t rng;
} snapshot_t;

typedef struct {
    const fm_session_config_t *cfg;
    volatile sig_atomic_t *stop; /* set by a signal: leave, even mid-training */
    fm_link_t link;       /* the connection to the coordinator */
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
    snapshot_t pre;         /* the state from before round pre.round (= last_round) */
    double last_beat, heartbeat_s; /* the last Heartbeat, and how often (the Welcome's) */
    double away_since;      /* > 0: the coordinator stopped mid-run then (waiting for it) */
    double last_hello;
    uint32_t task_round;    /* the round of the newest Task taken (0: none), for heartbeats */
    bool hello_due;         /* a restarted coordinator asked who we are: a Hello, rate-limited */
    bool hello_unsent;      /* the last Hello found no connection (said once until one goes) */
    bool pre_on_disk;       /* the .pre state file exists (sess_save_state, sess_drop_pre) */
    bool connecting;        /* holds one of its virtual host's places to connect, until welcomed */
    struct {                /* the last update sent, as sent: a repeated task gets it again */
        uint8_t *bytes;
        size_t len;
        uint32_t round;
        uint8_t nonce[FM_NONCE_BYTES];
        bool waiting;       /* not sent yet: waiting for its Grant */
    } sent;
    bool grants;            /* the coordinator grants uploads (its Welcome said so) */
    bool spilled;           /* model and trainer freed between rounds (virtual host): rebuilt from the state file */
    bool loaded;            /* the state file was read since the welcome */
} session_t;

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
