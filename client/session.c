#include "session.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "fedmoe/clientdata.h"
#include "fedmoe/clock.h"
#include "fedmoe/log.h"
#include "fedmoe/rng.h"
#include "fedmoe/runspec.h"
#include "fedmoe/train.h"
#include "fedmoe/wire.h"

#define HELLO_RETRY_S 3.0
#define HEARTBEAT_S 1.0
#define STATE_MAGIC 0x53434D46u /* "FMCS" */
#define STATE_VERSION 1u

typedef struct {
    int round;              /* -1: empty */
    float *a[FM_GROUP_COUNT][3];
    int64_t steps[2];
    fm_rng_t rng;
} snapshot_t;

typedef struct {
    const fm_session_config_t *cfg;
    volatile sig_atomic_t *stop; /* set by a signal: leave, even mid-training */
    void *ctx, *sock;
    char run_id[64];
    fm_run_spec_t spec;
    int partition;
    fm_client_data_t data;
    bool have_data;
    fm_model_t *model;
    fm_trainer_t *trainer;
    float *vec;             /* federated vector scratch */
    size_t nvec, nprompt;
    int last_round;         /* last round trained (0: none) */
    snapshot_t pre;         /* the state from before round pre.round (= last_round) */
    double last_beat;
} session_t;

void fm_session_config_default(fm_session_config_t *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->connect, sizeof c->connect, "tcp://127.0.0.1:5555");
    char host[32] = "client";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    snprintf(c->id, sizeof c->id, "%.30s-%d", host, (int)getpid());
    c->specialists = 2;
    c->partition_index = -1;
}

static void send_hello(session_t *s)
{
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    Fedmoe__Hello h = FEDMOE__HELLO__INIT;
    h.client_id = (char *)s->cfg->id;
    h.protocol_version = FM_PROTOCOL_VERSION;
    h.specialists = (uint32_t)s->cfg->specialists;
    h.partition_index = s->have_data ? s->partition : s->cfg->partition_index;
    if (s->have_data) {
        h.train_samples = s->data.train.n;
        h.val_samples = s->data.val.n;
        h.test_samples = s->data.test.n;
    }
    env.body_case = FEDMOE__ENVELOPE__BODY_HELLO;
    env.hello = &h;
    if (fm_wire_send(s->sock, NULL, &env) != FM_OK)
        fm_warn("hello not sent: %s", fm_error_last());
}

static void state_path(const session_t *s, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s.%s.state", s->cfg->state_dir, s->run_id, s->cfg->id);
}

/* Everything a round changes on a client: every group's weights and moments, the
 * AdamW step counts and the shuffling generator. */
static void snap_free(snapshot_t *n)
{
    for (int g = 0; g < FM_GROUP_COUNT; g++)
        for (int k = 0; k < 3; k++) {
            free(n->a[g][k]);
            n->a[g][k] = NULL;
        }
    n->round = -1;
}

static fm_status snap_take(session_t *s, snapshot_t *n, int round)
{
    fm_params_t *ps = fm_model_params(s->model);
    for (int g = 0; g < FM_GROUP_COUNT; g++) {
        size_t sz = ps->groups[g].size;
        const float *src[3] = {ps->groups[g].w, ps->groups[g].m, ps->groups[g].v};
        for (int k = 0; k < 3; k++) {
            if (!n->a[g][k] && !(n->a[g][k] = malloc(4 * (sz ? sz : 1))))
                return FM_ERR_NOMEM;
            memcpy(n->a[g][k], src[k], 4 * sz);
        }
    }
    n->steps[0] = fm_trainer_steps(s->trainer, FM_LEVEL_LOWER);
    n->steps[1] = fm_trainer_steps(s->trainer, FM_LEVEL_UPPER);
    n->rng = *fm_trainer_rng(s->trainer);
    n->round = round;
    return FM_OK;
}

static void snap_restore(session_t *s, const snapshot_t *n)
{
    fm_params_t *ps = fm_model_params(s->model);
    for (int g = 0; g < FM_GROUP_COUNT; g++) {
        size_t sz = ps->groups[g].size;
        float *dst[3] = {ps->groups[g].w, ps->groups[g].m, ps->groups[g].v};
        for (int k = 0; k < 3; k++)
            memcpy(dst[k], n->a[g][k], 4 * sz);
    }
    fm_trainer_set_steps(s->trainer, (long)n->steps[0], (long)n->steps[1]);
    *fm_trainer_rng(s->trainer) = n->rng;
}

static bool snap_write(FILE *f, session_t *s, const snapshot_t *n)
{
    fm_params_t *ps = fm_model_params(s->model);
    int32_t round = n->round;
    bool ok = fwrite(&round, 4, 1, f) == 1 && fwrite(n->steps, sizeof n->steps, 1, f) == 1 &&
              fwrite(&n->rng, sizeof n->rng, 1, f) == 1;
    for (int g = 0; g < FM_GROUP_COUNT && ok; g++) {
        uint64_t sz = ps->groups[g].size;
        ok = fwrite(&sz, 8, 1, f) == 1;
        for (int k = 0; k < 3 && ok; k++)
            ok = fwrite(n->a[g][k], 4, sz, f) == sz;
    }
    return ok;
}

static bool snap_read(FILE *f, session_t *s, snapshot_t *n)
{
    fm_params_t *ps = fm_model_params(s->model);
    int32_t round;
    bool ok = fread(&round, 4, 1, f) == 1 && fread(n->steps, sizeof n->steps, 1, f) == 1 &&
              fread(&n->rng, sizeof n->rng, 1, f) == 1;
    for (int g = 0; g < FM_GROUP_COUNT && ok; g++) {
        uint64_t sz;
        ok = fread(&sz, 8, 1, f) == 1 && sz == ps->groups[g].size;
        for (int k = 0; k < 3 && ok; k++)
            ok = (n->a[g][k] || (n->a[g][k] = malloc(4 * (sz ? sz : 1)))) && fread(n->a[g][k], 4, sz, f) == sz;
    }
    n->round = round;
    return ok;
}

/* The state file holds the state after the last trained round and the state from
 * before it, so a round the coordinator sends again is trained from the same
 * starting point. Written to a temporary file and renamed. */
static void save_state(session_t *s)
{
    if (!s->cfg->state_dir[0])
        return;
    char path[1200], tmp[1210];
    state_path(s, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        fm_warn("cannot write %s: %s", tmp, strerror(errno));
        return;
    }
    snapshot_t now = {.round = s->last_round};
    bool ok = snap_take(s, &now, s->last_round) == FM_OK;
    uint32_t hdr[2] = {STATE_MAGIC, STATE_VERSION};
    uint8_t has_pre = s->pre.round >= 0;
    ok = ok && fwrite(hdr, sizeof hdr, 1, f) == 1 && snap_write(f, s, &now) && fwrite(&has_pre, 1, 1, f) == 1 &&
         (!has_pre || snap_write(f, s, &s->pre));
    snap_free(&now);
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        fm_warn("cannot write %s", path);
        unlink(tmp);
    }
}

static void load_state(session_t *s)
{
    if (!s->cfg->state_dir[0])
        return;
    char path[1200];
    state_path(s, path, sizeof path);
    FILE *f = fopen(path, "rb");
    if (!f)
        return;
    uint32_t hdr[2];
    snapshot_t now = {.round = -1}, pre = {.round = -1};
    uint8_t has_pre = 0;
    bool ok = fread(hdr, sizeof hdr, 1, f) == 1 && hdr[0] == STATE_MAGIC && hdr[1] == STATE_VERSION &&
              snap_read(f, s, &now) && fread(&has_pre, 1, 1, f) == 1 && (!has_pre || snap_read(f, s, &pre)) &&
              fgetc(f) == EOF;
    fclose(f);
    if (ok) {
        snap_restore(s, &now);
        s->last_round = now.round;
        snap_free(&s->pre);
        s->pre = pre;
        pre.round = -1;
        for (int g = 0; g < FM_GROUP_COUNT; g++)
            for (int k = 0; k < 3; k++)
                pre.a[g][k] = NULL;
        fm_info("restored local state after round %d from %s", s->last_round, path);
    } else {
        fm_warn("%s is not a usable state file for this run; starting fresh", path);
    }
    snap_free(&now);
    snap_free(&pre);
}

static void drop_run(session_t *s)
{
    fm_trainer_destroy(&s->trainer);
    fm_model_destroy(&s->model);
    if (s->have_data)
        fm_client_data_free(&s->data);
    s->have_data = false;
    free(s->vec);
    s->vec = NULL;
    s->run_id[0] = 0;
    s->last_round = 0;
    snap_free(&s->pre);
}

/* A heartbeat when one is due; also called between training steps, so a client
 * busy with a long local step is not taken for dead. */
static void beat_if_due(session_t *s)
{
    double now = fm_clock_seconds();
    if (now - s->last_beat < HEARTBEAT_S)
        return;
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    Fedmoe__Heartbeat hb = FEDMOE__HEARTBEAT__INIT;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    hb.unix_ms = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    env.body_case = FEDMOE__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    fm_wire_send(s->sock, NULL, &env);
    s->last_beat = now;
}

static bool on_progress(void *user)
{
    session_t *s = user;
    beat_if_due(s);
    return !*s->stop;
}

static fm_status handle_welcome(session_t *s, const Fedmoe__Welcome *w)
{
    if (s->run_id[0] && strcmp(s->run_id, w->run_id) == 0)
        return FM_OK; /* a repeated welcome for the run we are in */
    if (s->run_id[0])
        fm_info("the coordinator now runs %s; leaving run %s", w->run_id, s->run_id);
    drop_run(s);
    if (!fm_wire_valid_id(w->run_id, strlen(w->run_id))) {
        fm_error_set("welcome with an unusable run id");
        return FM_ERR_FORMAT;
    }
    fm_status st = fm_run_spec_from_welcome(&s->spec, w, s->cfg->specialists);
    if (st != FM_OK)
        return st;
    if (w->partition_index < 0 || w->partition_index >= s->spec.partition_count) {
        fm_error_set("welcome assigns partition %d of %d", w->partition_index, s->spec.partition_count);
        return FM_ERR_FORMAT;
    }
    if (s->cfg->partition_count && s->cfg->partition_count != s->spec.partition_count) {
        fm_error_set("--partition says %d clients, the run has %d", s->cfg->partition_count, s->spec.partition_count);
        return FM_ERR_ARG;
    }
    s->partition = w->partition_index;
    fm_data_spec_t ds;
    fm_data_spec_default(&ds);
    ds.dataset = s->cfg->dataset[0] ? s->cfg->dataset : s->spec.dataset;
    ds.index = s->partition;
    ds.count = s->spec.partition_count;
    ds.part = s->spec.part;
    ds.seed = s->spec.seed;
    ds.holdout = s->spec.holdout;
    if ((st = fm_client_data_load(&s->data, &ds)) != FM_OK)
        return st;
    s->have_data = true;
    if ((uint32_t)s->data.dim != (uint32_t)s->spec.model.in_dim || s->data.classes > s->spec.model.classes) {
        fm_error_set("data has %d features and %d classes; the run's model takes %d and %d", s->data.dim,
                     s->data.classes, s->spec.model.in_dim, s->spec.model.classes);
        return FM_ERR_ARG;
    }
    uint64_t stream = FM_STREAM_LOCAL + (uint64_t)s->partition;
    if ((st = fm_model_new(&s->model, &s->spec.model, s->spec.seed, stream)) != FM_OK ||
        (st = fm_trainer_new(&s->trainer, s->model, &s->spec.train, s->spec.seed, stream)) != FM_OK)
        return st;
    fm_trainer_set_progress(s->trainer, on_progress, s, 10);
    s->nvec = fm_federated_size(s->model, s->spec.strategy);
    s->nprompt = (size_t)s->spec.model.prompt_len * s->spec.model.prompt_dim;
    if (!(s->vec = malloc(sizeof(float) * (s->nvec + 1))))
        return FM_ERR_NOMEM;
    snprintf(s->run_id, sizeof s->run_id, "%s", w->run_id);
    load_state(s);
    fm_info("run %s (%s), partition %d/%d: %zu train, %zu validation, %zu test examples", s->run_id,
            fm_strategy_name(s->spec.strategy), s->partition, s->spec.partition_count, s->data.train.n,
            s->data.val.n, s->data.test.n);
    send_hello(s); /* again, now with sample counts */
    return FM_OK;
}


static void reply_error(session_t *s, fm_wire_code code, const char *text)
{
    fm_warn("%s", text);
    fm_wire_send_error(s->sock, NULL, code, text);
}

static fm_status handle_task(session_t *s, const Fedmoe__Task *t)
{
    if (!s->model) {
        reply_error(s, FM_WIRE_REJECTED, "task before welcome");
        return FM_OK;
    }
    const fm_model_config_t *mc = &s->spec.model;
    float *prompt = fm_params_find(fm_model_params(s->model), "prompt")->view->w;
    /* check everything, then apply */
    float lr_scale = t->lr_scale == 0.0f ? 1.0f : t->lr_scale;
    if (!(lr_scale > 0.0f && lr_scale <= 10.0f)) {
        reply_error(s, FM_WIRE_BAD_VALUE, "task lr_scale out of range (0, 10]");
        return FM_OK;
    }
    if (s->spec.strategy != FM_STRATEGY_LOCAL &&
        (t->n_model != 1 || fm_wire_tensor_get(t->model[0], "model", 1, (uint32_t)s->nvec, s->vec) != FM_OK)) {
        reply_error(s, FM_WIRE_BAD_TENSOR, t->n_model != 1 ? "task without its model tensor" : fm_error_last());
        return FM_OK;
    }
    float *gp = malloc(sizeof(float) * s->nprompt), *nl = NULL;
    int K = (int)t->n_nonlocal_prompts;
    if (K > mc->max_nonlocal)
        K = -1;
    else
        nl = malloc(sizeof(float) * s->nprompt * (K ? K : 1));
    bool ok = gp && nl && K >= 0;
    if (ok && fm_strategy_shares_prompt(s->spec.strategy))
        ok = fm_wire_tensor_get(t->global_prompt, "prompt", (uint32_t)mc->prompt_len, (uint32_t)mc->prompt_dim, gp) == FM_OK;
    for (int j = 0; ok && j < K; j++)
        ok = fm_wire_tensor_get(t->nonlocal_prompts[j], "nonlocal", (uint32_t)mc->prompt_len, (uint32_t)mc->prompt_dim,
                                nl + s->nprompt * j) == FM_OK;
    if (!ok) {
        reply_error(s, FM_WIRE_BAD_TENSOR, K < 0 ? "too many non-local prompts" : fm_error_last());
        free(gp);
        free(nl);
        return FM_OK;
    }
    /* exactly once: a round sent again (the coordinator lost it) is trained again
     * from the state before it, not from the state it produced */
    if ((int)t->round == s->last_round && s->pre.round == (int)t->round) {
        fm_info("round %u again: restoring the state from before it", t->round);
        snap_restore(s, &s->pre);
    } else if ((int)t->round <= s->last_round) {
        fm_warn("round %u is older than the last trained round %d; training from the current state", t->round,
                s->last_round);
    } else if (snap_take(s, &s->pre, (int)t->round) != FM_OK) {
        free(gp);
        free(nl);
        return FM_ERR_NOMEM;
    }
    if (s->spec.strategy != FM_STRATEGY_LOCAL)
        fm_federated_unpack(s->model, s->spec.strategy, s->vec);
    if (fm_strategy_shares_prompt(s->spec.strategy))
        memcpy(prompt, gp, sizeof(float) * s->nprompt);
    fm_model_set_nonlocal(s->model, nl, fm_strategy_uses_pool(s->spec.strategy) ? K : 0);
    free(gp);
    free(nl);
    fm_trainer_set_lr_scale(s->trainer, lr_scale);
    fm_train_stats_t ts;
    fm_eval_t ev, vv = {0};
    double t0 = fm_clock_seconds();
    fm_status st = fm_trainer_run(s->trainer, &s->data.train, &s->data.val, s->spec.local_epochs, &ts);
    if (st == FM_ERR_STATE && *s->stop) {
        /* the state file keeps the last finished round; a restart trains this one again */
        fm_info("round %u abandoned: stopping", t->round);
        return FM_OK;
    }
    if (st == FM_OK)
        st = fm_evaluate(s->model, &s->data.test, &ev);
    if (st == FM_OK && s->data.val.n > 0)
        st = fm_evaluate(s->model, &s->data.val, &vv);
    if (st != FM_OK)
        return st;
    s->last_round = (int)t->round;
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    Fedmoe__Update up = FEDMOE__UPDATE__INIT;
    Fedmoe__Metrics m = FEDMOE__METRICS__INIT;
    Fedmoe__Tensor model_t, prompt_t, *list[1];
    up.round = t->round;
    up.train_samples = s->data.train.n;
    m.train_loss = (float)ts.train_loss;
    m.val_loss = (float)ts.val_loss;
    m.test_loss = (float)ev.loss;
    m.test_accuracy = (float)ev.accuracy;
    m.generalist_share = (float)ev.generalist_share;
    m.test_samples = ev.n;
    m.test_correct = ev.correct;
    m.val_samples = vv.n;
    m.val_correct = vv.correct;
    m.seconds = fm_clock_seconds() - t0;
    up.metrics = &m;
    bool built = true;
    if (s->spec.strategy != FM_STRATEGY_LOCAL) {
        fm_federated_pack(s->model, s->spec.strategy, s->vec);
        built &= fm_wire_tensor_set(&model_t, "model", s->vec, 1, (uint32_t)s->nvec) == FM_OK;
        list[0] = &model_t;
        up.model = list;
        up.n_model = 1;
    }
    if (fm_strategy_shares_prompt(s->spec.strategy)) {
        built &= fm_wire_tensor_set(&prompt_t, "prompt", prompt, (uint32_t)mc->prompt_len, (uint32_t)mc->prompt_dim) == FM_OK;
        up.prompt = &prompt_t;
    }
    env.body_case = FEDMOE__ENVELOPE__BODY_UPDATE;
    env.update = &up;
    st = built ? fm_wire_send(s->sock, NULL, &env) : FM_ERR_NOMEM;
    if (up.n_model)
        fm_wire_tensor_clear(&model_t);
    if (up.prompt)
        fm_wire_tensor_clear(&prompt_t);
    if (st != FM_OK)
        fm_warn("round %u: update not sent: %s", t->round, fm_error_last());
    fm_info("round %u: train loss %.4f, test accuracy %.2f%% (%zu examples), %.1f s", t->round, ts.train_loss,
            100.0 * ev.accuracy, ev.n, m.seconds);
    save_state(s);
    return FM_OK;
}

fm_status fm_session_run(const fm_session_config_t *cfg, volatile sig_atomic_t *stop)
{
    session_t s = {0};
    s.cfg = cfg;
    s.stop = stop;
    s.pre.round = -1;
    s.partition = cfg->partition_index;
    fm_status st = FM_OK;
    s.ctx = zmq_ctx_new();
    s.sock = s.ctx ? zmq_socket(s.ctx, ZMQ_DEALER) : NULL;
    if (!s.sock) {
        fm_error_set("cannot create a ZeroMQ socket: %s", zmq_strerror(zmq_errno()));
        st = FM_ERR_IO;
        goto out;
    }
    zmq_setsockopt(s.sock, ZMQ_ROUTING_ID, cfg->id, strlen(cfg->id));
    int linger = 2000;
    zmq_setsockopt(s.sock, ZMQ_LINGER, &linger, sizeof linger);
    fm_wire_tune_socket(s.sock);
    if (zmq_connect(s.sock, cfg->connect) != 0) {
        fm_error_set("cannot connect to %s: %s", cfg->connect, zmq_strerror(zmq_errno()));
        st = FM_ERR_ARG;
        goto out;
    }
    fm_info("client %s connecting to %s", cfg->id, cfg->connect);
    send_hello(&s);
    double last_hello = fm_clock_seconds(), started = fm_clock_seconds();
    while (!*stop) {
        zmq_pollitem_t item = {s.sock, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&item, 1, 500) < 0 && zmq_errno() != EINTR) {
            fm_error_set("poll: %s", zmq_strerror(zmq_errno()));
            st = FM_ERR_IO;
            break;
        }
        double now = fm_clock_seconds();
        if (!s.run_id[0]) {
            if (cfg->connect_timeout > 0 && now - started > cfg->connect_timeout) {
                fm_error_set("no welcome from %s within %.0f s", cfg->connect, cfg->connect_timeout);
                st = FM_ERR_IO;
                break;
            }
            if (now - last_hello > HELLO_RETRY_S) {
                send_hello(&s);
                last_hello = now;
            }
        } else {
            beat_if_due(&s);
        }
        if (!(item.revents & ZMQ_POLLIN))
            continue;
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, s.sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&msg);
            continue;
        }
        Fedmoe__Envelope *env = NULL;
        if (fm_wire_decode(zmq_msg_data(&msg), zmq_msg_size(&msg), (size_t)1 << 31, &env) != FM_OK) {
            fm_warn("bad message from the coordinator: %s", fm_error_last());
            zmq_msg_close(&msg);
            continue;
        }
        zmq_msg_close(&msg);
        bool done = false;
        switch (env->body_case) {
        case FEDMOE__ENVELOPE__BODY_WELCOME: st = handle_welcome(&s, env->welcome); done = st != FM_OK; break;
        case FEDMOE__ENVELOPE__BODY_TASK: st = handle_task(&s, env->task); done = st != FM_OK; break;
        case FEDMOE__ENVELOPE__BODY_SHUTDOWN:
            fm_info("coordinator says shut down: %.200s", env->shutdown->reason);
            done = true;
            break;
        case FEDMOE__ENVELOPE__BODY_ERROR:
            fm_warn("coordinator error %u: %.300s", env->error->code, env->error->text);
            if (env->error->code == FM_WIRE_UNKNOWN_CLIENT) /* a restarted coordinator: introduce ourselves */
                send_hello(&s);
            if (env->error->code == FM_WIRE_REJECTED || env->error->code == FM_WIRE_VERSION) {
                fm_error_set("rejected by the coordinator: %.300s", env->error->text);
                st = FM_ERR_ARG;
                done = true;
            }
            break;
        default: fm_warn("unexpected message from the coordinator (case %d)", env->body_case); break;
        }
        fedmoe__envelope__free_unpacked(env, NULL);
        if (done)
            break;
    }
out:
    drop_run(&s);
    if (s.sock)
        zmq_close(s.sock);
    if (s.ctx)
        zmq_ctx_term(s.ctx);
    return st;
}
