/* signals.h - the flags every program shares: SIGTERM and SIGINT set the stop
 * flag, SIGPIPE is ignored; in a daemon SIGHUP sets the reload flag (elsewhere
 * it keeps its default: a closed terminal ends the program). Loops poll them. */
#ifndef FEDMOE_SIGNALS_H
#define FEDMOE_SIGNALS_H

#include <signal.h>

/* The flag, non-zero once SIGTERM or SIGINT arrived (clear it to wait again). */
extern volatile sig_atomic_t fm_stop_requested;
/* Non-zero once SIGHUP arrived (the coordinator rereads its allow-list and
 * clears it). */
extern volatile sig_atomic_t fm_reload_requested;
/* Installs the handlers. */
void fm_signals_install(void);
/* Also takes SIGHUP as "reload" (fedmoe-server). */
void fm_signals_install_reload(void);

#endif
