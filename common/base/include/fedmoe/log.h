/* log.h - timestamped, levelled log lines on stderr; plus the last error text.
 *
 * Library functions that fail with FM_ERR_* also record a one-line reason with
 * fm_error_set(); programs print it with fm_error_last(). */
#ifndef FEDMOE_LOG_H
#define FEDMOE_LOG_H

#include <stdbool.h>

typedef enum { FM_LOG_DEBUG, FM_LOG_INFO, FM_LOG_WARN, FM_LOG_ERROR } fm_log_level;

/* Lines below level are not written (default INFO). */
void fm_log_set_level(fm_log_level level);
/* One line on stderr: UTC time, level, the message with control characters
 * written as \xNN. */
void fm_log(fm_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Lines written since the program started (all threads; tests of log floods). */
unsigned long fm_log_lines(void);

#define fm_debug(...) fm_log(FM_LOG_DEBUG, __VA_ARGS__)
#define fm_info(...)  fm_log(FM_LOG_INFO, __VA_ARGS__)
#define fm_warn(...)  fm_log(FM_LOG_WARN, __VA_ARGS__)
#define fm_errorf(...) fm_log(FM_LOG_ERROR, __VA_ARGS__)

/* A limit on the lines one source logs: at most per_second in a second; the
 * rest are counted, and the count is logged ("N more WHAT in the last second
 * were not logged") once the second is over. Zero-initialise. */
typedef struct {
    double second;   /* when the current second began (monotonic seconds) */
    int used, dropped;
} fm_log_limit_t;
/* Whether a line may be written at now; ends an elapsed second first. */
bool fm_log_limit_take(fm_log_limit_t *l, double now, int per_second, const char *what);
/* Ends the second if it has elapsed (call it now and then: a flood that stopped
 * still gets its count logged). */
void fm_log_limit_flush(fm_log_limit_t *l, double now, const char *what);

/* Records the reason for the error being returned (thread-local), control
 * characters written as \xNN so it stays one line. */
void fm_error_set(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The last recorded reason, or "" if none. Valid until the next fm_error_set. */
const char *fm_error_last(void);

#endif
