/* textdata_manpages.c - the manual pages of Debian's manpages packages as a
 * text source: one page a document (its troff source, as installed), one
 * package a language. The pages are the package's own, found through dpkg's
 * list of the files it installed, so the corpus does not change with what
 * else is installed. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "fedmoe/log.h"
#include "textdata_internal.h"

typedef struct {
    const char *code, *name, *package;
} man_lang_t;
static const man_lang_t MANPAGES[] = {
    {"en", "English", "manpages"},      {"de", "German", "manpages-de"},  {"es", "Spanish", "manpages-es"},
    {"it", "Italian", "manpages-it"},   {"pl", "Polish", "manpages-pl"},  {"ru", "Russian", "manpages-ru"},
    {"cs", "Czech", "manpages-cs"},     {"pt", "Portuguese", "manpages-pt-br"}, {"fr", "French", "manpages-fr"},
};
#define MAN_LANGS ((int)(sizeof MANPAGES / sizeof MANPAGES[0]))
static const char *const DEFAULT_MANPAGES = "en,de,es,it,pl,ru,cs,pt";
#define MAX_PAGES 100000

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The compressed pages (regular files, not links) dpkg lists for package,
 * sorted; *n of them. */
static fm_status package_pages(const char *root, const man_lang_t *l, char ***out, int *n)
{
    char list[4096], line[4096];
    snprintf(list, sizeof list, "%s/var/lib/dpkg/info/%s.list", root, l->package);
    *out = NULL;
    *n = 0;
    FILE *f = fopen(list, "r");
    if (!f) {
        fm_error_set("manpages: no %s manual pages (%s: %s): install the package %s (apt-get install %s)", l->name,
                     list, strerror(errno), l->package, l->package);
        return FM_ERR_IO;
    }
    fm_status st = FM_OK;
    char **pages = NULL;
    int cap = 0;
    while (st == FM_OK && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        size_t len = strlen(line);
        char path[8192];
        struct stat sb;
        if (strncmp(line, "/usr/share/man/", 15) != 0 || len < 4 || strcmp(line + len - 3, ".gz") != 0 ||
            snprintf(path, sizeof path, "%s%s", root, line) >= (int)sizeof path || lstat(path, &sb) != 0 ||
            !S_ISREG(sb.st_mode))
            continue;
        if (*n == MAX_PAGES) {
            fm_error_set("manpages: %s lists more than %d pages", list, MAX_PAGES);
            st = FM_ERR_ARG;
        } else if (*n == cap) {
            cap = cap ? 2 * cap : 256;
            char **g = realloc(pages, sizeof(char *) * cap);
            st = g ? FM_OK : FM_ERR_NOMEM;
            pages = g ? g : pages;
        }
        if (st == FM_OK && !(pages[*n] = strdup(path)))
            st = FM_ERR_NOMEM;
        if (st == FM_OK)
            (*n)++;
    }
    fclose(f);
    if (st == FM_OK && *n > 1)
        qsort(pages, *n, sizeof(char *), cmp_str);
    *out = pages;
    return st;
}

/* A buffer for one decompressed page, grown as pages need (most are a few
 * KB), up to TEXT_MAX_FILE_BYTES; one for a whole load. */
typedef struct {
    uint8_t *p;
    size_t cap;
} page_buf_t;

/* One page, decompressed, as a document of language lang: left out when it
 * is not UTF-8 or only points at another page (".so"). */
static fm_status add_page(text_builder_t *b, int lang, const char *path, page_buf_t *buf)
{
    gzFile z = gzopen(path, "rb");
    if (!z) {
        fm_error_set("manpages: %s: cannot open", path);
        return FM_ERR_IO;
    }
    size_t len = 0;
    int got = 1;
    while (got > 0 && len < TEXT_MAX_FILE_BYTES) {
        if (len == buf->cap) {
            size_t cap = buf->cap ? 2 * buf->cap : 1 << 16;
            cap = cap < TEXT_MAX_FILE_BYTES ? cap : TEXT_MAX_FILE_BYTES;
            uint8_t *g = realloc(buf->p, cap);
            if (!g) {
                gzclose(z);
                return FM_ERR_NOMEM;
            }
            buf->p = g;
            buf->cap = cap;
        }
        if ((got = gzread(z, buf->p + len, (unsigned)(buf->cap - len))) > 0)
            len += (size_t)got;
    }
    int err;
    const char *why = gzerror(z, &err);
    bool bad = err != Z_OK && err != Z_BUF_ERROR;
    gzclose(z);
    if (bad || len == TEXT_MAX_FILE_BYTES) {
        fm_error_set("manpages: %s: %s", path, bad ? why : "larger than a text file may be");
        return FM_ERR_FORMAT;
    }
    const uint8_t *t = buf->p;
    if (len == 0 || (len > 4 && strncmp((const char *)t, ".so ", 4) == 0) || text_utf8_prefix(t, len) != len)
        return FM_OK;
    return text_add_doc(b, lang, t, len);
}

static fm_status load_lang(text_builder_t *b, const char *root, const man_lang_t *l, int lang, page_buf_t *buf)
{
    char **pages;
    int n;
    fm_status st = package_pages(root, l, &pages, &n);
    size_t before = b->c->docs;
    for (int i = 0; st == FM_OK && i < n; i++)
        st = add_page(b, lang, pages[i], buf);
    for (int i = 0; i < n; i++)
        free(pages[i]);
    free(pages);
    if (st == FM_OK && b->c->docs == before) {
        fm_error_set("manpages: the package %s has no readable pages under %s/usr/share/man (apt-get install "
                     "--reinstall %s)", l->package, root, l->package);
        st = FM_ERR_IO;
    }
    return st;
}

fm_status text_load_manpages(text_builder_t *b, const char *list, const char *root, const char *prefix)
{
    char codes[256];
    snprintf(codes, sizeof codes, "%s", list && *list ? list : DEFAULT_MANPAGES);
    page_buf_t buf = {0};
    fm_status st = FM_OK;
    for (char *save = NULL, *code = strtok_r(codes, ",", &save); st == FM_OK && code;
         code = strtok_r(NULL, ",", &save)) {
        int L = 0;
        while (L < MAN_LANGS && strcmp(MANPAGES[L].code, code) != 0)
            L++;
        if (L == MAN_LANGS) {
            fm_error_set("manpages: no language '%s' (en, de, es, it, pl, ru, cs, pt, fr)", code);
            st = FM_ERR_ARG;
        } else if ((st = text_new_language(b->c, prefix, code)) == FM_OK) {
            st = load_lang(b, root, &MANPAGES[L], b->c->languages - 1, &buf);
        }
    }
    free(buf.p);
    return st;
}
