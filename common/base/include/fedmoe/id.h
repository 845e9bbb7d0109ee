/* id.h - what a client id may be: 1 to 63 of [A-Za-z0-9._-]. The same rule for
 * a key file's id, a config value, a ZeroMQ routing id and a Hello. */
#ifndef FEDMOE_ID_H
#define FEDMOE_ID_H

#include <stdbool.h>
#include <stddef.h>

/* Whether the n bytes at id are a valid client id. */
bool fm_id_valid(const char *id, size_t n);

#endif
