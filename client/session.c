/* The client session (session.h): the protocol's client half, without I/O.
 * Messages are handled on the owner's thread; a Task becomes a job (work) run
 * on a worker, which touches the model, trainer, data and state files and
 * leaves what to send in s->result; work_done sends it on the owner's
 * thread. The heartbeat reads only the task round and the kept Update, which
 * a job never writes. */
#include "session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fedmoe/aggregate.h"
#include "fedmoe/clientdata.h"
#include "fedmoe/dp.h"
#include "fedmoe/exchange.h"
#include "fedmoe/clock.h"
#include "fedmoe/log.h"
#include "fedmoe/rng.h"
#include "fedmoe/runspec.h"
#include "fedmoe/runspec_wire.h"
#include "fedmoe/train.h"
#include "fedmoe/wire.h"
#include "session_internal.h"

static const fm_session_upload_hook_t *upload_hook; /* session.h: the benchmark's attacker only */

void fm_session_set_upload_hook(const fm_session_upload_hook_t *h) { upload_hook = h; }

#define HELLO_RETRY_S 3.0
#define HEARTBEAT_S 1.0 /* until a Welcome says how often (Welcome.heartbeat_ms, taken within the two below) */
#define HEARTBEAT_MIN_S 0.5
#define HEARTBEAT_MAX_S 30.0

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

/* Encodes env and hands it to the owner; FM_OK when it went out. */
static fm_status send_env(session_t *s, Fedmoe__Envelope *env)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    fm_status st = fm_wire_encode(env, &buf, &len);
    if (st == FM_OK)
        st = s->ops.send(s->ops.user, buf, len);
    free(buf);
    return st;
}

static void send_hello(session_t *s)
{
    s->last_hello = s->now;
    s->hello_due = false;
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    Fedmoe__Hello h = FEDMOE__HELLO__INIT;
    h.client_id = s->id;
    h.protocol_version = FM_PROTOCOL_VERSION;
    h.specialists = (uint32_t)s->cfg->specialists;
    h.partition_index = s->have_data ? s->partition : s->own_partition;
    if (s->have_data) {
        h.train_samples = s->data.train.n;
        h.val_samples = s->data.val.n;
        h.test_samples = s->data.test.n;
        /* data of its own: the coordinator cannot know its sizes and caps its weight */
        h.own_data = s->cfg->dataset[0] && strcmp(s->cfg->dataset, s->spec.dataset) != 0;
    }
    env.body_case = FEDMOE__ENVELOPE__BODY_HELLO;
    env.hello = &h;
    /* (until the connection is up a send finds no peer: said once, tried again) */
    bool sent = send_env(s, &env) == FM_OK;
    if (!sent && !s->hello_unsent)
        fm_warn("hello not sent yet (%s): trying again", fm_error_last());
    s->hello_unsent = !sent;
}

/* Forgets a secure-aggregation round (its keys, secrets and plain values). */
static void sa_reset(session_t *s)
{
    fm_sa_client_destroy(&s->sa.sa);
    fm_wire_free(s->sa.env);
    s->sa.env = NULL;
    if (s->sa.x)
        memset(s->sa.x, 0, sizeof(float) * s->sa.nx);
    free(s->sa.x);
    s->sa.x = NULL;
    s->sa.phase = 0;
}

/* Frees what training holds: model, trainer, scratch, the snapshot from before
 * the round and the Update kept as sent (all of it rebuilt or redone from the
 * state file when needed again). */
static void release_model(session_t *s)
{
    fm_trainer_destroy(&s->trainer);
    fm_model_destroy(&s->model);
    free(s->vec);
    s->vec = NULL;
    sess_snap_free(&s->pre);
    free(s->sent.bytes);
    s->sent.bytes = NULL;
}

static void drop_run(session_t *s)
{
    release_model(s);
    sa_reset(s);
    s->spilled = false;
    if (s->have_data)
        fm_client_data_free(&s->data);
    s->have_data = false;
    s->run_id[0] = 0;
    s->last_round = 0;
    s->task_round = 0;
    s->sent.round = 0;
    s->sent.waiting = false;
}

/* A heartbeat when one is due, or now when forced (a Task taken, which frees
 * its place in the coordinator's fan-out window; an Update waiting for its
 * Grant). Reads only what a job does not write. */
static void beat(session_t *s, bool force)
{
    if (!force && s->now - s->last_beat < s->heartbeat_s)
        return;
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    Fedmoe__Heartbeat hb = FEDMOE__HEARTBEAT__INIT;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* (a wall-clock stamp for the coordinator's log, not a timer) */
    hb.unix_ms = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    hb.progress = true;
    hb.task_round = s->task_round;
    hb.sent_round = !s->sent.waiting ? s->sent.round : 0; /* (its bytes may be spilled) */
    hb.ready_round = s->sent.bytes && s->sent.waiting ? s->sent.round : 0;
    env.body_case = FEDMOE__ENVELOPE__BODY_HEARTBEAT;
    env.heartbeat = &hb;
    send_env(s, &env);
    s->last_beat = s->now;
}

static void reply_error(session_t *s, fm_wire_code code, const char *text)
{
    fm_warn("%s", text);
    uint8_t *buf = NULL;
    size_t len = 0;
    if (fm_wire_encode_error(code, text, &buf, &len) == FM_OK)
        s->ops.send(s->ops.user, buf, len);
    free(buf);
}

/* The job's training: it leaves when the owner stops. */
static bool on_progress(void *user)
{
    session_t *s = user;
    return !(s->stop && *s->stop);
}

/* The run's model, trainer and scratch (from its spec and partition), with the
 * state of the client's state file when there is one. */
static fm_status build_model(session_t *s)
{
    uint64_t index = (uint64_t)s->partition;
    fm_status st;
    if ((st = fm_model_new(&s->model, &s->spec.model, s->spec.seed, fm_rng_stream(FM_STREAM_LOCAL, index))) != FM_OK ||
        (st = fm_trainer_new(&s->trainer, s->model, &s->spec.train, s->spec.seed,
                             fm_rng_stream(FM_STREAM_SHUFFLE, index))) != FM_OK)
        return st;
    fm_trainer_set_progress(s->trainer, on_progress, s, 10);
    s->dims = fm_exchange_dims(&s->spec, fm_federated_size(s->model, s->spec.strategy));
    if (!(s->vec = malloc(sizeof(float) * (s->dims.nmodel + 1))))
        return FM_ERR_NOMEM;
    sess_load_state(s, !s->loaded); /* (said at its first load after a welcome) */
    s->loaded = true;
    s->spilled = false;
    return FM_OK;
}

/* A spilling client between rounds (its Update sent): the model, trainer,
 * snapshot and kept Update go, rebuilt from the state file at its next Task,
 * so an idle client holds only its data and connection. (A Task sent again
 * then trains the round again from the state before it: the same Update.) */
static void spill(session_t *s)
{
    if (!s->cfg->spill || !s->cfg->state_dir[0] || !s->model || s->sent.waiting)
        return;
    release_model(s);
    s->spilled = true;
    if (s->ops.released)
        s->ops.released(s->ops.user);
}

/* The Welcome's run, partition and data. */
static fm_status join_run(session_t *s, const Fedmoe__Welcome *w)
{
    if (!fm_id_valid(w->run_id, strlen(w->run_id))) {
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
    /* the data source is the client's to choose: from the network only a named
     * dataset in its standard place, never a path (any readable file, /dev/zero) */
    if (!s->cfg->dataset[0] && !fm_data_spec_named(s->spec.dataset)) {
        fm_error_set("the coordinator asks for data at '%.200s'; a client takes only a named dataset (fmnist, "
                     "fortunes) from the network: give --dataset to read local files",
                     s->spec.dataset);
        return FM_ERR_ARG;
    }
    fm_data_spec_t ds;
    fm_run_spec_data(&s->spec, &ds);
    ds.dataset = s->cfg->dataset[0] ? s->cfg->dataset : s->spec.dataset;
    ds.index = s->partition;
    st = s->ops.data ? s->ops.data(s->ops.user, &ds, &s->data) : fm_client_data_load(&s->data, &ds);
    if (st != FM_OK)
        return st;
    s->have_data = true;
    return fm_model_config_accepts(&s->spec.model, &s->data.train, "the run's data");
}

static fm_status handle_welcome(session_t *s, const Fedmoe__Welcome *w)
{
    s->welcomed = true;
    s->away_since = 0.0;
    s->hello_due = false;
    s->grants = w->upload_grants;
    double every = w->heartbeat_ms ? w->heartbeat_ms / 1000.0 : HEARTBEAT_S;
    s->heartbeat_s = every < HEARTBEAT_MIN_S ? HEARTBEAT_MIN_S : every > HEARTBEAT_MAX_S ? HEARTBEAT_MAX_S : every;
    if (s->run_id[0] && strcmp(s->run_id, w->run_id) == 0)
        return FM_OK; /* a repeated welcome for the run we are in */
    if (s->run_id[0])
        fm_info("the coordinator now runs %s; leaving run %s", w->run_id, s->run_id);
    drop_run(s);
    fm_status st = join_run(s, w);
    if (st != FM_OK)
        return st;
    snprintf(s->run_id, sizeof s->run_id, "%s", w->run_id);
    s->loaded = false;
    /* a spilling client builds its model at its first Task (most virtual
     * clients are idle most rounds: a model each would be gigabytes) */
    s->spilled = s->cfg->spill && s->cfg->state_dir[0];
    if (!s->spilled && (st = build_model(s)) != FM_OK)
        return st;
    fm_info("run %s (%s), partition %d/%d: %zu train, %zu validation, %zu test %s%s%s", s->run_id,
            fm_strategy_name(s->spec.strategy), s->partition, s->spec.partition_count, s->data.train.n,
            s->data.val.n, s->data.test.n, s->spec.model.family == FM_FAMILY_TEXT ? "windows" : "examples",
            s->data.languages[0] ? "; languages: " : "", s->data.languages);
    send_hello(s); /* again, now with sample counts */
    return FM_OK;
}

/* Restores, before training round `round`, the state it must start from:
 * exactly once, a round sent again (the coordinator lost it, or this client was
 * restarted) is trained again from the state before it. (A round stopped
 * midway was put back as before it when it stopped: take_task.) */
static fm_status start_round(session_t *s, int round)
{
    if (round == s->last_round && s->pre.round == round) {
        fm_info("round %d again: restoring the state from before it", round);
        sess_snap_restore(s, &s->pre);
        return FM_OK;
    }
    if (round <= s->last_round) {
        fm_warn("round %d is older than the last trained round %d; training from the current state", round,
                s->last_round);
        return FM_OK;
    }
    return sess_snap_take(s, &s->pre, round);
}

/* The values a round exchanges, model then prompt (each read only when the
 * run exchanges it), into a new array of *n floats; NULL when out of memory. */
static float *exchanged_copy(session_t *s, const float *model, const float *prompt, size_t *n)
{
    fm_exchange_t e = fm_exchange_of(&s->spec);
    size_t nm = e.model ? s->dims.nmodel : 0;
    *n = nm + (e.prompt ? s->dims.nprompt : 0);
    float *x = malloc(sizeof(float) * (*n ? *n : 1));
    if (x && e.model)
        memcpy(x, model, sizeof(float) * nm);
    if (x && e.prompt)
        memcpy(x + nm, prompt, sizeof(float) * s->dims.nprompt);
    return x;
}

/* Under secure aggregation the trained values (model, then prompt) and the
 * metrics wait in s->sa for the phases (work_done starts them); nothing is
 * encoded yet. First what the coordinator cannot do to values it never sees:
 * the client's own bound on its distance from the Task's state (ref, kept
 * only when there is a bound), and under distributed differential privacy
 * its share of the noise. */
static fm_status keep_for_masking(session_t *s, const fm_update_t *u, const fm_sa_setup_t *sa, const float *ref)
{
    sa_reset(s);
    if (!(s->sa.x = exchanged_copy(s, u->model, u->prompt, &s->sa.nx)))
        return FM_ERR_NOMEM;
    double clip = fm_run_client_clip(&s->spec), z = fm_run_client_noise(&s->spec);
    if (clip > 0.0) {
        double d = fm_clip_to_norm(s->sa.x, ref, s->sa.nx, clip);
        fm_status st = z > 0.0 ? fm_dp_add_noise(s->sa.x, s->sa.nx, fm_dp_client_sd(z, clip, sa->t)) : FM_OK;
        if (st != FM_OK)
            return st; /* (partly noised: never masked, the round goes without it) */
        fm_info("round %u: update at distance %.4g from the task's state, bounded at %g%s", u->round, d, clip,
                z > 0.0 ? ", noise share added" : "");
    }
    if (upload_hook && upload_hook->masking)
        upload_hook->masking(s->sa.x, ref, s->sa.nx, u->round, sa->weight);
    s->sa.setup = *sa;
    s->sa.round = u->round;
    memcpy(s->sa.nonce, u->nonce, FM_NONCE_BYTES);
    s->sa.metrics = u->metrics;
    s->sa.train_samples = u->train_samples;
    s->result.masking = true;
    return FM_OK;
}

/* Evaluates (eval_sample examples of each split, or all when 0), then encodes
 * the round's Update into the job's result (under secure aggregation: keeps
 * it for masking, ref the Task's state). */
static fm_status upload(session_t *s, uint32_t round, const uint8_t *nonce, uint32_t eval_sample,
                        const fm_sa_setup_t *sa, const float *ref, const fm_train_stats_t *ts, double t0)
{
    fm_eval_t ev, vv = {0};
    fm_status st = fm_evaluate_sample(s->model, &s->data.test, eval_sample, &ev, on_progress, s);
    if (st == FM_OK && s->data.val.n > 0)
        st = fm_evaluate_sample(s->model, &s->data.val, eval_sample, &vv, on_progress, s);
    if (st != FM_OK)
        return st;
    fm_update_t u = {.round = round, .train_samples = s->data.train.n, .prompt = fm_model_prompt(s->model)};
    memcpy(u.nonce, nonce, FM_NONCE_BYTES);
    u.metrics = (fm_metrics_t){.train_loss = ts->train_loss, .val_loss = ts->val_loss, .test_loss = ev.loss,
                               .test_accuracy = ev.accuracy, .generalist_share = ev.generalist_share,
                               /* (counted in predictions: an image, or a byte of text) */
                               .test_samples = ev.predictions, .test_correct = ev.correct,
                               .val_samples = vv.predictions, .val_correct = vv.correct,
                               .seconds = fm_clock_seconds() - t0}; /* (a measurement: the real clock) */
    if (fm_exchange_of(&s->spec).model) {
        fm_federated_pack(s->model, s->spec.strategy, s->vec);
        u.model = s->vec;
        if (upload_hook && upload_hook->upload)
            upload_hook->upload(s->vec, s->dims.nmodel, round);
    }
    job_result_t *r = &s->result;
    if (s->spec.secure_aggregation)
        st = keep_for_masking(s, &u, sa, ref);
    else
        st = fm_exchange_encode_update(&s->spec, &s->dims, &u, &r->bytes, &r->len);
    if (st != FM_OK)
        fm_warn("round %u: update not made: %s", round, fm_error_last());
    r->round = round;
    memcpy(r->nonce, nonce, FM_NONCE_BYTES);
    fm_info("round %u: train loss %.4f, test accuracy %.2f%% (%zu examples), %.1f s", round, ts->train_loss,
            100.0 * ev.accuracy, ev.n, u.metrics.seconds);
    return FM_OK;
}

/* The Task, checked, then applied and trained: the job (on a worker). What
 * to send is left in s->result. */
static fm_status take_task(session_t *s, const Fedmoe__Task *t)
{
    job_result_t *r = &s->result;
    fm_status built = s->spilled ? build_model(s) : FM_OK;
    if (built != FM_OK)
        return built;
    if (!s->model) {
        r->code = FM_WIRE_REJECTED;
        snprintf(r->why, sizeof r->why, "task before welcome");
        return FM_OK;
    }
    /* check everything, then apply */
    fm_task_in_t in;
    fm_wire_code code;
    if (fm_exchange_read_task(&s->spec, &s->dims, t, &in, &code) != FM_OK) {
        if (code == FM_WIRE_OK)
            return FM_ERR_NOMEM;
        r->code = code;
        snprintf(r->why, sizeof r->why, "%s", fm_error_last());
        return FM_OK;
    }
    uint8_t nonce[FM_NONCE_BYTES];
    memcpy(nonce, in.nonce, sizeof nonce);
    const uint32_t eval_sample = in.eval_sample;
    const fm_sa_setup_t sa = in.sa;
    if (s->sent.bytes && in.round == s->sent.round && memcmp(nonce, s->sent.nonce, sizeof nonce) == 0) {
        /* the task of the update sent last, again (this client said hello again,
         * or its update was lost on the way): the same update again, not retrained */
        fm_exchange_task_free(&in);
        r->waiting = s->sent.waiting; /* (still waiting for its grant: say so again) */
        r->resend = !s->sent.waiting;
        return FM_OK;
    }
    if (s->sa.x && in.round == s->sa.round && memcmp(nonce, s->sa.nonce, sizeof nonce) == 0) {
        /* the task of the round being masked, again: its phases go on */
        fm_exchange_task_free(&in);
        return FM_OK;
    }
    fm_status st = start_round(s, (int)in.round);
    if (st == FM_OK) {
        if (in.model)
            fm_federated_unpack(s->model, s->spec.strategy, in.model);
        if (in.model && upload_hook && upload_hook->received)
            upload_hook->received(in.model, s->dims.nmodel);
        if (in.prompt)
            memcpy(fm_model_prompt(s->model), in.prompt, sizeof(float) * s->dims.nprompt);
        st = fm_model_set_nonlocal(s->model, in.nonlocal, in.k);
        fm_trainer_set_lr_scale(s->trainer, in.lr_scale);
    }
    fm_exchange_task_free(&in);
    float *ref = NULL; /* the Task's state, which the client's own bound is measured from (secure aggregation) */
    size_t nref;
    if (st == FM_OK && fm_run_client_clip(&s->spec) > 0.0) {
        if (fm_exchange_of(&s->spec).model)
            fm_federated_pack(s->model, s->spec.strategy, s->vec); /* (s->vec: scratch until the upload) */
        if (!(ref = exchanged_copy(s, s->vec, fm_model_prompt(s->model), &nref)))
            st = FM_ERR_NOMEM;
    }
    if (st != FM_OK)
        return st;
    fm_train_stats_t ts;
    double t0 = fm_clock_seconds();
    st = fm_trainer_run(s->trainer, &s->data.train, &s->data.val, s->spec.local_epochs, &ts);
    if (st == FM_OK)
        st = upload(s, t->round, nonce, eval_sample, &sa, ref, &ts, t0);
    free(ref);
    if (st == FM_ERR_STATE && s->stop && *s->stop) {
        /* the state file keeps the last finished round; this one is trained
         * again from the state before it */
        fm_info("round %u abandoned: stopping", t->round);
        if (s->pre.round == (int)t->round && (int)t->round > s->last_round)
            sess_snap_restore(s, &s->pre); /* (not half-trained: as before the round) */
        r->abandoned = true;
        return FM_OK;
    }
    if (st != FM_OK)
        return st;
    s->last_round = (int)t->round;
    r->trained = true;
    sess_save_state(s);
    return FM_OK;
}

static fm_status sa_share(session_t *s, const Fedmoe__SecAgg *m);
static fm_status sa_mask(session_t *s, const Fedmoe__SecAgg *m);

void fm_session_work(fm_session_t *s, volatile sig_atomic_t *stop)
{
    s->stop = stop;
    memset(&s->result, 0, sizeof s->result);
    s->result.masked = s->sa.env != NULL;
    if (s->sa.env)
        s->result.st = s->sa.phase == 1 ? sa_share(s, s->sa.env->secagg) : sa_mask(s, s->sa.env->secagg);
    else
        s->result.st = take_task(s, s->task);
    if (s->result.st != FM_OK)
        snprintf(s->result.why, sizeof s->result.why, "%s", fm_error_last());
}

static void send_kept(session_t *s)
{
    if (s->ops.send(s->ops.user, s->sent.bytes, s->sent.len) != FM_OK)
        fm_warn("round %u: update not sent: %s", s->sent.round, fm_error_last());
}

/* An Update to send (bytes, malloc'd, now the session's): kept as sent, so a
 * repeated Task gets it again; with upload grants it waits for its Grant
 * (announced now, then in every heartbeat). */
static void keep_update(session_t *s, uint8_t *bytes, size_t len, uint32_t round, const uint8_t *nonce)
{
    free(s->sent.bytes);
    s->sent.bytes = bytes;
    s->sent.len = len;
    s->sent.round = round;
    memcpy(s->sent.nonce, nonce, FM_NONCE_BYTES);
    s->sent.waiting = s->grants;
    if (s->grants)
        beat(s, true);
    else
        send_kept(s);
}

/* ---- secure aggregation (docs/secure-aggregation.md) ------------------------ */

/* A phase of secure aggregation answered: the message, with this round's
 * numbers, to the coordinator. */
static fm_status encode_sa(session_t *s, Fedmoe__SecAgg *m, int phase, uint8_t **buf, size_t *len)
{
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    m->round = s->sa.round;
    m->phase = (uint32_t)phase;
    m->nonce.data = s->sa.nonce;
    m->nonce.len = FM_NONCE_BYTES;
    env.body_case = FEDMOE__ENVELOPE__BODY_SECAGG;
    env.secagg = m;
    return fm_wire_encode(&env, buf, len);
}

static void send_bytes_sa(session_t *s, const uint8_t *buf, size_t len, int phase)
{
    if (s->ops.send(s->ops.user, buf, len) != FM_OK)
        fm_warn("round %u: secure aggregation's phase %d not sent: %s", s->sa.round, phase, fm_error_last());
}

static void send_sa(session_t *s, Fedmoe__SecAgg *m, int phase)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    if (encode_sa(s, m, phase, &buf, &len) == FM_OK)
        send_bytes_sa(s, buf, len, phase);
    free(buf);
}

/* The masking failed (a peer's share that does not open, keys that do not
 * agree): this client's part in the round ends, said to the coordinator. */
static void sa_fail(session_t *s, int phase, const char *reason)
{
    char why[700];
    snprintf(why, sizeof why, "round %u: secure aggregation, phase %d: %s", s->sa.round, phase, reason);
    reply_error(s, FM_WIRE_BAD_VALUE, why);
    sa_reset(s);
}

/* Phase 0, after training: fresh keys for the round, advertised. */
static void sa_advertise(session_t *s)
{
    const fm_sa_setup_t *a = &s->sa.setup;
    if (upload_hook && upload_hook->phase)
        upload_hook->phase(s->sa.round, 0);
    if (fm_sa_client_new(&s->sa.sa, a->who, a->n, a->t, s->sa.round) != FM_OK) {
        sa_fail(s, 0, fm_error_last());
        return;
    }
    fm_sa_keys_t k;
    uint8_t record[FM_SA_KEYS_RECORD];
    fm_sa_client_keys(s->sa.sa, &k);
    fm_sa_keys_put(&k, record);
    Fedmoe__SecAgg m = FEDMOE__SEC_AGG__INIT;
    m.keys = (ProtobufCBinaryData){sizeof record, record};
    s->sa.phase = 1;
    send_sa(s, &m, 0);
}

/* Phase 1, a job (Shamir sharing two secrets n ways and n - 1 seals): U1's
 * keys in, this client's sealed shares for each of them made into the job's
 * result (work_done sends them). */
static fm_status sa_share(session_t *s, const Fedmoe__SecAgg *m)
{
    if (m->keys.len % FM_SA_KEYS_RECORD || m->keys.len / FM_SA_KEYS_RECORD > FM_SA_MAX_CLIENTS) {
        fm_error_set("keys of %zu bytes are not records of %d", m->keys.len, FM_SA_KEYS_RECORD);
        return FM_ERR_FORMAT;
    }
    uint32_t k = (uint32_t)(m->keys.len / FM_SA_KEYS_RECORD);
    fm_sa_keys_t *u1 = calloc(k ? k : 1, sizeof *u1);
    fm_sa_sealed_t *out = calloc(k ? k : 1, sizeof *out);
    uint8_t *table = malloc((size_t)FM_SA_SEALED_RECORD * (k ? k : 1));
    fm_status st = u1 && out && table ? FM_OK : FM_ERR_NOMEM;
    for (uint32_t i = 0; st == FM_OK && i < k; i++)
        fm_sa_keys_get(m->keys.data + (size_t)FM_SA_KEYS_RECORD * i, &u1[i]);
    if (st == FM_OK)
        st = fm_sa_client_share(s->sa.sa, u1, k, out);
    if (st == FM_OK) {
        for (uint32_t i = 0; i + 1 < k; i++) {
            if (upload_hook && upload_hook->tamper)
                upload_hook->tamper(s->sa.round, 1, out[i].sealed, FM_SA_SEALED_BYTES + FM_GCM_TAG_BYTES);
            fm_sa_sealed_put(&out[i], table + (size_t)FM_SA_SEALED_RECORD * i);
        }
        Fedmoe__SecAgg a = FEDMOE__SEC_AGG__INIT;
        a.sealed = (ProtobufCBinaryData){(size_t)FM_SA_SEALED_RECORD * (k - 1), table};
        st = encode_sa(s, &a, 1, &s->result.bytes, &s->result.len);
    }
    free(u1);
    free(out);
    free(table);
    return st;
}

/* Phase 2, the job (on a worker, as training: n - 1 pair masks of the whole
 * update): the shares sealed for this client in, its Update with the masked
 * input made into the job's result (work_done keeps it, sent when granted,
 * as any Update). */
static fm_status sa_mask(session_t *s, const Fedmoe__SecAgg *m)
{
    uint32_t k = (uint32_t)(m->sealed.len / FM_SA_SEALED_RECORD);
    fm_sa_sealed_t *in = calloc(k ? k : 1, sizeof *in);
    fm_u128 *y = malloc(sizeof *y * (s->sa.nx + 1));
    fm_status st = in && y ? FM_OK : FM_ERR_NOMEM;
    if (st == FM_OK && (m->sealed.len % FM_SA_SEALED_RECORD || k > FM_SA_MAX_CLIENTS)) {
        fm_error_set("sealed shares of %zu bytes are not records of %d", m->sealed.len, FM_SA_SEALED_RECORD);
        st = FM_ERR_FORMAT;
    }
    for (uint32_t i = 0; st == FM_OK && i < k; i++)
        fm_sa_sealed_get(m->sealed.data + (size_t)FM_SA_SEALED_RECORD * i, &in[i]);
    double t0 = fm_clock_seconds(); /* (a measurement: the real clock) */
    if (st == FM_OK)
        st = fm_sa_client_mask(s->sa.sa, in, k, s->sa.x, s->sa.nx, s->sa.setup.weight, y);
    if (st == FM_OK)
        fm_info("round %u: input masked with %u others' pair masks in %.2f s", s->sa.round, k,
                fm_clock_seconds() - t0);
    uint32_t who[8], bad = st == FM_OK ? fm_sa_client_unopened(s->sa.sa, who, 8) : 0;
    for (uint32_t i = 0; i < bad && i < 8; i++)
        fm_warn("round %u: the shares client %u sealed for this client do not open (changed on the way, or sealed "
                "wrong): masked all the same, without them", s->sa.round, who[i]);
    uint8_t *bytes = NULL;
    size_t len = 0;
    if (st == FM_OK) {
        fm_update_t u = {.round = s->sa.round, .train_samples = s->sa.train_samples, .metrics = s->sa.metrics,
                         .masked = y, .nmasked = s->sa.nx + 1};
        memcpy(u.nonce, s->sa.nonce, FM_NONCE_BYTES);
        st = fm_exchange_encode_update(&s->spec, &s->dims, &u, &bytes, &len);
    }
    if (st == FM_OK) {
        memset(s->sa.x, 0, sizeof(float) * s->sa.nx); /* (masked: the plain values are not needed again) */
        job_result_t *r = &s->result;
        r->bytes = bytes;
        r->len = len;
        r->round = s->sa.round;
        memcpy(r->nonce, s->sa.nonce, FM_NONCE_BYTES);
    }
    free(in);
    free(y);
    return st;
}

/* Phase 3: U3 in, this client's shares out; the round's secrets then go. */
static fm_status sa_unmask(session_t *s, const Fedmoe__SecAgg *m)
{
    uint32_t k = (uint32_t)m->n_survivors, n = 0;
    fm_sa_share_t *out = calloc(s->sa.setup.n, sizeof *out);
    uint8_t *table = malloc((size_t)FM_SA_SHARE_RECORD * s->sa.setup.n);
    fm_status st = out && table ? fm_sa_client_unmask(s->sa.sa, m->survivors, k, out, &n) : FM_ERR_NOMEM;
    if (st == FM_OK) {
        for (uint32_t i = 0; i < n; i++) {
            if (upload_hook && upload_hook->tamper)
                upload_hook->tamper(s->sa.round, 3, out[i].y, FM_SHAMIR_Y_BYTES);
            fm_sa_share_put(&out[i], table + (size_t)FM_SA_SHARE_RECORD * i);
        }
        Fedmoe__SecAgg a = FEDMOE__SEC_AGG__INIT;
        a.shares = (ProtobufCBinaryData){(size_t)FM_SA_SHARE_RECORD * n, table};
        send_sa(s, &a, 3);
    }
    if (out)
        memset(out, 0, sizeof *out * s->sa.setup.n);
    if (table)
        memset(table, 0, (size_t)FM_SA_SHARE_RECORD * s->sa.setup.n);
    free(out);
    free(table);
    return st;
}

/* A SecAgg message: phases 1 and 2 kept as the job (returns true: the
 * session owns env), phase 3 answered at once. */
static bool handle_secagg(session_t *s, Fedmoe__Envelope *env)
{
    const Fedmoe__SecAgg *m = env->secagg;
    int phase = (int)m->phase;
    if (!s->sa.sa || m->round != s->sa.round || m->nonce.len != FM_NONCE_BYTES ||
        memcmp(m->nonce.data, s->sa.nonce, FM_NONCE_BYTES) != 0 || phase != s->sa.phase) {
        fm_debug("secure aggregation: phase %d of round %u is not the one this client is at (ignored)", phase,
                 m->round);
        return false;
    }
    if (upload_hook && upload_hook->phase)
        upload_hook->phase(s->sa.round, phase);
    if (phase == 1 || phase == 2) {
        s->sa.env = env;
        return true;
    }
    if (sa_unmask(s, m) != FM_OK)
        sa_fail(s, phase, fm_error_last());
    else
        sa_reset(s); /* (the round's part is done) */
    return false;
}

/* Phase 1's or 2's job done: the sealed shares sent, or the masked Update
 * kept (sent when granted); or the failure said to the coordinator (its part
 * ends; the session goes on). */
static void masked_done(session_t *s)
{
    job_result_t *r = &s->result;
    int phase = s->sa.phase;
    fm_wire_free(s->sa.env);
    s->sa.env = NULL;
    if (r->st != FM_OK) {
        free(r->bytes);
        r->bytes = NULL;
        sa_fail(s, phase, r->why);
        return;
    }
    s->sa.phase = phase + 1;
    if (phase == 1) {
        send_bytes_sa(s, r->bytes, r->len, 1);
        free(r->bytes);
    } else {
        keep_update(s, r->bytes, r->len, r->round, r->nonce);
    }
    r->bytes = NULL;
}

fm_status fm_session_work_done(fm_session_t *s, double now)
{
    s->now = now;
    job_result_t *r = &s->result;
    if (r->masked) {
        masked_done(s);
        return FM_OK;
    }
    uint32_t round = s->task->round;
    fm_wire_free(s->task_env);
    s->task_env = NULL;
    s->task = NULL;
    if (r->st != FM_OK) {
        free(r->bytes);
        r->bytes = NULL;
        fm_error_set("%s", r->why);
        return r->st;
    }
    if (r->abandoned && s->task_round > (uint32_t)s->last_round) {
        s->task_round = (uint32_t)s->last_round; /* (the Task not held: the coordinator may send it again) */
        beat(s, true);
    }
    if (r->code != FM_WIRE_OK)
        reply_error(s, r->code, r->why);
    if (r->waiting)
        beat(s, true);
    if (r->resend) {
        fm_info("round %u: the same task again: its update sent again", s->sent.round);
        send_kept(s);
    }
    if (r->trained && round < s->task_round) { /* (an older round than the newest said) */
        s->task_round = round;
        beat(s, true);
    }
    if (r->bytes)
        keep_update(s, r->bytes, r->len, r->round, r->nonce);
    r->bytes = NULL;
    if (r->masking)
        sa_advertise(s);
    if (r->trained && s->ops.saw_round)
        s->ops.saw_round(s->ops.user, s->run_id, (int)round);
    if (r->trained)
        spill(s);
    return FM_OK;
}

/* A Task: said taken at once (the coordinator's fan-out goes on meanwhile),
 * then left as the job. */
static void handle_task(session_t *s, Fedmoe__Envelope *env)
{
    const Fedmoe__Task *t = env->task;
    if (s->run_id[0] && t->round > s->task_round) {
        s->task_round = t->round;
        beat(s, true);
    }
    s->task_env = env;
    s->task = env->task;
}

/* The coordinator's leave to send the Update waiting for it. */
static void handle_grant(session_t *s, const Fedmoe__Grant *g)
{
    if (!s->sent.bytes || !s->sent.waiting || g->round != s->sent.round)
        return; /* (a grant repeated after it was used, or for another round) */
    s->sent.waiting = false;
    send_kept(s);
    spill(s);
}

static fm_status handle_error(session_t *s, const Fedmoe__Error *e)
{
    fm_warn("coordinator error %u: %.300s", e->code, e->text);
    if (e->code == FM_WIRE_UNKNOWN_CLIENT) {
        /* a restarted coordinator: introduce ourselves (once, not once
         * per heartbeat queued while it was away) */
        if (s->now - s->last_hello > HELLO_RETRY_S)
            send_hello(s);
        else
            s->hello_due = true;
    }
    if (e->code == FM_WIRE_REJECTED || e->code == FM_WIRE_VERSION) {
        fm_error_set("rejected by the coordinator: %.300s", e->text);
        return FM_ERR_ARG;
    }
    return FM_OK;
}

fm_status fm_session_handle(fm_session_t *s, const uint8_t *msg, size_t len, double now)
{
    s->now = now;
    Fedmoe__Envelope *env = NULL;
    if (fm_wire_decode(msg, len, (size_t)1 << 31, &env) != FM_OK) {
        fm_warn("bad message from the coordinator: %s", fm_error_last());
        return FM_OK;
    }
    fm_status st = FM_OK;
    switch (env->body_case) {
    case FEDMOE__ENVELOPE__BODY_WELCOME: st = handle_welcome(s, env->welcome); break;
    case FEDMOE__ENVELOPE__BODY_TASK:
        if (fm_session_job_waiting(s)) { /* (the owner's mistake: one job at a time) */
            fm_wire_free(env);
            fm_error_set("a Task handed to a session whose job is out");
            return FM_ERR_STATE;
        }
        handle_task(s, env);
        return FM_OK; /* (the job owns env) */
    case FEDMOE__ENVELOPE__BODY_GRANT: handle_grant(s, env->grant); break;
    case FEDMOE__ENVELOPE__BODY_SECAGG:
        if (handle_secagg(s, env))
            return FM_OK; /* (the job owns env) */
        break;
    case FEDMOE__ENVELOPE__BODY_SHUTDOWN:
        if (env->shutdown->resumable && s->run_id[0]) {
            /* (a restart, an upgrade): ZeroMQ reconnects, and the heartbeat
             * a restarted coordinator does not know brings a new welcome */
            fm_info("%.200s: waiting for it", env->shutdown->reason);
            s->away_since = now;
            break;
        }
        fm_info("coordinator says shut down: %.200s", env->shutdown->reason);
        s->ended = true;
        break;
    case FEDMOE__ENVELOPE__BODY_ERROR: st = handle_error(s, env->error); break;
    default: fm_warn("unexpected message from the coordinator (case %d)", env->body_case); break;
    }
    fm_wire_free(env);
    return st;
}

fm_status fm_session_tick(fm_session_t *s, double now)
{
    s->now = now;
    if (s->started < 0.0)
        s->started = now;
    const fm_session_config_t *cfg = s->cfg;
    if (!s->task && s->pre_on_disk && s->ops.round_over && s->ops.round_over(s->ops.user, s->run_id, s->last_round))
        sess_drop_pre(s); /* (an idle client of a virtual host: its files are its state alone) */
    if (!s->run_id[0]) {
        if (cfg->connect_timeout > 0 && now - s->started > cfg->connect_timeout) {
            fm_error_set("no welcome from %s within %.0f s", cfg->connect, cfg->connect_timeout);
            return FM_ERR_IO;
        }
        if (s->last_hello < 0.0 || now - s->last_hello > HELLO_RETRY_S)
            send_hello(s);
        return FM_OK;
    }
    if (s->away_since > 0.0 && cfg->connect_timeout > 0 && now - s->away_since > cfg->connect_timeout) {
        fm_error_set("the coordinator stopped mid-run and did not come back within %.0f s (--connect-timeout)",
                     cfg->connect_timeout);
        return FM_ERR_IO;
    }
    if (s->hello_due && now - s->last_hello > HELLO_RETRY_S)
        send_hello(s);
    beat(s, false);
    return FM_OK;
}

fm_status fm_session_new(fm_session_t **out, const fm_session_config_t *cfg, const char *id, int partition,
                         const fm_session_ops_t *ops)
{
    *out = NULL;
    session_t *s = calloc(1, sizeof *s);
    if (!s)
        return FM_ERR_NOMEM;
    s->cfg = cfg;
    s->ops = *ops;
    snprintf(s->id, sizeof s->id, "%s", id ? id : cfg->id);
    s->own_partition = partition >= 0 ? partition : cfg->partition_index;
    s->partition = s->own_partition;
    s->pre.round = -1;
    s->heartbeat_s = HEARTBEAT_S;
    s->started = -1.0;
    s->last_hello = -1.0;
    *out = s;
    return FM_OK;
}

const char *fm_session_id(const fm_session_t *s) { return s->id; }
bool fm_session_ended(const fm_session_t *s) { return s->ended; }
bool fm_session_welcomed(const fm_session_t *s) { return s->welcomed; }
bool fm_session_job_waiting(const fm_session_t *s) { return s->task != NULL || s->sa.env != NULL; }

void fm_session_destroy(fm_session_t **sp)
{
    session_t *s = *sp;
    if (!s)
        return;
    fm_wire_free(s->task_env);
    free(s->result.bytes);
    drop_run(s);
    free(s);
    *sp = NULL;
}
