/* view_assets.h - the browser view's page (server/history/view_page/), built into
 * the program (cmake/embed_assets.cmake) so it serves without a data folder. */
#ifndef FEDMOE_VIEW_ASSETS_H
#define FEDMOE_VIEW_ASSETS_H

#include <stddef.h>

typedef struct {
    const char *path; /* "/index.html", ...; NULL ends the table */
    const char *type; /* its Content-Type */
    const unsigned char *data;
    size_t len;
} fm_view_asset_t;

extern const fm_view_asset_t fm_view_assets[];

#endif
