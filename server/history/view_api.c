/* view_api.c - the browser view's JSON API (view_api.h, docs/http.md). */
#define _GNU_SOURCE /* qsort_r */
#include "view_api.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/log.h"
#include "fedmoe/record.h"
#include "fedmoe/report.h"

/* ---- JSON ------------------------------------------------------------------------ */

/* A number, or null when it is not finite (JSON has no NaN). */
static void jnum(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, "%.9g", v);
    else
        fputs("null", f);
}

static void key(FILE *f, bool *first, const char *k)
{
    fprintf(f, "%s\"%s\":", *first ? "" : ",", k);
    *first = false;
}

static void knum(FILE *f, bool *first, const char *k, double v)
{
    key(f, first, k);
    jnum(f, v);
}

static void kstr(FILE *f, bool *first, const char *k, const char *v)
{
    key(f, first, k);
    fm_json_str(f, v);
}

static void run_json(FILE *f, const fm_run_row_t *r, const fm_round_row_t *last)
{
    bool first = true;
    fputc('{', f);
    kstr(f, &first, "id", r->id);
    kstr(f, &first, "strategy", r->strategy);
    kstr(f, &first, "status", r->status);
    knum(f, &first, "seed", (double)r->seed);
    knum(f, &first, "rounds_planned", r->rounds_planned);
    knum(f, &first, "rounds_done", r->rounds_done);
    kstr(f, &first, "started_at", r->started_at);
    kstr(f, &first, "finished_at", r->finished_at);
    key(f, &first, "text");
    fputs(fm_run_text(r) ? "true" : "false", f);
    key(f, &first, "holdout");
    fputs(fm_run_holdout(r) ? "true" : "false", f);
    key(f, &first, "last");
    if (last) {
        bool one = true;
        fputc('{', f);
        knum(f, &one, "round", last->round);
        knum(f, &one, "test_accuracy", last->test_accuracy);
        knum(f, &one, "test_loss", last->test_loss);
        knum(f, &one, "val_accuracy", last->val_accuracy);
        knum(f, &one, "epsilon", last->epsilon);
        fputc('}', f);
    } else {
        fputs("null", f);
    }
    fputc('}', f);
}

static void round_json(FILE *f, const fm_round_row_t *r) { fm_record_json(f, &fm_round_record, r, NULL); }

static void client_json(FILE *f, const fm_client_round_row_t *c)
{
    fm_record_json(f, &fm_client_round_record, c, NULL);
}

/* ---- answers ----------------------------------------------------------------------- */

typedef struct {
    FILE *f;
    int status;
} answer_t;

static void error(answer_t *a, int status, const char *why)
{
    a->status = status;
    fputs("{\"error\":", a->f);
    fm_json_str(a->f, why);
    fputc('}', a->f);
}

/* Query parameter `name` as an integer in [lo, hi] (def when absent): false
 * (a 400 answered) when it is not one. */
static bool int_arg(answer_t *a, fm_view_arg_fn arg, void *ctx, const char *name, long lo, long hi, long def,
                    long *out)
{
    const char *v = arg(ctx, name);
    *out = def;
    if (!v)
        return true;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi) {
        char why[160];
        snprintf(why, sizeof why, "%s: expected an integer in %ld..%ld, got '%.40s'", name, lo, hi, v);
        error(a, 400, why);
        return false;
    }
    *out = x;
    return true;
}

/* The run's last committed round into *out; false when it has none. */
static bool last_round(fm_store_t *st, const fm_run_row_t *run, fm_round_row_t *out)
{
    fm_round_row_t *r = NULL;
    int n = 0;
    /* (rounds_done is the count of committed rounds, numbered from 1) */
    bool got = fm_store_list_rounds_since(st, run->id, run->rounds_done - 1, 1, &r, &n) == FM_OK && n == 1;
    if (got)
        *out = r[0];
    free(r);
    return got;
}

static void runs(answer_t *a, fm_store_t *st)
{
    fm_run_row_t *r;
    int n;
    if (fm_store_list_runs(st, &r, &n) != FM_OK) {
        error(a, 500, fm_error_last());
        return;
    }
    fputs("{\"runs\":[", a->f);
    for (int i = 0; i < n; i++) {
        fm_round_row_t last;
        fputs(i ? "," : "", a->f);
        run_json(a->f, &r[i], last_round(st, &r[i], &last) ? &last : NULL);
        fm_store_run_clear(&r[i]);
    }
    free(r);
    fputs("]}", a->f);
}

/* The run named id into *run (404 answered when there is none). */
static bool find_run(answer_t *a, fm_store_t *st, const char *id, fm_run_row_t *run)
{
    bool found = false;
    if (fm_store_get_run(st, id, run, &found) != FM_OK) {
        error(a, 500, fm_error_last());
        return false;
    }
    if (!found) {
        char why[160];
        snprintf(why, sizeof why, "no run '%.64s'", id);
        error(a, 404, why);
    }
    return found;
}

static void run_detail(answer_t *a, fm_store_t *st, const fm_run_row_t *run)
{
    fm_round_row_t last;
    fputs("{\"run\":", a->f);
    run_json(a->f, run, last_round(st, run, &last) ? &last : NULL);
    /* (the config is the coordinator's own JSON object) */
    fprintf(a->f, ",\"config\":%s}", run->config && run->config[0] == '{' ? run->config : "null");
}

/* A page of rounds: ?since=R (0) and ?limit=N (1..FM_VIEW_ROUNDS_LIMIT); false
 * (a 400 answered) when either is bad. The store is asked for limit + 1 rows:
 * whether more follow. */
typedef struct {
    long since, limit;
} page_t;

static bool page_args(answer_t *a, fm_view_arg_fn arg, void *ctx, page_t *p)
{
    return int_arg(a, arg, ctx, "since", 0, 1 << 30, 0, &p->since) &&
           int_arg(a, arg, ctx, "limit", 1, FM_VIEW_ROUNDS_LIMIT, FM_VIEW_ROUNDS_LIMIT, &p->limit);
}

/* Of n rows fetched (limit + 1 asked), those to show. */
static int page_rows(const page_t *p, int n)
{
    return n > p->limit ? (int)p->limit : n;
}

/* The page's end after its rows, the last shown one of round last_round:
 * "],"next_since":R,"more":B}". */
static void page_end(answer_t *a, const page_t *p, int fetched, int last_round)
{
    int shown = page_rows(p, fetched);
    fprintf(a->f, "],\"next_since\":%d,\"more\":%s}", shown ? last_round : (int)p->since,
            fetched > p->limit ? "true" : "false");
}

static void rounds(answer_t *a, fm_store_t *st, const fm_run_row_t *run, fm_view_arg_fn arg, void *ctx)
{
    page_t p;
    if (!page_args(a, arg, ctx, &p))
        return;
    fm_round_row_t *r;
    int n;
    if (fm_store_list_rounds_since(st, run->id, (int)p.since, (int)p.limit + 1, &r, &n) != FM_OK) {
        error(a, 500, fm_error_last());
        return;
    }
    int shown = page_rows(&p, n);
    fprintf(a->f, "{\"run\":");
    fm_json_str(a->f, run->id);
    fprintf(a->f, ",\"status\":");
    fm_json_str(a->f, run->status);
    fputs(",\"rounds\":[", a->f);
    for (int i = 0; i < shown; i++) {
        fputs(i ? "," : "", a->f);
        round_json(a->f, &r[i]);
    }
    page_end(a, &p, n, shown ? r[shown - 1].round : 0);
    free(r);
}

/* A round's client table sorts by any field of the client row (record.h), by
 * its key ("client", "status", "train_loss", ...), in either order. */
typedef struct {
    const fm_field_t *k;
    int dir; /* 1 ascending, -1 descending */
} sort_t;

static int cmp_clients(const void *pa, const void *pb, void *arg)
{
    const sort_t *s = arg;
    const fm_client_round_row_t *a = pa, *b = pb;
    int c;
    if (s->k->type == FM_FIELD_TEXT) {
        c = strcmp(fm_field_text(s->k, a), fm_field_text(s->k, b));
    } else {
        double x = fm_field_num(s->k, a), y = fm_field_num(s->k, b);
        c = (x > y) - (x < y);
    }
    return c ? s->dir * c : strcmp(a->client_id, b->client_id); /* (ties: by client, one order) */
}

/* The sort of ?sort=KEY&order=asc|desc (client, ascending by default); false
 * when either is unknown (a 400 answered). */
static bool sort_arg(answer_t *a, fm_view_arg_fn arg, void *ctx, sort_t *s)
{
    const char *k = arg(ctx, "sort"), *o = arg(ctx, "order");
    s->k = fm_record_field(&fm_client_round_record, k ? k : "client");
    s->dir = 1;
    if (!s->k) {
        char why[400] = "sort: expected one of";
        for (int j = 0; j < fm_client_round_record.count; j++) /* (the record's keys, so the two cannot differ) */
            snprintf(why + strlen(why), sizeof why - strlen(why), "%s %s", j ? "," : "",
                     fm_client_round_record.fields[j].key);
        error(a, 400, why);
        return false;
    }
    if (o && strcmp(o, "asc") != 0 && strcmp(o, "desc") != 0) {
        error(a, 400, "order: expected asc or desc");
        return false;
    }
    s->dir = o && !strcmp(o, "desc") ? -1 : 1;
    return true;
}

static void round_clients(answer_t *a, fm_store_t *st, const fm_run_row_t *run, const char *round_text,
                          fm_view_arg_fn arg, void *ctx)
{
    char *end;
    long round = strtol(round_text, &end, 10);
    long offset, limit;
    sort_t s;
    if (!*round_text || *end || round < 1 || round > (1 << 30)) {
        error(a, 400, "round: expected a round number");
        return;
    }
    if (!int_arg(a, arg, ctx, "offset", 0, 1 << 30, 0, &offset) ||
        !int_arg(a, arg, ctx, "limit", 1, FM_VIEW_CLIENTS_MAX, FM_VIEW_CLIENTS_LIMIT, &limit) || !sort_arg(a, arg, ctx, &s))
        return;
    fm_client_round_row_t *c;
    int n;
    if (fm_store_list_client_rounds(st, run->id, (int)round, &c, &n) != FM_OK) {
        error(a, 500, fm_error_last());
        return;
    }
    if (n == 0) {
        char why[160];
        snprintf(why, sizeof why, "run %.64s has no round %ld", run->id, round);
        error(a, 404, why);
        return;
    }
    qsort_r(c, (size_t)n, sizeof *c, cmp_clients, &s);
    fprintf(a->f, "{\"run\":");
    fm_json_str(a->f, run->id);
    fprintf(a->f, ",\"round\":%ld,\"total\":%d,\"offset\":%ld,\"clients\":[", round, n, offset);
    for (long i = offset; i < n && i < offset + limit; i++) {
        fputs(i > offset ? "," : "", a->f);
        client_json(a->f, &c[i]);
    }
    fputs("]}", a->f);
    free(c);
}

static void client_history(answer_t *a, fm_store_t *st, const fm_run_row_t *run, const char *client,
                           fm_view_arg_fn arg, void *ctx)
{
    page_t p;
    if (!page_args(a, arg, ctx, &p))
        return;
    fm_client_round_row_t *c;
    int n;
    if (fm_store_client_history(st, run->id, client, (int)p.since, (int)p.limit + 1, &c, &n) != FM_OK) {
        error(a, 500, fm_error_last());
        return;
    }
    if (n == 0 && p.since == 0) {
        char why[200];
        snprintf(why, sizeof why, "run %.64s has no client '%.64s'", run->id, client);
        error(a, 404, why);
        return;
    }
    int shown = page_rows(&p, n);
    fprintf(a->f, "{\"run\":");
    fm_json_str(a->f, run->id);
    fputs(",\"client\":", a->f);
    fm_json_str(a->f, client);
    fputs(",\"rounds\":[", a->f);
    for (int i = 0; i < shown; i++) {
        fputs(i ? "," : "", a->f);
        client_json(a->f, &c[i]);
    }
    page_end(a, &p, n, shown ? c[shown - 1].round : 0);
    free(c);
}

/* Splits path into at most max segments (in buf, cap bytes); their count, or
 * -1 when a segment is empty or there are more. */
static int segments(const char *path, char *buf, size_t cap, char **seg, int max)
{
    snprintf(buf, cap, "%s", path);
    int n = 0;
    for (char *p = buf; *p;) {
        if (*p != '/' || n == max)
            return -1;
        *p++ = 0;
        seg[n++] = p;
        p += strcspn(p, "/");
        if (p == seg[n - 1])
            return -1;
    }
    return n;
}

void fm_view_api(fm_store_t *st, const char *path, fm_view_arg_fn arg, void *ctx, fm_view_reply_t *out)
{
    memset(out, 0, sizeof *out);
    answer_t a = {.f = open_memstream(&out->body, &out->len), .status = 200};
    if (!a.f) {
        out->status = 500;
        return;
    }
    char buf[512], *seg[6];
    int n = strlen(path) < sizeof buf ? segments(path, buf, sizeof buf, seg, 6) : -1;
    fm_run_row_t run = {0};
    if (n < 2 || strcmp(seg[0], "api") != 0 || strcmp(seg[1], "runs") != 0) {
        error(&a, 404, "no such path; the API: /api/runs, /api/runs/RUN, /api/runs/RUN/rounds, "
                       "/api/runs/RUN/rounds/ROUND/clients, /api/runs/RUN/clients/CLIENT");
    } else if (n == 2) {
        runs(&a, st);
    } else if (find_run(&a, st, seg[2], &run)) {
        if (n == 3)
            run_detail(&a, st, &run);
        else if (n == 4 && !strcmp(seg[3], "rounds"))
            rounds(&a, st, &run, arg, ctx);
        else if (n == 6 && !strcmp(seg[3], "rounds") && !strcmp(seg[5], "clients"))
            round_clients(&a, st, &run, seg[4], arg, ctx);
        else if (n == 5 && !strcmp(seg[3], "clients"))
            client_history(&a, st, &run, seg[4], arg, ctx);
        else
            error(&a, 404, "no such path under the run (rounds, rounds/ROUND/clients, clients/CLIENT)");
    }
    fm_store_run_clear(&run);
    fclose(a.f);
    out->status = a.status;
}
