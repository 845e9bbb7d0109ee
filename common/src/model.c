/* model.c - the model as a whole: configuration, create/destroy, the parameter
 * registry and initialisation (by role and kind), the batch workspace (two
 * arenas: activations and gradient scratch), and the forward/backward passes as a
 * list of component calls. The components: model_stem.c, model_moe.c,
 * model_head.c; their shared layout: model_internal.h. */
#include "fedmoe/model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/kernels.h"
#include "fedmoe/args.h"
#include "fedmoe/log.h"
#include "fedmoe/rng.h"
#include "model_internal.h"

static const char *stem_names[] = {"mlp", "cnn"};

const char *fm_stem_name(fm_stem_kind k) { return stem_names[k == FM_STEM_CNN]; }

fm_status fm_stem_parse(const char *flag, const char *name, fm_stem_kind *out)
{
    int i;
    fm_status st = fm_arg_choice(flag, name, stem_names, 2, &i);
    if (st == FM_OK)
        *out = i ? FM_STEM_CNN : FM_STEM_MLP;
    return st;
}

void fm_model_config_default(fm_model_config_t *c)
{
    memset(c, 0, sizeof *c);
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
    c->heads = 8;
    c->max_nonlocal = 4;
    c->attn_scale = 10.0f;
    c->lambda = 0.5f;
    c->tau = 10.0f;
    c->gating = true;
    c->gating_on_validation = false;
}

fm_status fm_model_config_check(const fm_model_config_t *c)
{
#define REQUIRE(cond, ...)           \
    do {                             \
        if (!(cond)) {               \
            fm_error_set(__VA_ARGS__); \
            return FM_ERR_ARG;       \
        }                            \
    } while (0)
    REQUIRE(c->in_dim > 0 && c->in_dim <= 1 << 20, "model: in_dim %d out of range", c->in_dim);
    REQUIRE(c->classes >= 2 && c->classes <= 256, "model: classes %d out of range (2..256)", c->classes);
    REQUIRE(c->d >= 2 && c->d <= 4096, "model: width d %d out of range", c->d);
    REQUIRE(c->blocks >= 0 && c->blocks <= 64, "model: blocks %d out of range", c->blocks);
    REQUIRE(c->generalists >= 0 && c->specialists >= 0 && c->generalists + c->specialists >= 1 &&
                c->generalists + c->specialists <= 64,
            "model: need 1..64 experts (generalists %d + specialists %d)", c->generalists, c->specialists);
    REQUIRE(c->ffn_hidden >= 1 && c->ffn_hidden <= 65536, "model: ffn_hidden %d out of range", c->ffn_hidden);
    REQUIRE(c->top_k >= 1, "model: top_k must be at least 1");
    REQUIRE(c->generalist_importance >= 0.0f && c->generalist_importance <= 1.0f,
            "model: generalist_importance must be in [0, 1]");
    REQUIRE(c->lb_weight >= 0.0f, "model: lb_weight must be >= 0");
    REQUIRE(c->prompt_len >= 1 && c->prompt_dim >= 1 && c->text_hidden >= 1, "model: prompt sizes must be positive");
    REQUIRE(c->heads >= 1 && c->d % c->heads == 0, "model: heads %d must divide d %d", c->heads, c->d);
    REQUIRE(c->max_nonlocal >= 0 && c->max_nonlocal <= 64, "model: max_nonlocal %d out of range", c->max_nonlocal);
    if (c->stem == FM_STEM_CNN) {
        REQUIRE(c->img_h * c->img_w == c->in_dim, "model: cnn stem needs in_dim = img_h * img_w");
        int h1 = c->img_h - CNN_K + 1, w1 = c->img_w - CNN_K + 1;
        REQUIRE(h1 > 0 && w1 > 0 && h1 % 2 == 0 && w1 % 2 == 0, "model: image %dx%d does not fit the cnn stem", c->img_h, c->img_w);
        int h2 = h1 / 2 - CNN_K + 1, w2 = w1 / 2 - CNN_K + 1;
        REQUIRE(h2 > 0 && w2 > 0 && h2 % 2 == 0 && w2 % 2 == 0, "model: image %dx%d does not fit the cnn stem", c->img_h, c->img_w);
    }
    return FM_OK;
#undef REQUIRE
}


const fm_model_config_t *fm_model_config(const fm_model_t *m) { return &m->cfg; }
fm_params_t *fm_model_params(fm_model_t *m) { return &m->ps; }
int fm_model_experts(const fm_model_t *m) { return m->E; }

/* ---- construction ---------------------------------------------------------- */

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
    case FM_ROLE_ROUTER:
    case FM_ROLE_GATING: s.group = FM_GROUP_LOCAL; break;
    case FM_ROLE_PROMPT: s.group = FM_GROUP_PROMPT; break;
    default: s.group = FM_GROUP_SHARED; break;
    }
    s.level = role == FM_ROLE_ROUTER ? FM_LEVEL_UPPER : role == FM_ROLE_GATING ? m->gate_level : FM_LEVEL_LOWER;
    /* AdamW decay on the matrices, not on biases, norms, routers or the prompt */
    s.decay = kind == FM_KIND_WEIGHT && role != FM_ROLE_ROUTER && role != FM_ROLE_PROMPT;
    return fm_params_add(&m->ps, view, name, &s);
}

/* Stem, blocks, head: this order is the layout of every group (and so of what
 * clients send and store); it must not change. */
static fm_status register_params(fm_model_t *m)
{
    fm_status st = fm_stem_register(m);
    for (int l = 0; l < m->cfg.blocks && st == FM_OK; l++)
        st = fm_moe_register(m, l);
    return st == FM_OK ? fm_head_register(m) : st;
}

/* Draws the initial values in registration order: the local group from the
 * client's stream, the others from the shared one. */
static void init_params(fm_model_t *m, uint64_t seed, uint64_t local_stream)
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

fm_status fm_model_new(fm_model_t **out, const fm_model_config_t *cfg, uint64_t seed, uint64_t local_stream)
{
    *out = NULL;
    fm_status st = fm_model_config_check(cfg);
    if (st != FM_OK)
        return st;
    fm_model_t *m = calloc(1, sizeof *m);
    if (!m)
        return FM_ERR_NOMEM;
    m->cfg = *cfg;
    m->E = cfg->generalists + cfg->specialists;
    m->k = cfg->top_k < m->E ? cfg->top_k : m->E;
    m->hd = cfg->d / cfg->heads;
    m->gate_level = cfg->gating_on_validation ? FM_LEVEL_UPPER : FM_LEVEL_LOWER;
    fm_stem_geometry(m);
    m->blocks = calloc(cfg->blocks ? cfg->blocks : 1, sizeof(fm_block_t));
    if (!m->blocks) {
        st = FM_ERR_NOMEM;
        goto fail;
    }
    for (int l = 0; l < cfg->blocks; l++) {
        m->blocks[l].experts = calloc(m->E, sizeof(fm_expert_t));
        if (!m->blocks[l].experts) {
            st = FM_ERR_NOMEM;
            goto fail;
        }
    }
    if ((st = register_params(m)) != FM_OK || (st = fm_params_alloc(&m->ps)) != FM_OK)
        goto fail;
    init_params(m, seed, local_stream);
    if ((st = fm_head_init_encoder(m, seed)) != FM_OK)
        goto fail;
    *out = m;
    return FM_OK;
fail:
    if (st == FM_ERR_NOMEM)
        fm_error_set("model: out of memory");
    fm_model_destroy(&m);
    return st;
}

void fm_model_destroy(fm_model_t **mp)
{
    if (!mp || !*mp)
        return;
    fm_model_t *m = *mp;
    if (m->blocks)
        for (int l = 0; l < m->cfg.blocks; l++)
            free(m->blocks[l].experts);
    free(m->blocks);
    fm_params_free(&m->ps);
    fm_head_free(m);
    free(m->act_arena);
    free(m->grad_arena);
    free(m);
    *mp = NULL;
}

/* ---- workspace ------------------------------------------------------------- */

void *fm_layout_take(fm_layout_t *L, size_t bytes)
{
    L->off = (L->off + 63) & ~(size_t)63;
    void *p = L->base ? L->base + L->off : NULL;
    L->off += bytes;
    return p;
}

/* Lays out every batch buffer in the two arenas (act, grad); with NULL bases it
 * only measures. */
static void layout_workspace(fm_model_t *m, int B, fm_layout_t *act, fm_layout_t *grad)
{
    FM_TAKE(act, m->h, float, (size_t)B * m->cfg.d);
    FM_TAKE(grad, m->dh, float, (size_t)B * m->cfg.d);
    fm_stem_layout(m, B, act, grad);
    fm_moe_layout(m, B, act, grad);
    fm_head_layout(m, B, act, grad);
}

static void *alloc_zeroed(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes) != 0)
        return NULL;
    memset(p, 0, bytes);
    return p;
}

static fm_status ensure_workspace(fm_model_t *m, int B)
{
    if (B <= m->ws_B)
        return FM_OK;
    fm_layout_t act = {NULL, 0}, grad = {NULL, 0};
    layout_workspace(m, B, &act, &grad);
    void *pa = alloc_zeroed(act.off + 64), *pg = alloc_zeroed(grad.off + 64);
    if (!pa || !pg) {
        free(pa);
        free(pg);
        return FM_ERR_NOMEM;
    }
    free(m->act_arena);
    free(m->grad_arena);
    m->act_arena = pa;
    m->grad_arena = pg;
    m->ws_B = B;
    act = (fm_layout_t){pa, 0};
    grad = (fm_layout_t){pg, 0};
    layout_workspace(m, B, &act, &grad);
    return FM_OK;
}

/* ---- forward and backward -------------------------------------------------- */

float fm_model_forward(fm_model_t *m, const float *x, const uint8_t *labels, int B, bool with_lb,
                       float *logits, fm_batch_stats_t *stats)
{
    const fm_model_config_t *c = &m->cfg;
    if (ensure_workspace(m, B) != FM_OK) {
        fm_errorf("model: cannot allocate the workspace for batch %d", B);
        abort();
    }
    int C = c->classes;
    m->B = B;
    m->x = x;
    m->labels = labels;
    m->with_lb = with_lb;
    fm_stem_forward(m, x, B);
    double gen_mass = 0.0;
    float lb = 0.0f;
    for (int l = 0; l < c->blocks; l++)
        lb += fm_moe_forward(m, &m->blocks[l], B, &gen_mass);
    fm_head_forward(m, B);
    int correct = 0;
    float ce = fm_cross_entropy(m->head.act.dlogits, &correct, m->head.act.logits, labels, B, C, 1.0f);
    if (logits)
        memcpy(logits, m->head.act.logits, sizeof(float) * B * C);
    if (stats) {
        stats->loss = ce;
        stats->lb_loss = lb;
        stats->correct = correct;
        stats->generalist_share = c->blocks ? (float)(gen_mass / ((double)B * c->blocks)) : 0.0f;
    }
    return ce + (with_lb ? c->lb_weight * lb : 0.0f);
}

void fm_model_backward(fm_model_t *m, int levels)
{
    const fm_model_config_t *c = &m->cfg;
    int B = m->B;
    bool lo = levels & FM_LEVEL_LOWER, up = levels & FM_LEVEL_UPPER;
    bool train_gate = (levels & m->gate_level) != 0;
    fm_head_backward(m, B, lo, train_gate);
    for (int l = c->blocks - 1; l >= 0; l--)
        fm_moe_backward(m, &m->blocks[l], B, lo, up, lo || l > 0);
    if (lo) {
        fm_stem_backward(m, B);
        fm_head_prompt_backward(m);
    }
}

uint64_t fm_model_branch_signature(const fm_model_t *m)
{
    uint64_t h = 1469598103934665603ull;
    int B = m->B;
    for (int l = 0; l < m->cfg.blocks; l++)
        for (int i = 0; i < B * m->k; i++)
            h = fm_sig_mix(h, (uint64_t)m->blocks[l].act.topi[i]);
    return fm_stem_signature(m, h);
}
