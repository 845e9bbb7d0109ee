/* log.h - timestamped, levelled log lines on stderr; plus the last error text.
 *
 * Library functions that fail with FM_ERR_* also record a one-line reason with
 * fm_error_set(); programs print it with fm_error_last(). */
#ifndef FEDMOE_LOG_H
#define FEDMOE_LOG_H

typedef enum { FM_LOG_DEBUG, FM_LOG_INFO, FM_LOG_WARN, FM_LOG_ERROR } fm_log_level;

/* Lines below level are not written (default INFO). */
void fm_log_set_level(fm_log_level level);
/* One line on stderr: UTC time, level, the message with control characters
 * written as \xNN. */
void fm_log(fm_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define fm_debug(...) fm_log(FM_LOG_DEBUG, __VA_ARGS__)
#define fm_info(...)  fm_log(FM_LOG_INFO, __VA_ARGS__)
#define fm_warn(...)  fm_log(FM_LOG_WARN, __VA_ARGS__)
#define fm_errorf(...) fm_log(FM_LOG_ERROR, __VA_ARGS__)

/* Records the reason for the error being returned (thread-local), control
 * characters written as \xNN so it stays one line. */
void fm_error_set(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The last recorded reason, or "" if none. Valid until the next fm_error_set. */
const char *fm_error_last(void);

#endif
