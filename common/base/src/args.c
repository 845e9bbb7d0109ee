#include "fedmoe/args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/log.h"

fm_status fm_arg_long(const char *flag, const char *s, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno == ERANGE) {
        fm_error_set("%s: '%s' is not an integer", flag, s);
        return FM_ERR_ARG;
    }
    if (v < min || v > max) {
        fm_error_set("%s: %ld is out of range %ld..%ld", flag, v, min, max);
        return FM_ERR_ARG;
    }
    *out = v;
    return FM_OK;
}

fm_status fm_arg_int(const char *flag, const char *s, int min, int max, int *out)
{
    long v;
    fm_status st = fm_arg_long(flag, s, min, max, &v);
    if (st == FM_OK)
        *out = (int)v;
    return st;
}

fm_status fm_arg_double(const char *flag, const char *s, double min, double max, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno == ERANGE || !isfinite(v)) {
        fm_error_set("%s: '%s' is not a number", flag, s);
        return FM_ERR_ARG;
    }
    if (v < min || v > max) {
        fm_error_set("%s: %g is out of range %g..%g", flag, v, min, max);
        return FM_ERR_ARG;
    }
    *out = v;
    return FM_OK;
}

fm_status fm_arg_u64(const char *flag, const char *s, unsigned long long *out)
{
    char *end;
    errno = 0;
    if (*s == '-') {
        fm_error_set("%s: '%s' must not be negative", flag, s);
        return FM_ERR_ARG;
    }
    unsigned long long v = strtoull(s, &end, 10);
    if (!*s || *end || errno == ERANGE) {
        fm_error_set("%s: '%s' is not a non-negative integer", flag, s);
        return FM_ERR_ARG;
    }
    *out = v;
    return FM_OK;
}

fm_status fm_arg_bool(const char *flag, const char *s, bool *out)
{
    static const char *yes[] = {"true", "yes", "on", "1"}, *no[] = {"false", "no", "off", "0"};
    if (!s) {
        *out = true;
        return FM_OK;
    }
    for (int i = 0; i < 4; i++) {
        if (strcmp(s, yes[i]) == 0 || strcmp(s, no[i]) == 0) {
            *out = strcmp(s, yes[i]) == 0;
            return FM_OK;
        }
    }
    fm_error_set("%s: '%s' is not true or false", flag, s);
    return FM_ERR_ARG;
}

fm_status fm_arg_fraction(const char *flag, const char *s, int max_n, int *i, int *n)
{
    char *end;
    errno = 0;
    long a = strtol(s, &end, 10);
    if (end == s || *end != '/' || errno) {
        fm_error_set("%s: '%s' is not of the form I/N", flag, s);
        return FM_ERR_ARG;
    }
    const char *t = end + 1;
    long b = strtol(t, &end, 10);
    if (end == t || *end || errno) {
        fm_error_set("%s: '%s' is not of the form I/N", flag, s);
        return FM_ERR_ARG;
    }
    if (b < 1 || b > max_n || a < 0 || a >= b) {
        fm_error_set("%s: '%s' needs 0 <= I < N <= %d", flag, s, max_n);
        return FM_ERR_ARG;
    }
    *i = (int)a;
    *n = (int)b;
    return FM_OK;
}

fm_status fm_arg_choice(const char *flag, const char *s, const char *const *names, int n, int *out)
{
    char list[256] = "";
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            return FM_OK;
        }
        int k = snprintf(list + used, sizeof list - used, "%s%s", i == 0 ? "" : n == 2 ? " or " : ", ", names[i]);
        used += k > 0 && (size_t)k < sizeof list - used ? (size_t)k : 0;
    }
    fm_error_set("%s: '%.40s' is not %s%s", flag, s, n == 2 ? "" : "one of ", list);
    return FM_ERR_ARG;
}
