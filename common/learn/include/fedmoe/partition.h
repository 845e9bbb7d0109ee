/* partition.h - deterministic client partitions and per-client splits.
 *
 * Every party computes the same partition from (labels, seed, clients, config)
 * alone. Schemes: Dirichlet(alpha) label skew with a minimum per client (PFLlib's
 * algorithm: each class spread over the clients), client-wise Dirichlet (each
 * client n/clients examples, its class mix drawn; Hsu et al. 2019; for thousands
 * of clients), pathological (s classes per client), IID. A client's part is split
 * stratified by class into 75% train / 25% test, and 20% of train becomes
 * validation. */
#ifndef FEDMOE_PARTITION_H
#define FEDMOE_PARTITION_H

#include <stddef.h>
#include <stdint.h>

#include "fedmoe/status.h"

typedef enum {
    FM_PARTITION_DIRICHLET = 0,
    FM_PARTITION_PATHOLOGICAL,
    FM_PARTITION_IID,
    FM_PARTITION_CLIENT_DIRICHLET,
} fm_partition_kind;

typedef struct {
    fm_partition_kind kind;
    double alpha;           /* Dirichlet concentration, both Dirichlet schemes (0.3) */
    int classes_per_client; /* pathological s (2) */
    size_t min_samples;     /* class-wise Dirichlet: every client gets at least this many (40) */
} fm_partition_config_t;

/* Dirichlet(0.3), 2 classes per client for pathological, 40 examples at least. */
void fm_partition_config_default(fm_partition_config_t *c);
/* "dirichlet", "pathological", "iid" or "client-dirichlet" (the wire and round-log names); a static string. */
const char *fm_partition_kind_name(fm_partition_kind k);
/* The inverse of fm_partition_kind_name; FM_ERR_ARG with a reason otherwise. */
fm_status fm_partition_kind_parse(const char *flag, const char *name, fm_partition_kind *out);

/* Client i owns index[offset[i] .. offset[i+1]), ascending. */
typedef struct {
    int clients;
    size_t *offset; /* clients + 1 */
    uint32_t *index;
} fm_partition_t;

/* Splits examples 0..n-1 (labels[i] < classes) over clients by cfg, drawn from
 * (seed, the partition stream) alone: everyone computes the same partition. p
 * owns its arrays (fm_partition_free). FM_ERR_ARG with a reason for impossible
 * settings (more clients than examples, a Dirichlet draw that cannot give every
 * client min_samples in 1,000 tries). */
fm_status fm_partition_make(fm_partition_t *p, const uint8_t *labels, size_t n, int classes, int clients,
                            uint64_t seed, const fm_partition_config_t *cfg);
/* Frees what p owns and zeroes it (p itself is the caller's). */
void fm_partition_free(fm_partition_t *p);

typedef struct {
    uint32_t *train, *val, *test; /* indices into the full dataset */
    size_t n_train, n_val, n_test;
} fm_split_t;

/* The sizes of a client's three splits. */
typedef struct {
    uint64_t train, val, test;
} fm_split_sizes_t;

/* Stratified split of one client's examples idx[0..n): test_frac of every class to
 * test, then val_frac of the rest to validation. Drawn from (seed, client). */
fm_status fm_split_make(fm_split_t *s, const uint32_t *idx, size_t n, const uint8_t *labels, int classes,
                        uint64_t seed, int client, double test_frac, double val_frac);
/* For choosing settings without the test split: replaces s by a split of its
 * train and validation examples alone, in the same proportions (test_frac of them
 * become the held-out evaluation set), from another stream of (seed, client).
 * s's test examples are dropped. */
fm_status fm_split_holdout(fm_split_t *s, const uint8_t *labels, int classes, uint64_t seed, int client,
                           double test_frac, double val_frac);
/* Frees what s owns and zeroes it. */
void fm_split_free(fm_split_t *s);

#endif
