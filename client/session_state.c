/* A client's state across round re-runs and restarts: the snapshot from
 * before the round being trained, and the state files in --state-dir (the one
 * checkpoint format, fedmoe/checkpoint.h): ID.state holds the state after the
 * last trained round, ID.pre the state from before it, needed only while that
 * round may be run again (a virtual host removes it once a later round is
 * seen). Neither holds the weights every Task overwrites (those the strategy
 * federates): an idle client's files are its own parameters, its optimizer's
 * moments and its generator. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fedmoe/checkpoint.h"
#include "fedmoe/log.h"
#include "session_internal.h"

#define STATE_VERSION 3u /* 1: the unframed layout before fedmoe/checkpoint.h; 2: both snapshots in one
                            file, with the federated weights */

static void state_path(const session_t *s, const char *ext, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s.%s.%s", s->cfg->state_dir, s->run_id, s->id, ext);
}

/* Everything a round changes on a client: every group's weights and moments, the
 * AdamW step counts and the shuffling generator. */
void sess_snap_free(snapshot_t *n)
{
    for (int g = 0; g < FM_GROUP_COUNT; g++)
        for (int k = 0; k < 3; k++) {
            free(n->a[g][k]);
            n->a[g][k] = NULL;
        }
    n->round = -1;
}

/* The live state as a snapshot that points into the model (not owned: never
 * pass it to snap_free). */
static snapshot_t snap_view(session_t *s, int round)
{
    fm_params_t *ps = fm_model_params(s->model);
    snapshot_t v = {.round = round};
    for (int g = 0; g < FM_GROUP_COUNT; g++) {
        v.a[g][0] = ps->groups[g].w;
        v.a[g][1] = ps->groups[g].m;
        v.a[g][2] = ps->groups[g].v;
    }
    v.steps[0] = fm_trainer_steps(s->trainer, FM_LEVEL_LOWER);
    v.steps[1] = fm_trainer_steps(s->trainer, FM_LEVEL_UPPER);
    v.rng = *fm_trainer_rng(s->trainer);
    return v;
}

fm_status sess_snap_take(session_t *s, snapshot_t *n, int round)
{
    fm_params_t *ps = fm_model_params(s->model);
    snapshot_t live = snap_view(s, round);
    for (int g = 0; g < FM_GROUP_COUNT; g++) {
        size_t sz = ps->groups[g].size;
        for (int k = 0; k < 3; k++) {
            if (!n->a[g][k] && !(n->a[g][k] = malloc(4 * (sz ? sz : 1))))
                return FM_ERR_NOMEM;
            memcpy(n->a[g][k], live.a[g][k], 4 * sz);
        }
    }
    memcpy(n->steps, live.steps, sizeof n->steps);
    n->rng = live.rng;
    n->round = round;
    return FM_OK;
}

void sess_snap_restore(session_t *s, const snapshot_t *n)
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

/* Whether a snapshot file holds p's weights (in group g): all but those a
 * Task brings, which the strategy federates. */
static bool kept_weight(const session_t *s, const fm_param_t *p, int g)
{
    return p->group == (fm_group_id)g && !fm_strategy_federates(s->spec.strategy, p);
}

static void put_snapshot(fm_ckpt_writer_t *w, session_t *s, const snapshot_t *n)
{
    fm_params_t *ps = fm_model_params(s->model);
    fm_ckpt_put_u32(w, (uint32_t)n->round);
    fm_ckpt_put_u64(w, (uint64_t)n->steps[0]);
    fm_ckpt_put_u64(w, (uint64_t)n->steps[1]);
    fm_ckpt_put_u32(w, n->rng.key[0]);
    fm_ckpt_put_u32(w, n->rng.key[1]);
    fm_ckpt_put_u64(w, n->rng.stream);
    fm_ckpt_put_u64(w, n->rng.counter);
    for (int i = 0; i < 4; i++)
        fm_ckpt_put_u32(w, n->rng.buf[i]);
    fm_ckpt_put_u32(w, (uint32_t)n->rng.used);
    for (int g = 0; g < FM_GROUP_COUNT; g++) {
        fm_ckpt_put_u64(w, ps->groups[g].size);
        for (int i = 0; i < ps->count; i++)
            if (kept_weight(s, &ps->params[i], g))
                fm_ckpt_put_floats(w, n->a[g][0] + ps->params[i].offset, ps->params[i].size);
        for (int k = 1; k < 3; k++)
            fm_ckpt_put_floats(w, n->a[g][k], ps->groups[g].size);
    }
}

/* The weights of group g as put_snapshot wrote them; those a Task brings are
 * zero until it does. */
static bool get_weights(fm_ckpt_reader_t *r, session_t *s, int g, float *a)
{
    fm_params_t *ps = fm_model_params(s->model);
    memset(a, 0, 4 * ps->groups[g].size);
    bool ok = true;
    for (int i = 0; ok && i < ps->count; i++)
        if (kept_weight(s, &ps->params[i], g))
            ok = fm_ckpt_get_floats(r, a + ps->params[i].offset, ps->params[i].size);
    return ok;
}

/* Reads a snapshot of this model's layout; every value must be finite. */
static bool get_snapshot(fm_ckpt_reader_t *r, session_t *s, snapshot_t *n)
{
    fm_params_t *ps = fm_model_params(s->model);
    uint32_t round, used, k0, k1;
    uint64_t steps[2];
    bool ok = fm_ckpt_get_u32(r, &round) && round < (1u << 30) && fm_ckpt_get_u64(r, &steps[0]) &&
              fm_ckpt_get_u64(r, &steps[1]) && steps[0] < (1ull << 50) && steps[1] < (1ull << 50) &&
              fm_ckpt_get_u32(r, &k0) && fm_ckpt_get_u32(r, &k1) && fm_ckpt_get_u64(r, &n->rng.stream) &&
              fm_ckpt_get_u64(r, &n->rng.counter);
    for (int i = 0; ok && i < 4; i++)
        ok = fm_ckpt_get_u32(r, &n->rng.buf[i]);
    ok = ok && fm_ckpt_get_u32(r, &used) && used <= 4;
    for (int g = 0; g < FM_GROUP_COUNT && ok; g++) {
        uint64_t sz;
        ok = fm_ckpt_get_u64(r, &sz) && sz == ps->groups[g].size;
        for (int k = 0; k < 3 && ok; k++) {
            ok = (n->a[g][k] || (n->a[g][k] = malloc(4 * (sz ? sz : 1)))) &&
                 (k == 0 ? get_weights(r, s, g, n->a[g][k]) : fm_ckpt_get_floats(r, n->a[g][k], sz));
            for (uint64_t i = 0; ok && i < sz; i++)
                ok = isfinite(n->a[g][k][i]);
        }
    }
    n->round = (int)round;
    n->steps[0] = (int64_t)steps[0];
    n->steps[1] = (int64_t)steps[1];
    n->rng.key[0] = k0;
    n->rng.key[1] = k1;
    n->rng.used = (int)used;
    return ok;
}

/* The most a state file of this model can hold: a snapshot and framing. */
static size_t state_bound(session_t *s)
{
    return 12 * fm_params_total(fm_model_params(s->model)) + 4096 + FM_CKPT_OVERHEAD;
}

static void write_snapshot(session_t *s, const char *ext, const snapshot_t *n)
{
    char path[1200];
    state_path(s, ext, path, sizeof path);
    fm_ckpt_writer_t w;
    fm_ckpt_begin(&w, FM_CKPT_MAGIC_CLIENT, STATE_VERSION);
    put_snapshot(&w, s, n);
    uint8_t *blob = NULL;
    size_t len = 0;
    if (fm_ckpt_finish(&w, &blob, &len) != FM_OK || fm_ckpt_write_file(path, blob, len) != FM_OK)
        fm_warn("%s", fm_error_last());
    free(blob);
}

/* The state after the last trained round and (first: a crash between the two
 * leaves a .pre of a round the .state has not reached, which loading ignores)
 * the state from before it. */
void sess_save_state(session_t *s)
{
    if (!s->cfg->state_dir[0])
        return;
    if (s->pre.round >= 0) {
        write_snapshot(s, "pre", &s->pre);
        s->pre_on_disk = true;
    }
    snapshot_t now = snap_view(s, s->last_round); /* written as it is, not copied */
    write_snapshot(s, "state", &now);
}

void sess_drop_pre(session_t *s)
{
    char path[1200];
    state_path(s, "pre", path, sizeof path);
    if (unlink(path) != 0 && errno != ENOENT)
        fm_warn("cannot remove %s: %s", path, strerror(errno));
    s->pre_on_disk = false;
}

static fm_status read_snapshot(session_t *s, const char *path, snapshot_t *n)
{
    uint8_t *blob = NULL;
    size_t len = 0;
    fm_ckpt_reader_t r;
    fm_status st = fm_ckpt_read_file(path, state_bound(s), &blob, &len);
    if (st == FM_OK)
        st = fm_ckpt_open(&r, blob, len, FM_CKPT_MAGIC_CLIENT, STATE_VERSION, "client state");
    if (st == FM_OK) {
        bool ok = get_snapshot(&r, s, n);
        st = ok ? fm_ckpt_close(&r, "client state") : FM_ERR_FORMAT;
        if (!ok)
            fm_error_set("client state: fields missing, out of range or not finite");
    }
    free(blob);
    return st;
}

/* The state files: the state after the last round (path), and the state
 * before it when its .pre is of that round. */
static fm_status read_state(session_t *s, const char *path, snapshot_t *now, snapshot_t *pre)
{
    fm_status st = read_snapshot(s, path, now);
    char pre_path[1200];
    state_path(s, "pre", pre_path, sizeof pre_path);
    s->pre_on_disk = access(pre_path, F_OK) == 0;
    if (st == FM_OK && s->pre_on_disk && (read_snapshot(s, pre_path, pre) != FM_OK || pre->round != now->round)) {
        sess_snap_free(pre); /* (another round's, or unusable: not this round's starting point) */
        pre->round = -1;
    }
    return st;
}

void sess_load_state(session_t *s, bool restart)
{
    if (!s->cfg->state_dir[0])
        return;
    char path[1200];
    state_path(s, "state", path, sizeof path);
    if (access(path, F_OK) != 0)
        return;
    snapshot_t now = {.round = -1}, pre = {.round = -1};
    if (read_state(s, path, &now, &pre) == FM_OK) {
        sess_snap_restore(s, &now);
        s->last_round = now.round;
        sess_snap_free(&s->pre);
        s->pre = pre;
        memset(&pre, 0, sizeof pre);
        pre.round = -1;
        fm_log(restart ? FM_LOG_INFO : FM_LOG_DEBUG, "restored local state after round %d from %s", s->last_round,
               path);
    } else {
        fm_warn("%s is not a usable state file for this run (%s); starting fresh", path, fm_error_last());
    }
    sess_snap_free(&now);
    sess_snap_free(&pre);
}
