/* view_api.h - the JSON API of the browser view (docs/http.md): what a GET
 * of a path answers, read from the round log. No HTTP here (view_http.c
 * serves it), so the answers are tested without a socket too. */
#ifndef FEDMOE_VIEW_API_H
#define FEDMOE_VIEW_API_H

#include <stddef.h>
#include <stdio.h>

#include "fedmoe/store.h"

/* Bounds of a page (?limit=) */
#define FM_VIEW_ROUNDS_LIMIT 1000   /* rounds of a run (default and most) */
#define FM_VIEW_CLIENTS_LIMIT 100   /* clients of a round (default) */
#define FM_VIEW_CLIENTS_MAX 1000    /* ... at most */

typedef struct {
    int status;       /* 200, 400, 404, 500 */
    char *body;       /* malloc'd JSON (the caller frees it) */
    size_t len;
} fm_view_reply_t;

/* The value of query parameter `name` of the request, or NULL. */
typedef const char *(*fm_view_arg_fn)(void *ctx, const char *name);

/* The answer to GET path (already URL-decoded, without the query) with its
 * query parameters from arg(ctx, name). Never fails: errors are answers
 * ({"error": "..."} with 400, 404 or 500). */
void fm_view_api(fm_store_t *st, const char *path, fm_view_arg_fn arg, void *ctx, fm_view_reply_t *out);

#endif
