/* session.h - a client's federated session: connect to the coordinator, say
 * Hello, train every Task with the learning core, upload, until Shutdown.
 *
 * Local parameters (specialists, routers, gating) and optimizer states stay in
 * memory across rounds and, with a state directory, in a state file written
 * after every round so a restarted client continues where it was. */
#ifndef FEDMOE_SESSION_H
#define FEDMOE_SESSION_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fedmoe/status.h"

typedef struct {
    char connect[256];     /* coordinator endpoint (tcp://127.0.0.1:5555) */
    char id[64];           /* client id = ZeroMQ routing id */
    int specialists;       /* S_i (2) */
    int partition_index;   /* own partition, or -1 to be assigned one */
    int partition_count;   /* with an own partition: N of I/N, checked against the run */
    char dataset[256];     /* overrides the run's dataset spec when not empty */
    char state_dir[1024];  /* where the state file lives; empty: no state file */
    double connect_timeout;/* seconds to wait for a Welcome before giving up (0: forever) */
    char key[1024];        /* own CURVE key pair file; its id must be id */
    char server_key[1024]; /* the coordinator's public key file */
    bool insecure;         /* no CURVE (plain text; warned) */
    struct fm_vhost *host; /* the virtual host this client is one of (vhost.h), or NULL: a process of its own */
} fm_session_config_t;

/* Loopback :5555, id HOST-PID, 2 specialists, a partition to be assigned, no
 * state file, waiting for ever, CURVE (keys to be given). */
void fm_session_config_default(fm_session_config_t *c);
/* Runs until Shutdown or *stop (FM_OK), or a fatal error (rejected, bad data). */
fm_status fm_session_run(const fm_session_config_t *cfg, volatile sig_atomic_t *stop);

/* A hook on the model vector a client uploads: received() sees the state each
 * Task sent, upload() may rewrite the trained vector before it is sent. Only
 * the robust-aggregation benchmark's attacker sets one (bench/attack.c, at
 * load time); fedmoe-client never does. NULL (the default) or h to keep. */
typedef struct {
    void (*received)(const float *g, size_t n);
    void (*upload)(float *x, size_t n, uint32_t round);
} fm_session_upload_hook_t;
void fm_session_set_upload_hook(const fm_session_upload_hook_t *h);

#endif
