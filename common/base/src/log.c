#include "fedmoe/log.h"

#include "fedmoe/clock.h"

#include <stdarg.h>
#include <stdio.h>

static fm_log_level g_level = FM_LOG_INFO;
static _Atomic unsigned long g_lines;
static _Thread_local char g_error[512];

void fm_log_set_level(fm_log_level level) { g_level = level; }

/* out = in with control characters written as \xNN (cut to fit cap): one
 * event, one line, so a newline in a peer's id or text cannot forge a log line. */
static void escape_controls(char *out, size_t cap, const char *in)
{
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p && o + 5 < cap; p++) {
        if (*p < 0x20 || *p == 0x7f)
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", *p);
        else
            out[o++] = (char)*p;
    }
    out[o] = 0;
}

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
    char safe[4 * sizeof line];
    escape_controls(safe, sizeof safe, line);
    fprintf(stderr, "%s %-5s %s\n", stamp, names[level], safe);
    g_lines++;
}

unsigned long fm_log_lines(void) { return g_lines; }

void fm_error_set(const char *fmt, ...)
{
    char raw[sizeof g_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    escape_controls(g_error, sizeof g_error, raw);
}

const char *fm_error_last(void) { return g_error; }

void fm_log_limit_flush(fm_log_limit_t *l, double now, const char *what)
{
    if (now < l->second + 1.0)
        return;
    if (l->dropped)
        fm_warn("%d more %s in the last second were not logged", l->dropped, what);
    l->second = now;
    l->used = l->dropped = 0;
}

bool fm_log_limit_take(fm_log_limit_t *l, double now, int per_second, const char *what)
{
    fm_log_limit_flush(l, now, what);
    if (l->used < per_second) {
        l->used++;
        return true;
    }
    l->dropped++;
    return false;
}
