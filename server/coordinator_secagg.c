/* coordinator_secagg.c - secure aggregation's phases in the coordinator's
 * round (--secure-aggregation; docs/secure-aggregation.md): the masking is
 * fedmoe/secagg.h's, the relaying, the sets and the deadlines are here.
 *
 * Participant i of the round is number i + 1. Its Task tells it its number,
 * the round's n, the threshold t and its weight. Then:
 *   0 advertise  (while clients train, under the round's deadline and its
 *                extensions) each sends its public keys when its training is
 *                done; U1 = those whose keys came.
 *   1 share      U1's keys go to every client of U1; each sends its sealed
 *                shares for the others; U2 = those whose shares came.
 *   2 masked     each client of U2 gets the shares sealed for it by the others
 *                of U2 and sends its Update with its masked input (paced by
 *                the upload grants); the coordinator adds it to the running
 *                sum and keeps nothing else of it; U3 = those whose input came.
 *   3 unmask     U3 goes to every client of U3; each answers with its shares;
 *                with them the sum is unmasked into the aggregators, and the
 *                round commits as any other.
 * Phases 1 to 3 each end when every client still expected has answered, or
 * after --round-timeout; one that ends with fewer than t clients abandons the
 * round (logged, run again), as does a sum that cannot be unmasked. A phase's
 * answers are taken once per client, only from the participant of that
 * number (its authenticated key) and only in its phase. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator_internal.h"
#include "fedmoe/log.h"
#include "fedmoe/secagg.h"

enum { PHASE_ADVERTISE = 0, PHASE_SHARE, PHASE_MASKED, PHASE_UNMASK };
static const char *const phase_names[] = {"advertise keys", "share keys", "masked input", "unmask"};

struct fm_coord_sa {
    int phase;
    uint32_t n, t;
    size_t d;                /* masked values: fm_exchange_masked_size */
    fm_sa_keys_t *keys;      /* [i]: participant i's, once its keys came */
    uint8_t *done;           /* [i]: bit k set when it completed phase k */
    fm_sa_sealed_t *sealed;  /* [from * n + to], 0-based: phase 1's, relayed in phase 2 */
    fm_u128 *sum;            /* U3's masked inputs, added as they come */
    fm_sa_share_t *shares;   /* phase 3's answers */
    uint32_t nshares, capshares;
    uint8_t probe[FM_X25519_BYTES]; /* a private key of its own: a public key it cannot agree with is refused */
};

void fm_coord_sa_close(fm_coordinator_t *c)
{
    fm_coord_sa_t *a = c->sa;
    if (!a)
        return;
    free(a->keys);
    free(a->done);
    free(a->sealed);
    free(a->sum);
    if (a->shares)
        memset(a->shares, 0, sizeof *a->shares * a->capshares); /* (shares of secrets: not left in freed memory) */
    free(a->shares);
    memset(a->probe, 0, sizeof a->probe);
    free(a);
    c->sa = NULL;
}

fm_status fm_coord_sa_open(fm_coordinator_t *c)
{
    fm_coord_sa_close(c);
    if (!c->spec.secure_aggregation)
        return FM_OK;
    uint32_t n = (uint32_t)c->round.nparts, t = n / 2 + 1;
    if ((uint32_t)c->cfg.min_clients > t)
        t = (uint32_t)c->cfg.min_clients;
    fm_coord_sa_t *a = calloc(1, sizeof *a);
    uint8_t pub[FM_X25519_BYTES];
    if (!a || !(a->keys = calloc(n, sizeof *a->keys)) || !(a->done = calloc(n, 1)) ||
        !(a->sum = calloc(fm_exchange_masked_size(&c->spec, &c->dims), sizeof *a->sum)) ||
        fm_x25519_keypair(a->probe, pub) != FM_OK) {
        c->sa = a;
        fm_coord_sa_close(c);
        fm_error_set("round %d: no memory or randomness for secure aggregation", c->round.number);
        return FM_ERR_NOMEM;
    }
    a->n = n;
    a->t = t > n ? n : t;
    a->d = fm_exchange_masked_size(&c->spec, &c->dims);
    c->sa = a;
    return FM_OK;
}

fm_sa_setup_t fm_coord_sa_setup(const fm_coordinator_t *c, const fm_participant_t *p)
{
    const fm_coord_sa_t *a = c->sa;
    if (!a)
        return (fm_sa_setup_t){0};
    /* (under differential privacy every update weighs the same: fm_coord_dp_pad) */
    uint64_t weight = fm_dp_on(&c->spec.dp) ? 1 : fm_registry_at(c->reg, p->slot)->weight;
    return (fm_sa_setup_t){(uint32_t)fm_coord_part_index(c, p) + 1, a->n, a->t, weight};
}

static bool in_phase(const fm_coord_sa_t *a, uint32_t i, int k) { return a->done[i] & (1u << k); }

/* Whether participant i is still expected to complete the current phase: in
 * the set the phase is for, not done with it, still there. */
static bool expected(const fm_coordinator_t *c, uint32_t i)
{
    const fm_coord_sa_t *a = c->sa;
    const fm_participant_t *p = &c->round.parts[i];
    bool member = a->phase == PHASE_ADVERTISE || in_phase(a, i, a->phase - 1);
    bool there = fm_registry_at(c->reg, p->slot)->connected &&
                 (p->state == FM_PART_AWAITED || (a->phase == PHASE_UNMASK && p->state == FM_PART_COMPLETED));
    return member && there && !in_phase(a, i, a->phase) && !(a->done[i] & 0x80);
}

static uint32_t count_phase(const fm_coord_sa_t *a, int k)
{
    uint32_t m = 0;
    for (uint32_t i = 0; i < a->n; i++)
        m += in_phase(a, i, k);
    return m;
}

static void send_sa(fm_coordinator_t *c, uint32_t i, Fedmoe__SecAgg *m)
{
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    m->round = (uint32_t)c->round.number;
    m->phase = (uint32_t)c->sa->phase;
    m->nonce.data = c->round.parts[i].nonce;
    m->nonce.len = FM_NONCE_BYTES;
    env.body_case = FEDMOE__ENVELOPE__BODY_SECAGG;
    env.secagg = m;
    c->bytes_down += fm_coord_emit(c, fm_registry_at(c->reg, c->round.parts[i].slot)->id, &env);
}

/* m to every client that completed phase k. */
static void broadcast(fm_coordinator_t *c, int k, Fedmoe__SecAgg *m)
{
    for (uint32_t i = 0; i < c->sa->n; i++)
        if (in_phase(c->sa, i, k))
            send_sa(c, i, m);
}

/* Phase 1 begins: U1's keys to every client of U1. */
static fm_status begin_share(fm_coordinator_t *c)
{
    fm_coord_sa_t *a = c->sa;
    uint32_t k = count_phase(a, PHASE_ADVERTISE), o = 0;
    uint8_t *table = malloc((size_t)FM_SA_KEYS_RECORD * (k ? k : 1));
    a->sealed = calloc((size_t)a->n * a->n, sizeof *a->sealed);
    if (!table || !a->sealed) {
        free(table);
        return FM_ERR_NOMEM;
    }
    for (uint32_t i = 0; i < a->n; i++)
        if (in_phase(a, i, PHASE_ADVERTISE))
            fm_sa_keys_put(&a->keys[i], table + (size_t)FM_SA_KEYS_RECORD * o++);
    Fedmoe__SecAgg m = FEDMOE__SEC_AGG__INIT;
    m.keys = (ProtobufCBinaryData){(size_t)FM_SA_KEYS_RECORD * k, table};
    broadcast(c, PHASE_ADVERTISE, &m);
    free(table);
    return FM_OK;
}

/* Phase 2 begins: to each client of U2, the shares the others of U2 sealed for it. */
static fm_status begin_masked(fm_coordinator_t *c)
{
    fm_coord_sa_t *a = c->sa;
    uint8_t *table = malloc((size_t)FM_SA_SEALED_RECORD * a->n);
    if (!table)
        return FM_ERR_NOMEM;
    for (uint32_t to = 0; to < a->n; to++) {
        if (!in_phase(a, to, PHASE_SHARE))
            continue;
        size_t o = 0;
        for (uint32_t from = 0; from < a->n; from++)
            if (from != to && in_phase(a, from, PHASE_SHARE))
                fm_sa_sealed_put(&a->sealed[(size_t)from * a->n + to], table + FM_SA_SEALED_RECORD * o++);
        Fedmoe__SecAgg m = FEDMOE__SEC_AGG__INIT;
        m.sealed = (ProtobufCBinaryData){FM_SA_SEALED_RECORD * o, table};
        send_sa(c, to, &m);
    }
    free(table);
    free(a->sealed); /* (relayed: not needed again) */
    a->sealed = NULL;
    return FM_OK;
}

/* Phase 3 begins: U3 to every client of U3. */
static fm_status begin_unmask(fm_coordinator_t *c)
{
    fm_coord_sa_t *a = c->sa;
    uint32_t k3 = count_phase(a, PHASE_MASKED), k2 = count_phase(a, PHASE_SHARE), o = 0;
    uint32_t *u3 = malloc(sizeof *u3 * (k3 ? k3 : 1));
    a->capshares = k3 * k2;
    a->shares = calloc(a->capshares ? a->capshares : 1, sizeof *a->shares);
    if (!u3 || !a->shares) {
        free(u3);
        return FM_ERR_NOMEM;
    }
    for (uint32_t i = 0; i < a->n; i++)
        if (in_phase(a, i, PHASE_MASKED))
            u3[o++] = i + 1;
    Fedmoe__SecAgg m = FEDMOE__SEC_AGG__INIT;
    m.survivors = u3;
    m.n_survivors = k3;
    broadcast(c, PHASE_MASKED, &m);
    free(u3);
    return FM_OK;
}

/* The sum unmasked into the aggregators (FM_ERR_STATE: it cannot be, the
 * round is abandoned). */
static fm_status finish(fm_coordinator_t *c)
{
    fm_coord_sa_t *a = c->sa;
    uint32_t k2 = count_phase(a, PHASE_SHARE), k3 = count_phase(a, PHASE_MASKED), o2 = 0, o3 = 0;
    fm_sa_keys_t *u2 = malloc(sizeof *u2 * (k2 ? k2 : 1));
    uint32_t *u3 = malloc(sizeof *u3 * (k3 ? k3 : 1));
    fm_status st = u2 && u3 ? FM_OK : FM_ERR_NOMEM;
    for (uint32_t i = 0; st == FM_OK && i < a->n; i++) {
        if (in_phase(a, i, PHASE_SHARE))
            u2[o2++] = a->keys[i];
        if (in_phase(a, i, PHASE_MASKED))
            u3[o3++] = i + 1;
    }
    uint32_t unbuilt = 0;
    if (st == FM_OK)
        st = fm_sa_unmask(a->sum, a->d - 1, a->t, (uint64_t)c->round.number, u2, k2, u3, k3, a->shares, a->nshares,
                          &unbuilt);
    free(u2);
    free(u3);
    if (unbuilt) { /* its shares did not rebuild its secret (sealed wrong for too many): a failure of its own,
                      which benches it after BENCH_AFTER in a row, so the round runs again without it */
        fm_participant_t *p = &c->round.parts[unbuilt - 1];
        p->state = FM_PART_REFUSED;
        snprintf(p->row.status, sizeof p->row.status, "%s", fm_part_state_name(p->state));
        fm_warn("round %d: the secret of client %s cannot be rebuilt from the shares it sealed for the others",
                c->round.number, fm_registry_at(c->reg, p->slot)->id);
    }
    if (st != FM_OK)
        return st;
    /* the weight is the last value: below k3 x 2^29, checked by the unmasking */
    uint64_t weight = (uint64_t)a->sum[a->d - 1];
    fm_exchange_t e = fm_exchange_of(&c->spec);
    const __int128 *sum = (const __int128 *)a->sum;
    if (e.model && (st = fm_aggregator_add_sum(c->agg_model, sum, weight, (int)k3)) != FM_OK)
        return st;
    if (e.prompt)
        st = fm_aggregator_add_sum(c->agg_prompt, sum + (e.model ? c->dims.nmodel : 0), weight, (int)k3);
    return st;
}

/* The participants still awaited that are out of the next set: dropped. */
static void drop_the_rest(fm_coordinator_t *c)
{
    for (uint32_t i = 0; i < c->sa->n; i++) {
        fm_participant_t *p = &c->round.parts[i];
        if (p->state == FM_PART_AWAITED && !in_phase(c->sa, i, c->sa->phase)) {
            p->state = FM_PART_DROPPED;
            fm_coord_part_done(c, p);
        }
    }
}

fm_round_verdict fm_coord_sa_decide(fm_coordinator_t *c, double now)
{
    fm_coord_sa_t *a = c->sa;
    bool waiting = false;
    for (uint32_t i = 0; !waiting && i < a->n; i++)
        waiting = expected(c, i);
    if (waiting && now < c->round.deadline)
        return FM_VERDICT_WAIT;
    uint32_t k = count_phase(a, a->phase);
    int r = c->round.number;
    if (waiting && a->phase == PHASE_ADVERTISE && k < a->t && c->round.extensions < FM_ROUND_MAX_EXTENSIONS) {
        c->round.extensions++;
        c->round.deadline = now + c->cfg.round_timeout;
        fm_warn("round %d: %u of %u clients trained by the deadline, the threshold is %u: waiting another %.0f s "
                "(extension %d of %d)",
                r, k, a->n, a->t, c->cfg.round_timeout, c->round.extensions, FM_ROUND_MAX_EXTENSIONS);
        return FM_VERDICT_EXTEND;
    }
    drop_the_rest(c);
    if (k < a->t) {
        fm_warn("round %d: secure aggregation's phase '%s' ended with %u of %u clients, fewer than the threshold "
                "%u: the round is abandoned and run again",
                r, phase_names[a->phase], k, a->n, a->t);
        return FM_VERDICT_ABANDON;
    }
    if (a->phase == PHASE_UNMASK) {
        fm_status st = finish(c);
        if (st != FM_OK) {
            fm_warn("round %d: the masked sum cannot be unmasked (%s): the round is abandoned and run again", r,
                    fm_error_last());
            return FM_VERDICT_ABANDON;
        }
        fm_info("round %d: secure aggregation unmasked the sum of %u updates (%u answers)", r,
                count_phase(a, PHASE_MASKED), k);
        return FM_VERDICT_COMMIT;
    }
    a->phase++;
    c->round.deadline = now + c->cfg.round_timeout; /* (each phase its own) */
    fm_status st = a->phase == PHASE_SHARE ? begin_share(c) : a->phase == PHASE_MASKED ? begin_masked(c)
                                                                                        : begin_unmask(c);
    if (st != FM_OK) {
        fm_warn("round %d: out of memory in secure aggregation: the round is abandoned", r);
        return FM_VERDICT_ABANDON;
    }
    fm_debug("round %d: secure aggregation: %u of %u clients, phase '%s' begins", r, k, a->n, phase_names[a->phase]);
    return FM_VERDICT_WAIT;
}

/* ---- the clients' answers ---------------------------------------------------- */

static bool take_keys(fm_coordinator_t *c, uint32_t i, const Fedmoe__SecAgg *m, char *why, size_t cap)
{
    fm_coord_sa_t *a = c->sa;
    fm_sa_keys_t k;
    if (m->keys.len == FM_SA_KEYS_RECORD)
        fm_sa_keys_get(m->keys.data, &k);
    if (m->keys.len != FM_SA_KEYS_RECORD || k.who != i + 1) {
        snprintf(why, cap, "keys: one %d-byte record with this client's number %u", FM_SA_KEYS_RECORD, i + 1);
        return false;
    }
    uint8_t shared[FM_X25519_BYTES];
    if (fm_x25519_shared(a->probe, k.c_pk, shared) != FM_OK || fm_x25519_shared(a->probe, k.s_pk, shared) != FM_OK) {
        snprintf(why, cap, "keys: a public key no key can agree with (a point of small order)");
        return false;
    }
    memset(shared, 0, sizeof shared);
    a->keys[i] = k;
    return true;
}

static bool take_sealed(fm_coordinator_t *c, uint32_t i, const Fedmoe__SecAgg *m, char *why, size_t cap)
{
    fm_coord_sa_t *a = c->sa;
    uint32_t k1 = count_phase(a, PHASE_ADVERTISE);
    if (m->sealed.len != (size_t)FM_SA_SEALED_RECORD * (k1 - 1)) {
        snprintf(why, cap, "shares: %zu bytes of sealed records, %u records of %d expected (one for every other "
                 "client of U1)", m->sealed.len, k1 - 1, FM_SA_SEALED_RECORD);
        return false;
    }
    bool *seen = calloc(a->n, sizeof *seen);
    bool ok = seen != NULL;
    for (uint32_t j = 0; ok && j + 1 < k1; j++) { /* check all, then keep */
        fm_sa_sealed_t s;
        fm_sa_sealed_get(m->sealed.data + (size_t)FM_SA_SEALED_RECORD * j, &s);
        ok = s.from == i + 1 && s.to >= 1 && s.to <= a->n && s.to != i + 1 && in_phase(a, s.to - 1, PHASE_ADVERTISE) &&
             !seen[s.to - 1];
        if (ok)
            seen[s.to - 1] = true;
        else
            snprintf(why, cap, "shares: record %u is not from this client (%u) to another client of U1, once each", j,
                     i + 1);
    }
    for (uint32_t j = 0; ok && j + 1 < k1; j++) {
        fm_sa_sealed_t s;
        fm_sa_sealed_get(m->sealed.data + (size_t)FM_SA_SEALED_RECORD * j, &s);
        a->sealed[(size_t)i * a->n + (s.to - 1)] = s;
    }
    free(seen);
    return ok;
}

static bool take_shares(fm_coordinator_t *c, uint32_t i, const Fedmoe__SecAgg *m, char *why, size_t cap)
{
    fm_coord_sa_t *a = c->sa;
    uint32_t k2 = count_phase(a, PHASE_SHARE);
    size_t n = m->shares.len / FM_SA_SHARE_RECORD;
    if (m->shares.len % FM_SA_SHARE_RECORD || n > k2 || a->nshares + n > a->capshares) {
        snprintf(why, cap, "unmask: %zu bytes of share records, at most %u records of %d (one for each client of U2)",
                 m->shares.len, k2, FM_SA_SHARE_RECORD);
        return false;
    }
    bool *seen = calloc(a->n, sizeof *seen);
    bool ok = seen != NULL;
    for (size_t j = 0; ok && j < n; j++) {
        fm_sa_share_t s;
        fm_sa_share_get(m->shares.data + FM_SA_SHARE_RECORD * j, i + 1, &s);
        uint32_t o = s.owner;
        bool owner_in = o >= 1 && o <= a->n && in_phase(a, o - 1, PHASE_SHARE);
        /* a seed for a client of U3, a key for one of U2 that is not: never both */
        uint8_t kind = owner_in && in_phase(a, o - 1, PHASE_MASKED) ? 0 : 1;
        ok = owner_in && s.kind == kind && !seen[o - 1];
        if (ok)
            seen[o - 1] = true;
        else
            snprintf(why, cap, "unmask: share %zu is not one share of a client of U2 (its seed when in U3, else its "
                     "key)", j);
    }
    for (size_t j = 0; ok && j < n; j++) /* (the holder is the sender's number, never its word) */
        fm_sa_share_get(m->shares.data + FM_SA_SHARE_RECORD * j, i + 1, &a->shares[a->nshares++]);
    free(seen);
    return ok;
}

void fm_coord_sa_handle(fm_coordinator_t *c, const char *id, int slot, const Fedmoe__SecAgg *m)
{
    fm_coord_sa_t *a = c->sa;
    fm_participant_t *p = c->round.state == FM_ROUND_OPEN ? fm_round_find(&c->round, slot) : NULL;
    char why[256] = "";
    if (!a || !p || m->round != (uint32_t)c->round.number) {
        snprintf(why, sizeof why, "secure-aggregation message for round %u: this client has no part in it",
                 m->round);
        fm_coord_send_error(c, id, FM_WIRE_WRONG_ROUND, why);
        return;
    }
    uint32_t i = (uint32_t)fm_coord_part_index(c, p);
    if (m->nonce.len != FM_NONCE_BYTES || memcmp(m->nonce.data, p->nonce, FM_NONCE_BYTES) != 0) {
        fm_coord_send_error(c, id, FM_WIRE_WRONG_ROUND, "secure-aggregation message without this round's task nonce");
        return;
    }
    int phase = (int)m->phase;
    if (phase == PHASE_MASKED || phase != a->phase || !expected(c, i)) {
        snprintf(why, sizeof why, "secure-aggregation phase %u: not this client's to answer now (the round is in "
                 "phase '%s')", m->phase, phase_names[a->phase]);
        fm_coord_send_error(c, id, FM_WIRE_WRONG_ROUND, why);
        return;
    }
    bool ok = phase == PHASE_ADVERTISE ? take_keys(c, i, m, why, sizeof why)
              : phase == PHASE_SHARE   ? take_sealed(c, i, m, why, sizeof why)
                                       : take_shares(c, i, m, why, sizeof why);
    if (!ok) { /* (its part ends: a client that cannot follow the protocol) */
        char text[320];
        snprintf(text, sizeof text, "secure aggregation, %s (its part in round %d ends)", why, c->round.number);
        if (p->state == FM_PART_AWAITED) {
            fm_coord_part_done(c, p);
            fm_round_refuse(&c->round, p);
            snprintf(p->row.status, sizeof p->row.status, "%s", fm_part_state_name(p->state));
        }
        a->done[i] |= 0x80; /* (out of every later set: REFUSED, or for phase 3 not an answer) */
        fm_coord_send_error(c, id, FM_WIRE_BAD_VALUE, text);
        return;
    }
    a->done[i] |= (uint8_t)(1u << phase);
    c->bytes_up += (int64_t)fedmoe__sec_agg__get_packed_size(m);
}

fm_status fm_coord_sa_masked(fm_coordinator_t *c, fm_participant_t *p, const Fedmoe__Update *u,
                             const fm_split_sizes_t *expect, fm_metrics_t *m, fm_wire_code *code)
{
    fm_coord_sa_t *a = c->sa;
    uint32_t i = (uint32_t)fm_coord_part_index(c, p);
    if (a->phase != PHASE_MASKED || !in_phase(a, i, PHASE_SHARE)) {
        fm_error_set("a masked update in phase '%s' from a client %s U2", phase_names[a->phase],
                     in_phase(a, i, PHASE_SHARE) ? "of" : "not in");
        *code = FM_WIRE_WRONG_ROUND;
        return FM_ERR_FORMAT;
    }
    fm_u128 *y = malloc(sizeof *y * a->d);
    if (!y) {
        fm_error_set("coordinator out of memory");
        *code = FM_WIRE_REJECTED;
        return FM_ERR_NOMEM;
    }
    fm_status st = fm_exchange_read_masked(&c->spec, &c->dims, u, expect, y, m, code);
    if (st == FM_OK) {
        fm_sa_sum_add(a->sum, y, a->d - 1);
        a->done[i] |= 1u << PHASE_MASKED;
    }
    memset(y, 0, sizeof *y * a->d); /* (a masked input alone reveals nothing; still not kept) */
    free(y);
    return st;
}
