/* clientdata.h - a client's data: load a dataset, take its partition, split it.
 *
 * Dataset specs: "fmnist" (Debian's package), "fmnist:DIR", "idx:IMAGES,LABELS",
 * "csv:PATH", and text: "fortunes", "fortunes:LANG,...", "text:DIR"
 * (textdata.h). With count == 0 the client takes all the data (centralized).
 * Text is partitioned and split by document (labelled by language), then each
 * split's documents become windows of `context` bytes. */
#ifndef FEDMOE_CLIENTDATA_H
#define FEDMOE_CLIENTDATA_H

#include <stdbool.h>
#include <stdint.h>

#include "fedmoe/dataset.h"
#include "fedmoe/partition.h"
#include "fedmoe/regime.h"
#include "fedmoe/status.h"
#include "fedmoe/textdata.h"

typedef struct {
    const char *dataset;        /* spec as above */
    int index, count;           /* partition index / number of clients; count 0 = all data */
    fm_partition_config_t part;
    uint64_t seed;
    double test_frac, val_frac; /* 0.25, 0.2 */
    int context;                /* text: bytes a window gives the model (its context) */
    bool holdout;               /* evaluate on a held-out part of train + validation,
                                 * never loading the test split (fm_split_holdout) */
    fm_regime_t regime;         /* caps, domains, concept groups (regime.h) */
} fm_data_spec_t;

/* Whether dataset names data in its standard place (fmnist, fortunes,
 * fortunes:LANG,...), not a path: all a client takes from the network. */
bool fm_data_spec_named(const char *dataset);

/* Fashion-MNIST, the partition defaults, seed 1, a 25% test and 20% validation split. */
void fm_data_spec_default(fm_data_spec_t *s);
/* Whether a and b give the same data (dataset, partitioning, splits), whatever
 * the client index. */
bool fm_data_spec_same(const fm_data_spec_t *a, const fm_data_spec_t *b);

typedef struct {
    fm_dataset_t train, val, test;
    int classes, dim, img_h, img_w;
    char languages[64]; /* text: its languages by share of windows, e.g. "it" or "en 62%, de 38%" */
} fm_client_data_t;

/* Loads, partitions and splits; on error records a reason. Free with fm_client_data_free. */
fm_status fm_client_data_load(fm_client_data_t *cd, const fm_data_spec_t *spec);
/* The sizes of the three splits of every partition 0..spec->count-1 (sizes has
 * spec->count entries), exactly as fm_client_data_load gives them, from the
 * dataset's labels alone. What a coordinator knows of its clients' data. */
fm_status fm_client_data_sizes(const fm_data_spec_t *spec, fm_split_sizes_t *sizes);
/* Frees the three splits cd owns (each zeroed). */
void fm_client_data_free(fm_client_data_t *cd);

/* A dataset loaded and partitioned once for the many clients of one process
 * (a virtual host): a client's data is then its split of the shared examples,
 * copied (a client's own is small), the same as fm_client_data_load's. */
typedef struct {
    fm_data_spec_t spec; /* (index unused) */
    char dataset[256];
    fm_dataset_t all;    /* text: its documents, labels only (x and tok NULL) */
    fm_text_corpus_t text; /* text: the documents */
    fm_partition_t part; /* when spec.count > 0 */
} fm_data_cache_t;
fm_status fm_data_cache_load(fm_data_cache_t *c, const fm_data_spec_t *spec);
/* Whether c holds the data of spec (the same dataset, partitioning and splits). */
bool fm_data_cache_serves(const fm_data_cache_t *c, const fm_data_spec_t *spec);
/* Client `index`'s data from c. Free with fm_client_data_free. */
fm_status fm_client_data_from_cache(fm_client_data_t *cd, const fm_data_cache_t *c, int index);
/* Frees c (safe on a zeroed or failed one). */
void fm_data_cache_free(fm_data_cache_t *c);

#endif
