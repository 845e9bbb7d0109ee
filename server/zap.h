/* zap.h - the coordinator's ZeroMQ authentication handler (ZAP, RFC 27).
 *
 * libzmq asks it about every CURVE handshake on the coordinator's socket; it
 * admits a peer whose public key is in the allow-list and names it by the id
 * of that key (the ZAP User-Id) with the key itself as metadata (X-Key), which
 * the daemon then finds on every message of the connection, and refuses every
 * other peer before any message of theirs is read. The list is reread on
 * request (SIGHUP); a key removed or replaced is refused from then on, also on
 * connections made before. */
#ifndef FEDMOE_ZAP_H
#define FEDMOE_ZAP_H

#include "fedmoe/keys.h"
#include "fedmoe/status.h"

typedef struct fm_zap fm_zap_t;

/* Binds the handler's socket in ctx (before the coordinator's socket is bound)
 * and loads the allow-list from allow_dir. Caller closes with fm_zap_close. */
fm_status fm_zap_open(fm_zap_t **out, void *ctx, const char *allow_dir);
/* The socket to poll for requests (owned by the handler). */
void *fm_zap_socket(fm_zap_t *z);
/* Answers every waiting request. */
void fm_zap_handle(fm_zap_t *z);
/* Rereads the allow-list; on an error the old list stays and the reason is
 * logged. */
void fm_zap_reload(fm_zap_t *z);
/* Whether the key a connection was admitted with (key_z85, the X-Key its
 * messages carry) still belongs to id in the allow-list as it is now: false
 * once that key was removed or replaced by another key for id. */
bool fm_zap_allows(const fm_zap_t *z, const char *id, const char *key_z85);
/* A key that sends what cannot be read is held for a while. A message of id's
 * could not be read (malformed, too large or too costly to decode, another
 * protocol version, several frames): past FM_BUDGET_UNREADABLE's allowance (4,
 * then one in 10 s) its key is held for FM_ZAP_HOLD_S, its handshakes put off
 * (status 300). True when this message started the hold: the caller then closes
 * the key's connections and drops its waiting messages unread (fm_zap_held). */
#define FM_ZAP_HOLD_S 60.0
bool fm_zap_unreadable(fm_zap_t *z, const char *id, double now);
/* Whether id's key is held at now. */
bool fm_zap_held(fm_zap_t *z, const char *id, double now);
/* Closes the socket and frees the handler; sets *z to NULL; safe on NULL. */
void fm_zap_close(fm_zap_t **z);

#endif
