/* link.h - a client's connection to its coordinator: a DEALER socket with
 * CURVE, the client's key pair and the coordinator's pinned public key (the
 * coordinator knows the client by its key), or, when insecure, a plain socket
 * whose routing id is the client id; and what its handshakes say. The one
 * owner of a session's socket (client/host.c holds a link per session). */
#ifndef FEDMOE_LINK_H
#define FEDMOE_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fedmoe/status.h"
#include "session.h"

typedef struct {
    const fm_session_config_t *cfg;
    void *ctx, *sock;
    bool own_ctx;   /* ctx is the link's (not a virtual host's) */
    void *mon;      /* handshake events of sock (CURVE, a client of its own only), to poll */
    bool unproven;  /* a handshake failed: the peer did not prove the pinned key */
    double refused_since; /* when refusals of our key began (0: none since the last success) */
} fm_link_t;

/* Seconds of refusals of our key after which the client gives up. A refusal is
 * not authenticated, so one alone does not end the client. */
#define FM_LINK_REFUSED_GIVE_UP_S 20.0

/* Creates the socket as client `id` with the key pair in key_path (ignored
 * when insecure), applies CURVE (the key's id must be id; cfg->server_key
 * pinned) or warns that it is insecure, and connects. In a shared context
 * (a virtual host's; NULL: a context of its own) the socket has no ZMTP
 * heartbeats and no handshake monitor. FM_ERR_ARG with a reason for keys the
 * user can fix. cfg must outlive the link. Close with fm_link_close, also after
 * a failure. */
fm_status fm_link_open(fm_link_t *l, const fm_session_config_t *cfg, const char *id, const char *key_path,
                       void *shared_ctx);
/* Reads waiting handshake events: FM_ERR_ARG with the reason once the
 * coordinator has refused our key for FM_LINK_REFUSED_GIVE_UP_S (the end); a
 * peer that cannot prove the pinned key is warned about once (l->unproven) and
 * retried by libzmq. */
fm_status fm_link_check(fm_link_t *l, double now);
/* Why no Welcome came, as far as the handshakes tell ("" when they do not). */
const char *fm_link_why_silent(const fm_link_t *l);
/* Sends one message; FM_OK when it went out. */
fm_status fm_link_send(fm_link_t *l, const uint8_t *msg, size_t len);
/* Closes the sockets and the context. */
void fm_link_close(fm_link_t *l);

#endif
