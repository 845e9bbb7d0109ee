/* regime.c - caps, domains and concept groups (fedmoe/regime.h). */
#include "fedmoe/regime.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/args.h"
#include "fedmoe/log.h"
#include "fedmoe/rng.h"

/* ---- caps ---- */

static fm_status cap_value(const char *flag, const char *s, size_t len, uint64_t *out)
{
    char buf[32];
    if (len == 0 || len >= sizeof buf) {
        fm_error_set("%s: '%.*s' is not a count", flag, (int)(len < 64 ? len : 64), s);
        return FM_ERR_ARG;
    }
    memcpy(buf, s, len);
    buf[len] = '\0';
    char *end;
    errno = 0;
    unsigned long long v = buf[0] >= '0' && buf[0] <= '9' ? strtoull(buf, &end, 10) : 0;
    if (buf[0] < '0' || buf[0] > '9' || *end || errno || v < 1 || v > FM_CAP_MAX) {
        fm_error_set("%s: '%s' is not a count from 1 to %llu", flag, buf, (unsigned long long)FM_CAP_MAX);
        return FM_ERR_ARG;
    }
    *out = v;
    return FM_OK;
}

fm_status fm_cap_parse(const char *flag, const char *text, fm_cap_t *out)
{
    fm_cap_t c = {0};
    if (!text || !*text || !strcmp(text, "off")) {
        *out = c;
        return FM_OK;
    }
    const char *dots = strstr(text, "..");
    fm_status st;
    if (dots) {
        c.kind = FM_CAP_RANGE;
        c.n = 2;
        if ((st = cap_value(flag, text, (size_t)(dots - text), &c.v[0])) != FM_OK ||
            (st = cap_value(flag, dots + 2, strlen(dots + 2), &c.v[1])) != FM_OK)
            return st;
        if (c.v[0] > c.v[1]) {
            fm_error_set("%s: the range '%s' runs backwards", flag, text);
            return FM_ERR_ARG;
        }
    } else {
        for (const char *p = text;; c.n++) {
            if (c.n == FM_CAP_MAX_VALUES) {
                fm_error_set("%s: more than %d caps in '%s'", flag, FM_CAP_MAX_VALUES, text);
                return FM_ERR_ARG;
            }
            const char *comma = strchr(p, ',');
            size_t len = comma ? (size_t)(comma - p) : strlen(p);
            if ((st = cap_value(flag, p, len, &c.v[c.n])) != FM_OK)
                return st;
            if (!comma) {
                c.n++;
                break;
            }
            p = comma + 1;
        }
        c.kind = c.n == 1 ? FM_CAP_FIXED : FM_CAP_LIST;
    }
    *out = c;
    return FM_OK;
}

void fm_cap_name(const fm_cap_t *c, char *buf, size_t cap)
{
    if (cap == 0)
        return;
    buf[0] = '\0';
    if (c->kind == FM_CAP_NONE) {
        snprintf(buf, cap, "off");
        return;
    }
    size_t at = 0;
    for (int i = 0; i < c->n && at < cap; i++) {
        const char *sep = i == 0 ? "" : c->kind == FM_CAP_RANGE ? ".." : ",";
        int w = snprintf(buf + at, cap - at, "%s%llu", sep, (unsigned long long)c->v[i]);
        if (w < 0)
            break;
        at += (size_t)w;
    }
}

bool fm_cap_same(const fm_cap_t *a, const fm_cap_t *b)
{
    if (a->kind != b->kind || a->n != b->n)
        return false;
    for (int i = 0; i < a->n; i++)
        if (a->v[i] != b->v[i])
            return false;
    return true;
}

uint64_t fm_cap_of(const fm_cap_t *c, uint64_t seed, int client)
{
    switch (c->kind) {
    case FM_CAP_NONE: return 0;
    case FM_CAP_FIXED: return c->v[0];
    case FM_CAP_LIST: return c->v[(unsigned)client % (unsigned)c->n];
    case FM_CAP_RANGE: {
        fm_rng_t r;
        fm_rng_init(&r, seed, fm_rng_stream(FM_STREAM_CAP_SIZE, (uint64_t)client));
        double lo = log((double)c->v[0]), hi = log((double)c->v[1]);
        double v = floor(exp(lo + fm_rng_uniform_double(&r) * (hi - lo)) + 0.5);
        return v < (double)c->v[0] ? c->v[0] : v > (double)c->v[1] ? c->v[1] : (uint64_t)v;
    }
    }
    return 0;
}

/* Keeps of idx[0..*n) the longest prefix, in r's shuffled order, whose costs
 * fit budget (at least one example), in idx's own order. */
static void keep_within(fm_rng_t *r, uint64_t budget, const uint64_t *cost, uint32_t *idx, size_t *n)
{
    if (*n == 0)
        return;
    uint32_t *order = malloc(sizeof(uint32_t) * *n);
    uint8_t *kept = calloc(*n, 1);
    if (!order || !kept) { /* (small: a client's splits) */
        free(order);
        free(kept);
        return;
    }
    for (size_t i = 0; i < *n; i++)
        order[i] = (uint32_t)i;
    fm_rng_shuffle(r, order, *n);
    uint64_t used = 0;
    for (size_t k = 0; k < *n; k++) {
        uint64_t c = cost ? cost[idx[order[k]]] : 1;
        if (k > 0 && (used + c > budget || used + c < used))
            break;
        used += c;
        kept[order[k]] = 1;
    }
    size_t m = 0;
    for (size_t i = 0; i < *n; i++)
        if (kept[i])
            idx[m++] = idx[i];
    *n = m;
    free(order);
    free(kept);
}

void fm_cap_apply(uint64_t limit, double val_frac, uint64_t seed, int client, const uint64_t *cost, uint32_t *train,
                  size_t *n_train, uint32_t *val, size_t *n_val)
{
    if (limit == 0)
        return;
    uint64_t v = (uint64_t)floor((double)limit * val_frac + 0.5);
    if (v == 0 && val_frac > 0.0)
        v = 1;
    if (v >= limit)
        v = limit > 1 ? limit - 1 : 0;
    fm_rng_t r;
    fm_rng_init(&r, seed, fm_rng_stream(FM_STREAM_CAP, (uint64_t)client));
    keep_within(&r, limit - v, cost, train, n_train);
    keep_within(&r, v, cost, val, n_val);
}

/* ---- domains ---- */

static const char *const domain_names[FM_DOMAIN_KINDS] = {"identity", "rotate90", "rotate180", "rotate270",
                                                          "invert",   "blur",     "noise",     "patches"};

const char *fm_domain_name(fm_domain_kind k) { return (unsigned)k < FM_DOMAIN_KINDS ? domain_names[k] : "?"; }

static fm_status domains_add(const char *flag, fm_domains_t *d, fm_domain_kind k)
{
    if (d->n == FM_DOMAINS_MAX) {
        fm_error_set("%s: more than %d domains", flag, FM_DOMAINS_MAX);
        return FM_ERR_ARG;
    }
    d->kind[d->n++] = k;
    return FM_OK;
}

fm_status fm_domains_parse(const char *flag, const char *text, fm_domains_t *out)
{
    fm_domains_t d = {0};
    if (!text || !*text || !strcmp(text, "off")) {
        *out = d;
        return FM_OK;
    }
    for (const char *p = text;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        fm_status st = FM_ERR_ARG;
        if (len == 6 && !strncmp(p, "rotate", 6)) {
            for (int k = FM_DOMAIN_IDENTITY; k <= FM_DOMAIN_ROTATE270 && (st = domains_add(flag, &d, k)) == FM_OK; k++)
                ;
        } else if (len == 3 && !strncmp(p, "all", 3)) {
            for (int k = 0; k < FM_DOMAIN_KINDS && (st = domains_add(flag, &d, k)) == FM_OK; k++)
                ;
        } else {
            int k = 0;
            while (k < FM_DOMAIN_KINDS && !(strlen(domain_names[k]) == len && !strncmp(p, domain_names[k], len)))
                k++;
            if (k == FM_DOMAIN_KINDS) {
                fm_error_set("%s: '%.*s' is not a domain: identity, rotate90, rotate180, rotate270, invert, blur, "
                             "noise, patches, or the presets rotate (the four turns) and all",
                             flag, (int)(len < 64 ? len : 64), p);
                return FM_ERR_ARG;
            }
            st = domains_add(flag, &d, (fm_domain_kind)k);
        }
        if (st != FM_OK)
            return st;
        if (!comma)
            break;
        p = comma + 1;
    }
    *out = d;
    return FM_OK;
}

void fm_domains_name(const fm_domains_t *d, char *buf, size_t cap)
{
    if (cap == 0)
        return;
    snprintf(buf, cap, "%s", d->n ? "" : "off");
    size_t at = 0;
    for (int i = 0; i < d->n && at < cap; i++) {
        int w = snprintf(buf + at, cap - at, "%s%s", i ? "," : "", fm_domain_name(d->kind[i]));
        if (w < 0)
            break;
        at += (size_t)w;
    }
}

bool fm_domains_same(const fm_domains_t *a, const fm_domains_t *b)
{
    return a->n == b->n && !memcmp(a->kind, b->kind, sizeof a->kind[0] * (size_t)a->n);
}

fm_domain_kind fm_domain_of(const fm_domains_t *d, int client)
{
    return d->n ? d->kind[(unsigned)client % (unsigned)d->n] : FM_DOMAIN_IDENTITY;
}

/* One pass of the binomial (1 4 6 4 1)/16 along rows (dx 1) or columns, edges repeated. */
static void blur_pass(const float *in, float *out, int h, int w, bool along_rows)
{
    static const float k[5] = {1.0f / 16, 4.0f / 16, 6.0f / 16, 4.0f / 16, 1.0f / 16};
    for (int r = 0; r < h; r++)
        for (int c = 0; c < w; c++) {
            float s = 0.0f;
            for (int t = -2; t <= 2; t++) {
                int rr = along_rows ? r : r + t, cc = along_rows ? c + t : c;
                rr = rr < 0 ? 0 : rr >= h ? h - 1 : rr;
                cc = cc < 0 ? 0 : cc >= w ? w - 1 : cc;
                s += k[t + 2] * in[(size_t)rr * w + cc];
            }
            out[(size_t)r * w + c] = s;
        }
}

void fm_domain_apply(fm_domain_kind k, float *img, int h, int w, uint64_t seed, uint64_t noise_key, float *scratch)
{
    size_t n = (size_t)h * (size_t)w;
    switch (k) {
    case FM_DOMAIN_IDENTITY:
    case FM_DOMAIN_KINDS: return;
    case FM_DOMAIN_ROTATE90:
    case FM_DOMAIN_ROTATE180:
    case FM_DOMAIN_ROTATE270:
        memcpy(scratch, img, sizeof(float) * n);
        for (int r = 0; r < h; r++)
            for (int c = 0; c < w; c++) {
                /* out[r][c] = in[...]: a clockwise quarter turn takes in[h-1-c][r] */
                int sr = k == FM_DOMAIN_ROTATE90 ? h - 1 - c : k == FM_DOMAIN_ROTATE180 ? h - 1 - r : c;
                int sc = k == FM_DOMAIN_ROTATE90 ? r : k == FM_DOMAIN_ROTATE180 ? w - 1 - c : w - 1 - r;
                img[(size_t)r * w + c] = scratch[(size_t)sr * w + sc];
            }
        return;
    case FM_DOMAIN_INVERT:
        for (size_t i = 0; i < n; i++)
            img[i] = 1.0f - img[i];
        return;
    case FM_DOMAIN_BLUR:
        blur_pass(img, scratch, h, w, true);
        blur_pass(scratch, img, h, w, false);
        return;
    case FM_DOMAIN_NOISE: {
        fm_rng_t r;
        fm_rng_init(&r, seed, fm_rng_stream(FM_STREAM_NOISE, noise_key & FM_STREAM_INDEX_MAX));
        for (size_t i = 0; i < n; i++)
            img[i] += FM_DOMAIN_NOISE_SD * (float)fm_rng_normal(&r);
        return;
    }
    case FM_DOMAIN_PATCHES: {
        enum { T = FM_DOMAIN_GRID * FM_DOMAIN_GRID };
        uint32_t perm[T];
        for (uint32_t t = 0; t < T; t++)
            perm[t] = t;
        fm_rng_t r;
        fm_rng_init(&r, seed, fm_rng_stream(FM_STREAM_TILES, 0));
        fm_rng_shuffle(&r, perm, T);
        int th = h / FM_DOMAIN_GRID, tw = w / FM_DOMAIN_GRID;
        memcpy(scratch, img, sizeof(float) * n);
        for (int t = 0; t < T; t++) { /* tile t of the output is tile perm[t] of the input */
            int r0 = t / FM_DOMAIN_GRID * th, c0 = t % FM_DOMAIN_GRID * tw;
            int s0 = (int)perm[t] / FM_DOMAIN_GRID * th, q0 = (int)perm[t] % FM_DOMAIN_GRID * tw;
            for (int y = 0; y < th; y++)
                memcpy(img + (size_t)(r0 + y) * w + c0, scratch + (size_t)(s0 + y) * w + q0, sizeof(float) * tw);
        }
        return;
    }
    }
}

fm_status fm_domains_check(const fm_domains_t *d, int h, int w)
{
    for (int i = 0; i < d->n; i++) {
        fm_domain_kind k = d->kind[i];
        if (k == FM_DOMAIN_IDENTITY)
            continue;
        if (h <= 0 || w <= 0) {
            fm_error_set("--domains transform images; this dataset's examples are not images (CSV rows)");
            return FM_ERR_ARG;
        }
        if ((k == FM_DOMAIN_ROTATE90 || k == FM_DOMAIN_ROTATE270) && h != w) {
            fm_error_set("--domains %s needs square images; these are %dx%d", fm_domain_name(k), h, w);
            return FM_ERR_ARG;
        }
        if (k == FM_DOMAIN_PATCHES && (h % FM_DOMAIN_GRID || w % FM_DOMAIN_GRID)) {
            fm_error_set("--domains patches needs images whose sides divide by %d; these are %dx%d", FM_DOMAIN_GRID,
                         h, w);
            return FM_ERR_ARG;
        }
    }
    return FM_OK;
}

fm_status fm_domain_apply_dataset(fm_domain_kind k, fm_dataset_t *ds, const uint32_t *keys, uint64_t seed)
{
    if (k == FM_DOMAIN_IDENTITY || ds->n == 0)
        return FM_OK;
    fm_domains_t one = {.n = 1, .kind = {k}};
    fm_status st = fm_domains_check(&one, ds->img_h, ds->img_w);
    if (st != FM_OK)
        return st;
    float *scratch = malloc(sizeof(float) * (size_t)ds->dim);
    if (!scratch)
        return FM_ERR_NOMEM;
    float mean = ds->mean, inv = ds->inv_std > 0.0f ? ds->inv_std : 1.0f;
    for (size_t i = 0; i < ds->n; i++) {
        float *x = ds->x + i * (size_t)ds->dim;
        for (int j = 0; j < ds->dim; j++)
            x[j] = x[j] / inv + mean;
        fm_domain_apply(k, x, ds->img_h, ds->img_w, seed, keys[i], scratch);
        for (int j = 0; j < ds->dim; j++)
            x[j] = (x[j] - mean) * inv;
    }
    free(scratch);
    return FM_OK;
}

/* ---- concept groups ---- */

void fm_concept_map(uint64_t seed, int group, int classes, uint8_t *map)
{
    uint32_t p[256];
    for (int c = 0; c < classes; c++)
        p[c] = (uint32_t)c;
    if (group > 0 && classes >= 2) {
        fm_rng_t r;
        fm_rng_init(&r, seed, fm_rng_stream(FM_STREAM_CONCEPT, (uint64_t)group));
        for (bool fixed = true; fixed;) { /* shuffles until no class keeps its label (about e tries) */
            fm_rng_shuffle(&r, p, (size_t)classes);
            fixed = false;
            for (int c = 0; c < classes; c++)
                fixed |= p[c] == (uint32_t)c;
        }
    }
    for (int c = 0; c < classes; c++)
        map[c] = (uint8_t)p[c];
}

void fm_concept_apply(fm_dataset_t *ds, uint64_t seed, int groups, int client)
{
    if (groups < 2 || ds->classes < 2 || ds->classes > 256)
        return;
    uint8_t map[256];
    fm_concept_map(seed, (int)((unsigned)client % (unsigned)groups), ds->classes, map);
    for (size_t i = 0; i < ds->n; i++)
        if (ds->y[i] < ds->classes)
            ds->y[i] = map[ds->y[i]];
}

/* ---- the three together ---- */

bool fm_regime_same(const fm_regime_t *a, const fm_regime_t *b)
{
    return fm_cap_same(&a->examples, &b->examples) && fm_cap_same(&a->bytes, &b->bytes) &&
           fm_domains_same(&a->domains, &b->domains) && a->concept_groups == b->concept_groups;
}

bool fm_regime_any(const fm_regime_t *r)
{
    return r->examples.kind != FM_CAP_NONE || r->bytes.kind != FM_CAP_NONE || r->domains.n > 0 ||
           r->concept_groups > 1;
}

fm_status fm_regime_check(const fm_regime_t *r, bool text)
{
    if (r->concept_groups < 0 || r->concept_groups > FM_CONCEPT_GROUPS_MAX) {
        fm_error_set("--concept-groups %d out of range 0..%d", r->concept_groups, FM_CONCEPT_GROUPS_MAX);
        return FM_ERR_ARG;
    }
    if (text && r->examples.kind != FM_CAP_NONE) {
        fm_error_set("--client-examples caps image data; text is capped in bytes (--client-bytes)");
        return FM_ERR_ARG;
    }
    if (!text && r->bytes.kind != FM_CAP_NONE) {
        fm_error_set("--client-bytes caps text; image data is capped in examples (--client-examples)");
        return FM_ERR_ARG;
    }
    if (text && (r->domains.n > 0 || r->concept_groups > 1)) {
        fm_error_set("--domains and --concept-groups are for image classification, not text");
        return FM_ERR_ARG;
    }
    return FM_OK;
}
