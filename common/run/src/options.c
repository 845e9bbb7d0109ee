/* options.c - what the option table (options_table.c) generates: apply by name,
 * config files, the getopt_long array, --help and fedmoe-sim's forwarding. */
#include "fedmoe/options.h"

#include <errno.h>
#include <getopt.h>
#include <ini.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fedmoe/args.h"
#include "fedmoe/log.h"
#include "fedmoe/runspec.h"

#define ROW_CODE 1000 /* getopt_long returns ROW_CODE + row index for long options */
#define HELP_COLUMN 24
#define HELP_WIDTH 100

const fm_option_t *fm_options_find(fm_prog prog, const char *name)
{
    char key[64];
    size_t i, n;
    for (i = 0; name[i] && i < sizeof key - 1; i++)
        key[i] = name[i] == '_' ? '-' : name[i];
    key[i] = 0;
    const fm_option_t *t = fm_options_table(&n);
    for (i = 0; i < n; i++)
        if ((t[i].progs & prog) && strcmp(t[i].name, key) == 0)
            return &t[i];
    return NULL;
}

static void *where(fm_options_t *o, const fm_option_t *r)
{
    return (r->flags & FM_OPTF_SPEC ? (char *)o->spec : (char *)o) + r->offset;
}

static const void *where_c(const fm_options_t *o, const fm_option_t *r)
{
    return (r->flags & FM_OPTF_SPEC ? (const char *)o->spec : (const char *)o) + r->offset;
}

/* Parses value into the row's field. */
static fm_status store(fm_options_t *o, const fm_option_t *r, const char *flag, const char *v)
{
    void *p = where(o, r);
    double d;
    long l;
    fm_status st;
    if (!v && r->arg) {
        fm_error_set("%s: needs a value", flag);
        return FM_ERR_ARG;
    }
    switch (r->type) {
    case FM_OPT_INT: return fm_arg_int(flag, v, (int)r->min, (int)r->max, p);
    case FM_OPT_SIZE:
        if ((st = fm_arg_long(flag, v, (long)r->min, (long)r->max, &l)) == FM_OK)
            *(size_t *)p = (size_t)l;
        return st;
    case FM_OPT_DOUBLE: return fm_arg_double(flag, v, r->min, r->max, p);
    case FM_OPT_FLOAT:
        if ((st = fm_arg_double(flag, v, r->min, r->max, &d)) == FM_OK)
            *(float *)p = (float)d;
        return st;
    case FM_OPT_U64: {
        unsigned long long u;
        if ((st = fm_arg_u64(flag, v, &u)) != FM_OK)
            return st;
        if (r->max > 0 && ((double)u < r->min || (double)u > r->max)) { /* max 0: any value */
            fm_error_set("%s: %llu is outside %.0f..%.0f", flag, u, r->min, r->max);
            return FM_ERR_ARG;
        }
        *(uint64_t *)p = u;
        return FM_OK;
    }
    case FM_OPT_SWITCH: return fm_arg_bool(flag, v, p);
    case FM_OPT_STRING:
        if (strlen(v) >= r->size) {
            fm_error_set("%s: '%.40s...' is longer than %zu characters", flag, v, r->size - 1);
            return FM_ERR_ARG;
        }
        memcpy(p, v, strlen(v) + 1);
        return FM_OK;
    case FM_OPT_CUSTOM: return r->set(o, flag, v);
    }
    return FM_ERR_ARG;
}

/* Keeps what was set, in order, for fm_options_given and fm_options_forward. */
static fm_status remember(fm_options_t *o, int row, const char *v)
{
    size_t len = v ? strlen(v) + 1 : 0;
    if (o->ngiven >= FM_OPT_MAX_GIVEN || o->text_used + len > sizeof o->text) {
        fm_error_set("too many options");
        return FM_ERR_ARG;
    }
    o->given[o->ngiven].row = row;
    o->given[o->ngiven].value = NULL;
    if (v) {
        o->given[o->ngiven].value = o->text + o->text_used;
        memcpy(o->text + o->text_used, v, len);
        o->text_used += len;
    }
    o->ngiven++;
    return FM_OK;
}

static fm_status apply_row(fm_options_t *o, const fm_option_t *r, const char *v)
{
    char flag[72];
    size_t n;
    snprintf(flag, sizeof flag, "--%s", r->name);
    fm_status st = store(o, r, flag, v);
    if (st != FM_OK)
        return st;
    return remember(o, (int)(r - fm_options_table(&n)), v);
}

fm_status fm_options_apply(fm_options_t *o, const char *name, const char *value)
{
    const fm_option_t *r = fm_options_find(o->prog, name);
    if (!r) {
        fm_error_set("unknown option '%s'", name);
        return FM_ERR_ARG;
    }
    return apply_row(o, r, value);
}

typedef struct {
    fm_options_t *o;
    bool failed;
} ini_ctx_t;

static int on_ini(void *user, const char *section, const char *name, const char *value)
{
    (void)section;
    ini_ctx_t *ctx = user;
    const fm_option_t *r = fm_options_find(ctx->o->prog, name);
    if (r && (r->flags & FM_OPTF_NOCONFIG))
        r = NULL;
    if (!r)
        fm_error_set("unknown option '%s'", name);
    if (!r || apply_row(ctx->o, r, value) != FM_OK) {
        ctx->failed = true;
        return 0;
    }
    return 1;
}

#define CONFIG_MAX_BYTES (1u << 20)
#define CONFIG_MAX_LINE 199 /* libinih's line buffer (INI_MAX_LINE 200) */

/* The whole of a config file, checked to be a text file of at most
 * CONFIG_MAX_BYTES with lines libinih reads whole: a directory, a device (read
 * for ever), a NUL byte or a cut line is refused, never run on. NULL with the
 * reason set; caller frees. */
static char *read_config(const char *path)
{
    struct stat sb;
    FILE *f = NULL;
    char *buf = NULL;
    if (stat(path, &sb) != 0) {
        fm_error_set("%s: cannot read the config file: %s", path, strerror(errno));
        return NULL;
    }
    if (!S_ISREG(sb.st_mode)) {
        fm_error_set("%s: not a regular file (a directory or a device?): a config file is a text file of "
                     "'key = value' lines", path);
        return NULL;
    }
    if (sb.st_size > CONFIG_MAX_BYTES) {
        fm_error_set("%s: %lld bytes, more than a config file may have (%u)", path, (long long)sb.st_size,
                     CONFIG_MAX_BYTES);
        return NULL;
    }
    size_t n = (size_t)sb.st_size;
    if (!(f = fopen(path, "rb")) || !(buf = malloc(n + 1)) || fread(buf, 1, n, f) != n) {
        fm_error_set("%s: cannot read the config file%s", path, f && !buf ? ": out of memory" : "");
        free(buf);
        if (f)
            fclose(f);
        return NULL;
    }
    fclose(f);
    buf[n] = 0;
    const char *nul = memchr(buf, 0, n);
    if (nul) {
        fm_error_set("%s: a NUL byte at offset %zu: not a text config file", path, (size_t)(nul - buf));
        free(buf);
        return NULL;
    }
    int line = 1;
    for (const char *p = buf, *eol; *p; p = eol + 1, line++) {
        eol = strchr(p, '\n');
        if (!eol)
            eol = buf + n;
        if (eol - p > CONFIG_MAX_LINE) {
            fm_error_set("%s:%d: a line longer than %d characters", path, line, CONFIG_MAX_LINE);
            free(buf);
            return NULL;
        }
        if (!*eol)
            break;
    }
    return buf;
}

fm_status fm_options_load_file(fm_options_t *o, const char *path)
{
    ini_ctx_t ctx = {o, false};
    char *text = read_config(path);
    if (!text)
        return FM_ERR_ARG;
    int rc = ini_parse_string(text, on_ini, &ctx);
    free(text);
    if (rc < 0) {
        fm_error_set("%s: cannot read the config file", path);
        return FM_ERR_ARG;
    }
    if (rc > 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", ctx.failed ? fm_error_last() : "not a valid INI line");
        fm_error_set("%s:%d: %s", path, rc, why);
        return FM_ERR_ARG;
    }
    return FM_OK;
}

/* The --config files of argv, first, so that the flags override them. */
static fm_status load_configs(fm_options_t *o, int argc, char **argv)
{
    if (!fm_options_find(o->prog, "config"))
        return FM_OK;
    for (int i = 1; i < argc; i++) {
        const char *path = NULL;
        if (!strcmp(argv[i], "--config") && i + 1 < argc)
            path = argv[i + 1];
        else if (!strncmp(argv[i], "--config=", 9))
            path = argv[i] + 9;
        if (path && fm_options_load_file(o, path) != FM_OK)
            return FM_ERR_ARG;
    }
    return FM_OK;
}

/* The getopt_long array and short options of prog, from the table. */
static void getopt_table(fm_prog prog, struct option *longs, char *shorts, size_t shorts_cap)
{
    size_t n, k = 0, s = 0;
    const fm_option_t *t = fm_options_table(&n);
    for (size_t i = 0; i < n; i++) {
        if (!(t[i].progs & prog))
            continue;
        longs[k++] = (struct option){t[i].name, t[i].arg ? required_argument : no_argument, NULL, ROW_CODE + (int)i};
        if (t[i].short_name && s + 1 < shorts_cap)
            shorts[s++] = t[i].short_name;
    }
    longs[k] = (struct option){0, 0, 0, 0};
    shorts[s] = 0;
}

static const fm_option_t *row_of(fm_prog prog, int c)
{
    size_t n;
    const fm_option_t *t = fm_options_table(&n);
    if (c >= ROW_CODE && (size_t)(c - ROW_CODE) < n)
        return &t[c - ROW_CODE];
    for (size_t i = 0; i < n && c > 0; i++)
        if ((t[i].progs & prog) && t[i].short_name == c)
            return &t[i];
    return NULL;
}

/* Whether the argument typed ("--name" or "--name=value") names option `name` whole. */
static bool whole_name(const char *typed, const char *name)
{
    size_t len = strlen(name);
    return strncmp(typed, "--", 2) == 0 && strncmp(typed + 2, name, len) == 0 &&
           (typed[2 + len] == 0 || typed[2 + len] == '=');
}

fm_status fm_options_parse(fm_options_t *o, int argc, char **argv)
{
    size_t n;
    fm_options_table(&n);
    struct option *longs = calloc(n + 1, sizeof *longs);
    if (!longs)
        return FM_ERR_NOMEM;
    char shorts[32];
    getopt_table(o->prog, longs, shorts, sizeof shorts);
    fm_status st = load_configs(o, argc, argv);
    opterr = 0;
    optind = 0; /* GNU getopt: start over */
    int c;
    while (st == FM_OK && !o->help && (c = getopt_long(argc, argv, shorts, longs, NULL)) != -1) {
        const fm_option_t *r = row_of(o->prog, c);
        const char *typed = c >= ROW_CODE ? argv[optind - (r && r->arg && optarg == argv[optind - 1] ? 2 : 1)] : NULL;
        if (r && typed && !whole_name(typed, r->name)) {
            /* getopt_long takes a unique prefix: --lr for --lr-schedule where
             * this program has no --lr; no abbreviation is taken */
            fm_error_set("unknown option '%.*s' (see --help; options are not abbreviated)", (int)strcspn(typed, "="),
                         typed);
            st = FM_ERR_ARG;
        } else if (!r) {
            fm_error_set("unknown or incomplete option '%s' (see --help)", argv[optind - 1]);
            st = FM_ERR_ARG;
        } else if (strcmp(r->name, "config") != 0) { /* config files are read already */
            st = apply_row(o, r, optarg);
        }
    }
    free(longs);
    if (st == FM_OK && !o->help && optind < argc) {
        fm_error_set("unexpected argument '%s' (see --help)", argv[optind]);
        st = FM_ERR_ARG;
    }
    return st;
}

/* The value of row r in o as text for --help; false when none is shown. */
static bool default_text(const fm_options_t *o, const fm_option_t *r, char *buf, size_t cap)
{
    const void *p = where_c(o, r);
    if (r->def) {
        snprintf(buf, cap, "%s", r->def);
        return r->def[0] != 0;
    }
    switch (r->type) {
    case FM_OPT_INT: snprintf(buf, cap, "%d", *(const int *)p); break;
    case FM_OPT_SIZE: snprintf(buf, cap, "%zu", *(const size_t *)p); break;
    case FM_OPT_DOUBLE: snprintf(buf, cap, "%g", *(const double *)p); break;
    case FM_OPT_FLOAT: snprintf(buf, cap, "%g", (double)*(const float *)p); break;
    case FM_OPT_U64: snprintf(buf, cap, "%llu", (unsigned long long)*(const uint64_t *)p); break;
    case FM_OPT_STRING: snprintf(buf, cap, "%s", (const char *)p); break;
    case FM_OPT_SWITCH: return false;
    case FM_OPT_CUSTOM:
        if (!r->show)
            return false;
        r->show(o, buf, cap);
        break;
    }
    return buf[0] != 0;
}

/* One option's lines: the flag, then its help with the default at the end. */
static void usage_row(const fm_options_t *o, const fm_option_t *r, FILE *f)
{
    char left[96], def[160], short_flag[8] = "";
    if (r->short_name)
        snprintf(short_flag, sizeof short_flag, "-%c, ", r->short_name);
    int len = snprintf(left, sizeof left, "  %s--%s%s%s", short_flag, r->name, r->arg ? " " : "", r->arg ? r->arg : "");
    fprintf(f, "%s%*s", left, len < HELP_COLUMN - 1 ? HELP_COLUMN - len : 2, "");
    if (!default_text(o, r, def, sizeof def))
        def[0] = 0;
    const char *line = r->help;
    for (;;) {
        const char *end = strchr(line, '\n');
        int w = end ? (int)(end - line) : (int)strlen(line);
        if (end) {
            fprintf(f, "%.*s\n%*s", w, line, HELP_COLUMN, "");
            line = end + 1;
            continue;
        }
        fprintf(f, "%s", line);
        if (def[0]) {
            int at = (line == r->help ? (len < HELP_COLUMN - 1 ? HELP_COLUMN : len + 2) : HELP_COLUMN) + w;
            bool own_line = at + (int)strlen(def) + 12 > HELP_WIDTH;
            if (own_line)
                fprintf(f, "\n%*s", HELP_COLUMN, "");
            fprintf(f, "%s(default%s%s)", own_line ? "" : " ", r->def ? ": " : " ", def);
        }
        fputc('\n', f);
        return;
    }
}

void fm_options_usage(const fm_options_t *o, FILE *f, const char *const titles[FM_OPT_GROUPS])
{
    size_t n;
    const fm_option_t *t = fm_options_table(&n);
    for (int g = 0; g < FM_OPT_GROUPS; g++) {
        bool titled = false;
        for (size_t i = 0; i < n; i++) {
            if (t[i].group != (fm_opt_group)g || !(t[i].progs & o->prog))
                continue;
            if (!titled && titles && titles[g])
                fprintf(f, "%s\n", titles[g]);
            titled = true;
            usage_row(o, &t[i], f);
        }
    }
}

int fm_options_main(fm_options_t *o, int argc, char **argv, const fm_program_t *p)
{
    if (fm_options_parse(o, argc, argv) != FM_OK) {
        fprintf(stderr, "%s: %s\n", p->name, fm_error_last());
        return 2;
    }
    if (o->help) {
        fm_run_spec_t spec;
        fm_options_t *d = malloc(sizeof *d);
        if (!d)
            return 2;
        p->defaults(d, &spec);
        fputs(p->intro, stdout);
        fm_options_usage(d, stdout, p->titles);
        free(d);
        return 0;
    }
    if (o->verbose)
        fm_log_set_level(FM_LOG_DEBUG);
    return -1;
}

int fm_options_forward(fm_options_t *o, fm_prog to, char **argv, int cap)
{
    size_t n;
    const fm_option_t *t = fm_options_table(&n);
    int k = 0;
    for (int i = 0; i < o->ngiven; i++) {
        const fm_option_t *r = &t[o->given[i].row];
        const char *v = o->given[i].value;
        bool on = true;
        if (!r->arg && v && fm_arg_bool(r->name, v, &on) != FM_OK)
            on = false;
        if (!(r->progs & to) || (r->flags & FM_OPTF_NOCONFIG) || !on)
            continue; /* a switch turned off in a config file: nothing to pass on */
        size_t len = strlen(r->name) + 3;
        if (k + 2 > cap || o->text_used + len > sizeof o->text)
            return -1;
        char *flag = o->text + o->text_used;
        snprintf(flag, len, "--%s", r->name);
        o->text_used += len;
        argv[k++] = flag;
        if (r->arg)
            argv[k++] = (char *)v;
    }
    return k;
}

bool fm_options_given(const fm_options_t *o, const char *name)
{
    size_t n;
    const fm_option_t *t = fm_options_table(&n);
    const fm_option_t *r = fm_options_find(o->prog, name);
    for (int i = 0; r && i < o->ngiven; i++)
        if (&t[o->given[i].row] == r)
            return true;
    return false;
}
