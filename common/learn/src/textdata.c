/* textdata.c - text corpora (fortune packages, user folders; manual pages in
 * textdata_manpages.c) and their windows
 * (textdata.h). */
#include "fedmoe/textdata.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fedmoe/dir.h"
#include "fedmoe/log.h"
#include "textdata_internal.h"

#define MAX_FILE_BYTES TEXT_MAX_FILE_BYTES
#define MAX_CORPUS_BYTES (4ull << 30)

/* The fortune languages: code, folder under the root ("" = the root's own
 * files, which hold the English ones), the package, and what the root's own
 * files of other packages are. */
typedef struct {
    const char *code, *name, *dir, *package;
} fortune_lang_t;
static const fortune_lang_t FORTUNES[] = {
    {"en", "English", "", "fortunes"},     {"de", "German", "de", "fortunes-de"},
    {"es", "Spanish", "es", "fortunes-es"}, {"it", "Italian", "it", "fortunes-it"},
    {"pl", "Polish", "pl", "fortunes-pl"},  {"ru", "Russian", "ru", "fortunes-ru"},
    {"cs", "Czech", "cs", "fortunes-cs"},   {"pt", "Portuguese", "brasil", "fortunes-br"},
    {"bg", "Bulgarian", "bg", "fortunes-bg"}, {"eo", "Esperanto", "eo", "fortunes-eo"},
    {"ga", "Irish", "ga", "fortunes-ga"},
};
#define FORTUNE_LANGS ((int)(sizeof FORTUNES / sizeof FORTUNES[0]))
static const char *const DEFAULT_FORTUNES = "en,de,es,it,pl,ru,cs,pt";

bool fm_text_spec(const char *spec)
{
    if (strncmp(spec, "text:", 5) == 0)
        return true;
    /* named sources joined by '+' */
    for (const char *p = spec;; p++) {
        if (strncmp(p, "fortunes", 8) != 0 && strncmp(p, "manpages", 8) != 0)
            return false;
        p += 8;
        if (*p == ':')
            p += strcspn(p, "+");
        if (*p == 0)
            return true;
        if (*p != '+')
            return false;
    }
}

void fm_text_corpus_free(fm_text_corpus_t *c)
{
    free(c->lang);
    free(c->off);
    free(c->bytes);
    memset(c, 0, sizeof *c);
}

/* ---- building a corpus ------------------------------------------------------- */

typedef text_builder_t builder_t;

fm_status text_add_doc(builder_t *b, int lang, const uint8_t *text, size_t len)
{
    fm_text_corpus_t *c = b->c;
    size_t used = c->docs ? c->off[c->docs] : 0;
    if (used + len > MAX_CORPUS_BYTES) {
        fm_error_set("text: more than %llu bytes of text", (unsigned long long)MAX_CORPUS_BYTES);
        return FM_ERR_ARG;
    }
    if (c->docs + 1 >= b->cap_docs) {
        size_t cap = b->cap_docs ? 2 * b->cap_docs : 4096;
        uint8_t *l = realloc(c->lang, cap);
        uint64_t *o = l ? realloc(c->off, sizeof(uint64_t) * (cap + 1)) : NULL;
        if (l)
            c->lang = l;
        if (!o)
            return FM_ERR_NOMEM;
        c->off = o;
        b->cap_docs = cap;
    }
    if (used + len > b->cap_bytes) {
        size_t cap = b->cap_bytes ? b->cap_bytes : 1 << 20;
        while (cap < used + len)
            cap *= 2;
        uint8_t *g = realloc(c->bytes, cap);
        if (!g)
            return FM_ERR_NOMEM;
        c->bytes = g;
        b->cap_bytes = cap;
    }
    memcpy(c->bytes + used, text, len);
    c->off[c->docs] = used;
    c->lang[c->docs++] = (uint8_t)lang;
    c->off[c->docs] = used + len;
    return FM_OK;
}

size_t text_utf8_prefix(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t b = s[i];
        size_t k = b < 0x80 ? 0 : (b & 0xe0) == 0xc0 && b >= 0xc2 ? 1 : (b & 0xf0) == 0xe0 ? 2
                 : (b & 0xf8) == 0xf0 && b <= 0xf4 ? 3 : 4;
        if (b == 0 || k == 4 || (k > 0 && i + k >= n))
            return i;
        for (size_t j = 1; j <= k; j++)
            if ((s[i + j] & 0xc0) != 0x80)
                return i;
        i += k + 1;
    }
    return n;
}

/* The whole of a regular file (bounded); *len its size. */
static fm_status read_file(const char *path, uint8_t **out, size_t *len)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st) != 0) {
        fm_error_set("%s: cannot read: %s", path, strerror(errno));
        if (f)
            fclose(f);
        return FM_ERR_IO;
    }
    if ((uint64_t)st.st_size > MAX_FILE_BYTES) {
        fclose(f);
        fm_error_set("%s: %lld bytes, more than the %u a text file may have", path, (long long)st.st_size,
                     MAX_FILE_BYTES);
        return FM_ERR_ARG;
    }
    uint8_t *buf = malloc((size_t)st.st_size + 1);
    size_t got = buf ? fread(buf, 1, (size_t)st.st_size, f) : 0;
    fclose(f);
    if (!buf || got != (size_t)st.st_size) {
        free(buf);
        fm_error_set("%s: cannot read", path);
        return buf ? FM_ERR_IO : FM_ERR_NOMEM;
    }
    *out = buf;
    *len = got;
    return FM_OK;
}

/* The fortunes of one file: separated by lines holding only "%"; each without
 * its last newline; empty ones skipped. */
static fm_status add_fortunes(builder_t *b, int lang, const uint8_t *s, size_t n)
{
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        bool end = i == n || (s[i] == '%' && (i == 0 || s[i - 1] == '\n') && (i + 1 == n || s[i + 1] == '\n'));
        if (!end)
            continue;
        size_t stop = i;
        while (stop > start && (s[stop - 1] == '\n' || s[stop - 1] == '\r'))
            stop--;
        fm_status st = stop > start ? text_add_doc(b, lang, s + start, stop - start) : FM_OK;
        if (st != FM_OK)
            return st;
        start = i + 2;
        i++;
    }
    return FM_OK;
}

/* ---- folders ------------------------------------------------------------------- */

/* A fortune file's name worth reading: not an index (.dat), not a .u8 copy
 * of a file beside it (read in its place when the file is not UTF-8), not a
 * language file of the root (brasil). */
static bool fortune_file(const fm_names_t *files, const char *name, bool root)
{
    size_t n = strlen(name);
    char base[512];
    if (n > 4 && strcmp(name + n - 4, ".dat") == 0)
        return false;
    if (n > 3 && n - 3 < sizeof base && strcmp(name + n - 3, ".u8") == 0) {
        memcpy(base, name, n - 3);
        base[n - 3] = 0;
        if (fm_names_has(files, base))
            return false;
    }
    return !(root && strcmp(name, "brasil") == 0);
}

/* The fortunes of one file of a package: path, or when it is not UTF-8 its
 * UTF-8 copy path.u8; neither: left out. */
static fm_status add_fortune_file(builder_t *b, int lang, const char *path)
{
    char u8[8200];
    for (int pass = 0; pass < 2; pass++) {
        uint8_t *text;
        size_t len;
        if (pass == 1 && snprintf(u8, sizeof u8, "%s.u8", path) >= (int)sizeof u8)
            return FM_OK;
        fm_status st = read_file(pass ? u8 : path, &text, &len);
        if (st != FM_OK)
            return pass ? FM_OK : st;
        bool utf8 = text_utf8_prefix(text, len) == len;
        if (utf8)
            st = add_fortunes(b, lang, text, len);
        free(text);
        if (utf8 || st != FM_OK)
            return st;
    }
    return FM_OK;
}

/* The fortunes of language L (FORTUNES index) under root, as language `lang`. */
static fm_status load_fortune_lang(builder_t *b, const char *root, int L, int lang)
{
    const fortune_lang_t *f = &FORTUNES[L];
    char dir[4096], path[8192];
    snprintf(dir, sizeof dir, "%s%s%s", root, f->dir[0] ? "/" : "", f->dir);
    struct stat sb;
    bool single = stat(dir, &sb) == 0 && S_ISREG(sb.st_mode); /* (pt: one file) */
    fm_names_t files = {0};
    fm_status st = single ? FM_OK : stat(dir, &sb) == 0 ? fm_dir_names(dir, FM_DIR_FILES, &files) : FM_ERR_IO;
    size_t before = b->c->docs;
    for (int i = 0; st == FM_OK && i < (single ? 1 : files.n); i++)
        if (single || (fortune_file(&files, files.names[i], !f->dir[0]) &&
                       snprintf(path, sizeof path, "%s/%s", dir, files.names[i]) < (int)sizeof path))
            st = add_fortune_file(b, lang, single ? dir : path);
    fm_names_free(&files);
    if (st == FM_OK && b->c->docs == before)
        st = FM_ERR_IO;
    if (st == FM_ERR_IO)
        fm_error_set("fortunes: no %s fortunes in %s: install the package %s (apt-get install %s)", f->name, dir,
                     f->package, f->package);
    return st;
}

static fm_status load_fortunes(builder_t *b, const char *list, const char *root, const char *prefix)
{
    char codes[256];
    snprintf(codes, sizeof codes, "%s", list && *list ? list : DEFAULT_FORTUNES);
    fm_text_corpus_t *c = b->c;
    for (char *save = NULL, *code = strtok_r(codes, ",", &save); code; code = strtok_r(NULL, ",", &save)) {
        int L = 0;
        while (L < FORTUNE_LANGS && strcmp(FORTUNES[L].code, code) != 0)
            L++;
        if (L == FORTUNE_LANGS) {
            fm_error_set("fortunes: no language '%s' (en, de, es, it, pl, ru, cs, pt, bg, eo, ga)", code);
            return FM_ERR_ARG;
        }
        fm_status st = text_new_language(c, prefix, code);
        if (st == FM_OK)
            st = load_fortune_lang(b, root, L, c->languages - 1);
        if (st != FM_OK)
            return st;
    }
    return FM_OK;
}

/* Every file of dir as one document of language `lang`; user files must be
 * non-empty UTF-8 without NUL bytes. */
static fm_status load_user_files(builder_t *b, const char *dir, const fm_names_t *files, int lang)
{
    for (int i = 0; i < files->n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, files->names[i]);
        uint8_t *text;
        size_t len;
        fm_status st = read_file(path, &text, &len);
        if (st != FM_OK)
            return st;
        size_t ok = text_utf8_prefix(text, len);
        if (len == 0 || ok != len) {
            if (len == 0)
                fm_error_set("%s: an empty file (every file is a document of UTF-8 text)", path);
            else
                fm_error_set("%s: not UTF-8 text (byte %zu: 0x%02x)", path, ok, text[ok]);
            free(text);
            return FM_ERR_FORMAT;
        }
        st = text_add_doc(b, lang, text, len);
        free(text);
        if (st != FM_OK)
            return st;
    }
    return FM_OK;
}

fm_status text_new_language(fm_text_corpus_t *c, const char *prefix, const char *name)
{
    if (c->languages == FM_TEXT_MAX_LANGUAGES) {
        fm_error_set("text: more than %d languages", FM_TEXT_MAX_LANGUAGES);
        return FM_ERR_ARG;
    }
    char full[128];
    snprintf(full, sizeof full, "%s%s%s", prefix ? prefix : "", prefix ? "/" : "", name);
    size_t k = strnlen(full, sizeof c->names[0] - 1); /* (a longer folder name is cut) */
    full[k] = 0;
    for (int j = 0; j < c->languages; j++)
        if (strcmp(c->names[j], full) == 0) {
            fm_error_set("text: language '%s' named twice", full);
            return FM_ERR_ARG;
        }
    memcpy(c->names[c->languages++], full, k + 1);
    return FM_OK;
}

static fm_status load_user(builder_t *b, const char *dir)
{
    fm_names_t files = {0}, dirs = {0};
    fm_status st = fm_dir_names(dir, FM_DIR_FILES, &files);
    if (st == FM_OK)
        st = fm_dir_names(dir, FM_DIR_FOLDERS, &dirs);
    if (st == FM_OK && files.n > 0) {
        const char *base = strrchr(dir, '/');
        if ((st = text_new_language(b->c, NULL, base && base[1] ? base + 1 : dir)) == FM_OK)
            st = load_user_files(b, dir, &files, b->c->languages - 1);
    }
    for (int i = 0; st == FM_OK && i < dirs.n; i++) {
        char sub[4096];
        fm_names_t in = {0};
        snprintf(sub, sizeof sub, "%s/%s", dir, dirs.names[i]);
        if ((st = fm_dir_names(sub, FM_DIR_FILES, &in)) == FM_OK && in.n > 0 && (st = text_new_language(b->c, NULL, dirs.names[i])) == FM_OK)
            st = load_user_files(b, sub, &in, b->c->languages - 1);
        fm_names_free(&in);
    }
    fm_names_free(&files);
    fm_names_free(&dirs);
    if (st == FM_OK && b->c->docs == 0) {
        fm_error_set("text:%s: no files (one UTF-8 file a document; subfolders one language each)", dir);
        st = FM_ERR_ARG;
    }
    return st;
}

/* One named source ("fortunes[:LANGS]" or "manpages[:LANGS]"), its languages
 * prefixed with its name when prefixed. */
static fm_status load_named(builder_t *b, const char *part, const char *root, bool prefixed)
{
    const char *colon = strchr(part, ':');
    size_t n = colon ? (size_t)(colon - part) : strlen(part);
    char dir[2048];
    snprintf(dir, sizeof dir, "%s%s", root ? root : "", FM_FORTUNES_DIR);
    if (n == 8 && strncmp(part, "fortunes", 8) == 0)
        return load_fortunes(b, colon ? colon + 1 : NULL, dir, prefixed ? "fortunes" : NULL);
    if (n == 8 && strncmp(part, "manpages", 8) == 0)
        return text_load_manpages(b, colon ? colon + 1 : NULL, root ? root : "", prefixed ? "manpages" : NULL);
    fm_error_set("text: '%.*s' is not a text source (fortunes, manpages)", (int)n, part);
    return FM_ERR_ARG;
}

fm_status fm_text_corpus_load(fm_text_corpus_t *c, const char *spec, const char *root)
{
    memset(c, 0, sizeof *c);
    builder_t b = {.c = c};
    fm_status st = FM_OK;
    if (strncmp(spec, "text:", 5) == 0 && spec[5]) {
        st = load_user(&b, spec + 5);
    } else if (fm_text_spec(spec)) { /* sources joined by '+', each a domain of its own */
        char parts[256];
        snprintf(parts, sizeof parts, "%s", spec);
        bool prefixed = strchr(parts, '+') != NULL;
        for (char *save = NULL, *p = strtok_r(parts, "+", &save); p && st == FM_OK; p = strtok_r(NULL, "+", &save))
            st = load_named(&b, p, root, prefixed);
    } else {
        fm_error_set("dataset '%s': not text; use fortunes[:LANG,...], manpages[:LANG,...] (joined by +) or text:DIR",
                     spec);
        st = FM_ERR_ARG;
    }
    if (st == FM_ERR_NOMEM)
        fm_error_set("text: out of memory");
    if (st != FM_OK)
        fm_text_corpus_free(c);
    return st;
}

/* ---- windows ------------------------------------------------------------------- */

size_t fm_text_window_count(const fm_text_corpus_t *c, const uint32_t *idx, size_t n, int context)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += c->off[idx[i] + 1] - c->off[idx[i]] + 1;
    return context > 0 && total > (uint64_t)context ? (size_t)((total - 1) / (uint64_t)context) : 0;
}

fm_status fm_text_windows(fm_dataset_t *out, const fm_text_corpus_t *c, const uint32_t *idx, size_t n, int context)
{
    memset(out, 0, sizeof *out);
    size_t windows = fm_text_window_count(c, idx, n, context), T = (size_t)context;
    out->dim = context;
    out->classes = c->languages;
    out->tok = malloc(windows ? windows * (T + 1) : 1);
    out->y = malloc(windows ? windows : 1);
    if (!out->tok || !out->y) {
        fm_dataset_free(out);
        fm_error_set("text: out of memory for %zu windows", windows);
        return FM_ERR_NOMEM;
    }
    /* walk the join: window w takes bytes from w*T on; pos counts bytes of the join */
    size_t doc = 0, inside = 0; /* the next byte: document idx[doc], its byte `inside` (its length: the separator) */
    for (size_t w = 0; w < windows; w++) {
        out->y[w] = c->lang[idx[doc]];
        size_t d = doc, k = inside;
        for (size_t j = 0; j <= T; j++) {
            size_t len = c->off[idx[d] + 1] - c->off[idx[d]];
            out->tok[w * (T + 1) + j] = k < len ? c->bytes[c->off[idx[d]] + k] : FM_TEXT_SEPARATOR;
            if (j == T - 1) { /* the next window starts after this window's T inputs */
                doc = d;
                inside = k + 1;
                if (inside > len) {
                    doc++;
                    inside = 0;
                }
            }
            if (++k > len) {
                d++;
                k = 0;
            }
        }
    }
    out->n = windows;
    return FM_OK;
}
