/* regime.h - data regimes: how much data a client learns from (caps), what its
 * images look like (domains: feature shift) and what its labels mean (concept
 * groups: concept shift).
 *
 * Everything here is computed from (seed, client) alone, like the partition, so
 * every party agrees without being told. The rules:
 *  - A cap of N applies to a client's train and validation examples after its
 *    partition is split: its validation split keeps round(N x val_frac) of its
 *    examples and its train split the rest of N, each a seeded random subset of
 *    that split (never an example moved between splits); the test split is kept
 *    whole, so scores are not noise. For text, N counts bytes and whole
 *    documents are kept while they fit (at least one a split). Caps are nested:
 *    with one seed, the examples kept under a cap are among those kept under any
 *    larger one.
 *  - Client i's domain is domains[i mod n]; it transforms the pixels of all
 *    three of its splits, in [0,1] before standardization.
 *  - Client i is in concept group i mod G. Group 0 keeps the labels; group g > 0
 *    relabels class c as map_g[c], a permutation without fixed points drawn from
 *    (seed, g), on all three splits. */
#ifndef FEDMOE_REGIME_H
#define FEDMOE_REGIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fedmoe/dataset.h"
#include "fedmoe/status.h"

/* ---- caps ---- */

#define FM_CAP_MAX_VALUES 32
#define FM_CAP_MAX ((uint64_t)1 << 40)

typedef enum {
    FM_CAP_NONE = 0, /* every example */
    FM_CAP_FIXED,    /* v[0] for every client */
    FM_CAP_LIST,     /* client i: v[i mod n] */
    FM_CAP_RANGE,    /* client i: log-uniform in [v[0], v[1]], drawn from (seed, i) */
} fm_cap_kind;

typedef struct {
    fm_cap_kind kind;
    int n;
    uint64_t v[FM_CAP_MAX_VALUES];
} fm_cap_t;

/* "off" (or ""), "N", "A,B,C" or "A..B", every value 1..FM_CAP_MAX. FM_ERR_ARG
 * with a reason naming flag otherwise. */
fm_status fm_cap_parse(const char *flag, const char *text, fm_cap_t *out);
/* The inverse: "off", "100", "25,100,400", "25..1000". */
void fm_cap_name(const fm_cap_t *c, char *buf, size_t cap);
bool fm_cap_same(const fm_cap_t *a, const fm_cap_t *b);
/* Client `client`'s cap; 0 for none. */
uint64_t fm_cap_of(const fm_cap_t *c, uint64_t seed, int client);

/* Keeps of train[0..*n_train) and val[0..*n_val) (indices of examples; in
 * place, in their order) those the cap `limit` keeps, as the rules above say.
 * cost[i] is example i's size (NULL: 1 each; text: a document's bytes).
 * limit 0 keeps everything. */
void fm_cap_apply(uint64_t limit, double val_frac, uint64_t seed, int client, const uint64_t *cost, uint32_t *train,
                  size_t *n_train, uint32_t *val, size_t *n_val);

/* ---- domains ---- */

typedef enum {
    FM_DOMAIN_IDENTITY = 0,
    FM_DOMAIN_ROTATE90, /* a quarter turn clockwise */
    FM_DOMAIN_ROTATE180,
    FM_DOMAIN_ROTATE270,
    FM_DOMAIN_INVERT,   /* 1 - x */
    FM_DOMAIN_BLUR,     /* binomial 5x5 (1 4 6 4 1)/16 each way, edges repeated */
    FM_DOMAIN_NOISE,    /* + N(0, FM_DOMAIN_NOISE_SD), fixed per example */
    FM_DOMAIN_PATCHES,  /* a 4x4 grid of tiles shuffled by one permutation of the seed */
    FM_DOMAIN_KINDS
} fm_domain_kind;

#define FM_DOMAIN_NOISE_SD 0.3f
#define FM_DOMAIN_GRID 4
#define FM_DOMAINS_MAX 16

typedef struct {
    int n; /* 0: none */
    fm_domain_kind kind[FM_DOMAINS_MAX];
} fm_domains_t;

const char *fm_domain_name(fm_domain_kind k);
/* A comma list of domain names, or of the presets "rotate" (identity,
 * rotate90, rotate180, rotate270) and "all" (every domain), expanded in place;
 * "off" or "" for none. */
fm_status fm_domains_parse(const char *flag, const char *text, fm_domains_t *out);
/* The names, comma-separated ("off" for none). */
void fm_domains_name(const fm_domains_t *d, char *buf, size_t cap);
bool fm_domains_same(const fm_domains_t *a, const fm_domains_t *b);
/* Client `client`'s domain. */
fm_domain_kind fm_domain_of(const fm_domains_t *d, int client);

/* Transforms one image of h x w pixels in [0,1] (row-major) in place. noise_key
 * picks its noise (the example's index in the dataset); scratch holds h x w
 * floats. The rotations need h == w, the tiles h and w divisible by
 * FM_DOMAIN_GRID (checked by fm_domains_check). */
void fm_domain_apply(fm_domain_kind k, float *img, int h, int w, uint64_t seed, uint64_t noise_key, float *scratch);
/* Whether data of h x w images can take every domain of d; FM_ERR_ARG with a reason. */
fm_status fm_domains_check(const fm_domains_t *d, int h, int w);
/* Applies domain k to every row of ds (standardized images: each row is taken
 * back to [0,1], transformed and standardized again); keys[i] is row i's
 * example index (its noise). */
fm_status fm_domain_apply_dataset(fm_domain_kind k, fm_dataset_t *ds, const uint32_t *keys, uint64_t seed);

/* ---- concept groups ---- */

#define FM_CONCEPT_GROUPS_MAX 64

/* map[0..classes) for group g of a run with this seed: the identity for g 0, a
 * permutation without fixed points otherwise (classes >= 2). */
void fm_concept_map(uint64_t seed, int group, int classes, uint8_t *map);
/* Relabels ds by client `client`'s map (groups 0 or 1: nothing). */
void fm_concept_apply(fm_dataset_t *ds, uint64_t seed, int groups, int client);

/* ---- the three together ---- */

typedef struct {
    fm_cap_t examples; /* images (and CSV): examples */
    fm_cap_t bytes;    /* text: bytes */
    fm_domains_t domains;
    int concept_groups; /* 0 or 1: none */
} fm_regime_t;

bool fm_regime_same(const fm_regime_t *a, const fm_regime_t *b);
/* Whether any of it is set (a run on the whole data of every client otherwise). */
bool fm_regime_any(const fm_regime_t *r);
/* Checks r against the task: caps in bytes only for text, in examples only for
 * the others, domains and concept groups not for text. FM_ERR_ARG with a reason. */
fm_status fm_regime_check(const fm_regime_t *r, bool text);

#endif
