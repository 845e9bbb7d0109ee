#include "fedmoe/exchange.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/log.h"
#include "fedmoe/secagg.h"

fm_exchange_t fm_exchange_of(const fm_run_spec_t *s)
{
    fm_exchange_t e = {0};
    bool head = fm_model_config_has_head(&s->model);
    e.model = fm_strategy_traits(s->strategy)->model;
    e.prompt = head && fm_strategy_shares_prompt(s->strategy);
    e.pool = fm_run_uses_pool(s);
    return e;
}

fm_exchange_dims_t fm_exchange_dims(const fm_run_spec_t *s, size_t nmodel)
{
    fm_exchange_dims_t d = {0};
    fm_exchange_t e = fm_exchange_of(s);
    d.nmodel = nmodel;
    d.prompt_rows = e.prompt ? (uint32_t)s->model.prompt_len : 0;
    d.prompt_cols = e.prompt ? (uint32_t)s->model.prompt_dim : 0;
    d.nprompt = (size_t)d.prompt_rows * d.prompt_cols;
    d.max_nonlocal = e.pool ? s->model.max_nonlocal : 0;
    return d;
}

/* ---- Task ---------------------------------------------------------------- */

/* The Task's tensors that every participant shares (the round's global state),
 * or (own) those of one client (its K nearest pool prompts) and its nonce,
 * as a Task message of their own; ok false when out of memory. */
typedef struct {
    Fedmoe__Task task;
    Fedmoe__SecAggSetup sa;
    Fedmoe__Tensor model, prompt, nl[64];
    Fedmoe__Tensor *model_list[1], *nl_list[64];
    int built;
    bool ok;
} task_part_t;

static void task_part_build(task_part_t *p, const fm_run_spec_t *s, const fm_exchange_dims_t *d, const fm_task_t *t,
                            bool own)
{
    fm_exchange_t e = fm_exchange_of(s);
    memset(p, 0, sizeof *p);
    fedmoe__task__init(&p->task);
    p->ok = true;
    if (own) {
        int k = e.pool ? (t->k < 64 ? t->k : 64) : 0;
        p->task.nonce.data = (uint8_t *)t->nonce;
        p->task.nonce.len = FM_NONCE_BYTES;
        if (s->secure_aggregation) {
            fedmoe__sec_agg_setup__init(&p->sa);
            p->sa.who = t->sa.who;
            p->sa.n = t->sa.n;
            p->sa.t = t->sa.t;
            p->sa.weight = t->sa.weight;
            p->task.secagg = &p->sa;
        }
        for (; p->built < k; p->built++) {
            p->ok &= fm_wire_tensor_set(&p->nl[p->built], "nonlocal", t->nonlocal[p->built], d->prompt_rows,
                                        d->prompt_cols) == FM_OK;
            p->nl_list[p->built] = &p->nl[p->built];
        }
        p->task.nonlocal_prompts = p->nl_list;
        p->task.n_nonlocal_prompts = (size_t)k;
        return;
    }
    p->task.round = t->round;
    p->task.lr_scale = t->lr_scale;
    p->task.eval_sample = t->eval_sample;
    if (e.model) {
        p->ok &= fm_wire_tensor_set(&p->model, "model", t->model, 1, (uint32_t)d->nmodel) == FM_OK;
        p->model_list[0] = &p->model;
        p->task.model = p->model_list;
        p->task.n_model = 1;
    }
    if (e.prompt) {
        p->ok &= fm_wire_tensor_set(&p->prompt, "prompt", t->prompt, d->prompt_rows, d->prompt_cols) == FM_OK;
        p->task.global_prompt = &p->prompt;
    }
}

static void task_part_clear(task_part_t *p)
{
    if (p->task.n_model)
        fm_wire_tensor_clear(&p->model);
    if (p->task.global_prompt)
        fm_wire_tensor_clear(&p->prompt);
    for (int j = 0; j < p->built; j++)
        fm_wire_tensor_clear(&p->nl[j]);
}

static size_t put_varint(uint8_t *out, uint64_t v)
{
    size_t n = 0;
    do {
        out[n++] = (uint8_t)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
        v >>= 7;
    } while (v);
    return n;
}

fm_status fm_exchange_encode_task_shared(const fm_run_spec_t *s, const fm_exchange_dims_t *d, const fm_task_t *t,
                                         fm_blob_t **out)
{
    task_part_t p;
    task_part_build(&p, s, d, t, false);
    *out = p.ok ? fm_blob_new(fedmoe__task__get_packed_size(&p.task)) : NULL;
    if (*out)
        fedmoe__task__pack(&p.task, fm_blob_data(*out));
    task_part_clear(&p);
    if (!*out)
        fm_error_set("out of memory building a task");
    return *out ? FM_OK : FM_ERR_NOMEM;
}

fm_status fm_exchange_encode_task_own(const fm_run_spec_t *s, const fm_exchange_dims_t *d, const fm_task_t *t,
                                      size_t shared_len, uint8_t **buf, size_t *len, size_t *head)
{
    task_part_t p;
    task_part_build(&p, s, d, t, true);
    size_t tail = fedmoe__task__get_packed_size(&p.task);
    *buf = p.ok ? malloc(24 + tail) : NULL;
    if (*buf) {
        /* Envelope: protocol_version (field 1, varint), task (field 4, bytes) */
        size_t h = 0;
        (*buf)[h++] = 0x08;
        h += put_varint(*buf + h, FM_PROTOCOL_VERSION);
        (*buf)[h++] = 0x22;
        h += put_varint(*buf + h, (uint64_t)shared_len + tail);
        *head = h;
        *len = h + fedmoe__task__pack(&p.task, *buf + h);
    }
    task_part_clear(&p);
    if (!*buf)
        fm_error_set("out of memory building a task");
    return *buf ? FM_OK : FM_ERR_NOMEM;
}

void fm_exchange_task_frames(const uint8_t *own, size_t len, size_t head, fm_blob_t *shared, fm_frame_t f[3])
{
    f[0] = (fm_frame_t){own, head, NULL};
    f[1] = (fm_frame_t){NULL, 0, shared};
    f[2] = (fm_frame_t){own + head, len - head, NULL};
}

void fm_exchange_task_free(fm_task_in_t *t)
{
    free(t->model);
    free(t->prompt);
    free(t->nonlocal);
    memset(t, 0, sizeof *t);
}

static fm_status refuse(fm_wire_code *code, fm_wire_code c)
{
    *code = c;
    return FM_ERR_FORMAT;
}

/* Refuses with code c, the last reason prefixed with which tensor ("model: ..."). */
static fm_status refuse_tensor(fm_wire_code *code, const char *which, fm_wire_code c)
{
    char why[256];
    snprintf(why, sizeof why, "%s", fm_error_last());
    fm_error_set("%s: %s", which, why);
    return refuse(code, c);
}

fm_status fm_exchange_read_task(const fm_run_spec_t *s, const fm_exchange_dims_t *d, const Fedmoe__Task *t,
                                fm_task_in_t *out, fm_wire_code *code)
{
    fm_exchange_t e = fm_exchange_of(s);
    memset(out, 0, sizeof *out);
    out->round = t->round;
    out->lr_scale = t->lr_scale == 0.0f ? 1.0f : t->lr_scale;
    out->eval_sample = t->eval_sample; /* (any count: a split smaller than it is evaluated whole) */
    if (!(out->lr_scale > 0.0f && out->lr_scale <= 10.0f)) {
        fm_error_set("task lr_scale out of range (0, 10]");
        return refuse(code, FM_WIRE_BAD_VALUE);
    }
    if (t->nonce.len != FM_NONCE_BYTES) {
        fm_error_set("task without its %d-byte nonce", FM_NONCE_BYTES);
        return refuse(code, FM_WIRE_MALFORMED);
    }
    memcpy(out->nonce, t->nonce.data, FM_NONCE_BYTES);
    if (s->secure_aggregation) {
        const Fedmoe__SecAggSetup *a = t->secagg;
        if (!a || a->who < 1 || a->who > a->n || a->n > FM_SA_MAX_CLIENTS || 2 * a->t <= a->n || a->t > a->n ||
            a->weight < 1 || a->weight > FM_AGG_MAX_WEIGHT) {
            fm_error_set("task of a secure-aggregation run without a usable place in it (number, clients, "
                         "threshold, weight)");
            return refuse(code, FM_WIRE_BAD_VALUE);
        }
        out->sa = (fm_sa_setup_t){a->who, a->n, a->t, a->weight};
    }
    if (e.model && t->n_model != 1) {
        fm_error_set("task without its model tensor");
        return refuse(code, FM_WIRE_BAD_TENSOR);
    }
    if (t->n_nonlocal_prompts > (size_t)d->max_nonlocal) {
        fm_error_set("too many non-local prompts");
        return refuse(code, FM_WIRE_BAD_TENSOR);
    }
    out->k = e.pool ? (int)t->n_nonlocal_prompts : 0;
    out->model = e.model ? malloc(sizeof(float) * (d->nmodel + 1)) : NULL;
    out->prompt = e.prompt ? malloc(sizeof(float) * d->nprompt) : NULL;
    out->nonlocal = out->k ? malloc(sizeof(float) * d->nprompt * (size_t)out->k) : NULL;
    if ((e.model && !out->model) || (e.prompt && !out->prompt) || (out->k && !out->nonlocal)) {
        fm_exchange_task_free(out);
        fm_error_set("out of memory reading a task");
        return FM_ERR_NOMEM;
    }
    bool ok = !e.model || fm_wire_tensor_get(t->model[0], "model", 1, (uint32_t)d->nmodel, out->model) == FM_OK;
    if (ok && e.prompt)
        ok = fm_wire_tensor_get(t->global_prompt, "prompt", d->prompt_rows, d->prompt_cols, out->prompt) == FM_OK;
    for (int j = 0; ok && j < out->k; j++)
        ok = fm_wire_tensor_get(t->nonlocal_prompts[j], "nonlocal", d->prompt_rows, d->prompt_cols,
                                out->nonlocal + d->nprompt * (size_t)j) == FM_OK;
    if (!ok) {
        fm_exchange_task_free(out);
        return refuse(code, fm_wire_last_code());
    }
    return FM_OK;
}

/* ---- Update -------------------------------------------------------------- */

fm_status fm_exchange_encode_update(const fm_run_spec_t *s, const fm_exchange_dims_t *d, const fm_update_t *u,
                                    uint8_t **buf, size_t *len)
{
    fm_exchange_t e = fm_exchange_of(s);
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    Fedmoe__Update up = FEDMOE__UPDATE__INIT;
    Fedmoe__Metrics m = FEDMOE__METRICS__INIT;
    Fedmoe__Tensor model_t, prompt_t, *list[1];
    const fm_metrics_t *mm = &u->metrics;
    up.round = u->round;
    up.train_samples = u->train_samples;
    up.nonce.data = (uint8_t *)u->nonce;
    up.nonce.len = FM_NONCE_BYTES;
    m.train_loss = (float)mm->train_loss;
    m.val_loss = (float)mm->val_loss;
    m.test_loss = (float)mm->test_loss;
    m.test_accuracy = (float)mm->test_accuracy;
    m.generalist_share = (float)mm->generalist_share;
    m.test_samples = mm->test_samples;
    m.test_correct = mm->test_correct;
    m.val_samples = mm->val_samples;
    m.val_correct = mm->val_correct;
    m.seconds = mm->seconds;
    up.metrics = &m;
    bool ok = true;
    uint8_t *masked = NULL;
    if (u->masked) { /* (instead of the tensors) */
        e.model = e.prompt = false;
        ok = (masked = malloc(16 * u->nmasked + 1)) != NULL;
        for (size_t i = 0; ok && i < u->nmasked; i++)
            for (int b = 0; b < 16; b++)
                masked[16 * i + (size_t)b] = (uint8_t)(u->masked[i] >> (8 * b));
        up.masked.data = masked;
        up.masked.len = ok ? 16 * u->nmasked : 0;
    }
    if (e.model) {
        ok &= fm_wire_tensor_set(&model_t, "model", u->model, 1, (uint32_t)d->nmodel) == FM_OK;
        list[0] = &model_t;
        up.model = list;
        up.n_model = 1;
    }
    if (e.prompt) {
        ok &= fm_wire_tensor_set(&prompt_t, "prompt", u->prompt, d->prompt_rows, d->prompt_cols) == FM_OK;
        up.prompt = &prompt_t;
    }
    env.body_case = FEDMOE__ENVELOPE__BODY_UPDATE;
    env.update = &up;
    fm_status st = ok ? fm_wire_encode(&env, buf, len) : FM_ERR_NOMEM;
    if (e.model)
        fm_wire_tensor_clear(&model_t);
    if (e.prompt)
        fm_wire_tensor_clear(&prompt_t);
    free(masked);
    if (st != FM_OK)
        fm_error_set("out of memory building an update");
    return st;
}

static bool metrics_ok(const Fedmoe__Metrics *m)
{
    return m && isfinite(m->train_loss) && isfinite(m->val_loss) && isfinite(m->test_loss) &&
           m->test_accuracy >= 0.0f && m->test_accuracy <= 1.0f && m->generalist_share >= 0.0f &&
           m->generalist_share <= 1.0f && m->test_correct <= m->test_samples && m->test_samples <= (1ull << 40) &&
           m->val_correct <= m->val_samples && m->val_samples <= (1ull << 40) && m->seconds >= 0.0 &&
           m->seconds < 1e9;
}

fm_split_sizes_t fm_exchange_evaluated(const fm_split_sizes_t *declared, uint32_t eval_sample)
{
    fm_split_sizes_t e = *declared;
    if (eval_sample > 0 && e.val > eval_sample)
        e.val = eval_sample;
    if (eval_sample > 0 && e.test > eval_sample)
        e.test = eval_sample;
    return e;
}

/* An Update's metrics and counts, checked, into out. */
static fm_status read_metrics(const fm_run_spec_t *s, const Fedmoe__Update *u, const fm_split_sizes_t *expect,
                              fm_metrics_t *out, fm_wire_code *code)
{
    const Fedmoe__Metrics *m = u->metrics;
    if (!metrics_ok(m)) {
        fm_error_set("metrics missing or out of range");
        return refuse(code, FM_WIRE_BAD_VALUE);
    }
    /* (its metrics count predictions: an example's one, or a text window's bytes) */
    uint64_t per = (uint64_t)fm_model_config_predictions(&s->model);
    if (u->train_samples != expect->train || m->val_samples != expect->val * per || m->test_samples != expect->test * per) {
        fm_error_set("update counts %llu train examples and %llu/%llu validation/test predictions, the round expects "
                     "%llu/%llu/%llu examples (%llu predictions each)",
                     (unsigned long long)u->train_samples, (unsigned long long)m->val_samples,
                     (unsigned long long)m->test_samples, (unsigned long long)expect->train,
                     (unsigned long long)expect->val, (unsigned long long)expect->test, (unsigned long long)per);
        return refuse(code, FM_WIRE_BAD_VALUE);
    }
    if (m->test_samples && fabs((double)m->test_accuracy - (double)m->test_correct / (double)m->test_samples) > 1e-4) {
        fm_error_set("test accuracy %.6f is not its %llu correct of %llu", (double)m->test_accuracy,
                     (unsigned long long)m->test_correct, (unsigned long long)m->test_samples);
        return refuse(code, FM_WIRE_BAD_VALUE);
    }
    *out = (fm_metrics_t){
        .train_loss = m->train_loss, .val_loss = m->val_loss, .test_loss = m->test_loss,
        .test_accuracy = m->test_accuracy, .generalist_share = m->generalist_share,
        .test_samples = m->test_samples, .test_correct = m->test_correct, .val_samples = m->val_samples,
        .val_correct = m->val_correct, .seconds = m->seconds,
    };
    return FM_OK;
}

fm_status fm_exchange_read_update(const fm_run_spec_t *s, const fm_exchange_dims_t *d, const Fedmoe__Update *u,
                                  const fm_split_sizes_t *expect, float *model, float *prompt, fm_metrics_t *out,
                                  fm_wire_code *code)
{
    fm_exchange_t e = fm_exchange_of(s);
    fm_metrics_t m;
    if (read_metrics(s, u, expect, &m, code) != FM_OK)
        return FM_ERR_FORMAT;
    if (e.model && u->n_model != 1) {
        fm_error_set("model: expected one tensor");
        return refuse(code, FM_WIRE_BAD_TENSOR);
    }
    if (e.model && fm_wire_tensor_get(u->model[0], "model", 1, (uint32_t)d->nmodel, model) != FM_OK)
        return refuse_tensor(code, "model", fm_wire_last_code());
    if (e.prompt && fm_wire_tensor_get(u->prompt, "prompt", d->prompt_rows, d->prompt_cols, prompt) != FM_OK)
        return refuse_tensor(code, "prompt", FM_WIRE_BAD_TENSOR);
    *out = m;
    return FM_OK;
}

size_t fm_exchange_masked_size(const fm_run_spec_t *s, const fm_exchange_dims_t *d)
{
    fm_exchange_t e = fm_exchange_of(s);
    return (e.model ? d->nmodel : 0) + (e.prompt ? d->nprompt : 0) + 1;
}

fm_status fm_exchange_read_masked(const fm_run_spec_t *s, const fm_exchange_dims_t *d, const Fedmoe__Update *u,
                                  const fm_split_sizes_t *expect, unsigned __int128 *masked, fm_metrics_t *out,
                                  fm_wire_code *code)
{
    fm_metrics_t m;
    if (read_metrics(s, u, expect, &m, code) != FM_OK)
        return FM_ERR_FORMAT;
    size_t n = fm_exchange_masked_size(s, d);
    if (u->n_model || u->prompt || u->masked.len != 16 * n) {
        fm_error_set("a secure-aggregation update carries its masked input alone (%zu bytes), not %zu bytes%s", 16 * n,
                     u->masked.len, u->n_model || u->prompt ? " and tensors" : "");
        return refuse(code, FM_WIRE_BAD_TENSOR);
    }
    for (size_t i = 0; i < n; i++) {
        unsigned __int128 v = 0;
        for (int b = 15; b >= 0; b--)
            v = v << 8 | u->masked.data[16 * i + (size_t)b];
        masked[i] = v;
    }
    *out = m;
    return FM_OK;
}
