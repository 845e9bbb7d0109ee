/* clock.h - the two clocks fedmoe reads: monotonic seconds for durations and
 * deadlines, UTC wall time as ISO 8601 for logs and the round log. */
#ifndef FEDMOE_CLOCK_H
#define FEDMOE_CLOCK_H

#include "fedmoe/status.h"

/* Seconds on the monotonic clock (durations, deadlines). */
double fm_clock_seconds(void);
/* UTC now as "YYYY-MM-DDTHH:MM:SS.mmmZ" (24 characters and a NUL). */
void fm_clock_utc(char out[32]);
/* A UTC time given as "YYYY-MM-DDTHH:MM:SS[.mmm]Z" into fm_clock_utc's form in
 * out (so the two compare as strings); FM_ERR_ARG for anything else. */
fm_status fm_clock_utc_parse(const char *text, char out[32]);

#endif
