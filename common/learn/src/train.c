#include "fedmoe/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fedmoe/clock.h"
#include "fedmoe/log.h"
#include "fedmoe/rng.h"

#define EVAL_BATCH 256          /* examples in an evaluation batch, at most */
#define EVAL_PREDICTIONS 4096   /* and predictions (text: bytes) */

/* The evaluation batch of m. */
static int eval_batch(const fm_model_t *m)
{
    int b = EVAL_PREDICTIONS / fm_model_predictions(m);
    return b < 1 ? 1 : b > EVAL_BATCH ? EVAL_BATCH : b;
}

struct fm_trainer {
    fm_model_t *m;
    fm_train_config_t cfg;
    fm_rng_t rng;
    long steps[2];     /* AdamW step counts: lower, upper */
    float lr_scale;    /* schedule multiplier on both learning rates */
    bool (*progress)(void *user);
    void *progress_user;
    int progress_every;
    uint32_t *vidx;    /* the current validation batch's indices (batch) */
    uint32_t *order;   /* shuffled train indices */
    size_t order_cap;
    uint32_t *vorder;  /* shuffled validation indices, consumed cyclically */
    size_t vcap, vpos, vn;
};

void fm_train_config_default(fm_train_config_t *c)
{
    c->batch = 32;
    c->expert_steps = 30;
    c->router_steps = 10;
    c->lower = (fm_adamw_config_t){.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 1e-4f};
    c->upper = (fm_adamw_config_t){.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.0f};
    c->lb_in_upper = true;
    c->anchor = 0.0f;
    c->local_steps = 0;
}

fm_status fm_trainer_new(fm_trainer_t **out, fm_model_t *m, const fm_train_config_t *cfg, uint64_t seed,
                         uint64_t stream)
{
    *out = NULL;
    if (cfg->batch < 1 || cfg->batch > 65536 || cfg->expert_steps < 1 || cfg->router_steps < 0) {
        fm_error_set("train: batch must be 1..65536, expert_steps >= 1, router_steps >= 0");
        return FM_ERR_ARG;
    }
    double ws = fm_model_workspace_bytes(m, cfg->batch > eval_batch(m) ? cfg->batch : eval_batch(m));
    if (ws > FM_MODEL_MAX_WORKSPACE_BYTES) {
        fm_error_set("train: batch %d needs %.0f MiB of workspace with this model, more than the %.0f MiB allowed",
                     cfg->batch, ws / 1048576.0, FM_MODEL_MAX_WORKSPACE_BYTES / 1048576.0);
        return FM_ERR_ARG;
    }
    fm_trainer_t *t = calloc(1, sizeof *t);
    if (!t)
        return FM_ERR_NOMEM;
    t->m = m;
    t->cfg = *cfg;
    t->lr_scale = 1.0f;
    fm_rng_init(&t->rng, seed, stream);
    t->vidx = malloc(sizeof(uint32_t) * cfg->batch);
    if (!t->vidx) {
        fm_trainer_destroy(&t);
        return FM_ERR_NOMEM;
    }
    *out = t;
    return FM_OK;
}

void fm_trainer_destroy(fm_trainer_t **tp)
{
    if (!tp || !*tp)
        return;
    fm_trainer_t *t = *tp;
    free(t->vidx);
    free(t->order);
    free(t->vorder);
    free(t);
    *tp = NULL;
}

void fm_trainer_set_lr_scale(fm_trainer_t *t, float scale) { t->lr_scale = scale; }

float fm_lr_cosine(int step, int total, float min_scale)
{
    if (total < 1 || step < 1)
        return 1.0f;
    double x = (double)(step - 1) / (double)total;
    return min_scale + (1.0f - min_scale) * (float)(0.5 * (1.0 + cos(3.14159265358979323846 * (x > 1.0 ? 1.0 : x))));
}

fm_rng_t *fm_trainer_rng(fm_trainer_t *t) { return &t->rng; }

void fm_trainer_set_progress(fm_trainer_t *t, bool (*fn)(void *user), void *user, int every)
{
    t->progress = fn;
    t->progress_user = user;
    t->progress_every = every > 0 ? every : 1;
}

void fm_trainer_set_steps(fm_trainer_t *t, long lower, long upper)
{
    t->steps[0] = lower;
    t->steps[1] = upper;
}

long fm_trainer_steps(const fm_trainer_t *t, fm_level level) { return t->steps[level == FM_LEVEL_UPPER]; }

static void adamw_level(fm_trainer_t *t, fm_level level)
{
    fm_params_t *ps = fm_model_params(t->m);
    fm_adamw_config_t c_scaled = level == FM_LEVEL_UPPER ? t->cfg.upper : t->cfg.lower;
    c_scaled.lr *= t->lr_scale;
    const fm_adamw_config_t *c = &c_scaled;
    long step = ++t->steps[level == FM_LEVEL_UPPER];
    for (int i = 0; i < ps->count; i++) {
        const fm_param_t *p = &ps->params[i];
        if (p->level != level)
            continue;
        fm_group_t *g = &ps->groups[p->group];
        fm_adamw_update(g->w + p->offset, g->g + p->offset, g->m + p->offset, g->v + p->offset, p->size, c,
                        p->decay ? c->weight_decay : 0.0f, step);
    }
    if (level == FM_LEVEL_LOWER && t->cfg.anchor > 0.0f)
        fm_model_anchor_specialists(t->m, fminf(1.0f, c->lr * t->cfg.anchor));
}

float fm_trainer_step(fm_trainer_t *t, fm_level level, const fm_batch_t *b)
{
    fm_params_t *ps = fm_model_params(t->m);
    fm_params_zero_grad(ps);
    bool with_lb = level == FM_LEVEL_LOWER || t->cfg.lb_in_upper;
    fm_batch_stats_t st;
    fm_model_forward(t->m, b, with_lb, NULL, &st);
    fm_model_backward(t->m, level);
    adamw_level(t, level);
    return st.loss;
}

static int ensure_u32(uint32_t **buf, size_t *cap, size_t n)
{
    if (n <= *cap)
        return 0;
    uint32_t *p = realloc(*buf, sizeof(uint32_t) * n);
    if (!p)
        return -1;
    *buf = p;
    *cap = n;
    return 0;
}

/* The next validation batch, reshuffling at the end of each pass. */
static fm_batch_t next_val_batch(fm_trainer_t *t, const fm_dataset_t *val)
{
    int B = t->cfg.batch;
    if ((size_t)B > val->n)
        B = (int)val->n;
    for (int i = 0; i < B; i++) {
        if (t->vpos == t->vn) {
            fm_rng_shuffle(&t->rng, t->vorder, t->vn);
            t->vpos = 0;
        }
        t->vidx[i] = t->vorder[t->vpos++];
    }
    return (fm_batch_t){.ds = val, .idx = t->vidx, .n = B};
}

/* n upper-level steps on the next validation batches; losses summed into *sum. */
static void upper_steps(fm_trainer_t *t, const fm_dataset_t *val, long n, double *sum, long *count)
{
    for (long s = 0; s < n; s++) {
        fm_batch_t vb = next_val_batch(t, val);
        *sum += fm_trainer_step(t, FM_LEVEL_UPPER, &vb);
        (*count)++;
    }
}

fm_status fm_trainer_run(fm_trainer_t *t, const fm_dataset_t *train, const fm_dataset_t *val, int epochs,
                         fm_train_stats_t *out)
{
    memset(out, 0, sizeof *out);
    fm_status st = fm_model_accepts(t->m, train, "train");
    if (st == FM_OK && val && val->n)
        st = fm_model_accepts(t->m, val, "train (validation)");
    if (st != FM_OK)
        return st;
    if (train->n == 0) {
        fm_error_set("train: no training examples");
        return FM_ERR_ARG;
    }
    double t0 = fm_clock_seconds();
    if (ensure_u32(&t->order, &t->order_cap, train->n))
        return FM_ERR_NOMEM;
    bool upper = val && val->n > 0 && t->cfg.router_steps > 0;
    if (upper) {
        if (ensure_u32(&t->vorder, &t->vcap, val->n))
            return FM_ERR_NOMEM;
        for (size_t i = 0; i < val->n; i++)
            t->vorder[i] = (uint32_t)i;
        t->vn = val->n;
        t->vpos = val->n; /* shuffle on first use */
    }
    double lsum = 0.0, vsum = 0.0;
    long lcount = 0, vcount = 0, since_upper = 0;
    const long budget = t->cfg.local_steps; /* (0: the epochs) */
    for (int ep = 0; budget > 0 ? lcount < budget : ep < epochs; ep++) {
        for (size_t i = 0; i < train->n; i++)
            t->order[i] = (uint32_t)i;
        fm_rng_shuffle(&t->rng, t->order, train->n);
        for (size_t pos = 0; pos < train->n && !(budget > 0 && lcount == budget); pos += (size_t)t->cfg.batch) {
            int B = (int)(train->n - pos < (size_t)t->cfg.batch ? train->n - pos : (size_t)t->cfg.batch);
            fm_batch_t b = {.ds = train, .idx = t->order + pos, .n = B};
            lsum += fm_trainer_step(t, FM_LEVEL_LOWER, &b);
            lcount++;
            out->samples += B;
            if (t->progress && lcount % t->progress_every == 0 && !t->progress(t->progress_user)) {
                fm_error_set("training stopped after %ld steps", lcount);
                return FM_ERR_STATE;
            }
            if (upper && ++since_upper == t->cfg.expert_steps) {
                since_upper = 0;
                upper_steps(t, val, t->cfg.router_steps, &vsum, &vcount);
            }
        }
    }
    /* the cycle left unfinished at the end gets its share of upper steps, so a
     * client with fewer than T_e batches still trains its routers */
    if (upper && since_upper > 0)
        upper_steps(t, val, (since_upper * t->cfg.router_steps + t->cfg.expert_steps / 2) / t->cfg.expert_steps,
                    &vsum, &vcount);
    out->train_loss = lcount ? lsum / lcount : 0.0;
    out->val_loss = vcount ? vsum / vcount : 0.0;
    out->lower_steps = lcount;
    out->upper_steps = vcount;
    out->seconds = fm_clock_seconds() - t0;
    return FM_OK;
}

fm_status fm_evaluate(fm_model_t *m, const fm_dataset_t *ds, fm_eval_t *out)
{
    return fm_evaluate_sample(m, ds, 0, out, NULL, NULL);
}

static fm_status evaluate_all(fm_model_t *m, const fm_dataset_t *ds, fm_eval_t *out, bool (*progress)(void *user),
                              void *user)
{
    memset(out, 0, sizeof *out);
    if (ds->n == 0)
        return FM_OK;
    fm_status st = fm_model_accepts(m, ds, "evaluate");
    if (st != FM_OK)
        return st;
    double loss = 0.0, share = 0.0;
    const size_t eb = (size_t)eval_batch(m);
    for (size_t pos = 0; pos < ds->n; pos += eb) {
        int B = (int)(ds->n - pos < eb ? ds->n - pos : eb);
        fm_batch_stats_t bs;
        fm_batch_t b = {.ds = ds, .first = pos, .n = B};
        fm_model_forward(m, &b, false, NULL, &bs);
        loss += (double)bs.loss * B;
        share += (double)bs.generalist_share * B;
        out->correct += (size_t)bs.correct;
        out->predictions += (size_t)bs.predictions;
        if (progress && !progress(user)) {
            fm_error_set("evaluation stopped");
            return FM_ERR_STATE;
        }
    }
    out->n = ds->n;
    out->loss = loss / ds->n;
    out->generalist_share = share / ds->n;
    out->accuracy = (double)out->correct / (double)out->predictions;
    return FM_OK;
}

fm_status fm_evaluate_sample(fm_model_t *m, const fm_dataset_t *ds, size_t sample, fm_eval_t *out,
                             bool (*progress)(void *user), void *user)
{
    if (sample == 0 || sample >= ds->n)
        return evaluate_all(m, ds, out, progress, user);
    uint32_t *idx = malloc(sizeof(uint32_t) * sample);
    fm_dataset_t some;
    fm_status st = idx ? FM_OK : FM_ERR_NOMEM;
    for (size_t j = 0; st == FM_OK && j < sample; j++)
        idx[j] = (uint32_t)(((2 * j + 1) * ds->n) / (2 * sample));
    if (st == FM_OK)
        st = fm_dataset_subset(&some, ds, idx, sample);
    free(idx);
    if (st != FM_OK) {
        memset(out, 0, sizeof *out);
        fm_error_set("evaluate: out of memory");
        return st;
    }
    st = evaluate_all(m, &some, out, progress, user);
    fm_dataset_free(&some);
    return st;
}
