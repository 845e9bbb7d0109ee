#include "registry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/clock.h"

struct fm_registry {
    fm_client_t *slots;
    int *order; /* slots sorted by id */
    int count, cap;
    int *owner; /* per partition: the slot holding it, -1: none */
    int partitions;
};

fm_status fm_registry_new(fm_registry_t **out, int partitions)
{
    fm_registry_t *r = calloc(1, sizeof *r);
    int *owner = malloc(sizeof(int) * (size_t)(partitions > 0 ? partitions : 1));
    if (!r || !owner) {
        free(r);
        free(owner);
        *out = NULL;
        return FM_ERR_NOMEM;
    }
    for (int p = 0; p < partitions; p++)
        owner[p] = -1;
    r->owner = owner;
    r->partitions = partitions;
    *out = r;
    return FM_OK;
}

void fm_registry_destroy(fm_registry_t **rp)
{
    fm_registry_t *r = rp ? *rp : NULL;
    if (!r)
        return;
    for (int i = 0; i < r->count; i++)
        free(r->slots[i].prompt);
    free(r->slots);
    free(r->order);
    free(r->owner);
    free(r);
    *rp = NULL;
}

int fm_registry_count(const fm_registry_t *r) { return r->count; }
fm_client_t *fm_registry_at(fm_registry_t *r, int slot) { return &r->slots[slot]; }
const int *fm_registry_sorted(const fm_registry_t *r) { return r->order; }

/* The position in order where id is, or would be inserted. */
static int lower_bound(const fm_registry_t *r, const char *id)
{
    int lo = 0, hi = r->count;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (strcmp(r->slots[r->order[mid]].id, id) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int fm_registry_find(const fm_registry_t *r, const char *id)
{
    int at = lower_bound(r, id);
    return at < r->count && strcmp(r->slots[r->order[at]].id, id) == 0 ? r->order[at] : -1;
}

int fm_registry_add(fm_registry_t *r, const char *id)
{
    if (r->count == r->cap) {
        int cap = r->cap ? r->cap * 2 : 16;
        fm_client_t *s = realloc(r->slots, sizeof *s * (size_t)cap);
        if (!s)
            return -1;
        r->slots = s;
        int *o = realloc(r->order, sizeof *o * (size_t)cap);
        if (!o)
            return -1;
        r->order = o;
        r->cap = cap;
    }
    int slot = r->count, at = lower_bound(r, id);
    fm_client_t *c = &r->slots[slot];
    memset(c, 0, sizeof *c);
    snprintf(c->id, sizeof c->id, "%s", id);
    c->partition = -1;
    fm_clock_utc(c->first_seen);
    memmove(r->order + at + 1, r->order + at, sizeof(int) * (size_t)(r->count - at));
    r->order[at] = slot;
    r->count++;
    return slot;
}

void fm_registry_set_partition(fm_registry_t *r, int slot, int p)
{
    fm_client_t *c = &r->slots[slot];
    if (c->partition >= 0 && c->partition < r->partitions && r->owner[c->partition] == slot)
        r->owner[c->partition] = -1;
    c->partition = p >= 0 && p < r->partitions ? p : -1;
    if (c->partition >= 0)
        r->owner[c->partition] = slot;
}

int fm_registry_partition_owner(const fm_registry_t *r, int p)
{
    return p >= 0 && p < r->partitions ? r->owner[p] : -1;
}

int fm_registry_free_partition(const fm_registry_t *r)
{
    for (int p = 0; p < r->partitions; p++)
        if (r->owner[p] < 0)
            return p;
    return -1;
}
