/* dir.c - the names in a folder (dir.h). */
#include "fedmoe/dir.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fedmoe/log.h"

void fm_names_free(fm_names_t *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->names[i]);
    free(l->names);
    memset(l, 0, sizeof *l);
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

bool fm_names_has(const fm_names_t *l, const char *name)
{
    return l->n > 0 && bsearch(&name, l->names, (size_t)l->n, sizeof(char *), cmp_name) != NULL;
}

static bool wanted(const char *dir, const char *name, int flags)
{
    char path[4096];
    struct stat sb;
    if (name[0] == '.' || snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path ||
        ((flags & FM_DIR_FOLLOW) ? stat(path, &sb) : lstat(path, &sb)) != 0)
        return false;
    return ((flags & FM_DIR_FILES) && S_ISREG(sb.st_mode)) || ((flags & FM_DIR_FOLDERS) && S_ISDIR(sb.st_mode));
}

fm_status fm_dir_names(const char *dir, int flags, fm_names_t *out)
{
    memset(out, 0, sizeof *out);
    DIR *d = opendir(dir);
    if (!d) {
        fm_error_set("cannot open the folder %s: %s", dir, strerror(errno));
        return FM_ERR_IO;
    }
    fm_status st = FM_OK;
    int cap = 0;
    for (struct dirent *e; st == FM_OK && (e = readdir(d));) {
        if (!wanted(dir, e->d_name, flags))
            continue;
        if (out->n == cap) {
            cap = cap ? 2 * cap : 64;
            char **g = realloc(out->names, sizeof(char *) * (size_t)cap);
            if (!g) {
                st = FM_ERR_NOMEM;
                break;
            }
            out->names = g;
        }
        if (!(out->names[out->n] = strdup(e->d_name)))
            st = FM_ERR_NOMEM;
        else
            out->n++;
    }
    closedir(d);
    if (st != FM_OK) {
        fm_names_free(out);
        return st;
    }
    if (out->n > 1)
        qsort(out->names, (size_t)out->n, sizeof(char *), cmp_name);
    return FM_OK;
}
