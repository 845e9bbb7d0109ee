#include "budget.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/log.h"

typedef struct {
    double rate, burst;
    const char *what; /* in the summary line */
} kind_t;

static const kind_t kinds[FM_BUDGET_KINDS] = {
    [FM_BUDGET_REPLY] = {10.0, 20.0, "error replies withheld"},
    [FM_BUDGET_WELCOME] = {1.0, 4.0, "repeated hellos not answered"},
    [FM_BUDGET_CHANGE] = {1.0 / 60.0, 2.0, "hellos changing partition or counts refused"},
    [FM_BUDGET_REPORT] = {0.2, 5.0, "error reports from clients not logged"},
    [FM_BUDGET_REFUSAL] = {0.2, 5.0, "refusals not logged"},
    [FM_BUDGET_HANDSHAKE] = {0.5, 8.0, "handshakes put off (too many from one key)"},
    [FM_BUDGET_UNREADABLE] = {0.1, 4.0, "unreadable messages past the allowance"},
};

typedef struct {
    char id[64]; /* "" : a free entry */
    double tokens[FM_BUDGET_KINDS], at[FM_BUDGET_KINDS];
    uint32_t refused[FM_BUDGET_KINDS]; /* in the current summary window */
    uint32_t window[FM_BUDGET_KINDS];  /* which window refused counts */
    double held_until;                 /* fm_budget_hold */
} entry_t;

typedef struct {
    unsigned long total, window_count;
    int ids;
    char most_id[64];
    uint32_t most;
} summary_t;

struct fm_budget {
    entry_t *e;
    size_t cap; /* a power of two, at least twice max_ids */
    int used, max_ids;
    uint32_t window;
    double window_start;
    summary_t sum[FM_BUDGET_KINDS];
};

fm_status fm_budget_new(fm_budget_t **out, int max_ids)
{
    *out = NULL;
    max_ids = max_ids < 16 ? 16 : max_ids;
    size_t cap = 32;
    while (cap < 2 * (size_t)max_ids)
        cap *= 2;
    fm_budget_t *b = calloc(1, sizeof *b);
    if (!b || !(b->e = calloc(cap, sizeof *b->e))) {
        free(b);
        return FM_ERR_NOMEM;
    }
    b->cap = cap;
    b->max_ids = max_ids;
    b->window = 1;
    b->window_start = -1.0;
    *out = b;
    return FM_OK;
}

void fm_budget_free(fm_budget_t **bp)
{
    fm_budget_t *b = bp ? *bp : NULL;
    if (!b)
        return;
    free(b->e);
    free(b);
    *bp = NULL;
}

static uint64_t hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Starts the table afresh (full buckets for everyone), but for the ids held
 * at now, which keep their holds: a flood of new ids cannot end a hold. The held
 * entries are rehashed into a fresh table (they are at most max_ids, so they
 * fit); without memory for it, everything starts afresh. */
static void reset(fm_budget_t *b, double now)
{
    entry_t *old = b->e, *fresh = calloc(b->cap, sizeof *fresh);
    b->used = 0;
    if (!fresh) {
        memset(old, 0, b->cap * sizeof *old);
        return;
    }
    for (size_t j = 0; j < b->cap; j++) {
        if (!old[j].id[0] || now >= old[j].held_until)
            continue;
        size_t i = hash(old[j].id) & (b->cap - 1);
        while (fresh[i].id[0])
            i = (i + 1) & (b->cap - 1);
        fresh[i] = old[j];
        b->used++;
    }
    b->e = fresh;
    free(old);
}

/* id's entry, made (full buckets) if new. */
static entry_t *find(fm_budget_t *b, const char *id, double now)
{
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = hash(id) & (b->cap - 1);; i = (i + 1) & (b->cap - 1)) {
            entry_t *e = &b->e[i];
            if (e->id[0] && strncmp(e->id, id, sizeof e->id - 1) == 0)
                return e;
            if (e->id[0])
                continue;
            if (b->used >= b->max_ids)
                break; /* full: start afresh */
            snprintf(e->id, sizeof e->id, "%s", id);
            for (int k = 0; k < FM_BUDGET_KINDS; k++) {
                e->tokens[k] = kinds[k].burst;
                e->at[k] = now;
            }
            b->used++;
            return e;
        }
        reset(b, now);
    }
    return NULL; /* (not reached: a reset table has room) */
}

bool fm_budget_take(fm_budget_t *b, const char *id, fm_budget_kind kind, double now)
{
    entry_t *e = find(b, id, now);
    if (!e)
        return true;
    const kind_t *k = &kinds[kind];
    double t = e->tokens[kind] + (now > e->at[kind] ? now - e->at[kind] : 0.0) * k->rate;
    e->tokens[kind] = t > k->burst ? k->burst : t;
    e->at[kind] = now > e->at[kind] ? now : e->at[kind];
    if (e->tokens[kind] >= 1.0) {
        e->tokens[kind] -= 1.0;
        return true;
    }
    summary_t *s = &b->sum[kind];
    if (e->window[kind] != b->window) {
        e->window[kind] = b->window;
        e->refused[kind] = 0;
        s->ids++;
    }
    e->refused[kind]++;
    s->total++;
    s->window_count++;
    if (e->refused[kind] > s->most) {
        s->most = e->refused[kind];
        snprintf(s->most_id, sizeof s->most_id, "%s", e->id);
    }
    if (b->window_start < 0.0)
        b->window_start = now;
    return false;
}

void fm_budget_hold(fm_budget_t *b, const char *id, double until, double now)
{
    entry_t *e = find(b, id, now);
    if (e && until > e->held_until)
        e->held_until = until;
}

bool fm_budget_held(fm_budget_t *b, const char *id, double now)
{
    entry_t *e = find(b, id, now);
    return e && now < e->held_until;
}

void fm_budget_flush(fm_budget_t *b, double now)
{
    if (b->window_start < 0.0 || now - b->window_start < FM_BUDGET_SUMMARY_S)
        return;
    for (int k = 0; k < FM_BUDGET_KINDS; k++) {
        summary_t *s = &b->sum[k];
        if (s->window_count)
            fm_warn("%lu %s in the last %.0f s, from %d client id%s (most from %s: %u)", s->window_count,
                    kinds[k].what, now - b->window_start, s->ids, s->ids == 1 ? "" : "s", s->most_id, s->most);
        s->window_count = 0;
        s->ids = 0;
        s->most = 0;
    }
    b->window++;
    b->window_start = -1.0;
}

unsigned long fm_budget_refused(const fm_budget_t *b, fm_budget_kind kind) { return b->sum[kind].total; }
