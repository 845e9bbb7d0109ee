/* Loaders: real Fashion-MNIST from the Debian package; IDX files written here,
 * gzip and plain; truncated, corrupt and mismatched files are rejected; CSV. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "fedmoe/clientdata.h"
#include "fedmoe/dataset.h"
#include "fedmoe/log.h"

#include "procs.h"

static char dir[256];

static void path(char *out, const char *name) { snprintf(out, 512, "%s/%s", dir, name); }

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = v >> 24;
    p[1] = v >> 16;
    p[2] = v >> 8;
    p[3] = v;
}

/* Writes an IDX image file of n images (r x c) and a label file; gz selects gzip. */
static void write_idx(const char *img_name, const char *lab_name, uint32_t n, uint32_t r, uint32_t c, bool gz,
                      uint32_t label_count)
{
    size_t ilen = 16 + (size_t)n * r * c, llen = 8 + label_count;
    uint8_t *img = malloc(ilen), *lab = malloc(llen);
    put_be32(img, 0x803);
    put_be32(img + 4, n);
    put_be32(img + 8, r);
    put_be32(img + 12, c);
    for (size_t i = 16; i < ilen; i++)
        img[i] = (uint8_t)(i * 31);
    put_be32(lab, 0x801);
    put_be32(lab + 4, label_count);
    for (size_t i = 8; i < llen; i++)
        lab[i] = (uint8_t)(i % 3);
    char p[512];
    const char *names[2] = {img_name, lab_name};
    uint8_t *bufs[2] = {img, lab};
    size_t lens[2] = {ilen, llen};
    for (int k = 0; k < 2; k++) {
        path(p, names[k]);
        if (gz) {
            gzFile f = gzopen(p, "wb");
            gzwrite(f, bufs[k], (unsigned)lens[k]);
            gzclose(f);
        } else {
            FILE *f = fopen(p, "wb");
            fwrite(bufs[k], 1, lens[k], f);
            fclose(f);
        }
    }
    free(img);
    free(lab);
}

static void truncate_file(const char *name, long keep)
{
    char p[512];
    path(p, name);
    assert_int_equal(truncate(p, keep), 0);
}

static long file_size(const char *name)
{
    char p[512];
    path(p, name);
    FILE *f = fopen(p, "rb");
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return n;
}

static fm_status load(const char *img, const char *lab)
{
    char a[512], b[512];
    path(a, img);
    path(b, lab);
    fm_dataset_t ds = {0};
    fm_status st = fm_dataset_append_idx(&ds, a, b);
    if (st == FM_OK) {
        assert_int_equal(ds.n, 50);
        assert_int_equal(ds.dim, 12);
        assert_int_equal(ds.classes, 3);
        assert_true(ds.x[0] >= 0.0f && ds.x[0] <= 1.0f);
    } else {
        assert_true(strlen(fm_error_last()) > 0);
        assert_null(ds.x);
    }
    fm_dataset_free(&ds);
    return st;
}

static void test_idx_good_files(void **state)
{
    (void)state;
    write_idx("a.gz", "b.gz", 50, 3, 4, true, 50);
    assert_int_equal(load("a.gz", "b.gz"), FM_OK);
    write_idx("a.raw", "b.raw", 50, 3, 4, false, 50);
    assert_int_equal(load("a.raw", "b.raw"), FM_OK);
}

static void test_idx_truncated_and_corrupt(void **state)
{
    (void)state;
    /* plain file cut short */
    write_idx("t.raw", "tl.raw", 50, 3, 4, false, 50);
    truncate_file("t.raw", 16 + 50 * 12 - 5);
    assert_int_equal(load("t.raw", "tl.raw"), FM_ERR_FORMAT);
    /* gzip stream cut short */
    write_idx("t.gz", "tl.gz", 50, 3, 4, true, 50);
    truncate_file("t.gz", file_size("t.gz") / 2);
    assert_int_equal(load("t.gz", "tl.gz"), FM_ERR_FORMAT);
    /* gzip stream with flipped bytes */
    write_idx("c.gz", "cl.gz", 50, 3, 4, true, 50);
    char p[512];
    path(p, "c.gz");
    FILE *f = fopen(p, "r+b");
    fseek(f, 20, SEEK_SET);
    uint8_t junk[8] = {0xde, 0xad, 0xbe, 0xef, 0x00, 0xff, 0x13, 0x37};
    fwrite(junk, 1, sizeof junk, f);
    fclose(f);
    assert_int_equal(load("c.gz", "cl.gz"), FM_ERR_FORMAT);
    /* header only */
    truncate_file("t.raw", 10);
    assert_int_equal(load("t.raw", "tl.raw"), FM_ERR_FORMAT);
    /* missing file */
    assert_int_equal(load("nope.gz", "tl.raw"), FM_ERR_IO);
}

static void test_idx_mismatched(void **state)
{
    (void)state;
    write_idx("m.raw", "ml.raw", 50, 3, 4, false, 49); /* 50 images, 49 labels */
    assert_int_equal(load("m.raw", "ml.raw"), FM_ERR_FORMAT);
    write_idx("s.raw", "sl.raw", 50, 3, 4, false, 50);
    assert_int_equal(load("sl.raw", "s.raw"), FM_ERR_FORMAT); /* files swapped: bad magic */
}

static void test_csv(void **state)
{
    (void)state;
    char p[512];
    path(p, "good.csv");
    FILE *f = fopen(p, "w");
    fprintf(f, "label,a,b,c\n1,0.5,2,3\n0,1e-3,-4,5.5\n\n2,7,8,9\n");
    fclose(f);
    fm_dataset_t ds;
    assert_int_equal(fm_dataset_load_csv(&ds, p), FM_OK);
    assert_int_equal(ds.n, 3);
    assert_int_equal(ds.dim, 3);
    assert_int_equal(ds.classes, 3);
    assert_float_equal(ds.x[4], -4.0f, 0);
    assert_int_equal(ds.y[2], 2);
    fm_dataset_free(&ds);
    const char *bad[] = {"1,2,3\n0,1\n", "1,2,x\n", "-1,2,3\n", "1,2,nan\n", "1,2,3,\n", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        path(p, "bad.csv");
        f = fopen(p, "w");
        fputs(bad[i], f);
        fclose(f);
        assert_int_equal(fm_dataset_load_csv(&ds, p), FM_ERR_FORMAT);
        assert_null(ds.x);
    }
}

static void test_fashion_mnist(void **state)
{
    (void)state;
    fm_dataset_t ds;
    fm_status st = fm_dataset_load_fmnist(&ds, NULL);
    if (st != FM_OK)
        fail_msg("Fashion-MNIST not loadable (install dataset-fashion-mnist): %s", fm_error_last());
    assert_int_equal(ds.n, 70000);
    assert_int_equal(ds.dim, 784);
    assert_int_equal(ds.classes, 10);
    size_t per[10] = {0};
    double s = 0, s2 = 0;
    for (size_t i = 0; i < ds.n; i++)
        per[ds.y[i]]++;
    for (size_t i = 0; i < ds.n * 784; i++) {
        s += ds.x[i];
        s2 += (double)ds.x[i] * ds.x[i];
    }
    for (int c = 0; c < 10; c++)
        assert_int_equal(per[c], 7000);
    double mean = s / (ds.n * 784.0);
    assert_true(fabs(mean) < 1e-3);
    assert_true(fabs(s2 / (ds.n * 784.0) - 1.0) < 1e-3);
    fm_dataset_free(&ds);
    /* a client's data: partition 3 of 10 */
    fm_data_spec_t spec;
    fm_data_spec_default(&spec);
    spec.index = 3;
    spec.count = 10;
    fm_client_data_t cd;
    assert_int_equal(fm_client_data_load(&cd, &spec), FM_OK);
    size_t n = cd.train.n + cd.val.n + cd.test.n;
    assert_true(n >= 40);
    assert_true(fabs((double)cd.test.n / n - 0.25) < 0.02);
    fm_client_data_free(&cd);
    spec.dataset = "fmnist:/nonexistent";
    assert_int_equal(fm_client_data_load(&cd, &spec), FM_ERR_IO);
}

/* A client's partition as loading everything and taking its rows would give
 * it (fm_dataset_subset of the standardized whole). */
static void whole_then_rows(const fm_data_spec_t *spec, fm_client_data_t *cd)
{
    fm_dataset_t all;
    assert_int_equal(fm_dataset_load_fmnist(&all, NULL), FM_OK);
    fm_partition_t part = {0};
    assert_int_equal(fm_partition_make(&part, all.y, all.n, all.classes, spec->count, spec->seed, &spec->part), FM_OK);
    fm_split_t split = {0};
    const uint32_t *mine = part.index + part.offset[spec->index];
    size_t n = part.offset[spec->index + 1] - part.offset[spec->index];
    assert_int_equal(fm_split_make(&split, mine, n, all.y, all.classes, spec->seed, spec->index, spec->test_frac,
                                   spec->val_frac),
                     FM_OK);
    if (spec->holdout)
        assert_int_equal(fm_split_holdout(&split, all.y, all.classes, spec->seed, spec->index, spec->test_frac,
                                          spec->val_frac),
                         FM_OK);
    memset(cd, 0, sizeof *cd);
    assert_int_equal(fm_dataset_subset(&cd->train, &all, split.train, split.n_train), FM_OK);
    assert_int_equal(fm_dataset_subset(&cd->val, &all, split.val, split.n_val), FM_OK);
    assert_int_equal(fm_dataset_subset(&cd->test, &all, split.test, split.n_test), FM_OK);
    fm_split_free(&split);
    fm_partition_free(&part);
    fm_dataset_free(&all);
}

static void same_rows(const fm_dataset_t *a, const fm_dataset_t *b)
{
    assert_int_equal(a->n, b->n);
    assert_int_equal(a->dim, b->dim);
    assert_int_equal(a->img_h, b->img_h);
    assert_memory_equal(a->y, b->y, a->n);
    assert_memory_equal(a->x, b->x, sizeof(float) * a->n * (size_t)a->dim);
}

/* A client reads only its own rows of the image files (it never holds the whole
 * dataset), and gets bit for bit what loading everything gives: partitions 3
 * and 9 of 10, and 7 with the holdout re-split. A truncated image file is
 * refused on this path too. */
static void test_client_reads_only_its_rows(void **state)
{
    (void)state;
    fm_data_spec_t spec;
    fm_data_spec_default(&spec);
    spec.count = 10;
    const int cases[3][2] = {{3, 0}, {9, 0}, {7, 1}};
    for (int k = 0; k < 3; k++) {
        spec.index = cases[k][0];
        spec.holdout = cases[k][1];
        fm_client_data_t rows, whole;
        assert_int_equal(fm_client_data_load(&rows, &spec), FM_OK);
        whole_then_rows(&spec, &whole);
        same_rows(&rows.train, &whole.train);
        same_rows(&rows.val, &whole.val);
        same_rows(&rows.test, &whole.test);
        assert_int_equal(rows.dim, 784);
        assert_int_equal(rows.img_w, 28);
        assert_int_equal(rows.classes, 10);
        fm_client_data_free(&rows);
        fm_client_data_free(&whole);
    }
    write_idx("r.gz", "rl.gz", 400, 3, 4, true, 400);
    truncate_file("r.gz", file_size("r.gz") - 40);
    char spec_text[1200], a[512], b[512];
    path(a, "r.gz");
    path(b, "rl.gz");
    snprintf(spec_text, sizeof spec_text, "idx:%s,%s", a, b);
    spec.dataset = spec_text;
    spec.index = 1;
    spec.count = 2;
    spec.holdout = false;
    spec.part.min_samples = 10;
    fm_client_data_t cd;
    assert_int_equal(fm_client_data_load(&cd, &spec), FM_ERR_FORMAT);
    assert_non_null(strstr(fm_error_last(), "r.gz"));
}

/* A virtual host's clients take their data from one shared copy (the dataset
 * loaded and partitioned once): the same rows as a client process reading only
 * its own; the cache serves only the spec it was made for. */
static void test_shared_cache_gives_each_client_its_data(void **state)
{
    (void)state;
    fm_data_spec_t spec;
    fm_data_spec_default(&spec);
    spec.count = 10;
    fm_data_cache_t cache;
    assert_int_equal(fm_data_cache_load(&cache, &spec), FM_OK);
    for (int index = 0; index < 10; index += 4) {
        spec.index = index;
        assert_true(fm_data_cache_serves(&cache, &spec));
        fm_client_data_t own, shared;
        assert_int_equal(fm_client_data_load(&own, &spec), FM_OK);
        assert_int_equal(fm_client_data_from_cache(&shared, &cache, index), FM_OK);
        same_rows(&own.train, &shared.train);
        same_rows(&own.val, &shared.val);
        same_rows(&own.test, &shared.test);
        fm_client_data_free(&own);
        fm_client_data_free(&shared);
    }
    fm_client_data_t none;
    assert_int_equal(fm_client_data_from_cache(&none, &cache, 10), FM_ERR_ARG);
    spec.seed = 2;
    assert_false(fm_data_cache_serves(&cache, &spec));
    spec.seed = 1;
    spec.holdout = true;
    assert_false(fm_data_cache_serves(&cache, &spec));
    fm_data_cache_free(&cache);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idx_good_files),
        cmocka_unit_test(test_idx_truncated_and_corrupt),
        cmocka_unit_test(test_idx_mismatched),
        cmocka_unit_test(test_csv),
        cmocka_unit_test(test_fashion_mnist),
        cmocka_unit_test(test_client_reads_only_its_rows),
        cmocka_unit_test(test_shared_cache_gives_each_client_its_data),
    };
    return procs_run_tests("dataset", tests, sizeof tests / sizeof tests[0], dir, sizeof dir);
}
