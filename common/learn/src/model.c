/* model.c - the model front: configuration defaults and the checks every family
 * shares, the parameter registry's rules (group, level and decay from role and
 * kind; initial values by role and kind), and the public fm_model_* functions,
 * which dispatch to the configured family (model_family.h). The image family:
 * model_image.c. */
#include "fedmoe/model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/args.h"
#include "fedmoe/log.h"
#include "fedmoe/rng.h"
#include "model_internal.h"

/* Indexed by fm_model_family_kind. */
static const fm_model_family_t *const families[] = {&fm_family_image, &fm_family_text};
#define FAMILY_COUNT ((int)(sizeof families / sizeof families[0]))

FM_ARG_ENUM_NAMES(fm_stem_kind, fm_stem_name, fm_stem_parse, "mlp", "cnn")
FM_ARG_ENUM_NAMES(fm_model_family_kind, fm_family_name, fm_family_parse, "image", "text")
FM_ARG_ENUM_NAMES(fm_shared_kind, fm_shared_name, fm_shared_parse, "all", "experts")

void fm_model_config_default(fm_model_config_t *c)
{
    memset(c, 0, sizeof *c);
    c->family = FM_FAMILY_IMAGE;
    c->in_dim = 784;
    c->img_h = 28;
    c->img_w = 28;
    c->classes = 10;
    c->stem = FM_STEM_MLP;
    c->d = 128;
    c->blocks = 2;
    c->generalists = 1;
    c->specialists = 2;
    c->ffn_hidden = 256;
    c->top_k = 2;
    c->lb_weight = 0.01f;
    c->generalist_importance = 0.5f;
    c->prompt_len = 4;
    c->prompt_dim = 64;
    c->text_hidden = 256;
    c->heads = FM_IMAGE_HEADS;
    c->context = 128; /* (unused by images; kept: it is in their runs' logged configs, which resuming compares) */
    c->max_nonlocal = 4;
    c->attn_scale = 10.0f;
    c->lambda = 0.5f;
    c->tau = 10.0f;
    c->gating = true;
    c->gating_on_validation = false;
}

void fm_model_config_text(fm_model_config_t *c)
{
    c->family = FM_FAMILY_TEXT;
    c->d = 128;
    c->heads = FM_TEXT_HEADS;
    c->blocks = 2;
    c->context = FM_TEXT_CONTEXT;
    c->untied = false;
    c->classes = 256;
}

fm_status fm_model_config_check(const fm_model_config_t *c)
{
    FM_MODEL_REQUIRE((int)c->family >= 0 && (int)c->family < FAMILY_COUNT, "model: unknown family %d", (int)c->family);
    FM_MODEL_REQUIRE(c->shared == FM_SHARED_ALL || c->shared == FM_SHARED_EXPERTS, "model: unknown shared kind %d", (int)c->shared);
    FM_MODEL_REQUIRE(c->d >= 2 && c->d <= 4096, "model: width d %d out of range", c->d);
    FM_MODEL_REQUIRE(c->blocks >= 0 && c->blocks <= 64, "model: blocks %d out of range", c->blocks);
    FM_MODEL_REQUIRE(c->generalists >= 0 && c->specialists >= 0 && c->generalists + c->specialists >= 1 &&
                         c->generalists + c->specialists <= 64,
                     "model: need 1..64 experts (generalists %d + specialists %d)", c->generalists, c->specialists);
    FM_MODEL_REQUIRE(c->ffn_hidden >= 1 && c->ffn_hidden <= 65536, "model: ffn_hidden %d out of range", c->ffn_hidden);
    FM_MODEL_REQUIRE(c->top_k >= 1, "model: top_k must be at least 1");
    FM_MODEL_REQUIRE(c->generalist_importance >= 0.0f && c->generalist_importance <= 1.0f,
                     "model: generalist_importance must be in [0, 1]");
    FM_MODEL_REQUIRE(c->lb_weight >= 0.0f, "model: lb_weight must be >= 0");
    return families[c->family]->check(c);
}

double fm_model_config_parameters(const fm_model_config_t *c)
{
    return (int)c->family >= 0 && (int)c->family < FAMILY_COUNT ? families[c->family]->parameters(c) : 0.0;
}

/* ---- the parameter registry's rules ------------------------------------------ */

fm_status fm_model_add_param(fm_model_t *m, fm_view_t *view, fm_role role, fm_param_kind kind, int block,
                             int unit, int rows, int cols, const char *fmt, ...)
{
    char name[48];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    fm_param_spec_t s = {.role = role, .kind = kind, .block = block, .unit = unit, .rows = rows, .cols = cols};
    switch (role) {
    case FM_ROLE_SPECIALIST:
    case FM_ROLE_ROUTER: s.group = FM_GROUP_LOCAL; break;
    case FM_ROLE_GATING: s.group = m->cfg.gating_shared ? FM_GROUP_SHARED : FM_GROUP_LOCAL; break;
    case FM_ROLE_PROMPT: s.group = FM_GROUP_PROMPT; break;
    case FM_ROLE_GENERALIST: s.group = FM_GROUP_SHARED; break;
    default: s.group = m->cfg.shared == FM_SHARED_EXPERTS ? FM_GROUP_LOCAL : FM_GROUP_SHARED; break;
    }
    s.level = role == FM_ROLE_ROUTER ? FM_LEVEL_UPPER : role == FM_ROLE_GATING ? m->gate_level : FM_LEVEL_LOWER;
    /* AdamW decay on the matrices, not on biases, norms, routers or the prompt */
    s.decay = kind == FM_KIND_WEIGHT && role != FM_ROLE_ROUTER && role != FM_ROLE_PROMPT;
    return fm_params_add(&m->ps, view, name, &s);
}

/* Draws the initial values in registration order: the local group from the
 * client's stream, the others from the shared one. */
void fm_model_init_params(fm_model_t *m, uint64_t seed, uint64_t local_stream)
{
    fm_rng_t shared, local;
    fm_rng_init(&shared, seed, fm_rng_stream(FM_STREAM_INIT, 0));
    fm_rng_init(&local, seed, local_stream);
    for (int i = 0; i < m->ps.count; i++) {
        fm_param_t *p = &m->ps.params[i];
        fm_rng_t *r = p->group == FM_GROUP_LOCAL ? &local : &shared;
        float *w = p->view->w;
        if (p->kind == FM_KIND_NORM_GAIN) {
            for (size_t j = 0; j < p->size; j++)
                w[j] = 1.0f;
        } else if (p->kind == FM_KIND_NORM_BIAS || p->kind == FM_KIND_BIAS) {
            /* zero */
        } else if (p->role == FM_ROLE_PROMPT) {
            fm_rng_fill_uniform(r, w, p->size, 0.05f);
        } else if (p->role == FM_ROLE_ROUTER) {
            fm_rng_fill_uniform(r, w, p->size, 0.01f);
        } else {
            fm_rng_fill_uniform(r, w, p->size, 1.0f / sqrtf((float)p->cols));
        }
    }
}

/* ---- the batch workspace ------------------------------------------------------ */

void *fm_layout_take(fm_layout_t *L, size_t bytes)
{
    L->off = (L->off + 63) & ~(size_t)63;
    void *p = L->base ? L->base + L->off : NULL;
    L->off += bytes;
    return p;
}

static void *alloc_zeroed(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes) != 0)
        return NULL;
    memset(p, 0, bytes);
    return p;
}

double fm_workspace_measure(fm_workspace_t *ws, fm_model_t *m, int B, fm_layout_fn layout)
{
    fm_layout_t act = {NULL, 0}, grad = {NULL, 0};
    layout(m, B, &act, &grad); /* (measuring sets the buffer pointers: laid out again below) */
    double bytes = (double)act.off + (double)grad.off;
    fm_layout_t a = {ws->act, 0}, g = {ws->grad, 0};
    if (ws->B > 0)
        layout(m, ws->B, &a, &g);
    return bytes;
}

void fm_workspace_ensure(fm_workspace_t *ws, fm_model_t *m, int B, fm_layout_fn layout)
{
    if (B <= ws->B)
        return;
    fm_layout_t act = {NULL, 0}, grad = {NULL, 0};
    layout(m, B, &act, &grad);
    void *pa = alloc_zeroed(act.off + 64), *pg = alloc_zeroed(grad.off + 64);
    if (!pa || !pg) {
        fm_errorf("model: cannot allocate the workspace for batch %d", B);
        abort();
    }
    fm_workspace_free(ws);
    *ws = (fm_workspace_t){B, pa, pg};
    act = (fm_layout_t){pa, 0};
    grad = (fm_layout_t){pg, 0};
    layout(m, B, &act, &grad);
}

void fm_workspace_free(fm_workspace_t *ws)
{
    free(ws->act);
    free(ws->grad);
    *ws = (fm_workspace_t){0, NULL, NULL};
}

/* ---- dispatch ---------------------------------------------------------------- */

fm_status fm_model_new(fm_model_t **out, const fm_model_config_t *cfg, uint64_t seed, uint64_t local_stream)
{
    *out = NULL;
    fm_status st = fm_model_config_check(cfg);
    return st == FM_OK ? families[cfg->family]->create(out, cfg, seed, local_stream) : st;
}

void fm_model_destroy(fm_model_t **mp)
{
    if (!mp || !*mp)
        return;
    (*mp)->family->destroy(*mp);
    *mp = NULL;
}

const fm_model_config_t *fm_model_config(const fm_model_t *m) { return &m->cfg; }
fm_params_t *fm_model_params(fm_model_t *m) { return &m->ps; }

fm_status fm_model_accepts(const fm_model_t *m, const fm_dataset_t *ds, const char *who)
{
    return m->family->accepts(&m->cfg, ds, who);
}

fm_status fm_model_config_accepts(const fm_model_config_t *c, const fm_dataset_t *ds, const char *who)
{
    if ((int)c->family < 0 || (int)c->family >= FAMILY_COUNT)
        return fm_model_config_check(c);
    fm_status st = families[c->family]->accepts(c, ds, who); /* (what the data is, first) */
    return st == FM_OK ? fm_model_config_check(c) : st;
}

float fm_model_forward(fm_model_t *m, const fm_batch_t *b, bool with_lb, float *logits, fm_batch_stats_t *stats)
{
    return m->family->forward(m, b, with_lb, logits, stats);
}

void fm_model_backward(fm_model_t *m, int levels) { m->family->backward(m, levels); }
uint64_t fm_model_branch_signature(const fm_model_t *m) { return m->family->signature(m); }
void fm_model_anchor_specialists(fm_model_t *m, float rate) { m->family->anchor(m, rate); }

float *fm_model_prompt(fm_model_t *m) { return m->family->head ? m->family->head->prompt(m) : NULL; }
double fm_model_workspace_bytes(const fm_model_t *m, int B) { return m->family->workspace(m, B); }
int fm_model_predictions(const fm_model_t *m) { return m->family->predictions(&m->cfg); }

bool fm_model_config_has_head(const fm_model_config_t *c)
{
    return (int)c->family >= 0 && (int)c->family < FAMILY_COUNT && families[c->family]->head != NULL;
}

int fm_model_config_predictions(const fm_model_config_t *c)
{
    return (int)c->family >= 0 && (int)c->family < FAMILY_COUNT ? families[c->family]->predictions(c) : 1;
}

size_t fm_model_prompt_size(const fm_model_t *m) { return m->family->head ? m->family->head->prompt_size(m) : 0; }

const float *fm_model_text_features(fm_model_t *m)
{
    return m->family->head ? m->family->head->text_features(m) : NULL;
}

fm_status fm_model_set_nonlocal(fm_model_t *m, const float *prompts, int K)
{
    if (m->family->head)
        return m->family->head->set_nonlocal(m, prompts, K);
    if (K == 0)
        return FM_OK;
    fm_error_set("model: the %s family has no prompt head for non-local prompts", m->family->name);
    return FM_ERR_ARG;
}
