#include "fedmoe/signals.h"

#include <stddef.h>

volatile sig_atomic_t fm_stop_requested = 0;
volatile sig_atomic_t fm_reload_requested = 0;

static void on_signal(int sig)
{
    if (sig == SIGHUP)
        fm_reload_requested = 1;
    else
        fm_stop_requested = 1;
}

void fm_signals_install(void)
{
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

void fm_signals_install_reload(void)
{
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGHUP, &sa, NULL);
}
