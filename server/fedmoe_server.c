/* fedmoe-server: the coordinator daemon. Flags and an INI config file (the same
 * names, without the dashes) set the run; SIGTERM / SIGINT stop it cleanly. */
#include <getopt.h>
#include <ini.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator.h"
#include "fedmoe/args.h"
#include "fedmoe/kernels.h"
#include "fedmoe/log.h"
#include "fedmoe/signals.h"


static void usage(FILE *f)
{
    fprintf(f,
            "usage: fedmoe-server [options]\n"
            "\n"
            "The fedmoe coordinator: registers clients, runs rounds, aggregates, logs every round\n"
            "to SQLite. Resumes the latest unfinished run in --db when started with the same settings.\n"
            "\n"
            "  --config FILE         INI file of the options below (key = value, names without dashes);\n"
            "                        flags given after it win\n"
            "  --bind ENDPOINT       ZeroMQ endpoint to bind (default tcp://*:5555)\n"
            "  --db PATH             SQLite round log (default fedmoe.db)\n"
            "  --rounds N            rounds in the run (default 20)\n"
            "  --min-clients N       clients a round needs and its quorum (default 2)\n"
            "  --fraction F          fraction of connected clients per round, 0 < F <= 1 (default 1)\n"
            "  --round-timeout S     seconds a round waits for updates (default 600)\n"
            "  --client-timeout S    seconds without a message (clients send a heartbeat every second,\n"
            "                        also while training) before a client is taken as gone (default 15)\n"
            "  --strategy S          local, fedavg, comigs, pfedmoap or full (default full)\n"
            "  --seed N              run seed (default 1)\n"
            "  --new-run             start a new run even if the latest one is unfinished\n"
            "data (clients that ask are assigned partitions of this):\n"
            "  --dataset SPEC        fmnist (default), fmnist:DIR, idx:IMAGES,LABELS or csv:PATH\n"
            "  --partitions N        number of partitions, i.e. clients (default 10)\n"
            "  --dirichlet ALPHA     Dirichlet label skew (default 0.3)\n"
            "  --pathological S      S classes per client instead\n"
            "  --iid                 uniform partition instead\n"
            "  --holdout             tuning run: clients evaluate on a held-out quarter of their train\n"
            "                        and validation data, never on their test split\n"
            "model and training (sent to every client):\n"
            "  --stem mlp|cnn        (default mlp)\n"
            "  --generalists G       shared experts per block (default 1)\n"
            "  --specialists S       specialists per client, required under fedavg / pfedmoap (default 2)\n"
            "  --local-epochs N      passes over a client's train split per round (default 1)\n"
            "  --tau T               logit scale of the prompt head (default 10)\n"
            "  --batch B             (default 32)\n"
            "  --lr LR               expert learning rate (default 1e-3)\n"
            "  --router-lr LR        router learning rate (default 1e-3)\n"
            "  --lr-schedule S       constant, or cosine: both rates decay over the rounds\n"
            "                        from 1x to 0.05x (default cosine)\n"
            "  --expert-steps N      T_e (default 30)\n"
            "  --router-steps N      T_r (default 10)\n"
            "  --weight-decay W      AdamW weight decay of the lower level's matrices (default 1e-4)\n"
            "  --anchor A            after each expert step, specialists move lr x A of the way toward\n"
            "                        their block's mean generalist, where specialists stay local\n"
            "                        (local, comigs, full); 0 turns it off (default 20)\n"
            "  --max-message BYTES   largest message accepted (default: twice the model, plus 1 MiB)\n"
            "  -v, --verbose         debug logging\n"
            "  -h, --help            this text\n");
}

/* Applies one option by its long name; used by the flags and the config file. */
static fm_status apply(fm_server_config_t *c, const char *name, const char *v)
{
    fm_run_spec_t *s = &c->spec;
    double dv;
    long lv;
    unsigned long long uv;
    fm_status st = FM_OK;
    char flag[64];
    snprintf(flag, sizeof flag, "--%s", name);
    if (!strcmp(name, "bind"))
        snprintf(c->bind, sizeof c->bind, "%s", v);
    else if (!strcmp(name, "db"))
        snprintf(c->db, sizeof c->db, "%s", v);
    else if (!strcmp(name, "rounds"))
        st = fm_arg_int(flag, v, 1, 1000000, &c->rounds);
    else if (!strcmp(name, "min-clients") || !strcmp(name, "min_clients"))
        st = fm_arg_int(flag, v, 1, 100000, &c->min_clients);
    else if (!strcmp(name, "fraction"))
        st = fm_arg_double(flag, v, 1e-6, 1.0, &c->fraction);
    else if (!strcmp(name, "round-timeout") || !strcmp(name, "round_timeout"))
        st = fm_arg_double(flag, v, 0.001, 1e7, &c->round_timeout);
    else if (!strcmp(name, "client-timeout") || !strcmp(name, "client_timeout"))
        st = fm_arg_double(flag, v, 0.5, 1e7, &c->client_timeout);
    else if (!strcmp(name, "strategy"))
        st = fm_strategy_parse(v, &s->strategy);
    else if (!strcmp(name, "seed")) {
        if ((st = fm_arg_u64(flag, v, &uv)) == FM_OK)
            s->seed = uv;
    } else if (!strcmp(name, "new-run") || !strcmp(name, "new_run"))
        st = fm_arg_bool(flag, v, &c->new_run);
    else if (!strcmp(name, "dataset"))
        snprintf(s->dataset, sizeof s->dataset, "%s", v);
    else if (!strcmp(name, "partitions"))
        st = fm_arg_int(flag, v, 1, 100000, &s->partition_count);
    else if (!strcmp(name, "dirichlet")) {
        st = fm_arg_double(flag, v, 1e-4, 1e4, &s->part.alpha);
        s->part.kind = FM_PARTITION_DIRICHLET;
    } else if (!strcmp(name, "pathological")) {
        st = fm_arg_int(flag, v, 1, 256, &s->part.classes_per_client);
        s->part.kind = FM_PARTITION_PATHOLOGICAL;
    } else if (!strcmp(name, "iid"))
        s->part.kind = FM_PARTITION_IID;
    else if (!strcmp(name, "holdout"))
        st = fm_arg_bool(flag, v, &s->holdout);
    else if (!strcmp(name, "stem"))
        st = fm_stem_parse(flag, v, &s->model.stem);
    else if (!strcmp(name, "generalists"))
        st = fm_arg_int(flag, v, 0, 64, &s->model.generalists);
    else if (!strcmp(name, "specialists"))
        st = fm_arg_int(flag, v, 0, 63, &s->model.specialists);
    else if (!strcmp(name, "local-epochs") || !strcmp(name, "local_epochs"))
        st = fm_arg_int(flag, v, 1, 1000, &s->local_epochs);
    else if (!strcmp(name, "tau")) {
        st = fm_arg_double(flag, v, 0.01, 1000.0, &dv);
        s->model.tau = (float)dv;
    } else if (!strcmp(name, "lr-schedule") || !strcmp(name, "lr_schedule"))
        st = fm_lr_schedule_parse(flag, v, &s->lr_schedule);
    else if (!strcmp(name, "batch"))
        st = fm_arg_int(flag, v, 1, 65536, &s->train.batch);
    else if (!strcmp(name, "lr")) {
        st = fm_arg_double(flag, v, 0.0, 10.0, &dv);
        s->train.lower.lr = (float)dv;
    } else if (!strcmp(name, "router-lr") || !strcmp(name, "router_lr")) {
        st = fm_arg_double(flag, v, 0.0, 10.0, &dv);
        s->train.upper.lr = (float)dv;
    } else if (!strcmp(name, "expert-steps") || !strcmp(name, "expert_steps"))
        st = fm_arg_int(flag, v, 1, 1 << 30, &s->train.expert_steps);
    else if (!strcmp(name, "router-steps") || !strcmp(name, "router_steps"))
        st = fm_arg_int(flag, v, 0, 1 << 30, &s->train.router_steps);
    else if (!strcmp(name, "weight-decay") || !strcmp(name, "weight_decay")) {
        st = fm_arg_double(flag, v, 0.0, 1000.0, &dv);
        s->train.lower.weight_decay = (float)dv;
    } else if (!strcmp(name, "anchor")) {
        st = fm_arg_double(flag, v, 0.0, 1e6, &dv);
        s->train.anchor = (float)dv;
    } else if (!strcmp(name, "max-message") || !strcmp(name, "max_message")) {
        if ((st = fm_arg_long(flag, v, 1024, 1L << 40, &lv)) == FM_OK)
            c->max_message = (size_t)lv;
    } else {
        fm_error_set("unknown option '%s'", name);
        st = FM_ERR_ARG;
    }
    return st;
}

typedef struct {
    fm_server_config_t *cfg;
    const char *path;
    bool failed;
} ini_ctx_t;

static int on_ini(void *user, const char *section, const char *name, const char *value)
{
    (void)section;
    ini_ctx_t *ctx = user;
    if (apply(ctx->cfg, name, value) != FM_OK) {
        ctx->failed = true;
        return 0;
    }
    return 1;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, 0, 'c'}, {"bind", required_argument, 0, 1},
        {"db", required_argument, 0, 1}, {"rounds", required_argument, 0, 1},
        {"min-clients", required_argument, 0, 1}, {"fraction", required_argument, 0, 1},
        {"round-timeout", required_argument, 0, 1}, {"strategy", required_argument, 0, 1},
        {"client-timeout", required_argument, 0, 1},
        {"seed", required_argument, 0, 1}, {"new-run", no_argument, 0, 1},
        {"dataset", required_argument, 0, 1}, {"partitions", required_argument, 0, 1},
        {"dirichlet", required_argument, 0, 1}, {"pathological", required_argument, 0, 1},
        {"iid", no_argument, 0, 1}, {"holdout", no_argument, 0, 1}, {"stem", required_argument, 0, 1},
        {"specialists", required_argument, 0, 1}, {"local-epochs", required_argument, 0, 1},
        {"batch", required_argument, 0, 1}, {"lr", required_argument, 0, 1},
        {"router-lr", required_argument, 0, 1}, {"expert-steps", required_argument, 0, 1},
        {"router-steps", required_argument, 0, 1}, {"max-message", required_argument, 0, 1},
        {"lr-schedule", required_argument, 0, 1}, {"tau", required_argument, 0, 1},
        {"generalists", required_argument, 0, 1}, {"weight-decay", required_argument, 0, 1}, {"anchor", required_argument, 0, 1},
        {"verbose", no_argument, 0, 'v'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    fm_server_config_t cfg;
    fm_server_config_default(&cfg);
    /* the config file first, so that flags override it */
    for (int i = 1; i < argc; i++) {
        const char *path = NULL;
        if (!strcmp(argv[i], "--config") && i + 1 < argc)
            path = argv[i + 1];
        else if (!strncmp(argv[i], "--config=", 9))
            path = argv[i] + 9;
        if (path) {
            ini_ctx_t ctx = {&cfg, path, false};
            int rc = ini_parse(path, on_ini, &ctx);
            if (rc < 0) {
                fprintf(stderr, "fedmoe-server: %s: cannot read the config file\n", path);
                return 2;
            }
            if (rc > 0) {
                char why[512];
                snprintf(why, sizeof why, "%s", ctx.failed ? fm_error_last() : "not a valid INI line");
                fm_error_set("%s:%d: %s", path, rc, why);
            }
            if (rc != 0) {
                fprintf(stderr, "fedmoe-server: %s\n", fm_error_last());
                return 2;
            }
        }
    }
    opterr = 0;
    int c, idx = 0;
    while ((c = getopt_long(argc, argv, "vh", opts, &idx)) != -1) {
        switch (c) {
        case 'c': break;
        case 1:
            if (apply(&cfg, opts[idx].name, optarg) != FM_OK) {
                fprintf(stderr, "fedmoe-server: %s\n", fm_error_last());
                return 2;
            }
            break;
        case 'v': fm_log_set_level(FM_LOG_DEBUG); break;
        case 'h': usage(stdout); return 0;
        default: fprintf(stderr, "fedmoe-server: unknown or incomplete option '%s' (see --help)\n", argv[optind - 1]); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "fedmoe-server: unexpected argument '%s' (see --help)\n", argv[optind]);
        return 2;
    }
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
