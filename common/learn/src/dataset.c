#include "fedmoe/dataset.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "fedmoe/log.h"

#define IDX_MAX_ITEMS 100000000u

const char *const FM_FMNIST_FILES[2][2] = {{"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"},
                                           {"t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}};

/* Reads the whole (possibly gzip) file into memory; *out is malloc'd. */
static fm_status read_file(const char *path, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    gzFile f = gzopen(path, "rb");
    if (!f) {
        fm_error_set("%s: %s", path, strerror(errno ? errno : ENOENT));
        return FM_ERR_IO;
    }
    size_t cap = 1 << 20, n = 0;
    uint8_t *buf = malloc(cap);
    if (!buf) {
        gzclose(f);
        return FM_ERR_NOMEM;
    }
    for (;;) {
        if (n == cap) {
            if (cap > ((size_t)1 << 32)) {
                fm_error_set("%s: file too large", path);
                free(buf);
                gzclose(f);
                return FM_ERR_FORMAT;
            }
            uint8_t *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                gzclose(f);
                return FM_ERR_NOMEM;
            }
            buf = nb;
            cap *= 2;
        }
        int got = gzread(f, buf + n, (unsigned)(cap - n > (1u << 30) ? (1u << 30) : cap - n));
        if (got < 0) {
            int err;
            const char *msg = gzerror(f, &err);
            fm_error_set("%s: corrupt compressed data (%s)", path, msg);
            free(buf);
            gzclose(f);
            return FM_ERR_FORMAT;
        }
        if (got == 0)
            break;
        n += (size_t)got;
    }
    /* gzread returns 0 at a truncated gzip stream; gzclose reports it */
    int err = gzclose(f);
    if (err != Z_OK) {
        fm_error_set("%s: truncated or corrupt compressed file", path);
        free(buf);
        return FM_ERR_FORMAT;
    }
    *out = buf;
    *len = n;
    return FM_OK;
}

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

/* The labels of an IDX label file: *lab is malloc'd, labels at lab + 8, *n of them. */
static fm_status read_labels(const char *path, uint8_t **lab, uint32_t *n)
{
    size_t len = 0;
    fm_status st = read_file(path, lab, &len);
    if (st != FM_OK)
        return st;
    if (len < 8 || be32(*lab) != 0x00000801u) {
        fm_error_set("%s: not an IDX ubyte label file (bad magic)", path);
        goto bad;
    }
    *n = be32(*lab + 4);
    if (len != 8 + (size_t)*n) {
        fm_error_set("%s: %zu bytes, header says %zu (truncated or corrupt)", path, len, 8 + (size_t)*n);
        goto bad;
    }
    for (uint32_t i = 0; i < *n; i++)
        if ((*lab)[8 + i] >= 255) {
            fm_error_set("%s: label %u out of range", path, (*lab)[8 + i]);
            goto bad;
        }
    return FM_OK;
bad:
    free(*lab);
    *lab = NULL;
    return FM_ERR_FORMAT;
}

/* The one way pixels become features and are standardized, used by the whole
 * load and the row-by-row one alike (noinline: one compiled body, the same
 * rounding, whatever the caller). */
__attribute__((noinline)) static void scale_pixels(const uint8_t *p, size_t n, float *x)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)p[i] * (1.0f / 255.0f);
}

__attribute__((noinline)) static void add_values(const float *x, size_t n, double *s, double *s2)
{
    for (size_t i = 0; i < n; i++) {
        *s += x[i];
        *s2 += (double)x[i] * x[i];
    }
}

static void moments(double s, double s2, size_t total, float *mu, float *inv)
{
    double mean = s / total, var = s2 / total - mean * mean;
    *inv = (float)(1.0 / sqrt(var > 1e-12 ? var : 1.0));
    *mu = (float)mean;
}

__attribute__((noinline)) static void apply_standard(float *x, size_t n, float mu, float inv)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (x[i] - mu) * inv;
}

/* The pixels of an IDX image file of n images, scaled to [0,1], appended to ds. */
static fm_status append_images(fm_dataset_t *ds, const char *path, uint32_t n_labels)
{
    uint8_t *img = NULL;
    size_t ilen = 0;
    fm_status st = read_file(path, &img, &ilen);
    if (st != FM_OK)
        return st;
    st = FM_ERR_FORMAT;
    if (ilen < 16 || be32(img) != 0x00000803u) {
        fm_error_set("%s: not an IDX ubyte image file (bad magic)", path);
        goto out;
    }
    uint32_t n = be32(img + 4), rows = be32(img + 8), cols = be32(img + 12);
    if (n == 0 || n > IDX_MAX_ITEMS || rows == 0 || cols == 0 || rows > 4096 || cols > 4096) {
        fm_error_set("%s: implausible sizes %u x %u x %u", path, n, rows, cols);
        goto out;
    }
    if (ilen != 16 + (size_t)n * rows * cols) {
        fm_error_set("%s: %zu bytes, header says %zu (truncated or corrupt)", path, ilen, 16 + (size_t)n * rows * cols);
        goto out;
    }
    if (n != n_labels) {
        fm_error_set("%s has %u images but its label file has %u labels", path, n, n_labels);
        goto out;
    }
    int dim = (int)(rows * cols);
    if (ds->n > 0 && (ds->dim != dim || ds->img_h != (int)rows)) {
        fm_error_set("%s: images of %ux%u do not match the %dx%d already loaded", path, rows, cols, ds->img_h,
                     ds->img_w);
        goto out;
    }
    float *x = realloc(ds->x, sizeof(float) * (ds->n + n) * dim);
    if (!x) {
        st = FM_ERR_NOMEM;
        goto out;
    }
    ds->x = x;
    scale_pixels(img + 16, (size_t)n * dim, ds->x + ds->n * dim);
    ds->dim = dim;
    ds->img_h = (int)rows;
    ds->img_w = (int)cols;
    st = FM_OK;
out:
    free(img);
    return st;
}

fm_status fm_dataset_append_idx(fm_dataset_t *ds, const char *images_path, const char *labels_path)
{
    uint8_t *lab = NULL;
    uint32_t n = 0;
    fm_status st = read_labels(labels_path, &lab, &n);
    if (st != FM_OK)
        return st;
    if (images_path && (st = append_images(ds, images_path, n)) != FM_OK)
        goto out;
    uint8_t *y = realloc(ds->y, ds->n + n);
    if (!y) {
        st = FM_ERR_NOMEM;
        goto out;
    }
    ds->y = y;
    memcpy(ds->y + ds->n, lab + 8, n);
    for (uint32_t i = 0; i < n; i++)
        if (lab[8 + i] + 1 > ds->classes)
            ds->classes = lab[8 + i] + 1;
    ds->n += n;
out:
    free(lab);
    return st;
}

/* Reads an IDX image file's header from f (checked against n_labels and the
 * image size seen so far, *dim 0 before the first file). */
static fm_status stream_header(gzFile f, const char *path, uint32_t n_labels, int *dim, int *h, int *w, uint32_t *n)
{
    uint8_t hd[16];
    if (gzread(f, hd, sizeof hd) != (int)sizeof hd || be32(hd) != 0x00000803u) {
        fm_error_set("%s: not an IDX ubyte image file (bad magic)", path);
        return FM_ERR_FORMAT;
    }
    uint32_t rows = be32(hd + 8), cols = be32(hd + 12);
    *n = be32(hd + 4);
    if (*n != n_labels || rows == 0 || cols == 0 || rows > 4096 || cols > 4096) {
        fm_error_set("%s: %u images of %u x %u for %u labels", path, *n, rows, cols, n_labels);
        return FM_ERR_FORMAT;
    }
    if (*dim && (*dim != (int)(rows * cols) || *h != (int)rows)) {
        fm_error_set("%s: images of %ux%u do not match the %dx%d before", path, rows, cols, *h, *w);
        return FM_ERR_FORMAT;
    }
    *dim = (int)(rows * cols);
    *h = (int)rows;
    *w = (int)cols;
    return FM_OK;
}

/* Reads every image of the files once, in order: the sums of all pixel values
 * (scaled to [0,1]) as fm_dataset_standardize adds them, in the same order,
 * and the raw pixels of the images at[i] >= 0 into keep + at[i] * dim. */
static fm_status stream_images(const char *const *paths, int nfiles, const uint32_t *per_file, const int32_t *at,
                               uint8_t **keep, size_t kept, fm_dataset_t *shape, double *s, double *s2)
{
    uint8_t *img = NULL;
    float *v = NULL;
    size_t base = 0;
    fm_status st = FM_OK;
    *s = *s2 = 0.0;
    for (int k = 0; st == FM_OK && k < nfiles; k++) {
        gzFile f = gzopen(paths[k], "rb");
        if (!f) {
            fm_error_set("%s: %s", paths[k], strerror(errno ? errno : ENOENT));
            st = FM_ERR_IO;
            break;
        }
        uint32_t n;
        st = stream_header(f, paths[k], per_file[k], &shape->dim, &shape->img_h, &shape->img_w, &n);
        if (st == FM_OK && !img && (!(img = malloc((size_t)shape->dim)) || !(v = malloc(sizeof(float) * shape->dim)) ||
                                    (kept && !(*keep = malloc(kept * (size_t)shape->dim)))))
            st = FM_ERR_NOMEM;
        for (uint32_t i = 0; st == FM_OK && i < n; i++) {
            if (gzread(f, img, (unsigned)shape->dim) != shape->dim) {
                fm_error_set("%s: truncated or corrupt at image %u of %u", paths[k], i, n);
                st = FM_ERR_FORMAT;
                break;
            }
            scale_pixels(img, (size_t)shape->dim, v);
            add_values(v, (size_t)shape->dim, s, s2);
            if (at[base + i] >= 0)
                memcpy(*keep + (size_t)at[base + i] * (size_t)shape->dim, img, (size_t)shape->dim);
        }
        if (gzclose(f) != Z_OK && st == FM_OK) {
            fm_error_set("%s: truncated or corrupt compressed file", paths[k]);
            st = FM_ERR_FORMAT;
        }
        base += n;
    }
    free(img);
    free(v);
    return st;
}

fm_status fm_dataset_idx_rows(const char *const *image_paths, const uint32_t *per_file, int nfiles,
                              const fm_dataset_t *labels, const uint32_t *const *idx, const size_t *n, int parts,
                              fm_dataset_t *out)
{
    for (int p = 0; p < parts; p++)
        memset(&out[p], 0, sizeof out[p]);
    int32_t *at = malloc(sizeof(int32_t) * (labels->n ? labels->n : 1));
    if (!at)
        return FM_ERR_NOMEM;
    memset(at, 0xff, sizeof(int32_t) * labels->n); /* -1: not kept */
    size_t kept = 0;
    for (int p = 0; p < parts; p++)
        for (size_t i = 0; i < n[p]; i++) {
            if (idx[p][i] >= labels->n) {
                fm_error_set("row %u of a dataset of %zu", idx[p][i], labels->n);
                free(at);
                return FM_ERR_ARG;
            }
            if (at[idx[p][i]] < 0)
                at[idx[p][i]] = (int32_t)kept++;
        }
    uint8_t *keep = NULL;
    fm_dataset_t shape = {0};
    double s, s2;
    fm_status st = stream_images(image_paths, nfiles, per_file, at, &keep, kept, &shape, &s, &s2);
    /* fm_dataset_standardize's numbers, from the sums over every pixel */
    float mu = 0.0f, inv = 1.0f;
    if (labels->n * (size_t)shape.dim != 0)
        moments(s, s2, labels->n * (size_t)shape.dim, &mu, &inv);
    for (int p = 0; st == FM_OK && p < parts; p++) {
        fm_dataset_t *d = &out[p];
        d->dim = shape.dim;
        d->img_h = shape.img_h;
        d->img_w = shape.img_w;
        d->classes = labels->classes;
        d->n = n[p];
        d->mean = mu;
        d->inv_std = inv;
        d->x = malloc(sizeof(float) * (n[p] ? n[p] : 1) * (size_t)shape.dim);
        d->y = malloc(n[p] ? n[p] : 1);
        if (!d->x || !d->y) {
            st = FM_ERR_NOMEM;
            break;
        }
        for (size_t i = 0; i < n[p]; i++) {
            scale_pixels(keep + (size_t)at[idx[p][i]] * (size_t)shape.dim, (size_t)shape.dim,
                         d->x + i * (size_t)shape.dim);
            d->y[i] = labels->y[idx[p][i]];
        }
        apply_standard(d->x, n[p] * (size_t)shape.dim, mu, inv);
    }
    free(keep);
    free(at);
    if (st != FM_OK)
        for (int p = 0; p < parts; p++)
            fm_dataset_free(&out[p]);
    return st;
}

void fm_dataset_standardize(fm_dataset_t *ds)
{
    size_t total = ds->n * (size_t)ds->dim;
    if (total == 0)
        return;
    double s = 0.0, s2 = 0.0;
    add_values(ds->x, total, &s, &s2);
    float mu, inv;
    moments(s, s2, total, &mu, &inv);
    apply_standard(ds->x, total, mu, inv);
    ds->mean = mu;
    ds->inv_std = inv;
}

static fm_status load_fmnist(fm_dataset_t *ds, const char *dir, bool images)
{
    if (!dir)
        dir = FM_FMNIST_DIR;
    memset(ds, 0, sizeof *ds);
    for (int i = 0; i < 2; i++) {
        char ip[4096], lp[4096];
        snprintf(ip, sizeof ip, "%s/%s", dir, FM_FMNIST_FILES[i][0]);
        snprintf(lp, sizeof lp, "%s/%s", dir, FM_FMNIST_FILES[i][1]);
        fm_status st = fm_dataset_append_idx(ds, images ? ip : NULL, lp);
        if (st != FM_OK) {
            fm_dataset_free(ds);
            return st;
        }
    }
    fm_dataset_standardize(ds);
    return FM_OK;
}

fm_status fm_dataset_load_fmnist(fm_dataset_t *ds, const char *dir) { return load_fmnist(ds, dir, true); }

fm_status fm_dataset_load_fmnist_labels(fm_dataset_t *ds, const char *dir) { return load_fmnist(ds, dir, false); }

fm_status fm_dataset_load_csv(fm_dataset_t *ds, const char *path)
{
    memset(ds, 0, sizeof *ds);
    FILE *f = fopen(path, "r");
    if (!f) {
        fm_error_set("%s: %s", path, strerror(errno));
        return FM_ERR_IO;
    }
    char *line = NULL;
    size_t cap = 0, xcap = 0, ycap = 0;
    ssize_t len;
    long lineno = 0;
    fm_status st = FM_OK;
    while ((len = getline(&line, &cap, f)) != -1) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = 0;
        if (len == 0)
            continue;
        char *p = line, *end;
        errno = 0;
        long label = strtol(p, &end, 10);
        if (end == p || (*end != ',' && *end != 0)) {
            if (lineno == 1 && ds->n == 0)
                continue; /* a header line */
            fm_error_set("%s:%ld: the label is not an integer", path, lineno);
            st = FM_ERR_FORMAT;
            break;
        }
        if (label < 0 || label > 254) {
            fm_error_set("%s:%ld: label %ld out of range 0..254", path, lineno, label);
            st = FM_ERR_FORMAT;
            break;
        }
        int dim = 0;
        p = end;
        while (*p == ',') {
            p++;
            errno = 0;
            float v = strtof(p, &end);
            if (end == p || errno == ERANGE || !isfinite(v)) {
                fm_error_set("%s:%ld: feature %d is not a finite number", path, lineno, dim + 1);
                st = FM_ERR_FORMAT;
                goto done;
            }
            if (ds->n * (size_t)(ds->dim ? ds->dim : 1) + dim + 1 > xcap) {
                xcap = xcap ? xcap * 2 : 4096;
                float *nx = realloc(ds->x, sizeof(float) * xcap);
                if (!nx) {
                    st = FM_ERR_NOMEM;
                    goto done;
                }
                ds->x = nx;
            }
            ds->x[ds->n * (size_t)(ds->dim ? ds->dim : 0) + dim] = v;
            dim++;
            p = end;
        }
        if (*p != 0) {
            fm_error_set("%s:%ld: unexpected text after feature %d", path, lineno, dim);
            st = FM_ERR_FORMAT;
            break;
        }
        if (dim == 0 || (ds->n > 0 && dim != ds->dim)) {
            fm_error_set("%s:%ld: %d features, expected %d", path, lineno, dim, ds->n ? ds->dim : 1);
            st = FM_ERR_FORMAT;
            break;
        }
        ds->dim = dim;
        if (ds->n + 1 > ycap) {
            ycap = ycap ? ycap * 2 : 1024;
            uint8_t *ny = realloc(ds->y, ycap);
            if (!ny) {
                st = FM_ERR_NOMEM;
                break;
            }
            ds->y = ny;
        }
        ds->y[ds->n++] = (uint8_t)label;
        if ((int)label + 1 > ds->classes)
            ds->classes = (int)label + 1;
    }
done:
    free(line);
    fclose(f);
    if (st == FM_OK && ds->n == 0) {
        fm_error_set("%s: no examples", path);
        st = FM_ERR_FORMAT;
    }
    if (st != FM_OK)
        fm_dataset_free(ds);
    return st;
}

fm_status fm_dataset_subset(fm_dataset_t *out, const fm_dataset_t *src, const uint32_t *idx, size_t n)
{
    memset(out, 0, sizeof *out);
    out->dim = src->dim;
    out->classes = src->classes;
    out->img_h = src->img_h;
    out->img_w = src->img_w;
    out->mean = src->mean;
    out->inv_std = src->inv_std;
    size_t row = src->tok ? (size_t)src->dim + 1 : sizeof(float) * src->dim;
    void *rows = malloc((n ? n : 1) * row);
    out->y = malloc(n ? n : 1);
    if (src->tok)
        out->tok = rows;
    else
        out->x = rows;
    if (!rows || !out->y) {
        fm_dataset_free(out);
        return FM_ERR_NOMEM;
    }
    const char *from = src->tok ? (const char *)src->tok : (const char *)src->x;
    for (size_t i = 0; i < n; i++) {
        memcpy((char *)rows + i * row, from + (size_t)idx[i] * row, row);
        out->y[i] = src->y[idx[i]];
    }
    out->n = n;
    return FM_OK;
}

void fm_dataset_gather(const fm_dataset_t *ds, const uint32_t *idx, int B, float *x, uint8_t *y)
{
    for (int i = 0; i < B; i++) {
        memcpy(x + (size_t)i * ds->dim, ds->x + (size_t)idx[i] * ds->dim, sizeof(float) * ds->dim);
        y[i] = ds->y[idx[i]];
    }
}

void fm_dataset_free(fm_dataset_t *ds)
{
    free(ds->x);
    free(ds->tok);
    free(ds->y);
    memset(ds, 0, sizeof *ds);
}
