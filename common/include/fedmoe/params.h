/* params.h - parameters kept in groups, each one flat array with named views.
 *
 * A group (shared, local, prompt) holds weights, gradients and the two AdamW
 * moments as four parallel arrays, so averaging, sending or checkpointing a
 * group is one pass over one array. A view names a slice of a group and says
 * which level of the bi-level problem trains it. */
#ifndef FEDMOE_PARAMS_H
#define FEDMOE_PARAMS_H

#include <stdbool.h>
#include <stddef.h>

#include "fedmoe/status.h"

typedef enum {
    FM_GROUP_SHARED = 0, /* stem, norms, generalist experts: averaged by the coordinator */
    FM_GROUP_LOCAL,      /* specialists, routers, gating: never leave the client */
    FM_GROUP_PROMPT,     /* the local prompt: uploaded, averaged, pooled */
    FM_GROUP_COUNT
} fm_group_id;

typedef enum {
    FM_LEVEL_LOWER = 1, /* trained on train batches (experts, stem, prompt, gating) */
    FM_LEVEL_UPPER = 2, /* trained on validation batches (routers) */
} fm_level;

/* A parameter as the model code sees it: weights and gradients of one view. */
typedef struct {
    float *w, *g;
    int id; /* index into fm_params_t.params */
} fm_view_t;

typedef struct {
    char name[48];
    fm_group_id group;
    fm_level level;
    size_t offset, size; /* in floats, within the group */
    int rows, cols;
    bool decay;          /* AdamW weight decay applies (matrices, not biases/norms) */
    fm_view_t *view;     /* the model's handle, fixed up by fm_params_alloc */
} fm_param_t;

typedef struct {
    float *w, *g, *m, *v; /* each `size` floats */
    size_t size;
} fm_group_t;

typedef struct {
    fm_group_t groups[FM_GROUP_COUNT];
    fm_param_t *params;
    int count, cap;
} fm_params_t;

/* Registers a (rows x cols) parameter in a group; view is filled by fm_params_alloc. */
fm_status fm_params_add(fm_params_t *ps, fm_view_t *view, const char *name, fm_group_id group,
                        fm_level level, int rows, int cols, bool decay);
/* Allocates every group (all zero) and points each registered view into it. */
fm_status fm_params_alloc(fm_params_t *ps);
/* Frees the groups and the registry; safe on a zeroed struct. */
void fm_params_free(fm_params_t *ps);
/* Zeroes every gradient. */
void fm_params_zero_grad(fm_params_t *ps);
/* The parameter with this name, or NULL. */
const fm_param_t *fm_params_find(const fm_params_t *ps, const char *name);
/* Total number of floats over the groups. */
size_t fm_params_total(const fm_params_t *ps);
/* Name of a group ("shared", "local", "prompt"). */
const char *fm_group_name(fm_group_id g);

#endif
