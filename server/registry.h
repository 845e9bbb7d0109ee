/* registry.h - the clients a coordinator knows: ids, partitions, liveness and
 * their committed prompt-pool entries.
 *
 * A client keeps its slot (an index) for the life of the registry, so a round can
 * refer to its participants by slot; iteration in id order (fm_registry_sorted)
 * is what every deterministic choice uses (selection, nearest prompts, the
 * checkpoint's pool order). Lookup by id is a binary search; the owner of a
 * partition is a table look-up. */
#ifndef FEDMOE_REGISTRY_H
#define FEDMOE_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fedmoe/status.h"

typedef struct {
    char id[64];
    int partition;          /* assigned partition, -1: none yet (set with fm_registry_set_partition) */
    int specialists;
    uint64_t train_samples, val_samples, test_samples; /* as its hello declared them */
    uint64_t weight;        /* its averaging weight, decided at hello */
    bool own_counts;        /* its counts are its own word (data of its own, or the dataset unreadable here) */
    bool connected;         /* said hello and not silent since */
    bool ready;             /* has its data: said hello with sample counts */
    bool greeted;           /* said hello to this coordinator since it started */
    int failures;           /* rounds in a row it was selected for and gave nothing usable */
    int benched_until;      /* not selected before this round (after failures; a Hello does not reset it) */
    double benched_until_s; /* ... nor before this time: rounds run again do not advance the round
                               number, so a bench in rounds alone could last for ever */
    double last_seen;       /* the coordinator's clock at its last message */
    double logged_at;       /* when its row in the round log was last written */
    char first_seen[32];
    float *prompt;          /* committed pool entry (owned), or NULL */
} fm_client_t;

typedef struct fm_registry fm_registry_t;

/* An empty registry of a run with `partitions` partitions; caller destroys it
 * (freeing every pool entry). */
fm_status fm_registry_new(fm_registry_t **out, int partitions);
/* Frees the registry and every entry it owns, sets *r to NULL; safe on NULL. */
void fm_registry_destroy(fm_registry_t **r);

/* Number of clients (slots 0..count-1). */
int fm_registry_count(const fm_registry_t *r);
/* The client in slot i; the pointer is valid until the next fm_registry_add. */
fm_client_t *fm_registry_at(fm_registry_t *r, int slot);
/* The slot of id, or -1. */
int fm_registry_find(const fm_registry_t *r, const char *id);
/* Adds a client (partition -1, first seen now) and returns its slot, or -1 when
 * out of memory. The id must not be present. */
int fm_registry_add(fm_registry_t *r, const char *id);
/* The slots in id order (count entries, owned by the registry, valid until the
 * next fm_registry_add). */
const int *fm_registry_sorted(const fm_registry_t *r);
/* Gives the client in slot its partition p (in the run's range), or none (-1). */
void fm_registry_set_partition(fm_registry_t *r, int slot, int p);
/* The lowest partition that no client holds, or -1. */
int fm_registry_free_partition(const fm_registry_t *r);
/* The slot holding partition p, or -1. */
int fm_registry_partition_owner(const fm_registry_t *r, int p);

#endif
