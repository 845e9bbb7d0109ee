/* round.h - one federated round as a state machine (docs/architecture.md).
 *
 *   WAITING --open--> OPEN --decide: all in / deadline--> commit or abandon --> WAITING
 *                      |  ^
 *                      +--+ decide: EXTEND (short of the quorum, clients still
 *                           working; at most FM_ROUND_MAX_EXTENSIONS times)
 *
 * Each participant is AWAITED until it completes, its update is refused, it goes
 * silent (GONE) or the last deadline passes (DROPPED). Only AWAITED participants
 * hold a round open; a GONE one that says hello again is AWAITED again (and is
 * sent its task again). The module makes decisions only: it sends nothing, reads
 * no clock (the caller passes `now`) and touches no database, so it is tested on
 * its own. */
#ifndef FEDMOE_ROUND_H
#define FEDMOE_ROUND_H

#include <stdbool.h>

#include "fedmoe/status.h"
#include "fedmoe/store.h"

/* How many times a round short of its quorum waits another round timeout for
 * participants that are still working. */
#define FM_ROUND_MAX_EXTENSIONS 2

typedef enum {
    FM_ROUND_WAITING = 0, /* no round open: waiting for enough ready clients */
    FM_ROUND_OPEN,        /* tasks sent; collecting updates */
} fm_round_state;

typedef enum {
    FM_PART_AWAITED = 0, /* task sent, no update yet */
    FM_PART_COMPLETED,   /* update accepted and folded in */
    FM_PART_REFUSED,     /* update refused: out of this round */
    FM_PART_GONE,        /* silent past the client timeout */
    FM_PART_DROPPED,     /* no update by the last deadline */
} fm_part_state;

typedef enum {
    FM_VERDICT_WAIT = 0, /* keep collecting */
    FM_VERDICT_EXTEND,   /* deadline moved on (short of the quorum, some still working) */
    FM_VERDICT_COMMIT,   /* aggregate the completed updates and log the round */
    FM_VERDICT_ABANDON,  /* too few updates and nobody left to wait for: run it again */
} fm_round_verdict;

typedef struct {
    int slot;                  /* registry slot */
    fm_part_state state;
    uint8_t nonce[16];         /* its Task's nonce (FM_NONCE_BYTES), fresh at the round's opening */
    float *prompt;             /* uploaded prompt, staged until the round commits (owned) */
    double norm[2];            /* its update's L2 distance from the state sent (model, prompt), before clipping */
    double task_sent_at;       /* when its Task was last sent (the caller's clock) */
    bool resent_on_hello;      /* its Task was sent again after a Hello this round (once at most) */
    fm_client_round_row_t row; /* its line in the round log */
} fm_participant_t;

typedef struct {
    fm_round_state state;
    int number;               /* the round open, or the next one */
    fm_participant_t *parts;
    int nparts;
    int *by_slot;             /* the participant of each registry slot below nslots, -1: none */
    int nslots;
    double started, deadline; /* the caller's clock */
    double timeout;           /* seconds from opening (or extending) to the deadline */
    int extensions;
    char started_at[32];      /* UTC */
} fm_round_t;

/* A round machine in WAITING before round `first`. */
void fm_round_init(fm_round_t *r, int first, double timeout);
/* Frees the participants (and their staged prompts). */
void fm_round_free(fm_round_t *r);

/* WAITING -> OPEN with these participants (registry slots, in the order given),
 * each AWAITED, their rows named by ids[i]. */
fm_status fm_round_open(fm_round_t *r, const int *slots, char (*ids)[64], int n, double now);
/* The participant of a registry slot in the open round, or NULL. */
fm_participant_t *fm_round_find(fm_round_t *r, int slot);
/* Participant transitions (no-ops unless AWAITED, except rejoin). Completing
 * takes ownership of prompt (may be NULL). */
void fm_round_complete(fm_round_t *r, fm_participant_t *p, float **prompt);
void fm_round_refuse(fm_round_t *r, fm_participant_t *p);
void fm_round_lose(fm_round_t *r, fm_participant_t *p);
/* A participant that says hello again: GONE becomes AWAITED. True when it is
 * AWAITED now (so its task must be sent again). */
bool fm_round_rejoin(fm_round_t *r, fm_participant_t *p);

/* Counts by state. */
int fm_round_count(const fm_round_t *r, fm_part_state s);

/* What to do now: COMMIT when nobody is awaited (or the last deadline passed) and
 * the quorum completed; EXTEND moves the deadline when the quorum can still be
 * reached by those awaited and extensions are left; at the last deadline every
 * AWAITED participant becomes DROPPED. */
fm_round_verdict fm_round_decide(fm_round_t *r, double now, int quorum);
/* OPEN -> WAITING after a commit (the number advances) or an abandon (it does
 * not). Frees the participants. */
void fm_round_close(fm_round_t *r, bool committed);

/* The state as the round log writes it: "awaited", "completed", "rejected", or
 * "dropped" (gone and dropped alike); static storage. */
const char *fm_part_state_name(fm_part_state s);

#endif
