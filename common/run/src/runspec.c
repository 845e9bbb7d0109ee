#include "fedmoe/runspec.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/args.h"
#include "fedmoe/log.h"

FM_ARG_ENUM_NAMES(fm_strategy, fm_strategy_name, fm_strategy_parse, "local", "fedavg", "comigs", "pfedmoap", "full")
FM_ARG_ENUM_NAMES(fm_lr_schedule, fm_lr_schedule_name, fm_lr_schedule_parse, "constant", "cosine")

float fm_lr_schedule_scale(fm_lr_schedule s, int round, int rounds)
{
    return s == FM_LR_COSINE ? fm_lr_cosine(round, rounds, FM_LR_COSINE_FLOOR) : 1.0f;
}

static const fm_strategy_traits_t strategies[] = {
    /*                       model  averages_local  shares_prompt  uses_pool */
    [FM_STRATEGY_LOCAL] = {false, false, false, false},
    [FM_STRATEGY_FEDAVG] = {true, true, true, false},
    [FM_STRATEGY_COMIGS] = {true, false, true, false},
    [FM_STRATEGY_PFEDMOAP] = {true, true, true, true},
    [FM_STRATEGY_FULL] = {true, false, true, true},
};

const fm_strategy_traits_t *fm_strategy_traits(fm_strategy s)
{
    static const fm_strategy_traits_t none = {false, false, false, false};
    return (unsigned)s < sizeof strategies / sizeof strategies[0] ? &strategies[s] : &none;
}

bool fm_strategy_shares_prompt(fm_strategy s) { return fm_strategy_traits(s)->shares_prompt; }
bool fm_strategy_uses_pool(fm_strategy s) { return fm_strategy_traits(s)->uses_pool; }
bool fm_strategy_averages_local(fm_strategy s) { return fm_strategy_traits(s)->averages_local; }

bool fm_run_uses_pool(const fm_run_spec_t *s)
{
    return fm_strategy_uses_pool(s->strategy) && fm_model_config_has_head(&s->model) && s->model.max_nonlocal > 0;
}

bool fm_strategy_federates(fm_strategy s, const fm_param_t *p)
{
    const fm_strategy_traits_t *t = fm_strategy_traits(s);
    return t->model && (p->group == FM_GROUP_SHARED ||
                        (t->averages_local && p->group == FM_GROUP_LOCAL && p->role != FM_ROLE_GATING));
}

void fm_run_spec_default(fm_run_spec_t *s)
{
    memset(s, 0, sizeof *s);
    s->strategy = FM_STRATEGY_FULL;
    s->seed = 1;
    fm_model_config_default(&s->model);
    fm_train_config_default(&s->train);
    s->local_epochs = 1;
    s->lr_schedule = FM_LR_COSINE;
    s->train.anchor = 20.0f; /* chosen on holdout runs, BENCHMARKS.md */
    snprintf(s->dataset, sizeof s->dataset, "fmnist");
    fm_partition_config_default(&s->part);
    s->partition_count = 10;
    s->aggregate.rule = FM_AGG_MEAN;
    s->clip_norm = FM_CLIP_AUTO;
    fm_dp_spec_default(&s->dp);
}

uint64_t fm_run_spec_data_seed(const fm_run_spec_t *s) { return s->data_seed ? s->data_seed : s->seed; }

void fm_run_spec_data(const fm_run_spec_t *s, fm_data_spec_t *out)
{
    fm_data_spec_default(out);
    out->dataset = s->dataset;
    out->count = s->partition_count;
    out->part = s->part;
    out->seed = fm_run_spec_data_seed(s);
    out->holdout = s->holdout;
    out->context = s->model.context;
    out->regime = s->regime;
}

void fm_clip_norm_name(double clip, char *buf, size_t cap)
{
    if (clip == FM_CLIP_AUTO)
        snprintf(buf, cap, "auto");
    else if (clip == 0.0)
        snprintf(buf, cap, "off");
    else
        snprintf(buf, cap, "%g", clip);
}

fm_status fm_clip_norm_parse(const char *flag, const char *text, double *out)
{
    if (!strcmp(text, "auto") || !strcmp(text, "off")) {
        *out = text[0] == 'a' ? FM_CLIP_AUTO : 0.0;
        return FM_OK;
    }
    char *end;
    double v = strtod(text, &end);
    if (end == text || *end || !(v > 0.0 && v < 1e12)) {
        fm_error_set("%s: '%s' is not auto, off or a positive number", flag, text);
        return FM_ERR_ARG;
    }
    *out = v;
    return FM_OK;
}

/* What both privacy modes need of the run (the one place this is decided):
 * something averaged, by the mean, and no client's own values sent anywhere
 * else (pfedmoap's and full's prompt pool, unless off); flag names the mode in the
 * refusal. Then the coordinator's own bound on updates gives way: a learned
 * one (--clip-norm auto, which would itself tell of the updates) is off, and
 * a number given is refused with clip_why, or, when clip_why is NULL, kept as
 * the bound the clients put on their own updates (fm_run_client_clip). */
static fm_status private_average(fm_run_spec_t *s, const char *flag, const char *clip_why)
{
    const char *why = NULL;
    if (!fm_strategy_traits(s->strategy)->model)
        why = "strategy local averages nothing: there is no shared result to protect";
    else if (fm_run_uses_pool(s))
        why = "pfedmoap and full also send each client's own prompt to its nearest peers, which it does not "
              "protect: use fedavg or comigs, or --prompt-pool off";
    else if (s->aggregate.rule != FM_AGG_MEAN)
        why = "it needs --aggregate mean: the median and the trimmed mean read every update";
    else if (clip_why && s->clip_norm != FM_CLIP_AUTO && s->clip_norm != 0.0)
        why = clip_why;
    if (why) {
        fm_error_set("%s: %s", flag, why);
        return FM_ERR_ARG;
    }
    if (s->clip_norm == FM_CLIP_AUTO)
        s->clip_norm = 0.0;
    return FM_OK;
}

/* Differential privacy's and secure aggregation's settings against the rest
 * of the run and each other: under secure aggregation the coordinator sees
 * no update, so the clients bound their own (--clip-norm C, or --dp-clip)
 * and differential privacy's noise is theirs to add (--dp-mode distributed);
 * without it, the noise is the coordinator's (central). */
static fm_status privacy_check(fm_run_spec_t *s)
{
    fm_status st = fm_dp_spec_check(&s->dp);
    bool dp = fm_dp_on(&s->dp), distributed = dp && s->dp.mode == FM_DP_DISTRIBUTED;
    const char *why = NULL;
    if (st != FM_OK)
        return st;
    if (s->secure_aggregation && dp && !distributed)
        why = "--secure-aggregation with --dp-noise needs --dp-mode distributed: the coordinator cannot clip or "
              "noise updates it cannot see, so the clients clip theirs and each adds its share of the noise";
    else if (distributed && !s->secure_aggregation)
        why = "--dp-mode distributed needs --secure-aggregation: each client adds only a share of the noise, "
              "which hides its update only inside the masked sum (without masking: --dp-mode central)";
    if (why) {
        fm_error_set("%s", why);
        return FM_ERR_ARG;
    }
    if (s->secure_aggregation)
        st = private_average(s, "--secure-aggregation", NULL); /* (--clip-norm C: the clients' own bound) */
    if (st == FM_OK && dp)
        st = private_average(s, "--dp-noise", "--clip-norm and --dp-clip both bound the updates: give --dp-clip alone");
    return st;
}

double fm_run_client_clip(const fm_run_spec_t *s)
{
    if (!s->secure_aggregation)
        return 0.0;
    if (fm_dp_on(&s->dp))
        return s->dp.clip;
    return s->clip_norm > 0.0 ? s->clip_norm : 0.0;
}

double fm_run_client_noise(const fm_run_spec_t *s)
{
    return s->secure_aggregation && fm_dp_on(&s->dp) && s->dp.mode == FM_DP_DISTRIBUTED ? s->dp.noise : 0.0;
}

fm_status fm_run_spec_finish(fm_run_spec_t *s)
{
    s->model.gating = fm_strategy_uses_pool(s->strategy);
    /* the anchor regularises specialists that stay local; averaged ones have FedAvg */
    if (fm_strategy_averages_local(s->strategy))
        s->train.anchor = 0.0f;
    fm_status st = fm_model_config_check(&s->model);
    if (st != FM_OK)
        return st;
    const fm_strategy_traits_t *t = fm_strategy_traits(s->strategy);
    if (s->model.shared == FM_SHARED_EXPERTS && (!t->model || t->averages_local)) {
        fm_error_set("--shared experts changes what comigs and full average; strategy %s %s",
                     fm_strategy_name(s->strategy),
                     !t->model ? "averages nothing" : "averages every expert and router");
        return FM_ERR_ARG;
    }
    if (s->model.gating_shared && !fm_strategy_uses_pool(s->strategy)) {
        fm_error_set("--gating shared: strategy %s has no gating network (pfedmoap and full have)",
                     fm_strategy_name(s->strategy));
        return FM_ERR_ARG;
    }
    if (!fm_model_config_has_head(&s->model) && fm_strategy_uses_pool(s->strategy)) {
        fm_error_set("strategy %s needs the prompt head of the image task; text runs use local, fedavg or comigs",
                     fm_strategy_name(s->strategy));
        return FM_ERR_ARG;
    }
    if ((st = privacy_check(s)) != FM_OK)
        return st;
    if (s->local_epochs < 1 || s->local_epochs > 1000) {
        fm_error_set("local epochs %d out of range 1..1000", s->local_epochs);
        return FM_ERR_ARG;
    }
    if (s->train.batch < 1 || s->train.batch > 65536 || s->train.expert_steps < 1 || s->train.router_steps < 0 ||
        s->train.local_steps < 0 || s->train.local_steps > (1 << 30) ||
        !(s->train.lower.lr >= 0.0f && s->train.lower.lr <= 10.0f) || !(s->train.upper.lr >= 0.0f && s->train.upper.lr <= 10.0f)) {
        fm_error_set("training spec out of range (batch 1..65536, expert_steps >= 1, lr 0..10)");
        return FM_ERR_ARG;
    }
    const fm_train_config_t *tc = &s->train;
    if (!(tc->lower.weight_decay >= 0.0f && tc->lower.weight_decay <= 1000.0f) ||
        !(tc->anchor >= 0.0f && tc->lower.lr * tc->anchor <= 1.0f)) {
        fm_error_set("training spec out of range (weight decay 0..1000, anchor >= 0 with lr x anchor <= 1)");
        return FM_ERR_ARG;
    }
    if (s->eval_sample < 0 || s->eval_sample > (1 << 30)) {
        fm_error_set("evaluation sample %d out of range 0..%d", s->eval_sample, 1 << 30);
        return FM_ERR_ARG;
    }
    if ((st = fm_regime_check(&s->regime, s->model.family == FM_FAMILY_TEXT)) != FM_OK)
        return st;
    if (s->partition_count < 1 || s->partition_count > 100000) {
        fm_error_set("partition count %d out of range 1..100000", s->partition_count);
        return FM_ERR_ARG;
    }
    return FM_OK;
}

size_t fm_run_spec_json(const fm_run_spec_t *s, char *buf, size_t cap)
{
    const fm_model_config_t *c = &s->model;
    char rule[64], clip[32];
    fm_agg_spec_name(&s->aggregate, rule, sizeof rule);
    fm_clip_norm_name(s->clip_norm, clip, sizeof clip);
    char dseed[48] = ""; /* only when set: runs without one keep their old config text (so gating_shared) */
    if (s->data_seed)
        snprintf(dseed, sizeof dseed, ",\"data_seed\":%llu", (unsigned long long)s->data_seed);
    int n = snprintf(
        buf, cap,
        "{\"strategy\":\"%s\",\"seed\":%llu,\"dataset\":\"%s\",\"partition\":{\"scheme\":\"%s\",\"alpha\":%g,"
        "\"classes_per_client\":%d,\"min_samples\":%zu,\"count\":%d,\"holdout\":%s%s},"
        "\"model\":{\"family\":\"%s\",\"context\":%d,\"untied\":%s,\"shared\":\"%s\",\"stem\":\"%s\",\"in_dim\":%d,\"classes\":%d,\"d\":%d,\"blocks\":%d,\"generalists\":%d,"
        "\"specialists\":%d,\"ffn_hidden\":%d,\"top_k\":%d,\"lb_weight\":%g,\"generalist_importance\":%g,"
        "\"prompt_len\":%d,\"prompt_dim\":%d,\"text_hidden\":%d,\"heads\":%d,\"max_nonlocal\":%d,"
        "\"attn_scale\":%g,\"lambda\":%g,\"tau\":%g,\"gating\":%s,\"gating_on_validation\":%s%s},"
        "\"train\":{\"batch\":%d,\"expert_steps\":%d,\"router_steps\":%d,\"lr\":%g,\"router_lr\":%g,"
        "\"weight_decay\":%g,\"local_epochs\":%d,\"local_steps\":%d,\"lb_in_upper\":%s,\"anchor\":%g,\"lr_schedule\":\"%s\"},"
        "\"aggregation\":{\"rule\":\"%s\",\"clip\":\"%s\"},\"eval_sample\":%d}",
        fm_strategy_name(s->strategy), (unsigned long long)s->seed, s->dataset, fm_partition_kind_name(s->part.kind),
        s->part.alpha, s->part.classes_per_client, s->part.min_samples, s->partition_count, s->holdout ? "true" : "false", dseed,
        fm_family_name(c->family), c->context, c->untied ? "true" : "false", fm_shared_name(c->shared), fm_stem_name(c->stem), c->in_dim, c->classes, c->d, c->blocks, c->generalists,
        c->specialists, c->ffn_hidden, c->top_k, c->lb_weight, c->generalist_importance, c->prompt_len,
        c->prompt_dim, c->text_hidden, c->heads, c->max_nonlocal, c->attn_scale, c->lambda, c->tau,
        c->gating ? "true" : "false", c->gating_on_validation ? "true" : "false",
        c->gating_shared ? ",\"gating_shared\":true" : "", s->train.batch,
        s->train.expert_steps, s->train.router_steps, s->train.lower.lr, s->train.upper.lr,
        s->train.lower.weight_decay, s->local_epochs, s->train.local_steps, s->train.lb_in_upper ? "true" : "false",
        s->train.anchor, fm_lr_schedule_name(s->lr_schedule), rule, clip, s->eval_sample);
    char noise[32]; /* a number, or "auto" before the coordinator chose it */
    if (s->dp.noise == FM_DP_NOISE_AUTO)
        snprintf(noise, sizeof noise, "\"auto\"");
    else
        snprintf(noise, sizeof noise, "%.17g", s->dp.noise);
    if (n >= 0 && (size_t)n < cap && fm_dp_on(&s->dp)) /* only when on: other runs keep their config text */
        n += snprintf(buf + n - 1, cap - (size_t)n + 1,
                      ",\"privacy\":{\"noise\":%s,\"clip\":%.17g,\"delta\":%.17g,\"mode\":\"%s\","
                      "\"epsilon_budget\":%.17g}}",
                      noise, s->dp.clip, s->dp.delta, fm_dp_mode_name(s->dp.mode), s->dp.budget) - 1;
    if (n >= 0 && (size_t)n < cap && s->secure_aggregation) /* (likewise) */
        n += snprintf(buf + n - 1, cap - (size_t)n + 1, ",\"secure_aggregation\":true}") - 1;
    if (n < 0 || (size_t)n >= cap || !fm_regime_any(&s->regime))
        return n < 0 ? 0 : (size_t)n;
    /* the regime, when set, as one more object (runs without one keep their old config text) */
    char ex[640], by[640], dom[256];
    fm_cap_name(&s->regime.examples, ex, sizeof ex);
    fm_cap_name(&s->regime.bytes, by, sizeof by);
    fm_domains_name(&s->regime.domains, dom, sizeof dom);
    int m = snprintf(buf + n - 1, cap - (size_t)n + 1,
                     ",\"regime\":{\"client_examples\":\"%s\",\"client_bytes\":\"%s\",\"domains\":\"%s\","
                     "\"concept_groups\":%d}}",
                     ex, by, dom, s->regime.concept_groups);
    return m < 0 ? (size_t)n : (size_t)n - 1 + (size_t)m;
}

uint32_t fm_run_eval_sample(const fm_run_spec_t *s, int round, int rounds)
{
    return round >= rounds ? 0 : (uint32_t)s->eval_sample;
}

size_t fm_federated_size(fm_model_t *m, fm_strategy s)
{
    fm_params_t *ps = fm_model_params(m);
    size_t n = 0;
    for (int i = 0; i < ps->count; i++)
        if (fm_strategy_federates(s, &ps->params[i]))
            n += ps->params[i].size;
    return n;
}

void fm_federated_pack(fm_model_t *m, fm_strategy s, float *out)
{
    fm_params_t *ps = fm_model_params(m);
    for (int i = 0; i < ps->count; i++)
        if (fm_strategy_federates(s, &ps->params[i])) {
            memcpy(out, ps->params[i].view->w, sizeof(float) * ps->params[i].size);
            out += ps->params[i].size;
        }
}

void fm_federated_unpack(fm_model_t *m, fm_strategy s, const float *in)
{
    fm_params_t *ps = fm_model_params(m);
    for (int i = 0; i < ps->count; i++)
        if (fm_strategy_federates(s, &ps->params[i])) {
            memcpy(ps->params[i].view->w, in, sizeof(float) * ps->params[i].size);
            in += ps->params[i].size;
        }
}
