/* textdata_internal.h - what the text sources (textdata.c, textdata_manpages.c)
 * share: the corpus builder and the checks of a document's bytes. */
#ifndef FEDMOE_TEXTDATA_INTERNAL_H
#define FEDMOE_TEXTDATA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "fedmoe/textdata.h"

#define TEXT_MAX_FILE_BYTES (256u << 20) /* one file; a corpus is checked as it grows */

typedef struct {
    fm_text_corpus_t *c;
    size_t cap_docs, cap_bytes;
} text_builder_t;

/* Appends a document of language lang (an index into c->names). */
fm_status text_add_doc(text_builder_t *b, int lang, const uint8_t *text, size_t len);
/* The length of the valid UTF-8 prefix of s (n when all of it is; a NUL byte
 * ends it too). */
size_t text_utf8_prefix(const uint8_t *s, size_t n);
/* Names the next language (name, or "prefix/name" when prefix is given). */
fm_status text_new_language(fm_text_corpus_t *c, const char *prefix, const char *name);

/* The manual pages of Debian's manpages packages (textdata_manpages.c):
 * languages list ("en,de,..."; NULL: the default eight), the packages' files
 * found through dpkg's lists under root ("" on a real system), the language
 * names prefixed with prefix when given. */
fm_status text_load_manpages(text_builder_t *b, const char *list, const char *root, const char *prefix);

#endif
