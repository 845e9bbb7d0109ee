/* host.h - the loop that runs client sessions: one (fedmoe-client) or many in
 * one process (fedmoe-client --virtual N), for simulations larger than a
 * machine holds processes.
 *
 * One thread polls every session's connection (client/link.c) and runs the
 * sessions' timers (client/session.c); a pool of workers, sized to the cores,
 * trains the Tasks the sessions hand out. Each client is a real session with
 * its own key, socket and connection, speaking the real protocol to the real
 * coordinator; the clients are independent of each other and give the same
 * results as separate processes. What a virtual host's clients share is what
 * a process would hold once: one ZeroMQ context (one I/O thread, no ZMTP
 * heartbeats: the sessions' own show them alive), one copy of the dataset,
 * loaded and partitioned once (each client's split copied from it), and the
 * workers: at most `workers` clients train at once, the others wait their
 * turn (heartbeating). */
#ifndef FEDMOE_HOST_H
#define FEDMOE_HOST_H

#include <signal.h>

#include "fedmoe/status.h"
#include "session.h"

typedef struct {
    int clients;          /* N virtual clients; 0: one client of its own (the config's id, key and partition) */
    int workers;          /* trainings at once (0: the cores; one client: 1) */
    char keys[1024];      /* virtual clients with CURVE: DIR/ID.key of every client */
    int first_partition;  /* virtual client i takes partition first + i; -1: assigned by the coordinator */
} fm_host_config_t;

/* The file descriptors a virtual host of n clients needs (a socket's and its
 * connection's each, and a margin), and the clients a host can hold under a
 * limit of that many (at least one): fedmoe-sim sizes its hosts by it. */
#define FM_HOST_FDS_EACH 2
#define FM_HOST_FDS_MARGIN 64
static inline long fm_host_descriptors(int n) { return (long)FM_HOST_FDS_EACH * n + FM_HOST_FDS_MARGIN; }
static inline int fm_host_capacity(long limit)
{
    long n = (limit - FM_HOST_FDS_MARGIN) / FM_HOST_FDS_EACH;
    return n < 1 ? 1 : n > 1000000 ? 1000000 : (int)n;
}

/* Runs the clients of base (virtual client i's id is base->id-NNNNN, NNNNN its
 * partition first + i, or i when the coordinator assigns them; its key
 * keys/ID.key) until all have ended or *stop. FM_OK when every client ended
 * well or was stopped; otherwise the first failure's status, with its reason. */
fm_status fm_host_run(const fm_session_config_t *base, const fm_host_config_t *hc, volatile sig_atomic_t *stop);

#endif
