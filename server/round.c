#include "round.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/clock.h"

static const char *part_names[] = {"awaited", "completed", "rejected", "dropped", "dropped"};

const char *fm_part_state_name(fm_part_state s) { return (unsigned)s < 5 ? part_names[s] : "?"; }

void fm_round_init(fm_round_t *r, int first, double timeout)
{
    memset(r, 0, sizeof *r);
    r->state = FM_ROUND_WAITING;
    r->number = first;
    r->timeout = timeout;
}

static void free_parts(fm_round_t *r)
{
    for (int i = 0; i < r->nparts; i++)
        free(r->parts[i].prompt);
    free(r->parts);
    free(r->by_slot);
    r->parts = NULL;
    r->by_slot = NULL;
    r->nparts = r->nslots = 0;
}

void fm_round_free(fm_round_t *r) { free_parts(r); }

fm_status fm_round_open(fm_round_t *r, const int *slots, char (*ids)[64], int n, double now)
{
    if (r->state != FM_ROUND_WAITING || n < 1)
        return FM_ERR_STATE;
    int nslots = 0;
    for (int i = 0; i < n; i++)
        nslots = slots[i] >= nslots ? slots[i] + 1 : nslots;
    fm_participant_t *p = calloc((size_t)n, sizeof *p);
    int *by_slot = malloc(sizeof(int) * (size_t)nslots);
    if (!p || !by_slot) {
        free(p);
        free(by_slot);
        return FM_ERR_NOMEM;
    }
    for (int s = 0; s < nslots; s++)
        by_slot[s] = -1;
    for (int i = 0; i < n; i++) {
        by_slot[slots[i]] = i;
        p[i].slot = slots[i];
        p[i].state = FM_PART_AWAITED;
        snprintf(p[i].row.client_id, sizeof p[i].row.client_id, "%s", ids[i]);
        p[i].row.round = r->number;
    }
    r->parts = p;
    r->nparts = n;
    r->by_slot = by_slot;
    r->nslots = nslots;
    r->state = FM_ROUND_OPEN;
    r->started = now;
    r->deadline = now + r->timeout;
    r->extensions = 0;
    fm_clock_utc(r->started_at);
    return FM_OK;
}

fm_participant_t *fm_round_find(fm_round_t *r, int slot)
{
    if (r->state != FM_ROUND_OPEN || slot < 0 || slot >= r->nslots || r->by_slot[slot] < 0)
        return NULL;
    return &r->parts[r->by_slot[slot]];
}

void fm_round_complete(fm_round_t *r, fm_participant_t *p, float **prompt)
{
    (void)r;
    if (p->state != FM_PART_AWAITED)
        return;
    p->state = FM_PART_COMPLETED;
    if (prompt) {
        free(p->prompt);
        p->prompt = *prompt;
        *prompt = NULL;
    }
}

void fm_round_refuse(fm_round_t *r, fm_participant_t *p)
{
    (void)r;
    if (p->state == FM_PART_AWAITED)
        p->state = FM_PART_REFUSED;
}

void fm_round_lose(fm_round_t *r, fm_participant_t *p)
{
    (void)r;
    if (p->state == FM_PART_AWAITED)
        p->state = FM_PART_GONE;
}

bool fm_round_rejoin(fm_round_t *r, fm_participant_t *p)
{
    (void)r;
    if (p->state == FM_PART_GONE)
        p->state = FM_PART_AWAITED;
    return p->state == FM_PART_AWAITED;
}

int fm_round_count(const fm_round_t *r, fm_part_state s)
{
    int n = 0;
    for (int i = 0; i < r->nparts; i++)
        n += r->parts[i].state == s;
    return n;
}

fm_round_verdict fm_round_decide(fm_round_t *r, double now, int quorum)
{
    if (r->state != FM_ROUND_OPEN)
        return FM_VERDICT_WAIT;
    int done = fm_round_count(r, FM_PART_COMPLETED), awaited = fm_round_count(r, FM_PART_AWAITED);
    if (awaited > 0 && now < r->deadline)
        return FM_VERDICT_WAIT;
    if (awaited > 0 && done < quorum && done + awaited >= quorum && r->extensions < FM_ROUND_MAX_EXTENSIONS) {
        /* short of the quorum, but clients alive are still training: wait for them
         * rather than run the round again and make them start over */
        r->extensions++;
        r->deadline = now + r->timeout;
        return FM_VERDICT_EXTEND;
    }
    for (int i = 0; i < r->nparts; i++)
        if (r->parts[i].state == FM_PART_AWAITED)
            r->parts[i].state = FM_PART_DROPPED;
    return done >= quorum ? FM_VERDICT_COMMIT : FM_VERDICT_ABANDON;
}

void fm_round_close(fm_round_t *r, bool committed)
{
    free_parts(r);
    r->state = FM_ROUND_WAITING;
    if (committed)
        r->number++;
}
