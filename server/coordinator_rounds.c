/* The coordinator's time-driven work: clients gone silent, rounds opened,
 * decided (round.h) and committed to the round log. */
#include <math.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator_internal.h"
#include "fedmoe/clock.h"
#include "fedmoe/log.h"
#include "fedmoe/rng.h"
#include "fedmoe/secagg.h"

#define WAITING_LOG_S 10.0
#define BENCH_AFTER 2 /* failed rounds in a row before a client sits out rounds */
#define BENCH_MAX 16  /* rounds a failing client sits out at most */

/* Clients silent for longer than the client timeout are taken as gone: not
 * selected, and no longer awaited in the round they were selected for. A scan
 * of every client, so at most every SWEEP_S (a quarter of the timeout when
 * that is shorter), not every tick. */
#define SWEEP_S 1.0
static void sweep_silent(fm_coordinator_t *c, double now)
{
    double every = c->cfg.client_timeout / 4 < SWEEP_S ? c->cfg.client_timeout / 4 : SWEEP_S;
    if (now - c->swept < every)
        return;
    c->swept = now;
    for (int i = 0; i < fm_registry_count(c->reg); i++) {
        fm_client_t *cl = fm_registry_at(c->reg, i);
        if (!(cl->connected && now - cl->last_seen > c->cfg.client_timeout))
            continue;
        cl->connected = false; /* (also one that never had its data: its partition lease runs from now) */
        if (!cl->ready) {
            fm_debug("client %s silent for %.0f s before it had its data: taken as gone", cl->id,
                     now - cl->last_seen);
            continue;
        }
        fm_participant_t *p = fm_round_find(&c->round, i);
        bool awaited = p && p->state == FM_PART_AWAITED;
        if (p) {
            fm_round_lose(&c->round, p);
            fm_coord_part_done(c, p);
        }
        fm_warn("client %s silent for %.0f s: taken as gone%s", cl->id, now - cl->last_seen,
                awaited ? " (dropped from this round)" : "");
    }
}

static bool selectable(const fm_client_t *cl, int round, double now)
{
    return cl->connected && cl->ready && (cl->benched_until <= round || now >= cl->benched_until_s);
}

/* --clip-norm auto with no bound learned yet for group g (0 model, 1 prompt):
 * the open round learns it from its own updates (kept until then). The one
 * place this is decided. */
static bool learns_bound(const fm_coordinator_t *c, int g)
{
    return c->spec.clip_norm == FM_CLIP_AUTO && c->clip[g] == 0.0;
}

/* Opens the next round when enough clients are ready: a deterministic choice,
 * clients in id order shuffled by (seed, round); tasks go out in id order. */
static fm_status try_open_round(fm_coordinator_t *c, double now)
{
    int n = fm_registry_count(c->reg), ready = 0, round = c->round.number;
    const int *order = fm_registry_sorted(c->reg);
    for (int i = 0; i < n; i++)
        ready += selectable(fm_registry_at(c->reg, order[i]), round, now);
    if (ready < c->cfg.min_clients) {
        if (now - c->waiting_logged > WAITING_LOG_S) {
            fm_info("round %d: waiting for clients (%d ready, %d needed)", round, ready, c->cfg.min_clients);
            c->waiting_logged = now;
        }
        return FM_OK;
    }
    uint32_t *cand = malloc(sizeof(uint32_t) * (size_t)ready);
    bool *chosen = calloc((size_t)n, sizeof(bool));
    int *slots = malloc(sizeof(int) * (size_t)ready);
    char (*ids)[64] = malloc(64 * (size_t)ready);
    fm_status st = cand && chosen && slots && ids ? FM_OK : FM_ERR_NOMEM;
    if (st == FM_OK) {
        int k = 0;
        for (int i = 0; i < n; i++)
            if (selectable(fm_registry_at(c->reg, order[i]), round, now))
                cand[k++] = (uint32_t)order[i];
        fm_rng_t r;
        fm_rng_init(&r, c->spec.seed, fm_rng_stream(FM_STREAM_SELECT, (uint64_t)round));
        fm_rng_shuffle(&r, cand, (size_t)ready);
        int want = (int)ceil(c->cfg.fraction * ready);
        want = want < c->cfg.min_clients ? c->cfg.min_clients : want > ready ? ready : want;
        if (c->spec.secure_aggregation && want > FM_SA_MAX_CLIENTS)
            want = FM_SA_MAX_CLIENTS; /* (secure aggregation's most) */
        for (int s = 0; s < want; s++)
            chosen[cand[s]] = true;
        k = 0;
        for (int i = 0; i < n; i++)
            if (chosen[order[i]]) {
                slots[k] = order[i];
                snprintf(ids[k++], 64, "%s", fm_registry_at(c->reg, order[i])->id);
            }
        c->bytes_up = c->bytes_down = 0;
        c->clipped = 0;
        c->sampled[0] = c->sampled[1] = 0.0;
        /* auto bounds not learned yet: this round keeps its first updates and
         * learns its bound from them (fm_coord_sample_clip), or from all of
         * them at its end when fewer come; robust rules keep every update
         * (fm_aggregator_keep also forgets the last round's) */
        fm_aggregator_t *agg[2] = {c->agg_model, c->agg_prompt};
        bool mean = c->spec.aggregate.rule == FM_AGG_MEAN;
        for (int g = 0; g < 2; g++) {
            fm_aggregator_keep(agg[g], learns_bound(c, g));
            bool sample = mean && learns_bound(c, g);
            int held = sample && want > FM_CLIP_SAMPLE ? FM_CLIP_SAMPLE : want;
            /* a mean's sample of FM_CLIP_SAMPLE updates stays in memory (a few
             * models, whatever the clients: no spill file); robust rules keep
             * every update, beyond FM_AGG_MEMORY in the file */
            size_t row = sizeof(float) * (g ? c->dims.nprompt : c->dims.nmodel);
            fm_aggregator_set_memory(agg[g], sample && (size_t)FM_CLIP_SAMPLE * row > FM_AGG_MEMORY
                                                 ? (size_t)FM_CLIP_SAMPLE * row
                                                 : FM_AGG_MEMORY);
            if (st == FM_OK)
                st = fm_aggregator_reserve(agg[g], held);
        }
        if (st == FM_OK)
            st = fm_round_open(&c->round, slots, ids, want, now);
        if (st == FM_OK)
            st = fm_coord_sa_open(c);
        for (int i = 0; st == FM_OK && i < c->round.nparts; i++)
            if (RAND_bytes(c->round.parts[i].nonce, (int)sizeof c->round.parts[i].nonce) != 1) {
                fm_error_set("round %d: no random bytes for the task nonces", round);
                st = FM_ERR_STATE;
            }
        if (st == FM_OK) {
            fm_info("round %d/%d: %d of %d connected clients selected", round, c->cfg.rounds, want, ready);
            st = fm_coord_start_tasks(c);
        }
    }
    free(cand);
    free(chosen);
    free(slots);
    free(ids);
    return st;
}

/* Participants that gave nothing usable sit out rounds after BENCH_AFTER such
 * rounds in a row (1, 2, 4... up to BENCH_MAX rounds; a Hello or a reconnect
 * does not end it), or for as long as that many rounds could last at most (the timeout and its
 * extensions each): when every client is benched and a round is run again, the
 * round number does not advance, and a bench in rounds alone stalled the run
 * for good (seen with slow clients under AddressSanitizer). */
static void count_failures(fm_coordinator_t *c, double now)
{
    for (int i = 0; i < c->round.nparts; i++) {
        fm_participant_t *p = &c->round.parts[i];
        fm_client_t *cl = fm_registry_at(c->reg, p->slot);
        if (p->state == FM_PART_COMPLETED) {
            cl->failures = 0;
            continue;
        }
        if (p->state == FM_PART_GONE)
            continue; /* silence is the client timeout's business */
        if (++cl->failures < BENCH_AFTER)
            continue;
        int sit = 1 << (cl->failures - BENCH_AFTER < 4 ? cl->failures - BENCH_AFTER : 4);
        sit = sit > BENCH_MAX ? BENCH_MAX : sit;
        cl->benched_until = c->round.number + 1 + sit;
        cl->benched_until_s = now + sit * c->cfg.round_timeout * (1 + FM_ROUND_MAX_EXTENSIONS);
        fm_warn("client %s: no usable update in %d rounds in a row: not selected for %d round%s",
                cl->id, cl->failures, sit, sit == 1 ? "" : "s");
    }
}

/* The round row: sums over the completed participants. */
static void round_row(const fm_coordinator_t *c, double now, fm_round_row_t *r)
{
    memset(r, 0, sizeof *r);
    r->round = c->round.number;
    snprintf(r->started_at, sizeof r->started_at, "%s", c->round.started_at);
    fm_clock_utc(r->finished_at);
    r->selected = c->round.nparts;
    r->completed = fm_round_count(&c->round, FM_PART_COMPLETED);
    r->dropped = r->selected - r->completed;
    double tl = 0, tn = 0, sl = 0, sn = 0, corr = 0, vn = 0, vcorr = 0, gs = 0;
    for (int i = 0; i < c->round.nparts; i++) {
        const fm_participant_t *p = &c->round.parts[i];
        if (p->state != FM_PART_COMPLETED)
            continue;
        /* a client whose counts are its own word weighs at most --max-weight
         * examples in each sum (its ratios kept): declaring 2^40 test examples
         * cannot make the round's accuracy its own */
        bool own = fm_registry_at(c->reg, p->slot)->own_counts;
        double ts = (double)p->row.test_samples, vs = (double)p->row.val_samples, cap = (double)c->weight_cap;
        double wt = own && ts > cap ? cap / ts : 1.0, wv = own && vs > cap ? cap / vs : 1.0;
        tl += p->row.train_loss * (double)p->row.train_samples;
        tn += (double)p->row.train_samples;
        sl += p->row.test_loss * ts * wt;
        sn += ts * wt;
        corr += (double)p->row.test_correct * wt;
        gs += p->row.generalist_share * ts * wt;
        vn += vs * wv;
        vcorr += (double)p->row.val_correct * wv;
    }
    r->train_loss = tn > 0 ? tl / tn : 0.0;
    r->test_loss = sn > 0 ? sl / sn : 0.0;
    r->test_accuracy = sn > 0 ? corr / sn : 0.0;
    r->val_accuracy = vn > 0 ? vcorr / vn : 0.0;
    r->generalist_share = sn > 0 ? gs / sn : 0.0;
    r->bytes_up = c->bytes_up;
    r->bytes_down = c->bytes_down;
    r->seconds = now - c->round.started;
    r->epsilon = fm_coord_dp_epsilon(c, c->round.number);
}

/* The bounds on update distances for the next round: fixed, none, or (auto)
 * FM_CLIP_AUTO_FACTOR x the lower median of this round's accepted distances
 * (the ceil(k/2)-th smallest of k): set by the honest updates whenever fewer
 * than half are an attacker's, so with two updates one attacker is bounded by
 * twice the other's distance (the mean of two, the plain median, was its own).
 * A single update sets no bound: the earlier round's stays. */
bool fm_coord_auto_bound(const fm_coordinator_t *c, int g, double *out)
{
    double *v = malloc(sizeof(double) * (size_t)(c->round.nparts ? c->round.nparts : 1));
    int k = 0;
    for (int i = 0; v && i < c->round.nparts; i++)
        if (c->round.parts[i].state == FM_PART_COMPLETED && c->round.parts[i].norm[g] > 0.0)
            v[k++] = c->round.parts[i].norm[g];
    if (k >= 2)
        *out = FM_CLIP_AUTO_FACTOR * fm_lower_median(v, k);
    free(v);
    return k >= 2;
}

static void next_clip(const fm_coordinator_t *c, double clip[2])
{
    clip[0] = c->clip[0];
    clip[1] = c->clip[1];
    if (c->spec.clip_norm != FM_CLIP_AUTO)
        return;
    for (int g = 0; g < 2; g++)
        fm_coord_auto_bound(c, g, &clip[g]);
}

void fm_coord_sample_clip(fm_coordinator_t *c)
{
    if (c->spec.aggregate.rule != FM_AGG_MEAN)
        return;
    fm_aggregator_t *agg[2] = {c->agg_model, c->agg_prompt};
    const float *ref[2] = {c->global, c->gprompt};
    int late = 0;
    for (int g = 0; g < 2; g++) {
        if (!learns_bound(c, g) || fm_aggregator_held(agg[g]) < FM_CLIP_SAMPLE)
            continue;
        double b = 0.0; /* (fewer than two nonzero distances: no bound this round) */
        if (fm_coord_auto_bound(c, g, &b)) {
            int k = fm_aggregator_clip_rows(agg[g], ref[g], b);
            late = k > late ? k : late;
        }
        fm_aggregator_fold(agg[g]);
        c->sampled[g] = b;
        fm_info("round %d: %s updates bounded at distance %.4g from the first %d (2x their lower median)",
                c->round.number, g ? "prompt" : "model", b, FM_CLIP_SAMPLE);
    }
    c->clipped += late;
}

/* The checkpoint of the state after this round: the pool takes the round's
 * prompts (pool strategies), in id order. */
static fm_status encode_checkpoint(fm_coordinator_t *c, const double clip[2], uint8_t **blob, size_t *len)
{
    int n = fm_registry_count(c->reg), count = 0;
    const int *order = fm_registry_sorted(c->reg);
    fm_checkpoint_t ck = {.round = c->round.number, .global = c->global, .nglobal = c->dims.nmodel,
                          .prompt = c->gprompt, .nprompt = c->dims.nprompt};
    memcpy(ck.clip, clip, sizeof ck.clip);
    ck.pool_ids = malloc(64 * (size_t)(n ? n : 1));
    ck.pool = malloc(sizeof(float) * c->dims.nprompt * (size_t)(n ? n : 1));
    if (!ck.pool_ids || !ck.pool) {
        free(ck.pool_ids);
        free(ck.pool);
        return FM_ERR_NOMEM;
    }
    bool pool = fm_exchange_of(&c->spec).pool;
    for (int i = 0; i < n; i++) {
        const fm_client_t *cl = fm_registry_at(c->reg, order[i]);
        const fm_participant_t *p = fm_round_find(&c->round, order[i]);
        const float *entry = pool && p && p->state == FM_PART_COMPLETED && p->prompt ? p->prompt : cl->prompt;
        if (!entry)
            continue;
        snprintf(ck.pool_ids[count], 64, "%s", cl->id);
        memcpy(ck.pool + (size_t)count * c->dims.nprompt, entry, sizeof(float) * c->dims.nprompt);
        count++;
    }
    ck.pool_count = count;
    fm_status st = fm_checkpoint_encode(&ck, blob, len);
    free(ck.pool_ids);
    free(ck.pool);
    return st;
}

/* Aggregates and commits the round in one transaction; the pool takes the
 * round's prompts only once the commit succeeded. */
static fm_status commit_round(fm_coordinator_t *c, double now)
{
    fm_exchange_t e = fm_exchange_of(&c->spec);
    double learned[2]; /* the next round's bounds, from this round's distances (once) */
    next_clip(c, learned);
    int late[2] = {0, 0}; /* clipped now, with the bounds this round learned */
    if (e.model && learns_bound(c, 0))
        late[0] = fm_aggregator_clip_rows(c->agg_model, c->global, learned[0]);
    if (e.prompt && learns_bound(c, 1))
        late[1] = fm_aggregator_clip_rows(c->agg_prompt, c->gprompt, learned[1]);
    c->clipped += late[0] > late[1] ? late[0] : late[1];
    bool dp = fm_dp_on(&c->spec.dp);
    if (dp && fm_coord_dp_pad(c) != FM_OK)
        return FM_ERR_STATE;
    if (e.model && fm_aggregator_result(c->agg_model, c->global) != FM_OK)
        return FM_ERR_STATE;
    if (e.prompt && fm_aggregator_result(c->agg_prompt, c->gprompt) != FM_OK)
        return FM_ERR_STATE;
    fm_status st = dp ? fm_coord_dp_noise(c) : FM_OK; /* (fails only for want of memory or randomness) */
    if (st != FM_OK)
        return st;
    fm_round_row_t r;
    round_row(c, now, &r);
    fm_client_round_row_t *rows = calloc((size_t)c->round.nparts, sizeof *rows);
    if (!rows)
        return FM_ERR_NOMEM;
    for (int i = 0; i < c->round.nparts; i++) {
        rows[i] = c->round.parts[i].row;
        if (c->round.parts[i].state != FM_PART_COMPLETED)
            snprintf(rows[i].status, sizeof rows[i].status, "%s", fm_part_state_name(c->round.parts[i].state));
    }
    uint8_t *ckpt = NULL;
    size_t ckpt_len = 0;
    st = encode_checkpoint(c, learned, &ckpt, &ckpt_len);
    if (st == FM_OK) {
        fm_sha256_hex(ckpt, ckpt_len, r.checkpoint_sha256);
        st = fm_store_commit_round(c->store, c->run_id, &r, rows, c->round.nparts, ckpt, ckpt_len);
    }
    free(ckpt);
    free(rows);
    if (st != FM_OK)
        return st;
    memcpy(c->clip, learned, sizeof c->clip);
    for (int i = 0; e.pool && i < c->round.nparts; i++) {
        fm_participant_t *p = &c->round.parts[i];
        fm_client_t *cl = fm_registry_at(c->reg, p->slot);
        if (p->state == FM_PART_COMPLETED && p->prompt) {
            free(cl->prompt);
            cl->prompt = p->prompt; /* now owned as the pool entry */
            p->prompt = NULL;
        }
    }
    char clipped[48] = "", eps[64] = "";
    if (c->clipped && !dp) /* (under DP how many were clipped tells of individual updates: not logged) */
        snprintf(clipped, sizeof clipped, " (%d clipped)", c->clipped);
    if (dp)
        snprintf(eps, sizeof eps, ", epsilon %.3g (delta %g)", r.epsilon, c->spec.dp.delta);
    fm_info("round %d/%d: %d/%d clients%s, train loss %.4f, test loss %.4f, test accuracy %.2f%%, %.1f s%s", r.round,
            c->cfg.rounds, r.completed, r.selected, clipped, r.train_loss, r.test_loss, 100.0 * r.test_accuracy,
            r.seconds, eps);
    return FM_OK;
}

/* Acts on the open round's verdict. */
static fm_status decide(fm_coordinator_t *c, double now)
{
    int awaited = fm_round_count(&c->round, FM_PART_AWAITED);
    fm_round_verdict v = c->sa ? fm_coord_sa_decide(c, now) : fm_round_decide(&c->round, now, c->cfg.min_clients);
    int done = fm_round_count(&c->round, FM_PART_COMPLETED), n = c->round.nparts, k = c->round.number;
    switch (v) {
    case FM_VERDICT_WAIT: return FM_OK;
    case FM_VERDICT_EXTEND:
        if (c->sa)
            return FM_OK; /* (said) */
        fm_warn("round %d: %d of %d updates by the deadline, the quorum is %d; %d clients still training: "
                "waiting another %.0f s (extension %d of %d)",
                k, done, n, c->cfg.min_clients, awaited, c->cfg.round_timeout, c->round.extensions,
                FM_ROUND_MAX_EXTENSIONS);
        return FM_OK;
    case FM_VERDICT_COMMIT:
    case FM_VERDICT_ABANDON: break;
    }
    for (int i = 0; awaited && i < n; i++)
        if (c->round.parts[i].state == FM_PART_DROPPED)
            fm_warn("round %d: client %s sent no update by the deadline%s: dropped from the round", k,
                    c->round.parts[i].row.client_id, c->round.extensions ? " and its extensions" : "");
    count_failures(c, now);
    if (v == FM_VERDICT_ABANDON) {
        if (!c->sa) /* (secure aggregation said why) */
            fm_warn("round %d: %d of %d updates, short of the quorum of %d: running the round again when enough "
                    "clients are ready",
                    k, done, n, c->cfg.min_clients);
        fm_round_close(&c->round, false);
        fm_coord_end_tasks(c);
        fm_coord_sa_close(c);
        return FM_OK;
    }
    fm_status st = commit_round(c, now);
    if (st == FM_OK)
        fm_round_close(&c->round, true);
    fm_coord_end_tasks(c);
    fm_coord_sa_close(c);
    return st;
}

static void shutdown_clients(fm_coordinator_t *c, const char *reason, bool resumable)
{
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    Fedmoe__Shutdown sd = FEDMOE__SHUTDOWN__INIT;
    sd.reason = (char *)reason;
    sd.resumable = resumable;
    env.body_case = FEDMOE__ENVELOPE__BODY_SHUTDOWN;
    env.shutdown = &sd;
    for (int i = 0; i < fm_registry_count(c->reg); i++)
        if (fm_registry_at(c->reg, i)->connected)
            fm_coord_emit(c, fm_registry_at(c->reg, i)->id, &env);
}

/* --dp-epsilon-budget: whether the next round would pass it (the one place
 * the budget is asked). */
static bool over_budget(const fm_coordinator_t *c)
{
    return c->spec.dp.budget > 0.0 && fm_coord_dp_epsilon(c, c->round.number) > c->spec.dp.budget;
}

fm_status fm_coordinator_tick(fm_coordinator_t *c, double now)
{
    if (c->finished)
        return FM_OK;
    fm_coord_set_now(c, now);
    fm_log_limit_flush(&c->refusals, now, "refusals");
    fm_log_limit_flush(&c->resends, now, "task resends");
    fm_log_limit_flush(&c->reports, now, "error reports");
    fm_budget_flush(c->budget, now);
    sweep_silent(c, now);
    fm_status st = FM_OK;
    if (c->round.state == FM_ROUND_OPEN && (st = decide(c, now)) != FM_OK)
        return st;
    bool spent = c->round.state == FM_ROUND_WAITING && over_budget(c);
    if (c->round.number > c->cfg.rounds || spent) {
        if (spent)
            fm_info("run %s finished: round %d would spend epsilon %.3g, more than the budget %g (delta %g); "
                    "%d rounds of %d",
                    c->run_id, c->round.number, fm_coord_dp_epsilon(c, c->round.number), c->spec.dp.budget,
                    c->spec.dp.delta, c->round.number - 1, c->cfg.rounds);
        else
            fm_info("run %s finished: %d rounds", c->run_id, c->cfg.rounds);
        c->finished = true;
        st = fm_store_set_run_status(c->store, c->run_id, "finished");
        shutdown_clients(c, "the run is finished", false);
        return st;
    }
    if (c->round.state == FM_ROUND_WAITING)
        st = try_open_round(c, now);
    fm_coord_pump(c); /* (places held too long are freed) */
    return st;
}

double fm_coordinator_wait(const fm_coordinator_t *c, double now, double max_wait)
{
    if (c->round.state == FM_ROUND_OPEN) {
        double left = c->round.deadline - now;
        return left <= 0 ? 0 : left < max_wait ? left : max_wait;
    }
    return max_wait;
}

bool fm_coordinator_finished(const fm_coordinator_t *c) { return c->finished; }

fm_status fm_coordinator_stop(fm_coordinator_t *c)
{
    if (c->finished)
        return FM_OK;
    fm_info("stopping: run %s left resumable at round %d", c->run_id, c->round.number);
    fm_status st = fm_store_set_run_status(c->store, c->run_id, "stopped");
    shutdown_clients(c, "the coordinator is stopping; the run resumes when it starts again", true);
    return st;
}
