/* session.h - a client's federated session as an object that does no I/O:
 * messages from the coordinator go in (fm_session_handle), messages for it come
 * out through ops->send, time is the caller's (now), and training is a job the
 * caller runs on a thread of its choosing (fm_session_work) and hands back
 * (fm_session_work_done). The socket is client/link.c's, the loop and the
 * workers client/host.c's; tests drive a session in-process with a fake clock.
 *
 * It says Hello, takes the Welcome's run and data, trains every Task with the
 * learning core and uploads, until Shutdown. Local parameters (specialists,
 * routers, gating) and optimizer states stay in memory across rounds and, with
 * a state folder, in a state file written after every round so a restarted
 * client continues where it was. */
#ifndef FEDMOE_SESSION_H
#define FEDMOE_SESSION_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fedmoe/clientdata.h"
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
    bool spill;            /* with a state folder: the model freed between rounds, rebuilt from the state file
                              (a virtual host's clients: most are idle most rounds) */
} fm_session_config_t;

/* Loopback :5555, id HOST-PID, 2 specialists, a partition to be assigned, no
 * state file, waiting for ever, CURVE (keys to be given). */
void fm_session_config_default(fm_session_config_t *c);

/* What a session asks of its owner. send is required; the others may be NULL. */
typedef struct {
    /* An encoded message for the coordinator; FM_OK when it went out. */
    fm_status (*send)(void *user, const uint8_t *msg, size_t len);
    /* The client's data (a virtual host's shared copy); NULL: fm_client_data_load. */
    fm_status (*data)(void *user, const fm_data_spec_t *spec, fm_client_data_t *out);
    /* Round `round` of run_id was trained; and whether that round is over (a
     * later one was trained), so what was kept to run it again can go. */
    void (*saw_round)(void *user, const char *run_id, int round);
    bool (*round_over)(void *user, const char *run_id, int round);
    /* A model was freed (the owner may give the memory back). */
    void (*released)(void *user);
    void *user;
} fm_session_ops_t;

typedef struct fm_session fm_session_t;

/* A session of cfg (which must outlive it) as client `id` (cfg->id when NULL)
 * with its own partition `partition` (-1: cfg->partition_index). Its first
 * tick says Hello. */
fm_status fm_session_new(fm_session_t **out, const fm_session_config_t *cfg, const char *id, int partition,
                         const fm_session_ops_t *ops);
void fm_session_destroy(fm_session_t **s);

/* One message from the coordinator (its frames joined), at time now. FM_OK,
 * or the failure that ends the session (rejected, unusable run or data), with
 * its reason. Not while a job is out (fm_session_job_waiting). */
fm_status fm_session_handle(fm_session_t *s, const uint8_t *msg, size_t len, double now);
/* The session's timers at time now: Hello until welcomed, heartbeats, the
 * --connect-timeout. FM_OK, or FM_ERR_IO when a wait ran out. Also while a
 * job is out (it reads nothing the job writes). */
fm_status fm_session_tick(fm_session_t *s, double now);
/* The client id it speaks as. */
const char *fm_session_id(const fm_session_t *s);
/* Shutdown received: the session is over (well). */
bool fm_session_ended(const fm_session_t *s);
/* A Welcome has come (once is enough: the host's place to connect is freed). */
bool fm_session_welcomed(const fm_session_t *s);

/* The training job. A Task handled leaves a job waiting: the owner runs
 * fm_session_work on any thread (it rebuilds a spilled model, trains,
 * evaluates, encodes the Update and saves the state file; *stop ends it
 * early), then, on the session's thread, fm_session_work_done sends what it
 * made. Between the two only fm_session_tick may be called. */
bool fm_session_job_waiting(const fm_session_t *s);
void fm_session_work(fm_session_t *s, volatile sig_atomic_t *stop);
fm_status fm_session_work_done(fm_session_t *s, double now);

/* A hook on the model vector a client uploads: received() sees the state each
 * Task sent, upload() may rewrite the trained vector before it is sent. Only
 * the robust-aggregation benchmark's attacker (bench/attack.c) and the
 * secure-aggregation tests' client (tests/secagg_client.c) set one, at load
 * time; fedmoe-client never does. NULL (the default) or h to keep. */
typedef struct {
    void (*received)(const float *g, size_t n);
    void (*upload)(float *x, size_t n, uint32_t round);
    /* secure aggregation: the values about to be masked (model then prompt;
     * bounded and noised as the Welcome said), the state the Task sent (NULL
     * when the client has no bound) and their weight; and each phase (0-3) about to be answered (the dropout
     * tests' client leaves there) */
    void (*masking)(const float *x, const float *ref, size_t n, uint32_t round, uint64_t weight);
    void (*phase)(uint32_t round, int phase);
    /* ... and what it sends in phases 1 (each sealed share) and 3 (each
     * share), which a malicious client's test may spoil */
    void (*tamper)(uint32_t round, int phase, uint8_t *bytes, size_t n);
} fm_session_upload_hook_t;
void fm_session_set_upload_hook(const fm_session_upload_hook_t *h);

#endif
