/* link.h - a client's connection to its coordinator: a DEALER socket with
 * CURVE, the client's key pair and the coordinator's pinned public key (the
 * coordinator knows the client by its key), or, when insecure, a plain socket
 * whose routing id is the client id; and what its handshakes say. */
#ifndef FEDMOE_LINK_H
#define FEDMOE_LINK_H

#include <stdbool.h>

#include "fedmoe/status.h"
#include "session.h"

typedef struct {
    const fm_session_config_t *cfg;
    void *ctx, *sock;
    bool own_ctx;   /* ctx is the link's (not a virtual host's) */
    void *mon;      /* handshake events of sock (CURVE only), to poll */
    bool unproven;  /* a handshake failed: the peer did not prove the pinned key */
    double refused_since; /* when refusals of our key began (0: none since the last success) */
} fm_link_t;

/* Seconds of refusals of our key after which the client gives up. A refusal is
 * not authenticated, so one alone does not end the client. */
#define FM_LINK_REFUSED_GIVE_UP_S 20.0

/* Creates the socket, applies CURVE (reading cfg->key and cfg->server_key; the
 * key's id must be cfg->id) or warns that it is insecure, and connects.
 * FM_ERR_ARG with a reason for keys the user can fix. cfg must outlive the
 * link. Close with fm_link_close, also after a failure. */
fm_status fm_link_open(fm_link_t *l, const fm_session_config_t *cfg);
/* Reads waiting handshake events: FM_ERR_ARG with the reason once the
 * coordinator has refused our key for FM_LINK_REFUSED_GIVE_UP_S (the end); a
 * peer that cannot prove the pinned key is warned about once (l->unproven) and
 * retried by libzmq. */
fm_status fm_link_check(fm_link_t *l);
/* Closes the sockets and the context. */
void fm_link_close(fm_link_t *l);

#endif
