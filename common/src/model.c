#include "fedmoe/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/kernels.h"
#include "fedmoe/log.h"
#include "fedmoe/rng.h"

#define CNN_K 5    /* convolution kernel size */
#define CNN_C1 32  /* channels of the first convolution */
#define CNN_C2 64  /* channels of the second convolution */

typedef struct {
    fm_view_t w1, b1, w2, b2; /* w1 (H,d), b1 (H), w2 (d,H), b2 (d) */
} expert_t;

typedef struct {
    fm_view_t ln_g, ln_b, router; /* router (E,d) */
    expert_t *experts;            /* E = G + S */
    /* activations of the last forward */
    float *xhat, *rstd, *u;       /* (B,d), (B), (B,d) */
    float *rlog, *pfull;          /* router logits and their full softmax (B,E) */
    int *topi;                    /* kept experts (B,k) */
    float *topw;                  /* their weights (B,k) */
    int *off;                     /* (E+1): rows of expert e are off[e]..off[e+1] */
    int *row_b, *row_slot;        /* (B*k): input and slot of each expert row */
    float *ug, *a, *ga, *y;       /* gathered u (B*k,d), pre-act (B*k,H), GELU (B*k,H), out (B*k,d) */
    float *frac;                  /* fraction of dispatches per expert (E) */
} block_t;

struct fm_model {
    fm_model_config_t cfg;
    int E, k, hd;                 /* experts per block, kept per input, head width */
    fm_params_t ps;
    fm_level gate_level;
    /* parameters */
    fm_view_t stem_w, stem_b;                 /* mlp: (d,in), (d) */
    fm_view_t c1_w, c1_b, c2_w, c2_b;         /* cnn: (32,25), (32), (64,800), (64) */
    fm_view_t fc_w, fc_b;                     /* cnn: (d, flat), (d) */
    block_t *blocks;
    fm_view_t lnf_g, lnf_b;
    fm_view_t prompt;                         /* (M, dp) */
    fm_view_t wq, bq, wk, bk, wv, bv, wo, bo; /* gating, (d,d) and (d) */
    /* frozen class-text encoder */
    float *emb;                   /* (C, dp) */
    float *wa, *ba;               /* (Ht, (M+1)dp), (Ht) */
    float *wb, *bb;               /* (d, Ht), (d) */
    /* non-local prompts and their text features */
    int K;
    float *nl_prompts;            /* (max_nonlocal, M*dp) */
    float *tall;                  /* ((1+max_nonlocal)*C, d): row j*C+c = t_c(P_j), j=0 local */
    /* cnn geometry */
    int c1h, c1w, p1h, p1w, c2h, c2w, p2h, p2w, flat;
    /* workspace for batches up to ws_B */
    int ws_B;
    void *arena;
    int B;
    const float *x;
    const uint8_t *labels;
    bool gated, with_lb;
    float *z0, *h;                /* stem pre-activation (B,d), residual stream (B,d) */
    float *cols1, *cc1, *rr1, *pp1, *cols2, *cc2, *rr2, *pp2; /* cnn activations */
    int32_t *arg1, *arg2;
    float *xhatf, *rstdf, *f, *fnorm, *nf;    /* final LayerNorm, feature norms, f/|f| */
    float *tv, *tza, *tga, *to, *tonorm;      /* local text encoder activations */
    float *c1, *logits, *dlogits;             /* (B,C) */
    float *q, *gq, *kp, *vp;                  /* (B,d), (B,d), (J*C,d), (J*C,d) */
    float *att, *vdot;                        /* (heads, B, J*C): column j*C + c */
    float *datt, *dvdot;                      /* their gradients, same layout */
    /* backward scratch */
    float *dh, *du, *df, *dnf, *dr, *dw, *dyg, *dg, *dug, *dz0;
    float *dc1, *dtl, *dq, *dgq, *dkp, *dvp;
    float *dcols2, *dpp1, *drr1, *dpp2, *drr2;
    float *dto, *dga, *dv;
};

fm_status fm_stem_parse(const char *flag, const char *name, fm_stem_kind *out)
{
    if (strcmp(name, "mlp") == 0)
        *out = FM_STEM_MLP;
    else if (strcmp(name, "cnn") == 0)
        *out = FM_STEM_CNN;
    else {
        fm_error_set("%s: '%s' is not mlp or cnn", flag, name);
        return FM_ERR_ARG;
    }
    return FM_OK;
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

/* Tensor t (0..3: w1, b1, w2, b2) of an expert, and its length. */
static fm_view_t *expert_tensor(expert_t *ex, int t) { return t == 0 ? &ex->w1 : t == 1 ? &ex->b1 : t == 2 ? &ex->w2 : &ex->b2; }

void fm_model_anchor_specialists(fm_model_t *m, float rate)
{
    const fm_model_config_t *c = &m->cfg;
    int G = c->generalists;
    if (rate == 0.0f || G < 1)
        return;
    const size_t len[4] = {(size_t)c->ffn_hidden * c->d, (size_t)c->ffn_hidden, (size_t)c->d * c->ffn_hidden,
                           (size_t)c->d};
    float inv = 1.0f / (float)G;
    for (int l = 0; l < c->blocks; l++) {
        expert_t *ex = m->blocks[l].experts;
        for (int t = 0; t < 4; t++) {
            const float *g0 = expert_tensor(&ex[0], t)->w;
            for (int e = G; e < m->E; e++) {
                float *w = expert_tensor(&ex[e], t)->w;
                for (size_t i = 0; i < len[t]; i++) {
                    float mean = g0[i];
                    for (int g = 1; g < G; g++)
                        mean += expert_tensor(&ex[g], t)->w[i];
                    w[i] -= rate * (w[i] - mean * inv);
                }
            }
        }
    }
}

int fm_model_nonlocal_count(const fm_model_t *m) { return m->K; }

/* ---- construction ---------------------------------------------------------- */

static fm_status register_params(fm_model_t *m)
{
    const fm_model_config_t *c = &m->cfg;
    fm_params_t *ps = &m->ps;
    char name[48];
    fm_status st = FM_OK;
#define ADD(view, nm, grp, lvl, r, cl, dec)                                          \
    do {                                                                             \
        if ((st = fm_params_add(ps, &(view), nm, grp, lvl, r, cl, dec)) != FM_OK)    \
            return st;                                                               \
    } while (0)
    if (c->stem == FM_STEM_MLP) {
        ADD(m->stem_w, "stem.w", FM_GROUP_SHARED, FM_LEVEL_LOWER, c->d, c->in_dim, true);
        ADD(m->stem_b, "stem.b", FM_GROUP_SHARED, FM_LEVEL_LOWER, 1, c->d, false);
    } else {
        ADD(m->c1_w, "stem.conv1.w", FM_GROUP_SHARED, FM_LEVEL_LOWER, CNN_C1, CNN_K * CNN_K, true);
        ADD(m->c1_b, "stem.conv1.b", FM_GROUP_SHARED, FM_LEVEL_LOWER, 1, CNN_C1, false);
        ADD(m->c2_w, "stem.conv2.w", FM_GROUP_SHARED, FM_LEVEL_LOWER, CNN_C2, CNN_K * CNN_K * CNN_C1, true);
        ADD(m->c2_b, "stem.conv2.b", FM_GROUP_SHARED, FM_LEVEL_LOWER, 1, CNN_C2, false);
        ADD(m->fc_w, "stem.fc.w", FM_GROUP_SHARED, FM_LEVEL_LOWER, c->d, m->flat, true);
        ADD(m->fc_b, "stem.fc.b", FM_GROUP_SHARED, FM_LEVEL_LOWER, 1, c->d, false);
    }
    for (int l = 0; l < c->blocks; l++) {
        block_t *bl = &m->blocks[l];
        snprintf(name, sizeof name, "block%d.ln.g", l);
        ADD(bl->ln_g, name, FM_GROUP_SHARED, FM_LEVEL_LOWER, 1, c->d, false);
        snprintf(name, sizeof name, "block%d.ln.b", l);
        ADD(bl->ln_b, name, FM_GROUP_SHARED, FM_LEVEL_LOWER, 1, c->d, false);
        snprintf(name, sizeof name, "block%d.router", l);
        ADD(bl->router, name, FM_GROUP_LOCAL, FM_LEVEL_UPPER, m->E, c->d, false);
        for (int e = 0; e < m->E; e++) {
            fm_group_id g = e < c->generalists ? FM_GROUP_SHARED : FM_GROUP_LOCAL;
            expert_t *ex = &bl->experts[e];
            snprintf(name, sizeof name, "block%d.expert%d.w1", l, e);
            ADD(ex->w1, name, g, FM_LEVEL_LOWER, c->ffn_hidden, c->d, true);
            snprintf(name, sizeof name, "block%d.expert%d.b1", l, e);
            ADD(ex->b1, name, g, FM_LEVEL_LOWER, 1, c->ffn_hidden, false);
            snprintf(name, sizeof name, "block%d.expert%d.w2", l, e);
            ADD(ex->w2, name, g, FM_LEVEL_LOWER, c->d, c->ffn_hidden, true);
            snprintf(name, sizeof name, "block%d.expert%d.b2", l, e);
            ADD(ex->b2, name, g, FM_LEVEL_LOWER, 1, c->d, false);
        }
    }
    ADD(m->lnf_g, "feature.ln.g", FM_GROUP_SHARED, FM_LEVEL_LOWER, 1, c->d, false);
    ADD(m->lnf_b, "feature.ln.b", FM_GROUP_SHARED, FM_LEVEL_LOWER, 1, c->d, false);
    ADD(m->prompt, "prompt", FM_GROUP_PROMPT, FM_LEVEL_LOWER, c->prompt_len, c->prompt_dim, false);
    fm_level gl = m->gate_level;
    ADD(m->wq, "gating.wq", FM_GROUP_LOCAL, gl, c->d, c->d, true);
    ADD(m->bq, "gating.bq", FM_GROUP_LOCAL, gl, 1, c->d, false);
    ADD(m->wk, "gating.wk", FM_GROUP_LOCAL, gl, c->d, c->d, true);
    ADD(m->bk, "gating.bk", FM_GROUP_LOCAL, gl, 1, c->d, false);
    ADD(m->wv, "gating.wv", FM_GROUP_LOCAL, gl, c->d, c->d, true);
    ADD(m->bv, "gating.bv", FM_GROUP_LOCAL, gl, 1, c->d, false);
    ADD(m->wo, "gating.wo", FM_GROUP_LOCAL, gl, c->d, c->d, true);
    ADD(m->bo, "gating.bo", FM_GROUP_LOCAL, gl, 1, c->d, false);
#undef ADD
    return FM_OK;
}

static void init_params(fm_model_t *m, uint64_t seed, uint64_t local_stream)
{
    fm_rng_t shared, local;
    fm_rng_init(&shared, seed, FM_STREAM_INIT);
    fm_rng_init(&local, seed, local_stream);
    for (int i = 0; i < m->ps.count; i++) {
        fm_param_t *p = &m->ps.params[i];
        fm_rng_t *r = p->group == FM_GROUP_LOCAL ? &local : &shared;
        float *w = p->view->w;
        const char *dot = strrchr(p->name, '.');
        if (strstr(p->name, ".ln.g")) {
            for (size_t j = 0; j < p->size; j++)
                w[j] = 1.0f;
        } else if (strstr(p->name, ".ln.b")) {
            /* zero */
        } else if (p->group == FM_GROUP_PROMPT) {
            fm_rng_fill_uniform(r, w, p->size, 0.05f);
        } else if (strstr(p->name, "router")) {
            fm_rng_fill_uniform(r, w, p->size, 0.01f);
        } else if (dot && dot[1] == 'b') {
            /* biases: zero */
        } else {
            fm_rng_fill_uniform(r, w, p->size, 1.0f / sqrtf((float)p->cols));
        }
    }
}

static fm_status init_encoder(fm_model_t *m, uint64_t seed)
{
    const fm_model_config_t *c = &m->cfg;
    int C = c->classes, dp = c->prompt_dim, Ht = c->text_hidden, in = (c->prompt_len + 1) * dp;
    m->emb = malloc(sizeof(float) * C * dp);
    m->wa = malloc(sizeof(float) * Ht * in);
    m->ba = malloc(sizeof(float) * Ht);
    m->wb = malloc(sizeof(float) * c->d * Ht);
    m->bb = malloc(sizeof(float) * c->d);
    m->nl_prompts = calloc((size_t)(c->max_nonlocal ? c->max_nonlocal : 1) * c->prompt_len * dp, sizeof(float));
    m->tall = calloc((size_t)(1 + c->max_nonlocal) * C * c->d, sizeof(float));
    if (!m->emb || !m->wa || !m->ba || !m->wb || !m->bb || !m->nl_prompts || !m->tall)
        return FM_ERR_NOMEM;
    fm_rng_t r;
    fm_rng_init(&r, seed, FM_STREAM_ENCODER);
    fm_rng_fill_uniform(&r, m->emb, (size_t)C * dp, sqrtf(3.0f));
    fm_rng_fill_uniform(&r, m->wa, (size_t)Ht * in, sqrtf(3.0f / (float)in));
    fm_rng_fill_uniform(&r, m->ba, (size_t)Ht, 0.1f);
    fm_rng_fill_uniform(&r, m->wb, (size_t)c->d * Ht, sqrtf(3.0f / (float)Ht));
    fm_rng_fill_uniform(&r, m->bb, (size_t)c->d, 0.1f);
    return FM_OK;
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
    if (cfg->stem == FM_STEM_CNN) {
        m->c1h = cfg->img_h - CNN_K + 1;
        m->c1w = cfg->img_w - CNN_K + 1;
        m->p1h = m->c1h / 2;
        m->p1w = m->c1w / 2;
        m->c2h = m->p1h - CNN_K + 1;
        m->c2w = m->p1w - CNN_K + 1;
        m->p2h = m->c2h / 2;
        m->p2w = m->c2w / 2;
        m->flat = m->p2h * m->p2w * CNN_C2;
    }
    m->blocks = calloc(cfg->blocks ? cfg->blocks : 1, sizeof(block_t));
    if (!m->blocks) {
        st = FM_ERR_NOMEM;
        goto fail;
    }
    for (int l = 0; l < cfg->blocks; l++) {
        m->blocks[l].experts = calloc(m->E, sizeof(expert_t));
        if (!m->blocks[l].experts) {
            st = FM_ERR_NOMEM;
            goto fail;
        }
    }
    if ((st = register_params(m)) != FM_OK || (st = fm_params_alloc(&m->ps)) != FM_OK)
        goto fail;
    init_params(m, seed, local_stream);
    if ((st = init_encoder(m, seed)) != FM_OK)
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
    free(m->emb);
    free(m->wa);
    free(m->ba);
    free(m->wb);
    free(m->bb);
    free(m->nl_prompts);
    free(m->tall);
    free(m->arena);
    free(m);
    *mp = NULL;
}

/* ---- workspace ------------------------------------------------------------- */

/* Lays out every batch buffer in one arena; with base == NULL it only measures. */
static size_t layout_workspace(fm_model_t *m, int B, char *base)
{
    const fm_model_config_t *c = &m->cfg;
    size_t off = 0;
#define TAKE(ptr, type, count)                                     \
    do {                                                           \
        off = (off + 63) & ~(size_t)63;                            \
        if (base)                                                  \
            (ptr) = (type *)(void *)(base + off);                  \
        off += sizeof(type) * (size_t)(count);                     \
    } while (0)
    int d = c->d, E = m->E, k = m->k, Hf = c->ffn_hidden, C = c->classes;
    int J = 1 + c->max_nonlocal, Ht = c->text_hidden, tin = (c->prompt_len + 1) * c->prompt_dim;
    size_t Bk = (size_t)B * k;
    TAKE(m->z0, float, B * d);
    TAKE(m->h, float, B * d);
    if (c->stem == FM_STEM_CNN) {
        size_t n1 = (size_t)B * m->c1h * m->c1w, n2 = (size_t)B * m->c2h * m->c2w;
        TAKE(m->cols1, float, n1 * CNN_K * CNN_K);
        TAKE(m->cc1, float, n1 * CNN_C1);
        TAKE(m->rr1, float, n1 * CNN_C1);
        TAKE(m->pp1, float, (size_t)B * m->p1h * m->p1w * CNN_C1);
        TAKE(m->arg1, int32_t, (size_t)B * m->p1h * m->p1w * CNN_C1);
        TAKE(m->cols2, float, n2 * CNN_K * CNN_K * CNN_C1);
        TAKE(m->cc2, float, n2 * CNN_C2);
        TAKE(m->rr2, float, n2 * CNN_C2);
        TAKE(m->pp2, float, (size_t)B * m->flat);
        TAKE(m->arg2, int32_t, (size_t)B * m->flat);
        TAKE(m->dcols2, float, n2 * CNN_K * CNN_K * CNN_C1);
        TAKE(m->dpp1, float, (size_t)B * m->p1h * m->p1w * CNN_C1);
        TAKE(m->drr1, float, n1 * CNN_C1);
        TAKE(m->dpp2, float, (size_t)B * m->flat);
        TAKE(m->drr2, float, n2 * CNN_C2);
    }
    for (int l = 0; l < c->blocks; l++) {
        block_t *bl = &m->blocks[l];
        TAKE(bl->xhat, float, B * d);
        TAKE(bl->rstd, float, B);
        TAKE(bl->u, float, B * d);
        TAKE(bl->rlog, float, B * E);
        TAKE(bl->pfull, float, B * E);
        TAKE(bl->topi, int, Bk);
        TAKE(bl->topw, float, Bk);
        TAKE(bl->off, int, E + 1);
        TAKE(bl->row_b, int, Bk);
        TAKE(bl->row_slot, int, Bk);
        TAKE(bl->ug, float, Bk * d);
        TAKE(bl->a, float, Bk * Hf);
        TAKE(bl->ga, float, Bk * Hf);
        TAKE(bl->y, float, Bk * d);
        TAKE(bl->frac, float, E);
    }
    TAKE(m->xhatf, float, B * d);
    TAKE(m->rstdf, float, B);
    TAKE(m->f, float, B * d);
    TAKE(m->fnorm, float, B);
    TAKE(m->nf, float, B * d);
    TAKE(m->tv, float, C * tin);
    TAKE(m->tza, float, C * Ht);
    TAKE(m->tga, float, C * Ht);
    TAKE(m->to, float, C * d);
    TAKE(m->tonorm, float, C);
    TAKE(m->c1, float, B * C);
    TAKE(m->logits, float, B * C);
    TAKE(m->dlogits, float, B * C);
    TAKE(m->q, float, B * d);
    TAKE(m->gq, float, B * d);
    TAKE(m->kp, float, J * C * d);
    TAKE(m->vp, float, J * C * d);
    TAKE(m->att, float, (size_t)B * C * c->heads * J);
    TAKE(m->vdot, float, (size_t)B * C * c->heads * J);
    TAKE(m->datt, float, (size_t)B * C * c->heads * J);
    TAKE(m->dvdot, float, (size_t)B * C * c->heads * J);
    TAKE(m->dh, float, B * d);
    TAKE(m->du, float, B * d);
    TAKE(m->df, float, B * d);
    TAKE(m->dnf, float, B * d);
    TAKE(m->dr, float, B * E);
    TAKE(m->dw, float, Bk);
    TAKE(m->dyg, float, Bk * d);
    TAKE(m->dg, float, Bk * Hf);
    TAKE(m->dug, float, Bk * d);
    TAKE(m->dz0, float, B * d);
    TAKE(m->dc1, float, B * C);
    TAKE(m->dtl, float, C * d);
    TAKE(m->dq, float, B * d);
    TAKE(m->dgq, float, B * d);
    TAKE(m->dkp, float, J * C * d);
    TAKE(m->dvp, float, J * C * d);
    TAKE(m->dto, float, C * d);
    TAKE(m->dga, float, C * Ht);
    TAKE(m->dv, float, C * tin);
#undef TAKE
    return off + 64;
}

static fm_status ensure_workspace(fm_model_t *m, int B)
{
    if (B <= m->ws_B)
        return FM_OK;
    size_t bytes = layout_workspace(m, B, NULL);
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes) != 0)
        return FM_ERR_NOMEM;
    memset(p, 0, bytes);
    free(m->arena);
    m->arena = p;
    m->ws_B = B;
    layout_workspace(m, B, p);
    return FM_OK;
}

/* ---- class-text encoder ---------------------------------------------------- */

/* t (C,d) = normalize(wb GELU(wa [P; e_c] + ba) + bb); keeps activations in the
 * given buffers for the backward of the local prompt. */
static void text_forward(const fm_model_t *m, const float *P, float *v, float *za, float *ga,
                         float *o, float *onorm, float *t)
{
    const fm_model_config_t *c = &m->cfg;
    int C = c->classes, dp = c->prompt_dim, Mdp = c->prompt_len * dp, tin = Mdp + dp, Ht = c->text_hidden;
    for (int cl = 0; cl < C; cl++) {
        memcpy(v + (size_t)cl * tin, P, sizeof(float) * Mdp);
        memcpy(v + (size_t)cl * tin + Mdp, m->emb + (size_t)cl * dp, sizeof(float) * dp);
    }
    fm_linear_forward(za, v, m->wa, m->ba, C, tin, Ht);
    fm_gelu_forward(ga, za, (size_t)C * Ht);
    fm_linear_forward(o, ga, m->wb, m->bb, C, Ht, c->d);
    for (int cl = 0; cl < C; cl++) {
        const float *oc = o + (size_t)cl * c->d;
        float s = 0.0f;
        for (int j = 0; j < c->d; j++)
            s += oc[j] * oc[j];
        float n = sqrtf(s) + 1e-12f;
        onorm[cl] = n;
        for (int j = 0; j < c->d; j++)
            t[(size_t)cl * c->d + j] = oc[j] / n;
    }
}

fm_status fm_model_set_nonlocal(fm_model_t *m, const float *prompts, int K)
{
    const fm_model_config_t *c = &m->cfg;
    if (K < 0 || K > c->max_nonlocal) {
        fm_error_set("model: %d non-local prompts, at most %d", K, c->max_nonlocal);
        return FM_ERR_ARG;
    }
    fm_status st = ensure_workspace(m, 1);
    if (st != FM_OK)
        return st;
    size_t psz = (size_t)c->prompt_len * c->prompt_dim;
    if (K > 0)
        memcpy(m->nl_prompts, prompts, sizeof(float) * psz * K);
    m->K = K;
    size_t tsz = (size_t)c->classes * c->d;
    for (int j = 0; j < K; j++)
        text_forward(m, m->nl_prompts + psz * j, m->dv, m->dga, m->tga, m->dto, m->tonorm,
                     m->tall + tsz * (1 + j));
    return FM_OK;
}

const float *fm_model_text_features(fm_model_t *m)
{
    if (ensure_workspace(m, 1) != FM_OK)
        return NULL;
    text_forward(m, m->prompt.w, m->tv, m->tza, m->tga, m->to, m->tonorm, m->tall);
    return m->tall;
}

/* ---- forward ----------------------------------------------------------------- */

static void stem_forward(fm_model_t *m, const float *x, int B)
{
    const fm_model_config_t *c = &m->cfg;
    if (c->stem == FM_STEM_MLP) {
        fm_linear_forward(m->z0, x, m->stem_w.w, m->stem_b.w, B, c->in_dim, c->d);
    } else {
        size_t s1 = (size_t)m->c1h * m->c1w, sp1 = (size_t)m->p1h * m->p1w;
        size_t s2 = (size_t)m->c2h * m->c2w;
        int kk1 = CNN_K * CNN_K, kk2 = CNN_K * CNN_K * CNN_C1;
        for (int b = 0; b < B; b++)
            fm_im2col(m->cols1 + b * s1 * kk1, x + (size_t)b * c->in_dim, c->img_h, c->img_w, 1, CNN_K, CNN_K);
        fm_linear_forward(m->cc1, m->cols1, m->c1_w.w, m->c1_b.w, (int)(B * s1), kk1, CNN_C1);
        fm_relu_forward(m->rr1, m->cc1, B * s1 * CNN_C1);
        for (int b = 0; b < B; b++) {
            fm_maxpool2_forward(m->pp1 + b * sp1 * CNN_C1, m->arg1 + b * sp1 * CNN_C1,
                                m->rr1 + b * s1 * CNN_C1, m->c1h, m->c1w, CNN_C1);
            fm_im2col(m->cols2 + b * s2 * kk2, m->pp1 + b * sp1 * CNN_C1, m->p1h, m->p1w, CNN_C1, CNN_K, CNN_K);
        }
        fm_linear_forward(m->cc2, m->cols2, m->c2_w.w, m->c2_b.w, (int)(B * s2), kk2, CNN_C2);
        fm_relu_forward(m->rr2, m->cc2, B * s2 * CNN_C2);
        for (int b = 0; b < B; b++)
            fm_maxpool2_forward(m->pp2 + (size_t)b * m->flat, m->arg2 + (size_t)b * m->flat,
                                m->rr2 + b * s2 * CNN_C2, m->c2h, m->c2w, CNN_C2);
        fm_linear_forward(m->z0, m->pp2, m->fc_w.w, m->fc_b.w, B, m->flat, c->d);
    }
    fm_gelu_forward(m->h, m->z0, (size_t)B * c->d);
}

/* The routing target q_e of the load-balancing term: generalist_importance split
 * evenly over the generalists, the rest over the specialists. */
static float lb_target(const fm_model_t *m, int e)
{
    const fm_model_config_t *c = &m->cfg;
    if (c->specialists == 0)
        return 1.0f / (float)c->generalists;
    if (c->generalists == 0)
        return 1.0f / (float)c->specialists;
    return e < c->generalists ? c->generalist_importance / (float)c->generalists
                              : (1.0f - c->generalist_importance) / (float)c->specialists;
}

/* One MoE block in place on m->h; returns its load-balancing term. */
static float block_forward(fm_model_t *m, block_t *bl, int B, double *gen_mass)
{
    const fm_model_config_t *c = &m->cfg;
    int d = c->d, E = m->E, k = m->k, Hf = c->ffn_hidden;
    fm_layernorm_forward(bl->u, bl->xhat, bl->rstd, m->h, bl->ln_g.w, bl->ln_b.w, B, d);
    fm_linear_forward(bl->rlog, bl->u, bl->router.w, NULL, B, d, E);
    int counts[64] = {0};
    for (int b = 0; b < B; b++) {
        const float *r = bl->rlog + (size_t)b * E;
        fm_softmax(bl->pfull + (size_t)b * E, r, E);
        int *ti = bl->topi + (size_t)b * k;
        float *tw = bl->topw + (size_t)b * k;
        fm_topk(ti, r, E, k);
        for (int s = 0; s < k; s++)
            tw[s] = r[ti[s]];
        fm_softmax(tw, tw, k);
        for (int s = 0; s < k; s++) {
            counts[ti[s]]++;
            if (ti[s] < c->generalists)
                *gen_mass += tw[s];
        }
    }
    bl->off[0] = 0;
    for (int e = 0; e < E; e++)
        bl->off[e + 1] = bl->off[e] + counts[e];
    int fill[64];
    memcpy(fill, bl->off, sizeof(int) * E);
    for (int b = 0; b < B; b++)
        for (int s = 0; s < k; s++) {
            int e = bl->topi[(size_t)b * k + s], r = fill[e]++;
            bl->row_b[r] = b;
            bl->row_slot[r] = s;
            memcpy(bl->ug + (size_t)r * d, bl->u + (size_t)b * d, sizeof(float) * d);
        }
    /* load balancing: sum_e f_e P_e / q_e, f = dispatch fraction, P = mean router prob */
    float lb = 0.0f;
    for (int e = 0; e < E; e++) {
        bl->frac[e] = (float)counts[e] / (float)(B * k);
        float P = 0.0f;
        for (int b = 0; b < B; b++)
            P += bl->pfull[(size_t)b * E + e];
        lb += bl->frac[e] * (P / (float)B) / lb_target(m, e);
    }
    for (int e = 0; e < E; e++) {
        int r0 = bl->off[e], n = bl->off[e + 1] - r0;
        if (n == 0)
            continue;
        expert_t *ex = &bl->experts[e];
        float *a = bl->a + (size_t)r0 * Hf, *ga = bl->ga + (size_t)r0 * Hf, *y = bl->y + (size_t)r0 * d;
        fm_linear_forward(a, bl->ug + (size_t)r0 * d, ex->w1.w, ex->b1.w, n, d, Hf);
        fm_gelu_forward(ga, a, (size_t)n * Hf);
        fm_linear_forward(y, ga, ex->w2.w, ex->b2.w, n, Hf, d);
    }
    for (int r = 0; r < B * k; r++) {
        int b = bl->row_b[r];
        float w = bl->topw[(size_t)b * k + bl->row_slot[r]];
        float *h = m->h + (size_t)b * d;
        const float *y = bl->y + (size_t)r * d;
        for (int j = 0; j < d; j++)
            h[j] += w * y[j];
    }
    return lb;
}

static void rows_normalize(float *y, float *norms, const float *x, int rows, int d)
{
    for (int i = 0; i < rows; i++) {
        const float *xi = x + (size_t)i * d;
        float s = 0.0f;
        for (int j = 0; j < d; j++)
            s += xi[j] * xi[j];
        float n = sqrtf(s) + 1e-12f;
        norms[i] = n;
        for (int j = 0; j < d; j++)
            y[(size_t)i * d + j] = xi[j] / n;
    }
}

/* Gating attention: fills att, vdot and adds the gated term to logits (B,C).
 * Per head h, with keys and values of (expert j, class c) in row j*C + c:
 * att_h (B, J*C) = softmax_j(scale * q_h kp_h^T), vdot_h (B, J*C) = gq_h vp_h^T. */
static void gating_forward(fm_model_t *m, int B)
{
    const fm_model_config_t *c = &m->cfg;
    int d = c->d, C = c->classes, H = c->heads, dh = m->hd, J = 1 + m->K, JC = J * C;
    fm_linear_forward(m->q, m->f, m->wq.w, m->bq.w, B, d, d);
    fm_linear_forward(m->kp, m->tall, m->wk.w, m->bk.w, JC, d, d);
    fm_linear_forward(m->vp, m->tall, m->wv.w, m->bv.w, JC, d, d);
    /* gq_b = wo^T nf_b, so <nf_b, wo o + bo> = <gq_b, o> + <nf_b, bo> */
    fm_gemm(false, false, B, d, d, 1.0f, m->nf, d, m->wo.w, d, 0.0f, m->gq, d);
    for (int h = 0; h < H; h++) {
        float *att = m->att + (size_t)h * B * JC, *vd = m->vdot + (size_t)h * B * JC;
        fm_gemm(false, true, B, JC, dh, c->attn_scale, m->q + h * dh, d, m->kp + h * dh, d, 0.0f, att, JC);
        fm_gemm(false, true, B, JC, dh, 1.0f, m->gq + h * dh, d, m->vp + h * dh, d, 0.0f, vd, JC);
    }
    float tmp[65];
    for (int b = 0; b < B; b++) {
        const float *nb = m->nf + (size_t)b * d;
        float bias = 0.0f;
        for (int j = 0; j < d; j++)
            bias += nb[j] * m->bo.w[j];
        for (int cl = 0; cl < C; cl++) {
            float term = bias;
            for (int h = 0; h < H; h++) {
                float *att = m->att + ((size_t)h * B + b) * JC + cl;
                const float *vd = m->vdot + ((size_t)h * B + b) * JC + cl;
                for (int j = 0; j < J; j++)
                    tmp[j] = att[j * C];
                fm_softmax(tmp, tmp, J);
                for (int j = 0; j < J; j++) {
                    att[j * C] = tmp[j];
                    term += tmp[j] * vd[j * C];
                }
            }
            m->logits[(size_t)b * C + cl] += c->tau * term;
        }
    }
}

float fm_model_forward(fm_model_t *m, const float *x, const uint8_t *labels, int B, bool with_lb,
                       float *logits, fm_batch_stats_t *stats)
{
    const fm_model_config_t *c = &m->cfg;
    if (ensure_workspace(m, B) != FM_OK) {
        fm_errorf("model: cannot allocate the workspace for batch %d", B);
        abort();
    }
    int d = c->d, C = c->classes;
    m->B = B;
    m->x = x;
    m->labels = labels;
    m->with_lb = with_lb;
    m->gated = c->gating && m->K > 0;
    stem_forward(m, x, B);
    double gen_mass = 0.0;
    float lb = 0.0f;
    for (int l = 0; l < c->blocks; l++)
        lb += block_forward(m, &m->blocks[l], B, &gen_mass);
    fm_layernorm_forward(m->f, m->xhatf, m->rstdf, m->h, m->lnf_g.w, m->lnf_b.w, B, d);
    rows_normalize(m->nf, m->fnorm, m->f, B, d);
    text_forward(m, m->prompt.w, m->tv, m->tza, m->tga, m->to, m->tonorm, m->tall);
    /* c1 (B,C) = nf tl^T: cosine of the feature with each local class text feature */
    fm_gemm(false, true, B, C, d, 1.0f, m->nf, d, m->tall, d, 0.0f, m->c1, C);
    float w1 = m->gated ? c->tau * c->lambda : c->tau;
    for (int i = 0; i < B * C; i++)
        m->logits[i] = w1 * m->c1[i];
    if (m->gated)
        gating_forward(m, B);
    int correct = 0;
    float ce = fm_cross_entropy(m->dlogits, &correct, m->logits, labels, B, C, 1.0f);
    if (logits)
        memcpy(logits, m->logits, sizeof(float) * B * C);
    if (stats) {
        stats->loss = ce;
        stats->lb_loss = lb;
        stats->correct = correct;
        stats->generalist_share = c->blocks ? (float)(gen_mass / ((double)B * c->blocks)) : 0.0f;
    }
    return ce + (with_lb ? c->lb_weight * lb : 0.0f);
}

/* ---- backward ---------------------------------------------------------------- */

static void gating_backward(fm_model_t *m, int B, bool train_gate, bool need_dtl)
{
    const fm_model_config_t *c = &m->cfg;
    int d = c->d, C = c->classes, H = c->heads, dh = m->hd, J = 1 + m->K, JC = J * C;
    float att[65], da[65], ds[65];
    /* through the softmax over experts, per (head, input, class) */
    for (int h = 0; h < H; h++)
        for (int b = 0; b < B; b++) {
            size_t row = ((size_t)h * B + b) * JC;
            for (int cl = 0; cl < C; cl++) {
                float dc2 = c->tau * m->dlogits[(size_t)b * C + cl];
                for (int j = 0; j < J; j++) {
                    size_t i = row + (size_t)j * C + cl;
                    att[j] = m->att[i];
                    da[j] = dc2 * m->vdot[i];
                    m->dvdot[i] = dc2 * att[j];
                }
                fm_softmax_backward(ds, da, att, J);
                for (int j = 0; j < J; j++)
                    m->datt[row + (size_t)j * C + cl] = ds[j];
            }
        }
    /* per head: the four products of the two bilinear maps */
    for (int h = 0; h < H; h++) {
        const float *dvd = m->dvdot + (size_t)h * B * JC, *dat = m->datt + (size_t)h * B * JC;
        int o = h * dh;
        fm_gemm(false, false, B, dh, JC, 1.0f, dvd, JC, m->vp + o, d, 0.0f, m->dgq + o, d);
        fm_gemm(true, false, JC, dh, B, 1.0f, dvd, JC, m->gq + o, d, 0.0f, m->dvp + o, d);
        fm_gemm(false, false, B, dh, JC, c->attn_scale, dat, JC, m->kp + o, d, 0.0f, m->dq + o, d);
        fm_gemm(true, false, JC, dh, B, c->attn_scale, dat, JC, m->q + o, d, 0.0f, m->dkp + o, d);
    }
    /* bias term <nf_b, bo> */
    for (int b = 0; b < B; b++) {
        float sum_dc2 = 0.0f;
        for (int cl = 0; cl < C; cl++)
            sum_dc2 += c->tau * m->dlogits[(size_t)b * C + cl];
        float *dnb = m->dnf + (size_t)b * d;
        const float *nb = m->nf + (size_t)b * d;
        for (int j = 0; j < d; j++) {
            dnb[j] += sum_dc2 * m->bo.w[j];
            if (train_gate)
                m->bo.g[j] += sum_dc2 * nb[j];
        }
    }
    /* gq = nf wo */
    fm_gemm(false, true, B, d, d, 1.0f, m->dgq, d, m->wo.w, d, 1.0f, m->dnf, d);
    if (train_gate)
        fm_gemm(true, false, d, d, B, 1.0f, m->nf, d, m->dgq, d, 1.0f, m->wo.g, d);
    /* q = f wq^T + bq: its dx goes to df */
    fm_linear_backward(m->df, train_gate ? m->wq.g : NULL, train_gate ? m->bq.g : NULL, m->dq, m->f,
                       m->wq.w, B, d, d, true);
    /* kp, vp = tall w^T + b; only the local rows (j = 0) carry gradient to the prompt */
    if (train_gate) {
        fm_linear_backward(NULL, m->wk.g, m->bk.g, m->dkp, m->tall, m->wk.w, JC, d, d, false);
        fm_linear_backward(NULL, m->wv.g, m->bv.g, m->dvp, m->tall, m->wv.w, JC, d, d, false);
    }
    if (need_dtl) {
        fm_linear_backward(m->dtl, NULL, NULL, m->dkp, m->tall, m->wk.w, C, d, d, true);
        fm_linear_backward(m->dtl, NULL, NULL, m->dvp, m->tall, m->wv.w, C, d, d, true);
    }
}

static void normalize_backward(float *dx, const float *dy, const float *y, const float *norms, int rows,
                               int d, bool accumulate)
{
    for (int i = 0; i < rows; i++) {
        const float *yi = y + (size_t)i * d, *dyi = dy + (size_t)i * d;
        float dot = 0.0f;
        for (int j = 0; j < d; j++)
            dot += yi[j] * dyi[j];
        float *dxi = dx + (size_t)i * d;
        for (int j = 0; j < d; j++) {
            float v = (dyi[j] - yi[j] * dot) / norms[i];
            dxi[j] = accumulate ? dxi[j] + v : v;
        }
    }
}

static void text_backward(fm_model_t *m)
{
    const fm_model_config_t *c = &m->cfg;
    int C = c->classes, d = c->d, Ht = c->text_hidden, Mdp = c->prompt_len * c->prompt_dim;
    int tin = Mdp + c->prompt_dim;
    normalize_backward(m->dto, m->dtl, m->tall, m->tonorm, C, d, false);
    fm_gemm(false, false, C, Ht, d, 1.0f, m->dto, d, m->wb, Ht, 0.0f, m->dga, Ht);
    fm_gelu_backward(m->dga, m->dga, m->tza, (size_t)C * Ht);
    fm_gemm(false, false, C, tin, Ht, 1.0f, m->dga, Ht, m->wa, tin, 0.0f, m->dv, tin);
    for (int cl = 0; cl < C; cl++)
        for (int j = 0; j < Mdp; j++)
            m->prompt.g[j] += m->dv[(size_t)cl * tin + j];
}

/* Backward through one block: m->dh holds dL/dh_out and becomes dL/dh_in. */
static void block_backward(fm_model_t *m, block_t *bl, int B, bool lo, bool up, bool need_dx)
{
    const fm_model_config_t *c = &m->cfg;
    int d = c->d, E = m->E, k = m->k, Hf = c->ffn_hidden;
    memset(m->du, 0, sizeof(float) * B * d);
    /* experts: dY_r = w dh_b, dw = <dh_b, y_r> */
    for (int r = 0; r < B * k; r++) {
        int b = bl->row_b[r], s = bl->row_slot[r];
        float w = bl->topw[(size_t)b * k + s];
        const float *dhb = m->dh + (size_t)b * d, *y = bl->y + (size_t)r * d;
        float *dy = m->dyg + (size_t)r * d, dot = 0.0f;
        for (int j = 0; j < d; j++) {
            dy[j] = w * dhb[j];
            dot += dhb[j] * y[j];
        }
        m->dw[(size_t)b * k + s] = dot;
    }
    for (int e = 0; e < E; e++) {
        int r0 = bl->off[e], n = bl->off[e + 1] - r0;
        if (n == 0)
            continue;
        expert_t *ex = &bl->experts[e];
        float *dg = m->dg + (size_t)r0 * Hf;
        fm_linear_backward(dg, lo ? ex->w2.g : NULL, lo ? ex->b2.g : NULL, m->dyg + (size_t)r0 * d,
                           bl->ga + (size_t)r0 * Hf, ex->w2.w, n, Hf, d, false);
        fm_gelu_backward(dg, dg, bl->a + (size_t)r0 * Hf, (size_t)n * Hf);
        fm_linear_backward(m->dug + (size_t)r0 * d, lo ? ex->w1.g : NULL, lo ? ex->b1.g : NULL, dg,
                           bl->ug + (size_t)r0 * d, ex->w1.w, n, d, Hf, false);
    }
    for (int r = 0; r < B * k; r++) {
        float *du = m->du + (size_t)bl->row_b[r] * d;
        const float *dug = m->dug + (size_t)r * d;
        for (int j = 0; j < d; j++)
            du[j] += dug[j];
    }
    /* router: softmax over the kept logits, plus the load-balancing term */
    memset(m->dr, 0, sizeof(float) * B * E);
    float g[64], dlb[64], tmp[64];
    if (m->with_lb)
        for (int e = 0; e < E; e++)
            g[e] = c->lb_weight * bl->frac[e] / lb_target(m, e) / (float)B;
    for (int b = 0; b < B; b++) {
        float *drb = m->dr + (size_t)b * E;
        const float *tw = bl->topw + (size_t)b * k;
        const int *ti = bl->topi + (size_t)b * k;
        fm_softmax_backward(tmp, m->dw + (size_t)b * k, tw, k);
        for (int s = 0; s < k; s++)
            drb[ti[s]] += tmp[s];
        if (m->with_lb) {
            fm_softmax_backward(dlb, g, bl->pfull + (size_t)b * E, E);
            for (int e = 0; e < E; e++)
                drb[e] += dlb[e];
        }
    }
    fm_linear_backward(m->du, up ? bl->router.g : NULL, NULL, m->dr, bl->u, bl->router.w, B, d, E, true);
    if (lo || need_dx)
        fm_layernorm_backward(need_dx ? m->dh : NULL, lo ? bl->ln_g.g : NULL, lo ? bl->ln_b.g : NULL,
                              m->du, bl->xhat, bl->rstd, bl->ln_g.w, B, d);
}

static void stem_backward(fm_model_t *m, int B)
{
    const fm_model_config_t *c = &m->cfg;
    fm_gelu_backward(m->dz0, m->dh, m->z0, (size_t)B * c->d);
    if (c->stem == FM_STEM_MLP) {
        fm_linear_backward(NULL, m->stem_w.g, m->stem_b.g, m->dz0, m->x, m->stem_w.w, B, c->in_dim, c->d, false);
        return;
    }
    size_t s1 = (size_t)m->c1h * m->c1w, sp1 = (size_t)m->p1h * m->p1w, s2 = (size_t)m->c2h * m->c2w;
    int kk1 = CNN_K * CNN_K, kk2 = CNN_K * CNN_K * CNN_C1;
    fm_linear_backward(m->dpp2, m->fc_w.g, m->fc_b.g, m->dz0, m->pp2, m->fc_w.w, B, m->flat, c->d, false);
    memset(m->drr2, 0, sizeof(float) * B * s2 * CNN_C2);
    for (int b = 0; b < B; b++)
        fm_maxpool2_backward(m->drr2 + b * s2 * CNN_C2, m->dpp2 + (size_t)b * m->flat,
                             m->arg2 + (size_t)b * m->flat, m->c2h, m->c2w, CNN_C2);
    fm_relu_backward(m->drr2, m->drr2, m->cc2, B * s2 * CNN_C2);
    fm_linear_backward(m->dcols2, m->c2_w.g, m->c2_b.g, m->drr2, m->cols2, m->c2_w.w, (int)(B * s2), kk2,
                       CNN_C2, false);
    memset(m->dpp1, 0, sizeof(float) * B * sp1 * CNN_C1);
    memset(m->drr1, 0, sizeof(float) * B * s1 * CNN_C1);
    for (int b = 0; b < B; b++) {
        fm_col2im(m->dpp1 + b * sp1 * CNN_C1, m->dcols2 + b * s2 * kk2, m->p1h, m->p1w, CNN_C1, CNN_K, CNN_K);
        fm_maxpool2_backward(m->drr1 + b * s1 * CNN_C1, m->dpp1 + b * sp1 * CNN_C1, m->arg1 + b * sp1 * CNN_C1,
                             m->c1h, m->c1w, CNN_C1);
    }
    fm_relu_backward(m->drr1, m->drr1, m->cc1, B * s1 * CNN_C1);
    fm_linear_backward(NULL, m->c1_w.g, m->c1_b.g, m->drr1, m->cols1, m->c1_w.w, (int)(B * s1), kk1, CNN_C1, false);
}

void fm_model_backward(fm_model_t *m, int levels)
{
    const fm_model_config_t *c = &m->cfg;
    int B = m->B, d = c->d, C = c->classes;
    bool lo = levels & FM_LEVEL_LOWER, up = levels & FM_LEVEL_UPPER;
    bool train_gate = (levels & m->gate_level) != 0;
    /* the local cosine term: logits += w1 * nf tl^T */
    float w1 = m->gated ? c->tau * c->lambda : c->tau;
    for (int i = 0; i < B * C; i++)
        m->dc1[i] = w1 * m->dlogits[i];
    fm_gemm(false, false, B, d, C, 1.0f, m->dc1, C, m->tall, d, 0.0f, m->dnf, d);
    if (lo)
        fm_gemm(true, false, C, d, B, 1.0f, m->dc1, C, m->nf, d, 0.0f, m->dtl, d);
    memset(m->df, 0, sizeof(float) * B * d);
    if (m->gated)
        gating_backward(m, B, train_gate, lo);
    normalize_backward(m->df, m->dnf, m->nf, m->fnorm, B, d, true);
    memset(m->dh, 0, sizeof(float) * B * d);
    fm_layernorm_backward(m->dh, lo ? m->lnf_g.g : NULL, lo ? m->lnf_b.g : NULL, m->df, m->xhatf, m->rstdf,
                          m->lnf_g.w, B, d);
    for (int l = c->blocks - 1; l >= 0; l--)
        block_backward(m, &m->blocks[l], B, lo, up, lo || l > 0);
    if (lo) {
        stem_backward(m, B);
        text_backward(m);
    }
}

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
}

uint64_t fm_model_branch_signature(const fm_model_t *m)
{
    uint64_t h = 1469598103934665603ull;
    int B = m->B;
    for (int l = 0; l < m->cfg.blocks; l++)
        for (int i = 0; i < B * m->k; i++)
            h = mix(h, (uint64_t)m->blocks[l].topi[i]);
    if (m->cfg.stem == FM_STEM_CNN) {
        size_t n1 = (size_t)B * m->p1h * m->p1w * CNN_C1, n2 = (size_t)B * m->flat;
        size_t r1 = (size_t)B * m->c1h * m->c1w * CNN_C1, r2 = (size_t)B * m->c2h * m->c2w * CNN_C2;
        for (size_t i = 0; i < n1; i++)
            h = mix(h, (uint64_t)m->arg1[i]);
        for (size_t i = 0; i < n2; i++)
            h = mix(h, (uint64_t)m->arg2[i]);
        for (size_t i = 0; i < r1; i++)
            h = mix(h, m->cc1[i] > 0.0f);
        for (size_t i = 0; i < r2; i++)
            h = mix(h, m->cc2[i] > 0.0f);
    }
    return h;
}
