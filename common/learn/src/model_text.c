/* model_text.c - the text family (model_family.h): a byte-level causal
 * language model. A window of T bytes x_0..x_{T-1} (and x_T, the last byte to
 * predict): h_t = E[x_t] + P[t]; per block l, h += Attention_l(h) (causal,
 * model_attention.c), h += MoE_l(h) (the blocks of model_moe.c, as in the image
 * family: generalists, specialists, top-k router, load balancing); logits_t =
 * LayerNorm_f(h_t) W^T with W = E (tied, the default) or an output layer of
 * its own; the objective is the mean cross-entropy of x_{t+1} over the B*T
 * positions. Parameters: embeddings, attention, norms and generalists shared,
 * specialists and routers local (params.h roles); no prompt head. */
#include "fedmoe/model.h"

#include <stdlib.h>
#include <string.h>

#include "fedmoe/kernels.h"
#include "fedmoe/log.h"
#include "model_internal.h"

#define VOCAB 256

/* ---- construction ---------------------------------------------------------- */

/* Embeddings, then attention and MoE block by block, then the final norm and
 * (untied) the output layer: the layout of every group; it must not change. */
static fm_status register_params(fm_text_t *m)
{
    fm_model_t *b = &m->base;
    const fm_model_config_t *c = &b->cfg;
    fm_status st = fm_model_add_param(b, &m->emb, FM_ROLE_EMBEDDING, FM_KIND_WEIGHT, -1, -1, VOCAB, c->d, "emb");
    if (st == FM_OK)
        st = fm_model_add_param(b, &m->pos, FM_ROLE_EMBEDDING, FM_KIND_WEIGHT, -1, -1, c->context, c->d, "pos");
    for (int l = 0; l < c->blocks && st == FM_OK; l++)
        if ((st = fm_attn_register(b, &m->attn[l], l)) == FM_OK)
            st = fm_moe_register(b, &m->moe, l);
    if (st == FM_OK)
        st = fm_model_add_param(b, &m->lnf_g, FM_ROLE_NORM, FM_KIND_NORM_GAIN, -1, -1, 1, c->d, "lnf.g");
    if (st == FM_OK)
        st = fm_model_add_param(b, &m->lnf_b, FM_ROLE_NORM, FM_KIND_NORM_BIAS, -1, -1, 1, c->d, "lnf.b");
    if (st == FM_OK && c->untied)
        st = fm_model_add_param(b, &m->out, FM_ROLE_EMBEDDING, FM_KIND_WEIGHT, -1, -1, VOCAB, c->d, "out");
    return st;
}

static void text_destroy(fm_model_t *mm)
{
    fm_text_t *m = (fm_text_t *)mm;
    fm_moe_free(&m->moe);
    free(m->attn);
    fm_params_free(&m->base.ps);
    fm_workspace_free(&m->ws);
    free(m);
}

static fm_status text_create(fm_model_t **out, const fm_model_config_t *cfg, uint64_t seed, uint64_t local_stream)
{
    fm_text_t *m = calloc(1, sizeof *m);
    if (!m) {
        fm_error_set("model: out of memory");
        return FM_ERR_NOMEM;
    }
    fm_status st = FM_ERR_NOMEM;
    m->base.family = &fm_family_text;
    m->base.cfg = *cfg;
    m->base.gate_level = FM_LEVEL_LOWER;
    if (fm_moe_init(&m->moe, &m->base.cfg) != FM_OK || !(m->attn = calloc(cfg->blocks ? cfg->blocks : 1, sizeof *m->attn)))
        goto fail;
    if ((st = register_params(m)) != FM_OK || (st = fm_params_alloc(&m->base.ps)) != FM_OK)
        goto fail;
    fm_model_init_params(&m->base, seed, local_stream);
    *out = &m->base;
    return FM_OK;
fail:
    if (st == FM_ERR_NOMEM)
        fm_error_set("model: out of memory");
    text_destroy(&m->base);
    return st;
}

/* ---- workspace ------------------------------------------------------------- */

static void layout_workspace(fm_model_t *mm, int B, fm_layout_t *act, fm_layout_t *grad)
{
    fm_text_t *m = (fm_text_t *)mm;
    const fm_model_config_t *c = &m->base.cfg;
    size_t T = (size_t)c->context, rows = (size_t)B * T, d = (size_t)c->d;
    FM_TAKE(act, m->tokbuf, uint8_t, (size_t)B * (T + 1));
    FM_TAKE(act, m->next, uint8_t, rows);
    FM_TAKE(act, m->h, float, rows * d);
    FM_TAKE(act, m->xhatf, float, rows * d);
    FM_TAKE(act, m->rstdf, float, rows);
    FM_TAKE(act, m->hf, float, rows * d);
    FM_TAKE(act, m->logits, float, rows * VOCAB);
    FM_TAKE(act, m->dlogits, float, rows * VOCAB);
    FM_TAKE(grad, m->dh, float, rows * d);
    FM_TAKE(grad, m->dhf, float, rows * d);
    for (int l = 0; l < c->blocks; l++)
        fm_attn_layout(&m->attn[l], c, B, act);
    fm_attn_grad_layout(&m->attn_grad, c, B, grad);
    fm_moe_layout(&m->moe, (int)rows, act, grad);
}

static double text_workspace(const fm_model_t *mm, int B)
{
    fm_text_t *m = (fm_text_t *)mm;
    return fm_workspace_measure(&m->ws, &m->base, B, layout_workspace);
}

/* ---- forward and backward -------------------------------------------------- */

/* The batch's windows into m->tok, its inputs embedded into m->h and the bytes
 * to predict into m->next. */
static void embed(fm_text_t *m, const fm_batch_t *b)
{
    int T = m->base.cfg.context, d = m->base.cfg.d, B = b->n;
    size_t win = (size_t)T + 1;
    if (b->idx) {
        for (int i = 0; i < B; i++)
            memcpy(m->tokbuf + i * win, b->ds->tok + (size_t)b->idx[i] * win, win);
        m->tok = m->tokbuf;
    } else {
        m->tok = b->ds->tok + b->first * win;
    }
    for (int i = 0; i < B; i++)
        for (int t = 0; t < T; t++) {
            size_t r = (size_t)i * T + t;
            const float *e = m->emb.w + (size_t)m->tok[i * win + t] * d, *p = m->pos.w + (size_t)t * d;
            float *h = m->h + r * d;
            for (int j = 0; j < d; j++)
                h[j] = e[j] + p[j];
            m->next[r] = m->tok[i * win + t + 1];
        }
}

static float text_forward(fm_model_t *mm, const fm_batch_t *b, bool with_lb, float *logits, fm_batch_stats_t *stats)
{
    fm_text_t *m = (fm_text_t *)mm;
    const fm_model_config_t *c = &m->base.cfg;
    int B = b->n, rows = B * c->context, d = c->d;
    fm_workspace_ensure(&m->ws, mm, B, layout_workspace);
    m->B = B;
    m->moe.with_lb = with_lb;
    embed(m, b);
    double gen_mass = 0.0;
    float lb = 0.0f;
    for (int l = 0; l < c->blocks; l++) {
        fm_attn_forward(&m->attn[l], c, m->h, B);
        lb += fm_moe_forward(&m->moe, &m->moe.blocks[l], m->h, rows, &gen_mass);
    }
    fm_layernorm_forward(m->hf, m->xhatf, m->rstdf, m->h, m->lnf_g.w, m->lnf_b.w, rows, d);
    fm_linear_forward(m->logits, m->hf, c->untied ? m->out.w : m->emb.w, NULL, rows, d, VOCAB);
    int correct = 0;
    float ce = fm_cross_entropy(m->dlogits, &correct, m->logits, m->next, rows, VOCAB, 1.0f);
    if (logits)
        memcpy(logits, m->logits, sizeof(float) * (size_t)rows * VOCAB);
    if (stats) {
        stats->loss = ce;
        stats->lb_loss = lb;
        stats->predictions = rows;
        stats->correct = correct;
        stats->generalist_share = c->blocks ? (float)(gen_mass / ((double)rows * c->blocks)) : 0.0f;
    }
    return ce + (with_lb ? c->lb_weight * lb : 0.0f);
}

static void text_backward(fm_model_t *mm, int levels)
{
    fm_text_t *m = (fm_text_t *)mm;
    const fm_model_config_t *c = &m->base.cfg;
    int B = m->B, T = c->context, rows = B * T, d = c->d;
    bool lo = levels & FM_LEVEL_LOWER, up = levels & FM_LEVEL_UPPER;
    fm_view_t *w = c->untied ? &m->out : &m->emb;
    fm_linear_backward(m->dhf, lo ? w->g : NULL, NULL, m->dlogits, m->hf, w->w, rows, d, VOCAB, false);
    memset(m->dh, 0, sizeof(float) * (size_t)rows * d);
    fm_layernorm_backward(m->dh, lo ? m->lnf_g.g : NULL, lo ? m->lnf_b.g : NULL, m->dhf, m->xhatf, m->rstdf,
                          m->lnf_g.w, rows, d);
    for (int l = c->blocks - 1; l >= 0; l--) {
        bool need_dx = lo || l > 0; /* (a router below, or the embeddings) */
        fm_moe_backward(&m->moe, &m->moe.blocks[l], m->dh, rows, lo, up, need_dx);
        fm_attn_backward(&m->attn[l], &m->attn_grad, c, m->dh, B, lo, need_dx);
    }
    if (!lo)
        return;
    size_t win = (size_t)T + 1;
    for (int i = 0; i < B; i++)
        for (int t = 0; t < T; t++) {
            const float *g = m->dh + ((size_t)i * T + t) * d;
            float *ge = m->emb.g + (size_t)m->tok[i * win + t] * d, *gp = m->pos.g + (size_t)t * d;
            for (int j = 0; j < d; j++) {
                ge[j] += g[j];
                gp[j] += g[j];
            }
        }
}

static uint64_t text_signature(const fm_model_t *mm)
{
    const fm_text_t *m = (const fm_text_t *)mm;
    return fm_moe_signature(&m->moe, m->B * m->base.cfg.context, 1469598103934665603ull);
}

static void text_anchor(fm_model_t *m, float rate) { fm_moe_anchor(&((fm_text_t *)m)->moe, rate); }

/* ---- the family ---------------------------------------------------------------- */

static double text_parameters(const fm_model_config_t *c)
{
    double d = c->d, E = (double)c->generalists + c->specialists, H = c->ffn_hidden;
    double embed = VOCAB * d + (double)c->context * d + (c->untied ? VOCAB * d : 0.0);
    double attn = 2 * d + 3 * d * d + 3 * d + d * d + d;
    double moe = 2 * d + E * d + E * (2 * H * d + H + d);
    return embed + c->blocks * (attn + moe) + 2 * d;
}

static int text_predictions(const fm_model_config_t *c) { return c->context; }

static fm_status text_check(const fm_model_config_t *c)
{
    FM_MODEL_REQUIRE(c->context >= 1 && c->context <= 4096, "model: context %d out of range (1..4096)", c->context);
    FM_MODEL_REQUIRE(c->heads >= 1 && c->d % c->heads == 0, "model: heads %d must divide d %d", c->heads, c->d);
    double n = text_parameters(c);
    FM_MODEL_REQUIRE(n <= FM_MODEL_MAX_PARAMETERS, "model: %.3g parameters, more than the %d this build allows", n,
                     FM_MODEL_MAX_PARAMETERS);
    return FM_OK;
}

static fm_status text_accepts(const fm_model_config_t *c, const fm_dataset_t *ds, const char *who)
{
    if (!ds->tok) {
        fm_error_set("%s: the text model reads text, and this data is not (a text dataset: fortunes or text:DIR)",
                     who);
        return FM_ERR_ARG;
    }
    if (ds->dim != c->context) {
        fm_error_set("%s: data has windows of %d bytes, the model reads %d", who, ds->dim, c->context);
        return FM_ERR_ARG;
    }
    return FM_OK;
}

const fm_model_family_t fm_family_text = {
    .name = "text",
    .check = text_check,
    .parameters = text_parameters,
    .create = text_create,
    .destroy = text_destroy,
    .accepts = text_accepts,
    .predictions = text_predictions,
    .workspace = text_workspace,
    .forward = text_forward,
    .backward = text_backward,
    .signature = text_signature,
    .anchor = text_anchor,
    .head = NULL,
};
