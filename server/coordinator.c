/* The coordinator object: message handlers and the round's life, on the
 * registry (clients) and the round state machine. The daemon loop that feeds it
 * is in daemon.c, resume in resume.c. */
#include "coordinator_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/clock.h"
#include "fedmoe/log.h"
#include "fedmoe/runspec_wire.h"

void fm_server_config_from_options(const fm_options_t *o, fm_server_config_t *c)
{
    snprintf(c->bind, sizeof c->bind, "%s", o->bind);
    snprintf(c->db, sizeof c->db, "%s", o->db);
    c->rounds = o->rounds;
    c->min_clients = o->min_clients;
    c->fraction = o->fraction;
    c->round_timeout = o->round_timeout;
    c->client_timeout = o->client_timeout;
    c->partition_lease = o->partition_lease;
    c->new_run = o->new_run;
    c->max_message = o->max_message;
    c->max_weight = o->max_weight;
    c->max_connections = o->max_connections;
    snprintf(c->key, sizeof c->key, "%s", o->key);
    snprintf(c->allow, sizeof c->allow, "%s", o->allow);
    c->insecure = o->insecure;
    if (o->spec != &c->spec)
        c->spec = *o->spec;
}

void fm_server_config_default(fm_server_config_t *c)
{
    fm_options_t o;
    memset(c, 0, sizeof *c);
    fm_options_default(&o, FM_PROG_SERVER, &c->spec);
    fm_server_config_from_options(&o, c);
}

/* ---- hello ------------------------------------------------------------------ */

static void log_client(fm_coordinator_t *c, const fm_client_t *cl);

/* Partitions of clients gone (not connected) for longer than the partition
 * lease are released when another client asks for them, so that a client that
 * took one and left cannot hold it for good; a client not seen since this
 * coordinator started counts from its start. */
static bool lease_expired(const fm_coordinator_t *c, fm_client_t *cl)
{
    double gone = c->now - (cl->greeted ? cl->last_seen : c->started);
    return cl->partition >= 0 && !cl->connected && gone > c->cfg.partition_lease;
}

static void release(fm_coordinator_t *c, int slot)
{
    fm_client_t *cl = fm_registry_at(c->reg, slot);
    fm_info("client %s gone for %.0f s: its partition %d is released", cl->id,
            c->now - (cl->greeted ? cl->last_seen : c->started), cl->partition);
    fm_registry_set_partition(c->reg, slot, -1);
    log_client(c, cl);
}

/* The partition a Hello gets, or -1 with a reason in why. */
static int lease_partition(fm_coordinator_t *c, int slot, const Fedmoe__Hello *h, char *why, size_t cap)
{
    if (h->partition_index < -1 || h->partition_index >= c->spec.partition_count) {
        snprintf(why, cap, "partition %d is outside 0..%d", h->partition_index, c->spec.partition_count - 1);
        return -1;
    }
    int part = h->partition_index;
    if (part < 0) {
        int own = slot >= 0 ? fm_registry_at(c->reg, slot)->partition : -1;
        part = own >= 0 ? own : fm_registry_free_partition(c->reg);
        for (int i = 0; part < 0 && i < fm_registry_count(c->reg); i++) /* all taken: any lease run out? */
            if (lease_expired(c, fm_registry_at(c->reg, i))) {
                release(c, i);
                part = fm_registry_free_partition(c->reg);
            }
    }
    if (part < 0) {
        snprintf(why, cap, "every partition of this run is taken");
        return -1;
    }
    int owner = fm_registry_partition_owner(c->reg, part);
    if (owner >= 0 && owner != slot && lease_expired(c, fm_registry_at(c->reg, owner))) {
        release(c, owner);
        owner = -1;
    }
    if (owner >= 0 && owner != slot) {
        snprintf(why, cap, "partition %d belongs to client %s", part, fm_registry_at(c->reg, owner)->id);
        return -1;
    }
    return part;
}

/* The averaging weight of a client that declares h's counts for partition part
 * (0 while it has no data yet), or -1 with a reason in why. On the run's dataset
 * the counts must be the partition's, which the coordinator computed, and the
 * weight is its training examples; on data of its own, or when the coordinator
 * cannot read the dataset, the declared count capped by --max-weight. */
static int64_t hello_weight(const fm_coordinator_t *c, const Fedmoe__Hello *h, int part, char *why, size_t cap)
{
    if (h->train_samples == 0)
        return 0;
    const uint64_t most = 1ull << 40;
    if (h->train_samples > most || h->val_samples > most || h->test_samples > most) {
        snprintf(why, cap, "hello declares more than 2^40 examples");
        return -1;
    }
    if (c->sizes && !h->own_data) {
        const fm_split_sizes_t *z = &c->sizes[part];
        if (h->train_samples != z->train || h->val_samples != z->val || h->test_samples != z->test) {
            snprintf(why, cap,
                     "hello declares %llu/%llu/%llu train/validation/test examples; partition %d of the run's "
                     "dataset has %llu/%llu/%llu",
                     (unsigned long long)h->train_samples, (unsigned long long)h->val_samples,
                     (unsigned long long)h->test_samples, part, (unsigned long long)z->train,
                     (unsigned long long)z->val, (unsigned long long)z->test);
            return -1;
        }
        return (int64_t)z->train;
    }
    return (int64_t)(h->train_samples < c->weight_cap ? h->train_samples : c->weight_cap);
}

#define HELLO_LOG_EVERY_S 60.0

static void log_client(fm_coordinator_t *c, const fm_client_t *cl)
{
    fm_client_row_t row = {0};
    snprintf(row.id, sizeof row.id, "%s", cl->id);
    snprintf(row.first_seen, sizeof row.first_seen, "%s", cl->first_seen);
    fm_clock_utc(row.last_seen);
    row.specialists = cl->specialists;
    row.partition_index = cl->partition;
    row.train_samples = (int64_t)cl->train_samples;
    row.val_samples = (int64_t)cl->val_samples;
    row.test_samples = (int64_t)cl->test_samples;
    if (fm_store_upsert_client(c->store, c->run_id, &row) != FM_OK)
        fm_warn("%s", fm_error_last());
}

static void handle_hello(fm_coordinator_t *c, const char *id, const Fedmoe__Hello *h, double now)
{
    char why[256];
    if (strcmp(h->client_id, id) != 0) {
        snprintf(why, sizeof why, "hello names client '%.63s' but the socket identity is '%s'", h->client_id, id);
        fm_coord_send_error(c, id, FM_WIRE_REJECTED, why);
        return;
    }
    if (h->specialists > 63 || (fm_strategy_averages_local(c->spec.strategy) &&
                                (int)h->specialists != c->spec.model.specialists)) {
        snprintf(why, sizeof why, "%u specialists; strategy %s needs %d on every client", h->specialists,
                 fm_strategy_name(c->spec.strategy), c->spec.model.specialists);
        fm_coord_send_error(c, id, FM_WIRE_REJECTED, why);
        return;
    }
    int slot = fm_registry_find(c->reg, id);
    int part = lease_partition(c, slot, h, why, sizeof why);
    int64_t weight = part < 0 ? -1 : hello_weight(c, h, part, why, sizeof why);
    if (weight < 0) {
        fm_coord_send_error(c, id, FM_WIRE_REJECTED, why);
        return;
    }
    if (slot < 0 && (slot = fm_registry_add(c->reg, id)) < 0) {
        fm_coord_send_error(c, id, FM_WIRE_REJECTED, "coordinator out of memory");
        return;
    }
    fm_client_t *cl = fm_registry_at(c->reg, slot);
    bool was = cl->connected;
    /* a Hello that changes nothing is not written to the round log more than once
     * a minute: a Hello flood must not cost a transaction (an fsync) each; nor
     * answered more than about once a second (budget.h) */
    bool changed = !cl->greeted || cl->partition != part || cl->specialists != (int)h->specialists ||
                   cl->train_samples != h->train_samples || cl->val_samples != h->val_samples ||
                   cl->test_samples != h->test_samples;
    if (!changed && was && !fm_budget_take(c->budget, id, FM_BUDGET_WELCOME, now)) {
        cl->last_seen = now;
        return;
    }
    /* changing partition, or counts it had declared, is a restart with other
     * data: twice a minute at most (a key alternating between two partitions
     * would otherwise cost a transaction and a log line each time); a client's
     * first counts, after a Hello without data, are not a change */
    bool moved = cl->greeted && (cl->partition != part || (cl->train_samples > 0 && changed));
    if (moved && !fm_budget_take(c->budget, id, FM_BUDGET_CHANGE, now)) {
        fm_coord_send_error(c, id, FM_WIRE_REJECTED, "this client changed its partition or counts twice in the last "
                                             "minute: say hello with the ones it had, or wait");
        return;
    }
    fm_registry_set_partition(c->reg, slot, part);
    cl->specialists = (int)h->specialists;
    cl->ready = h->train_samples > 0;
    cl->train_samples = h->train_samples;
    cl->val_samples = h->val_samples;
    cl->test_samples = h->test_samples;
    cl->weight = (uint64_t)weight;
    cl->own_counts = h->own_data || !c->sizes;
    cl->connected = true;
    cl->greeted = true;
    cl->last_seen = now; /* (a client sitting out rounds still does: a Hello is no excuse) */
    if (changed || now - cl->logged_at >= HELLO_LOG_EVERY_S) {
        log_client(c, cl);
        cl->logged_at = now;
    }
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    fm_welcome_pb_t w;
    fm_run_spec_welcome(&c->spec, c->run_id, part, (uint32_t)c->round.number, &w);
    env.body_case = FEDMOE__ENVELOPE__BODY_WELCOME;
    env.welcome = &w.welcome;
    w.welcome.upload_grants = true;
    w.welcome.heartbeat_ms = fm_coord_heartbeat_ms(c->cfg.client_timeout);
    fm_coord_emit(c, id, &env);
    fm_log(changed || !was ? FM_LOG_INFO : FM_LOG_DEBUG, "client %s %s (partition %d, %u specialists)", id,
           was ? "said hello again" : "joined", part, h->specialists);
    /* a participant restarted mid-round lost its task: once it has its data again,
     * send the task again, once a round (after that only when its heartbeat
     * shows it lacks it: check_progress) */
    fm_participant_t *p = fm_round_find(&c->round, slot);
    if (p && cl->ready && fm_round_rejoin(&c->round, p) && !p->resent_on_hello) {
        p->resent_on_hello = true;
        fm_info("round %d: client %s is a participant: task sent again", c->round.number, id);
        fm_coord_queue_task(c, p);
    }
}

/* ---- update ----------------------------------------------------------------- */

/* The participant an update for round `round` from slot may come from, or NULL
 * after an Error reply. */
static fm_participant_t *update_target(fm_coordinator_t *c, const char *id, int slot, const Fedmoe__Update *u)
{
    uint32_t round = u->round;
    char why[160];
    bool open = c->round.state == FM_ROUND_OPEN;
    if (!open || round != (uint32_t)c->round.number) {
        snprintf(why, sizeof why, "update for round %u, but %s", round,
                 open ? "another round is open" : "no round is open");
        fm_coord_send_error(c, id, FM_WIRE_WRONG_ROUND, why);
        return NULL;
    }
    fm_participant_t *p = fm_round_find(&c->round, slot);
    if (!p) {
        snprintf(why, sizeof why, "update for round %u, but this client was not selected", round);
        fm_coord_send_error(c, id, FM_WIRE_WRONG_ROUND, why);
    } else if (p->state == FM_PART_COMPLETED) {
        snprintf(why, sizeof why, "a second update for round %u", round);
        fm_coord_send_error(c, id, FM_WIRE_DUPLICATE, why);
        p = NULL;
    } else if (p->state != FM_PART_AWAITED) {
        snprintf(why, sizeof why, "update for round %u, but this client's part in it has ended (%s)", round,
                 fm_part_state_name(p->state));
        fm_coord_send_error(c, id, FM_WIRE_WRONG_ROUND, why);
        p = NULL;
    } else if (u->nonce.len != FM_NONCE_BYTES || memcmp(u->nonce.data, p->nonce, FM_NONCE_BYTES) != 0) {
        /* a replay of another round's update, or one relabelled with this round's number */
        snprintf(why, sizeof why, "update for round %u does not carry the nonce of this round's task", round);
        fm_coord_send_error(c, id, FM_WIRE_WRONG_ROUND, why);
        p = NULL;
    }
    return p;
}

/* A client awaited in the open round reports an error (a Task it could not
 * read: it will send no Update): its part ends now, so the round does not
 * wait for it until the deadline. (Its own part only: an Error changes
 * nothing else.) */
static void participant_failed(fm_coordinator_t *c, int slot)
{
    fm_participant_t *p = c->round.state == FM_ROUND_OPEN ? fm_round_find(&c->round, slot) : NULL;
    if (!p || p->state != FM_PART_AWAITED || p->row.bytes_down == 0) /* (its Task not sent yet: not about it) */
        return;
    fm_coord_part_done(c, p);
    fm_round_refuse(&c->round, p);
    snprintf(p->row.status, sizeof p->row.status, "%s", fm_part_state_name(p->state));
}

static void fill_row(fm_client_round_row_t *row, const fm_metrics_t *m, uint64_t samples, size_t bytes)
{
    snprintf(row->status, sizeof row->status, "completed");
    row->train_loss = m->train_loss;
    row->val_loss = m->val_loss;
    row->test_loss = m->test_loss;
    row->test_accuracy = m->test_accuracy;
    row->generalist_share = m->generalist_share;
    row->train_samples = (int64_t)samples;
    row->test_samples = (int64_t)m->test_samples;
    row->test_correct = (int64_t)m->test_correct;
    row->val_samples = (int64_t)m->val_samples;
    row->val_correct = (int64_t)m->val_correct;
    row->seconds = m->seconds;
    row->bytes_up = (int64_t)bytes;
}

/* Bounds the update's distance from the state it was sent (--clip-norm;
 * auto before a bound was learned: the one the round's sample set, if yet);
 * returns its weight in the mean (its client's). */
static uint64_t clip(fm_coordinator_t *c, fm_participant_t *p, const char *id, float *prompt)
{
    fm_exchange_t e = fm_exchange_of(&c->spec);
    double bound[2] = {c->clip[0] > 0.0 ? c->clip[0] : c->sampled[0], c->clip[1] > 0.0 ? c->clip[1] : c->sampled[1]};
    if (e.model)
        p->norm[0] = fm_clip_to_norm(c->scratch, c->global, c->dims.nmodel, bound[0]);
    if (e.prompt)
        p->norm[1] = fm_clip_to_norm(prompt, c->gprompt, c->dims.nprompt, bound[1]);
    if ((bound[0] > 0.0 && p->norm[0] > bound[0]) || (bound[1] > 0.0 && p->norm[1] > bound[1])) {
        c->clipped++;
        fm_info("round %d: update of %s clipped (distance %.4g / %.4g, bound %.4g / %.4g)", c->round.number, id,
                p->norm[0], p->norm[1], bound[0], bound[1]);
    }
    return fm_registry_at(c->reg, p->slot)->weight;
}

/* p's Update refused with code (the reason in fm_error_last()): its part in the round ends. */
static void refuse_update(fm_coordinator_t *c, fm_participant_t *p, const char *id, fm_wire_code code)
{
    char why[320];
    snprintf(why, sizeof why, "%s (its part in round %d ends)", fm_error_last(), c->round.number);
    fm_round_refuse(&c->round, p);
    snprintf(p->row.status, sizeof p->row.status, "%s", fm_part_state_name(p->state));
    fm_coord_send_error(c, id, code, why);
}

static void handle_update(fm_coordinator_t *c, const char *id, int slot, const Fedmoe__Update *u, size_t bytes)
{
    fm_participant_t *p = update_target(c, id, slot, u);
    if (!p)
        return;
    fm_coord_part_done(c, p);
    fm_exchange_t e = fm_exchange_of(&c->spec);
    fm_metrics_t m;
    fm_wire_code code = FM_WIRE_OK;
    const fm_client_t *cl = fm_registry_at(c->reg, slot);
    const fm_split_sizes_t declared = {cl->train_samples, cl->val_samples, cl->test_samples};
    const fm_split_sizes_t expect =
        fm_exchange_evaluated(&declared, fm_run_eval_sample(&c->spec, c->round.number, c->cfg.rounds));
    if (c->sa) { /* (secure aggregation: the masked input is added to the sum, nothing else kept) */
        if (fm_coord_sa_masked(c, p, u, &expect, &m, &code) == FM_OK) {
            fm_round_complete(&c->round, p, NULL);
            fill_row(&p->row, &m, cl->weight, bytes);
            c->bytes_up += (int64_t)bytes;
        } else {
            refuse_update(c, p, id, code);
        }
        return;
    }
    float *prompt = e.prompt ? malloc(sizeof(float) * c->dims.nprompt) : NULL;
    /* validate everything before changing anything */
    if (e.prompt && !prompt) {
        fm_error_set("coordinator out of memory");
        code = FM_WIRE_REJECTED;
    } else if (fm_exchange_read_update(&c->spec, &c->dims, u, &expect, c->scratch, prompt, &m, &code) !=
               FM_OK) {
    } else if (e.model && fm_aggregator_check(c->agg_model, c->scratch, cl->weight) != FM_OK) {
        code = FM_WIRE_BAD_VALUE;
    } else if (e.prompt && fm_aggregator_check(c->agg_prompt, prompt, cl->weight) != FM_OK) {
        code = FM_WIRE_BAD_TENSOR;
    }
    if (code != FM_WIRE_OK) {
        free(prompt);
        refuse_update(c, p, id, code);
        return;
    }
    uint64_t weight = fm_dp_on(&c->spec.dp) ? fm_coord_dp_clip(c, p, c->scratch, prompt) : clip(c, p, id, prompt);
    /* checked above, room reserved at the round's opening: adding fails only
     * when a kept update cannot be written to its file (the disk) */
    if ((e.model && fm_aggregator_add(c->agg_model, c->scratch, weight) != FM_OK) ||
        (e.prompt && fm_aggregator_add(c->agg_prompt, prompt, weight) != FM_OK)) {
        fm_errorf("round %d: the update of %s cannot be kept: %s", c->round.number, id, fm_error_last());
        free(prompt);
        fm_round_refuse(&c->round, p);
        snprintf(p->row.status, sizeof p->row.status, "%s", fm_part_state_name(p->state));
        return;
    }
    fm_round_complete(&c->round, p, &prompt);
    fm_coord_sample_clip(c);
    fill_row(&p->row, &m, cl->weight, bytes);
    c->bytes_up += (int64_t)bytes;
    fm_debug("round %d: update from %s (weight %llu, test accuracy %.4f)", c->round.number, id,
             (unsigned long long)cl->weight, m.test_accuracy);
}

/* ---- messages --------------------------------------------------------------- */

/* A participant still awaited whose heartbeat says it never got this round's
 * Task (TASK_LOST_S after it was sent: time for a large Task to arrive), or
 * that it sent its Update (which would have come first on its connection):
 * the message was lost, with the connection that carried it; the Task goes
 * again (a client answers a repeated Task with the Update it sent), at most
 * once per TASK_LOST_S. */
#define TASK_LOST_S 10.0
#define GRANT_LOST_S 3.0
static void check_progress(fm_coordinator_t *c, int slot, const Fedmoe__Heartbeat *hb)
{
    fm_participant_t *p = c->round.state == FM_ROUND_OPEN ? fm_round_find(&c->round, slot) : NULL;
    uint32_t r = (uint32_t)c->round.number;
    if (!hb->progress || !p || p->state != FM_PART_AWAITED)
        return;
    if (hb->task_round >= r)
        fm_coord_task_taken(c, p);
    int q = fm_coord_part_index(c, p);
    double granted = fm_fanout_sent_at(&c->grants, q);
    if (hb->ready_round == r && (granted < 0 || c->now - granted > GRANT_LOST_S))
        fm_fanout_push(&c->grants, q); /* (again: a grant that has not brought the Update in a while was lost) */
    if (c->now - p->task_sent_at < TASK_LOST_S || fm_fanout_queued(&c->fanout, q))
        return;
    bool no_task = hb->task_round < r, update_lost = hb->sent_round >= r;
    if (!no_task && !update_lost)
        return;
    if (fm_log_limit_take(&c->resends, c->now, WARNINGS_PER_SECOND, "task resends"))
        fm_info("round %d: client %s %s: its task sent again", c->round.number, fm_registry_at(c->reg, slot)->id,
                no_task ? "never got its task" : "sent an update that never came");
    fm_coord_queue_task(c, p);
}

fm_status fm_coordinator_handle(fm_coordinator_t *c, const char *id, const uint8_t *data, size_t len, double now)
{
    Fedmoe__Envelope *env = NULL;
    fm_coord_set_now(c, now);
    if (fm_wire_decode(data, len, c->max_message, &env) != FM_OK) {
        fm_wire_code code = fm_wire_last_code();
        fm_coord_send_error(c, id, code, fm_error_last());
        /* (another protocol version is a client to upgrade, told why, not an attacker) */
        return code == FM_WIRE_VERSION ? FM_OK : FM_ERR_FORMAT;
    }
    fm_status st = FM_OK;
    int slot = fm_registry_find(c->reg, id);
    fm_client_t *cl = slot >= 0 ? fm_registry_at(c->reg, slot) : NULL;
    bool known = cl && cl->greeted;
    if (known && env->body_case != FEDMOE__ENVELOPE__BODY_HELLO) {
        if (!cl->connected) {
            fm_info("client %s is back", id);
            fm_participant_t *p = fm_round_find(&c->round, slot);
            if (p)
                fm_round_rejoin(&c->round, p);
        }
        cl->connected = true;
        cl->last_seen = now;
    }
    switch (env->body_case) {
    case FEDMOE__ENVELOPE__BODY_HELLO: handle_hello(c, id, env->hello, now); break;
    case FEDMOE__ENVELOPE__BODY_UPDATE:
        if (!known)
            fm_coord_send_error(c, id, FM_WIRE_UNKNOWN_CLIENT, "update before hello");
        else
            handle_update(c, id, slot, env->update, len);
        break;
    case FEDMOE__ENVELOPE__BODY_HEARTBEAT:
        if (!known)
            fm_coord_send_error(c, id, FM_WIRE_UNKNOWN_CLIENT, "heartbeat before hello");
        else
            check_progress(c, slot, env->heartbeat);
        break;
    case FEDMOE__ENVELOPE__BODY_SECAGG:
        if (!known)
            fm_coord_send_error(c, id, FM_WIRE_UNKNOWN_CLIENT, "secure-aggregation message before hello");
        else
            fm_coord_sa_handle(c, id, slot, env->secagg);
        break;
    case FEDMOE__ENVELOPE__BODY_ERROR:
        if (fm_budget_take(c->budget, id, FM_BUDGET_REPORT, now) &&
            fm_log_limit_take(&c->reports, now, WARNINGS_PER_SECOND, "error reports"))
            fm_warn("client %s reports error %u: %.200s", id, env->error->code, env->error->text);
        if (known)
            participant_failed(c, slot);
        break;
    default: /* (a body a newer client may send: refused, not counted against its key) */
        fm_coord_send_error(c, id, FM_WIRE_MALFORMED, "a coordinator takes hello, update, heartbeat, secagg and error messages");
        break;
    }
    fm_wire_free(env);
    fm_coord_pump(c); /* (a Task taken makes room for the next) */
    return st;
}

