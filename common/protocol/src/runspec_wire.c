#include "fedmoe/runspec_wire.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fedmoe/log.h"

/* The run spec's plain fields beside their names in the Welcome, written once:
 * both directions are made from these lists. X(wire field, spec field, kind,
 * cap): INT travels as uint32 and is capped on the way in (a value above its
 * cap becomes -1, which the spec's checks refuse); SAME travels as it is.
 * What needs more than a copy (names of enums, the caps' text, gating,
 * specialists) is written beside the lists. */
#define MODEL_FIELDS(X)                                                                                        \
    X(in_dim, c->in_dim, INT, 1u << 24) X(img_h, c->img_h, INT, 1u << 16) X(img_w, c->img_w, INT, 1u << 16)  \
    X(classes, c->classes, INT, 256) X(d, c->d, INT, 4096) X(blocks, c->blocks, INT, 64)                      \
    X(generalists, c->generalists, INT, 64) X(ffn_hidden, c->ffn_hidden, INT, 65536)                          \
    X(top_k, c->top_k, INT, 64) X(prompt_len, c->prompt_len, INT, 4096) X(prompt_dim, c->prompt_dim, INT, 4096) \
    X(text_hidden, c->text_hidden, INT, 65536) X(heads, c->heads, INT, 4096)                                  \
    X(max_nonlocal, c->max_nonlocal, INT, 64) X(context, c->context, INT, 4096)                               \
    X(lb_weight, c->lb_weight, SAME, 0) X(generalist_importance, c->generalist_importance, SAME, 0)           \
    X(attn_scale, c->attn_scale, SAME, 0) X(lambda, c->lambda, SAME, 0) X(tau, c->tau, SAME, 0)               \
    X(untied, c->untied, SAME, 0) X(gating_on_validation, c->gating_on_validation, SAME, 0)                   \
    X(gating_shared, c->gating_shared, SAME, 0)
#define TRAIN_FIELDS(X)                                                                                        \
    X(batch, s->train.batch, INT, 65536) X(expert_steps, s->train.expert_steps, INT, 1u << 30)                \
    X(router_steps, s->train.router_steps, INT, 1u << 30) X(local_steps, s->train.local_steps, INT, 1u << 30) \
    X(local_epochs, s->local_epochs, INT, 1000) X(lr, s->train.lower.lr, SAME, 0)                             \
    X(router_lr, s->train.upper.lr, SAME, 0) X(weight_decay, s->train.lower.weight_decay, SAME, 0)           \
    X(lb_in_upper, s->train.lb_in_upper, SAME, 0) X(anchor, s->train.anchor, SAME, 0)
#define DATA_FIELDS(X)                                                                                         \
    X(alpha, s->part.alpha, SAME, 0) X(classes_per_client, s->part.classes_per_client, INT, 256)              \
    X(min_samples, s->part.min_samples, SAME, 0) X(partition_count, s->partition_count, INT, 100000)          \
    X(holdout, s->holdout, SAME, 0) X(data_seed, s->data_seed, SAME, 0)                                        \
    X(concept_groups, s->regime.concept_groups, INT, FM_CONCEPT_GROUPS_MAX)

#define TO_INT(v) ((uint32_t)(v))
#define TO_SAME(v) (v)
#define FROM_INT(v, hi) ((v) > (hi) ? -1 : (int)(v))
#define FROM_SAME(v, hi) (v)

static void spec_to_pb(const fm_run_spec_t *s, Fedmoe__ModelSpec *m, Fedmoe__TrainSpec *t, Fedmoe__DataSpec *d,
                       fm_regime_text_t *rt)
{
    const fm_model_config_t *c = &s->model;
    fedmoe__model_spec__init(m);
    fedmoe__train_spec__init(t);
    fedmoe__data_spec__init(d);
#define X(wire, field, kind, cap) m->wire = TO_##kind(field);
    MODEL_FIELDS(X)
#undef X
#define X(wire, field, kind, cap) t->wire = TO_##kind(field);
    TRAIN_FIELDS(X)
#undef X
#define X(wire, field, kind, cap) d->wire = TO_##kind(field);
    DATA_FIELDS(X)
#undef X
    m->stem = (char *)fm_stem_name(c->stem);
    m->gating = c->gating;
    m->specialists = (uint32_t)c->specialists;
    m->family = (char *)fm_family_name(c->family);
    m->shared = (char *)fm_shared_name(c->shared);
    d->dataset = (char *)s->dataset;
    d->scheme = (char *)fm_partition_kind_name(s->part.kind);
    fm_cap_name(&s->regime.examples, rt->examples, sizeof rt->examples);
    fm_cap_name(&s->regime.bytes, rt->bytes, sizeof rt->bytes);
    fm_domains_name(&s->regime.domains, rt->domains, sizeof rt->domains);
    d->client_examples = s->regime.examples.kind ? rt->examples : (char *)"";
    d->client_bytes = s->regime.bytes.kind ? rt->bytes : (char *)"";
    d->domains = s->regime.domains.n ? rt->domains : (char *)"";
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
    w->welcome.secure_aggregation = s->secure_aggregation;
    w->welcome.client_clip = fm_run_client_clip(s);
    w->welcome.client_noise = fm_run_client_noise(s);
}

/* The clients' own bound and noise (secure aggregation) back into the spec,
 * so that fm_run_client_clip and fm_run_client_noise give them again. */
static fm_status client_bounds(fm_run_spec_t *s, const Fedmoe__Welcome *w)
{
    double clip = w->client_clip, noise = w->client_noise;
    const char *why = NULL;
    if (!(clip >= 0.0 && clip <= 1e9) || !(noise >= 0.0 && noise <= 1e6))
        why = "client_clip must be in 0..1e9 and client_noise in 0..1e6";
    else if ((clip > 0.0 || noise > 0.0) && !w->secure_aggregation)
        why = "client_clip and client_noise come only with secure_aggregation";
    else if (noise > 0.0 && clip == 0.0)
        why = "client_noise needs client_clip, the bound the noise is scaled to";
    if (why) {
        fm_error_set("welcome: %s", why);
        return FM_ERR_FORMAT;
    }
    if (noise > 0.0) {
        s->dp.noise = noise;
        s->dp.clip = clip;
        s->dp.mode = FM_DP_DISTRIBUTED;
    } else {
        s->clip_norm = clip;
    }
    return FM_OK;
}

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
    s->secure_aggregation = w->secure_aggregation;
    if (client_bounds(s, w) != FM_OK)
        return FM_ERR_FORMAT;
    const Fedmoe__ModelSpec *m = w->model;
    const Fedmoe__TrainSpec *t = w->train;
    const Fedmoe__DataSpec *d = w->data;
    fm_model_config_t *c = &s->model;
#define X(wire, field, kind, cap) field = FROM_##kind(m->wire, cap);
    MODEL_FIELDS(X)
#undef X
#define X(wire, field, kind, cap) field = FROM_##kind(t->wire, cap);
    TRAIN_FIELDS(X)
#undef X
#define X(wire, field, kind, cap) field = FROM_##kind(d->wire, cap);
    DATA_FIELDS(X)
#undef X
    if (fm_stem_parse("stem", m->stem, &c->stem) != FM_OK ||
        fm_family_parse("family", m->family && m->family[0] ? m->family : "image", &c->family) != FM_OK ||
        fm_shared_parse("shared", m->shared && m->shared[0] ? m->shared : "all", &c->shared) != FM_OK)
        return FM_ERR_FORMAT;
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
    snprintf(s->dataset, sizeof s->dataset, "%s", d->dataset);
    if (fm_partition_kind_parse("scheme", d->scheme, &s->part.kind) != FM_OK ||
        fm_cap_parse("client_examples", d->client_examples, &s->regime.examples) != FM_OK ||
        fm_cap_parse("client_bytes", d->client_bytes, &s->regime.bytes) != FM_OK ||
        fm_domains_parse("domains", d->domains, &s->regime.domains) != FM_OK)
        return FM_ERR_FORMAT;
    fm_status st = fm_run_spec_finish(s);
    if (st == FM_OK && !(w->strategy && (c->gating == m->gating))) {
        fm_error_set("gating %d does not follow strategy %s", m->gating, w->strategy);
        return FM_ERR_FORMAT;
    }
    return st;
}
