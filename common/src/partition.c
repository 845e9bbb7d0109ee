#include "fedmoe/partition.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/args.h"
#include "fedmoe/log.h"
#include "fedmoe/rng.h"

#define DIRICHLET_MAX_TRIES 1000

void fm_partition_config_default(fm_partition_config_t *c)
{
    c->kind = FM_PARTITION_DIRICHLET;
    c->alpha = 0.3;
    c->classes_per_client = 2;
    c->min_samples = 40;
}

static const char *kind_names[] = {"dirichlet", "pathological", "iid"};

const char *fm_partition_kind_name(fm_partition_kind k)
{
    return (unsigned)k < 3 ? kind_names[k] : "dirichlet";
}

fm_status fm_partition_kind_parse(const char *flag, const char *name, fm_partition_kind *out)
{
    int i;
    fm_status st = fm_arg_choice(flag, name, kind_names, 3, &i);
    if (st == FM_OK)
        *out = (fm_partition_kind)i;
    return st;
}

/* A growable list of indices per client. */
typedef struct {
    uint32_t *v;
    size_t n, cap;
} ulist_t;

static int push(ulist_t *l, const uint32_t *src, size_t n)
{
    if (n == 0)
        return 0;
    if (l->n + n > l->cap) {
        size_t cap = l->cap ? l->cap : 256;
        while (cap < l->n + n)
            cap *= 2;
        uint32_t *v = realloc(l->v, sizeof(uint32_t) * cap);
        if (!v)
            return -1;
        l->v = v;
        l->cap = cap;
    }
    memcpy(l->v + l->n, src, sizeof(uint32_t) * n);
    l->n += n;
    return 0;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* by_class[c] = the indices with label c, ascending; returns counts. */
static fm_status group_by_class(const uint8_t *labels, size_t n, int classes, uint32_t **store, size_t *start,
                                size_t *count)
{
    memset(count, 0, sizeof(size_t) * classes);
    for (size_t i = 0; i < n; i++)
        if (labels[i] < classes)
            count[labels[i]]++;
    *store = malloc(sizeof(uint32_t) * (n ? n : 1));
    if (!*store)
        return FM_ERR_NOMEM;
    size_t s = 0;
    for (int c = 0; c < classes; c++) {
        start[c] = s;
        s += count[c];
    }
    size_t *fill = calloc(classes, sizeof(size_t));
    if (!fill)
        return FM_ERR_NOMEM;
    for (size_t i = 0; i < n; i++)
        if (labels[i] < classes)
            (*store)[start[labels[i]] + fill[labels[i]]++] = (uint32_t)i;
    free(fill);
    return FM_OK;
}

fm_status fm_partition_make(fm_partition_t *p, const uint8_t *labels, size_t n, int classes, int clients,
                            uint64_t seed, const fm_partition_config_t *cfg)
{
    memset(p, 0, sizeof *p);
    if (clients < 1 || (size_t)clients > n) {
        fm_error_set("partition: %d clients for %zu examples", clients, n);
        return FM_ERR_ARG;
    }
    if (classes < 1 || classes > 256) {
        fm_error_set("partition: %d classes", classes);
        return FM_ERR_ARG;
    }
    if (cfg->kind == FM_PARTITION_DIRICHLET && !(cfg->alpha > 0.0 && cfg->alpha < 1e6)) {
        fm_error_set("partition: Dirichlet alpha must be positive, got %g", cfg->alpha);
        return FM_ERR_ARG;
    }
    if (cfg->kind == FM_PARTITION_PATHOLOGICAL && (cfg->classes_per_client < 1 || cfg->classes_per_client > classes)) {
        fm_error_set("partition: %d classes per client, the data has %d", cfg->classes_per_client, classes);
        return FM_ERR_ARG;
    }
    fm_status st = FM_ERR_NOMEM;
    uint32_t *by = NULL, *tmp = malloc(sizeof(uint32_t) * (n ? n : 1));
    size_t *start = calloc(classes, sizeof(size_t)), *count = calloc(classes, sizeof(size_t));
    ulist_t *lists = calloc(clients, sizeof(ulist_t));
    double *prop = calloc(clients, sizeof(double));
    uint32_t *holders = calloc(clients, sizeof(uint32_t)); /* pathological: the clients holding a class */
    if (!tmp || !start || !count || !lists || !prop || !holders)
        goto out;
    if ((st = group_by_class(labels, n, classes, &by, start, count)) != FM_OK)
        goto out;
    st = FM_ERR_NOMEM;
    fm_rng_t r;
    fm_rng_init(&r, seed, fm_rng_stream(FM_STREAM_PARTITION, 0));
    if (cfg->kind == FM_PARTITION_DIRICHLET) {
        int tries = 0;
        for (;;) {
            for (int j = 0; j < clients; j++)
                lists[j].n = 0;
            for (int c = 0; c < classes; c++) {
                size_t nc = count[c];
                memcpy(tmp, by + start[c], sizeof(uint32_t) * nc);
                fm_rng_shuffle(&r, tmp, nc);
                double sum = 0.0, masked = 0.0;
                for (int j = 0; j < clients; j++) {
                    prop[j] = fm_rng_gamma(&r, cfg->alpha);
                    sum += prop[j];
                }
                /* PFLlib: no more for clients that already hold their fair share */
                for (int j = 0; j < clients; j++) {
                    if ((double)lists[j].n >= (double)n / clients)
                        prop[j] = 0.0;
                    masked += prop[j];
                }
                if (!(masked > 0.0)) {
                    masked = 0.0;
                    for (int j = 0; j < clients; j++)
                        masked += (prop[j] = 1.0);
                }
                (void)sum;
                double cum = 0.0;
                size_t from = 0;
                for (int j = 0; j < clients; j++) {
                    cum += prop[j] / masked;
                    size_t to = j == clients - 1 ? nc : (size_t)(cum * (double)nc);
                    if (to > nc)
                        to = nc;
                    if (to < from)
                        to = from;
                    if (push(&lists[j], tmp + from, to - from))
                        goto out;
                    from = to;
                }
            }
            size_t least = n;
            for (int j = 0; j < clients; j++)
                least = lists[j].n < least ? lists[j].n : least;
            if (least >= cfg->min_samples)
                break;
            if (++tries >= DIRICHLET_MAX_TRIES) {
                fm_error_set("partition: no Dirichlet(%g) draw in %d tries gives every one of %d clients "
                             "%zu examples; lower the minimum or use fewer clients",
                             cfg->alpha, tries, clients, cfg->min_samples);
                st = FM_ERR_ARG;
                goto out;
            }
        }
    } else if (cfg->kind == FM_PARTITION_PATHOLOGICAL) {
        int s = cfg->classes_per_client;
        for (int c = 0; c < classes; c++) {
            /* the clients holding class c: those j with c in {(j*s + t) mod C} */
            int nh = 0;
            for (int j = 0; j < clients; j++)
                for (int t = 0; t < s; t++)
                    if ((j * s + t) % classes == c) {
                        holders[nh++] = (uint32_t)j;
                        break;
                    }
            if (nh == 0)
                continue;
            size_t nc = count[c];
            memcpy(tmp, by + start[c], sizeof(uint32_t) * nc);
            fm_rng_shuffle(&r, tmp, nc);
            for (int h = 0; h < nh; h++) {
                size_t from = nc * h / nh, to = nc * (h + 1) / nh;
                if (push(&lists[holders[h]], tmp + from, to - from))
                    goto out;
            }
        }
    } else {
        for (size_t i = 0; i < n; i++)
            tmp[i] = (uint32_t)i;
        fm_rng_shuffle(&r, tmp, n);
        for (int j = 0; j < clients; j++) {
            size_t from = n * j / clients, to = n * (j + 1) / clients;
            if (push(&lists[j], tmp + from, to - from))
                goto out;
        }
    }
    p->clients = clients;
    p->offset = malloc(sizeof(size_t) * (clients + 1));
    size_t total = 0;
    for (int j = 0; j < clients; j++)
        total += lists[j].n;
    p->index = malloc(sizeof(uint32_t) * (total ? total : 1));
    if (!p->offset || !p->index)
        goto out;
    p->offset[0] = 0;
    for (int j = 0; j < clients; j++) {
        qsort(lists[j].v, lists[j].n, sizeof(uint32_t), cmp_u32);
        if (lists[j].n)
            memcpy(p->index + p->offset[j], lists[j].v, sizeof(uint32_t) * lists[j].n);
        p->offset[j + 1] = p->offset[j] + lists[j].n;
    }
    st = FM_OK;
out:
    if (st == FM_ERR_NOMEM)
        fm_error_set("partition: out of memory");
    if (st != FM_OK)
        fm_partition_free(p);
    if (lists)
        for (int j = 0; j < clients; j++)
            free(lists[j].v);
    free(lists);
    free(prop);
    free(holders);
    free(tmp);
    free(by);
    free(start);
    free(count);
    return st;
}

void fm_partition_free(fm_partition_t *p)
{
    free(p->offset);
    free(p->index);
    memset(p, 0, sizeof *p);
}

static fm_status split_stream(fm_split_t *s, const uint32_t *idx, size_t n, const uint8_t *labels, int classes,
                              uint64_t seed, uint64_t stream, double test_frac, double val_frac)
{
    memset(s, 0, sizeof *s);
    if (!(test_frac >= 0.0 && test_frac < 1.0 && val_frac >= 0.0 && val_frac < 1.0)) {
        fm_error_set("split: fractions must be in [0, 1)");
        return FM_ERR_ARG;
    }
    fm_status st = FM_ERR_NOMEM;
    uint32_t *cls = malloc(sizeof(uint32_t) * (n ? n : 1));
    s->train = malloc(sizeof(uint32_t) * (n ? n : 1));
    s->val = malloc(sizeof(uint32_t) * (n ? n : 1));
    s->test = malloc(sizeof(uint32_t) * (n ? n : 1));
    if (!cls || !s->train || !s->val || !s->test)
        goto out;
    fm_rng_t r;
    fm_rng_init(&r, seed, stream);
    for (int c = 0; c < classes; c++) {
        size_t nc = 0;
        for (size_t i = 0; i < n; i++)
            if (labels[idx[i]] == c)
                cls[nc++] = idx[i];
        if (nc == 0)
            continue;
        fm_rng_shuffle(&r, cls, nc);
        size_t nt = (size_t)llround((double)nc * test_frac);
        size_t nv = (size_t)llround((double)(nc - nt) * val_frac);
        memcpy(s->test + s->n_test, cls, sizeof(uint32_t) * nt);
        memcpy(s->val + s->n_val, cls + nt, sizeof(uint32_t) * nv);
        memcpy(s->train + s->n_train, cls + nt + nv, sizeof(uint32_t) * (nc - nt - nv));
        s->n_test += nt;
        s->n_val += nv;
        s->n_train += nc - nt - nv;
    }
    st = FM_OK;
out:
    free(cls);
    if (st != FM_OK) {
        fm_error_set("split: out of memory");
        fm_split_free(s);
    }
    return st;
}

fm_status fm_split_make(fm_split_t *s, const uint32_t *idx, size_t n, const uint8_t *labels, int classes,
                        uint64_t seed, int client, double test_frac, double val_frac)
{
    return split_stream(s, idx, n, labels, classes, seed, fm_rng_stream(FM_STREAM_SPLIT, (uint32_t)client),
                        test_frac, val_frac);
}

fm_status fm_split_holdout(fm_split_t *s, const uint8_t *labels, int classes, uint64_t seed, int client,
                           double test_frac, double val_frac)
{
    size_t n = s->n_train + s->n_val;
    uint32_t *rest = malloc(sizeof(uint32_t) * (n ? n : 1));
    if (!rest) {
        fm_error_set("split: out of memory");
        return FM_ERR_NOMEM;
    }
    memcpy(rest, s->train, sizeof(uint32_t) * s->n_train);
    memcpy(rest + s->n_train, s->val, sizeof(uint32_t) * s->n_val);
    fm_split_t again;
    fm_status st = split_stream(&again, rest, n, labels, classes, seed,
                                fm_rng_stream(FM_STREAM_HOLDOUT, (uint32_t)client), test_frac, val_frac);
    free(rest);
    if (st != FM_OK)
        return st;
    fm_split_free(s);
    *s = again;
    return FM_OK;
}

void fm_split_free(fm_split_t *s)
{
    free(s->train);
    free(s->val);
    free(s->test);
    memset(s, 0, sizeof *s);
}
