/* view_http.h - the browser view's HTTP server (libmicrohttpd): the JSON API
 * of view_api.h over a read-only handle on the round log, on loopback. */
#ifndef FEDMOE_VIEW_HTTP_H
#define FEDMOE_VIEW_HTTP_H

#include <signal.h>

#include "fedmoe/status.h"

/* Serves db's round log on listen ("HOST:PORT"; a loopback address: 127.0.0.1,
 * ::1 or localhost) until *stop is set. FM_ERR_ARG / FM_ERR_IO with one line
 * when the address is not loopback or taken, or the database is missing. */
fm_status fm_view_serve(const char *db, const char *listen, volatile sig_atomic_t *stop);

#endif
