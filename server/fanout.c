#include "fanout.h"

#include <stdlib.h>
#include <string.h>

enum { IDLE = 0, QUEUED, FLYING, STATE = 3, IN_RING = 4 }; /* (one left while queued keeps its place) */

void fm_fanout_free(fm_fanout_t *f)
{
    free(f->state);
    free(f->sent_at);
    free(f->queue);
    memset(f, 0, sizeof *f);
}

fm_status fm_fanout_reset(fm_fanout_t *f, int n, size_t task_bytes)
{
    fm_fanout_free(f);
    size_t k = n > 0 ? (size_t)n : 1;
    f->state = calloc(k, 1);
    f->sent_at = calloc(k, sizeof(double));
    f->queue = malloc(k * sizeof(int));
    if (!f->state || !f->sent_at || !f->queue) {
        fm_fanout_free(f);
        return FM_ERR_NOMEM;
    }
    f->n = n;
    size_t w = FM_FANOUT_BYTES / (task_bytes ? task_bytes : 1);
    f->window = w < FM_FANOUT_MIN ? FM_FANOUT_MIN : w > FM_FANOUT_MAX ? FM_FANOUT_MAX : (int)w;
    return FM_OK;
}

static void land(fm_fanout_t *f, int j)
{
    f->state[f->flight[j]] = IDLE;
    f->flight[j] = f->flight[--f->inflight];
}

/* Participant i, if in flight, gives up its place. */
static void land_participant(fm_fanout_t *f, int i)
{
    for (int j = 0; (f->state[i] & STATE) == FLYING && j < f->inflight; j++)
        if (f->flight[j] == i)
            land(f, j);
}

void fm_fanout_push(fm_fanout_t *f, int i)
{
    if (i < 0 || i >= f->n)
        return;
    land_participant(f, i); /* (sent, due again: it queues like the rest) */
    if ((f->state[i] & STATE) != IDLE)
        return;
    if (!(f->state[i] & IN_RING))
        f->queue[(f->head + f->queued++) % f->n] = i;
    f->state[i] = QUEUED | IN_RING;
}

void fm_fanout_done(fm_fanout_t *f, int i)
{
    if (i < 0 || i >= f->n)
        return;
    if ((f->state[i] & STATE) == QUEUED)
        f->state[i] = IN_RING; /* (skipped when its turn comes) */
    land_participant(f, i);
}

int fm_fanout_queued(const fm_fanout_t *f, int i) { return i >= 0 && i < f->n && (f->state[i] & STATE) == QUEUED; }

double fm_fanout_sent_at(const fm_fanout_t *f, int i)
{
    return i >= 0 && i < f->n && (f->state[i] & STATE) == FLYING ? f->sent_at[i] : -1.0;
}

int fm_fanout_next(fm_fanout_t *f, double now)
{
    for (int j = f->inflight - 1; j >= 0; j--)
        if (now - f->sent_at[f->flight[j]] >= FM_FANOUT_ACK_S)
            land(f, j);
    while (f->queued > 0 && f->inflight < f->window) {
        int i = f->queue[f->head];
        f->head = (f->head + 1) % f->n;
        f->queued--;
        f->state[i] &= STATE;
        if (f->state[i] != QUEUED)
            continue; /* left the round while queued */
        f->state[i] = FLYING;
        f->sent_at[i] = now;
        f->flight[f->inflight++] = i;
        return i;
    }
    return -1;
}
