/* params.h - parameters kept in groups, each one flat array with named views.
 *
 * A group (shared, local, prompt) holds weights, gradients and the two AdamW
 * moments as four parallel arrays, so averaging, sending or checkpointing a
 * group is one pass over one array. A view names a slice of a group and says
 * which level of the bi-level problem trains it, which part of the model it is
 * (its role) and what kind of tensor it is. Code decides by role and kind; the
 * names are for messages and people. */
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

/* Which part of the model a parameter belongs to. */
typedef enum {
    FM_ROLE_STEM = 0,   /* the input stem: mlp linear map, or cnn convolutions and fc */
    FM_ROLE_NORM,       /* a LayerNorm: each block's, and the image feature's */
    FM_ROLE_ROUTER,     /* a block's router */
    FM_ROLE_GENERALIST, /* a tensor of a generalist expert (shared) */
    FM_ROLE_SPECIALIST, /* a tensor of a specialist expert (the client's own) */
    FM_ROLE_PROMPT,     /* the local prompt P_L */
    FM_ROLE_GATING,     /* the attention gating over the prompt experts */
    FM_ROLE_EMBEDDING,  /* text: the byte and position embeddings (and a separate output layer) */
    FM_ROLE_ATTENTION,  /* text: a block's self-attention projections */
    FM_ROLE_COUNT
} fm_role;

/* What kind of tensor a parameter is (initialisation and weight decay follow it). */
typedef enum {
    FM_KIND_WEIGHT = 0, /* a matrix (the prompt's context vectors count as one) */
    FM_KIND_BIAS,       /* an additive bias */
    FM_KIND_NORM_GAIN,  /* a LayerNorm gain */
    FM_KIND_NORM_BIAS,  /* a LayerNorm shift */
} fm_param_kind;

/* A parameter as the model code sees it: weights and gradients of one view. */
typedef struct {
    float *w, *g;
    int id; /* index into fm_params_t.params */
} fm_view_t;

typedef struct {
    char name[48];       /* for messages and tests only: no decision is made from it */
    fm_group_id group;
    fm_level level;
    fm_role role;
    fm_param_kind kind;
    int block;           /* MoE block index, -1 outside the blocks */
    int unit;            /* expert index within its block (generalists first), -1 if not an expert */
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

/* Where and what a new parameter is: everything fm_params_add records besides its name. */
typedef struct {
    fm_group_id group;
    fm_level level;
    fm_role role;
    fm_param_kind kind;
    int block, unit;     /* as in fm_param_t; -1 when not applicable */
    int rows, cols;
    bool decay;          /* AdamW weight decay applies */
} fm_param_spec_t;

/* Registers a (rows x cols) parameter as spec describes, appended to its group.
 * The name is copied (truncated to 47 characters); view (owned by the caller,
 * which must keep it at a fixed address) is filled by fm_params_alloc. */
fm_status fm_params_add(fm_params_t *ps, fm_view_t *view, const char *name, const fm_param_spec_t *spec);
/* Allocates every group (all zero) and points each registered view into it. */
fm_status fm_params_alloc(fm_params_t *ps);
/* Frees the groups and the registry; safe on a zeroed struct. */
void fm_params_free(fm_params_t *ps);
/* Zeroes every gradient. */
void fm_params_zero_grad(fm_params_t *ps);
/* The parameter with this name, or NULL. Points into ps's registry: valid until
 * the next fm_params_add or fm_params_free. */
const fm_param_t *fm_params_find(const fm_params_t *ps, const char *name);
/* The first parameter (in registration order) with this role, or NULL; lifetime
 * as for fm_params_find. */
const fm_param_t *fm_params_find_role(const fm_params_t *ps, fm_role role);
/* Total number of floats over the groups. */
size_t fm_params_total(const fm_params_t *ps);
/* Name of a group ("shared", "local", "prompt"); a static string. */
const char *fm_group_name(fm_group_id g);
/* Name of a role ("stem", "norm", "router", "generalist", "specialist", "prompt",
 * "gating"; "?" otherwise); a static string. */
const char *fm_role_name(fm_role r);

#endif
