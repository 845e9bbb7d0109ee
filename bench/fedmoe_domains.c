/* fedmoe-domains: a picture of the image domains (--domains), for the docs.
 *
 *   fedmoe-domains OUT.png [--seed S] [--dataset fmnist|fmnist:DIR]
 *
 * Writes a grayscale PNG: one row a class (the dataset's first example of it),
 * one column a domain (identity, rotate90, ..., patches, in that order), each
 * image drawn twice its size, from the same transforms the clients apply
 * (fm_domain_apply on pixels in [0,1]; values outside shown clipped). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "fedmoe/args.h"
#include "fedmoe/dataset.h"
#include "fedmoe/log.h"
#include "fedmoe/regime.h"

#define ZOOM 2
#define GAP 4

static void put32(FILE *f, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
    fwrite(b, 1, 4, f);
}

static void chunk(FILE *f, const char *type, const uint8_t *data, uint32_t n)
{
    put32(f, n);
    fwrite(type, 1, 4, f);
    if (n)
        fwrite(data, 1, n, f);
    uLong crc = crc32(0L, (const Bytef *)type, 4);
    if (n)
        crc = crc32(crc, data, n);
    put32(f, (uint32_t)crc);
}

/* An 8-bit grayscale PNG of w x h pixels. */
static int write_png(const char *path, const uint8_t *px, int w, int h)
{
    size_t raw_n = (size_t)h * (size_t)(w + 1);
    uint8_t *raw = malloc(raw_n);
    uLongf zn = compressBound((uLong)raw_n);
    uint8_t *z = malloc(zn);
    FILE *f = fopen(path, "wb");
    int rc = 1;
    if (raw && z && f) {
        for (int y = 0; y < h; y++) {
            raw[(size_t)y * (w + 1)] = 0; /* filter: none */
            memcpy(raw + (size_t)y * (w + 1) + 1, px + (size_t)y * w, (size_t)w);
        }
        if (compress2(z, &zn, raw, (uLong)raw_n, 9) == Z_OK) {
            static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
            uint8_t ihdr[13] = {0};
            for (int i = 0; i < 4; i++) {
                ihdr[i] = (uint8_t)((uint32_t)w >> (24 - 8 * i));
                ihdr[4 + i] = (uint8_t)((uint32_t)h >> (24 - 8 * i));
            }
            ihdr[8] = 8; /* bit depth; colour type 0 (gray), deflate, no filter, no interlace */
            fwrite(sig, 1, 8, f);
            chunk(f, "IHDR", ihdr, 13);
            chunk(f, "IDAT", z, (uint32_t)zn);
            chunk(f, "IEND", NULL, 0);
            rc = ferror(f) ? 1 : 0;
        }
    }
    if (f && fclose(f) != 0)
        rc = 1;
    if (rc)
        fprintf(stderr, "fedmoe-domains: cannot write %s\n", path);
    free(raw);
    free(z);
    return rc;
}

int main(int argc, char **argv)
{
    const char *out = NULL, *dataset = "fmnist";
    unsigned long long seed = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: fedmoe-domains OUT.png [--seed S] [--dataset fmnist|fmnist:DIR]\n"
                   "a row a class, a column a domain: %s", fm_domain_name(0));
            for (int k = 1; k < FM_DOMAIN_KINDS; k++)
                printf(", %s", fm_domain_name((fm_domain_kind)k));
            printf("\n");
            return 0;
        }
        if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            if (fm_arg_u64("--seed", argv[++i], &seed) != FM_OK) {
                fprintf(stderr, "fedmoe-domains: %s\n", fm_error_last());
                return 2;
            }
        } else if (!strcmp(argv[i], "--dataset") && i + 1 < argc) {
            dataset = argv[++i];
        } else if (argv[i][0] != '-' && !out) {
            out = argv[i];
        } else {
            fprintf(stderr, "fedmoe-domains: unexpected '%s' (fedmoe-domains --help)\n", argv[i]);
            return 2;
        }
    }
    if (!out) {
        fprintf(stderr, "usage: fedmoe-domains OUT.png [--seed S] [--dataset fmnist|fmnist:DIR]\n");
        return 2;
    }
    if (strcmp(dataset, "fmnist") != 0 && strncmp(dataset, "fmnist:", 7) != 0) {
        fprintf(stderr, "fedmoe-domains: --dataset takes fmnist or fmnist:DIR\n");
        return 2;
    }
    fm_dataset_t ds;
    if (fm_dataset_load_fmnist(&ds, dataset[6] == ':' ? dataset + 7 : NULL) != FM_OK) {
        fprintf(stderr, "fedmoe-domains: %s\n", fm_error_last());
        return 1;
    }
    int h = ds.img_h, w = ds.img_w, rows = ds.classes, cols = FM_DOMAIN_KINDS;
    int cw = w * ZOOM + GAP, ch = h * ZOOM + GAP, W = cols * cw + GAP, H = rows * ch + GAP;
    uint8_t *px = malloc((size_t)W * H);
    float *img = malloc(sizeof(float) * (size_t)ds.dim), *scratch = malloc(sizeof(float) * (size_t)ds.dim);
    if (!px || !img || !scratch) {
        fprintf(stderr, "fedmoe-domains: out of memory\n");
        return 1;
    }
    memset(px, 255, (size_t)W * H);
    for (int c = 0; c < rows; c++) {
        size_t e = 0;
        while (e < ds.n && ds.y[e] != c)
            e++;
        if (e == ds.n)
            continue;
        for (int k = 0; k < cols; k++) {
            for (int j = 0; j < ds.dim; j++)
                img[j] = ds.x[e * (size_t)ds.dim + j] / ds.inv_std + ds.mean;
            fm_domain_apply((fm_domain_kind)k, img, h, w, seed, e, scratch);
            for (int y = 0; y < h * ZOOM; y++)
                for (int x = 0; x < w * ZOOM; x++) {
                    float v = img[(y / ZOOM) * w + x / ZOOM];
                    v = v < 0.0f ? 0.0f : v > 1.0f ? 1.0f : v;
                    /* dark ink on light paper, as the clothes are drawn */
                    px[(size_t)(GAP + c * ch + y) * W + GAP + k * cw + x] = (uint8_t)(255.0f - 255.0f * v + 0.5f);
                }
        }
    }
    int rc = write_png(out, px, W, H);
    free(px);
    free(img);
    free(scratch);
    fm_dataset_free(&ds);
    return rc;
}
