/* args.h - strict parsing of command-line values, shared by every program.
 *
 * Each parser accepts the whole string or nothing; on failure it records a
 * one-line reason naming the flag (fm_error_last) and returns FM_ERR_ARG. */
#ifndef FEDMOE_ARGS_H
#define FEDMOE_ARGS_H

#include <stdbool.h>

#include "fedmoe/status.h"

/* Flag values: s parsed whole into *out and checked against min..max. On a bad
 * value FM_ERR_ARG with a reason naming flag ("FLAG: 'x' is not an integer",
 * "FLAG: 5 is out of range 1..4"); *out untouched. */
fm_status fm_arg_long(const char *flag, const char *s, long min, long max, long *out);
fm_status fm_arg_int(const char *flag, const char *s, int min, int max, int *out);
fm_status fm_arg_double(const char *flag, const char *s, double min, double max, double *out);
fm_status fm_arg_u64(const char *flag, const char *s, unsigned long long *out);
/* A switch: NULL (a flag given without a value) or true/yes/on/1 is true,
 * false/no/off/0 is false (config files). */
fm_status fm_arg_bool(const char *flag, const char *s, bool *out);
/* One of n names: *out is its index. The reason names them all: "FLAG: 'x' is
 * not a or b", "FLAG: 'x' is not one of a, b, c". */
fm_status fm_arg_choice(const char *flag, const char *s, const char *const *names, int n, int *out);
/* Defines the two functions of an enum whose values are 0..n-1 in the order of
 * the names given: `const char *NAME_FN(TYPE v)`, v's name ("?" out of range,
 * static storage), and `fm_status PARSE_FN(const char *flag, const char *s,
 * TYPE *out)`, its inverse through fm_arg_choice (FM_ERR_ARG with a reason that
 * lists the names). Used once per enum, at file scope. */
#define FM_ARG_ENUM_NAMES(TYPE, NAME_FN, PARSE_FN, ...)                                      \
    static const char *const NAME_FN##_names[] = {__VA_ARGS__};                             \
    enum { NAME_FN##_count = (int)(sizeof NAME_FN##_names / sizeof NAME_FN##_names[0]) };   \
    const char *NAME_FN(TYPE v) { return (unsigned)v < NAME_FN##_count ? NAME_FN##_names[v] : "?"; } \
    fm_status PARSE_FN(const char *flag, const char *s, TYPE *out)                          \
    {                                                                                       \
        int i;                                                                              \
        fm_status st = fm_arg_choice(flag, s, NAME_FN##_names, NAME_FN##_count, &i);        \
        if (st == FM_OK)                                                                    \
            *out = (TYPE)i;                                                                 \
        return st;                                                                          \
    }

/* "I/N" with 0 <= I < N <= max_n. */
fm_status fm_arg_fraction(const char *flag, const char *s, int max_n, int *i, int *n);

#endif
