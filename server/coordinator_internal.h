/* coordinator_internal.h - the coordinator object's state, shared by its parts:
 * coordinator.c (messages), coordinator_rounds.c (time: rounds opened, closed
 * and committed), coordinator_setup.c (new run or resume, teardown). */
#ifndef FEDMOE_COORDINATOR_INTERNAL_H
#define FEDMOE_COORDINATOR_INTERNAL_H

#include "coordinator.h"
#include "fedmoe/aggregate.h"
#include "fedmoe/exchange.h"
#include "fedmoe/log.h"
#include "fedmoe/store.h"
#include "fedmoe/wire.h"
#include "registry.h"
#include "round.h"

struct fm_coordinator {
    fm_server_config_t cfg;
    fm_run_spec_t spec;         /* finished (gating set from the strategy) */
    fm_exchange_dims_t dims;
    fm_coordinator_send_fn send;
    void *send_user;
    fm_store_t *store;
    char run_id[64];
    float *global, *gprompt;    /* the committed global state */
    float *scratch;             /* one decoded update */
    size_t max_message;
    fm_registry_t *reg;
    fm_split_sizes_t *sizes;    /* every partition's split sizes of the run's dataset, NULL: unknown */
    uint64_t weight_cap;        /* the largest weight a client on its own data gets */
    fm_round_t round;
    fm_aggregator_t *agg_model, *agg_prompt;
    double clip[2];               /* this round's bound on update distances (model, prompt); 0: none */
    int clipped;                  /* updates clipped this round */
    int64_t bytes_up, bytes_down; /* this round */
    double now;                   /* the time of the message or tick being handled */
    double started;               /* the time of the first message or tick */
    bool started_set;
    fm_log_limit_t refusals;      /* refusal warnings, at most WARNINGS_PER_SECOND */
    fm_log_limit_t resends;       /* "task sent again" lines, likewise */
    double waiting_logged;
    bool finished;
};

/* The time of the message or tick being handled (and of the first one). */
static inline void fm_coord_set_now(fm_coordinator_t *c, double now)
{
    c->now = now;
    if (!c->started_set) {
        c->started = now;
        c->started_set = true;
    }
}

/* Sends participant p its Task (coordinator.c). */
void fm_coord_send_task(fm_coordinator_t *c, fm_participant_t *p);
/* Sends an envelope; returns its size in bytes, 0 when not encoded (coordinator.c). */
int64_t fm_coord_emit(fm_coordinator_t *c, const char *id, Fedmoe__Envelope *env);

#endif
