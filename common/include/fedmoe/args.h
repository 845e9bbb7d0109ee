/* args.h - strict parsing of command-line values, shared by every program.
 *
 * Each parser accepts the whole string or nothing; on failure it records a
 * one-line reason naming the flag (fm_error_last) and returns FM_ERR_ARG. */
#ifndef FEDMOE_ARGS_H
#define FEDMOE_ARGS_H

#include <stdbool.h>

#include "fedmoe/status.h"

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
/* "I/N" with 0 <= I < N <= max_n. */
fm_status fm_arg_fraction(const char *flag, const char *s, int max_n, int *i, int *n);

#endif
