#include "fedmoe/record.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define FIELD(row, name, type, cap, key, flags) \
    {#name, key, FM_FIELD_##type, offsetof(row, name), sizeof(((row *)0)->name), flags},
#define ROUND_FIELD(name, type, cap, key, flags) FIELD(fm_round_row_t, name, type, cap, key, flags)
#define CLIENT_ROUND_FIELD(name, type, cap, key, flags) FIELD(fm_client_round_row_t, name, type, cap, key, flags)

static const fm_field_t round_fields[] = {FM_ROUND_FIELDS(ROUND_FIELD)};
static const fm_field_t client_round_fields[] = {FM_CLIENT_ROUND_FIELDS(CLIENT_ROUND_FIELD)};

const fm_record_t fm_round_record = {"rounds", round_fields, (int)(sizeof round_fields / sizeof round_fields[0]),
                                     sizeof(fm_round_row_t)};
const fm_record_t fm_client_round_record = {"client_rounds", client_round_fields,
                                            (int)(sizeof client_round_fields / sizeof client_round_fields[0]),
                                            sizeof(fm_client_round_row_t)};

const fm_field_t *fm_record_field(const fm_record_t *r, const char *key)
{
    for (int i = 0; i < r->count; i++)
        if (!strcmp(r->fields[i].key, key))
            return &r->fields[i];
    return NULL;
}

double fm_field_num(const fm_field_t *f, const void *row)
{
    const char *p = (const char *)row + f->offset;
    switch (f->type) {
    case FM_FIELD_INT: return *(const int *)p;
    case FM_FIELD_INT64: return (double)*(const int64_t *)p;
    case FM_FIELD_REAL: return *(const double *)p;
    case FM_FIELD_TEXT: break;
    }
    return NAN;
}

const char *fm_field_text(const fm_field_t *f, const void *row)
{
    return f->type == FM_FIELD_TEXT ? (const char *)row + f->offset : NULL;
}

void fm_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

/* A field's value: JSON (strings quoted, null for what is not finite) or CSV
 * (strings as they are: ids and times hold no commas; empty for not finite). */
static void value(FILE *f, const fm_field_t *fd, const void *row, bool json)
{
    const char *text = fm_field_text(fd, row);
    if (text) {
        if (json)
            fm_json_str(f, text);
        else
            fputs(text, f);
        return;
    }
    double v = fm_field_num(fd, row);
    if (fd->type == FM_FIELD_INT64)
        fprintf(f, "%lld", (long long)*(const int64_t *)((const char *)row + fd->offset));
    else if (isfinite(v))
        fprintf(f, "%.9g", v);
    else if (json)
        fputs("null", f);
}

void fm_record_json(FILE *f, const fm_record_t *r, const void *row, const char *before)
{
    fputc('{', f);
    if (before)
        fputs(before, f);
    for (int i = 0; i < r->count; i++) {
        fprintf(f, "%s\"%s\":", i || before ? "," : "", r->fields[i].key);
        value(f, &r->fields[i], row, true);
    }
    fputc('}', f);
}

void fm_record_csv_header(FILE *f, const fm_record_t *r, const char *first)
{
    if (first)
        fprintf(f, "%s,", first);
    for (int i = 0; i < r->count; i++)
        fprintf(f, "%s%s", i ? "," : "", r->fields[i].key);
    fputc('\n', f);
}

void fm_record_csv(FILE *f, const fm_record_t *r, const void *row, const char *first)
{
    if (first)
        fprintf(f, "%s,", first);
    for (int i = 0; i < r->count; i++) {
        if (i)
            fputc(',', f);
        value(f, &r->fields[i], row, false);
    }
    fputc('\n', f);
}
