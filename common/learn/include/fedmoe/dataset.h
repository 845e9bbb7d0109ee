/* dataset.h - labelled examples in memory: Fashion-MNIST IDX files, user IDX or CSV.
 *
 * Features are float32 rows; labels are class indices. Image data (IDX) is scaled
 * to [0,1] and standardized with the mean and standard deviation given in the
 * dataset (by default those of the data itself, so every party that loads the same
 * files gets the same numbers). Loaders reject truncated, corrupt or mismatched
 * files with FM_ERR_FORMAT / FM_ERR_IO and a reason in fm_error_last(). */
#ifndef FEDMOE_DATASET_H
#define FEDMOE_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "fedmoe/status.h"

/* Where Debian's dataset-fashion-mnist package installs the files. */
#define FM_FMNIST_DIR "/usr/share/datasets/fashion-mnist"
/* Its files, in the order they are appended: {images, labels} of train, then test. */
extern const char *const FM_FMNIST_FILES[2][2];

/* Examples are feature rows (x) or, for text, windows of bytes (tok): a
 * window's dim + 1 bytes are its dim inputs and, one later, the dim bytes to
 * predict; its label y is its language (or other source). */
typedef struct {
    size_t n;        /* examples */
    int dim;         /* features per example; text: context length */
    int classes;     /* 1 + largest label */
    int img_h, img_w;/* image size, 0 when not images */
    float *x;        /* (n, dim); NULL for text */
    uint8_t *tok;    /* text: (n, dim + 1); NULL otherwise */
    uint8_t *y;      /* (n) */
    float mean, inv_std; /* standardized images: x = (pixel in [0,1] - mean) * inv_std; inv_std 0: raw */
} fm_dataset_t;

/* Fashion-MNIST: the union of the train and test files (70,000 images) in dir
 * (FM_FMNIST_DIR when NULL), standardized. */
fm_status fm_dataset_load_fmnist(fm_dataset_t *ds, const char *dir);
/* Only the labels of Fashion-MNIST (x NULL, dim 0): what a coordinator needs to
 * know every partition's size. */
fm_status fm_dataset_load_fmnist_labels(fm_dataset_t *ds, const char *dir);
/* One pair of IDX files (images idx3 ubyte, labels idx1 ubyte), gzip or plain,
 * appended to ds (which may be zeroed). Pixels are scaled to [0,1]; call
 * fm_dataset_standardize after the last append. images_path NULL: labels only. */
fm_status fm_dataset_append_idx(fm_dataset_t *ds, const char *images_path, const char *labels_path);
/* The rows idx[p][0..n[p]) (p < parts, indices into labels) of the IDX image
 * files image_paths (per_file[k] images in file k, in the order
 * fm_dataset_append_idx would append them; labels: theirs, all of them), into
 * out[p], standardized with the statistics of every pixel of every file: the
 * numbers loading everything and fm_dataset_standardize give, reading each
 * image once and holding only the rows asked for. An index out of range is
 * an error (FM_ERR_ARG). */
fm_status fm_dataset_idx_rows(const char *const *image_paths, const uint32_t *per_file, int nfiles,
                              const fm_dataset_t *labels, const uint32_t *const *idx, const size_t *n, int parts,
                              fm_dataset_t *out);
/* A CSV file: one example a line, "label,f1,f2,...", optional header line. */
fm_status fm_dataset_load_csv(fm_dataset_t *ds, const char *path);
/* x <- (x - mean) / std over all values. */
void fm_dataset_standardize(fm_dataset_t *ds);
/* out = the examples src[idx[0..n)] (copied; out must be zeroed or freed). */
fm_status fm_dataset_subset(fm_dataset_t *out, const fm_dataset_t *src, const uint32_t *idx, size_t n);
/* Copies a batch of examples idx[0..B) into x (B, dim) and y (B) (feature rows). */
void fm_dataset_gather(const fm_dataset_t *ds, const uint32_t *idx, int B, float *x, uint8_t *y);
/* Frees x and y and zeroes ds (ds itself is the caller's). */
void fm_dataset_free(fm_dataset_t *ds);

#endif
