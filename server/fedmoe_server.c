/* fedmoe-server: the coordinator daemon. Flags and an INI config file (the same
 * names, without the dashes) set the run; SIGTERM / SIGINT stop it cleanly. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator.h"
#include "fedmoe/kernels.h"
#include "fedmoe/log.h"
#include "fedmoe/options.h"
#include "fedmoe/signals.h"

/* The options' defaults: the coordinator's (fm_server_config_default). */
static void defaults(fm_options_t *o, fm_server_config_t *c)
{
    fm_server_config_default(c);
    fm_options_default(o, FM_PROG_SERVER, &c->spec);
    snprintf(o->bind, sizeof o->bind, "%s", c->bind);
    snprintf(o->db, sizeof o->db, "%s", c->db);
    o->rounds = c->rounds;
    o->min_clients = c->min_clients;
    o->fraction = c->fraction;
    o->round_timeout = c->round_timeout;
    o->client_timeout = c->client_timeout;
    o->new_run = c->new_run;
    o->max_message = c->max_message;
}

static void to_config(const fm_options_t *o, fm_server_config_t *c)
{
    snprintf(c->bind, sizeof c->bind, "%s", o->bind);
    snprintf(c->db, sizeof c->db, "%s", o->db);
    c->rounds = o->rounds;
    c->min_clients = o->min_clients;
    c->fraction = o->fraction;
    c->round_timeout = o->round_timeout;
    c->client_timeout = o->client_timeout;
    c->new_run = o->new_run;
    c->max_message = o->max_message;
}

static void usage(FILE *f)
{
    static const char *const titles[FM_OPT_GROUPS] = {
        [FM_OPT_G_DATA] = "data (clients that ask are assigned partitions of this):",
        [FM_OPT_G_MODEL] = "model and training (sent to every client):",
    };
    fm_server_config_t c;
    fm_options_t o;
    defaults(&o, &c);
    fprintf(f, "usage: fedmoe-server [options]\n"
               "\n"
               "The fedmoe coordinator: registers clients, runs rounds, aggregates, logs every round\n"
               "to SQLite. Resumes the latest unfinished run in --db when started with the same settings.\n"
               "\n");
    fm_options_usage(&o, f, titles);
}

int main(int argc, char **argv)
{
    fm_server_config_t cfg;
    fm_options_t o;
    defaults(&o, &cfg);
    if (fm_options_parse(&o, argc, argv) != FM_OK) {
        fprintf(stderr, "fedmoe-server: %s\n", fm_error_last());
        return 2;
    }
    if (o.help) {
        usage(stdout);
        return 0;
    }
    if (o.verbose)
        fm_log_set_level(FM_LOG_DEBUG);
    to_config(&o, &cfg);
    fm_kernels_set_threads(1);
    fm_signals_install();
    fm_status st = fm_coordinator_run(&cfg, &fm_stop_requested);
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
