/* fedmoe-server: the coordinator daemon. Flags and an INI config file (the same
 * names, without the dashes) set the run; SIGTERM / SIGINT stop it cleanly. */
#include <signal.h>
#include <malloc.h>
#include <stdio.h>

#include "coordinator.h"
#include "fedmoe/kernels.h"
#include "fedmoe/log.h"
#include "fedmoe/options.h"
#include "fedmoe/signals.h"

static void defaults(fm_options_t *o, struct fm_run_spec *spec) { fm_options_default(o, FM_PROG_SERVER, spec); }

static const char *const titles[FM_OPT_GROUPS] = {
    [FM_OPT_G_DATA] = "data (clients that ask are assigned partitions of this):",
    [FM_OPT_G_MODEL] = "model and training (sent to every client):",
};

static const fm_program_t program = {
    "fedmoe-server",
    "usage: fedmoe-server [options]\n"
    "\n"
    "The fedmoe coordinator: registers clients, runs rounds, aggregates, logs every round\n"
    "to SQLite. Resumes the latest unfinished run in --db when started with the same settings.\n"
    "\n",
    titles,
    defaults,
};

int main(int argc, char **argv)
{
    static fm_options_t o;
    fm_server_config_t cfg;
    defaults(&o, &cfg.spec);
    int rc = fm_options_main(&o, argc, argv, &program);
    if (rc >= 0)
        return rc;
    fm_server_config_from_options(&o, &cfg);
    /* Messages of a model's size are allocated and freed all the time (by
     * libzmq's I/O thread too): from the heap, reused, rather than mapped and
     * unmapped each time (a page fault per 4 KB, a TLB flush per unmap: a fifth
     * of the I/O thread's time at 1,000 clients) */
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 16 << 20);
    fm_kernels_set_threads(1);
    fm_signals_install();
    fm_signals_install_reload();
    fm_status st = fm_coordinator_run(&cfg, &fm_stop_requested, &fm_reload_requested);
    if (st == FM_ERR_ARG) { /* a configuration the user can fix: one plain line */
        fprintf(stderr, "fedmoe-server: %s\n", fm_error_last());
        return 2;
    }
    if (st != FM_OK) {
        fm_errorf("%s", fm_error_last());
        return 1;
    }
    return 0;
}
