#include "fedmoe/partition.h"

#include <math.h>
#include <stdbool.h>
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

FM_ARG_ENUM_NAMES(fm_partition_kind, fm_partition_kind_name, fm_partition_kind_parse, "dirichlet", "pathological",
                  "iid", "client-dirichlet")

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

/* What a split works on: the examples grouped by class, scratch, and the lists
 * it fills, one per client. */
typedef struct {
    size_t n;
    int classes, clients;
    uint32_t *by;             /* indices grouped by class: class c at by + start[c], count[c] of them */
    size_t *start, *count;
    uint32_t *tmp;            /* (n) scratch */
    double *prop;             /* (clients) Dirichlet proportions */
    uint32_t *holders;        /* (clients) pathological: the clients holding a class */
    ulist_t *lists;           /* (clients) */
    fm_rng_t r;
} split_t;

/* tmp = the examples of class c, shuffled; returns their count. */
static size_t shuffled_class(split_t *w, int c)
{
    size_t nc = w->count[c];
    memcpy(w->tmp, w->by + w->start[c], sizeof(uint32_t) * nc);
    fm_rng_shuffle(&w->r, w->tmp, nc);
    return nc;
}

/* One Dirichlet draw: each class spread over the clients by Gamma(alpha)
 * proportions, masked for clients that already hold their fair share (PFLlib). */
static fm_status dirichlet_draw(split_t *w, double alpha)
{
    int clients = w->clients;
    for (int j = 0; j < clients; j++)
        w->lists[j].n = 0;
    for (int c = 0; c < w->classes; c++) {
        size_t nc = shuffled_class(w, c);
        double masked = 0.0;
        for (int j = 0; j < clients; j++)
            w->prop[j] = fm_rng_gamma(&w->r, alpha);
        for (int j = 0; j < clients; j++) {
            if ((double)w->lists[j].n >= (double)w->n / clients)
                w->prop[j] = 0.0;
            masked += w->prop[j];
        }
        if (!(masked > 0.0)) {
            masked = 0.0;
            for (int j = 0; j < clients; j++)
                masked += (w->prop[j] = 1.0);
        }
        double cum = 0.0;
        size_t from = 0;
        for (int j = 0; j < clients; j++) {
            cum += w->prop[j] / masked;
            size_t to = j == clients - 1 ? nc : (size_t)(cum * (double)nc);
            if (to > nc)
                to = nc;
            if (to < from)
                to = from;
            if (push(&w->lists[j], w->tmp + from, to - from))
                return FM_ERR_NOMEM;
            from = to;
        }
    }
    return FM_OK;
}

/* Dirichlet draws until every client has min_samples (bounded tries). */
static fm_status split_dirichlet(split_t *w, const fm_partition_config_t *cfg)
{
    if ((double)w->clients * (double)cfg->min_samples > (double)w->n) {
        fm_error_set("partition: %d clients of %zu examples (--min-examples) need %.0f, the dataset has %zu; lower "
                     "the minimum, use fewer clients, or --client-dirichlet (any number of clients)",
                     w->clients, cfg->min_samples, (double)w->clients * (double)cfg->min_samples, w->n);
        return FM_ERR_ARG;
    }
    for (int tries = 1;; tries++) {
        fm_status st = dirichlet_draw(w, cfg->alpha);
        if (st != FM_OK)
            return st;
        size_t least = w->n;
        for (int j = 0; j < w->clients; j++)
            least = w->lists[j].n < least ? w->lists[j].n : least;
        if (least >= cfg->min_samples)
            return FM_OK;
        if (tries >= DIRICHLET_MAX_TRIES) {
            fm_error_set("partition: no Dirichlet(%g) draw in %d tries gives every one of %d clients "
                         "%zu examples (--min-examples); lower the minimum, use fewer clients, or "
                         "--client-dirichlet (any number of clients)",
                         cfg->alpha, tries, w->clients, cfg->min_samples);
            return FM_ERR_ARG;
        }
    }
}

/* Client-wise Dirichlet (Hsu et al. 2019): every client the same number of
 * examples (n/clients, one more for the first n mod clients), its class mix q_j
 * drawn from Dirichlet(alpha). Examples are dealt one at a time to the clients in
 * a random order, each from its q_j restricted to the classes not yet used up (by
 * what is left of each class when its q_j there is all used up or underflowed).
 * Any number of clients up to n gets a share: for thousands of clients, where the
 * class-wise draw cannot give every client a minimum. */
static fm_status split_client_dirichlet(split_t *w, double alpha)
{
    int classes = w->classes, clients = w->clients;
    double *q = malloc(sizeof(double) * (size_t)clients * (size_t)classes);
    size_t *left = malloc(sizeof(size_t) * (size_t)classes);
    if (!q || !left) {
        free(q);
        free(left);
        return FM_ERR_NOMEM;
    }
    for (int c = 0; c < classes; c++) {
        fm_rng_shuffle(&w->r, w->by + w->start[c], w->count[c]);
        left[c] = w->count[c];
    }
    size_t total = 0;
    for (int c = 0; c < classes; c++)
        total += w->count[c];
    for (int j = 0; j < clients; j++) {
        double *qj = q + (size_t)j * classes;
        for (int c = 0; c < classes; c++)
            qj[c] = fm_rng_gamma(&w->r, alpha);
        for (size_t t = total * j / clients; t < total * (j + 1) / clients; t++)
            w->tmp[t] = (uint32_t)j;
    }
    fm_rng_shuffle(&w->r, w->tmp, total);
    fm_status st = FM_OK;
    for (size_t t = 0; t < total && st == FM_OK; t++) {
        const double *qj = q + (size_t)w->tmp[t] * classes;
        double mass = 0.0;
        for (int c = 0; c < classes; c++)
            mass += left[c] ? qj[c] : 0.0;
        bool by_left = !(mass > 0.0);
        double u = fm_rng_uniform_double(&w->r) * (by_left ? (double)(total - t) : mass);
        int c = 0, last = 0;
        for (; c < classes; c++) {
            if (!left[c])
                continue;
            last = c;
            u -= by_left ? (double)left[c] : qj[c];
            if (u < 0.0)
                break;
        }
        c = c < classes ? c : last; /* (rounding at the end of the sum) */
        uint32_t example = w->by[w->start[c] + --left[c]];
        if (push(&w->lists[w->tmp[t]], &example, 1))
            st = FM_ERR_NOMEM;
    }
    free(q);
    free(left);
    return st;
}

/* Client j holds classes (j*s + t) mod C for t < s; each class is split evenly
 * among its holders. */
static fm_status split_pathological(split_t *w, int s)
{
    for (int c = 0; c < w->classes; c++) {
        int nh = 0;
        for (int j = 0; j < w->clients; j++)
            for (int t = 0; t < s; t++)
                if ((j * s + t) % w->classes == c) {
                    w->holders[nh++] = (uint32_t)j;
                    break;
                }
        if (nh == 0)
            continue;
        size_t nc = shuffled_class(w, c);
        for (int h = 0; h < nh; h++) {
            size_t from = nc * h / nh, to = nc * (h + 1) / nh;
            if (push(&w->lists[w->holders[h]], w->tmp + from, to - from))
                return FM_ERR_NOMEM;
        }
    }
    return FM_OK;
}

static fm_status split_iid(split_t *w)
{
    for (size_t i = 0; i < w->n; i++)
        w->tmp[i] = (uint32_t)i;
    fm_rng_shuffle(&w->r, w->tmp, w->n);
    for (int j = 0; j < w->clients; j++) {
        size_t from = w->n * j / w->clients, to = w->n * (j + 1) / w->clients;
        if (push(&w->lists[j], w->tmp + from, to - from))
            return FM_ERR_NOMEM;
    }
    return FM_OK;
}

/* p = the lists, each sorted, one after another. */
static fm_status flatten(fm_partition_t *p, split_t *w)
{
    p->clients = w->clients;
    p->offset = malloc(sizeof(size_t) * (w->clients + 1));
    size_t total = 0;
    for (int j = 0; j < w->clients; j++)
        total += w->lists[j].n;
    p->index = malloc(sizeof(uint32_t) * (total ? total : 1));
    if (!p->offset || !p->index)
        return FM_ERR_NOMEM;
    p->offset[0] = 0;
    for (int j = 0; j < w->clients; j++) {
        qsort(w->lists[j].v, w->lists[j].n, sizeof(uint32_t), cmp_u32);
        if (w->lists[j].n)
            memcpy(p->index + p->offset[j], w->lists[j].v, sizeof(uint32_t) * w->lists[j].n);
        p->offset[j + 1] = p->offset[j] + w->lists[j].n;
    }
    return FM_OK;
}

static fm_status check_args(size_t n, int classes, int clients, const fm_partition_config_t *cfg)
{
    if (clients < 1 || (size_t)clients > n)
        fm_error_set("partition: %d clients for %zu examples", clients, n);
    else if (classes < 1 || classes > 256)
        fm_error_set("partition: %d classes", classes);
    else if ((cfg->kind == FM_PARTITION_DIRICHLET || cfg->kind == FM_PARTITION_CLIENT_DIRICHLET) &&
             !(cfg->alpha > 0.0 && cfg->alpha < 1e6))
        fm_error_set("partition: Dirichlet alpha must be positive, got %g", cfg->alpha);
    else if (cfg->kind == FM_PARTITION_PATHOLOGICAL &&
             (cfg->classes_per_client < 1 || cfg->classes_per_client > classes))
        fm_error_set("partition: %d classes per client, the data has %d", cfg->classes_per_client, classes);
    else
        return FM_OK;
    return FM_ERR_ARG;
}

fm_status fm_partition_make(fm_partition_t *p, const uint8_t *labels, size_t n, int classes, int clients,
                            uint64_t seed, const fm_partition_config_t *cfg)
{
    memset(p, 0, sizeof *p);
    fm_status st = check_args(n, classes, clients, cfg);
    if (st != FM_OK)
        return st;
    split_t w = {.n = n, .classes = classes, .clients = clients};
    st = FM_ERR_NOMEM;
    w.tmp = malloc(sizeof(uint32_t) * (n ? n : 1));
    w.start = calloc(classes, sizeof(size_t));
    w.count = calloc(classes, sizeof(size_t));
    w.lists = calloc(clients, sizeof(ulist_t));
    w.prop = calloc(clients, sizeof(double));
    w.holders = calloc(clients, sizeof(uint32_t));
    if (w.tmp && w.start && w.count && w.lists && w.prop && w.holders &&
        (st = group_by_class(labels, n, classes, &w.by, w.start, w.count)) == FM_OK) {
        fm_rng_init(&w.r, seed, fm_rng_stream(FM_STREAM_PARTITION, 0));
        st = cfg->kind == FM_PARTITION_DIRICHLET      ? split_dirichlet(&w, cfg)
             : cfg->kind == FM_PARTITION_PATHOLOGICAL ? split_pathological(&w, cfg->classes_per_client)
             : cfg->kind == FM_PARTITION_CLIENT_DIRICHLET ? split_client_dirichlet(&w, cfg->alpha)
                                                           : split_iid(&w);
        if (st == FM_OK)
            st = flatten(p, &w);
    }
    if (st == FM_ERR_NOMEM)
        fm_error_set("partition: out of memory");
    if (st != FM_OK)
        fm_partition_free(p);
    if (w.lists)
        for (int j = 0; j < clients; j++)
            free(w.lists[j].v);
    free(w.lists);
    free(w.prop);
    free(w.holders);
    free(w.tmp);
    free(w.by);
    free(w.start);
    free(w.count);
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
