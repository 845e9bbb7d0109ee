/* signals.h - the stop flag every program shares: SIGTERM and SIGINT set it,
 * SIGPIPE is ignored; loops poll it and stop cleanly. */
#ifndef FEDMOE_SIGNALS_H
#define FEDMOE_SIGNALS_H

#include <signal.h>

/* The flag, non-zero once SIGTERM or SIGINT arrived (clear it to wait again). */
extern volatile sig_atomic_t fm_stop_requested;
/* Installs the handlers. */
void fm_signals_install(void);

#endif
