/* textdata.h - text for the text family: documents in several languages, and
 * the windows of bytes a model reads.
 *
 * Sources (dataset specs):
 *   "fortunes"            Debian's fortune packages, one language each, one
 *                         fortune a document: English (fortunes), German
 *                         (fortunes-de), Spanish (-es), Italian (-it), Polish
 *                         (-pl), Russian (-ru), Czech (-cs), Portuguese (-br)
 *   "fortunes:en,de,..."  those languages (also bg, eo, ga)
 *   "manpages"            Debian's manual pages (manpages, manpages-de, -es,
 *                         -it, -pl, -ru, -cs, -pt-br: the same eight
 *                         languages), one page's troff source a document: a
 *                         second, technical domain; the pages a package
 *                         installed, from dpkg's list of its files (links and
 *                         ".so" pointers to other pages left out)
 *   "manpages:en,de,..."  those languages (also fr)
 *   "fortunes:en+manpages:en"  sources joined by '+': each language of each
 *                         source a label of its own ("fortunes/en",
 *                         "manpages/en"), so partitions by language give a
 *                         client one (domain, language)
 *   "text:DIR"            a folder of UTF-8 files, one document each; its
 *                         subfolders are one language each (files directly in
 *                         DIR: one language named after DIR)
 * A package's file that is not UTF-8 is left out (some carry a Latin-2 copy
 * beside the UTF-8 one); a user's file that is not UTF-8, holds a NUL byte or is
 * empty is an error naming it. A missing package is an error naming it.
 *
 * A document's bytes never straddle splits: partitions and splits are made
 * over documents (their label: the language), and each split's documents are
 * then joined and cut into windows (fm_text_windows). */
#ifndef FEDMOE_TEXTDATA_H
#define FEDMOE_TEXTDATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fedmoe/dataset.h"
#include "fedmoe/status.h"

/* Where Debian's fortune packages install their files. */
#define FM_FORTUNES_DIR "/usr/share/games/fortunes"
/* The byte after every document when a split's documents are joined. */
#define FM_TEXT_SEPARATOR 0x1e
/* The most languages a corpus may have. */
#define FM_TEXT_MAX_LANGUAGES 64

typedef struct {
    size_t docs;
    int languages;
    char names[FM_TEXT_MAX_LANGUAGES][32]; /* "en", "de", ... or folder names */
    uint8_t *lang;                         /* (docs) */
    uint64_t *off;                         /* (docs + 1): document i is bytes[off[i] .. off[i+1]) */
    uint8_t *bytes;
} fm_text_corpus_t;

/* Whether spec names a text source ("fortunes", "manpages", with languages,
 * joined by '+'; "text:..."). */
bool fm_text_spec(const char *spec);
/* Loads the corpus of spec; the packages' files are looked for under root (a
 * system's root folder; NULL: this system's). FM_ERR_ARG / FM_ERR_IO /
 * FM_ERR_FORMAT with one line naming the missing package, folder or file.
 * Free with fm_text_corpus_free. */
fm_status fm_text_corpus_load(fm_text_corpus_t *c, const char *spec, const char *root);
void fm_text_corpus_free(fm_text_corpus_t *c);

/* Windows of documents idx[0..n) joined in that order, each followed by
 * FM_TEXT_SEPARATOR: window w is bytes [w*context, w*context + context + 1) of
 * the join (every byte but the first is predicted exactly once); its label is
 * the language of the document it starts in. */
size_t fm_text_window_count(const fm_text_corpus_t *c, const uint32_t *idx, size_t n, int context);
/* out (zeroed or freed) = those windows, a text dataset of dim context,
 * classes = the corpus's languages. */
fm_status fm_text_windows(fm_dataset_t *out, const fm_text_corpus_t *c, const uint32_t *idx, size_t n, int context);

#endif
