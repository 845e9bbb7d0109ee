/* dir.h - the names in a folder, sorted (the same order on every machine). */
#ifndef FEDMOE_DIR_H
#define FEDMOE_DIR_H

#include <stdbool.h>

#include "fedmoe/status.h"

typedef struct {
    char **names;
    int n;
} fm_names_t;

typedef enum {
    FM_DIR_FILES = 1,   /* regular files */
    FM_DIR_FOLDERS = 2, /* folders */
    FM_DIR_FOLLOW = 4,  /* taken through a symbolic link too (a mounted secret's files are links) */
} fm_dir_flags;

/* The names in dir of the kind flags asks for, not hidden (no leading dot),
 * sorted by strcmp; FM_ERR_IO with "cannot open the folder DIR: why" when it
 * cannot be read. The caller frees out with fm_names_free. */
fm_status fm_dir_names(const char *dir, int flags, fm_names_t *out);
void fm_names_free(fm_names_t *l);
/* Whether name is in l (sorted: fm_dir_names). */
bool fm_names_has(const fm_names_t *l, const char *name);

#endif
