/* coordinator.h - the coordinator (docs/architecture.md, docs/protocol.md): an object that takes
 * messages and clock ticks and answers through a send callback, and the daemon
 * loop that drives it from a ZeroMQ ROUTER socket.
 *
 * The object registers clients (Hello / Welcome, partitions; registry.h), runs
 * rounds through the round state machine (round.h: selection, tasks, deadline,
 * capped extensions, quorum), aggregates updates as they arrive (exact,
 * order-independent), keeps the prompt pool and picks each client's K nearest
 * prompts, and commits every round to the SQLite log with a checkpoint. Given a
 * database whose latest run is unfinished, it resumes that run. It reads no
 * clock and owns no socket: tests drive it in-process with a fake clock. */
#ifndef FEDMOE_COORDINATOR_H
#define FEDMOE_COORDINATOR_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fedmoe/blob.h"
#include "fedmoe/options.h"
#include "fedmoe/runspec.h"
#include "fedmoe/status.h"

typedef struct {
    char bind[256];        /* ZeroMQ endpoint, default tcp://0.0.0.0:5555 style */
    char db[1024];         /* fedmoe.db */
    int rounds;            /* rounds in the run (20) */
    int min_clients;       /* clients a round needs, and its quorum (2) */
    double fraction;       /* fraction of connected clients selected per round (1.0) */
    double round_timeout;  /* seconds from tasks to deadline (600) */
    double client_timeout; /* seconds without a message before a client is taken as gone (15) */
    double partition_lease; /* seconds a gone client keeps its partition (120) */
    bool new_run;          /* start a new run even if the latest one is unfinished */
    size_t max_message;    /* bytes; 0 = derived from the model size */
    uint64_t max_weight;   /* weight cap of clients on their own data; 0 = the largest partition */
    int max_connections;   /* connections held at once; 0 = twice the partitions plus 64 */
    char key[1024];        /* the coordinator's key pair file (fedmoe-keygen) */
    char allow[1024];      /* folder of the client public keys allowed to join */
    bool insecure;         /* no CURVE: plain text, anyone may connect (warned at start) */
    fm_run_spec_t spec;
} fm_server_config_t;

/* The coordinator's defaults: those of the option table (fedmoe/options.h). */
void fm_server_config_default(fm_server_config_t *c);
/* The coordinator settings of parsed options o (and its run spec, unless o->spec
 * is c->spec already). */
void fm_server_config_from_options(const fm_options_t *o, fm_server_config_t *c);

typedef struct fm_coordinator fm_coordinator_t;

/* How the coordinator sends: one encoded message to client id, in n frames
 * whose concatenation is the message (a Task's shared part is a blob, sent
 * without a copy; fedmoe/blob.h). Delivery is best effort (a lost message is
 * recovered by the protocol). */
typedef fm_status (*fm_coordinator_send_fn)(void *user, const char *id, const fm_frame_t *f, int n);

/* Opens the database, starts a new run or resumes the latest unfinished one.
 * cfg is copied. Caller destroys the coordinator. FM_ERR_ARG with a reason for a
 * configuration the user can fix. */
fm_status fm_coordinator_new(fm_coordinator_t **out, const fm_server_config_t *cfg, fm_coordinator_send_fn send,
                             void *user);
/* Closes the database (the run stays as last marked). Safe on NULL. */
void fm_coordinator_destroy(fm_coordinator_t **c);

/* One message of len bytes from client id (a valid id, fm_id_valid) at time
 * now (monotonic seconds). Bad messages get an Error reply; nothing is fatal.
 * Returns FM_ERR_FORMAT for a message that could not be decoded (malformed, or
 * too large or too costly to decode): what no honest client sends, for the
 * driver to count against the sender (zap.h); FM_OK otherwise, refused or not
 * (another protocol version, or a body it does not take, is refused only). */
fm_status fm_coordinator_handle(fm_coordinator_t *c, const char *id, const uint8_t *data, size_t len, double now);
/* Time-driven work: clients gone silent, the round's deadline, starting the next
 * round, finishing the run. Returns FM_OK, or a fatal error (the database). */
fm_status fm_coordinator_tick(fm_coordinator_t *c, double now);
/* Seconds until tick has timed work to do (at most max_wait). */
double fm_coordinator_wait(const fm_coordinator_t *c, double now, double max_wait);
/* Whether every planned round is committed (the run is marked finished). */
bool fm_coordinator_finished(const fm_coordinator_t *c);
/* Leaves the run resumable (marked stopped) and tells clients to shut down. */
fm_status fm_coordinator_stop(fm_coordinator_t *c);

/* Read-outs for the driver and tests. */
const char *fm_coordinator_run_id(const fm_coordinator_t *c);
int fm_coordinator_round(const fm_coordinator_t *c); /* the round open, or the next one */
bool fm_coordinator_round_open(const fm_coordinator_t *c);
size_t fm_coordinator_max_message(const fm_coordinator_t *c);
/* How often clients send a Heartbeat (Welcome.heartbeat_ms): a quarter of the
 * time after which a silent client is taken as gone, from 1 s to 5 s (10,000
 * clients beating every second were 10,000 messages a second). */
uint32_t fm_coord_heartbeat_ms(double client_timeout);

/* The daemon: binds cfg->bind (CURVE with cfg->key, peers checked against the
 * allow-list cfg->allow, unless cfg->insecure) and drives a coordinator until
 * its rounds are done (FM_OK), *stop becomes non-zero (FM_OK, the run left
 * resumable), or a fatal error (database, socket, keys) with a reason. When
 * *reload becomes non-zero the allow-list is reread and *reload cleared. */
fm_status fm_coordinator_run(const fm_server_config_t *cfg, volatile sig_atomic_t *stop,
                             volatile sig_atomic_t *reload);

/* A coordinator checkpoint (fedmoe/checkpoint.h format, magic FMCK): the round,
 * the global vector, the global prompt and the prompt pool. */
typedef struct fm_checkpoint {
    int round;
    float *global;
    size_t nglobal;
    float *prompt;
    size_t nprompt;
    int pool_count;
    char (*pool_ids)[64];
    float *pool;           /* pool_count * nprompt */
    double clip[2];        /* the next round's bounds on update distances (model, prompt); 0: none */
} fm_checkpoint_t;

/* Encodes c (which the caller keeps); *blob is malloc'd, the caller frees it. */
fm_status fm_checkpoint_encode(const fm_checkpoint_t *c, uint8_t **blob, size_t *len);
/* Decodes a checkpoint; the caller frees out with fm_checkpoint_free. */
fm_status fm_checkpoint_decode(const uint8_t *blob, size_t len, fm_checkpoint_t *out);
/* Frees what a decoded checkpoint owns (global vector, prompt, pool) and zeroes it. */
void fm_checkpoint_free(fm_checkpoint_t *c);

#endif
