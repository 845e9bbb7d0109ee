#include "fedmoe/runspec.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fedmoe/log.h"

static const char *names[] = {"local", "fedavg", "comigs", "pfedmoap", "full"};

const char *fm_strategy_name(fm_strategy s) { return (unsigned)s < 5 ? names[s] : "?"; }

fm_status fm_strategy_parse(const char *name, fm_strategy *out)
{
    for (int i = 0; i < 5; i++)
        if (strcmp(name, names[i]) == 0) {
            *out = (fm_strategy)i;
            return FM_OK;
        }
    fm_error_set("strategy '%s' is not one of local, fedavg, comigs, pfedmoap, full", name);
    return FM_ERR_ARG;
}

const char *fm_lr_schedule_name(fm_lr_schedule s) { return s == FM_LR_COSINE ? "cosine" : "constant"; }

fm_status fm_lr_schedule_parse(const char *flag, const char *name, fm_lr_schedule *out)
{
    if (!strcmp(name, "constant"))
        *out = FM_LR_CONSTANT;
    else if (!strcmp(name, "cosine"))
        *out = FM_LR_COSINE;
    else {
        fm_error_set("%s: '%s' is not constant or cosine", flag, name);
        return FM_ERR_ARG;
    }
    return FM_OK;
}

float fm_lr_schedule_scale(fm_lr_schedule s, int round, int rounds)
{
    return s == FM_LR_COSINE ? fm_lr_cosine(round, rounds, FM_LR_COSINE_FLOOR) : 1.0f;
}

bool fm_strategy_shares_prompt(fm_strategy s) { return s != FM_STRATEGY_LOCAL; }
bool fm_strategy_uses_pool(fm_strategy s) { return s == FM_STRATEGY_PFEDMOAP || s == FM_STRATEGY_FULL; }
bool fm_strategy_averages_local(fm_strategy s) { return s == FM_STRATEGY_FEDAVG || s == FM_STRATEGY_PFEDMOAP; }

bool fm_strategy_federates(fm_strategy s, const fm_param_t *p)
{
    switch (s) {
    case FM_STRATEGY_LOCAL: return false;
    case FM_STRATEGY_COMIGS:
    case FM_STRATEGY_FULL: return p->group == FM_GROUP_SHARED;
    case FM_STRATEGY_FEDAVG:
    case FM_STRATEGY_PFEDMOAP:
        return p->group == FM_GROUP_SHARED || (p->group == FM_GROUP_LOCAL && p->role != FM_ROLE_GATING);
    }
    return false;
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
    if (s->local_epochs < 1 || s->local_epochs > 1000) {
        fm_error_set("local epochs %d out of range 1..1000", s->local_epochs);
        return FM_ERR_ARG;
    }
    if (s->train.batch < 1 || s->train.batch > 65536 || s->train.expert_steps < 1 || s->train.router_steps < 0 ||
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
    if (s->partition_count < 1 || s->partition_count > 100000) {
        fm_error_set("partition count %d out of range 1..100000", s->partition_count);
        return FM_ERR_ARG;
    }
    return FM_OK;
}

static const char *scheme_name(fm_partition_kind k)
{
    return k == FM_PARTITION_PATHOLOGICAL ? "pathological" : k == FM_PARTITION_IID ? "iid" : "dirichlet";
}

static void spec_to_pb(const fm_run_spec_t *s, Fedmoe__ModelSpec *m, Fedmoe__TrainSpec *t, Fedmoe__DataSpec *d)
{
    const fm_model_config_t *c = &s->model;
    fedmoe__model_spec__init(m);
    m->in_dim = (uint32_t)c->in_dim;
    m->img_h = (uint32_t)c->img_h;
    m->img_w = (uint32_t)c->img_w;
    m->classes = (uint32_t)c->classes;
    m->stem = c->stem == FM_STEM_CNN ? "cnn" : "mlp";
    m->d = (uint32_t)c->d;
    m->blocks = (uint32_t)c->blocks;
    m->generalists = (uint32_t)c->generalists;
    m->ffn_hidden = (uint32_t)c->ffn_hidden;
    m->top_k = (uint32_t)c->top_k;
    m->lb_weight = c->lb_weight;
    m->generalist_importance = c->generalist_importance;
    m->prompt_len = (uint32_t)c->prompt_len;
    m->prompt_dim = (uint32_t)c->prompt_dim;
    m->text_hidden = (uint32_t)c->text_hidden;
    m->heads = (uint32_t)c->heads;
    m->max_nonlocal = (uint32_t)c->max_nonlocal;
    m->attn_scale = c->attn_scale;
    m->lambda = c->lambda;
    m->tau = c->tau;
    m->gating = c->gating;
    m->gating_on_validation = c->gating_on_validation;
    m->specialists = (uint32_t)c->specialists;
    fedmoe__train_spec__init(t);
    t->batch = (uint32_t)s->train.batch;
    t->expert_steps = (uint32_t)s->train.expert_steps;
    t->router_steps = (uint32_t)s->train.router_steps;
    t->lr = s->train.lower.lr;
    t->router_lr = s->train.upper.lr;
    t->weight_decay = s->train.lower.weight_decay;
    t->local_epochs = (uint32_t)s->local_epochs;
    t->lb_in_upper = s->train.lb_in_upper;
    t->anchor = s->train.anchor;
    fedmoe__data_spec__init(d);
    d->dataset = (char *)s->dataset;
    d->scheme = (char *)scheme_name(s->part.kind);
    d->alpha = s->part.alpha;
    d->classes_per_client = (uint32_t)s->part.classes_per_client;
    d->min_samples = (uint32_t)s->part.min_samples;
    d->partition_count = (uint32_t)s->partition_count;
    d->holdout = s->holdout;
}

void fm_run_spec_welcome(const fm_run_spec_t *s, const char *run_id, int32_t partition, uint32_t round,
                         fm_welcome_pb_t *w)
{
    spec_to_pb(s, &w->model, &w->train, &w->data);
    fedmoe__welcome__init(&w->welcome);
    w->welcome.run_id = (char *)run_id;
    w->welcome.seed = s->seed;
    w->welcome.model = &w->model;
    w->welcome.train = &w->train;
    w->welcome.data = &w->data;
    w->welcome.partition_index = partition;
    w->welcome.round = round;
    w->welcome.strategy = (char *)fm_strategy_name(s->strategy);
}

#define CAP_INT(v, hi) ((v) > (hi) ? -1 : (int)(v))

fm_status fm_run_spec_from_welcome(fm_run_spec_t *s, const Fedmoe__Welcome *w, int specialists)
{
    fm_run_spec_default(s);
    if (!w->model || !w->train || !w->data) {
        fm_error_set("welcome without model, train or data spec");
        return FM_ERR_FORMAT;
    }
    if (fm_strategy_parse(w->strategy, &s->strategy) != FM_OK)
        return FM_ERR_FORMAT;
    s->seed = w->seed;
    const Fedmoe__ModelSpec *m = w->model;
    fm_model_config_t *c = &s->model;
    c->in_dim = CAP_INT(m->in_dim, 1u << 24);
    c->img_h = CAP_INT(m->img_h, 1u << 16);
    c->img_w = CAP_INT(m->img_w, 1u << 16);
    c->classes = CAP_INT(m->classes, 256);
    if (strcmp(m->stem, "mlp") == 0)
        c->stem = FM_STEM_MLP;
    else if (strcmp(m->stem, "cnn") == 0)
        c->stem = FM_STEM_CNN;
    else {
        fm_error_set("unknown stem '%.20s'", m->stem);
        return FM_ERR_FORMAT;
    }
    c->d = CAP_INT(m->d, 4096);
    c->blocks = CAP_INT(m->blocks, 64);
    c->generalists = CAP_INT(m->generalists, 64);
    c->ffn_hidden = CAP_INT(m->ffn_hidden, 65536);
    c->top_k = CAP_INT(m->top_k, 64);
    c->lb_weight = m->lb_weight;
    c->generalist_importance = m->generalist_importance;
    c->prompt_len = CAP_INT(m->prompt_len, 4096);
    c->prompt_dim = CAP_INT(m->prompt_dim, 4096);
    c->text_hidden = CAP_INT(m->text_hidden, 65536);
    c->heads = CAP_INT(m->heads, 4096);
    c->max_nonlocal = CAP_INT(m->max_nonlocal, 64);
    c->attn_scale = m->attn_scale;
    c->lambda = m->lambda;
    c->tau = m->tau;
    c->gating_on_validation = m->gating_on_validation;
    c->specialists = specialists;
    if (fm_strategy_averages_local(s->strategy) && (uint32_t)specialists != m->specialists) {
        fm_error_set("strategy %s averages specialists: the run needs %u per client, this client has %d",
                     w->strategy, m->specialists, specialists);
        return FM_ERR_ARG;
    }
    if (!isfinite(c->lb_weight) || !isfinite(c->attn_scale) || !isfinite(c->lambda) || !isfinite(c->tau) ||
        !isfinite(c->generalist_importance)) {
        fm_error_set("model spec has non-finite values");
        return FM_ERR_FORMAT;
    }
    const Fedmoe__TrainSpec *t = w->train;
    s->train.batch = CAP_INT(t->batch, 65536);
    s->train.expert_steps = CAP_INT(t->expert_steps, 1u << 30);
    s->train.router_steps = CAP_INT(t->router_steps, 1u << 30);
    s->train.lower.lr = t->lr;
    s->train.upper.lr = t->router_lr;
    s->train.lower.weight_decay = t->weight_decay;
    s->train.lb_in_upper = t->lb_in_upper;
    s->train.anchor = t->anchor;
    s->local_epochs = CAP_INT(t->local_epochs, 1000);
    const Fedmoe__DataSpec *d = w->data;
    snprintf(s->dataset, sizeof s->dataset, "%s", d->dataset);
    if (strcmp(d->scheme, "dirichlet") == 0)
        s->part.kind = FM_PARTITION_DIRICHLET;
    else if (strcmp(d->scheme, "pathological") == 0)
        s->part.kind = FM_PARTITION_PATHOLOGICAL;
    else if (strcmp(d->scheme, "iid") == 0)
        s->part.kind = FM_PARTITION_IID;
    else {
        fm_error_set("unknown partition scheme '%.20s'", d->scheme);
        return FM_ERR_FORMAT;
    }
    s->part.alpha = d->alpha;
    s->part.classes_per_client = CAP_INT(d->classes_per_client, 256);
    s->part.min_samples = d->min_samples;
    s->partition_count = CAP_INT(d->partition_count, 100000);
    s->holdout = d->holdout;
    fm_status st = fm_run_spec_finish(s);
    if (st == FM_OK && !(w->strategy && (c->gating == m->gating))) {
        fm_error_set("gating %d does not follow strategy %s", m->gating, w->strategy);
        return FM_ERR_FORMAT;
    }
    return st;
}

size_t fm_run_spec_json(const fm_run_spec_t *s, char *buf, size_t cap)
{
    const fm_model_config_t *c = &s->model;
    int n = snprintf(
        buf, cap,
        "{\"strategy\":\"%s\",\"seed\":%llu,\"dataset\":\"%s\",\"partition\":{\"scheme\":\"%s\",\"alpha\":%g,"
        "\"classes_per_client\":%d,\"min_samples\":%zu,\"count\":%d,\"holdout\":%s},"
        "\"model\":{\"stem\":\"%s\",\"in_dim\":%d,\"classes\":%d,\"d\":%d,\"blocks\":%d,\"generalists\":%d,"
        "\"specialists\":%d,\"ffn_hidden\":%d,\"top_k\":%d,\"lb_weight\":%g,\"generalist_importance\":%g,"
        "\"prompt_len\":%d,\"prompt_dim\":%d,\"text_hidden\":%d,\"heads\":%d,\"max_nonlocal\":%d,"
        "\"attn_scale\":%g,\"lambda\":%g,\"tau\":%g,\"gating\":%s,\"gating_on_validation\":%s},"
        "\"train\":{\"batch\":%d,\"expert_steps\":%d,\"router_steps\":%d,\"lr\":%g,\"router_lr\":%g,"
        "\"weight_decay\":%g,\"local_epochs\":%d,\"lb_in_upper\":%s,\"anchor\":%g,\"lr_schedule\":\"%s\"}}",
        fm_strategy_name(s->strategy), (unsigned long long)s->seed, s->dataset, scheme_name(s->part.kind),
        s->part.alpha, s->part.classes_per_client, s->part.min_samples, s->partition_count, s->holdout ? "true" : "false",
        c->stem == FM_STEM_CNN ? "cnn" : "mlp", c->in_dim, c->classes, c->d, c->blocks, c->generalists,
        c->specialists, c->ffn_hidden, c->top_k, c->lb_weight, c->generalist_importance, c->prompt_len,
        c->prompt_dim, c->text_hidden, c->heads, c->max_nonlocal, c->attn_scale, c->lambda, c->tau,
        c->gating ? "true" : "false", c->gating_on_validation ? "true" : "false", s->train.batch,
        s->train.expert_steps, s->train.router_steps, s->train.lower.lr, s->train.upper.lr,
        s->train.lower.weight_decay, s->local_epochs, s->train.lb_in_upper ? "true" : "false",
        s->train.anchor, fm_lr_schedule_name(s->lr_schedule));
    return n < 0 ? 0 : (size_t)n;
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
