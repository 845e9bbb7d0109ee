#include "fedmoe/log.h"

#include "fedmoe/clock.h"

#include <stdarg.h>
#include <stdio.h>

static fm_log_level g_level = FM_LOG_INFO;
static _Thread_local char g_error[512];

void fm_log_set_level(fm_log_level level) { g_level = level; }

void fm_log(fm_log_level level, const char *fmt, ...)
{
    static const char *names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
    if (level < g_level)
        return;
    char stamp[32];
    fm_clock_utc(stamp);
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s %-5s %s\n", stamp, names[level], line);
}

void fm_error_set(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_error, sizeof g_error, fmt, ap);
    va_end(ap);
}

const char *fm_error_last(void) { return g_error; }
