/* model_head.c - the prompt-expert head. From the residual stream h (B,d):
 * f = LayerNorm_f(h), nf = f/|f|; a frozen class-text encoder turns the local
 * prompt P_L (and the K frozen non-local prompts) into unit class text features
 * t_c(P) = normalize(W_b GELU(W_a [P; e_c] + b_a) + b_b) (C,d); the logits are
 * tau * (lambda * cos(f, t_c(P_L)) + <nf, T_moe,c>) with the attention gating's
 * T_moe, or tau * cos(f, t_c(P_L)) without non-local prompts or with gating off. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fedmoe/kernels.h"
#include "fedmoe/log.h"
#include "fedmoe/rng.h"
#include "model_internal.h"

fm_status fm_head_register(fm_image_t *m)
{
    const fm_model_config_t *c = &m->base.cfg;
    fm_head_t *hd = &m->head;
    int d = c->d;
    fm_status st;
#define ADD(view, role, kind, r, cl, name)                                                       \
    do {                                                                                         \
        if ((st = fm_model_add_param(&m->base, &(view), role, kind, -1, -1, r, cl, name)) != FM_OK)     \
            return st;                                                                           \
    } while (0)
    ADD(hd->lnf_g, FM_ROLE_NORM, FM_KIND_NORM_GAIN, 1, d, "feature.ln.g");
    ADD(hd->lnf_b, FM_ROLE_NORM, FM_KIND_NORM_BIAS, 1, d, "feature.ln.b");
    ADD(hd->prompt, FM_ROLE_PROMPT, FM_KIND_WEIGHT, c->prompt_len, c->prompt_dim, "prompt");
    ADD(hd->wq, FM_ROLE_GATING, FM_KIND_WEIGHT, d, d, "gating.wq");
    ADD(hd->bq, FM_ROLE_GATING, FM_KIND_BIAS, 1, d, "gating.bq");
    ADD(hd->wk, FM_ROLE_GATING, FM_KIND_WEIGHT, d, d, "gating.wk");
    ADD(hd->bk, FM_ROLE_GATING, FM_KIND_BIAS, 1, d, "gating.bk");
    ADD(hd->wv, FM_ROLE_GATING, FM_KIND_WEIGHT, d, d, "gating.wv");
    ADD(hd->bv, FM_ROLE_GATING, FM_KIND_BIAS, 1, d, "gating.bv");
    ADD(hd->wo, FM_ROLE_GATING, FM_KIND_WEIGHT, d, d, "gating.wo");
    ADD(hd->bo, FM_ROLE_GATING, FM_KIND_BIAS, 1, d, "gating.bo");
#undef ADD
    return FM_OK;
}

/* Lays out one encoder pass's activations (C rows). */
static void text_layout(const fm_model_config_t *c, fm_text_act_t *a, fm_layout_t *L)
{
    int C = c->classes, tin = (c->prompt_len + 1) * c->prompt_dim;
    FM_TAKE(L, a->v, float, C * tin);
    FM_TAKE(L, a->za, float, C * c->text_hidden);
    FM_TAKE(L, a->ga, float, C * c->text_hidden);
    FM_TAKE(L, a->o, float, C * c->d);
    FM_TAKE(L, a->onorm, float, C);
}

fm_status fm_head_init_encoder(fm_image_t *m, uint64_t seed)
{
    const fm_model_config_t *c = &m->base.cfg;
    fm_head_t *hd = &m->head;
    int C = c->classes, dp = c->prompt_dim, Ht = c->text_hidden, in = (c->prompt_len + 1) * dp;
    int nl = c->max_nonlocal ? c->max_nonlocal : 1;
    hd->emb = malloc(sizeof(float) * C * dp);
    hd->wa = malloc(sizeof(float) * Ht * in);
    hd->ba = malloc(sizeof(float) * Ht);
    hd->wb = malloc(sizeof(float) * c->d * Ht);
    hd->bb = malloc(sizeof(float) * c->d);
    hd->nl_prompts = calloc((size_t)nl * c->prompt_len * dp, sizeof(float));
    hd->nl_t = calloc((size_t)nl * C * c->d, sizeof(float));
    hd->text_out = calloc((size_t)C * c->d, sizeof(float));
    /* the encoder's own activations, one block */
    fm_layout_t L = {NULL, 0};
    text_layout(c, &hd->enc, &L);
    if (posix_memalign(&hd->enc_block, 64, L.off + 64) != 0)
        hd->enc_block = NULL;
    if (!hd->emb || !hd->wa || !hd->ba || !hd->wb || !hd->bb || !hd->nl_prompts || !hd->nl_t || !hd->text_out ||
        !hd->enc_block)
        return FM_ERR_NOMEM;
    memset(hd->enc_block, 0, L.off + 64);
    L = (fm_layout_t){hd->enc_block, 0};
    text_layout(c, &hd->enc, &L);
    fm_rng_t r;
    fm_rng_init(&r, seed, fm_rng_stream(FM_STREAM_ENCODER, 0));
    fm_rng_fill_uniform(&r, hd->emb, (size_t)C * dp, sqrtf(3.0f));
    fm_rng_fill_uniform(&r, hd->wa, (size_t)Ht * in, sqrtf(3.0f / (float)in));
    fm_rng_fill_uniform(&r, hd->ba, (size_t)Ht, 0.1f);
    fm_rng_fill_uniform(&r, hd->wb, (size_t)c->d * Ht, sqrtf(3.0f / (float)Ht));
    fm_rng_fill_uniform(&r, hd->bb, (size_t)c->d, 0.1f);
    return FM_OK;
}

void fm_head_free(fm_image_t *m)
{
    fm_head_t *hd = &m->head;
    free(hd->emb);
    free(hd->wa);
    free(hd->ba);
    free(hd->wb);
    free(hd->bb);
    free(hd->nl_prompts);
    free(hd->nl_t);
    free(hd->text_out);
    free(hd->enc_block);
}

void fm_head_layout(fm_image_t *m, int B, fm_layout_t *act, fm_layout_t *grad)
{
    const fm_model_config_t *c = &m->base.cfg;
    fm_head_t *hd = &m->head;
    int d = c->d, C = c->classes, J = 1 + c->max_nonlocal, Ht = c->text_hidden;
    int tin = (c->prompt_len + 1) * c->prompt_dim;
    size_t natt = (size_t)B * C * c->heads * J;
    FM_TAKE(act, hd->act.xhatf, float, B * d);
    FM_TAKE(act, hd->act.rstdf, float, B);
    FM_TAKE(act, hd->act.f, float, B * d);
    FM_TAKE(act, hd->act.fnorm, float, B);
    FM_TAKE(act, hd->act.nf, float, B * d);
    text_layout(c, &hd->act.text, act);
    FM_TAKE(act, hd->act.tall, float, J * C * d);
    FM_TAKE(act, hd->act.c1, float, B * C);
    FM_TAKE(act, hd->act.logits, float, B * C);
    FM_TAKE(act, hd->act.dlogits, float, B * C);
    FM_TAKE(act, hd->act.q, float, B * d);
    FM_TAKE(act, hd->act.gq, float, B * d);
    FM_TAKE(act, hd->act.kp, float, J * C * d);
    FM_TAKE(act, hd->act.vp, float, J * C * d);
    FM_TAKE(act, hd->act.att, float, natt);
    FM_TAKE(act, hd->act.vdot, float, natt);
    FM_TAKE(grad, hd->grad.datt, float, natt);
    FM_TAKE(grad, hd->grad.dvdot, float, natt);
    FM_TAKE(grad, hd->grad.df, float, B * d);
    FM_TAKE(grad, hd->grad.dnf, float, B * d);
    FM_TAKE(grad, hd->grad.dc1, float, B * C);
    FM_TAKE(grad, hd->grad.dtl, float, C * d);
    FM_TAKE(grad, hd->grad.dq, float, B * d);
    FM_TAKE(grad, hd->grad.dgq, float, B * d);
    FM_TAKE(grad, hd->grad.dkp, float, J * C * d);
    FM_TAKE(grad, hd->grad.dvp, float, J * C * d);
    FM_TAKE(grad, hd->grad.dto, float, C * d);
    FM_TAKE(grad, hd->grad.dga, float, C * Ht);
    FM_TAKE(grad, hd->grad.dv, float, C * tin);
}

/* ---- class-text encoder ---------------------------------------------------- */

/* t (C,d) = normalize(wb GELU(wa [P; e_c] + ba) + bb); the activations go to a. */
static void text_forward(const fm_image_t *m, const float *P, fm_text_act_t *a, float *t)
{
    const fm_model_config_t *c = &m->base.cfg;
    const fm_head_t *hd = &m->head;
    int C = c->classes, dp = c->prompt_dim, Mdp = c->prompt_len * dp, tin = Mdp + dp, Ht = c->text_hidden;
    for (int cl = 0; cl < C; cl++) {
        memcpy(a->v + (size_t)cl * tin, P, sizeof(float) * Mdp);
        memcpy(a->v + (size_t)cl * tin + Mdp, hd->emb + (size_t)cl * dp, sizeof(float) * dp);
    }
    fm_linear_forward(a->za, a->v, hd->wa, hd->ba, C, tin, Ht);
    fm_gelu_forward(a->ga, a->za, (size_t)C * Ht);
    fm_linear_forward(a->o, a->ga, hd->wb, hd->bb, C, Ht, c->d);
    for (int cl = 0; cl < C; cl++) {
        const float *oc = a->o + (size_t)cl * c->d;
        float s = 0.0f;
        for (int j = 0; j < c->d; j++)
            s += oc[j] * oc[j];
        float n = sqrtf(s) + 1e-12f;
        a->onorm[cl] = n;
        for (int j = 0; j < c->d; j++)
            t[(size_t)cl * c->d + j] = oc[j] / n;
    }
}

fm_status fm_head_set_nonlocal(fm_model_t *mm, const float *prompts, int K)
{
    fm_image_t *m = (fm_image_t *)mm;
    const fm_model_config_t *c = &m->base.cfg;
    fm_head_t *hd = &m->head;
    if (K < 0 || K > c->max_nonlocal) {
        fm_error_set("model: %d non-local prompts, at most %d", K, c->max_nonlocal);
        return FM_ERR_ARG;
    }
    size_t psz = (size_t)c->prompt_len * c->prompt_dim;
    if (K > 0)
        memcpy(hd->nl_prompts, prompts, sizeof(float) * psz * K);
    hd->K = K;
    size_t tsz = (size_t)c->classes * c->d;
    for (int j = 0; j < K; j++)
        text_forward(m, hd->nl_prompts + psz * j, &hd->enc, hd->nl_t + tsz * j);
    return FM_OK;
}

const float *fm_head_text_features(fm_model_t *mm)
{
    fm_image_t *m = (fm_image_t *)mm;
    text_forward(m, m->head.prompt.w, &m->head.enc, m->head.text_out);
    return m->head.text_out;
}

float *fm_head_prompt(fm_model_t *m) { return ((fm_image_t *)m)->head.prompt.w; }

size_t fm_head_prompt_size(const fm_model_t *m) { return (size_t)m->cfg.prompt_len * m->cfg.prompt_dim; }

/* ---- forward ----------------------------------------------------------------- */

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
static void gating_forward(fm_image_t *m, int B)
{
    const fm_model_config_t *c = &m->base.cfg;
    fm_head_t *hd = &m->head;
    int d = c->d, C = c->classes, H = c->heads, dh = m->hd, J = 1 + hd->act.K, JC = J * C;
    fm_linear_forward(hd->act.q, hd->act.f, hd->wq.w, hd->bq.w, B, d, d);
    fm_linear_forward(hd->act.kp, hd->act.tall, hd->wk.w, hd->bk.w, JC, d, d);
    fm_linear_forward(hd->act.vp, hd->act.tall, hd->wv.w, hd->bv.w, JC, d, d);
    /* gq_b = wo^T nf_b, so <nf_b, wo o + bo> = <gq_b, o> + <nf_b, bo> */
    fm_gemm(false, false, B, d, d, 1.0f, hd->act.nf, d, hd->wo.w, d, 0.0f, hd->act.gq, d);
    for (int h = 0; h < H; h++) {
        float *att = hd->act.att + (size_t)h * B * JC, *vd = hd->act.vdot + (size_t)h * B * JC;
        fm_gemm(false, true, B, JC, dh, c->attn_scale, hd->act.q + h * dh, d, hd->act.kp + h * dh, d, 0.0f, att, JC);
        fm_gemm(false, true, B, JC, dh, 1.0f, hd->act.gq + h * dh, d, hd->act.vp + h * dh, d, 0.0f, vd, JC);
    }
    float tmp[65];
    for (int b = 0; b < B; b++) {
        const float *nb = hd->act.nf + (size_t)b * d;
        float bias = 0.0f;
        for (int j = 0; j < d; j++)
            bias += nb[j] * hd->bo.w[j];
        for (int cl = 0; cl < C; cl++) {
            float term = bias;
            for (int h = 0; h < H; h++) {
                float *att = hd->act.att + ((size_t)h * B + b) * JC + cl;
                const float *vd = hd->act.vdot + ((size_t)h * B + b) * JC + cl;
                for (int j = 0; j < J; j++)
                    tmp[j] = att[j * C];
                fm_softmax(tmp, tmp, J);
                for (int j = 0; j < J; j++) {
                    att[j * C] = tmp[j];
                    term += tmp[j] * vd[j * C];
                }
            }
            hd->act.logits[(size_t)b * C + cl] += c->tau * term;
        }
    }
}

void fm_head_forward(fm_image_t *m, int B)
{
    const fm_model_config_t *c = &m->base.cfg;
    fm_head_t *hd = &m->head;
    int d = c->d, C = c->classes;
    hd->act.K = hd->K;
    hd->act.gated = c->gating && hd->K > 0;
    fm_layernorm_forward(hd->act.f, hd->act.xhatf, hd->act.rstdf, m->h, hd->lnf_g.w, hd->lnf_b.w, B, d);
    rows_normalize(hd->act.nf, hd->act.fnorm, hd->act.f, B, d);
    text_forward(m, hd->prompt.w, &hd->act.text, hd->act.tall);
    /* c1 (B,C) = nf tl^T: cosine of the feature with each local class text feature */
    fm_gemm(false, true, B, C, d, 1.0f, hd->act.nf, d, hd->act.tall, d, 0.0f, hd->act.c1, C);
    float w1 = hd->act.gated ? c->tau * c->lambda : c->tau;
    for (int i = 0; i < B * C; i++)
        hd->act.logits[i] = w1 * hd->act.c1[i];
    if (hd->act.gated) {
        /* the non-local text features as of this forward, after the local ones */
        memcpy(hd->act.tall + (size_t)C * d, hd->nl_t, sizeof(float) * (size_t)hd->act.K * C * d);
        gating_forward(m, B);
    }
}

/* ---- backward ---------------------------------------------------------------- */

/* Through the softmax over experts, per (head, input, class): fills datt and dvdot. */
static void gating_softmax_backward(fm_image_t *m, int B)
{
    const fm_model_config_t *c = &m->base.cfg;
    fm_head_t *hd = &m->head;
    int C = c->classes, H = c->heads, J = 1 + hd->act.K, JC = J * C;
    float att[65], da[65], ds[65];
    for (int h = 0; h < H; h++)
        for (int b = 0; b < B; b++) {
            size_t row = ((size_t)h * B + b) * JC;
            for (int cl = 0; cl < C; cl++) {
                float dc2 = c->tau * hd->act.dlogits[(size_t)b * C + cl];
                for (int j = 0; j < J; j++) {
                    size_t i = row + (size_t)j * C + cl;
                    att[j] = hd->act.att[i];
                    da[j] = dc2 * hd->act.vdot[i];
                    hd->grad.dvdot[i] = dc2 * att[j];
                }
                fm_softmax_backward(ds, da, att, J);
                for (int j = 0; j < J; j++)
                    hd->grad.datt[row + (size_t)j * C + cl] = ds[j];
            }
        }
}

static void gating_backward(fm_image_t *m, int B, bool train_gate, bool need_dtl)
{
    const fm_model_config_t *c = &m->base.cfg;
    fm_head_t *hd = &m->head;
    int d = c->d, C = c->classes, H = c->heads, dh = m->hd, J = 1 + hd->act.K, JC = J * C;
    gating_softmax_backward(m, B);
    /* per head: the four products of the two bilinear maps */
    for (int h = 0; h < H; h++) {
        const float *dvd = hd->grad.dvdot + (size_t)h * B * JC, *dat = hd->grad.datt + (size_t)h * B * JC;
        int o = h * dh;
        fm_gemm(false, false, B, dh, JC, 1.0f, dvd, JC, hd->act.vp + o, d, 0.0f, hd->grad.dgq + o, d);
        fm_gemm(true, false, JC, dh, B, 1.0f, dvd, JC, hd->act.gq + o, d, 0.0f, hd->grad.dvp + o, d);
        fm_gemm(false, false, B, dh, JC, c->attn_scale, dat, JC, hd->act.kp + o, d, 0.0f, hd->grad.dq + o, d);
        fm_gemm(true, false, JC, dh, B, c->attn_scale, dat, JC, hd->act.q + o, d, 0.0f, hd->grad.dkp + o, d);
    }
    /* bias term <nf_b, bo> */
    for (int b = 0; b < B; b++) {
        float sum_dc2 = 0.0f;
        for (int cl = 0; cl < C; cl++)
            sum_dc2 += c->tau * hd->act.dlogits[(size_t)b * C + cl];
        float *dnb = hd->grad.dnf + (size_t)b * d;
        const float *nb = hd->act.nf + (size_t)b * d;
        for (int j = 0; j < d; j++) {
            dnb[j] += sum_dc2 * hd->bo.w[j];
            if (train_gate)
                hd->bo.g[j] += sum_dc2 * nb[j];
        }
    }
    /* gq = nf wo */
    fm_gemm(false, true, B, d, d, 1.0f, hd->grad.dgq, d, hd->wo.w, d, 1.0f, hd->grad.dnf, d);
    if (train_gate)
        fm_gemm(true, false, d, d, B, 1.0f, hd->act.nf, d, hd->grad.dgq, d, 1.0f, hd->wo.g, d);
    /* q = f wq^T + bq: its dx goes to df */
    fm_linear_backward(hd->grad.df, train_gate ? hd->wq.g : NULL, train_gate ? hd->bq.g : NULL, hd->grad.dq,
                       hd->act.f, hd->wq.w, B, d, d, true);
    /* kp, vp = tall w^T + b; only the local rows (j = 0) carry gradient to the prompt */
    if (train_gate) {
        fm_linear_backward(NULL, hd->wk.g, hd->bk.g, hd->grad.dkp, hd->act.tall, hd->wk.w, JC, d, d, false);
        fm_linear_backward(NULL, hd->wv.g, hd->bv.g, hd->grad.dvp, hd->act.tall, hd->wv.w, JC, d, d, false);
    }
    if (need_dtl) {
        fm_linear_backward(hd->grad.dtl, NULL, NULL, hd->grad.dkp, hd->act.tall, hd->wk.w, C, d, d, true);
        fm_linear_backward(hd->grad.dtl, NULL, NULL, hd->grad.dvp, hd->act.tall, hd->wv.w, C, d, d, true);
    }
}

/* dx (+)= the gradient through y = x/|x| row by row, given dy, y and the norms. */
static void normalize_backward(float *dx, const float *dy, const float *y, const float *norms, int rows, int d,
                               bool accumulate)
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

void fm_head_backward(fm_image_t *m, int B, bool lo, bool train_gate)
{
    const fm_model_config_t *c = &m->base.cfg;
    fm_head_t *hd = &m->head;
    int d = c->d, C = c->classes;
    /* the local cosine term: logits += w1 * nf tl^T */
    float w1 = hd->act.gated ? c->tau * c->lambda : c->tau;
    for (int i = 0; i < B * C; i++)
        hd->grad.dc1[i] = w1 * hd->act.dlogits[i];
    fm_gemm(false, false, B, d, C, 1.0f, hd->grad.dc1, C, hd->act.tall, d, 0.0f, hd->grad.dnf, d);
    if (lo)
        fm_gemm(true, false, C, d, B, 1.0f, hd->grad.dc1, C, hd->act.nf, d, 0.0f, hd->grad.dtl, d);
    memset(hd->grad.df, 0, sizeof(float) * B * d);
    if (hd->act.gated)
        gating_backward(m, B, train_gate, lo);
    normalize_backward(hd->grad.df, hd->grad.dnf, hd->act.nf, hd->act.fnorm, B, d, true);
    memset(m->dh, 0, sizeof(float) * B * d);
    fm_layernorm_backward(m->dh, lo ? hd->lnf_g.g : NULL, lo ? hd->lnf_b.g : NULL, hd->grad.df, hd->act.xhatf,
                          hd->act.rstdf, hd->lnf_g.w, B, d);
}

void fm_head_prompt_backward(fm_image_t *m)
{
    const fm_model_config_t *c = &m->base.cfg;
    fm_head_t *hd = &m->head;
    int C = c->classes, d = c->d, Ht = c->text_hidden, Mdp = c->prompt_len * c->prompt_dim;
    int tin = Mdp + c->prompt_dim;
    normalize_backward(hd->grad.dto, hd->grad.dtl, hd->act.tall, hd->act.text.onorm, C, d, false);
    fm_gemm(false, false, C, Ht, d, 1.0f, hd->grad.dto, d, hd->wb, Ht, 0.0f, hd->grad.dga, Ht);
    fm_gelu_backward(hd->grad.dga, hd->grad.dga, hd->act.text.za, (size_t)C * Ht);
    fm_gemm(false, false, C, tin, Ht, 1.0f, hd->grad.dga, Ht, hd->wa, tin, 0.0f, hd->grad.dv, tin);
    for (int cl = 0; cl < C; cl++)
        for (int j = 0; j < Mdp; j++)
            hd->prompt.g[j] += hd->grad.dv[(size_t)cl * tin + j];
}
