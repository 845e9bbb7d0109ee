/* report.c - see fedmoe/report.h. */
#include "fedmoe/report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fedmoe/clock.h"

void fm_report_begin(fm_report_t *r, const char *db, const char *run, bool running_is_it)
{
    memset(r, 0, sizeof *r);
    r->unit = 1.0;
    snprintf(r->db, sizeof r->db, "%s", db);
    r->t0 = fm_clock_seconds();
    if (run && run[0]) {
        snprintf(r->run_id, sizeof r->run_id, "%s", run);
        return;
    }
    fm_store_t *st = NULL;
    fm_run_row_t latest;
    bool found = false;
    if (access(db, F_OK) == 0 && fm_store_open(&st, db, true) == FM_OK &&
        fm_store_latest_run(st, &latest, &found) == FM_OK && found) {
        snprintf(r->before, sizeof r->before, "%s", latest.id);
        if (running_is_it && !strcmp(latest.status, "running"))
            snprintf(r->run_id, sizeof r->run_id, "%s", latest.id); /* the run in progress */
        fm_store_run_clear(&latest);
    }
    fm_store_close(&st);
}

/* A number or word after "key": in the run's configuration JSON (the flat
 * keys this report reads are unique in it); def when absent. */
static void json_field(const char *json, const char *key, char *out, size_t cap, const char *def)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = json ? strstr(json, pat) : NULL;
    snprintf(out, cap, "%s", def);
    if (!p)
        return;
    p += strlen(pat);
    p += *p == '"';
    size_t n = strcspn(p, "\",}");
    if (n < cap)
        snprintf(out, cap, "%.*s", (int)n, p);
}

bool fm_run_holdout(const fm_run_row_t *run)
{
    char h[16];
    json_field(run->config, "holdout", h, sizeof h, "false");
    return !strcmp(h, "true");
}

bool fm_run_text(const fm_run_row_t *run)
{
    char f[16];
    json_field(run->config, "family", f, sizeof f, "image");
    return !strcmp(f, "text");
}

double fm_run_loss_unit(const fm_run_row_t *run) { return fm_run_text(run) ? 1.0 / log(2.0) : 1.0; }

const char *fm_run_loss_name(const fm_run_row_t *run, const char *which, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s_%s", which, fm_run_text(run) ? "bpb" : "loss");
    return buf;
}

static bool open_store(fm_report_t *r)
{
    if (!r->store && access(r->db, F_OK) == 0 && fm_store_open(&r->store, r->db, true) != FM_OK)
        r->store = NULL;
    return r->store != NULL;
}

static void print_rounds(fm_report_t *r, const fm_round_row_t *rr, int n)
{
    for (; r->shown < n; r->shown++)
        printf("%5d %4d/%-4d %10.4f %9.4f %8.2f%% %8.2f\n", rr[r->shown].round, rr[r->shown].completed,
               rr[r->shown].selected, rr[r->shown].train_loss * r->unit, rr[r->shown].test_loss * r->unit,
               100.0 * rr[r->shown].test_accuracy, rr[r->shown].seconds);
}

/* Finds the run to follow: the given one, or the first newer than `before`,
 * or (with `after`) the latest if it ended at or after that time. */
static bool find_run(fm_report_t *r)
{
    if (r->run_id[0])
        return true;
    fm_run_row_t run;
    bool found = false;
    if (fm_store_latest_run(r->store, &run, &found) == FM_OK && found) {
        bool ended_after = r->after[0] && strcmp(run.status, "running") != 0 && run.finished_at[0] &&
                           strcmp(run.finished_at, r->after) >= 0;
        if (strcmp(run.id, r->before) != 0 || ended_after)
            snprintf(r->run_id, sizeof r->run_id, "%s", run.id);
        fm_store_run_clear(&run);
    }
    return r->run_id[0] != 0;
}

void fm_report_progress(fm_report_t *r)
{
    if (!open_store(r) || !find_run(r))
        return;
    fm_run_row_t run;
    bool found = false;
    if (!r->headed && fm_store_get_run(r->store, r->run_id, &run, &found) == FM_OK && found) {
        char tr[16], te[16];
        r->unit = fm_run_loss_unit(&run);
        printf("run %s\n%s%5s %9s %10s %9s %9s %8s\n", r->run_id,
               fm_run_holdout(&run) ? "holdout run: test_loss and test_acc are on held-out train/validation data\n" : "",
               "round", "clients", fm_run_loss_name(&run, "train", tr, sizeof tr),
               fm_run_loss_name(&run, "test", te, sizeof te), "test_acc", "seconds");
        r->headed = true;
        fm_store_run_clear(&run);
    }
    fm_round_row_t *rr;
    int n;
    if (r->headed && fm_store_list_rounds(r->store, r->run_id, &rr, &n) == FM_OK) {
        print_rounds(r, rr, n);
        free(rr);
    }
    fflush(stdout);
}

void fm_report_status(fm_report_t *r, char status[16])
{
    status[0] = 0;
    fm_run_row_t run;
    bool found = false;
    if (open_store(r) && find_run(r) && fm_store_get_run(r->store, r->run_id, &run, &found) == FM_OK && found) {
        snprintf(status, 16, "%s", run.status);
        fm_store_run_clear(&run);
    }
}

static void partition_desc(const char *json, char *buf, size_t cap)
{
    char scheme[32], v[32];
    json_field(json, "scheme", scheme, sizeof scheme, "?");
    if (!strcmp(scheme, "pathological")) {
        json_field(json, "classes_per_client", v, sizeof v, "?");
        snprintf(buf, cap, "pathological %s", v);
    } else if (!strcmp(scheme, "iid")) {
        snprintf(buf, cap, "IID");
    } else {
        json_field(json, "alpha", v, sizeof v, "?");
        snprintf(buf, cap, "%s %s", strcmp(scheme, "client-dirichlet") ? "Dirichlet" : "client Dirichlet", v);
    }
}

/* The clients of a round; text runs also show each one's test bits per byte. */
static void print_clients(fm_report_t *r, int round, const fm_run_row_t *run)
{
    bool text = fm_run_text(run);
    double unit = fm_run_loss_unit(run);
    fm_client_round_row_t *cr;
    int nc;
    if (fm_store_list_client_rounds(r->store, r->run_id, round, &cr, &nc) != FM_OK)
        return;
    printf("\n  %-12s %-9s %8s %7s %9s %9s%s\n", "client", "status", "samples", "tested", "test_acc", "gen_share",
           text ? "  test_bpb" : "");
    for (int i = 0; i < nc; i++) {
        printf("  %-12s %-9s %8lld %7lld %8.2f%% %9.3f", cr[i].client_id, cr[i].status,
               (long long)cr[i].train_samples, (long long)cr[i].test_samples, 100.0 * cr[i].test_accuracy,
               cr[i].generalist_share);
        if (text)
            printf(" %9.4f", cr[i].test_loss * unit);
        printf("\n");
    }
    free(cr);
}

/* Text runs: the final and best test bits per byte (and perplexity per byte). */
static void print_text_loss(const fm_round_row_t *rr, int n, double unit, bool holdout)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (rr[i].test_loss < rr[best].test_loss)
            best = i;
    double bpb = rr[n - 1].test_loss * unit;
    printf("  %-26s %.4f (perplexity %.2f a byte)\n", holdout ? "final holdout bits/byte" : "final test bits/byte",
           bpb, pow(2.0, bpb));
    printf("  best %-21s %.4f (round %d)\n", holdout ? "holdout bits/byte" : "test bits/byte",
           rr[best].test_loss * unit, rr[best].round);
}

static void print_summary(fm_report_t *r, const fm_round_row_t *rr, int n, const fm_run_row_t *run)
{
    bool holdout = fm_run_holdout(run); /* accuracies are then on the held-out part, not on test */
    int best = 0;
    double secs = 0;
    long long up = 0, down = 0;
    for (int i = 0; i < n; i++) {
        if (rr[i].test_accuracy > rr[best].test_accuracy)
            best = i;
        secs += rr[i].seconds;
        up += rr[i].bytes_up;
        down += rr[i].bytes_down;
    }
    char part[64], clients[16];
    partition_desc(run->config, part, sizeof part);
    json_field(run->config, "count", clients, sizeof clients, "?");
    printf("\nsummary: run %s, strategy %s, %s, %s clients, seed %llu\n", r->run_id, run->strategy, part, clients,
           (unsigned long long)run->seed);
    printf("  %-26s %d of %d%s\n", "rounds", n, run->rounds_planned, strcmp(run->status, "finished") ? " (stopped)" : "");
    if (fm_run_text(run))
        print_text_loss(rr, n, fm_run_loss_unit(run), holdout);
    printf("  %-26s %.2f%%%s\n", holdout ? "final holdout accuracy" : "final test accuracy",
           100.0 * rr[n - 1].test_accuracy, holdout ? " (test splits unused)" : "");
    printf("  best %-21s %.2f%% (round %d)\n", holdout ? "holdout accuracy" : "test accuracy",
           100.0 * rr[best].test_accuracy, rr[best].round);
    printf("  %-26s %.4f\n", fm_run_text(run) ? "final mean train bits/byte" : "final mean train loss",
           rr[n - 1].train_loss * fm_run_loss_unit(run));
    printf("  %-26s %.2f s\n", "mean round time", secs / n);
    printf("  %-26s %.1f s\n", "wall time", fm_clock_seconds() - r->t0);
    printf("  %-26s %.1f MB up, %.1f MB down\n", "traffic", up / 1e6, down / 1e6);
    print_clients(r, rr[n - 1].round, run);
}

int fm_report_summary(fm_report_t *r)
{
    fm_report_progress(r);
    fm_run_row_t run;
    bool found = false;
    if (!r->store || !r->run_id[0] || fm_store_get_run(r->store, r->run_id, &run, &found) != FM_OK || !found) {
        fprintf(stderr, "the coordinator logged no run in %s\n", r->db);
        return 1;
    }
    int rc = 0, n = 0;
    fm_round_row_t *rr;
    if (fm_store_list_rounds(r->store, r->run_id, &rr, &n) == FM_OK && n > 0) {
        print_rounds(r, rr, n);
        print_summary(r, rr, n, &run);
    } else {
        fprintf(stderr, "run %s has no rounds\n", r->run_id);
        rc = 1;
    }
    free(n > 0 ? rr : NULL);
    fm_store_run_clear(&run);
    fflush(stdout);
    return rc;
}

void fm_report_end(fm_report_t *r) { fm_store_close(&r->store); }
