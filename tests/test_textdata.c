/* Text corpora and their windows: Debian's fortune packages (the eight
 * languages, deterministic, a missing package named), its manual pages, user folders (languages
 * from subfolders; empty, binary and missing inputs refused naming the file or
 * folder), windows that cover a split's joined documents exactly, and
 * partitions by language and Dirichlet over languages whose splits never share
 * a document. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fedmoe/clientdata.h"
#include "fedmoe/log.h"
#include "fedmoe/partition.h"
#include "fedmoe/textdata.h"

static void put(const char *dir, const char *name, const char *text, size_t len)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    fclose(f);
}

static void sub(char *out, size_t cap, const char *dir, const char *name)
{
    snprintf(out, cap, "%s/%s", dir, name);
    assert_int_equal(mkdir(out, 0700), 0);
}

static void remove_tree(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_fortunes(void **state)
{
    (void)state;
    fm_text_corpus_t a, b;
    assert_int_equal(fm_text_corpus_load(&a, "fortunes", NULL), FM_OK);
    const char *want[] = {"en", "de", "es", "it", "pl", "ru", "cs", "pt"};
    assert_int_equal(a.languages, 8);
    size_t docs[8] = {0}, bytes[8] = {0};
    for (size_t i = 0; i < a.docs; i++) {
        size_t len = a.off[i + 1] - a.off[i];
        assert_true(len > 0);
        assert_null(memchr(a.bytes + a.off[i], 0, len));
        docs[a.lang[i]]++;
        bytes[a.lang[i]] += len;
    }
    for (int l = 0; l < 8; l++) {
        assert_string_equal(a.names[l], want[l]);
        fprintf(stderr, "  %s: %zu fortunes, %zu bytes\n", a.names[l], docs[l], bytes[l]);
        assert_true(docs[l] >= 100);
    }
    /* the same corpus every time, and one language alone is its part of it */
    assert_int_equal(fm_text_corpus_load(&b, "fortunes", NULL), FM_OK);
    assert_int_equal(a.docs, b.docs);
    assert_memory_equal(a.off, b.off, sizeof(uint64_t) * (a.docs + 1));
    assert_memory_equal(a.bytes, b.bytes, a.off[a.docs]);
    fm_text_corpus_free(&b);
    assert_int_equal(fm_text_corpus_load(&b, "fortunes:pl", NULL), FM_OK);
    assert_int_equal(b.languages, 1);
    assert_int_equal(b.docs, docs[4]);
    fm_text_corpus_free(&b);
    fm_text_corpus_free(&a);
}

static void test_fortunes_missing(void **state)
{
    (void)state;
    char root[] = "/tmp/fedmoe-fortunes-XXXXXX", de[600], cmd[700];
    assert_non_null(mkdtemp(root));
    snprintf(de, sizeof de, "%s" FM_FORTUNES_DIR "/de", root);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", de);
    assert_int_equal(system(cmd), 0);
    const char *f = "Erste.\n%\nZweite\nZeile.\n%\n\n%\nDritte.\n";
    put(de, "sprueche", f, strlen(f));
    put(de, "sprueche.dat", "\x01\x02", 2);
    fm_text_corpus_t c;
    assert_int_equal(fm_text_corpus_load(&c, "fortunes:de", root), FM_OK);
    assert_int_equal(c.docs, 3);
    assert_int_equal(c.off[2] - c.off[1], strlen("Zweite\nZeile."));
    assert_memory_equal(c.bytes + c.off[1], "Zweite\nZeile.", c.off[2] - c.off[1]);
    fm_text_corpus_free(&c);
    assert_int_equal(fm_text_corpus_load(&c, "fortunes:de,es", root), FM_ERR_IO);
    assert_non_null(strstr(fm_error_last(), "apt-get install fortunes-es"));
    assert_int_equal(fm_text_corpus_load(&c, "fortunes:xx", root), FM_ERR_ARG);
    assert_non_null(strstr(fm_error_last(), "'xx'"));
    assert_int_equal(fm_text_corpus_load(&c, "fortunes:de,de", root), FM_ERR_ARG);
    remove_tree(root);
}

/* A page of a fake system's manpages-de: written, then gzipped in place. */
static void man_page(const char *man, const char *name, const char *text)
{
    char cmd[1200];
    put(man, name, text, strlen(text));
    snprintf(cmd, sizeof cmd, "gzip -n '%s/%s'", man, name);
    assert_int_equal(system(cmd), 0);
}

/* Manual pages: a package's own pages from dpkg's list (links, ".so" pointers
 * and non-UTF-8 pages left out), a missing package named, and sources joined
 * by '+' labelled by source and language; the real packages when installed. */
static void test_manpages(void **state)
{
    (void)state;
    char root[] = "/tmp/fedmoe-man-XXXXXX", man[600], info[600], cmd[1400];
    assert_non_null(mkdtemp(root));
    snprintf(man, sizeof man, "%s/usr/share/man/de/man1", root);
    snprintf(info, sizeof info, "%s/var/lib/dpkg/info", root);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' '%s' '%s" FM_FORTUNES_DIR "/de'", man, info, root);
    assert_int_equal(system(cmd), 0);
    man_page(man, "ls.1", ".TH LS 1\n.SH NAME\nls \\- Verzeichnisinhalte auflisten\n");
    man_page(man, "dir.1", ".so man1/ls.1\n");
    man_page(man, "latin.1", ".TH X 1\n\xe4\n");
    man_page(man, "cat.1", ".TH CAT 1\n.SH NAME\ncat \\- Dateien verketten\n");
    snprintf(cmd, sizeof cmd, "ln -s ls.1.gz '%s/vdir.1.gz'", man);
    assert_int_equal(system(cmd), 0);
    const char *list = "/.\n/usr/share/man\n/usr/share/man/de/man1/ls.1.gz\n/usr/share/man/de/man1/dir.1.gz\n"
                       "/usr/share/man/de/man1/latin.1.gz\n/usr/share/man/de/man1/vdir.1.gz\n"
                       "/usr/share/man/de/man1/cat.1.gz\n/usr/share/doc/manpages-de/copyright\n";
    put(info, "manpages-de.list", list, strlen(list));
    fm_text_corpus_t c;
    assert_int_equal(fm_text_corpus_load(&c, "manpages:de", root), FM_OK);
    assert_int_equal(c.languages, 1);
    assert_string_equal(c.names[0], "de");
    assert_int_equal(c.docs, 2); /* cat.1 then ls.1 (sorted); not dir, latin, vdir */
    const char *cat = ".TH CAT 1\n.SH NAME\ncat \\- Dateien verketten\n";
    assert_int_equal(c.off[1], strlen(cat));
    assert_memory_equal(c.bytes, cat, strlen(cat));
    fm_text_corpus_free(&c);
    assert_int_equal(fm_text_corpus_load(&c, "manpages:de,es", root), FM_ERR_IO);
    assert_non_null(strstr(fm_error_last(), "apt-get install manpages-es"));
    assert_int_equal(fm_text_corpus_load(&c, "manpages:zz", root), FM_ERR_ARG);
    assert_non_null(strstr(fm_error_last(), "'zz'"));
    /* two sources: their languages labelled by source */
    put(info, "../../../.." FM_FORTUNES_DIR "/de/sprueche", "Eins.\n%\nZwei.\n", 14);
    assert_int_equal(fm_text_corpus_load(&c, "fortunes:de+manpages:de", root), FM_OK);
    assert_int_equal(c.languages, 2);
    assert_string_equal(c.names[0], "fortunes/de");
    assert_string_equal(c.names[1], "manpages/de");
    assert_int_equal(c.docs, 4);
    assert_int_equal(c.lang[1], 0);
    assert_int_equal(c.lang[2], 1);
    fm_text_corpus_free(&c);
    assert_int_equal(fm_text_corpus_load(&c, "fortunes:de+", root), FM_ERR_ARG);
    assert_int_equal(fm_text_corpus_load(&c, "manpages:de+manpages:de", root), FM_ERR_ARG);
    assert_non_null(strstr(fm_error_last(), "twice"));
    remove_tree(root);
    /* the real packages (install-deps installs them): every page UTF-8 without NUL */
    if (fm_text_corpus_load(&c, "manpages", NULL) != FM_OK)
        fail_msg("%s", fm_error_last());
    assert_int_equal(c.languages, 8);
    for (size_t i = 0; i < c.docs; i++)
        assert_null(memchr(c.bytes + c.off[i], 0, c.off[i + 1] - c.off[i]));
    fprintf(stderr, "  manpages: %zu pages, %llu bytes\n", c.docs, (unsigned long long)c.off[c.docs]);
    fm_text_corpus_free(&c);
}

/* What a client takes from the network: named sources, never a path. */
static void test_named_sources(void **state)
{
    (void)state;
    const char *named[] = {"fmnist", "fortunes", "fortunes:en,de", "manpages", "manpages:pt", "fortunes:en+manpages:de"};
    const char *not[] = {"text:/etc", "manpages:../x", "fortunes:en+text:/x", "csv:/etc/passwd", "fmnist:/x",
                         "fortunes/../..", "manpages+", "idx:/a,/b"};
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
        assert_true(fm_data_spec_named(named[i]));
    for (size_t i = 0; i < sizeof not / sizeof not[0]; i++)
        if (fm_data_spec_named(not[i]))
            fail_msg("'%s' taken as a named dataset", not[i]);
}

static void test_user_folder(void **state)
{
    (void)state;
    char root[] = "/tmp/fedmoe-text-XXXXXX", a[600], b[600], spec[700];
    assert_non_null(mkdtemp(root));
    snprintf(spec, sizeof spec, "text:%s", root);
    fm_text_corpus_t c;
    assert_int_equal(fm_text_corpus_load(&c, spec, NULL), FM_ERR_ARG); /* empty */
    assert_non_null(strstr(fm_error_last(), "no files"));
    sub(a, sizeof a, root, "alpha");
    sub(b, sizeof b, root, "beta");
    put(a, "2.txt", "zwei", 4);
    put(a, "1.txt", "eins \xc3\xa4", 7);
    put(b, "x", "\xd0\xbf\xd1\x80\xd0\xb8", 6);
    put(root, "top", "top level", 9);
    assert_int_equal(fm_text_corpus_load(&c, spec, NULL), FM_OK);
    assert_int_equal(c.languages, 3);
    assert_string_equal(c.names[1], "alpha");
    assert_string_equal(c.names[2], "beta");
    assert_int_equal(c.docs, 4);
    assert_int_equal(c.lang[0], 0);
    assert_memory_equal(c.bytes + c.off[1], "eins \xc3\xa4", 7); /* files in name order */
    assert_int_equal(c.lang[3], 2);
    fm_text_corpus_free(&c);
    put(b, "empty", "", 0);
    assert_int_equal(fm_text_corpus_load(&c, spec, NULL), FM_ERR_FORMAT);
    assert_non_null(strstr(fm_error_last(), "empty"));
    assert_non_null(strstr(fm_error_last(), "beta/empty"));
    put(b, "empty", "ok\xff\x00garbage", 11);
    assert_int_equal(fm_text_corpus_load(&c, spec, NULL), FM_ERR_FORMAT);
    assert_non_null(strstr(fm_error_last(), "beta/empty: not UTF-8 text (byte 2: 0xff)"));
    put(b, "empty", "a\0b", 3);
    assert_int_equal(fm_text_corpus_load(&c, spec, NULL), FM_ERR_FORMAT);
    remove_tree(root);
    assert_int_equal(fm_text_corpus_load(&c, spec, NULL), FM_ERR_IO);
    assert_non_null(strstr(fm_error_last(), root));
    assert_int_equal(fm_text_corpus_load(&c, "text:", NULL), FM_ERR_ARG);
}

/* A corpus of n documents of varied lengths, in two languages. */
static void synthetic(fm_text_corpus_t *c, size_t n)
{
    memset(c, 0, sizeof *c);
    c->languages = 2;
    c->lang = malloc(n);
    c->off = malloc(sizeof(uint64_t) * (n + 1));
    c->bytes = malloc(n * 40);
    c->off[0] = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = 1 + (i * 7919) % 37;
        for (size_t j = 0; j < len; j++)
            c->bytes[c->off[i] + j] = (uint8_t)('a' + (i + j) % 26);
        c->lang[i] = (uint8_t)(i % 3 == 0);
        c->off[i + 1] = c->off[i] + len;
    }
    c->docs = n;
}

static void test_windows(void **state)
{
    (void)state;
    fm_text_corpus_t c;
    synthetic(&c, 50);
    uint32_t idx[] = {3, 4, 9, 10, 11, 30, 49};
    size_t n = sizeof idx / sizeof idx[0];
    /* the join */
    uint8_t join[400];
    size_t total = 0;
    size_t starts[8];
    for (size_t i = 0; i < n; i++) {
        starts[i] = total;
        size_t len = c.off[idx[i] + 1] - c.off[idx[i]];
        memcpy(join + total, c.bytes + c.off[idx[i]], len);
        total += len;
        join[total++] = FM_TEXT_SEPARATOR;
    }
    for (int T = 1; T <= 9; T++) {
        fm_dataset_t w;
        assert_int_equal(fm_text_windows(&w, &c, idx, n, T), FM_OK);
        assert_int_equal(w.n, (total - 1) / T);
        assert_int_equal(w.n, fm_text_window_count(&c, idx, n, T));
        assert_int_equal(w.dim, T);
        for (size_t k = 0; k < w.n; k++) {
            assert_memory_equal(w.tok + k * (T + 1), join + k * T, T + 1);
            size_t d = 0;
            while (d + 1 < n && starts[d + 1] <= k * T)
                d++;
            assert_int_equal(w.y[k], c.lang[idx[d]]);
        }
        fm_dataset_free(&w);
    }
    /* fewer bytes than a window: none */
    assert_int_equal(fm_text_window_count(&c, idx, 1, 500), 0);
    fm_text_corpus_free(&c);
}

/* Partitions over documents, labelled by language; each client's split over
 * its documents: a document is in one client's one split. */
static void check_partition(const fm_text_corpus_t *c, int clients, const fm_partition_config_t *cfg, int seed,
                            bool one_language)
{
    fm_partition_t p;
    assert_int_equal(fm_partition_make(&p, c->lang, c->docs, c->languages, clients, (uint64_t)seed, cfg), FM_OK);
    uint8_t *seen = calloc(c->docs, 1);
    for (int j = 0; j < clients; j++) {
        size_t n = p.offset[j + 1] - p.offset[j];
        const uint32_t *mine = p.index + p.offset[j];
        for (size_t i = 0; one_language && i < n; i++)
            assert_int_equal(c->lang[mine[i]], j % c->languages);
        fm_split_t s;
        assert_int_equal(fm_split_make(&s, mine, n, c->lang, c->languages, (uint64_t)seed, j, 0.25, 0.2), FM_OK);
        const uint32_t *parts[3] = {s.train, s.val, s.test};
        size_t counts[3] = {s.n_train, s.n_val, s.n_test};
        for (int q = 0; q < 3; q++)
            for (size_t i = 0; i < counts[q]; i++) {
                assert_int_equal(seen[parts[q][i]], 0);
                seen[parts[q][i]] = 1;
            }
        assert_int_equal(counts[0] + counts[1] + counts[2], n);
        fm_split_free(&s);
    }
    free(seen);
    fm_partition_free(&p);
}

static void test_partitions(void **state)
{
    (void)state;
    fm_text_corpus_t c;
    assert_int_equal(fm_text_corpus_load(&c, "fortunes", NULL), FM_OK);
    fm_partition_config_t by_language;
    fm_partition_config_default(&by_language);
    by_language.kind = FM_PARTITION_PATHOLOGICAL;
    by_language.classes_per_client = 1;
    check_partition(&c, 8, &by_language, 1, true);
    check_partition(&c, 12, &by_language, 2, true); /* (clients 8..11 share en..it) */
    fm_partition_config_t mix;
    fm_partition_config_default(&mix);
    mix.alpha = 0.5;
    check_partition(&c, 8, &mix, 3, false);
    /* deterministic from the seed */
    fm_partition_t a, b;
    assert_int_equal(fm_partition_make(&a, c.lang, c.docs, c.languages, 8, 4, &mix), FM_OK);
    assert_int_equal(fm_partition_make(&b, c.lang, c.docs, c.languages, 8, 4, &mix), FM_OK);
    assert_memory_equal(a.offset, b.offset, sizeof(size_t) * 9);
    assert_memory_equal(a.index, b.index, sizeof(uint32_t) * a.offset[8]);
    fm_partition_free(&b);
    assert_int_equal(fm_partition_make(&b, c.lang, c.docs, c.languages, 8, 5, &mix), FM_OK);
    assert_true(memcmp(a.index, b.index, sizeof(uint32_t) * a.offset[8]) != 0);
    fm_partition_free(&a);
    fm_partition_free(&b);
    fm_text_corpus_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fortunes),  cmocka_unit_test(test_fortunes_missing),
        cmocka_unit_test(test_manpages), cmocka_unit_test(test_named_sources), cmocka_unit_test(test_user_folder),
        cmocka_unit_test(test_windows),   cmocka_unit_test(test_partitions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
