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
#include "budget.h"
#include "fanout.h"
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
    fm_blob_t *task_shared;     /* the open round's Task part every participant shares, or NULL */
    fm_fanout_t fanout;         /* the pace of the open round's Tasks */
    fm_fanout_t grants;         /* and of its uploads (upload grants) */
    int *nearest, *nearest_found; /* the open round's K nearest pool prompts of each participant */
    fm_aggregator_t *agg_model, *agg_prompt;
    struct fm_coord_sa *sa;       /* the open round's secure aggregation (coordinator_secagg.c), or NULL */
    double clip[2];               /* this round's bound on update distances (model, prompt); 0: none */
    double sampled[2];            /* --clip-norm auto before a bound was learned: the bound the round's
                                   * first FM_CLIP_SAMPLE updates set (0: not yet) */
    int clipped;                  /* updates clipped this round */
    int64_t bytes_up, bytes_down; /* this round */
    double now;                   /* the time of the message or tick being handled */
    double started;               /* the time of the first message or tick */
    bool started_set;
    fm_log_limit_t refusals;      /* refusal warnings, at most WARNINGS_PER_SECOND */
    fm_log_limit_t resends;       /* "task sent again" lines, likewise */
    fm_log_limit_t reports;       /* clients' Error reports logged, likewise */
    fm_budget_t *budget;          /* what one client id may cost (replies, Welcomes, changes, log lines) */
    double waiting_logged;
    double swept;                 /* when silent clients were last looked for */
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

/* The round's Tasks (coordinator.c), paced by the fan-out window (fanout.h):
 * start encodes the shared part of the open round's Task and queues every
 * participant's; end drops them (the round closed); queue asks for p's Task
 * (again); taken frees p's place in the window; pump sends what the window
 * lets through (after every message and tick). */
fm_status fm_coord_start_tasks(fm_coordinator_t *c);
void fm_coord_end_tasks(fm_coordinator_t *c);
void fm_coord_queue_task(fm_coordinator_t *c, fm_participant_t *p);
void fm_coord_task_taken(fm_coordinator_t *c, fm_participant_t *p);
/* p's part in the round ended (its Update came, or it left): its Task's and
 * its upload's places are free. */
void fm_coord_part_done(fm_coordinator_t *c, fm_participant_t *p);
void fm_coord_pump(fm_coordinator_t *c);
/* Client-level differential privacy (coordinator_privacy.c; --dp-noise), the
 * round's steps in order (start, once: --dp-noise auto becomes the least
 * noise that spends the budget over --rounds, and a budget no round fits is
 * refused): clip bounds an update (the model and the prompt
 * together, distances from the state it was sent) to the run's C and returns
 * its weight in the mean (1: equal weights); pad counts the selected clients
 * that sent nothing as unchanged (the mean's denominator is the round's
 * selected clients, whoever answers), before the aggregators' results; noise
 * adds the Gaussian noise to the results. epsilon is what `rounds` rounds
 * spend (NaN without --dp-noise). */
fm_status fm_coord_dp_start(fm_coordinator_t *c);
uint64_t fm_coord_dp_clip(fm_coordinator_t *c, fm_participant_t *p, float *model, float *prompt);
fm_status fm_coord_dp_pad(fm_coordinator_t *c);
fm_status fm_coord_dp_noise(fm_coordinator_t *c);
double fm_coord_dp_epsilon(const fm_coordinator_t *c, int rounds);
/* Secure aggregation (coordinator_secagg.c; --secure-aggregation): open
 * after the round opened (nothing without the flag), close when it ends;
 * setup is p's place in it for its Task; handle takes a client's SecAgg
 * message (keys, sealed shares, unmasking shares); masked reads and adds a
 * masked Update (keeping nothing else of it; FM_ERR_FORMAT with *code when
 * refused); decide drives the phases in place of fm_round_decide (logging
 * its EXTEND and ABANDON). */
typedef struct fm_coord_sa fm_coord_sa_t;
fm_status fm_coord_sa_open(fm_coordinator_t *c);
void fm_coord_sa_close(fm_coordinator_t *c);
fm_sa_setup_t fm_coord_sa_setup(const fm_coordinator_t *c, const fm_participant_t *p);
void fm_coord_sa_handle(fm_coordinator_t *c, const char *id, int slot, const Fedmoe__SecAgg *m);
fm_status fm_coord_sa_masked(fm_coordinator_t *c, fm_participant_t *p, const Fedmoe__Update *u,
                             const fm_split_sizes_t *expect, fm_metrics_t *m, fm_wire_code *code);
fm_round_verdict fm_coord_sa_decide(fm_coordinator_t *c, double now);
/* --clip-norm auto, group g (0 model, 1 prompt): FM_CLIP_AUTO_FACTOR x the
 * lower median of this round's accepted distances so far; false (out
 * untouched) with fewer than two (coordinator_rounds.c). */
bool fm_coord_auto_bound(const fm_coordinator_t *c, int g, double *out);
/* After an accepted update: once a round without a learned bound holds
 * FM_CLIP_SAMPLE updates, clips them by the bound they set, sums them, and
 * clips later updates by it as they come (coordinator_rounds.c). */
void fm_coord_sample_clip(fm_coordinator_t *c);
/* Sends an envelope; returns its size in bytes, 0 when not encoded (coordinator.c). */
int64_t fm_coord_emit(fm_coordinator_t *c, const char *id, Fedmoe__Envelope *env);
/* An Error to id, if its reply budget allows (its refusal logged within
 * WARNINGS_PER_SECOND). */
void fm_coord_send_error(fm_coordinator_t *c, const char *id, fm_wire_code code, const char *text);
/* Refusals logged per second at the most: a peer sending junk as fast as it can
 * must not flood the log (the rest are counted and the count logged). */
#define WARNINGS_PER_SECOND 20
/* p's index in the round (its place in the windows). */
static inline int fm_coord_part_index(const fm_coordinator_t *c, const fm_participant_t *p)
{
    return (int)(p - c->round.parts);
}

#endif
