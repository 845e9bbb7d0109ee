#include "routes.h"

#include <stdlib.h>
#include <string.h>

#include "fedmoe/log.h"

typedef struct {
    char id[64];
    uint8_t rid[255];
    uint8_t len;
} route_t;

struct fm_routes {
    route_t *v; /* sorted by id */
    size_t n, cap;
};

fm_status fm_routes_new(fm_routes_t **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? FM_OK : FM_ERR_NOMEM;
}

void fm_routes_free(fm_routes_t **r)
{
    if (!r || !*r)
        return;
    free((*r)->v);
    free(*r);
    *r = NULL;
}

/* The index of id, or where it would go (*found false). */
static size_t find(const fm_routes_t *r, const char *id, int *found)
{
    size_t lo = 0, hi = r->n;
    *found = 0;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = strcmp(r->v[mid].id, id);
        if (c == 0) {
            *found = 1;
            return mid;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

fm_status fm_routes_set(fm_routes_t *r, const char *id, const void *rid, size_t len)
{
    if (len < 1 || len > 255 || strlen(id) >= sizeof r->v[0].id)
        return FM_ERR_ARG;
    int found;
    size_t i = find(r, id, &found);
    if (!found) {
        if (r->n == r->cap) {
            size_t cap = r->cap ? r->cap * 2 : 64;
            route_t *v = realloc(r->v, sizeof *v * cap);
            if (!v) {
                fm_error_set("routes: out of memory");
                return FM_ERR_NOMEM;
            }
            r->v = v;
            r->cap = cap;
        }
        memmove(r->v + i + 1, r->v + i, sizeof *r->v * (r->n - i));
        r->n++;
        memset(&r->v[i], 0, sizeof r->v[i]);
        strcpy(r->v[i].id, id);
    }
    memcpy(r->v[i].rid, rid, len);
    r->v[i].len = (uint8_t)len;
    return FM_OK;
}

const uint8_t *fm_routes_get(const fm_routes_t *r, const char *id, size_t *len)
{
    int found;
    size_t i = r->n ? find(r, id, &found) : (found = 0, 0);
    if (!found)
        return NULL;
    *len = r->v[i].len;
    return r->v[i].rid;
}
