#include "coordinator.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "fedmoe/aggregate.h"
#include "fedmoe/clock.h"
#include "fedmoe/log.h"
#include "fedmoe/rng.h"
#include "fedmoe/store.h"
#include "fedmoe/wire.h"

#define POLL_MS 200
#define CKPT_MAGIC 0x4B434D46u /* "FMCK" */
#define CKPT_VERSION 1u
#define FM_STREAM_SELECT 0x5E1EC7ull

typedef struct {
    char id[64];
    int partition;
    int specialists;
    uint64_t train_samples, val_samples, test_samples;
    bool connected;         /* said hello to this coordinator and not silent since */
    bool ready;             /* has its data: said hello with sample counts */
    double last_seen;       /* monotonic seconds of its last message */
    char first_seen[32];
    float *prompt;          /* committed pool entry, or NULL */
    /* this round */
    bool selected, done;
    float *pending_prompt;  /* staged until the round commits */
    fm_client_round_row_t row;
} client_t;

typedef struct {
    const fm_server_config_t *cfg;
    fm_run_spec_t spec;
    fm_store_t *store;
    void *ctx, *sock;
    fm_model_t *tmpl;       /* layout and initial state */
    char run_id[64];
    float *global, *gprompt, *scratch;
    size_t nglobal, nprompt;
    size_t max_message;
    client_t *clients;
    int nclients, cap;
    fm_aggregator_t *agg_model, *agg_prompt;
    int round;              /* the round being run, or the next one */
    bool in_round;
    double deadline, started;
    char started_at[32];
    int64_t bytes_up, bytes_down;
} coord_t;

void fm_server_config_default(fm_server_config_t *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->bind, sizeof c->bind, "tcp://*:5555");
    snprintf(c->db, sizeof c->db, "fedmoe.db");
    c->rounds = 20;
    c->min_clients = 2;
    c->fraction = 1.0;
    c->round_timeout = 600.0;
    c->client_timeout = 15.0;
    fm_run_spec_default(&c->spec);
}

/* ---- checkpoints ------------------------------------------------------------ */

typedef struct {
    uint8_t *p;
    size_t len, cap;
    bool failed;
} buf_t;

static void put(buf_t *b, const void *src, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->failed = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
}

static void put_u32(buf_t *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf_t *b, uint64_t v) { put(b, &v, 8); }

static fm_status checkpoint_encode(coord_t *c, int round, uint8_t **out, size_t *len)
{
    buf_t b = {0};
    put_u32(&b, CKPT_MAGIC);
    put_u32(&b, CKPT_VERSION);
    put_u32(&b, (uint32_t)round);
    put_u64(&b, c->nglobal);
    put(&b, c->global, sizeof(float) * c->nglobal);
    put_u64(&b, c->nprompt);
    put(&b, c->gprompt, sizeof(float) * c->nprompt);
    uint32_t count = 0;
    for (int i = 0; i < c->nclients; i++)
        count += c->clients[i].prompt != NULL;
    put_u32(&b, count);
    for (int i = 0; i < c->nclients; i++)
        if (c->clients[i].prompt) {
            char id[64] = {0};
            snprintf(id, sizeof id, "%s", c->clients[i].id);
            put(&b, id, sizeof id);
            put(&b, c->clients[i].prompt, sizeof(float) * c->nprompt);
        }
    if (b.failed) {
        free(b.p);
        return FM_ERR_NOMEM;
    }
    *out = b.p;
    *len = b.len;
    return FM_OK;
}

fm_status fm_checkpoint_decode(const uint8_t *blob, size_t len, fm_checkpoint_t *out)
{
    memset(out, 0, sizeof *out);
    size_t pos = 0;
#define TAKE(dst, n)                                       \
    do {                                                   \
        if ((n) > len - pos)                               \
            goto bad;                                      \
        memcpy((dst), blob + pos, (n));                    \
        pos += (n);                                        \
    } while (0)
    uint32_t magic, version, round, count;
    uint64_t ng, np;
    TAKE(&magic, 4);
    TAKE(&version, 4);
    if (magic != CKPT_MAGIC || version != CKPT_VERSION)
        goto bad;
    TAKE(&round, 4);
    TAKE(&ng, 8);
    if (ng > (len - pos) / 4)
        goto bad;
    out->global = malloc(sizeof(float) * (ng ? ng : 1));
    if (!out->global)
        goto bad;
    TAKE(out->global, sizeof(float) * ng);
    TAKE(&np, 8);
    if (np > (len - pos) / 4)
        goto bad;
    out->prompt = malloc(sizeof(float) * (np ? np : 1));
    if (!out->prompt)
        goto bad;
    TAKE(out->prompt, sizeof(float) * np);
    TAKE(&count, 4);
    if (count > (len - pos) / (64 + 4 * np + 1) + 1)
        goto bad;
    out->pool_ids = calloc(count ? count : 1, 64);
    out->pool = malloc(sizeof(float) * (count ? count : 1) * (np ? np : 1));
    if (!out->pool_ids || !out->pool)
        goto bad;
    for (uint32_t i = 0; i < count; i++) {
        TAKE(out->pool_ids[i], 64);
        out->pool_ids[i][63] = 0;
        TAKE(out->pool + (size_t)i * np, sizeof(float) * np);
    }
    if (pos != len)
        goto bad;
    out->round = (int)round;
    out->nglobal = ng;
    out->nprompt = np;
    out->pool_count = (int)count;
    return FM_OK;
bad:
    fm_checkpoint_free(out);
    fm_error_set("checkpoint is truncated or not a fedmoe checkpoint");
    return FM_ERR_FORMAT;
#undef TAKE
}

void fm_checkpoint_free(fm_checkpoint_t *c)
{
    free(c->global);
    free(c->prompt);
    free(c->pool_ids);
    free(c->pool);
    memset(c, 0, sizeof *c);
}

/* ---- clients ----------------------------------------------------------------- */

static client_t *find_client(coord_t *c, const char *id)
{
    for (int i = 0; i < c->nclients; i++)
        if (strcmp(c->clients[i].id, id) == 0)
            return &c->clients[i];
    return NULL;
}

static client_t *add_client(coord_t *c, const char *id)
{
    if (c->nclients == c->cap) {
        int cap = c->cap ? c->cap * 2 : 16;
        client_t *p = realloc(c->clients, sizeof *p * cap);
        if (!p)
            return NULL;
        c->clients = p;
        c->cap = cap;
    }
    client_t *cl = &c->clients[c->nclients++];
    memset(cl, 0, sizeof *cl);
    snprintf(cl->id, sizeof cl->id, "%s", id);
    cl->partition = -1;
    fm_clock_utc(cl->first_seen);
    return cl;
}

static int free_partition(coord_t *c)
{
    for (int p = 0; p < c->spec.partition_count; p++) {
        bool used = false;
        for (int i = 0; i < c->nclients && !used; i++)
            used = c->clients[i].partition == p;
        if (!used)
            return p;
    }
    return -1;
}

static void send_error(coord_t *c, const char *id, fm_wire_code code, const char *text)
{
    fm_warn("client %s: %s", id, text);
    fm_wire_send_error(c->sock, id, code, text);
}

static void handle_hello(coord_t *c, const char *id, const Fedmoe__Hello *h)
{
    char why[256];
    if (strcmp(h->client_id, id) != 0) {
        snprintf(why, sizeof why, "hello names client '%.63s' but the socket identity is '%s'", h->client_id, id);
        send_error(c, id, FM_WIRE_REJECTED, why);
        return;
    }
    if (h->specialists > 63 || (fm_strategy_averages_local(c->spec.strategy) &&
                                (int)h->specialists != c->spec.model.specialists)) {
        snprintf(why, sizeof why, "%u specialists; strategy %s needs %d on every client", h->specialists,
                 fm_strategy_name(c->spec.strategy), c->spec.model.specialists);
        send_error(c, id, FM_WIRE_REJECTED, why);
        return;
    }
    if (h->partition_index < -1 || h->partition_index >= c->spec.partition_count) {
        snprintf(why, sizeof why, "partition %d is outside 0..%d", h->partition_index, c->spec.partition_count - 1);
        send_error(c, id, FM_WIRE_REJECTED, why);
        return;
    }
    client_t *cl = find_client(c, id);
    int part = h->partition_index;
    if (part < 0)
        part = cl && cl->partition >= 0 ? cl->partition : free_partition(c);
    if (part < 0) {
        send_error(c, id, FM_WIRE_REJECTED, "every partition of this run is taken");
        return;
    }
    for (int i = 0; i < c->nclients; i++)
        if (c->clients[i].partition == part && strcmp(c->clients[i].id, id) != 0) {
            snprintf(why, sizeof why, "partition %d belongs to client %s", part, c->clients[i].id);
            send_error(c, id, FM_WIRE_REJECTED, why);
            return;
        }
    if (!cl && !(cl = add_client(c, id))) {
        send_error(c, id, FM_WIRE_REJECTED, "coordinator out of memory");
        return;
    }
    cl->partition = part;
    cl->specialists = (int)h->specialists;
    cl->ready = h->train_samples > 0;
    cl->train_samples = h->train_samples;
    cl->val_samples = h->val_samples;
    cl->test_samples = h->test_samples;
    bool was = cl->connected;
    cl->connected = true;
    cl->last_seen = fm_clock_seconds();
    fm_client_row_t row = {0};
    snprintf(row.id, sizeof row.id, "%s", cl->id);
    snprintf(row.first_seen, sizeof row.first_seen, "%s", cl->first_seen);
    fm_clock_utc(row.last_seen);
    row.specialists = cl->specialists;
    row.partition_index = part;
    row.train_samples = (int64_t)h->train_samples;
    row.val_samples = (int64_t)h->val_samples;
    row.test_samples = (int64_t)h->test_samples;
    if (fm_store_upsert_client(c->store, c->run_id, &row) != FM_OK)
        fm_warn("%s", fm_error_last());
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    fm_welcome_pb_t w;
    fm_run_spec_welcome(&c->spec, c->run_id, part, (uint32_t)c->round, &w);
    env.body_case = FEDMOE__ENVELOPE__BODY_WELCOME;
    env.welcome = &w.welcome;
    fm_wire_send(c->sock, id, &env);
    fm_info("client %s %s (partition %d, %u specialists)", id, was ? "said hello again" : "joined", part,
            h->specialists);
}

static void send_task(coord_t *c, client_t *cl)
{
    const fm_model_config_t *mc = &c->spec.model;
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    Fedmoe__Task task = FEDMOE__TASK__INIT;
    Fedmoe__Tensor model, prompt, nl[64];
    Fedmoe__Tensor *model_list[1], *nl_list[64];
    task.round = (uint32_t)c->round;
    task.lr_scale = fm_lr_schedule_scale(c->spec.lr_schedule, c->round, c->cfg->rounds);
    bool ok = true;
    if (c->spec.strategy != FM_STRATEGY_LOCAL) {
        ok &= fm_wire_tensor_set(&model, "model", c->global, 1, (uint32_t)c->nglobal) == FM_OK;
        model_list[0] = &model;
        task.model = model_list;
        task.n_model = 1;
    }
    if (fm_strategy_shares_prompt(c->spec.strategy)) {
        ok &= fm_wire_tensor_set(&prompt, "prompt", c->gprompt, (uint32_t)mc->prompt_len, (uint32_t)mc->prompt_dim) == FM_OK;
        task.global_prompt = &prompt;
    }
    int k = 0;
    if (fm_strategy_uses_pool(c->spec.strategy)) {
        const float **entries = malloc(sizeof(float *) * (c->nclients ? c->nclients : 1));
        int idx[64];
        if (entries) {
            for (int i = 0; i < c->nclients; i++)
                entries[i] = c->clients[i].prompt;
            k = fm_knn(entries, c->nclients, c->nprompt, (int)(cl - c->clients), mc->max_nonlocal, idx);
            free(entries);
        }
        for (int j = 0; j < k; j++) {
            ok &= fm_wire_tensor_set(&nl[j], "nonlocal", c->clients[idx[j]].prompt, (uint32_t)mc->prompt_len,
                                     (uint32_t)mc->prompt_dim) == FM_OK;
            nl_list[j] = &nl[j];
        }
        task.nonlocal_prompts = nl_list;
        task.n_nonlocal_prompts = (size_t)k;
    }
    env.body_case = FEDMOE__ENVELOPE__BODY_TASK;
    env.task = &task;
    if (ok) {
        size_t bytes = fedmoe__envelope__get_packed_size(&env);
        if (fm_wire_send(c->sock, cl->id, &env) == FM_OK) {
            cl->row.bytes_down += (int64_t)bytes;
            c->bytes_down += (int64_t)bytes;
        } else {
            fm_warn("round %d: task to %s not sent: %s", c->round, cl->id, fm_error_last());
        }
    } else {
        fm_errorf("round %d: cannot build the task for %s (out of memory)", c->round, cl->id);
    }
    if (task.n_model)
        fm_wire_tensor_clear(&model);
    if (task.global_prompt)
        fm_wire_tensor_clear(&prompt);
    for (int j = 0; j < k; j++)
        fm_wire_tensor_clear(&nl[j]);
}

/* ---- rounds ------------------------------------------------------------------ */

static int cmp_client_id(const void *a, const void *b)
{
    return strcmp(((const client_t *)a)->id, ((const client_t *)b)->id);
}

static void try_start_round(coord_t *c)
{
    int connected = 0;
    for (int i = 0; i < c->nclients; i++)
        connected += c->clients[i].connected && c->clients[i].ready;
    if (connected < c->cfg->min_clients)
        return;
    /* deterministic selection: clients sorted by id, shuffled by (seed, round) */
    qsort(c->clients, c->nclients, sizeof *c->clients, cmp_client_id);
    uint32_t *cand = malloc(sizeof(uint32_t) * connected);
    if (!cand)
        return;
    int n = 0;
    for (int i = 0; i < c->nclients; i++)
        if (c->clients[i].connected && c->clients[i].ready)
            cand[n++] = (uint32_t)i;
    fm_rng_t r;
    fm_rng_init(&r, c->spec.seed, FM_STREAM_SELECT ^ ((uint64_t)c->round << 20));
    fm_rng_shuffle(&r, cand, (size_t)n);
    int want = (int)ceil(c->cfg->fraction * n);
    if (want < c->cfg->min_clients)
        want = c->cfg->min_clients;
    if (want > n)
        want = n;
    for (int i = 0; i < c->nclients; i++) {
        client_t *cl = &c->clients[i];
        cl->selected = cl->done = false;
        free(cl->pending_prompt);
        cl->pending_prompt = NULL;
        memset(&cl->row, 0, sizeof cl->row);
    }
    fm_aggregator_reset(c->agg_model);
    fm_aggregator_reset(c->agg_prompt);
    c->bytes_up = c->bytes_down = 0;
    c->in_round = true;
    c->started = fm_clock_seconds();
    c->deadline = c->started + c->cfg->round_timeout;
    fm_clock_utc(c->started_at);
    for (int s = 0; s < want; s++) {
        client_t *cl = &c->clients[cand[s]];
        cl->selected = true;
        snprintf(cl->row.client_id, sizeof cl->row.client_id, "%s", cl->id);
        snprintf(cl->row.status, sizeof cl->row.status, "dropped");
    }
    free(cand);
    fm_info("round %d/%d: %d of %d connected clients selected", c->round, c->cfg->rounds, want, connected);
    for (int i = 0; i < c->nclients; i++)
        if (c->clients[i].selected)
            send_task(c, &c->clients[i]);
}

static void handle_update(coord_t *c, client_t *cl, const Fedmoe__Update *u, size_t bytes)
{
    char why[320];
    const fm_model_config_t *mc = &c->spec.model;
    if (!c->in_round || u->round != (uint32_t)c->round) {
        snprintf(why, sizeof why, "update for round %u, but %s", u->round,
                 c->in_round ? "another round is open" : "no round is open");
        send_error(c, cl->id, FM_WIRE_WRONG_ROUND, why);
        return;
    }
    if (!cl->selected) {
        snprintf(why, sizeof why, "update for round %u, but this client was not selected", u->round);
        send_error(c, cl->id, FM_WIRE_WRONG_ROUND, why);
        return;
    }
    if (cl->done) {
        snprintf(why, sizeof why, "a second update for round %u", u->round);
        send_error(c, cl->id, FM_WIRE_DUPLICATE, why);
        return;
    }
    if (u->train_samples == 0 || u->train_samples > FM_AGG_MAX_WEIGHT) {
        snprintf(why, sizeof why, "train_samples %llu out of range 1..%llu", (unsigned long long)u->train_samples,
                 FM_AGG_MAX_WEIGHT);
        send_error(c, cl->id, FM_WIRE_BAD_VALUE, why);
        return;
    }
    const Fedmoe__Metrics *m = u->metrics;
    if (!m || !isfinite(m->train_loss) || !isfinite(m->val_loss) || !isfinite(m->test_loss) ||
        !(m->test_accuracy >= 0.0f && m->test_accuracy <= 1.0f) ||
        !(m->generalist_share >= 0.0f && m->generalist_share <= 1.0f) || m->test_correct > m->test_samples ||
        m->test_samples > (1ull << 40) || m->val_correct > m->val_samples || m->val_samples > (1ull << 40) ||
        !(m->seconds >= 0.0 && m->seconds < 1e9)) {
        send_error(c, cl->id, FM_WIRE_BAD_VALUE, "metrics missing or out of range");
        return;
    }
    /* validate everything before changing anything */
    if (c->spec.strategy != FM_STRATEGY_LOCAL) {
        fm_wire_code code = FM_WIRE_OK;
        if (u->n_model != 1) {
            code = FM_WIRE_BAD_TENSOR;
            fm_error_set("expected one tensor");
        } else if (fm_wire_tensor_get(u->model[0], "model", 1, (uint32_t)c->nglobal, c->scratch) != FM_OK) {
            code = fm_wire_last_code();
        } else if (fm_aggregator_check(c->agg_model, c->scratch, u->train_samples) != FM_OK) {
            code = FM_WIRE_BAD_VALUE;
        }
        if (code != FM_WIRE_OK) {
            snprintf(why, sizeof why, "model: %s", fm_error_last());
            send_error(c, cl->id, code, why);
            return;
        }
    }
    float *pp = NULL;
    if (fm_strategy_shares_prompt(c->spec.strategy)) {
        pp = malloc(sizeof(float) * c->nprompt);
        if (!pp || fm_wire_tensor_get(u->prompt, "prompt", (uint32_t)mc->prompt_len, (uint32_t)mc->prompt_dim, pp) != FM_OK ||
            fm_aggregator_check(c->agg_prompt, pp, u->train_samples) != FM_OK) {
            snprintf(why, sizeof why, "prompt: %s", fm_error_last());
            send_error(c, cl->id, FM_WIRE_BAD_TENSOR, why);
            free(pp);
            return;
        }
    }
    if (c->spec.strategy != FM_STRATEGY_LOCAL)
        fm_aggregator_add(c->agg_model, c->scratch, u->train_samples);
    if (pp) {
        fm_aggregator_add(c->agg_prompt, pp, u->train_samples);
        cl->pending_prompt = pp;
    }
    cl->done = true;
    fm_client_round_row_t *row = &cl->row;
    snprintf(row->status, sizeof row->status, "completed");
    row->train_loss = m->train_loss;
    row->val_loss = m->val_loss;
    row->test_loss = m->test_loss;
    row->test_accuracy = m->test_accuracy;
    row->generalist_share = m->generalist_share;
    row->train_samples = (int64_t)u->train_samples;
    row->test_samples = (int64_t)m->test_samples;
    row->test_correct = (int64_t)m->test_correct;
    row->val_samples = (int64_t)m->val_samples;
    row->val_correct = (int64_t)m->val_correct;
    row->seconds = m->seconds;
    row->bytes_up = (int64_t)bytes;
    c->bytes_up += (int64_t)bytes;
    fm_debug("round %d: update from %s (%llu samples, test accuracy %.4f)", c->round, cl->id,
             (unsigned long long)u->train_samples, m->test_accuracy);
}

/* Clients silent for longer than the client timeout are taken as gone: not
 * selected, and not waited for in the round they were selected for. */
static void sweep_silent(coord_t *c)
{
    double now = fm_clock_seconds();
    for (int i = 0; i < c->nclients; i++) {
        client_t *cl = &c->clients[i];
        if (cl->connected && cl->ready && now - cl->last_seen > c->cfg->client_timeout) {
            cl->connected = false;
            fm_warn("client %s silent for %.0f s: taken as gone%s", cl->id, now - cl->last_seen,
                    c->in_round && cl->selected && !cl->done ? " (dropped from this round)" : "");
        }
    }
}

/* Closes the round: aggregates and commits, or (short of the quorum) runs it again. */
static fm_status close_round(coord_t *c)
{
    int selected = 0, completed = 0, working = 0;
    for (int i = 0; i < c->nclients; i++) {
        const client_t *cl = &c->clients[i];
        selected += cl->selected;
        completed += cl->done;
        working += cl->selected && !cl->done && cl->connected;
    }
    if (completed < c->cfg->min_clients && completed + working >= c->cfg->min_clients) {
        /* short of the quorum, but clients that are alive are still training: wait
         * for them rather than resend the round and make them start over */
        fm_warn("round %d: %d of %d updates by the deadline, the quorum is %d; %d clients still training: "
                "waiting another %.0f s",
                c->round, completed, selected, c->cfg->min_clients, working, c->cfg->round_timeout);
        c->deadline = fm_clock_seconds() + c->cfg->round_timeout;
        return FM_OK;
    }
    c->in_round = false;
    if (completed < c->cfg->min_clients) {
        fm_warn("round %d: %d of %d updates and too few clients left for the quorum of %d: running the round again "
                "when enough clients are ready",
                c->round, completed, selected, c->cfg->min_clients);
        return FM_OK;
    }
    if (c->spec.strategy != FM_STRATEGY_LOCAL && fm_aggregator_mean(c->agg_model, c->global) != FM_OK)
        return FM_ERR_STATE;
    if (fm_strategy_shares_prompt(c->spec.strategy) && fm_aggregator_mean(c->agg_prompt, c->gprompt) != FM_OK)
        return FM_ERR_STATE;
    fm_client_round_row_t *rows = calloc(selected ? selected : 1, sizeof *rows);
    if (!rows)
        return FM_ERR_NOMEM;
    fm_round_row_t r = {0};
    r.round = c->round;
    snprintf(r.started_at, sizeof r.started_at, "%s", c->started_at);
    fm_clock_utc(r.finished_at);
    r.selected = selected;
    r.completed = completed;
    r.dropped = selected - completed;
    double tl = 0, tn = 0, sl = 0, sn = 0, corr = 0, vn = 0, vcorr = 0;
    int n = 0;
    for (int i = 0; i < c->nclients; i++) {
        client_t *cl = &c->clients[i];
        if (!cl->selected)
            continue;
        rows[n++] = cl->row;
        if (cl->done) {
            tl += cl->row.train_loss * (double)cl->row.train_samples;
            tn += (double)cl->row.train_samples;
            sl += cl->row.test_loss * (double)cl->row.test_samples;
            sn += (double)cl->row.test_samples;
            corr += (double)cl->row.test_correct;
            vn += (double)cl->row.val_samples;
            vcorr += (double)cl->row.val_correct;
        }
    }
    r.train_loss = tn > 0 ? tl / tn : 0.0;
    r.test_loss = sn > 0 ? sl / sn : 0.0;
    r.test_accuracy = sn > 0 ? corr / sn : 0.0;
    r.val_accuracy = vn > 0 ? vcorr / vn : 0.0;
    r.bytes_up = c->bytes_up;
    r.bytes_down = c->bytes_down;
    r.seconds = fm_clock_seconds() - c->started;
    /* the pool takes this round's prompts only once the round commits */
    float **old = calloc(c->nclients ? c->nclients : 1, sizeof(float *));
    if (!old) {
        free(rows);
        return FM_ERR_NOMEM;
    }
    for (int i = 0; i < c->nclients; i++) {
        client_t *cl = &c->clients[i];
        old[i] = cl->prompt;
        if (cl->done && cl->pending_prompt && fm_strategy_uses_pool(c->spec.strategy))
            cl->prompt = cl->pending_prompt;
    }
    uint8_t *ckpt = NULL;
    size_t ckpt_len = 0;
    fm_status st = checkpoint_encode(c, c->round, &ckpt, &ckpt_len);
    if (st == FM_OK) {
        fm_sha256_hex(ckpt, ckpt_len, r.checkpoint_sha256);
        st = fm_store_commit_round(c->store, c->run_id, &r, rows, n, ckpt, ckpt_len);
    }
    for (int i = 0; i < c->nclients; i++) {
        client_t *cl = &c->clients[i];
        if (cl->prompt != old[i]) {
            if (st == FM_OK) {
                free(old[i]);
                cl->pending_prompt = NULL; /* now owned as the pool entry */
            } else {
                cl->prompt = old[i];
            }
        }
    }
    free(old);
    free(ckpt);
    free(rows);
    if (st != FM_OK)
        return st;
    fm_info("round %d/%d: %d/%d clients, train loss %.4f, test loss %.4f, test accuracy %.2f%%, %.1f s",
            c->round, c->cfg->rounds, completed, selected, r.train_loss, r.test_loss, 100.0 * r.test_accuracy,
            r.seconds);
    c->round++;
    return FM_OK;
}

/* ---- startup: new run or resume ---------------------------------------------- */

static fm_status restore(coord_t *c, const char *run_id)
{
    int round = 0;
    uint8_t *blob = NULL;
    size_t len = 0;
    bool found = false;
    fm_status st = fm_store_latest_checkpoint(c->store, run_id, &round, &blob, &len, &found);
    if (st != FM_OK)
        return st;
    fm_client_row_t *rows = NULL;
    int n = 0;
    if ((st = fm_store_list_clients(c->store, run_id, &rows, &n)) != FM_OK) {
        free(blob);
        return st;
    }
    for (int i = 0; i < n; i++) {
        client_t *cl = add_client(c, rows[i].id);
        if (!cl) {
            st = FM_ERR_NOMEM;
            break;
        }
        cl->partition = rows[i].partition_index;
        snprintf(cl->first_seen, sizeof cl->first_seen, "%s", rows[i].first_seen);
    }
    free(rows);
    if (st == FM_OK && found) {
        fm_checkpoint_t ck;
        if ((st = fm_checkpoint_decode(blob, len, &ck)) == FM_OK) {
            if (ck.nglobal != c->nglobal || ck.nprompt != c->nprompt) {
                fm_error_set("checkpoint of run %s does not fit the model (%zu/%zu values, expected %zu/%zu)", run_id,
                             ck.nglobal, ck.nprompt, c->nglobal, c->nprompt);
                st = FM_ERR_FORMAT;
            } else {
                memcpy(c->global, ck.global, sizeof(float) * c->nglobal);
                memcpy(c->gprompt, ck.prompt, sizeof(float) * c->nprompt);
                for (int i = 0; i < ck.pool_count && st == FM_OK; i++) {
                    client_t *cl = find_client(c, ck.pool_ids[i]);
                    if (!cl)
                        cl = add_client(c, ck.pool_ids[i]);
                    if (!cl || !(cl->prompt = malloc(sizeof(float) * c->nprompt))) {
                        st = FM_ERR_NOMEM;
                        break;
                    }
                    memcpy(cl->prompt, ck.pool + (size_t)i * c->nprompt, sizeof(float) * c->nprompt);
                }
                c->round = ck.round + 1;
            }
            fm_checkpoint_free(&ck);
        }
    }
    free(blob);
    return st;
}

static fm_status start_or_resume(coord_t *c)
{
    char cfg_json[4096];
    fm_run_spec_json(&c->spec, cfg_json, sizeof cfg_json);
    fm_run_row_t latest;
    bool found = false;
    fm_status st = fm_store_latest_run(c->store, &latest, &found);
    if (st != FM_OK)
        return st;
    if (found && strcmp(latest.status, "finished") != 0 && !c->cfg->new_run) {
        if (strcmp(latest.config, cfg_json) != 0 || latest.rounds_planned != c->cfg->rounds) {
            fm_error_set("%s holds unfinished run %s with another configuration; start it with the same settings "
                         "to resume, or pass --new-run",
                         c->cfg->db, latest.id);
            fm_store_run_clear(&latest);
            return FM_ERR_ARG;
        }
        snprintf(c->run_id, sizeof c->run_id, "%s", latest.id);
        fm_store_run_clear(&latest);
        c->round = 1; /* unless a checkpoint says otherwise */
        if ((st = restore(c, c->run_id)) != FM_OK)
            return st;
        fm_info("resuming run %s at round %d of %d", c->run_id, c->round, c->cfg->rounds);
        return fm_store_set_run_status(c->store, c->run_id, "running");
    }
    if (found)
        fm_store_run_clear(&latest);
    fm_rng_t r;
    fm_rng_init(&r, (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32), 0);
    char stamp[32];
    fm_clock_utc(stamp);
    snprintf(c->run_id, sizeof c->run_id, "run-%.4s%.2s%.2s-%.2s%.2s%.2s-%04x", stamp, stamp + 5, stamp + 8,
             stamp + 11, stamp + 14, stamp + 17, fm_rng_u32(&r) & 0xffff);
    c->round = 1;
    fm_info("new run %s: strategy %s, %d rounds, seed %llu", c->run_id, fm_strategy_name(c->spec.strategy),
            c->cfg->rounds, (unsigned long long)c->spec.seed);
    return fm_store_create_run(c->store, c->run_id, cfg_json, c->spec.seed, fm_strategy_name(c->spec.strategy),
                               c->cfg->rounds);
}

/* ---- the loop ---------------------------------------------------------------- */

static void handle_message(coord_t *c, const char *id, const uint8_t *data, size_t len)
{
    Fedmoe__Envelope *env = NULL;
    if (fm_wire_decode(data, len, c->max_message, &env) != FM_OK) {
        send_error(c, id, fm_wire_last_code(), fm_error_last());
        return;
    }
    client_t *cl = find_client(c, id);
    if (cl && env->body_case != FEDMOE__ENVELOPE__BODY_HELLO && cl->last_seen > 0) {
        if (!cl->connected)
            fm_info("client %s is back", id);
        cl->connected = true;
        cl->last_seen = fm_clock_seconds();
    }
    switch (env->body_case) {
    case FEDMOE__ENVELOPE__BODY_HELLO: handle_hello(c, id, env->hello); break;
    case FEDMOE__ENVELOPE__BODY_UPDATE:
        if (!cl || !cl->connected)
            send_error(c, id, FM_WIRE_UNKNOWN_CLIENT, "update before hello");
        else
            handle_update(c, cl, env->update, len);
        break;
    case FEDMOE__ENVELOPE__BODY_HEARTBEAT:
        if (!cl || !cl->connected)
            send_error(c, id, FM_WIRE_UNKNOWN_CLIENT, "heartbeat before hello");
        break;
    case FEDMOE__ENVELOPE__BODY_ERROR: fm_warn("client %s reports error %u: %.200s", id, env->error->code, env->error->text); break;
    default: send_error(c, id, FM_WIRE_MALFORMED, "a coordinator takes hello, update, heartbeat and error messages"); break;
    }
    fedmoe__envelope__free_unpacked(env, NULL);
}

/* Reads every waiting message (identity frame + one payload frame). */
static void drain(coord_t *c)
{
    for (;;) {
        zmq_msg_t idm, msg;
        zmq_msg_init(&idm);
        if (zmq_msg_recv(&idm, c->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&idm);
            return;
        }
        char id[64] = "";
        size_t idn = zmq_msg_size(&idm);
        bool id_ok = fm_wire_valid_id(zmq_msg_data(&idm), idn);
        if (id_ok)
            memcpy(id, zmq_msg_data(&idm), idn);
        zmq_msg_init(&msg);
        bool have = zmq_msg_more(&idm) && zmq_msg_recv(&msg, c->sock, ZMQ_DONTWAIT) >= 0;
        bool extra = have && zmq_msg_more(&msg);
        while (have && zmq_msg_more(&msg)) { /* drop surplus frames */
            zmq_msg_close(&msg);
            zmq_msg_init(&msg);
            if (zmq_msg_recv(&msg, c->sock, ZMQ_DONTWAIT) < 0)
                break;
        }
        if (!id_ok)
            fm_warn("dropped a message from a peer without a valid client id (set ZMQ_ROUTING_ID to [A-Za-z0-9._-]{1,63})");
        else if (!have)
            fm_warn("client %s: empty message", id);
        else if (extra)
            send_error(c, id, FM_WIRE_MALFORMED, "a message is one frame");
        else
            handle_message(c, id, zmq_msg_data(&msg), zmq_msg_size(&msg));
        zmq_msg_close(&msg);
        zmq_msg_close(&idm);
    }
}

static void shutdown_clients(coord_t *c, const char *reason)
{
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    Fedmoe__Shutdown sd = FEDMOE__SHUTDOWN__INIT;
    sd.reason = (char *)reason;
    env.body_case = FEDMOE__ENVELOPE__BODY_SHUTDOWN;
    env.shutdown = &sd;
    for (int i = 0; i < c->nclients; i++)
        if (c->clients[i].connected)
            fm_wire_send(c->sock, c->clients[i].id, &env);
}

static void coord_free(coord_t *c)
{
    for (int i = 0; i < c->nclients; i++) {
        free(c->clients[i].prompt);
        free(c->clients[i].pending_prompt);
    }
    free(c->clients);
    free(c->global);
    free(c->gprompt);
    free(c->scratch);
    fm_aggregator_destroy(&c->agg_model);
    fm_aggregator_destroy(&c->agg_prompt);
    fm_model_destroy(&c->tmpl);
    if (c->sock) {
        int linger = 2000;
        zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof linger);
        zmq_close(c->sock);
    }
    if (c->ctx)
        zmq_ctx_term(c->ctx);
    fm_store_close(&c->store);
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

fm_status fm_coordinator_run(const fm_server_config_t *cfg, volatile sig_atomic_t *stop)
{
    coord_t c = {0};
    c.cfg = cfg;
    c.spec = cfg->spec;
    fm_status st = fm_run_spec_finish(&c.spec);
    if (st != FM_OK)
        return st;
    if (cfg->rounds < 1 || cfg->min_clients < 1 || !(cfg->fraction > 0.0 && cfg->fraction <= 1.0) ||
        !(cfg->round_timeout > 0.0) || !(cfg->client_timeout > 0.0)) {
        fm_error_set("rounds and min-clients must be at least 1, fraction in (0, 1], timeouts positive");
        return FM_ERR_ARG;
    }
    if ((st = fm_model_new(&c.tmpl, &c.spec.model, c.spec.seed, FM_STREAM_INIT)) != FM_OK)
        goto out;
    c.nglobal = fm_federated_size(c.tmpl, c.spec.strategy);
    c.nprompt = (size_t)c.spec.model.prompt_len * c.spec.model.prompt_dim;
    c.global = malloc(sizeof(float) * (c.nglobal + 1));
    c.gprompt = malloc(sizeof(float) * c.nprompt);
    c.scratch = malloc(sizeof(float) * (c.nglobal + 1));
    if (!c.global || !c.gprompt || !c.scratch) {
        st = FM_ERR_NOMEM;
        goto out;
    }
    fm_federated_pack(c.tmpl, c.spec.strategy, c.global);
    memcpy(c.gprompt, fm_params_find(fm_model_params(c.tmpl), "prompt")->view->w, sizeof(float) * c.nprompt);
    if ((st = fm_aggregator_new(&c.agg_model, c.nglobal)) != FM_OK ||
        (st = fm_aggregator_new(&c.agg_prompt, c.nprompt)) != FM_OK)
        goto out;
    c.max_message = cfg->max_message ? cfg->max_message : 2 * 4 * (c.nglobal + c.nprompt) + (1u << 20);
    if ((st = check_disk(cfg->db, 8 * (c.nglobal + c.nprompt) * 4)) != FM_OK ||
        (st = fm_store_open(&c.store, cfg->db, false)) != FM_OK)
        goto out;
    if ((st = start_or_resume(&c)) != FM_OK)
        goto out;
    c.ctx = zmq_ctx_new();
    c.sock = c.ctx ? zmq_socket(c.ctx, ZMQ_ROUTER) : NULL;
    if (!c.sock) {
        fm_error_set("cannot create a ZeroMQ socket: %s", zmq_strerror(zmq_errno()));
        st = FM_ERR_IO;
        goto out;
    }
    int64_t maxsz = (int64_t)c.max_message;
    int one = 1;
    zmq_setsockopt(c.sock, ZMQ_MAXMSGSIZE, &maxsz, sizeof maxsz);
    zmq_setsockopt(c.sock, ZMQ_ROUTER_HANDOVER, &one, sizeof one);
    fm_wire_tune_socket(c.sock);
    if (zmq_bind(c.sock, cfg->bind) != 0) {
        fm_error_set("cannot bind %s: %s", cfg->bind, zmq_strerror(zmq_errno()));
        st = FM_ERR_IO;
        goto out;
    }
    fm_info("listening on %s (database %s, messages up to %zu bytes)", cfg->bind, cfg->db, c.max_message);
    double waiting_logged = 0;
    while (!*stop && c.round <= cfg->rounds) {
        if (!c.in_round)
            try_start_round(&c);
        if (!c.in_round && fm_clock_seconds() - waiting_logged > 10.0) {
            int connected = 0;
            for (int i = 0; i < c.nclients; i++)
                connected += c.clients[i].connected && c.clients[i].ready;
            fm_info("round %d: waiting for clients (%d ready, %d needed)", c.round, connected, cfg->min_clients);
            waiting_logged = fm_clock_seconds();
        }
        zmq_pollitem_t item = {c.sock, 0, ZMQ_POLLIN, 0};
        long timeout = POLL_MS;
        if (c.in_round) {
            double left = c.deadline - fm_clock_seconds();
            timeout = left <= 0 ? 0 : (long)fmin(POLL_MS, left * 1000.0 + 1);
        }
        if (zmq_poll(&item, 1, timeout) < 0 && zmq_errno() != EINTR) {
            fm_error_set("poll: %s", zmq_strerror(zmq_errno()));
            st = FM_ERR_IO;
            goto out;
        }
        if (item.revents & ZMQ_POLLIN)
            drain(&c);
        sweep_silent(&c);
        if (c.in_round) {
            bool all = true;
            for (int i = 0; i < c.nclients; i++)
                all &= !c.clients[i].selected || c.clients[i].done || !c.clients[i].connected;
            if (all || fm_clock_seconds() >= c.deadline) {
                if (!all)
                    fm_warn("round %d: deadline passed", c.round);
                if ((st = close_round(&c)) != FM_OK)
                    goto out;
            }
        }
    }
    if (c.round > cfg->rounds) {
        fm_info("run %s finished: %d rounds", c.run_id, cfg->rounds);
        st = fm_store_set_run_status(c.store, c.run_id, "finished");
        shutdown_clients(&c, "the run is finished");
    } else {
        fm_info("stopping: run %s left resumable at round %d", c.run_id, c.round);
        st = fm_store_set_run_status(c.store, c.run_id, "stopped");
        shutdown_clients(&c, "the coordinator is stopping");
    }
out:
    coord_free(&c);
    return st;
}
