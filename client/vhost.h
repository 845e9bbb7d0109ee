/* vhost.h - a virtual host: many clients in one process (fedmoe-client
 * --virtual N), for simulations larger than a machine holds processes.
 *
 * Each client is a real session (session.h) in a thread of its own, with its
 * own key, socket and connection, speaking the real protocol to the real
 * coordinator; the clients are independent of each other and give the same
 * results as separate processes. What they share is what a process would hold
 * once: one ZeroMQ context (one I/O thread, no ZMTP heartbeats: the sessions'
 * own show them alive), one copy of the dataset, loaded and partitioned once
 * (each client's split copied from it), and the cores: at most `workers`
 * clients train at once, the others wait their turn (heartbeating). */
#ifndef FEDMOE_VHOST_H
#define FEDMOE_VHOST_H

#include <signal.h>
#include <stdbool.h>

#include "fedmoe/clientdata.h"
#include "fedmoe/status.h"
#include "session.h"

typedef struct fm_vhost fm_vhost_t;

typedef struct {
    int clients;          /* N */
    int workers;          /* trainings at once (0: the cores) */
    char keys[1024];      /* CURVE: DIR/ID.key of every client (unless insecure) */
    int first_partition;  /* client i takes partition first + i; -1: assigned by the coordinator */
} fm_vhost_config_t;

/* The file descriptors a host of n clients needs (a socket's and its
 * connection's each, and a margin), and the clients a host can hold under a
 * limit of that many (at least one): fedmoe-sim sizes its hosts by it. */
#define FM_VHOST_FDS_EACH 2
#define FM_VHOST_FDS_MARGIN 64
static inline long fm_vhost_descriptors(int n) { return (long)FM_VHOST_FDS_EACH * n + FM_VHOST_FDS_MARGIN; }
static inline int fm_vhost_capacity(long limit)
{
    long n = (limit - FM_VHOST_FDS_MARGIN) / FM_VHOST_FDS_EACH;
    return n < 1 ? 1 : n > 1000000 ? 1000000 : (int)n;
}

/* Runs N clients like base (client i's id is base->id-NNNNN, NNNNN its
 * partition first + i, or i when the coordinator assigns them; its key
 * keys/ID.key) until all have ended or *stop. FM_OK when every client ended
 * well; otherwise the first failure's status, with its reason. */
fm_status fm_vhost_run(const fm_session_config_t *base, const fm_vhost_config_t *vc, volatile sig_atomic_t *stop);

/* For the sessions of a host: the shared context; client data from the
 * shared copy (spec->index the client's partition); and the training turn:
 * enter blocks until a worker is free, calling wait(user) every half second
 * meanwhile; leave gives the turn back. */
void *fm_vhost_zmq(fm_vhost_t *h);
fm_status fm_vhost_data(fm_vhost_t *h, const fm_data_spec_t *spec, fm_client_data_t *out);
void fm_vhost_train_enter(fm_vhost_t *h, void (*wait)(void *user), void *user);
void fm_vhost_train_leave(fm_vhost_t *h);
/* The way in: at most a few clients between connecting and their Welcome at
 * once (the coordinator's listen queue); enter is false, without a place, once
 * *stop is set. */
bool fm_vhost_connect_enter(fm_vhost_t *h, volatile sig_atomic_t *stop);
void fm_vhost_connect_leave(fm_vhost_t *h);
/* A client has freed its model: the host gives freed memory back to the
 * system (at most every few seconds). */
void fm_vhost_trim(fm_vhost_t *h);
/* The rounds the host's clients are sent: a round older than the newest one
 * of its run is over (a round number moves on only when its round commits),
 * so what a client kept to run it again can go. */
void fm_vhost_saw_round(fm_vhost_t *h, const char *run_id, int round);
bool fm_vhost_round_over(fm_vhost_t *h, const char *run_id, int round);

#endif
