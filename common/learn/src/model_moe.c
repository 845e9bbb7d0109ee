/* model_moe.c - the MoE blocks. Per block l, on the residual stream h (B,d):
 * u = LayerNorm_l(h); router logits r = R_l u (B,E); keep the top-k logits and
 * softmax over them; h += sum_{kept e} w_e FFN_e(u), FFN = W2 GELU(W1 u + b1) + b2.
 * Dispatch is sparse: each expert runs one GEMM pair on the rows routed to it.
 * Also the load-balancing term with a generalist target, and the specialist anchor. */
#include <stdlib.h>
#include <string.h>

#include "fedmoe/kernels.h"
#include "model_internal.h"

fm_status fm_moe_init(fm_moe_t *moe, const fm_model_config_t *cfg)
{
    memset(moe, 0, sizeof *moe);
    moe->cfg = cfg;
    moe->E = cfg->generalists + cfg->specialists;
    moe->k = cfg->top_k < moe->E ? cfg->top_k : moe->E;
    if (!(moe->blocks = calloc(cfg->blocks ? cfg->blocks : 1, sizeof(fm_block_t))))
        return FM_ERR_NOMEM;
    for (int l = 0; l < cfg->blocks; l++)
        if (!(moe->blocks[l].experts = calloc(moe->E, sizeof(fm_expert_t))))
            return FM_ERR_NOMEM;
    return FM_OK;
}

void fm_moe_free(fm_moe_t *moe)
{
    if (moe->blocks)
        for (int l = 0; l < moe->cfg->blocks; l++)
            free(moe->blocks[l].experts);
    free(moe->blocks);
    moe->blocks = NULL;
}

fm_status fm_moe_register(fm_model_t *m, fm_moe_t *moe, int l)
{
    const fm_model_config_t *c = moe->cfg;
    fm_block_t *bl = &moe->blocks[l];
    int d = c->d, H = c->ffn_hidden;
    fm_status st;
#define ADD(view, role, kind, unit, r, cl, ...)                                                \
    do {                                                                                       \
        if ((st = fm_model_add_param(m, &(view), role, kind, l, unit, r, cl, __VA_ARGS__)) != FM_OK) \
            return st;                                                                         \
    } while (0)
    ADD(bl->ln_g, FM_ROLE_NORM, FM_KIND_NORM_GAIN, -1, 1, d, "block%d.ln.g", l);
    ADD(bl->ln_b, FM_ROLE_NORM, FM_KIND_NORM_BIAS, -1, 1, d, "block%d.ln.b", l);
    ADD(bl->router, FM_ROLE_ROUTER, FM_KIND_WEIGHT, -1, moe->E, d, "block%d.router", l);
    for (int e = 0; e < moe->E; e++) {
        fm_role role = e < c->generalists ? FM_ROLE_GENERALIST : FM_ROLE_SPECIALIST;
        fm_expert_t *ex = &bl->experts[e];
        ADD(ex->w1, role, FM_KIND_WEIGHT, e, H, d, "block%d.expert%d.w1", l, e);
        ADD(ex->b1, role, FM_KIND_BIAS, e, 1, H, "block%d.expert%d.b1", l, e);
        ADD(ex->w2, role, FM_KIND_WEIGHT, e, d, H, "block%d.expert%d.w2", l, e);
        ADD(ex->b2, role, FM_KIND_BIAS, e, 1, d, "block%d.expert%d.b2", l, e);
    }
#undef ADD
    return FM_OK;
}

void fm_moe_layout(fm_moe_t *moe, int B, fm_layout_t *act, fm_layout_t *grad)
{
    const fm_model_config_t *c = moe->cfg;
    int d = c->d, E = moe->E, Hf = c->ffn_hidden;
    size_t Bk = (size_t)B * moe->k;
    for (int l = 0; l < c->blocks; l++) {
        fm_block_t *bl = &moe->blocks[l];
        FM_TAKE(act, bl->act.xhat, float, B * d);
        FM_TAKE(act, bl->act.rstd, float, B);
        FM_TAKE(act, bl->act.u, float, B * d);
        FM_TAKE(act, bl->act.rlog, float, B * E);
        FM_TAKE(act, bl->act.pfull, float, B * E);
        FM_TAKE(act, bl->act.topi, int, Bk);
        FM_TAKE(act, bl->act.topw, float, Bk);
        FM_TAKE(act, bl->act.off, int, E + 1);
        FM_TAKE(act, bl->act.row_b, int, Bk);
        FM_TAKE(act, bl->act.row_slot, int, Bk);
        FM_TAKE(act, bl->act.ug, float, Bk * d);
        FM_TAKE(act, bl->act.a, float, Bk * Hf);
        FM_TAKE(act, bl->act.ga, float, Bk * Hf);
        FM_TAKE(act, bl->act.y, float, Bk * d);
        FM_TAKE(act, bl->act.frac, float, E);
    }
    fm_moe_grad_t *g = &moe->grad;
    FM_TAKE(grad, g->du, float, B * d);
    FM_TAKE(grad, g->dr, float, B * E);
    FM_TAKE(grad, g->dw, float, Bk);
    FM_TAKE(grad, g->dyg, float, Bk * d);
    FM_TAKE(grad, g->dg, float, Bk * Hf);
    FM_TAKE(grad, g->dug, float, Bk * d);
}

/* The routing target q_e of the load-balancing term: generalist_importance split
 * evenly over the generalists, the rest over the specialists. */
static float lb_target(const fm_moe_t *moe, int e)
{
    const fm_model_config_t *c = moe->cfg;
    if (c->specialists == 0)
        return 1.0f / (float)c->generalists;
    if (c->generalists == 0)
        return 1.0f / (float)c->specialists;
    return e < c->generalists ? c->generalist_importance / (float)c->generalists
                              : (1.0f - c->generalist_importance) / (float)c->specialists;
}

/* Router: softmax, top-k and the kept weights per input; counts[e] dispatches. */
static void route(fm_moe_t *moe, fm_block_t *bl, int B, int *counts, double *gen_mass)
{
    const fm_model_config_t *c = moe->cfg;
    int E = moe->E, k = moe->k;
    for (int b = 0; b < B; b++) {
        const float *r = bl->act.rlog + (size_t)b * E;
        fm_softmax(bl->act.pfull + (size_t)b * E, r, E);
        int *ti = bl->act.topi + (size_t)b * k;
        float *tw = bl->act.topw + (size_t)b * k;
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
}

float fm_moe_forward(fm_moe_t *moe, fm_block_t *bl, float *hs, int B, double *gen_mass)
{
    const fm_model_config_t *c = moe->cfg;
    int d = c->d, E = moe->E, k = moe->k, Hf = c->ffn_hidden;
    fm_layernorm_forward(bl->act.u, bl->act.xhat, bl->act.rstd, hs, bl->ln_g.w, bl->ln_b.w, B, d);
    fm_linear_forward(bl->act.rlog, bl->act.u, bl->router.w, NULL, B, d, E);
    int counts[64] = {0};
    route(moe, bl, B, counts, gen_mass);
    bl->act.off[0] = 0;
    for (int e = 0; e < E; e++)
        bl->act.off[e + 1] = bl->act.off[e] + counts[e];
    int fill[64];
    memcpy(fill, bl->act.off, sizeof(int) * E);
    for (int b = 0; b < B; b++)
        for (int s = 0; s < k; s++) {
            int e = bl->act.topi[(size_t)b * k + s], r = fill[e]++;
            bl->act.row_b[r] = b;
            bl->act.row_slot[r] = s;
            memcpy(bl->act.ug + (size_t)r * d, bl->act.u + (size_t)b * d, sizeof(float) * d);
        }
    /* load balancing: sum_e f_e P_e / q_e, f = dispatch fraction, P = mean router prob */
    float lb = 0.0f;
    for (int e = 0; e < E; e++) {
        bl->act.frac[e] = (float)counts[e] / (float)(B * k);
        float P = 0.0f;
        for (int b = 0; b < B; b++)
            P += bl->act.pfull[(size_t)b * E + e];
        lb += bl->act.frac[e] * (P / (float)B) / lb_target(moe, e);
    }
    for (int e = 0; e < E; e++) {
        int r0 = bl->act.off[e], n = bl->act.off[e + 1] - r0;
        if (n == 0)
            continue;
        fm_expert_t *ex = &bl->experts[e];
        float *a = bl->act.a + (size_t)r0 * Hf, *ga = bl->act.ga + (size_t)r0 * Hf, *y = bl->act.y + (size_t)r0 * d;
        fm_linear_forward(a, bl->act.ug + (size_t)r0 * d, ex->w1.w, ex->b1.w, n, d, Hf);
        fm_gelu_forward(ga, a, (size_t)n * Hf);
        fm_linear_forward(y, ga, ex->w2.w, ex->b2.w, n, Hf, d);
    }
    for (int r = 0; r < B * k; r++) {
        int b = bl->act.row_b[r];
        float w = bl->act.topw[(size_t)b * k + bl->act.row_slot[r]];
        float *h = hs + (size_t)b * d;
        const float *y = bl->act.y + (size_t)r * d;
        for (int j = 0; j < d; j++)
            h[j] += w * y[j];
    }
    return lb;
}

/* Experts: from dh to du (B,d) through every kept expert, and dw (B,k), the
 * gradient of each kept weight. */
static void experts_backward(fm_moe_t *moe, fm_block_t *bl, const float *dh, int B, bool lo)
{
    const fm_model_config_t *c = moe->cfg;
    fm_moe_grad_t *g = &moe->grad;
    int d = c->d, E = moe->E, k = moe->k, Hf = c->ffn_hidden;
    memset(g->du, 0, sizeof(float) * B * d);
    /* dY_r = w dh_b, dw = <dh_b, y_r> */
    for (int r = 0; r < B * k; r++) {
        int b = bl->act.row_b[r], s = bl->act.row_slot[r];
        float w = bl->act.topw[(size_t)b * k + s];
        const float *dhb = dh + (size_t)b * d, *y = bl->act.y + (size_t)r * d;
        float *dy = g->dyg + (size_t)r * d, dot = 0.0f;
        for (int j = 0; j < d; j++) {
            dy[j] = w * dhb[j];
            dot += dhb[j] * y[j];
        }
        g->dw[(size_t)b * k + s] = dot;
    }
    for (int e = 0; e < E; e++) {
        int r0 = bl->act.off[e], n = bl->act.off[e + 1] - r0;
        if (n == 0)
            continue;
        fm_expert_t *ex = &bl->experts[e];
        float *dg = g->dg + (size_t)r0 * Hf;
        fm_linear_backward(dg, lo ? ex->w2.g : NULL, lo ? ex->b2.g : NULL, g->dyg + (size_t)r0 * d,
                           bl->act.ga + (size_t)r0 * Hf, ex->w2.w, n, Hf, d, false);
        fm_gelu_backward(dg, dg, bl->act.a + (size_t)r0 * Hf, (size_t)n * Hf);
        fm_linear_backward(g->dug + (size_t)r0 * d, lo ? ex->w1.g : NULL, lo ? ex->b1.g : NULL, dg,
                           bl->act.ug + (size_t)r0 * d, ex->w1.w, n, d, Hf, false);
    }
    for (int r = 0; r < B * k; r++) {
        float *du = g->du + (size_t)bl->act.row_b[r] * d;
        const float *dug = g->dug + (size_t)r * d;
        for (int j = 0; j < d; j++)
            du[j] += dug[j];
    }
}

void fm_moe_backward(fm_moe_t *moe, fm_block_t *bl, float *dh, int B, bool lo, bool up, bool need_dx)
{
    const fm_model_config_t *c = moe->cfg;
    fm_moe_grad_t *gr = &moe->grad;
    int d = c->d, E = moe->E, k = moe->k;
    experts_backward(moe, bl, dh, B, lo);
    /* router: softmax over the kept logits, plus the load-balancing term */
    memset(gr->dr, 0, sizeof(float) * B * E);
    float g[64], dlb[64], tmp[64];
    if (moe->with_lb)
        for (int e = 0; e < E; e++)
            g[e] = c->lb_weight * bl->act.frac[e] / lb_target(moe, e) / (float)B;
    for (int b = 0; b < B; b++) {
        float *drb = gr->dr + (size_t)b * E;
        const float *tw = bl->act.topw + (size_t)b * k;
        const int *ti = bl->act.topi + (size_t)b * k;
        fm_softmax_backward(tmp, gr->dw + (size_t)b * k, tw, k);
        for (int s = 0; s < k; s++)
            drb[ti[s]] += tmp[s];
        if (moe->with_lb) {
            fm_softmax_backward(dlb, g, bl->act.pfull + (size_t)b * E, E);
            for (int e = 0; e < E; e++)
                drb[e] += dlb[e];
        }
    }
    fm_linear_backward(gr->du, up ? bl->router.g : NULL, NULL, gr->dr, bl->act.u, bl->router.w, B, d, E, true);
    if (lo || need_dx)
        fm_layernorm_backward(need_dx ? dh : NULL, lo ? bl->ln_g.g : NULL, lo ? bl->ln_b.g : NULL, gr->du,
                              bl->act.xhat, bl->act.rstd, bl->ln_g.w, B, d);
}

/* Tensor t (0..3: w1, b1, w2, b2) of an expert. */
static fm_view_t *expert_tensor(fm_expert_t *ex, int t)
{
    return t == 0 ? &ex->w1 : t == 1 ? &ex->b1 : t == 2 ? &ex->w2 : &ex->b2;
}

void fm_moe_anchor(fm_moe_t *moe, float rate)
{
    const fm_model_config_t *c = moe->cfg;
    int G = c->generalists;
    if (rate == 0.0f || G < 1)
        return;
    const size_t len[4] = {(size_t)c->ffn_hidden * c->d, (size_t)c->ffn_hidden, (size_t)c->d * c->ffn_hidden,
                           (size_t)c->d};
    float inv = 1.0f / (float)G;
    for (int l = 0; l < c->blocks; l++) {
        fm_expert_t *ex = moe->blocks[l].experts;
        for (int t = 0; t < 4; t++) {
            const float *g0 = expert_tensor(&ex[0], t)->w;
            for (int e = G; e < moe->E; e++) {
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

uint64_t fm_moe_signature(const fm_moe_t *moe, int rows, uint64_t h)
{
    for (int l = 0; l < moe->cfg->blocks; l++)
        for (int i = 0; i < rows * moe->k; i++)
            h = fm_sig_mix(h, (uint64_t)moe->blocks[l].act.topi[i]);
    return h;
}
