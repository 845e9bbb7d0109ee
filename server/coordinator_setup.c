/* The coordinator's life: a new run or the resumed latest one, and teardown. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "coordinator_internal.h"
#include "fedmoe/clientdata.h"
#include "fedmoe/clock.h"
#include "fedmoe/log.h"
#include "fedmoe/rng.h"

/* Puts the checkpoint's state in place: global vector, prompt, pool entries. */
static fm_status apply_checkpoint(fm_coordinator_t *c, const fm_checkpoint_t *ck)
{
    if (ck->nglobal != c->dims.nmodel || ck->nprompt != c->dims.nprompt) {
        fm_error_set("checkpoint of run %s does not fit the model (%zu/%zu values, expected %zu/%zu)", c->run_id,
                     ck->nglobal, ck->nprompt, c->dims.nmodel, c->dims.nprompt);
        return FM_ERR_FORMAT;
    }
    memcpy(c->global, ck->global, sizeof(float) * c->dims.nmodel);
    memcpy(c->gprompt, ck->prompt, sizeof(float) * c->dims.nprompt);
    if (c->spec.clip_norm == FM_CLIP_AUTO)
        memcpy(c->clip, ck->clip, sizeof c->clip);
    for (int i = 0; i < ck->pool_count; i++) {
        int slot = fm_registry_find(c->reg, ck->pool_ids[i]);
        if (slot < 0 && (slot = fm_registry_add(c->reg, ck->pool_ids[i])) < 0)
            return FM_ERR_NOMEM;
        fm_client_t *cl = fm_registry_at(c->reg, slot);
        free(cl->prompt);
        if (!(cl->prompt = malloc(sizeof(float) * c->dims.nprompt)))
            return FM_ERR_NOMEM;
        memcpy(cl->prompt, ck->pool + (size_t)i * c->dims.nprompt, sizeof(float) * c->dims.nprompt);
    }
    return FM_OK;
}

/* Reloads the run's clients (ids, partitions) and its newest checkpoint. */
static fm_status restore(fm_coordinator_t *c)
{
    fm_client_row_t *rows = NULL;
    int n = 0;
    fm_status st = fm_store_list_clients(c->store, c->run_id, &rows, &n);
    for (int i = 0; st == FM_OK && i < n; i++) {
        int slot = fm_registry_find(c->reg, rows[i].id);
        if (slot < 0 && (slot = fm_registry_add(c->reg, rows[i].id)) < 0) {
            st = FM_ERR_NOMEM;
            break;
        }
        fm_client_t *cl = fm_registry_at(c->reg, slot);
        fm_registry_set_partition(c->reg, slot, rows[i].partition_index);
        snprintf(cl->first_seen, sizeof cl->first_seen, "%s", rows[i].first_seen);
    }
    free(rows);
    int round = 0;
    uint8_t *blob = NULL;
    size_t len = 0;
    bool found = false;
    if (st == FM_OK)
        st = fm_store_latest_checkpoint(c->store, c->run_id, &round, &blob, &len, &found);
    if (st == FM_OK && found) {
        fm_checkpoint_t ck;
        if ((st = fm_checkpoint_decode(blob, len, &ck)) == FM_OK && (ck.round != round || ck.round > c->cfg.rounds)) {
            fm_error_set("the checkpoint of run %s is of round %d (its row says %d), %s: the database was changed "
                         "outside fedmoe; start a new run (--new-run) or another --db",
                         c->run_id, ck.round, round,
                         ck.round > c->cfg.rounds ? "past the run's rounds" : "not the round it is filed under");
            fm_checkpoint_free(&ck);
            st = FM_ERR_FORMAT;
        } else if (st == FM_OK) {
            if ((st = apply_checkpoint(c, &ck)) == FM_OK)
                fm_round_init(&c->round, ck.round + 1, c->cfg.round_timeout);
            fm_checkpoint_free(&ck);
        }
    }
    free(blob);
    return st;
}

static fm_status start_or_resume(fm_coordinator_t *c)
{
    char cfg_json[4096];
    fm_run_spec_json(&c->spec, cfg_json, sizeof cfg_json);
    fm_run_row_t latest;
    bool found = false;
    fm_status st = fm_store_latest_run(c->store, &latest, &found);
    if (st != FM_OK)
        return st;
    fm_round_init(&c->round, 1, c->cfg.round_timeout);
    if (found && strcmp(latest.status, "finished") != 0 && !c->cfg.new_run) {
        bool same = strcmp(latest.config, cfg_json) == 0 && latest.rounds_planned == c->cfg.rounds;
        snprintf(c->run_id, sizeof c->run_id, "%s", latest.id);
        fm_store_run_clear(&latest);
        if (!same) {
            fm_error_set("%s holds unfinished run %s with another configuration; start it with the same settings "
                         "to resume, or pass --new-run",
                         c->cfg.db, c->run_id);
            return FM_ERR_ARG;
        }
        if ((st = restore(c)) != FM_OK)
            return st;
        fm_info("resuming run %s at round %d of %d", c->run_id, c->round.number, c->cfg.rounds);
        return fm_store_set_run_status(c->store, c->run_id, "running");
    }
    if (found)
        fm_store_run_clear(&latest);
    fm_rng_t r;
    fm_rng_init(&r, (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32), fm_rng_stream(FM_STREAM_RUN_ID, 0));
    char stamp[32];
    fm_clock_utc(stamp);
    snprintf(c->run_id, sizeof c->run_id, "run-%.4s%.2s%.2s-%.2s%.2s%.2s-%04x", stamp, stamp + 5, stamp + 8,
             stamp + 11, stamp + 14, stamp + 17, fm_rng_u32(&r) & 0xffff);
    fm_info("new run %s: strategy %s, %d rounds, seed %llu", c->run_id, fm_strategy_name(c->spec.strategy),
            c->cfg.rounds, (unsigned long long)c->spec.seed);
    return fm_store_create_run(c->store, c->run_id, cfg_json, c->spec.seed, fm_strategy_name(c->spec.strategy),
                               c->cfg.rounds);
}

/* Refuses to start when the database's file system has less room than a few
 * rounds need (a checkpoint and the WAL), rather than failing at a commit. */
static fm_status check_disk(const char *db, size_t round_bytes)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", db);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == dir)
        dir[1] = 0;
    else
        *slash = 0;
    struct statvfs vfs;
    if (statvfs(dir, &vfs) != 0) {
        fm_error_set("%s: cannot reach the database's folder %s: %s", db, dir, strerror(errno));
        return FM_ERR_IO;
    }
    uint64_t free_bytes = (uint64_t)vfs.f_bavail * vfs.f_frsize, need = round_bytes + (16u << 20);
    if (free_bytes < need) {
        fm_error_set("%s: only %.1f MB free on its file system, a round needs about %.1f MB", db, free_bytes / 1e6,
                     need / 1e6);
        return FM_ERR_IO;
    }
    return FM_OK;
}

static fm_status check_config(const fm_server_config_t *cfg)
{
    if (cfg->rounds < 1 || cfg->min_clients < 1 || !(cfg->fraction > 0.0 && cfg->fraction <= 1.0) ||
        !(cfg->round_timeout > 0.0) || !(cfg->client_timeout > 0.0)) {
        fm_error_set("rounds and min-clients must be at least 1, fraction in (0, 1], timeouts positive");
        return FM_ERR_ARG;
    }
    if (cfg->spec.secure_aggregation && cfg->min_clients < 3) {
        /* (every client gets the mean: with two, each could tell the other's update from it) */
        fm_error_set("--secure-aggregation hides an update only in a sum of at least three: give --min-clients 3 or "
                     "more (it is %d)", cfg->min_clients);
        return FM_ERR_ARG;
    }
    return FM_OK;
}

/* The initial global state, from the model every party creates from the seed. */
static fm_status initial_state(fm_coordinator_t *c)
{
    fm_model_t *tmpl = NULL;
    fm_status st = fm_model_new(&tmpl, &c->spec.model, c->spec.seed, fm_rng_stream(FM_STREAM_INIT, 1));
    if (st != FM_OK)
        return st;
    c->dims = fm_exchange_dims(&c->spec, fm_federated_size(tmpl, c->spec.strategy));
    c->global = malloc(sizeof(float) * (c->dims.nmodel + 1));
    c->gprompt = malloc(sizeof(float) * (c->dims.nprompt + 1));
    c->scratch = malloc(sizeof(float) * (c->dims.nmodel + 1));
    if (!c->global || !c->gprompt || !c->scratch) {
        fm_model_destroy(&tmpl);
        return FM_ERR_NOMEM;
    }
    fm_federated_pack(tmpl, c->spec.strategy, c->global);
    if (c->dims.nprompt)
        memcpy(c->gprompt, fm_model_prompt(tmpl), sizeof(float) * c->dims.nprompt);
    fm_model_destroy(&tmpl);
    return FM_OK;
}

/* What the coordinator knows of its clients' data: every partition's split sizes,
 * from the run's dataset (labels only), so that the averaging weights are its
 * own numbers; and the cap on the weight of a client on data of its own. A
 * dataset this machine cannot read leaves the weights to the clients' counts
 * (warned); a partition that cannot be made (a Dirichlet draw that cannot give
 * every client --min-examples, a dataset named wrong) is FM_ERR_ARG: no client
 * could load its share either. */
static fm_status data_sizes(fm_coordinator_t *c)
{
    fm_data_spec_t ds;
    fm_run_spec_data(&c->spec, &ds);
    uint64_t largest = 0;
    c->sizes = calloc((size_t)ds.count, sizeof *c->sizes);
    fm_status st = c->sizes ? fm_client_data_sizes(&ds, c->sizes) : FM_ERR_NOMEM;
    if (st == FM_ERR_ARG) {
        free(c->sizes);
        c->sizes = NULL;
        return st;
    }
    if (st == FM_OK) {
        for (int i = 0; i < ds.count; i++)
            largest = c->sizes[i].train > largest ? c->sizes[i].train : largest;
    } else {
        fm_warn("cannot read the run's dataset to size its partitions (%s): every client's averaging weight is "
                "the count it declares, capped by --max-weight (%llu)",
                c->sizes ? fm_error_last() : "out of memory",
                (unsigned long long)(c->cfg.max_weight ? c->cfg.max_weight : 1));
        free(c->sizes);
        c->sizes = NULL;
        largest = 1; /* equal weights */
    }
    c->weight_cap = c->cfg.max_weight ? c->cfg.max_weight : largest;
    return FM_OK;
}

fm_status fm_coordinator_new(fm_coordinator_t **out, const fm_server_config_t *cfg, fm_coordinator_send_fn send,
                             void *user)
{
    *out = NULL;
    fm_status st = check_config(cfg);
    if (st != FM_OK)
        return st;
    fm_coordinator_t *c = calloc(1, sizeof *c);
    if (!c)
        return FM_ERR_NOMEM;
    c->cfg = *cfg;
    c->spec = cfg->spec;
    c->send = send;
    c->send_user = user;
    c->waiting_logged = c->swept = -1e9;
    fm_round_init(&c->round, 1, cfg->round_timeout);
    if ((st = fm_run_spec_finish(&c->spec)) != FM_OK || (st = initial_state(c)) != FM_OK ||
        (st = fm_registry_new(&c->reg, c->spec.partition_count)) != FM_OK || (st = fm_aggregator_new(&c->agg_model, c->dims.nmodel)) != FM_OK ||
        (st = fm_aggregator_new(&c->agg_prompt, c->dims.nprompt)) != FM_OK ||
        (st = fm_budget_new(&c->budget, 4 * c->spec.partition_count + 4096)) != FM_OK ||
        (st = data_sizes(c)) != FM_OK)
        goto fail;
    if ((st = fm_coord_dp_start(c)) != FM_OK)
        goto fail;
    fm_aggregator_set_rule(c->agg_model, &c->spec.aggregate);
    fm_aggregator_set_rule(c->agg_prompt, &c->spec.aggregate);
    c->clip[0] = c->clip[1] = c->spec.clip_norm > 0.0 ? c->spec.clip_norm : 0.0;
    /* a masked Update (secure aggregation) is 16 bytes a value */
    size_t masked = c->spec.secure_aggregation ? 16 * fm_exchange_masked_size(&c->spec, &c->dims) : 0;
    size_t plain = 2 * 4 * (c->dims.nmodel + c->dims.nprompt);
    c->max_message = cfg->max_message ? cfg->max_message : (plain > masked ? plain : masked) + (1u << 20);
    /* the largest message of the run: a Task (the model, the global prompt and
     * K nearest prompts) or an Update, with room for its fields */
    size_t need = 4 * (c->dims.nmodel + c->dims.nprompt * (2 + (size_t)c->dims.max_nonlocal)) + (64u << 10);
    need = need > masked + (64u << 10) ? need : masked + (64u << 10);
    if (c->max_message < need) {
        fm_error_set("--max-message %zu is smaller than this run's messages (up to %zu bytes with this model): "
                     "every Task and Update would be refused; give at least %zu, or leave it out",
                     c->max_message, need, need);
        st = FM_ERR_ARG;
        goto fail;
    }
    if ((st = check_disk(cfg->db, 8 * (c->dims.nmodel + c->dims.nprompt) * 4)) != FM_OK ||
        (st = fm_store_open(&c->store, cfg->db, false)) != FM_OK || (st = start_or_resume(c)) != FM_OK)
        goto fail;
    *out = c;
    return FM_OK;
fail:
    fm_coordinator_destroy(&c);
    return st;
}

void fm_coordinator_destroy(fm_coordinator_t **cp)
{
    fm_coordinator_t *c = cp ? *cp : NULL;
    if (!c)
        return;
    fm_coord_end_tasks(c);
    fm_round_free(&c->round);
    fm_coord_sa_close(c);
    fm_registry_destroy(&c->reg);
    fm_budget_free(&c->budget);
    free(c->global);
    free(c->gprompt);
    free(c->scratch);
    free(c->sizes);
    fm_aggregator_destroy(&c->agg_model);
    fm_aggregator_destroy(&c->agg_prompt);
    fm_store_close(&c->store);
    free(c);
    *cp = NULL;
}

const char *fm_coordinator_run_id(const fm_coordinator_t *c) { return c->run_id; }
int fm_coordinator_round(const fm_coordinator_t *c) { return c->round.number; }
bool fm_coordinator_round_open(const fm_coordinator_t *c) { return c->round.state == FM_ROUND_OPEN; }
size_t fm_coordinator_max_message(const fm_coordinator_t *c) { return c->max_message; }
