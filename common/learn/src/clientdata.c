#include "fedmoe/clientdata.h"

#include <stdio.h>
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
    s->context = 128;
}

bool fm_data_spec_named(const char *dataset)
{
    if (strcmp(dataset, "fmnist") == 0)
        return true;
    if (strncmp(dataset, "text:", 5) == 0 || !fm_text_spec(dataset))
        return false;
    for (const char *p = dataset; *p; p++) /* (source names, language codes, ':', ',' and '+' only) */
        if (!((*p >= 'a' && *p <= 'z') || *p == ',' || *p == ':' || *p == '+'))
            return false;
    return true;
}

/* Where a dataset's IDX files are: image and label file pairs, in the order
 * they are appended. */
typedef struct {
    int files;
    char images[2][4096], labels[2][4096];
} idx_source_t;

/* The IDX files of spec, or files = 0 for a dataset that is not IDX (CSV). */
static fm_status idx_source(idx_source_t *src, const char *spec)
{
    memset(src, 0, sizeof *src);
    if (strcmp(spec, "fmnist") == 0 || strncmp(spec, "fmnist:", 7) == 0) {
        const char *dir = spec[6] == ':' ? spec + 7 : FM_FMNIST_DIR;
        for (int i = 0; i < 2; i++) {
            snprintf(src->images[i], sizeof src->images[i], "%s/%s", dir, FM_FMNIST_FILES[i][0]);
            snprintf(src->labels[i], sizeof src->labels[i], "%s/%s", dir, FM_FMNIST_FILES[i][1]);
        }
        src->files = 2;
        return FM_OK;
    }
    if (strncmp(spec, "idx:", 4) == 0) {
        const char *comma = strchr(spec + 4, ',');
        size_t n = comma ? (size_t)(comma - (spec + 4)) : 0;
        if (!comma || n >= sizeof src->images[0] || strlen(comma + 1) >= sizeof src->labels[0]) {
            fm_error_set("dataset '%s': expected idx:IMAGES,LABELS", spec);
            return FM_ERR_ARG;
        }
        memcpy(src->images[0], spec + 4, n);
        snprintf(src->labels[0], sizeof src->labels[0], "%s", comma + 1);
        src->files = 1;
        return FM_OK;
    }
    if (strncmp(spec, "csv:", 4) == 0 || fm_text_spec(spec))
        return FM_OK;
    fm_error_set("dataset '%s': unknown; use fmnist, fmnist:DIR, idx:IMAGES,LABELS, csv:PATH, fortunes, "
                 "fortunes:LANG,..., manpages[:LANG,...] (text sources joined by +) or text:DIR", spec);
    return FM_ERR_ARG;
}

/* The dataset of spec; without images, only its labels where the format keeps
 * them apart (IDX: per_file then says how many examples each file has),
 * everything otherwise (CSV). */
/* Text: the corpus, and its documents as examples of ds (labels alone: their
 * languages), which partitions and splits are made over. */
static fm_status load_text(fm_dataset_t *ds, fm_text_corpus_t *text, const char *spec)
{
    memset(ds, 0, sizeof *ds);
    fm_status st = fm_text_corpus_load(text, spec, NULL);
    if (st != FM_OK)
        return st;
    if (!(ds->y = malloc(text->docs))) {
        fm_text_corpus_free(text);
        return FM_ERR_NOMEM;
    }
    memcpy(ds->y, text->lang, text->docs);
    ds->n = text->docs;
    ds->classes = text->languages;
    return FM_OK;
}

static fm_status load_any(fm_dataset_t *ds, const char *spec, bool images, uint32_t per_file[2])
{
    idx_source_t src;
    fm_status st = idx_source(&src, spec);
    if (st != FM_OK)
        return st;
    if (!src.files)
        return fm_dataset_load_csv(ds, spec + 4);
    memset(ds, 0, sizeof *ds);
    for (int i = 0; i < src.files; i++) {
        size_t before = ds->n;
        if ((st = fm_dataset_append_idx(ds, images ? src.images[i] : NULL, src.labels[i])) != FM_OK) {
            fm_dataset_free(ds);
            return st;
        }
        if (per_file)
            per_file[i] = (uint32_t)(ds->n - before);
    }
    fm_dataset_standardize(ds);
    return FM_OK;
}

/* Client `client`'s split of its examples idx[0..n) of all, as spec says
 * (train / validation / test, or the holdout re-split), its train and
 * validation splits then capped (text: in bytes, by its documents' sizes). */
static fm_status split_client(fm_split_t *s, const uint32_t *idx, size_t n, const fm_dataset_t *all,
                              const fm_text_corpus_t *text, const fm_data_spec_t *spec, int client)
{
    fm_status st = fm_split_make(s, idx, n, all->y, all->classes, spec->seed, client, spec->test_frac, spec->val_frac);
    if (st == FM_OK && spec->holdout)
        st = fm_split_holdout(s, all->y, all->classes, spec->seed, client, spec->test_frac, spec->val_frac);
    bool is_text = text && text->docs;
    uint64_t limit = fm_cap_of(is_text ? &spec->regime.bytes : &spec->regime.examples, spec->seed, client);
    if (st != FM_OK || limit == 0)
        return st;
    uint64_t *cost = NULL;
    if (is_text) {
        if (!(cost = malloc(sizeof(uint64_t) * text->docs)))
            return FM_ERR_NOMEM;
        for (size_t d = 0; d < text->docs; d++) /* a document and its separator */
            cost[d] = text->off[d + 1] - text->off[d] + 1;
    }
    fm_cap_apply(limit, spec->val_frac, spec->seed, client, cost, s->train, &s->n_train, s->val, &s->n_val);
    free(cost);
    return FM_OK;
}

/* The domain and the label map of client `client` on its three splits (lists:
 * their examples' indices in the dataset). */
static fm_status apply_regime(fm_client_data_t *cd, const fm_data_spec_t *spec, int client, const fm_split_t *split)
{
    fm_dataset_t *outs[3] = {&cd->train, &cd->val, &cd->test};
    const uint32_t *lists[3] = {split->train, split->val, split->test};
    fm_domain_kind k = fm_domain_of(&spec->regime.domains, client);
    fm_status st = FM_OK;
    for (int i = 0; i < 3 && st == FM_OK; i++) {
        st = fm_domain_apply_dataset(k, outs[i], lists[i], spec->seed);
        fm_concept_apply(outs[i], spec->seed, spec->regime.concept_groups, client);
    }
    return st;
}

/* The three splits of IDX data, read from the image files row by row: only
 * this client's rows are held (fm_dataset_idx_rows). */
static fm_status load_rows(fm_client_data_t *cd, const idx_source_t *src, const uint32_t *per_file,
                           const fm_dataset_t *labels, const fm_split_t *split)
{
    const char *paths[2] = {src->images[0], src->images[1]};
    const uint32_t *lists[3] = {split->train, split->val, split->test};
    size_t ns[3] = {split->n_train, split->n_val, split->n_test};
    fm_dataset_t out[3];
    fm_status st = fm_dataset_idx_rows(paths, per_file, src->files, labels, lists, ns, 3, out);
    if (st != FM_OK)
        return st;
    cd->train = out[0];
    cd->val = out[1];
    cd->test = out[2];
    cd->dim = out[0].dim;
    cd->img_h = out[0].img_h;
    cd->img_w = out[0].img_w;
    return FM_OK;
}

/* Client `index`'s examples of the loaded data (all of them when count is 0):
 * a view into part, or *owned (malloc'd) for all. */
static fm_status examples_of(const fm_dataset_t *all, const fm_partition_t *part, int count, int index,
                             uint32_t **mine, size_t *n, uint32_t **owned)
{
    *owned = NULL;
    if (count > 0) {
        *mine = part->index + part->offset[index];
        *n = part->offset[index + 1] - part->offset[index];
        return FM_OK;
    }
    if (!(*owned = malloc(sizeof(uint32_t) * (all->n ? all->n : 1))))
        return FM_ERR_NOMEM;
    for (size_t i = 0; i < all->n; i++)
        (*owned)[i] = (uint32_t)i;
    *mine = *owned;
    *n = all->n;
    return FM_OK;
}

/* A partition of IDX data: its labels first, then only its rows (a client holds
 * its own data, not the whole dataset). */
static fm_status load_own_rows(fm_client_data_t *cd, const fm_data_spec_t *spec, const idx_source_t *src)
{
    uint32_t per_file[2] = {0, 0};
    fm_dataset_t all;
    fm_status st = load_any(&all, spec->dataset, false, per_file);
    if (st != FM_OK)
        return st;
    fm_partition_t part = {0};
    fm_split_t split = {0};
    uint32_t *mine, *owned = NULL;
    size_t n_mine;
    if ((st = fm_partition_make(&part, all.y, all.n, all.classes, spec->count, spec->seed, &spec->part)) == FM_OK &&
        (st = examples_of(&all, &part, spec->count, spec->index, &mine, &n_mine, &owned)) == FM_OK &&
        (st = split_client(&split, mine, n_mine, &all, NULL, spec, spec->index)) == FM_OK) {
        cd->classes = all.classes;
        if ((st = load_rows(cd, src, per_file, &all, &split)) == FM_OK)
            st = apply_regime(cd, spec, spec->index, &split);
    }
    fm_split_free(&split);
    fm_partition_free(&part);
    fm_dataset_free(&all);
    return st;
}

fm_status fm_client_data_load(fm_client_data_t *cd, const fm_data_spec_t *spec)
{
    memset(cd, 0, sizeof *cd);
    idx_source_t src;
    fm_status st = idx_source(&src, spec->dataset);
    if (st == FM_OK && src.files > 0 && spec->count > 0) {
        st = load_own_rows(cd, spec, &src);
    } else if (st == FM_OK) { /* everything at once */
        fm_data_cache_t c;
        if ((st = fm_data_cache_load(&c, spec)) == FM_OK)
            st = fm_client_data_from_cache(cd, &c, spec->index);
        fm_data_cache_free(&c);
    }
    if (st != FM_OK)
        fm_client_data_free(cd);
    return st;
}

fm_status fm_data_cache_load(fm_data_cache_t *c, const fm_data_spec_t *spec)
{
    memset(c, 0, sizeof *c);
    c->spec = *spec;
    snprintf(c->dataset, sizeof c->dataset, "%s", spec->dataset);
    c->spec.dataset = c->dataset;
    fm_status st = fm_text_spec(spec->dataset) ? load_text(&c->all, &c->text, spec->dataset)
                                               : load_any(&c->all, spec->dataset, true, NULL);
    if (st == FM_OK && spec->count > 0)
        st = fm_partition_make(&c->part, c->all.y, c->all.n, c->all.classes, spec->count, spec->seed, &spec->part);
    if (st != FM_OK)
        fm_data_cache_free(c);
    return st;
}

bool fm_data_cache_serves(const fm_data_cache_t *c, const fm_data_spec_t *spec)
{
    return fm_data_spec_same(&c->spec, spec);
}

bool fm_data_spec_same(const fm_data_spec_t *a, const fm_data_spec_t *b)
{
    return !strcmp(a->dataset, b->dataset) && a->count == b->count && a->part.kind == b->part.kind &&
           a->part.alpha == b->part.alpha && a->part.classes_per_client == b->part.classes_per_client &&
           a->part.min_samples == b->part.min_samples && a->seed == b->seed && a->test_frac == b->test_frac &&
           a->val_frac == b->val_frac && a->holdout == b->holdout && a->context == b->context &&
           fm_regime_same(&a->regime, &b->regime);
}

/* cd->languages: the (up to three) languages of cd's windows, largest share first. */
static void describe_languages(fm_client_data_t *cd, const fm_text_corpus_t *text)
{
    size_t count[FM_TEXT_MAX_LANGUAGES] = {0}, total = 0;
    const fm_dataset_t *splits[3] = {&cd->train, &cd->val, &cd->test};
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < splits[k]->n; i++)
            if (splits[k]->y[i] < FM_TEXT_MAX_LANGUAGES) {
                count[splits[k]->y[i]]++;
                total++;
            }
    size_t at = 0;
    for (int shown = 0; shown < 3 && total > 0; shown++) {
        int best = 0;
        for (int l = 1; l < text->languages; l++)
            best = count[l] > count[best] ? l : best;
        if (count[best] == 0)
            break;
        int pct = (int)(100.0 * (double)count[best] / (double)total + 0.5);
        int w = count[best] == total ? snprintf(cd->languages, sizeof cd->languages, "%s", text->names[best])
                                     : snprintf(cd->languages + at, sizeof cd->languages - at, "%s%s %d%%",
                                                shown ? ", " : "", text->names[best], pct);
        if (w < 0 || (size_t)w >= sizeof cd->languages - at)
            break;
        at += (size_t)w;
        count[best] = 0;
    }
}

fm_status fm_client_data_from_cache(fm_client_data_t *cd, const fm_data_cache_t *c, int index)
{
    memset(cd, 0, sizeof *cd);
    if (c->spec.count > 0 && (index < 0 || index >= c->spec.count)) {
        fm_error_set("partition %d of %d", index, c->spec.count);
        return FM_ERR_ARG;
    }
    const fm_dataset_t *all = &c->all;
    fm_split_t split = {0};
    uint32_t *mine, *owned;
    size_t n_mine;
    fm_status st = examples_of(all, &c->part, c->spec.count, index, &mine, &n_mine, &owned);
    if (st == FM_OK)
        st = split_client(&split, mine, n_mine, all, &c->text, &c->spec, c->spec.count > 0 ? index : 0);
    const uint32_t *lists[3] = {split.train, split.val, split.test};
    size_t ns[3] = {split.n_train, split.n_val, split.n_test};
    fm_dataset_t *outs[3] = {&cd->train, &cd->val, &cd->test};
    for (int k = 0; k < 3 && st == FM_OK; k++)
        st = c->text.docs ? fm_text_windows(outs[k], &c->text, lists[k], ns[k], c->spec.context)
                          : fm_dataset_subset(outs[k], all, lists[k], ns[k]);
    cd->classes = all->classes;
    cd->dim = c->text.docs ? c->spec.context : all->dim;
    cd->img_h = all->img_h;
    cd->img_w = all->img_w;
    if (st == FM_OK && c->text.docs)
        describe_languages(cd, &c->text);
    else if (st == FM_OK)
        st = apply_regime(cd, &c->spec, c->spec.count > 0 ? index : 0, &split);
    free(owned);
    fm_split_free(&split);
    if (st != FM_OK)
        fm_client_data_free(cd);
    return st;
}

void fm_data_cache_free(fm_data_cache_t *c)
{
    fm_partition_free(&c->part);
    fm_dataset_free(&c->all);
    fm_text_corpus_free(&c->text);
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
    fm_text_corpus_t text = {0};
    fm_status st = fm_text_spec(spec->dataset) ? load_text(&all, &text, spec->dataset)
                                               : load_any(&all, spec->dataset, false, NULL);
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
        st = split_client(&split, part.index + part.offset[c], part.offset[c + 1] - part.offset[c], &all, &text, spec, c);
        sizes[c] = (fm_split_sizes_t){split.n_train, split.n_val, split.n_test};
        if (text.docs) /* (in windows) */
            sizes[c] = (fm_split_sizes_t){fm_text_window_count(&text, split.train, split.n_train, spec->context),
                                          fm_text_window_count(&text, split.val, split.n_val, spec->context),
                                          fm_text_window_count(&text, split.test, split.n_test, spec->context)};
        fm_split_free(&split);
    }
    fm_partition_free(&part);
    fm_dataset_free(&all);
    fm_text_corpus_free(&text);
    return st;
}
