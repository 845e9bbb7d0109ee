/* connections.h - a cap on the connections the coordinator's socket holds.
 *
 * libzmq has no limit of its own on a ROUTER's connections, and each holds a
 * file descriptor (and, with CURVE, a handshake's work). The counter watches the
 * socket's monitor events: every accepted connection counts until libzmq reports
 * it gone; one accepted beyond the cap is shut down at once (shutdown(2) on its
 * descriptor, which libzmq then closes as a peer that hung up). Connections
 * that never finish their handshake are closed by libzmq after
 * FM_WIRE_HANDSHAKE_MS, so a flood holds at most `cap` descriptors, for at most
 * that long each. */
#ifndef FEDMOE_CONNECTIONS_H
#define FEDMOE_CONNECTIONS_H

#include "fedmoe/status.h"

typedef struct fm_conns fm_conns_t;

/* Watches sock (a bound or about to be bound socket of ctx) with a cap of
 * `cap` connections. Caller closes with fm_conns_close before closing sock. */
fm_status fm_conns_open(fm_conns_t **out, void *ctx, void *sock, int cap);
/* The socket to poll for events (owned by the counter). */
void *fm_conns_socket(fm_conns_t *c);
/* Handles every waiting event; `now` for rate-limited log lines. */
void fm_conns_handle(fm_conns_t *c, double now);
/* Connections open now. */
int fm_conns_open_count(const fm_conns_t *c);
/* Stops watching and frees the counter; sets *c to NULL; safe on NULL. */
void fm_conns_close(fm_conns_t **c);

#endif
