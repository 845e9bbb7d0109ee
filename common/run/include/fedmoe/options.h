/* options.h - the one option table of fedmoe-server, fedmoe-client and fedmoe-sim.
 *
 * Every option is one row: its name (the long flag without dashes, which is also
 * its config-file key, with '-' or '_'), value type, range, where it is stored,
 * its help text and the programs that accept it. From the table come the
 * getopt_long array, the apply(name, value) used by flags and config files, the
 * --help text (with the defaults read from a defaulted fm_options_t) and what
 * fedmoe-sim forwards to the fedmoe-server it starts. The run-spec options
 * (strategy, seed, dataset, partition scheme, model and training settings) are
 * one set of rows whatever program accepts them. */
#ifndef FEDMOE_OPTIONS_H
#define FEDMOE_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fedmoe/status.h"

struct fm_run_spec; /* fm_run_spec_t, fedmoe/runspec.h */

/* The programs, as a bit mask in each row. */
typedef enum { FM_PROG_SERVER = 1, FM_PROG_CLIENT = 2, FM_PROG_SIM = 4 } fm_prog;

typedef enum {
    FM_OPT_INT,    /* int in [min, max] */
    FM_OPT_SIZE,   /* size_t in [min, max] */
    FM_OPT_DOUBLE, /* double in [min, max] */
    FM_OPT_FLOAT,  /* float, parsed as a double in [min, max] */
    FM_OPT_U64,    /* uint64_t, any */
    FM_OPT_SWITCH, /* bool; a flag without value sets it, a config key takes true/false */
    FM_OPT_STRING, /* char[size], copied */
    FM_OPT_CUSTOM, /* the row's set callback (choices, values that set two fields) */
} fm_opt_type;

/* The help sections, in this order; each program titles the ones it shows. */
typedef enum { FM_OPT_G_RUN, FM_OPT_G_FEDERATED, FM_OPT_G_DATA, FM_OPT_G_MODEL, FM_OPT_G_TRAIN, FM_OPT_G_END,
               FM_OPT_GROUPS } fm_opt_group;

#define FM_OPTF_SPEC 1u     /* offset is into the run spec, not into fm_options_t */
#define FM_OPTF_NOCONFIG 2u /* a flag only, never a config-file key (config, help) */

#define FM_OPT_MAX_GIVEN 96

/* How fedmoe-sim runs its clients: a process each, or many to a virtual host
 * (fedmoe-client --virtual); auto chooses by their number (FM_SIM_PROCESSES_MAX). */
typedef enum { FM_HOSTING_AUTO = 0, FM_HOSTING_PROCESSES, FM_HOSTING_VIRTUAL } fm_hosting;
#define FM_SIM_PROCESSES_MAX 32
#define FM_XSTR(x) FM_STR_(x) /* (a number as text, for help strings) */
#define FM_STR_(x) #x
const char *fm_hosting_name(fm_hosting h);

typedef struct fm_options fm_options_t;

typedef struct {
    const char *name;  /* long flag without dashes = config key */
    char short_name;   /* -v, -h; 0 for none */
    fm_opt_type type;
    const char *arg;   /* value name in --help; NULL: takes no value on the command line */
    double min, max;   /* range of INT, SIZE, DOUBLE, FLOAT */
    unsigned progs;    /* FM_PROG_* accepting it */
    unsigned flags;    /* FM_OPTF_* */
    size_t offset;     /* where the value goes (fm_options_t, or the run spec with FM_OPTF_SPEC) */
    size_t size;       /* FM_OPT_STRING: capacity */
    /* FM_OPT_CUSTOM: parse value (NULL for a flag without one) into o; FM_ERR_ARG
     * with a reason naming flag. */
    fm_status (*set)(fm_options_t *o, const char *flag, const char *value);
    /* FM_OPT_CUSTOM: the current value as text for --help; NULL: shows none. */
    void (*show)(const fm_options_t *o, char *buf, size_t cap);
    const char *def;   /* the default as text, overriding the value; "" shows none */
    fm_opt_group group;
    const char *help;  /* lines separated by '\n' */
} fm_option_t;

/* Everything the options of the three programs set. The run spec is the caller's. */
struct fm_options {
    fm_prog prog;
    struct fm_run_spec *spec;
    bool help, verbose;
    char config[1024];
    /* the coordinator (fedmoe-server; fedmoe-sim passes some on) */
    char bind[256], db[1024];
    int rounds, min_clients;
    double fraction, round_timeout, client_timeout, partition_lease;
    bool new_run;
    size_t max_message;
    uint64_t max_weight; /* 0: the run's largest partition (1 when the coordinator cannot read the dataset) */
    int max_connections; /* 0: twice the partitions plus 64 */
    /* transport security (server, client; fedmoe-sim makes its own keys) */
    char key[1024], allow[1024], server_key[1024];
    bool insecure;
    /* fedmoe-client */
    bool standalone;
    char connect[256], id[64], state_dir[1024];
    double connect_timeout;
    int partition_index, partition_count; /* --partition I/N; count 0 = not given */
    int epochs, threads;
    int virtual_clients, workers; /* --virtual N (0: one client), --workers W (0: the cores) */
    char keys[1024];              /* --keys DIR: the virtual clients' key pairs */
    /* fedmoe-sim */
    int clients, port;
    fm_hosting hosting;
    char workdir[1024];
    /* what was set, in order (flags and config keys): row and a copy of the value */
    int ngiven;
    struct {
        int row;
        char *value; /* NULL for a flag without value; points into text */
    } given[FM_OPT_MAX_GIVEN];
    char text[8192];
    size_t text_used;
};

/* The table and its length; static, never freed. */
const fm_option_t *fm_options_table(size_t *n);
/* The row called name (dashes or underscores) accepted by prog, or NULL. */
const fm_option_t *fm_options_find(fm_prog prog, const char *name);

/* Sets o to prog's defaults and spec to fm_run_spec_default; o->spec = spec (the
 * caller keeps owning it). Server fields get the coordinator's defaults. */
void fm_options_default(fm_options_t *o, fm_prog prog, struct fm_run_spec *spec);

/* Applies one option by name (the long flag without dashes; '_' or '-'), value
 * NULL for a flag given without one. FM_ERR_ARG with a one-line reason naming
 * the flag if the value is bad or o->prog does not accept the option. */
fm_status fm_options_apply(fm_options_t *o, const char *name, const char *value);

/* Applies an INI file of name = value lines (sections ignored). FM_ERR_ARG with
 * "PATH: cannot read the config file" or "PATH:LINE: reason". */
fm_status fm_options_load_file(fm_options_t *o, const char *path);

/* Parses a program's command line through the table: first the --config file(s)
 * when the program accepts --config, then the flags in order (later wins).
 * FM_ERR_ARG with a reason on an unknown, incomplete or bad flag or a positional
 * argument. --help sets o->help and stops. Resets getopt, so it can run again. */
fm_status fm_options_parse(fm_options_t *o, int argc, char **argv);

/* Prints the option lines of o->prog's --help, section by section under
 * titles[group] (NULL: no title line), with the defaults as they are in o. */
void fm_options_usage(const fm_options_t *o, FILE *f, const char *const titles[FM_OPT_GROUPS]);

/* Appends to argv (room for cap entries) "--name" and, if it had one, the value
 * of every option set in o that program `to` accepts, in the order given.
 * Returns the number added, or -1 if cap is too small. The strings are owned by
 * o and live as long as it does. */
int fm_options_forward(fm_options_t *o, fm_prog to, char **argv, int cap);

/* How a program presents itself: its name for error lines, the text --help
 * prints before the option lines, the section titles (FM_OPT_GROUPS entries, or
 * NULL) and its defaults (what --help shows). */
typedef struct {
    const char *name;
    const char *intro;
    const char *const *titles;
    void (*defaults)(fm_options_t *o, struct fm_run_spec *spec);
} fm_program_t;

/* A program's command line, once o holds the program's defaults: parsed through
 * the table (fm_options_parse), --verbose turning on debug logging. Returns -1
 * to go on, or the exit status to end with: 2 after a bad option ("NAME: reason"
 * on stderr), 0 after --help (printed on stdout with the program's defaults). */
int fm_options_main(fm_options_t *o, int argc, char **argv, const fm_program_t *p);

/* Whether option name was set (by a flag or a config key). */
bool fm_options_given(const fm_options_t *o, const char *name);

#endif
