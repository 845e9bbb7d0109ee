/* fanout.h - the pace at which a round's Tasks go out.
 *
 * Sending every participant its Task at once made libzmq hold one encrypted
 * copy of the model per client (CURVE encrypts each message for its
 * connection), and the burst starved connections past their heartbeat timeout
 * (1,000 clients: 1.9 GB, Tasks lost). So Tasks go out through a window: at
 * most `window` of them are in flight, sent and not yet taken; a client takes
 * one when it says so (a progress heartbeat for the round, sent on receipt, or
 * its Update), when it leaves the round, or FM_FANOUT_ACK_S after it was sent
 * (a client that does not say, or a Task lost: the time after which the
 * coordinator sends a lost Task again). A client slow to read keeps its place:
 * freeing it early let Tasks pile up, each encrypted for its connection, in
 * front of 5,000 slow clients (843 MB). Sends wait in a queue in the order asked; a
 * participant is queued or in flight at most once. The module decides only:
 * the coordinator sends.
 *
 * The same window paces uploads (upload grants): a client with an Update
 * ready says so (Heartbeat.ready_round) and sends it when granted; the
 * coordinator grants a window of them at a time, and an Update folded in (or
 * its client gone) makes room for the next. So a burst of uploads waits in the
 * clients, not in the coordinator. */
#ifndef FEDMOE_FANOUT_H
#define FEDMOE_FANOUT_H

#include <stddef.h>
#include <stdint.h>

#include "fedmoe/status.h"

/* Bytes of Tasks in flight at most (at least FM_FANOUT_MIN Tasks, at most
 * FM_FANOUT_MAX), and how long a Task not taken holds its place. */
#define FM_FANOUT_BYTES ((size_t)8 << 20)
#define FM_FANOUT_MIN 2
#define FM_FANOUT_MAX 64
#define FM_FANOUT_ACK_S 10.0

typedef struct {
    int n;           /* participants */
    uint8_t *state;  /* per participant: idle, queued, in flight */
    double *sent_at; /* per participant: when it went (in flight) */
    int *queue;      /* ring of n */
    int head, queued;
    int flight[FM_FANOUT_MAX];
    int inflight;
    int window;
} fm_fanout_t;

/* A fan-out for n participants whose Tasks are about task_bytes each (frees
 * what f held). */
fm_status fm_fanout_reset(fm_fanout_t *f, int n, size_t task_bytes);
void fm_fanout_free(fm_fanout_t *f);
/* Participant i's Task is due (again): queued unless queued already (one in
 * flight gives up its place and queues). */
void fm_fanout_push(fm_fanout_t *f, int i);
/* Participant i took its Task or left the round: its place in flight is free
 * (and it leaves the queue). */
void fm_fanout_done(fm_fanout_t *f, int i);
/* Whether participant i's Task waits in the queue (not sent yet). */
int fm_fanout_queued(const fm_fanout_t *f, int i);
/* When participant i's Task went, if it is in flight; -1 otherwise. */
double fm_fanout_sent_at(const fm_fanout_t *f, int i);
/* The next participant to send to now (it is in flight from now), or -1 when
 * the window is full or nothing is queued. Places held longer than
 * FM_FANOUT_ACK_S are freed first. */
int fm_fanout_next(fm_fanout_t *f, double now);

#endif
