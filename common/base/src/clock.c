#include "fedmoe/clock.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

double fm_clock_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void fm_clock_utc(char out[32])
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char base[24];
    strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, 32, "%.20s.%03dZ", base, (int)(ts.tv_nsec / 1000000) % 1000);
}

fm_status fm_clock_utc_parse(const char *text, char out[32])
{
    /* digits where the pattern has 9, the rest literally */
    static const char full[] = "9999-99-99T99:99:99.999Z", plain[] = "9999-99-99T99:99:99Z";
    size_t n = strlen(text);
    const char *pat = n == sizeof full - 1 ? full : n == sizeof plain - 1 ? plain : NULL;
    for (size_t i = 0; pat && i < n; i++)
        if (pat[i] == '9' ? !isdigit((unsigned char)text[i]) : text[i] != pat[i])
            pat = NULL;
    if (!pat)
        return FM_ERR_ARG;
    snprintf(out, 32, "%.19s.%.3sZ", text, pat == full ? text + 20 : "000");
    return FM_OK;
}
