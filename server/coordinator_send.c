/* What the coordinator sends: the round's Tasks and upload Grants through
 * their fan-out windows, Errors under each key's reply budget, and the one
 * encoder they share. The handlers of what it receives are in coordinator.c. */
#include "coordinator_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/knn.h"
#include "fedmoe/log.h"

/* ---- sending ---------------------------------------------------------------- */

int64_t fm_coord_emit(fm_coordinator_t *c, const char *id, Fedmoe__Envelope *env)
{
    uint8_t *buf;
    size_t len;
    if (fm_wire_encode(env, &buf, &len) != FM_OK)
        return 0;
    fm_frame_t f = {buf, len, NULL};
    c->send(c->send_user, id, &f, 1);
    free(buf);
    return (int64_t)len;
}

void fm_coord_send_error(fm_coordinator_t *c, const char *id, fm_wire_code code, const char *text)
{
    if (!fm_budget_take(c->budget, id, FM_BUDGET_REPLY, c->now))
        return; /* (counted; budget.h logs the sum) */
    if (fm_budget_take(c->budget, id, FM_BUDGET_REFUSAL, c->now) &&
        fm_log_limit_take(&c->refusals, c->now, WARNINGS_PER_SECOND, "refusals"))
        fm_warn("client %s: %s", id, text);
    uint8_t *buf;
    size_t len;
    if (fm_wire_encode_error(code, text, &buf, &len) == FM_OK) {
        fm_frame_t f = {buf, len, NULL};
        c->send(c->send_user, id, &f, 1);
        free(buf);
    }
}

uint32_t fm_coord_heartbeat_ms(double client_timeout)
{
    double ms = client_timeout * 1000.0 / 4.0;
    return (uint32_t)(ms < 1000.0 ? 1000.0 : ms > 5000.0 ? 5000.0 : ms);
}

/* ---- tasks ------------------------------------------------------------------ */



/* The K nearest pool prompts of every participant (pool strategies), in one
 * batched search at the round's opening (the pool changes only at commits):
 * into c->nearest (K a participant, as registry slots: a client joining while
 * Tasks wait in the fan-out window moves the id order, never a slot) and
 * c->nearest_found. */
static fm_status nearest_prompts(fm_coordinator_t *c)
{
    free(c->nearest);
    free(c->nearest_found);
    c->nearest = NULL;
    c->nearest_found = NULL;
    int n = fm_registry_count(c->reg), m = c->round.nparts, k = c->spec.model.max_nonlocal;
    if (!fm_exchange_of(&c->spec).pool || k <= 0)
        return FM_OK;
    const int *order = fm_registry_sorted(c->reg);
    const float **entries = malloc(sizeof(float *) * (size_t)(n ? n : 1));
    int *pos = malloc(sizeof(int) * (size_t)(n ? n : 1)), *selves = malloc(sizeof(int) * (size_t)m);
    c->nearest = malloc(sizeof(int) * (size_t)m * (size_t)k);
    c->nearest_found = malloc(sizeof(int) * (size_t)m);
    fm_status st = entries && pos && selves && c->nearest && c->nearest_found ? FM_OK : FM_ERR_NOMEM;
    for (int i = 0; st == FM_OK && i < n; i++) {
        entries[i] = fm_registry_at(c->reg, order[i])->prompt;
        pos[order[i]] = i;
    }
    for (int q = 0; st == FM_OK && q < m; q++)
        selves[q] = pos[c->round.parts[q].slot];
    if (st == FM_OK)
        st = fm_knn_batch(entries, n, c->dims.nprompt, selves, m, k, c->nearest, c->nearest_found);
    for (int q = 0; st == FM_OK && q < m; q++)
        for (int j = 0; j < c->nearest_found[q]; j++)
            c->nearest[(size_t)q * k + j] = order[c->nearest[(size_t)q * k + j]];
    free(entries);
    free(pos);
    free(selves);
    if (st != FM_OK)
        fm_error_set("out of memory choosing the nearest prompts");
    return st;
}

static fm_task_t round_task(const fm_coordinator_t *c)
{
    return (fm_task_t){.round = (uint32_t)c->round.number,
                       .lr_scale = fm_lr_schedule_scale(c->spec.lr_schedule, c->round.number, c->cfg.rounds),
                       .eval_sample = fm_run_eval_sample(&c->spec, c->round.number, c->cfg.rounds),
                       .model = c->global,
                       .prompt = c->gprompt};
}

/* The Task of participant p: the round's shared part (the global state, encoded
 * once), then p's K nearest pool prompts and nonce. */
static void send_task(fm_coordinator_t *c, fm_participant_t *p)
{
    fm_client_t *cl = fm_registry_at(c->reg, p->slot);
    const float *nl[64];
    fm_task_t t = round_task(c);
    int q = fm_coord_part_index(c, p), k = c->spec.model.max_nonlocal;
    t.nonlocal = nl;
    t.k = c->nearest ? (c->nearest_found[q] < 64 ? c->nearest_found[q] : 64) : 0;
    for (int j = 0; j < t.k && j < 64; j++)
        nl[j] = fm_registry_at(c->reg, c->nearest[(size_t)q * k + j])->prompt;
    memcpy(t.nonce, p->nonce, FM_NONCE_BYTES);
    t.sa = fm_coord_sa_setup(c, p);
    uint8_t *own;
    size_t len, head;
    if (fm_exchange_encode_task_own(&c->spec, &c->dims, &t, fm_blob_len(c->task_shared), &own, &len, &head) !=
        FM_OK) {
        fm_errorf("round %d: cannot build the task for %s: %s", c->round.number, cl->id, fm_error_last());
        return;
    }
    fm_frame_t f[3];
    fm_exchange_task_frames(own, len, head, c->task_shared, f);
    p->task_sent_at = c->now;
    if (c->send(c->send_user, cl->id, f, 3) == FM_OK) {
        int64_t bytes = (int64_t)fm_frames_len(f, 3);
        p->row.bytes_down += bytes;
        c->bytes_down += bytes;
    } else {
        fm_warn("round %d: task to %s not sent: %s", c->round.number, cl->id, fm_error_last());
    }
    free(own);
}

fm_status fm_coord_start_tasks(fm_coordinator_t *c)
{
    fm_coord_end_tasks(c);
    fm_task_t t = round_task(c);
    fm_status st = nearest_prompts(c);
    if (st == FM_OK)
        st = fm_exchange_encode_task_shared(&c->spec, &c->dims, &t, &c->task_shared);
    size_t own = 64 + (size_t)c->dims.max_nonlocal * (c->dims.nprompt * 4 + 96);
    if (st == FM_OK)
        st = fm_fanout_reset(&c->fanout, c->round.nparts, fm_blob_len(c->task_shared) + own);
    if (st == FM_OK) /* (an Update is about the size of the shared part) */
        st = fm_fanout_reset(&c->grants, c->round.nparts, fm_blob_len(c->task_shared) + own);
    for (int i = 0; st == FM_OK && i < c->round.nparts; i++)
        fm_fanout_push(&c->fanout, i);
    fm_coord_pump(c);
    return st;
}

void fm_coord_end_tasks(fm_coordinator_t *c)
{
    fm_blob_unref(c->task_shared);
    c->task_shared = NULL;
    fm_fanout_free(&c->fanout);
    fm_fanout_free(&c->grants);
    free(c->nearest);
    free(c->nearest_found);
    c->nearest = c->nearest_found = NULL;
}

void fm_coord_queue_task(fm_coordinator_t *c, fm_participant_t *p) { fm_fanout_push(&c->fanout, fm_coord_part_index(c, p)); }

void fm_coord_task_taken(fm_coordinator_t *c, fm_participant_t *p) { fm_fanout_done(&c->fanout, fm_coord_part_index(c, p)); }

void fm_coord_part_done(fm_coordinator_t *c, fm_participant_t *p)
{
    fm_coord_task_taken(c, p);
    fm_fanout_done(&c->grants, fm_coord_part_index(c, p));
}

static void send_grant(fm_coordinator_t *c, fm_participant_t *p)
{
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    Fedmoe__Grant g = FEDMOE__GRANT__INIT;
    g.round = (uint32_t)c->round.number;
    env.body_case = FEDMOE__ENVELOPE__BODY_GRANT;
    env.grant = &g;
    fm_coord_emit(c, fm_registry_at(c->reg, p->slot)->id, &env);
}

/* Sends what window w lets through to awaited participants (one that left the
 * round gives its place back). */
static void pump(fm_coordinator_t *c, fm_fanout_t *w, void (*send)(fm_coordinator_t *, fm_participant_t *))
{
    int i;
    while (c->round.state == FM_ROUND_OPEN && c->task_shared && (i = fm_fanout_next(w, c->now)) >= 0) {
        if (c->round.parts[i].state == FM_PART_AWAITED)
            send(c, &c->round.parts[i]);
        else
            fm_fanout_done(w, i);
    }
}

void fm_coord_pump(fm_coordinator_t *c)
{
    pump(c, &c->fanout, send_task);
    pump(c, &c->grants, send_grant);
}
