/* model_image.c - the image family (model_family.h): its configuration checks,
 * create/destroy, the batch workspace (two arenas: activations and gradient
 * scratch), and the forward/backward passes as a list of component calls. The
 * components: model_stem.c, model_moe.c, model_head.c; their shared layout:
 * model_internal.h. */
#include "fedmoe/model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/kernels.h"
#include "fedmoe/log.h"
#include "fedmoe/rng.h"
#include "model_internal.h"

/* ---- construction ---------------------------------------------------------- */

/* Stem, blocks, head: this order is the layout of every group (and so of what
 * clients send and store); it must not change. */
static fm_status register_params(fm_image_t *m)
{
    fm_status st = fm_stem_register(m);
    for (int l = 0; l < m->base.cfg.blocks && st == FM_OK; l++)
        st = fm_moe_register(&m->base, &m->moe, l);
    return st == FM_OK ? fm_head_register(m) : st;
}

static void image_destroy(fm_model_t *mm)
{
    fm_image_t *m = (fm_image_t *)mm;
    fm_moe_free(&m->moe);
    fm_params_free(&m->base.ps);
    fm_head_free(m);
    fm_workspace_free(&m->ws);
    free(m);
}

static fm_status image_create(fm_model_t **out, const fm_model_config_t *cfg, uint64_t seed, uint64_t local_stream)
{
    fm_image_t *m = calloc(1, sizeof *m);
    if (!m) {
        fm_error_set("model: out of memory");
        return FM_ERR_NOMEM;
    }
    fm_status st = FM_ERR_NOMEM;
    m->base.family = &fm_family_image;
    m->base.cfg = *cfg;
    m->hd = cfg->d / cfg->heads;
    m->base.gate_level = cfg->gating_on_validation ? FM_LEVEL_UPPER : FM_LEVEL_LOWER;
    fm_stem_geometry(m);
    if (fm_moe_init(&m->moe, &m->base.cfg) != FM_OK)
        goto fail;
    if ((st = register_params(m)) != FM_OK || (st = fm_params_alloc(&m->base.ps)) != FM_OK)
        goto fail;
    fm_model_init_params(&m->base, seed, local_stream);
    if ((st = fm_head_init_encoder(m, seed)) != FM_OK)
        goto fail;
    *out = &m->base;
    return FM_OK;
fail:
    if (st == FM_ERR_NOMEM)
        fm_error_set("model: out of memory");
    image_destroy(&m->base);
    return st;
}

/* ---- workspace ------------------------------------------------------------- */

/* Lays out every batch buffer in the two arenas (act, grad); with NULL bases it
 * only measures. */
static void layout_workspace(fm_model_t *mm, int B, fm_layout_t *act, fm_layout_t *grad)
{
    fm_image_t *m = (fm_image_t *)mm;
    FM_TAKE(act, m->h, float, (size_t)B * m->base.cfg.d);
    FM_TAKE(grad, m->dh, float, (size_t)B * m->base.cfg.d);
    FM_TAKE(act, m->xbuf, float, (size_t)B * m->base.cfg.in_dim);
    FM_TAKE(act, m->ybuf, uint8_t, (size_t)B);
    fm_stem_layout(m, B, act, grad);
    fm_moe_layout(&m->moe, B, act, grad);
    fm_head_layout(m, B, act, grad);
}

static double image_workspace(const fm_model_t *mm, int B)
{
    fm_image_t *m = (fm_image_t *)mm;
    return fm_workspace_measure(&m->ws, &m->base, B, layout_workspace);
}

/* ---- forward and backward -------------------------------------------------- */

static float image_forward(fm_model_t *mm, const fm_batch_t *b, bool with_lb, float *logits,
                           fm_batch_stats_t *stats)
{
    fm_image_t *m = (fm_image_t *)mm;
    const fm_model_config_t *c = &m->base.cfg;
    int B = b->n;
    fm_workspace_ensure(&m->ws, mm, B, layout_workspace);
    int C = c->classes;
    m->B = B;
    if (b->idx) {
        fm_dataset_gather(b->ds, b->idx, B, m->xbuf, m->ybuf);
        m->x = m->xbuf;
        m->labels = m->ybuf;
    } else {
        m->x = b->ds->x + b->first * (size_t)c->in_dim;
        m->labels = b->ds->y + b->first;
    }
    const uint8_t *labels = m->labels;
    m->moe.with_lb = with_lb;
    fm_stem_forward(m, m->x, B);
    double gen_mass = 0.0;
    float lb = 0.0f;
    for (int l = 0; l < c->blocks; l++)
        lb += fm_moe_forward(&m->moe, &m->moe.blocks[l], m->h, B, &gen_mass);
    fm_head_forward(m, B);
    int correct = 0;
    float ce = fm_cross_entropy(m->head.act.dlogits, &correct, m->head.act.logits, labels, B, C, 1.0f);
    if (logits)
        memcpy(logits, m->head.act.logits, sizeof(float) * B * C);
    if (stats) {
        stats->loss = ce;
        stats->lb_loss = lb;
        stats->predictions = B;
        stats->correct = correct;
        stats->generalist_share = c->blocks ? (float)(gen_mass / ((double)B * c->blocks)) : 0.0f;
    }
    return ce + (with_lb ? c->lb_weight * lb : 0.0f);
}

static void image_backward(fm_model_t *mm, int levels)
{
    fm_image_t *m = (fm_image_t *)mm;
    const fm_model_config_t *c = &m->base.cfg;
    int B = m->B;
    bool lo = levels & FM_LEVEL_LOWER, up = levels & FM_LEVEL_UPPER;
    bool train_gate = (levels & m->base.gate_level) != 0;
    fm_head_backward(m, B, lo, train_gate);
    for (int l = c->blocks - 1; l >= 0; l--)
        fm_moe_backward(&m->moe, &m->moe.blocks[l], m->dh, B, lo, up, lo || l > 0);
    if (lo) {
        fm_stem_backward(m, B);
        fm_head_prompt_backward(m);
    }
}

static uint64_t image_signature(const fm_model_t *mm)
{
    const fm_image_t *m = (const fm_image_t *)mm;
    return fm_stem_signature(m, fm_moe_signature(&m->moe, m->B, 1469598103934665603ull));
}

/* ---- the family ---------------------------------------------------------------- */

/* Parameters of the image model of c, counted from the sizes alone (in double,
 * so absurd sizes cannot overflow), before anything is allocated. */
static double image_parameters(const fm_model_config_t *c)
{
    double d = c->d, E = (double)c->generalists + c->specialists, H = c->ffn_hidden;
    double stem = (double)c->in_dim * d + d;
    if (c->stem == FM_STEM_CNN) {
        double flat = (double)((c->img_h - CNN_K + 1) / 2 - CNN_K + 1) / 2 *
                      (double)(((c->img_w - CNN_K + 1) / 2 - CNN_K + 1) / 2) * CNN_C2;
        stem = CNN_C1 * (CNN_K * CNN_K + 1.0) + CNN_C2 * (CNN_C1 * CNN_K * CNN_K + 1.0) + flat * d + d;
    }
    double block = 2 * d + E * d + E * (2 * H * d + H + d);
    double head = 2 * d + (double)c->prompt_len * c->prompt_dim + 4 * (d * d + d);
    return stem + c->blocks * block + head;
}

/* Floats held besides the parameters (the frozen class-text encoder, the
 * non-local prompts and their text features, the encoder's own activations). */
static double image_frozen(const fm_model_config_t *c)
{
    double C = c->classes, dp = c->prompt_dim, Ht = c->text_hidden, d = c->d, K = c->max_nonlocal ? c->max_nonlocal : 1;
    double tin = (c->prompt_len + 1.0) * dp;
    double encoder = C * dp + Ht * tin + Ht + d * Ht + d;
    double nonlocal = K * c->prompt_len * dp + K * C * d;
    double scratch = C * (tin + 2 * Ht + 2 * d) + C * d;
    return encoder + nonlocal + scratch;
}

static fm_status image_check(const fm_model_config_t *c)
{
    FM_MODEL_REQUIRE(c->in_dim > 0 && c->in_dim <= 1 << 20, "model: in_dim %d out of range", c->in_dim);
    FM_MODEL_REQUIRE(c->classes >= 2 && c->classes <= 256, "model: classes %d out of range (2..256)", c->classes);
    FM_MODEL_REQUIRE(c->prompt_len >= 1 && c->prompt_len <= 64 && c->prompt_dim >= 1 && c->prompt_dim <= 4096 &&
                         c->text_hidden >= 1 && c->text_hidden <= 65536,
                     "model: prompt sizes out of range (prompt_len 1..64, prompt_dim 1..4096, text_hidden 1..65536)");
    FM_MODEL_REQUIRE(c->heads >= 1 && c->d % c->heads == 0, "model: heads %d must divide d %d", c->heads, c->d);
    FM_MODEL_REQUIRE(c->max_nonlocal >= 0 && c->max_nonlocal <= 64, "model: max_nonlocal %d out of range",
                     c->max_nonlocal);
    if (c->stem == FM_STEM_CNN) {
        FM_MODEL_REQUIRE(c->img_h * c->img_w == c->in_dim, "model: cnn stem needs in_dim = img_h * img_w");
        int h1 = c->img_h - CNN_K + 1, w1 = c->img_w - CNN_K + 1;
        int h2 = h1 / 2 - CNN_K + 1, w2 = w1 / 2 - CNN_K + 1;
        FM_MODEL_REQUIRE(h1 > 0 && w1 > 0 && h1 % 2 == 0 && w1 % 2 == 0 && h2 > 0 && w2 > 0 && h2 % 2 == 0 &&
                             w2 % 2 == 0,
                         "model: image %dx%d does not fit the cnn stem", c->img_h, c->img_w);
    }
    double n = image_parameters(c) + image_frozen(c);
    FM_MODEL_REQUIRE(n <= FM_MODEL_MAX_PARAMETERS,
                     "model: %.3g parameters and frozen values, more than the %d this build allows", n,
                     FM_MODEL_MAX_PARAMETERS);
    return FM_OK;
}

static fm_status image_accepts(const fm_model_config_t *c, const fm_dataset_t *ds, const char *who)
{
    if (!ds->x && ds->tok) {
        fm_error_set("%s: the data is text, and this model classifies images (--task text)", who);
        return FM_ERR_ARG;
    }
    if (ds->dim != c->in_dim) {
        fm_error_set("%s: data has %d features, the model expects %d", who, ds->dim, c->in_dim);
        return FM_ERR_ARG;
    }
    if (ds->classes > c->classes) {
        fm_error_set("%s: data has %d classes, the model has %d", who, ds->classes, c->classes);
        return FM_ERR_ARG;
    }
    return FM_OK;
}

static void image_anchor(fm_model_t *m, float rate) { fm_moe_anchor(&((fm_image_t *)m)->moe, rate); }

static int image_predictions(const fm_model_config_t *c)
{
    (void)c;
    return 1;
}

static const fm_prompt_head_ops_t image_head = {
    .prompt = fm_head_prompt,
    .prompt_size = fm_head_prompt_size,
    .set_nonlocal = fm_head_set_nonlocal,
    .text_features = fm_head_text_features,
};

const fm_model_family_t fm_family_image = {
    .name = "image",
    .check = image_check,
    .parameters = image_parameters,
    .create = image_create,
    .destroy = image_destroy,
    .accepts = image_accepts,
    .predictions = image_predictions,
    .workspace = image_workspace,
    .forward = image_forward,
    .backward = image_backward,
    .signature = image_signature,
    .anchor = image_anchor,
    .head = &image_head,
};
