/* options_table.c - the rows of the option table (fedmoe/options.h), the parsers
 * of the values that are not plain numbers, and each program's defaults. */
#include "fedmoe/options.h"

#include <stdio.h>
#include <string.h>

#include "fedmoe/args.h"
#include "fedmoe/log.h"
#include "fedmoe/runspec.h"
#include "fedmoe/id.h"

#define S FM_PROG_SERVER
#define C FM_PROG_CLIENT
#define M FM_PROG_SIM
#define SPEC FM_OPTF_SPEC
#define NOCONF FM_OPTF_NOCONFIG
#define O(field) offsetof(fm_options_t, field), sizeof(((fm_options_t *)0)->field)
#define R(field) offsetof(fm_run_spec_t, field), sizeof(((fm_run_spec_t *)0)->field)

/* A flag without a value (NULL) is on; a config key takes true / false. */
static fm_status flag_on(const char *flag, const char *v, bool *on) { return fm_arg_bool(flag, v, on); }

static fm_status set_strategy(fm_options_t *o, const char *flag, const char *v)
{
    return fm_strategy_parse(flag, v, &o->spec->strategy);
}

static void show_strategy(const fm_options_t *o, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", fm_strategy_name(o->spec->strategy));
}

static fm_status set_stem(fm_options_t *o, const char *flag, const char *v)
{
    return fm_stem_parse(flag, v, &o->spec->model.stem);
}

static void show_stem(const fm_options_t *o, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", fm_stem_name(o->spec->model.stem));
}

static fm_status set_shared(fm_options_t *o, const char *flag, const char *v)
{
    return fm_shared_parse(flag, v, &o->spec->model.shared);
}

static void show_shared(const fm_options_t *o, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", fm_shared_name(o->spec->model.shared));
}

static fm_status set_gating(fm_options_t *o, const char *flag, const char *v)
{
    if (strcmp(v, "local") && strcmp(v, "shared")) {
        fm_error_set("%s: '%s' is not local or shared", flag, v);
        return FM_ERR_ARG;
    }
    o->spec->model.gating_shared = v[0] == 's';
    return FM_OK;
}

static void show_gating(const fm_options_t *o, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", o->spec->model.gating_shared ? "shared" : "local");
}

/* --prompt-pool off: no client is sent its nearest peers' prompts (the
 * model's non-local prompt slots, max_nonlocal, are none); on: the default K. */
static fm_status set_prompt_pool(fm_options_t *o, const char *flag, const char *v)
{
    if (strcmp(v, "on") && strcmp(v, "off")) {
        fm_error_set("%s: '%s' is not on or off", flag, v);
        return FM_ERR_ARG;
    }
    fm_model_config_t d;
    fm_model_config_default(&d);
    o->spec->model.max_nonlocal = strcmp(v, "on") == 0 ? d.max_nonlocal : 0;
    return FM_OK;
}

static void show_prompt_pool(const fm_options_t *o, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", o->spec->model.max_nonlocal > 0 ? "on" : "off");
}

/* --task text: the text model and, unless given, its data (the fortunes, a
 * language a client) and strategy (comigs; the prompt head is the image
 * task's). Flags given before it keep their values; flags after it override. */
static fm_status set_task(fm_options_t *o, const char *flag, const char *v)
{
    fm_model_family_kind k;
    fm_status st = fm_family_parse(flag, v, &k);
    if (st != FM_OK || k == o->spec->model.family)
        return st;
    fm_model_config_t *c = &o->spec->model, keep = *c;
    if (k == FM_FAMILY_IMAGE) {
        fm_model_config_default(c);
    } else {
        fm_model_config_text(c);
        if (!fm_options_given(o, "dataset"))
            snprintf(o->spec->dataset, sizeof o->spec->dataset, "fortunes");
        static const char *const parts[] = {"dirichlet", "client-dirichlet", "pathological", "iid", "partition-by"};
        bool part_given = false;
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
            part_given |= fm_options_given(o, parts[i]);
        if (!part_given) {
            o->spec->part.kind = FM_PARTITION_PATHOLOGICAL;
            o->spec->part.classes_per_client = 1;
        }
        if (!fm_options_given(o, "strategy"))
            o->spec->strategy = FM_STRATEGY_COMIGS;
        /* a round's budget in steps: a pass over a language's text took minutes */
        if (!fm_options_given(o, "local-steps"))
            o->spec->train.local_steps = FM_TEXT_LOCAL_STEPS;
        if (!fm_options_given(o, "batch"))
            o->spec->train.batch = FM_TEXT_BATCH;
        if (!fm_options_given(o, "eval-sample"))
            o->spec->eval_sample = FM_TEXT_EVAL_SAMPLE;
    }
    c->generalists = keep.generalists;
    c->specialists = keep.specialists;
    if (fm_options_given(o, "blocks"))
        c->blocks = keep.blocks;
    if (fm_options_given(o, "width"))
        c->d = keep.d;
    if (fm_options_given(o, "heads"))
        c->heads = keep.heads;
    if (fm_options_given(o, "context"))
        c->context = keep.context;
    c->gating_on_validation = keep.gating_on_validation;
    c->tau = keep.tau;
    c->stem = keep.stem;
    c->shared = keep.shared;
    c->gating_shared = keep.gating_shared;
    return FM_OK;
}

static void show_task(const fm_options_t *o, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", fm_family_name(o->spec->model.family));
}

static fm_status set_partition_by(fm_options_t *o, const char *flag, const char *v)
{
    if (!v || strcmp(v, "language") != 0) {
        fm_error_set("%s: expected 'language' (one language a client), got '%s'", flag, v ? v : "");
        return FM_ERR_ARG;
    }
    o->spec->part.kind = FM_PARTITION_PATHOLOGICAL;
    o->spec->part.classes_per_client = 1;
    return FM_OK;
}

static fm_status set_schedule(fm_options_t *o, const char *flag, const char *v)
{
    return fm_lr_schedule_parse(flag, v, &o->spec->lr_schedule);
}

static void show_schedule(const fm_options_t *o, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", fm_lr_schedule_name(o->spec->lr_schedule));
}

static fm_status set_dp_noise(fm_options_t *o, const char *flag, const char *v)
{
    return fm_dp_noise_parse(flag, v, &o->spec->dp.noise);
}

static void show_dp_noise(const fm_options_t *o, char *buf, size_t cap) { fm_dp_noise_name(o->spec->dp.noise, buf, cap); }

static fm_status set_dp_mode(fm_options_t *o, const char *flag, const char *v)
{
    return fm_dp_mode_parse(flag, v, &o->spec->dp.mode);
}

static void show_dp_mode(const fm_options_t *o, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", fm_dp_mode_name(o->spec->dp.mode));
}

static fm_status set_aggregate(fm_options_t *o, const char *flag, const char *v)
{
    return fm_agg_spec_parse(flag, v, &o->spec->aggregate);
}

static void show_aggregate(const fm_options_t *o, char *buf, size_t cap) { fm_agg_spec_name(&o->spec->aggregate, buf, cap); }

static fm_status set_clip(fm_options_t *o, const char *flag, const char *v)
{
    return fm_clip_norm_parse(flag, v, &o->spec->clip_norm);
}

static void show_clip(const fm_options_t *o, char *buf, size_t cap) { fm_clip_norm_name(o->spec->clip_norm, buf, cap); }

/* The partition scheme: three flags, each choosing the scheme and its parameter. */
/* Either Dirichlet scheme and its concentration. */
static fm_status set_alpha(fm_options_t *o, fm_partition_kind kind, const char *flag, const char *v)
{
    o->spec->part.kind = kind;
    return fm_arg_double(flag, v, 1e-4, 1e4, &o->spec->part.alpha);
}

static fm_status set_dirichlet(fm_options_t *o, const char *flag, const char *v)
{
    return set_alpha(o, FM_PARTITION_DIRICHLET, flag, v);
}

static void show_dirichlet(const fm_options_t *o, char *buf, size_t cap)
{
    snprintf(buf, cap, "%g", o->spec->part.alpha);
}

FM_ARG_ENUM_NAMES(fm_hosting, fm_hosting_name, hosting_parse, "auto", "processes", "virtual")

static fm_status set_hosting(fm_options_t *o, const char *flag, const char *v) { return hosting_parse(flag, v, &o->hosting); }

static void show_hosting(const fm_options_t *o, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", fm_hosting_name(o->hosting));
}

static fm_status set_client_dirichlet(fm_options_t *o, const char *flag, const char *v)
{
    return set_alpha(o, FM_PARTITION_CLIENT_DIRICHLET, flag, v);
}

static fm_status set_pathological(fm_options_t *o, const char *flag, const char *v)
{
    o->spec->part.kind = FM_PARTITION_PATHOLOGICAL;
    return fm_arg_int(flag, v, 1, 256, &o->spec->part.classes_per_client);
}

static fm_status set_iid(fm_options_t *o, const char *flag, const char *v)
{
    bool on;
    fm_status st = flag_on(flag, v, &on);
    if (st == FM_OK && on)
        o->spec->part.kind = FM_PARTITION_IID;
    return st;
}

static fm_status set_client_examples(fm_options_t *o, const char *flag, const char *v)
{
    return fm_cap_parse(flag, v, &o->spec->regime.examples);
}

static void show_client_examples(const fm_options_t *o, char *buf, size_t cap)
{
    fm_cap_name(&o->spec->regime.examples, buf, cap);
}

static fm_status set_client_bytes(fm_options_t *o, const char *flag, const char *v)
{
    return fm_cap_parse(flag, v, &o->spec->regime.bytes);
}

static void show_client_bytes(const fm_options_t *o, char *buf, size_t cap) { fm_cap_name(&o->spec->regime.bytes, buf, cap); }

static fm_status set_domains(fm_options_t *o, const char *flag, const char *v)
{
    return fm_domains_parse(flag, v, &o->spec->regime.domains);
}

static void show_domains(const fm_options_t *o, char *buf, size_t cap) { fm_domains_name(&o->spec->regime.domains, buf, cap); }

static fm_status set_no_gating(fm_options_t *o, const char *flag, const char *v)
{
    bool on;
    fm_status st = flag_on(flag, v, &on);
    if (st == FM_OK && on)
        o->spec->model.gating = false;
    return st;
}

static fm_status set_partition(fm_options_t *o, const char *flag, const char *v)
{
    return fm_arg_fraction(flag, v, 100000, &o->partition_index, &o->partition_count);
}

static fm_status set_id(fm_options_t *o, const char *flag, const char *v)
{
    if (!fm_id_valid(v, strlen(v))) {
        fm_error_set("%s: '%s' must be 1 to 63 of [A-Za-z0-9._-]", flag, v);
        return FM_ERR_ARG;
    }
    snprintf(o->id, sizeof o->id, "%s", v);
    return FM_OK;
}

/* name, short, type, arg, min, max, programs, flags, where, set, show, default text, group, help */
static const fm_option_t table[] = {
    /* the run */
    {"config", 0, FM_OPT_STRING, "FILE", 0, 0, S, NOCONF, O(config), NULL, NULL, "", FM_OPT_G_RUN,
     "INI file of the options below (key = value, names without dashes);\nflags given after it win"},
    {"standalone", 0, FM_OPT_SWITCH, NULL, 0, 0, C, 0, O(standalone), NULL, NULL, NULL, FM_OPT_G_RUN,
     "train on one client's data, or all of it centrally, without a coordinator"},
    {"bind", 0, FM_OPT_STRING, "ENDPOINT", 0, 0, S, 0, O(bind), NULL, NULL, NULL, FM_OPT_G_RUN,
     "ZeroMQ endpoint to bind"},
    {"clients", 0, FM_OPT_INT, "N", 1, 100000, M, 0, O(clients), NULL, NULL, NULL, FM_OPT_G_RUN,
     "clients, one partition each"},
    {"hosting", 0, FM_OPT_CUSTOM, "MODE", 0, 0, M, 0, 0, 0, set_hosting, show_hosting, NULL, FM_OPT_G_RUN,
     "processes (a fedmoe-client each), virtual (hosts of many\n"
     "clients: fedmoe-client --virtual) or auto (processes up to " FM_XSTR(FM_SIM_PROCESSES_MAX) ")"},
    {"rounds", 0, FM_OPT_INT, "N", 1, 1000000, S | M, 0, O(rounds), NULL, NULL, NULL, FM_OPT_G_RUN,
     "rounds in the run"},
    {"min-clients", 0, FM_OPT_INT, "N", 1, 100000, S | M, 0, O(min_clients), NULL, NULL, NULL, FM_OPT_G_RUN,
     "clients a round needs and its quorum (fedmoe-sim: the\n"
     "--fraction of --clients, at least 1)"},
    {"fraction", 0, FM_OPT_DOUBLE, "F", 1e-6, 1.0, S | M, 0, O(fraction), NULL, NULL, NULL, FM_OPT_G_RUN,
     "fraction of connected clients per round, 0 < F <= 1"},
    {"round-timeout", 0, FM_OPT_DOUBLE, "S", 0.001, 1e7, S | M, 0, O(round_timeout), NULL, NULL, NULL, FM_OPT_G_RUN,
     "seconds a round waits for updates"},
    {"client-timeout", 0, FM_OPT_DOUBLE, "S", 0.5, 1e7, S, 0, O(client_timeout), NULL, NULL, NULL, FM_OPT_G_RUN,
     "seconds without a message (clients send a heartbeat every\n"
     "quarter of it, 1-5 s apart, also while training) before a\n"
     "client is taken as gone"},
    {"partition-lease", 0, FM_OPT_DOUBLE, "S", 1.0, 1e7, S, 0, O(partition_lease), NULL, NULL, NULL, FM_OPT_G_RUN,
     "seconds a client gone keeps its partition; then another\n"
     "client may be given it"},
    {"task", 0, FM_OPT_CUSTOM, "image|text", 0, 0, S | C | M, 0, 0, 0, set_task, show_task, NULL, FM_OPT_G_RUN,
     "image classification (Fashion-MNIST), or text: a byte-level\n"
     "language model, the fortunes in eight languages, one a client,\n"
     "strategy comigs (local and fedavg too)"},
    {"strategy", 0, FM_OPT_CUSTOM, "S", 0, 0, S | M, 0, 0, 0, set_strategy, show_strategy, NULL, FM_OPT_G_RUN,
     "local, fedavg, comigs, pfedmoap or full"},
    {"seed", 0, FM_OPT_U64, "N", 0, 0, S | C | M, SPEC, R(seed), NULL, NULL, NULL, FM_OPT_G_RUN, "run seed: the initial model, the batch order, the choice of\n"
     "participants and (unless --data-seed) the data"},
    {"data-seed", 0, FM_OPT_U64, "N", 0, 0, S | C | M, SPEC, R(data_seed), NULL, NULL, "the run seed", FM_OPT_G_RUN,
     "seed of which examples each client holds (partition, splits,\n"
     "caps, domains, label maps) apart from the rest, so that runs can\n"
     "differ in training seed on one partition"},
    {"db", 0, FM_OPT_STRING, "PATH", 0, 0, S | M, 0, O(db), NULL, NULL, NULL, FM_OPT_G_RUN,
     "SQLite round log"},
    {"new-run", 0, FM_OPT_SWITCH, NULL, 0, 0, S, 0, O(new_run), NULL, NULL, NULL, FM_OPT_G_RUN,
     "start a new run even if the latest one is unfinished"},
    /* security */
    {"key", 0, FM_OPT_STRING, "FILE", 0, 0, S | C, 0, O(key), NULL, NULL, "", FM_OPT_G_FEDERATED,
     "this program's CURVE key pair (ID.key from fedmoe-keygen; mode 0600);\n"
     "a client's id is the key's id"},
    {"allow", 0, FM_OPT_STRING, "DIR", 0, 0, S, 0, O(allow), NULL, NULL, "", FM_OPT_G_FEDERATED,
     "folder of the public keys (ID.pub) of the clients allowed to join;\n"
     "reread on SIGHUP (a removed key is refused from then on)"},
    {"server-key", 0, FM_OPT_STRING, "FILE", 0, 0, C, 0, O(server_key), NULL, NULL, "", FM_OPT_G_FEDERATED,
     "the coordinator's public key (its .pub): talk to no one else"},
    {"insecure", 0, FM_OPT_SWITCH, NULL, 0, 0, S | C | M, 0, O(insecure), NULL, NULL, NULL, FM_OPT_G_FEDERATED,
     "no encryption and no authentication (plain ZeroMQ): only on a\n"
     "trusted network; warned at every start"},
    /* a client of a coordinator */
    {"connect", 0, FM_OPT_STRING, "ENDPOINT", 0, 0, C, 0, O(connect), NULL, NULL, NULL, FM_OPT_G_FEDERATED,
     "coordinator"},
    {"id", 0, FM_OPT_CUSTOM, "ID", 0, 0, C, 0, 0, 0, set_id, NULL, "HOST-PID", FM_OPT_G_FEDERATED,
     "client id, [A-Za-z0-9._-]{1,63}"},
    {"state-dir", 0, FM_OPT_STRING, "DIR", 0, 0, C, 0, O(state_dir), NULL, NULL, NULL, FM_OPT_G_FEDERATED,
     "keep local state there, to continue after a restart"},
    {"connect-timeout", 0, FM_OPT_DOUBLE, "S", 0.0, 1e7, C, 0, O(connect_timeout), NULL, NULL, "wait",
     FM_OPT_G_FEDERATED, "give up if no welcome within S seconds (at the start, and after the\n"
     "coordinator stopped mid-run)"},
    {"virtual", 0, FM_OPT_INT, "N", 0, 100000, C, 0, O(virtual_clients), NULL, NULL, "one client", FM_OPT_G_FEDERATED,
     "host N clients in this process (with --partition I/N client i\n"
     "takes partition I + i and is ID-NNNNN, NNNNN = I + i; keys\n"
     "ID-NNNNN.key in --keys):\n"
     "one dataset copy, at most --workers training at once"},
    {"keys", 0, FM_OPT_STRING, "DIR", 0, 0, C, 0, O(keys), NULL, NULL, "", FM_OPT_G_FEDERATED,
     "the key pairs of the --virtual clients"},
    {"workers", 0, FM_OPT_INT, "W", 0, 4096, C, 0, O(workers), NULL, NULL, "the cores", FM_OPT_G_FEDERATED,
     "--virtual clients training at once"},
    /* data */
    {"dataset", 0, FM_OPT_STRING, "SPEC", 0, 0, S | C | M, SPEC, R(dataset), NULL, NULL, NULL, FM_OPT_G_DATA,
     "fmnist, fmnist:DIR, idx:IMAGES,LABELS, csv:PATH; text:\n"
     "fortunes, fortunes:LANG,... (en de es it pl ru cs pt bg eo ga),\n"
     "manpages, manpages:LANG,... (en de es it pl ru cs pt fr),\n"
     "sources joined by + (fortunes:en+manpages:en: a label each),\n"
     "or text:DIR (a UTF-8 file a document, a subfolder a language)"},
    {"partitions", 0, FM_OPT_INT, "N", 1, 100000, S, SPEC, R(partition_count), NULL, NULL, NULL, FM_OPT_G_DATA,
     "number of partitions, i.e. clients"},
    {"partition", 0, FM_OPT_CUSTOM, "I/N", 0, 0, C, 0, 0, 0, set_partition, NULL, "", FM_OPT_G_DATA,
     "train partition I of N (standalone default: all data;\n"
     "federated default: the coordinator assigns one)"},
    {"dirichlet", 0, FM_OPT_CUSTOM, "ALPHA", 0, 0, S | C | M, 0, 0, 0, set_dirichlet, show_dirichlet, NULL,
     FM_OPT_G_DATA, "Dirichlet label skew"},
    {"min-examples", 0, FM_OPT_SIZE, "N", 1, 1e6, S | C | M, SPEC, R(part.min_samples), NULL, NULL, NULL,
     FM_OPT_G_DATA, "--dirichlet: every client gets at least N examples"},
    {"client-dirichlet", 0, FM_OPT_CUSTOM, "ALPHA", 0, 0, S | C | M, 0, 0, 0, set_client_dirichlet, NULL, "",
     FM_OPT_G_DATA, "client-wise Dirichlet label skew instead: every client\n"
     "N/clients examples, its class mix drawn (for thousands)"},
    {"pathological", 0, FM_OPT_CUSTOM, "S", 0, 0, S | C | M, 0, 0, 0, set_pathological, NULL, "", FM_OPT_G_DATA,
     "S classes per client instead"},
    {"partition-by", 0, FM_OPT_CUSTOM, "language", 0, 0, S | C | M, 0, 0, 0, set_partition_by, NULL, "", FM_OPT_G_DATA,
     "text: one language a client (several clients a language\n"
     "when there are more clients than languages)"},
    {"iid", 0, FM_OPT_CUSTOM, NULL, 0, 0, S | C | M, 0, 0, 0, set_iid, NULL, "", FM_OPT_G_DATA,
     "uniform random partition instead"},
    {"holdout", 0, FM_OPT_SWITCH, NULL, 0, 0, S | M, SPEC, R(holdout), NULL, NULL, NULL, FM_OPT_G_DATA,
     "tuning run: clients evaluate on a held-out quarter of their train\n"
     "and validation data, never on their test split"},
    {"client-examples", 0, FM_OPT_CUSTOM, "N|A,B,..|A..B", 0, 0, S | C | M, 0, 0, 0, set_client_examples,
     show_client_examples, NULL, FM_OPT_G_DATA,
     "images: cap each client's train + validation examples (its\n"
     "test split stays whole): N for all, a list (client i takes the\n"
     "(i mod n)th) or a log-uniform range A..B drawn per client; off"},
    {"client-bytes", 0, FM_OPT_CUSTOM, "B|A,B,..|A..B", 0, 0, S | C | M, 0, 0, 0, set_client_bytes, show_client_bytes,
     NULL, FM_OPT_G_DATA, "text: the same cap in bytes (whole documents)"},
    {"domains", 0, FM_OPT_CUSTOM, "LIST", 0, 0, S | C | M, 0, 0, 0, set_domains, show_domains, NULL, FM_OPT_G_DATA,
     "images: client i's pixels transformed by the (i mod n)th of\n"
     "identity, rotate90, rotate180, rotate270, invert, blur, noise,\n"
     "patches; presets rotate (the four turns) and all; off"},
    {"concept-groups", 0, FM_OPT_INT, "G", 0, FM_CONCEPT_GROUPS_MAX, S | C | M, SPEC, R(regime.concept_groups), NULL,
     NULL, "off", FM_OPT_G_DATA,
     "images: client i relabels its classes by group (i mod G)'s\n"
     "permutation (group 0 keeps them; the others move every class)"},
    /* the model */
    {"stem", 0, FM_OPT_CUSTOM, "mlp|cnn", 0, 0, S | C | M, 0, 0, 0, set_stem, show_stem, NULL, FM_OPT_G_MODEL,
     "the stem"},
    {"shared", 0, FM_OPT_CUSTOM, "all|experts", 0, 0, S | M, 0, 0, 0, set_shared, show_shared, NULL, FM_OPT_G_MODEL,
     "what comigs and full average besides the generalist experts: all\n"
     "(stem or embeddings, attention, norms) or experts (nothing: those\n"
     "stay on each client; with comigs or full only)"},
    {"gating", 0, FM_OPT_CUSTOM, "local|shared", 0, 0, S | M, 0, 0, 0, set_gating, show_gating, NULL,
     FM_OPT_G_MODEL, "pfedmoap and full: where the prompt gating network lives: local\n"
     "(each client's own, as pFedMoAP) or shared (averaged with the\n"
     "shared group: for clients with little data of one task)"},
    {"prompt-pool", 0, FM_OPT_CUSTOM, "on|off", 0, 0, S | M, 0, 0, 0, set_prompt_pool, show_prompt_pool, NULL,
     FM_OPT_G_MODEL, "pfedmoap and full: send each client its nearest peers'\n"
     "prompts as frozen experts (on), or only the averaged\n"
     "global prompt (off: nothing of one client reaches another,\n"
     "so --secure-aggregation and --dp-noise can take them)"},
    {"context", 0, FM_OPT_INT, "T", 1, 4096, S | C | M, SPEC, R(model.context), NULL, NULL, FM_XSTR(FM_TEXT_CONTEXT), FM_OPT_G_MODEL,
     "text: bytes of context"},
    {"generalists", 0, FM_OPT_INT, "G", 0, 64, S | C | M, SPEC, R(model.generalists), NULL, NULL, NULL,
     FM_OPT_G_MODEL, "shared (generalist) experts per block"},
    {"specialists", 0, FM_OPT_INT, "S", 0, 63, S | C | M, SPEC, R(model.specialists), NULL, NULL, NULL,
     FM_OPT_G_MODEL, "specialist experts per block of each client; fedavg and pfedmoap\n"
     "need the same count on every client"},
    {"width", 0, FM_OPT_INT, "D", 2, 4096, S | C | M, SPEC, R(model.d), NULL, NULL, NULL, FM_OPT_G_MODEL,
     "model width d (image and text)"},
    {"heads", 0, FM_OPT_INT, "H", 1, 256, S | C | M, SPEC, R(model.heads), NULL, NULL, "", FM_OPT_G_MODEL,
     "attention heads, dividing the width: text: self-attention\n"
     "(default " FM_XSTR(FM_TEXT_HEADS) "); image: the prompt gating (default " FM_XSTR(FM_IMAGE_HEADS) ")"},
    {"blocks", 0, FM_OPT_INT, "L", 0, 64, S | C | M, SPEC, R(model.blocks), NULL, NULL, NULL, FM_OPT_G_MODEL,
     "blocks (image: MoE blocks; text: attention + MoE blocks)"},
    {"tau", 0, FM_OPT_FLOAT, "T", 0.01, 1000.0, S | C | M, SPEC, R(model.tau), NULL, NULL, NULL, FM_OPT_G_MODEL,
     "logit scale of the prompt head"},
    {"no-gating", 0, FM_OPT_CUSTOM, NULL, 0, 0, C, 0, 0, 0, set_no_gating, NULL, "", FM_OPT_G_MODEL,
     "no attention gating (plain local logits)"},
    {"gating-on-validation", 0, FM_OPT_SWITCH, NULL, 0, 0, C, SPEC, R(model.gating_on_validation), NULL, NULL,
     NULL, FM_OPT_G_MODEL, "train the gating in the upper (validation) level"},
    /* training */
    {"local-steps", 0, FM_OPT_INT, "N", 0, 1 << 30, S | M, SPEC, R(train.local_steps), NULL, NULL, NULL,
     FM_OPT_G_TRAIN, "a round trains exactly N lower steps (batches), passes after\n"
     "passes; 0: --local-epochs passes (text: " FM_XSTR(FM_TEXT_LOCAL_STEPS) ")"},
    {"eval-sample", 0, FM_OPT_INT, "N", 0, 1 << 30, S | M, SPEC, R(eval_sample), NULL, NULL, NULL, FM_OPT_G_TRAIN,
     "rounds before the last evaluate only N evenly spaced examples\n"
     "(text: windows) of each test and validation split; the last\n"
     "round evaluates them whole; 0: always whole (text: " FM_XSTR(FM_TEXT_EVAL_SAMPLE) ")"},
    {"local-epochs", 0, FM_OPT_INT, "N", 1, 1000, S | M, SPEC, R(local_epochs), NULL, NULL, NULL, FM_OPT_G_TRAIN,
     "passes over a client's train split per round"},
    {"epochs", 0, FM_OPT_INT, "N", 0, 1000000, C, 0, O(epochs), NULL, NULL, NULL, FM_OPT_G_TRAIN,
     "passes over the train split"},
    {"batch", 0, FM_OPT_INT, "B", 1, 65536, S | C | M, SPEC, R(train.batch), NULL, NULL, NULL, FM_OPT_G_TRAIN,
     "batch size (text: " FM_XSTR(FM_TEXT_BATCH) " windows)"},
    {"lr", 0, FM_OPT_FLOAT, "LR", 0.0, 10.0, S | C | M, SPEC, R(train.lower.lr), NULL, NULL, NULL, FM_OPT_G_TRAIN,
     "expert learning rate"},
    {"router-lr", 0, FM_OPT_FLOAT, "LR", 0.0, 10.0, S | C | M, SPEC, R(train.upper.lr), NULL, NULL, NULL,
     FM_OPT_G_TRAIN, "router learning rate"},
    {"lr-schedule", 0, FM_OPT_CUSTOM, "S", 0, 0, S | M, 0, 0, 0, set_schedule, show_schedule, NULL, FM_OPT_G_TRAIN,
     "constant, or cosine: both rates decay over the rounds\nfrom 1x to 0.05x"},
    {"schedule", 0, FM_OPT_CUSTOM, "S", 0, 0, C, 0, 0, 0, set_schedule, show_schedule, NULL, FM_OPT_G_TRAIN,
     "cosine or constant learning rate over the epochs"},
    {"expert-steps", 0, FM_OPT_INT, "N", 1, 1 << 30, S | C | M, SPEC, R(train.expert_steps), NULL, NULL, NULL,
     FM_OPT_G_TRAIN, "T_e, lower-level (expert) steps per cycle"},
    {"router-steps", 0, FM_OPT_INT, "N", 0, 1 << 30, S | C | M, SPEC, R(train.router_steps), NULL, NULL, NULL,
     FM_OPT_G_TRAIN, "T_r, upper-level (router) steps per cycle; 0 = none"},
    {"weight-decay", 0, FM_OPT_FLOAT, "W", 0.0, 1000.0, S | M, SPEC, R(train.lower.weight_decay), NULL, NULL, NULL,
     FM_OPT_G_TRAIN, "AdamW weight decay of the experts' matrices"},
    {"anchor", 0, FM_OPT_FLOAT, "A", 0.0, 1e6, S | M, SPEC, R(train.anchor), NULL, NULL, NULL, FM_OPT_G_TRAIN,
     "after each expert step, specialists move lr x A of the way toward\n"
     "their block's mean generalist, where specialists stay local\n"
     "(local, comigs, full); 0 turns it off"},
    {"threads", 0, FM_OPT_INT, "N", 1, 256, C, 0, O(threads), NULL, NULL, NULL, FM_OPT_G_TRAIN, "OpenBLAS threads"},
    /* the rest */
    {"aggregate", 0, FM_OPT_CUSTOM, "RULE", 0, 0, S | M, 0, 0, 0, set_aggregate, show_aggregate, NULL, FM_OPT_G_RUN,
     "how the averaged groups are combined: mean (weighted),\n"
     "median or trimmed-mean:F (coordinate-wise, unweighted;\n"
     "F of the updates cut at each end, e.g. 0.2)"},
    {"clip-norm", 0, FM_OPT_CUSTOM, "C", 0, 0, S | M, 0, 0, 0, set_clip, show_clip, NULL, FM_OPT_G_RUN,
     "bound each update's L2 distance from the state it was\n"
     "sent: a number, off, or auto (2x the lower median distance\n"
     "of the previous round's updates; in round 1, of its own);\n"
     "with --secure-aggregation a number is each client's bound\n"
     "on its own update, and auto is off"},
    {"secure-aggregation", 0, FM_OPT_SWITCH, NULL, 0, 0, S | M, SPEC, R(secure_aggregation), NULL, NULL, NULL,
     FM_OPT_G_RUN,
     "updates travel masked (Bonawitz et al.): the coordinator\n"
     "learns only their sum, whoever drops (fedavg, comigs;\n"
     "pfedmoap and full with --prompt-pool off; mean);\n"
     "--clip-norm C is then each client's bound on its\n"
     "own update, and --dp-noise needs --dp-mode distributed"},
    {"dp-noise", 0, FM_OPT_CUSTOM, "Z", 0, 0, S | M, 0, 0, 0, set_dp_noise, show_dp_noise, NULL, FM_OPT_G_RUN,
     "client-level differential privacy: Gaussian noise of\n"
     "standard deviation Z x C on the sum of the updates, each\n"
     "clipped to --dp-clip C, equal weights (fedavg, comigs;\n"
     "pfedmoap and full with --prompt-pool off; mean); 0 = off;\n"
     "auto: the least noise that spends\n"
     "--dp-epsilon-budget over the run's rounds"},
    {"dp-clip", 0, FM_OPT_DOUBLE, "C", 0.0, 1e9, S | M, SPEC, R(dp.clip), NULL, NULL, NULL, FM_OPT_G_RUN,
     "with --dp-noise: the bound on each client's update (the\n"
     "L2 distance from the state it was sent, every averaged\n"
     "value together)"},
    {"dp-delta", 0, FM_OPT_DOUBLE, "D", 1e-300, 0.999999, S | M, SPEC, R(dp.delta), NULL, NULL, NULL, FM_OPT_G_RUN,
     "the delta of the (epsilon, delta) the round log reports"},
    {"dp-mode", 0, FM_OPT_CUSTOM, "M", 0, 0, S | M, 0, 0, 0, set_dp_mode, show_dp_mode, NULL, FM_OPT_G_RUN,
     "central (the coordinator clips and adds the noise) or\n"
     "distributed (with --secure-aggregation: each client clips\n"
     "its own update and adds its share of the noise)"},
    {"dp-epsilon-budget", 0, FM_OPT_DOUBLE, "E", 0.0, 1e6, S | M, SPEC, R(dp.budget), NULL, NULL, NULL,
     FM_OPT_G_RUN, "end the run before the round that would spend more\nthan epsilon E; 0 = no budget"},
    {"max-weight", 0, FM_OPT_U64, "N", 1, (double)(1ull << 29), S, 0, O(max_weight), NULL, NULL,
     "the largest partition", FM_OPT_G_RUN,
     "the averaging weight a client on data of its own may\nclaim (its declared training examples, capped);\n"
     "clients on the run's dataset weigh their partition's\ntraining examples, which the coordinator computes"},
    {"max-connections", 0, FM_OPT_INT, "N", 1, 1 << 24, S, 0, O(max_connections), NULL, NULL,
     "twice the partitions, plus 64", FM_OPT_G_RUN,
     "connections held at once; more are shut at once\n(never above the file-descriptor limit)"},
    {"max-message", 0, FM_OPT_SIZE, "BYTES", 1024, (double)(1LL << 40), S, 0, O(max_message), NULL, NULL,
     "twice the model, plus 1 MiB", FM_OPT_G_RUN,
     "largest message accepted (with --secure-aggregation the\ndefault counts a masked update: 16 bytes a value)"},
    {"port", 0, FM_OPT_INT, "P", 1, 65535, M, 0, O(port), NULL, NULL, "a free one", FM_OPT_G_END,
     "loopback port of the coordinator"},
    {"workdir", 0, FM_OPT_STRING, "DIR", 0, 0, M, 0, O(workdir), NULL, NULL, "a new folder in /tmp", FM_OPT_G_END,
     "logs and client state"},
    {"verbose", 'v', FM_OPT_SWITCH, NULL, 0, 0, S | C, 0, O(verbose), NULL, NULL, NULL, FM_OPT_G_END,
     "debug logging"},
    {"help", 'h', FM_OPT_SWITCH, NULL, 0, 0, S | C | M, NOCONF, O(help), NULL, NULL, NULL, FM_OPT_G_END,
     "this text"},
};

const fm_option_t *fm_options_table(size_t *n)
{
    *n = sizeof table / sizeof table[0];
    return table;
}

void fm_options_default(fm_options_t *o, fm_prog prog, struct fm_run_spec *spec)
{
    memset(o, 0, sizeof *o);
    o->prog = prog;
    o->spec = spec;
    fm_run_spec_default(spec);
    /* the coordinator's defaults (fm_server_config_default reads them here) */
    snprintf(o->bind, sizeof o->bind, "tcp://*:5555");
    snprintf(o->db, sizeof o->db, "%s", prog == FM_PROG_SIM ? "fedmoe-sim.db" : "fedmoe.db");
    o->rounds = 20;
    o->min_clients = 2;
    o->fraction = 1.0;
    o->round_timeout = 600.0;
    o->client_timeout = 15.0;
    o->partition_lease = 120.0;
    /* the client's (fedmoe-client takes the endpoint and id from
     * fm_session_config_default) */
    o->partition_index = -1;
    o->epochs = 10;
    o->threads = 1;
    /* the sim's */
    o->clients = 10;
}
