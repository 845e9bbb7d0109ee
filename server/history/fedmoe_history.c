/* fedmoe-history: reads a fedmoe round log (while the daemon writes to it):
 * runs, a run's rounds, a round's clients, CSV / JSON export, SVG plots. */
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fedmoe/clock.h"
#include "fedmoe/log.h"
#include "fedmoe/report.h"
#include "fedmoe/record.h"
#include "fedmoe/store.h"
#include "view_api.h"
#include "view_http.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fedmoe-history [--db PATH] COMMAND [ARGS]\n"
            "\n"
            "Reads the SQLite round log that fedmoe-server writes (default fedmoe.db).\n"
            "\n"
            "commands:\n"
            "  runs                          every run: id, strategy, status, rounds, final accuracy\n"
            "                                (marked h: a --holdout run, scored on held-out train data)\n"
            "  rounds [RUN]                  the rounds of a run (default: the latest run)\n"
            "  clients ROUND [RUN]           the clients of one round\n"
            "  export [--format csv|json] [--table rounds|clients] [RUN]\n"
            "                                rounds (default) or client rows of a run, to stdout\n"
            "  plot --out FILE.svg [RUN...]  test accuracy and losses over rounds, one line per run\n"
            "                                (default: the latest run)\n"
            "  follow [RUN]                  a run's rounds as they are committed, then its summary,\n"
            "                                as fedmoe-sim prints them (default: the run in progress,\n"
            "                                or the next one to start); exit 0 when it finished\n"
            "  check                         SQLite's integrity check of the database: ok, or its\n"
            "                                first problems (exit 1)\n"
            "  serve [--listen HOST:PORT]    the round log in a browser page and a read-only JSON\n"
            "                                API over HTTP (docs/http.md) while the coordinator\n"
            "                                writes; loopback only (default 127.0.0.1:8080) unless\n"
            "                                --token-file; until SIGINT or SIGTERM\n"
            "options:\n"
            "  --db PATH                     the database (default fedmoe.db)\n"
            "  --listen HOST:PORT            serve: where (127.0.0.1, ::1 or localhost; with\n"
            "                                --token-file any IPv4 address, 0.0.0.0 for all)\n"
            "  --token-file FILE             serve: the API answers only requests carrying the\n"
            "                                token of FILE (mode 600): Authorization: Bearer, or\n"
            "                                ?token= (open the page as http://HOST:PORT/?token=...)\n"
            "  --resume-wait S               follow: a run stopped before its end (its coordinator\n"
            "                                restarting) is waited for S seconds to resume (default 0)\n"
            "  --after TIME                  follow: also the latest run if it ended at or after TIME\n"
            "                                (UTC, 2026-12-06T03:02:00Z): one that began and ended\n"
            "                                before follow first looked (docker/sim.sh passes its start)\n"
            "  -h, --help                    this text\n");
}

/* The command line's options (main's defaults). */
typedef struct {
    const char *db, *format, *table, *out, *listen, *token_file;
    double resume_wait;
    char after[32]; /* follow --after, as the log writes times ("" when not given) */
} options_t;

static volatile sig_atomic_t interrupted;
static void on_signal(int sig) { interrupted = sig; }

/* Prints the run's rounds as they come and its summary at its end; waits for
 * the database and the run to appear. */
static int cmd_follow(const options_t *o, const char *run)
{
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    fm_report_t r;
    fm_report_begin(&r, o->db, run, true); /* (a run in progress is the one to follow) */
    snprintf(r.after, sizeof r.after, "%s", o->after);
    char status[16] = "";
    double stopped_at = -1.0; /* when it was first seen stopped */
    while (!interrupted) {
        fm_report_progress(&r);
        fm_report_status(&r, status);
        if (!strcmp(status, "stopped") && stopped_at < 0.0)
            stopped_at = fm_clock_seconds();
        else if (strcmp(status, "stopped"))
            stopped_at = -1.0;
        if (status[0] && strcmp(status, "running") &&
            !(stopped_at >= 0.0 && fm_clock_seconds() - stopped_at < o->resume_wait))
            break;
        usleep(500000);
    }
    int rc = interrupted ? 128 + interrupted : fm_report_summary(&r);
    if (rc == 0 && strcmp(status, "finished"))
        rc = 1; /* stopped before its last round */
    fm_report_end(&r);
    return rc;
}

static int fail(void);

static int cmd_serve(const char *db, const char *listen, const char *token_file)
{
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    return fm_view_serve(db, listen, token_file, &interrupted) == FM_OK ? 0 : fail();
}

static int fail(void)
{
    fprintf(stderr, "fedmoe-history: %s\n", fm_error_last());
    return 2;
}

static int cmd_check(fm_store_t *st)
{
    char report[2048];
    bool ok;
    if (fm_store_check(st, &ok, report, sizeof report) != FM_OK)
        return fail();
    printf("%s\n", report);
    return ok ? 0 : 1;
}

/* Resolves RUN (or the latest run when NULL). */
static int pick_run(fm_store_t *st, const char *arg, fm_run_row_t *run)
{
    bool found = false;
    fm_status s = arg ? fm_store_get_run(st, arg, run, &found) : fm_store_latest_run(st, run, &found);
    if (s != FM_OK)
        return fail();
    if (!found) {
        fm_error_set(arg ? "no run '%s' in the database" : "the database holds no runs%s", arg ? arg : "");
        return fail();
    }
    return 0;
}

/* A tuning run (--holdout): its test columns hold the held-out part of the
 * clients' train and validation data. */


static int cmd_runs(fm_store_t *st)
{
    fm_run_row_t *runs;
    int n;
    if (fm_store_list_runs(st, &runs, &n) != FM_OK)
        return fail();
    printf("%-28s %-9s %-9s %6s %14s %10s  %s\n", "run", "strategy", "status", "seed", "rounds", "final_acc", "started");
    for (int i = 0; i < n; i++) {
        fm_round_row_t *rr;
        int nr = 0;
        double acc = NAN;
        if (fm_store_list_rounds(st, runs[i].id, &rr, &nr) == FM_OK) {
            if (nr)
                acc = rr[nr - 1].test_accuracy;
            free(rr);
        }
        char rounds[32];
        snprintf(rounds, sizeof rounds, "%d/%d", runs[i].rounds_done, runs[i].rounds_planned);
        if (isnan(acc))
            printf("%-28s %-9s %-9s %6llu %14s %10s  %s\n", runs[i].id, runs[i].strategy, runs[i].status,
                   (unsigned long long)runs[i].seed, rounds, "-", runs[i].started_at);
        else
            printf("%-28s %-9s %-9s %6llu %14s %9.2f%%%s %s\n", runs[i].id, runs[i].strategy, runs[i].status,
                   (unsigned long long)runs[i].seed, rounds, 100.0 * acc, fm_run_holdout(&runs[i]) ? "h" : " ",
                   runs[i].started_at);
        fm_store_run_clear(&runs[i]);
    }
    free(runs);
    return 0;
}

static int cmd_rounds(fm_store_t *st, const char *arg)
{
    fm_run_row_t run;
    if (pick_run(st, arg, &run))
        return 2;
    fm_round_row_t *r;
    int n;
    if (fm_store_list_rounds(st, run.id, &r, &n) != FM_OK) {
        fm_store_run_clear(&run);
        return fail();
    }
    printf("run %s (%s, %s, %d/%d rounds)%s\n", run.id, run.strategy, run.status, run.rounds_done, run.rounds_planned,
           fm_run_holdout(&run) ? "; holdout run: test_loss and test_acc are on held-out train/validation data" : "");
    char tr[16], te[16];
    double unit = fm_run_loss_unit(&run); /* (text: bits per byte) */
    bool dp = false; /* (an epsilon column for runs with differential privacy) */
    for (int i = 0; i < n; i++)
        dp |= isfinite(r[i].epsilon);
    printf("%5s %8s %9s %7s %10s %9s %9s %9s %10s %10s %8s%s\n", "round", "selected", "completed", "dropped",
           fm_run_loss_name(&run, "train", tr, sizeof tr), fm_run_loss_name(&run, "test", te, sizeof te), "test_acc",
           "val_acc", "bytes_up", "bytes_down", "seconds", dp ? "  epsilon" : "");
    for (int i = 0; i < n; i++) {
        printf("%5d %8d %9d %7d %10.4f %9.4f %8.2f%% %8.2f%% %10lld %10lld %8.2f", r[i].round, r[i].selected,
               r[i].completed, r[i].dropped, r[i].train_loss * unit, r[i].test_loss * unit, 100.0 * r[i].test_accuracy,
               100.0 * r[i].val_accuracy, (long long)r[i].bytes_up, (long long)r[i].bytes_down, r[i].seconds);
        if (dp)
            printf(" %8.4g", r[i].epsilon);
        putchar('\n');
    }
    free(r);
    fm_store_run_clear(&run);
    return 0;
}

static int cmd_clients(fm_store_t *st, int round, const char *arg)
{
    fm_run_row_t run;
    if (pick_run(st, arg, &run))
        return 2;
    fm_client_round_row_t *c;
    int n;
    if (fm_store_list_client_rounds(st, run.id, round, &c, &n) != FM_OK) {
        fm_store_run_clear(&run);
        return fail();
    }
    if (n == 0) {
        fm_error_set("run %s has no round %d", run.id, round);
        fm_store_run_clear(&run);
        return fail();
    }
    printf("run %s, round %d\n", run.id, round);
    char tr[16], va[16], te[16];
    double unit = fm_run_loss_unit(&run);
    printf("%-20s %-9s %10s %9s %9s %9s %9s %8s %8s %8s\n", "client", "status",
           fm_run_loss_name(&run, "train", tr, sizeof tr), fm_run_loss_name(&run, "val", va, sizeof va),
           fm_run_loss_name(&run, "test", te, sizeof te), "test_acc", "gen_share", "samples", "tested", "seconds");
    for (int i = 0; i < n; i++)
        printf("%-20s %-9s %10.4f %9.4f %9.4f %8.2f%% %9.3f %8lld %8lld %8.2f\n", c[i].client_id, c[i].status,
               c[i].train_loss * unit, c[i].val_loss * unit, c[i].test_loss * unit, 100.0 * c[i].test_accuracy,
               c[i].generalist_share,
               (long long)c[i].train_samples, (long long)c[i].test_samples, c[i].seconds);
    free(c);
    fm_store_run_clear(&run);
    return 0;
}

static int cmd_export(fm_store_t *st, bool json, bool clients, const char *arg)
{
    fm_run_row_t run;
    if (pick_run(st, arg, &run))
        return 2;
    int rc = 0;
    if (!clients) {
        fm_round_row_t *r;
        int n;
        if (fm_store_list_rounds(st, run.id, &r, &n) != FM_OK) {
            fm_store_run_clear(&run);
            return fail();
        }
        if (json) {
            printf("{\"run\":");
            fm_json_str(stdout, run.id);
            printf(",\"strategy\":");
            fm_json_str(stdout, run.strategy);
            printf(",\"status\":");
            fm_json_str(stdout, run.status);
            printf(",\"config\":%s,\"rounds\":[", run.config);
        } else {
            fm_record_csv_header(stdout, &fm_round_record, "run");
        }
        for (int i = 0; i < n; i++) {
            if (json) {
                fputs(i ? "," : "", stdout);
                fm_record_json(stdout, &fm_round_record, &r[i], NULL);
            } else {
                fm_record_csv(stdout, &fm_round_record, &r[i], run.id);
            }
        }
        if (json)
            printf("]}\n");
        free(r);
    } else {
        fm_client_round_row_t *c;
        int n;
        if (fm_store_list_client_rounds(st, run.id, -1, &c, &n) != FM_OK) {
            fm_store_run_clear(&run);
            return fail();
        }
        char before[160];
        FILE *m = fmemopen(before, sizeof before, "w");
        if (m) { /* the run's member, ahead of each row's own */
            fputs("\"run\":", m);
            fm_json_str(m, run.id);
            fclose(m);
        } else {
            before[0] = 0;
        }
        if (json)
            printf("[");
        else
            fm_record_csv_header(stdout, &fm_client_round_record, "run");
        for (int i = 0; i < n; i++) {
            if (json) {
                fputs(i ? "," : "", stdout);
                fm_record_json(stdout, &fm_client_round_record, &c[i], before);
            } else {
                fm_record_csv(stdout, &fm_client_round_record, &c[i], run.id);
            }
        }
        if (json)
            printf("]\n");
        free(c);
    }
    fm_store_run_clear(&run);
    return rc;
}

/* ---- SVG -------------------------------------------------------------------- */

static const char *COLORS[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};

typedef struct {
    fm_run_row_t run;
    fm_round_row_t *r;
    int n;
} series_t;

/* Round j of series s in panel `which`: 0 accuracy %, 1 train loss, 2 test
 * loss (text runs: bits per byte). */
static double series_value(const series_t *s, int j, int which)
{
    double unit = which ? fm_run_loss_unit(&s->run) : 1.0;
    return unit * (which == 0 ? 100.0 * s->r[j].test_accuracy : which == 1 ? s->r[j].train_loss : s->r[j].test_loss);
}

/* One panel: x = round, y = a field chosen by `which` (series_value). */
static void panel(FILE *f, series_t *s, int ns, int which, double x0, double y0, double w, double h, const char *title,
                  int max_round)
{
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < ns; i++)
        for (int j = 0; j < s[i].n; j++) {
            double v = series_value(&s[i], j, which);
            lo = fmin(lo, v);
            hi = fmax(hi, v);
        }
    if (!isfinite(lo)) {
        lo = 0;
        hi = 1;
    }
    if (hi - lo < 1e-9) {
        hi += 0.5;
        lo -= 0.5;
    }
    double pad = (hi - lo) * 0.05;
    lo -= pad;
    hi += pad;
    fprintf(f, "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='none' stroke='#888'/>\n", x0, y0, w, h);
    fprintf(f, "<text x='%.1f' y='%.1f' font-size='14' text-anchor='middle'>%s</text>\n", x0 + w / 2, y0 - 8, title);
    for (int t = 0; t <= 4; t++) {
        double v = lo + (hi - lo) * t / 4.0, y = y0 + h - h * t / 4.0;
        fprintf(f, "<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='#eee'/>\n", x0, y, x0 + w, y);
        fprintf(f, "<text x='%.1f' y='%.1f' font-size='11' text-anchor='end'>%.*f</text>\n", x0 - 4, y + 4,
                which == 0 ? 1 : 3, v);
    }
    int xr = max_round > 1 ? max_round : 2;
    for (int t = 0; t <= 4; t++) {
        int rd = 1 + (int)lround((xr - 1) * t / 4.0);
        double x = x0 + w * (rd - 1) / (double)(xr - 1);
        fprintf(f, "<text x='%.1f' y='%.1f' font-size='11' text-anchor='middle'>%d</text>\n", x, y0 + h + 14, rd);
    }
    fprintf(f, "<text x='%.1f' y='%.1f' font-size='11' text-anchor='middle'>round</text>\n", x0 + w / 2, y0 + h + 28);
    for (int i = 0; i < ns; i++) {
        fprintf(f, "<polyline fill='none' stroke='%s' stroke-width='1.8' points='", COLORS[i % 8]);
        for (int j = 0; j < s[i].n; j++) {
            double v = series_value(&s[i], j, which);
            double x = x0 + w * (s[i].r[j].round - 1) / (double)(xr - 1), y = y0 + h - h * (v - lo) / (hi - lo);
            fprintf(f, "%.1f,%.1f ", x, y);
        }
        fprintf(f, "'/>\n");
    }
}

static int cmd_plot(fm_store_t *st, const char *out, char **runs, int nruns)
{
    int ns = nruns ? nruns : 1;
    series_t *s = calloc(ns, sizeof *s);
    int rc = 0, max_round = 1;
    for (int i = 0; i < ns && !rc; i++) {
        if ((rc = pick_run(st, nruns ? runs[i] : NULL, &s[i].run)))
            break;
        if (fm_store_list_rounds(st, s[i].run.id, &s[i].r, &s[i].n) != FM_OK)
            rc = fail();
        for (int j = 0; j < s[i].n; j++)
            max_round = s[i].r[j].round > max_round ? s[i].r[j].round : max_round;
    }
    FILE *f = rc ? NULL : fopen(out, "w");
    if (!rc && !f) {
        fm_error_set("cannot write %s", out);
        rc = fail();
    }
    if (f) {
        double W = 1020, H = 380 + 18.0 * ns;
        fprintf(f, "<?xml version='1.0' encoding='UTF-8'?>\n<svg xmlns='http://www.w3.org/2000/svg' width='%.0f' "
                   "height='%.0f' font-family='sans-serif'>\n<rect width='100%%' height='100%%' fill='white'/>\n", W, H);
        panel(f, s, ns, 0, 60, 40, 280, 240, "test accuracy (%)", max_round);
        bool text = false; /* (text runs' losses in bits per byte) */
        for (int i = 0; i < ns; i++)
            text |= fm_run_text(&s[i].run);
        panel(f, s, ns, 1, 400, 40, 260, 240, text ? "mean train loss (text: bits/byte)" : "mean train loss",
              max_round);
        panel(f, s, ns, 2, 720, 40, 260, 240, text ? "test loss (text: bits/byte)" : "test loss", max_round);
        for (int i = 0; i < ns; i++) {
            double y = 340 + 18.0 * i;
            fprintf(f, "<line x1='60' y1='%.1f' x2='90' y2='%.1f' stroke='%s' stroke-width='3'/>\n", y - 4, y - 4, COLORS[i % 8]);
            fprintf(f, "<text x='96' y='%.1f' font-size='12'>%s (%s)%s</text>\n", y, s[i].run.id, s[i].run.strategy,
                    s[i].n ? "" : " - no rounds yet");
        }
        fprintf(f, "</svg>\n");
        if (fclose(f) != 0) {
            fm_error_set("cannot write %s", out);
            rc = fail();
        } else {
            printf("wrote %s (%d run%s)\n", out, ns, ns == 1 ? "" : "s");
        }
    }
    for (int i = 0; i < ns; i++) {
        free(s[i].r);
        fm_store_run_clear(&s[i].run);
    }
    free(s);
    return rc;
}

/* Reads options up to the next argument into o; returns an exit status to stop with, or -1. */
static int parse_options(int argc, char **argv, const struct option *opts, options_t *o)
{
    int c;
    while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
        switch (c) {
        case 'd': o->db = optarg; break;
        case 'f': o->format = optarg; break;
        case 't': o->table = optarg; break;
        case 'o': o->out = optarg; break;
        case 'l': o->listen = optarg; break;
        case 'k': o->token_file = optarg; break;
        case 'w': {
            char *end;
            o->resume_wait = strtod(optarg, &end);
            if (*end || end == optarg || !(o->resume_wait >= 0.0 && o->resume_wait <= 1e7)) {
                fprintf(stderr, "fedmoe-history: --resume-wait: '%s' is not a number of seconds\n", optarg);
                return 2;
            }
            break;
        }
        case 'a':
            if (fm_clock_utc_parse(optarg, o->after) != FM_OK) {
                fprintf(stderr, "fedmoe-history: --after: '%s' is not a UTC time like 2026-12-06T03:02:00Z\n", optarg);
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        default: fprintf(stderr, "fedmoe-history: unknown or incomplete option '%s' (see --help)\n", argv[optind - 1]); return 2;
        }
    }
    return -1;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"db", required_argument, 0, 'd'},     {"format", required_argument, 0, 'f'},
                                         {"table", required_argument, 0, 't'},  {"out", required_argument, 0, 'o'},
                                         {"resume-wait", required_argument, 0, 'w'},
                                         {"listen", required_argument, 0, 'l'},
                                         {"token-file", required_argument, 0, 'k'},
                                         {"after", required_argument, 0, 'a'},
                                         {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
    options_t o = {.db = "fedmoe.db", .format = "csv", .table = "rounds", .listen = "127.0.0.1:8080"};
    opterr = 0;
    int rc = parse_options(argc, argv, opts, &o);
    if (rc >= 0)
        return rc;
    if (optind >= argc) {
        fprintf(stderr, "fedmoe-history: a command is needed: runs, rounds, clients, export, plot, follow, check or serve (see --help)\n");
        return 2;
    }
    const char *cmd = argv[optind++];
    /* options may also follow the command */
    if ((rc = parse_options(argc, argv, opts, &o)) >= 0)
        return rc;
    char **rest = argv + optind;
    int nrest = argc - optind;
    bool known = !strcmp(cmd, "runs") || !strcmp(cmd, "rounds") || !strcmp(cmd, "clients") || !strcmp(cmd, "export") ||
                 !strcmp(cmd, "plot") || !strcmp(cmd, "follow") || !strcmp(cmd, "check") || !strcmp(cmd, "serve");
    if (!known) {
        fprintf(stderr, "fedmoe-history: unknown command '%s' (runs, rounds, clients, export, plot, follow, check, serve)\n", cmd);
        return 2;
    }
    if (strcmp(o.format, "csv") && strcmp(o.format, "json")) {
        fprintf(stderr, "fedmoe-history: --format must be csv or json\n");
        return 2;
    }
    if (strcmp(o.table, "rounds") && strcmp(o.table, "clients")) {
        fprintf(stderr, "fedmoe-history: --table must be rounds or clients\n");
        return 2;
    }
    if (((!strcmp(cmd, "runs") || !strcmp(cmd, "check") || !strcmp(cmd, "serve")) && nrest > 0) ||
        ((!strcmp(cmd, "rounds") || !strcmp(cmd, "export") || !strcmp(cmd, "follow")) && nrest > 1) ||
        (!strcmp(cmd, "clients") && (nrest < 1 || nrest > 2))) {
        fprintf(stderr, "fedmoe-history: wrong arguments for '%s' (see --help)\n", cmd);
        return 2;
    }
    if (!strcmp(cmd, "plot") && !o.out) {
        fprintf(stderr, "fedmoe-history: plot needs --out FILE.svg\n");
        return 2;
    }
    int round = 0;
    if (!strcmp(cmd, "clients")) {
        char *end;
        long v = strtol(rest[0], &end, 10);
        if (*end || end == rest[0] || v < 1 || v > 1000000000) {
            fprintf(stderr, "fedmoe-history: round '%s' is not a positive integer\n", rest[0]);
            return 2;
        }
        round = (int)v;
    }
    if (!strcmp(cmd, "follow"))
        return cmd_follow(&o, nrest ? rest[0] : NULL);
    if (!strcmp(cmd, "serve"))
        return cmd_serve(o.db, o.listen, o.token_file);
    fm_store_t *st = NULL;
    if (fm_store_open(&st, o.db, true) != FM_OK)
        return fail();
    if (!strcmp(cmd, "runs"))
        rc = cmd_runs(st);
    else if (!strcmp(cmd, "check"))
        rc = cmd_check(st);
    else if (!strcmp(cmd, "rounds"))
        rc = cmd_rounds(st, nrest ? rest[0] : NULL);
    else if (!strcmp(cmd, "clients"))
        rc = cmd_clients(st, round, nrest > 1 ? rest[1] : NULL);
    else if (!strcmp(cmd, "export"))
        rc = cmd_export(st, !strcmp(o.format, "json"), !strcmp(o.table, "clients"), nrest ? rest[0] : NULL);
    else
        rc = cmd_plot(st, o.out, rest, nrest);
    fm_store_close(&st);
    return rc;
}
