#include "fedmoe/clientdata.h"

#include <stdlib.h>
#include <string.h>

#include "fedmoe/log.h"

void fm_data_spec_default(fm_data_spec_t *s)
{
    memset(s, 0, sizeof *s);
    s->dataset = "fmnist";
    fm_partition_config_default(&s->part);
    s->seed = 1;
    s->test_frac = 0.25;
    s->val_frac = 0.2;
}

/* The dataset of spec; without images, only its labels where the format keeps
 * them apart (IDX), everything otherwise (CSV). */
static fm_status load_any(fm_dataset_t *ds, const char *spec, bool images)
{
    if (strcmp(spec, "fmnist") == 0)
        return images ? fm_dataset_load_fmnist(ds, NULL) : fm_dataset_load_fmnist_labels(ds, NULL);
    if (strncmp(spec, "fmnist:", 7) == 0)
        return images ? fm_dataset_load_fmnist(ds, spec + 7) : fm_dataset_load_fmnist_labels(ds, spec + 7);
    if (strncmp(spec, "csv:", 4) == 0)
        return fm_dataset_load_csv(ds, spec + 4);
    if (strncmp(spec, "idx:", 4) == 0) {
        const char *comma = strchr(spec + 4, ',');
        if (!comma) {
            fm_error_set("dataset '%s': expected idx:IMAGES,LABELS", spec);
            return FM_ERR_ARG;
        }
        char path[4096];
        size_t n = (size_t)(comma - (spec + 4));
        if (n >= sizeof path) {
            fm_error_set("dataset '%s': path too long", spec);
            return FM_ERR_ARG;
        }
        memcpy(path, spec + 4, n);
        path[n] = 0;
        memset(ds, 0, sizeof *ds);
        fm_status st = fm_dataset_append_idx(ds, images ? path : NULL, comma + 1);
        if (st != FM_OK) {
            fm_dataset_free(ds);
            return st;
        }
        fm_dataset_standardize(ds);
        return FM_OK;
    }
    fm_error_set("dataset '%s': unknown; use fmnist, fmnist:DIR, idx:IMAGES,LABELS or csv:PATH", spec);
    return FM_ERR_ARG;
}

/* Client `client`'s split of its examples idx[0..n) of all, as spec says
 * (train / validation / test, or the holdout re-split). */
static fm_status split_client(fm_split_t *s, const uint32_t *idx, size_t n, const fm_dataset_t *all,
                              const fm_data_spec_t *spec, int client)
{
    fm_status st = fm_split_make(s, idx, n, all->y, all->classes, spec->seed, client, spec->test_frac, spec->val_frac);
    if (st == FM_OK && spec->holdout)
        st = fm_split_holdout(s, all->y, all->classes, spec->seed, client, spec->test_frac, spec->val_frac);
    return st;
}

fm_status fm_client_data_load(fm_client_data_t *cd, const fm_data_spec_t *spec)
{
    memset(cd, 0, sizeof *cd);
    fm_dataset_t all;
    fm_status st = load_any(&all, spec->dataset, true);
    if (st != FM_OK)
        return st;
    fm_partition_t part = {0};
    fm_split_t split = {0};
    uint32_t *mine = NULL;
    size_t n_mine = all.n;
    int client = 0;
    if (spec->count > 0) {
        if ((st = fm_partition_make(&part, all.y, all.n, all.classes, spec->count, spec->seed, &spec->part)) != FM_OK)
            goto out;
        client = spec->index;
        mine = part.index + part.offset[client];
        n_mine = part.offset[client + 1] - part.offset[client];
    } else {
        mine = malloc(sizeof(uint32_t) * all.n);
        if (!mine) {
            st = FM_ERR_NOMEM;
            goto out;
        }
        for (size_t i = 0; i < all.n; i++)
            mine[i] = (uint32_t)i;
    }
    if ((st = split_client(&split, mine, n_mine, &all, spec, client)) != FM_OK)
        goto out;
    if ((st = fm_dataset_subset(&cd->train, &all, split.train, split.n_train)) != FM_OK ||
        (st = fm_dataset_subset(&cd->val, &all, split.val, split.n_val)) != FM_OK ||
        (st = fm_dataset_subset(&cd->test, &all, split.test, split.n_test)) != FM_OK)
        goto out;
    cd->classes = all.classes;
    cd->dim = all.dim;
    cd->img_h = all.img_h;
    cd->img_w = all.img_w;
out:
    if (spec->count == 0)
        free(mine);
    fm_split_free(&split);
    fm_partition_free(&part);
    fm_dataset_free(&all);
    if (st != FM_OK)
        fm_client_data_free(cd);
    return st;
}

void fm_client_data_free(fm_client_data_t *cd)
{
    fm_dataset_free(&cd->train);
    fm_dataset_free(&cd->val);
    fm_dataset_free(&cd->test);
}

fm_status fm_client_data_sizes(const fm_data_spec_t *spec, fm_split_sizes_t *sizes)
{
    fm_dataset_t all;
    fm_status st = load_any(&all, spec->dataset, false);
    if (st != FM_OK)
        return st;
    fm_partition_t part = {0};
    if (spec->count < 1) {
        fm_error_set("partition sizes need a partition count");
        st = FM_ERR_ARG;
    } else {
        st = fm_partition_make(&part, all.y, all.n, all.classes, spec->count, spec->seed, &spec->part);
    }
    for (int c = 0; st == FM_OK && c < spec->count; c++) {
        fm_split_t split = {0};
        st = split_client(&split, part.index + part.offset[c], part.offset[c + 1] - part.offset[c], &all, spec, c);
        sizes[c] = (fm_split_sizes_t){split.n_train, split.n_val, split.n_test};
        fm_split_free(&split);
    }
    fm_partition_free(&part);
    fm_dataset_free(&all);
    return st;
}
