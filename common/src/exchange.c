#include "fedmoe/exchange.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/log.h"

fm_exchange_t fm_exchange_of(fm_strategy s)
{
    fm_exchange_t e = {0};
    e.model = s != FM_STRATEGY_LOCAL;
    e.prompt = fm_strategy_shares_prompt(s);
    e.pool = fm_strategy_uses_pool(s);
    return e;
}

fm_exchange_dims_t fm_exchange_dims(const fm_run_spec_t *s, size_t nmodel)
{
    fm_exchange_dims_t d = {0};
    d.nmodel = nmodel;
    d.prompt_rows = (uint32_t)s->model.prompt_len;
    d.prompt_cols = (uint32_t)s->model.prompt_dim;
    d.nprompt = (size_t)d.prompt_rows * d.prompt_cols;
    d.max_nonlocal = s->model.max_nonlocal;
    return d;
}

/* ---- Task ---------------------------------------------------------------- */

fm_status fm_exchange_encode_task(const fm_run_spec_t *s, const fm_exchange_dims_t *d, const fm_task_t *t,
                                  uint8_t **buf, size_t *len)
{
    fm_exchange_t e = fm_exchange_of(s->strategy);
    Fedmoe__Envelope env = FEDMOE__ENVELOPE__INIT;
    Fedmoe__Task task = FEDMOE__TASK__INIT;
    Fedmoe__Tensor model, prompt, nl[64];
    Fedmoe__Tensor *model_list[1], *nl_list[64];
    int k = e.pool ? (t->k < 64 ? t->k : 64) : 0, built = 0;
    bool ok = true;
    task.round = t->round;
    task.lr_scale = t->lr_scale;
    task.nonce.data = (uint8_t *)t->nonce;
    task.nonce.len = FM_NONCE_BYTES;
    if (e.model) {
        ok &= fm_wire_tensor_set(&model, "model", t->model, 1, (uint32_t)d->nmodel) == FM_OK;
        model_list[0] = &model;
        task.model = model_list;
        task.n_model = 1;
    }
    if (e.prompt) {
        ok &= fm_wire_tensor_set(&prompt, "prompt", t->prompt, d->prompt_rows, d->prompt_cols) == FM_OK;
        task.global_prompt = &prompt;
    }
    for (; built < k; built++) {
        ok &= fm_wire_tensor_set(&nl[built], "nonlocal", t->nonlocal[built], d->prompt_rows, d->prompt_cols) == FM_OK;
        nl_list[built] = &nl[built];
    }
    task.nonlocal_prompts = nl_list;
    task.n_nonlocal_prompts = (size_t)k;
    env.body_case = FEDMOE__ENVELOPE__BODY_TASK;
    env.task = &task;
    fm_status st = ok ? fm_wire_encode(&env, buf, len) : FM_ERR_NOMEM;
    if (e.model)
        fm_wire_tensor_clear(&model);
    if (e.prompt)
        fm_wire_tensor_clear(&prompt);
    for (int j = 0; j < built; j++)
        fm_wire_tensor_clear(&nl[j]);
    if (st != FM_OK)
        fm_error_set("out of memory building a task");
    return st;
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
    fm_exchange_t e = fm_exchange_of(s->strategy);
    memset(out, 0, sizeof *out);
    out->round = t->round;
    out->lr_scale = t->lr_scale == 0.0f ? 1.0f : t->lr_scale;
    if (!(out->lr_scale > 0.0f && out->lr_scale <= 10.0f)) {
        fm_error_set("task lr_scale out of range (0, 10]");
        return refuse(code, FM_WIRE_BAD_VALUE);
    }
    if (t->nonce.len != FM_NONCE_BYTES) {
        fm_error_set("task without its %d-byte nonce", FM_NONCE_BYTES);
        return refuse(code, FM_WIRE_MALFORMED);
    }
    memcpy(out->nonce, t->nonce.data, FM_NONCE_BYTES);
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
    fm_exchange_t e = fm_exchange_of(s->strategy);
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

fm_status fm_exchange_read_update(const fm_run_spec_t *s, const fm_exchange_dims_t *d, const Fedmoe__Update *u,
                                  const fm_split_sizes_t *expect, float *model, float *prompt, fm_metrics_t *out,
                                  fm_wire_code *code)
{
    fm_exchange_t e = fm_exchange_of(s->strategy);
    const Fedmoe__Metrics *m = u->metrics;
    if (!metrics_ok(m)) {
        fm_error_set("metrics missing or out of range");
        return refuse(code, FM_WIRE_BAD_VALUE);
    }
    if (u->train_samples != expect->train || m->val_samples != expect->val || m->test_samples != expect->test) {
        fm_error_set("update counts %llu/%llu/%llu train/validation/test examples, its hello declared %llu/%llu/%llu",
                     (unsigned long long)u->train_samples, (unsigned long long)m->val_samples,
                     (unsigned long long)m->test_samples, (unsigned long long)expect->train,
                     (unsigned long long)expect->val, (unsigned long long)expect->test);
        return refuse(code, FM_WIRE_BAD_VALUE);
    }
    if (m->test_samples && fabs((double)m->test_accuracy - (double)m->test_correct / (double)m->test_samples) > 1e-4) {
        fm_error_set("test accuracy %.6f is not its %llu correct of %llu", (double)m->test_accuracy,
                     (unsigned long long)m->test_correct, (unsigned long long)m->test_samples);
        return refuse(code, FM_WIRE_BAD_VALUE);
    }
    if (e.model && u->n_model != 1) {
        fm_error_set("model: expected one tensor");
        return refuse(code, FM_WIRE_BAD_TENSOR);
    }
    if (e.model && fm_wire_tensor_get(u->model[0], "model", 1, (uint32_t)d->nmodel, model) != FM_OK)
        return refuse_tensor(code, "model", fm_wire_last_code());
    if (e.prompt && fm_wire_tensor_get(u->prompt, "prompt", d->prompt_rows, d->prompt_cols, prompt) != FM_OK)
        return refuse_tensor(code, "prompt", FM_WIRE_BAD_TENSOR);
    *out = (fm_metrics_t){
        .train_loss = m->train_loss, .val_loss = m->val_loss, .test_loss = m->test_loss,
        .test_accuracy = m->test_accuracy, .generalist_share = m->generalist_share,
        .test_samples = m->test_samples, .test_correct = m->test_correct, .val_samples = m->val_samples,
        .val_correct = m->val_correct, .seconds = m->seconds,
    };
    return FM_OK;
}
