#include "fedmoe/runspec_wire.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fedmoe/log.h"

static void spec_to_pb(const fm_run_spec_t *s, Fedmoe__ModelSpec *m, Fedmoe__TrainSpec *t, Fedmoe__DataSpec *d,
                       fm_regime_text_t *rt)
{
    const fm_model_config_t *c = &s->model;
    fedmoe__model_spec__init(m);
    m->in_dim = (uint32_t)c->in_dim;
    m->img_h = (uint32_t)c->img_h;
    m->img_w = (uint32_t)c->img_w;
    m->classes = (uint32_t)c->classes;
    m->stem = (char *)fm_stem_name(c->stem);
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
    m->gating_shared = c->gating_shared;
    m->specialists = (uint32_t)c->specialists;
    m->family = (char *)fm_family_name(c->family);
    m->context = (uint32_t)c->context;
    m->untied = c->untied;
    m->shared = (char *)fm_shared_name(c->shared);
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
    t->local_steps = (uint32_t)s->train.local_steps;
    fedmoe__data_spec__init(d);
    d->dataset = (char *)s->dataset;
    d->scheme = (char *)fm_partition_kind_name(s->part.kind);
    d->alpha = s->part.alpha;
    d->classes_per_client = (uint32_t)s->part.classes_per_client;
    d->min_samples = (uint32_t)s->part.min_samples;
    d->partition_count = (uint32_t)s->partition_count;
    d->holdout = s->holdout;
    d->data_seed = s->data_seed;
    fm_cap_name(&s->regime.examples, rt->examples, sizeof rt->examples);
    fm_cap_name(&s->regime.bytes, rt->bytes, sizeof rt->bytes);
    fm_domains_name(&s->regime.domains, rt->domains, sizeof rt->domains);
    d->client_examples = s->regime.examples.kind ? rt->examples : (char *)"";
    d->client_bytes = s->regime.bytes.kind ? rt->bytes : (char *)"";
    d->domains = s->regime.domains.n ? rt->domains : (char *)"";
    d->concept_groups = (uint32_t)s->regime.concept_groups;
}

void fm_run_spec_welcome(const fm_run_spec_t *s, const char *run_id, int32_t partition, uint32_t round,
                         fm_welcome_pb_t *w)
{
    spec_to_pb(s, &w->model, &w->train, &w->data, &w->regime);
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
    if (fm_strategy_parse("strategy", w->strategy, &s->strategy) != FM_OK)
        return FM_ERR_FORMAT;
    s->seed = w->seed;
    const Fedmoe__ModelSpec *m = w->model;
    fm_model_config_t *c = &s->model;
    c->in_dim = CAP_INT(m->in_dim, 1u << 24);
    c->img_h = CAP_INT(m->img_h, 1u << 16);
    c->img_w = CAP_INT(m->img_w, 1u << 16);
    c->classes = CAP_INT(m->classes, 256);
    if (fm_stem_parse("stem", m->stem, &c->stem) != FM_OK ||
        fm_family_parse("family", m->family && m->family[0] ? m->family : "image", &c->family) != FM_OK)
        return FM_ERR_FORMAT;
    c->context = CAP_INT(m->context, 4096);
    c->untied = m->untied;
    if (fm_shared_parse("shared", m->shared && m->shared[0] ? m->shared : "all", &c->shared) != FM_OK)
        return FM_ERR_FORMAT;
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
    c->gating_shared = m->gating_shared;
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
    s->train.local_steps = CAP_INT(t->local_steps, 1u << 30);
    s->local_epochs = CAP_INT(t->local_epochs, 1000);
    const Fedmoe__DataSpec *d = w->data;
    snprintf(s->dataset, sizeof s->dataset, "%s", d->dataset);
    if (fm_partition_kind_parse("scheme", d->scheme, &s->part.kind) != FM_OK)
        return FM_ERR_FORMAT;
    s->part.alpha = d->alpha;
    s->part.classes_per_client = CAP_INT(d->classes_per_client, 256);
    s->part.min_samples = d->min_samples;
    s->partition_count = CAP_INT(d->partition_count, 100000);
    s->holdout = d->holdout;
    s->data_seed = d->data_seed;
    if (fm_cap_parse("client_examples", d->client_examples, &s->regime.examples) != FM_OK ||
        fm_cap_parse("client_bytes", d->client_bytes, &s->regime.bytes) != FM_OK ||
        fm_domains_parse("domains", d->domains, &s->regime.domains) != FM_OK)
        return FM_ERR_FORMAT;
    s->regime.concept_groups = CAP_INT(d->concept_groups, FM_CONCEPT_GROUPS_MAX);
    fm_status st = fm_run_spec_finish(s);
    if (st == FM_OK && !(w->strategy && (c->gating == m->gating))) {
        fm_error_set("gating %d does not follow strategy %s", m->gating, w->strategy);
        return FM_ERR_FORMAT;
    }
    return st;
}

