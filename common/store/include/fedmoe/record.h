/* record.h - the round log's records described once (store.h's field lists):
 * what the store, fedmoe-history's export and the browser view's API need to
 * know of each field, and the one JSON and CSV writer they share. */
#ifndef FEDMOE_RECORD_H
#define FEDMOE_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "fedmoe/store.h"

typedef enum { FM_FIELD_INT, FM_FIELD_INT64, FM_FIELD_REAL, FM_FIELD_TEXT } fm_field_type;

typedef struct {
    const char *column; /* in the table */
    const char *key;    /* in JSON and CSV */
    fm_field_type type;
    size_t offset, size; /* in the row's struct */
    unsigned flags;      /* FM_FIELD_KEY, FM_FIELD_ADDED */
} fm_field_t;

typedef struct {
    const char *table;
    const fm_field_t *fields;
    int count;
    size_t row_size;
} fm_record_t;

extern const fm_record_t fm_round_record;        /* fm_round_row_t, table rounds */
extern const fm_record_t fm_client_round_record; /* fm_client_round_row_t, table client_rounds */

/* The field with this JSON / CSV key, or NULL. */
const fm_field_t *fm_record_field(const fm_record_t *r, const char *key);
/* A numeric field's value (NaN for text); a text field's text (NULL for numbers). */
double fm_field_num(const fm_field_t *f, const void *row);
const char *fm_field_text(const fm_field_t *f, const void *row);

/* A JSON string, escaped. */
void fm_json_str(FILE *f, const char *s);
/* The row as one JSON object of its fields' keys (numbers %.9g; not finite:
 * null), after the members in `before` when not NULL (already JSON, e.g.
 * "\"run\":\"r1\""). */
void fm_record_json(FILE *f, const fm_record_t *r, const void *row, const char *before);
/* The CSV header of the fields' keys and one row (numbers %.9g; not finite:
 * empty), each after `first` and a comma when not NULL (the run's column). */
void fm_record_csv_header(FILE *f, const fm_record_t *r, const char *first);
void fm_record_csv(FILE *f, const fm_record_t *r, const void *row, const char *first);

#endif
