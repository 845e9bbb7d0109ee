/* routes.h - which connection reaches a client when connections are named by
 * their keys. With CURVE a client's id is the id of its key (the ZAP User-Id),
 * not the routing id of its connection (libzmq picks one at random for a client
 * that sets none; one a peer sets is not trusted), so the daemon keeps, for each
 * id, the routing id of the latest authenticated message from it and replies
 * through that. A client that reconnects is reached again with its first
 * message. Only ids that passed the key check get an entry, so the table is
 * bounded by the allow-list. */
#ifndef FEDMOE_ROUTES_H
#define FEDMOE_ROUTES_H

#include <stddef.h>
#include <stdint.h>

#include "fedmoe/status.h"

typedef struct fm_routes fm_routes_t;

/* An empty table; caller frees with fm_routes_free. */
fm_status fm_routes_new(fm_routes_t **out);
/* Frees the table, sets *r to NULL; safe on NULL. */
void fm_routes_free(fm_routes_t **r);
/* Client id is reached through routing id rid (len 1..255 bytes, copied). */
fm_status fm_routes_set(fm_routes_t *r, const char *id, const void *rid, size_t len);
/* The routing id that reaches id (owned by the table, valid until the next
 * set), its length in *len; NULL when id has sent nothing. */
const uint8_t *fm_routes_get(const fm_routes_t *r, const char *id, size_t *len);

#endif
