/* view_http.h - the browser view's HTTP server (libmicrohttpd): the JSON API
 * of view_api.h over a read-only handle on the round log, on loopback. */
#ifndef FEDMOE_VIEW_HTTP_H
#define FEDMOE_VIEW_HTTP_H

#include <signal.h>

#include "fedmoe/status.h"

/* Serves db's round log on listen ("HOST:PORT") until *stop is set. Without
 * token_file (NULL) only a loopback address (127.0.0.1, ::1, localhost); with
 * it any IPv4 address, and every /api/ request must carry its token
 * ("Authorization: Bearer TOKEN", or ?token=TOKEN), else 401. FM_ERR_ARG /
 * FM_ERR_IO with one line when the address is refused or taken, the token
 * file unfit (missing, shorter than 16 characters, readable by others) or the
 * database missing. */
fm_status fm_view_serve(const char *db, const char *listen, const char *token_file, volatile sig_atomic_t *stop);

#endif
