/* model_attention.c - causal multi-head self-attention for the text family.
 * Per block, on the residual stream h (B*T rows of d): u = LayerNorm(h);
 * [Q K V] = u Wqkv^T + bqkv; per window b and head j (width dh = d / heads),
 * P = softmax(Q K^T / sqrt(dh)) over the positions at or before each row's
 * (the causal mask), O = P V; h += [O_1 .. O_heads] Wo^T + bo. Each (window,
 * head) pair is three GEMMs forward and four backward on strided views of the
 * stacked projections, so nothing is copied between layouts. */
#include <math.h>
#include <string.h>

#include "fedmoe/kernels.h"
#include "model_internal.h"

fm_status fm_attn_register(fm_model_t *m, fm_attn_t *a, int l)
{
    int d = m->cfg.d;
    fm_status st;
#define ADD(view, role, kind, r, cl, name)                                                               \
    do {                                                                                                 \
        if ((st = fm_model_add_param(m, &(view), role, kind, l, -1, r, cl, "block%d.attn." name, l)) != FM_OK) \
            return st;                                                                                   \
    } while (0)
    ADD(a->ln_g, FM_ROLE_NORM, FM_KIND_NORM_GAIN, 1, d, "ln.g");
    ADD(a->ln_b, FM_ROLE_NORM, FM_KIND_NORM_BIAS, 1, d, "ln.b");
    ADD(a->wqkv, FM_ROLE_ATTENTION, FM_KIND_WEIGHT, 3 * d, d, "wqkv");
    ADD(a->bqkv, FM_ROLE_ATTENTION, FM_KIND_BIAS, 1, 3 * d, "bqkv");
    ADD(a->wo, FM_ROLE_ATTENTION, FM_KIND_WEIGHT, d, d, "wo");
    ADD(a->bo, FM_ROLE_ATTENTION, FM_KIND_BIAS, 1, d, "bo");
#undef ADD
    return FM_OK;
}

void fm_attn_layout(fm_attn_t *a, const fm_model_config_t *c, int B, fm_layout_t *act)
{
    size_t rows = (size_t)B * c->context, d = (size_t)c->d, T = (size_t)c->context;
    FM_TAKE(act, a->act.xhat, float, rows * d);
    FM_TAKE(act, a->act.rstd, float, rows);
    FM_TAKE(act, a->act.u, float, rows * d);
    FM_TAKE(act, a->act.qkv, float, rows * 3 * d);
    FM_TAKE(act, a->act.p, float, (size_t)B * c->heads * T * T);
    FM_TAKE(act, a->act.o, float, rows * d);
}

void fm_attn_grad_layout(fm_attn_grad_t *g, const fm_model_config_t *c, int B, fm_layout_t *grad)
{
    size_t rows = (size_t)B * c->context, d = (size_t)c->d, T = (size_t)c->context;
    FM_TAKE(grad, g->dout, float, rows * d);
    FM_TAKE(grad, g->du, float, rows * d);
    FM_TAKE(grad, g->dqkv, float, rows * 3 * d);
    FM_TAKE(grad, g->dp, float, T * T);
}

/* Row i of the scores s (T,T) to causal probabilities: softmax over 0..i,
 * zero after. */
static void causal_softmax(float *s, int T)
{
    for (int i = 0; i < T; i++) {
        float *r = s + (size_t)i * T;
        fm_softmax(r, r, i + 1);
        memset(r + i + 1, 0, sizeof(float) * (size_t)(T - i - 1));
    }
}

void fm_attn_forward(fm_attn_t *a, const fm_model_config_t *c, float *h, int B)
{
    int T = c->context, d = c->d, H = c->heads, dh = d / H, rows = B * T, ld = 3 * d;
    float scale = 1.0f / sqrtf((float)dh);
    fm_layernorm_forward(a->act.u, a->act.xhat, a->act.rstd, h, a->ln_g.w, a->ln_b.w, rows, d);
    fm_linear_forward(a->act.qkv, a->act.u, a->wqkv.w, a->bqkv.w, rows, d, 3 * d);
    for (int b = 0; b < B; b++)
        for (int j = 0; j < H; j++) {
            const float *q = a->act.qkv + (size_t)b * T * ld + (size_t)j * dh, *k = q + d, *v = q + 2 * d;
            float *p = a->act.p + ((size_t)b * H + j) * T * T;
            fm_gemm(false, true, T, T, dh, scale, q, ld, k, ld, 0.0f, p, T);
            causal_softmax(p, T);
            fm_gemm(false, false, T, dh, T, 1.0f, p, T, v, ld, 0.0f, a->act.o + (size_t)b * T * d + (size_t)j * dh,
                    d);
        }
    /* h += o Wo^T + bo */
    fm_gemm(false, true, rows, d, d, 1.0f, a->act.o, d, a->wo.w, d, 1.0f, h, d);
    for (int r = 0; r < rows; r++) {
        float *hr = h + (size_t)r * d;
        for (int i = 0; i < d; i++)
            hr[i] += a->bo.w[i];
    }
}

/* dp (T,T) <- p * (dp - rowsum(p * dp)): the softmax's backward, row by row,
 * and zero above the diagonal (masked: no gradient from a later position). */
static void softmax_rows_backward(float *dp, const float *p, int T)
{
    for (int i = 0; i < T; i++) {
        float *r = dp + (size_t)i * T;
        fm_softmax_backward(r, r, p + (size_t)i * T, i + 1);
        memset(r + i + 1, 0, sizeof(float) * (size_t)(T - i - 1));
    }
}

void fm_attn_backward(fm_attn_t *a, fm_attn_grad_t *g, const fm_model_config_t *c, float *dh, int B, bool lo,
                      bool need_dx)
{
    if (!lo && !need_dx)
        return;
    int T = c->context, d = c->d, H = c->heads, dh_ = d / H, rows = B * T, ld = 3 * d;
    float scale = 1.0f / sqrtf((float)dh_);
    fm_linear_backward(g->dout, lo ? a->wo.g : NULL, lo ? a->bo.g : NULL, dh, a->act.o, a->wo.w, rows, d, d, false);
    for (int b = 0; b < B; b++)
        for (int j = 0; j < H; j++) {
            size_t off = (size_t)b * T * ld + (size_t)j * dh_;
            const float *q = a->act.qkv + off, *k = q + d, *v = q + 2 * d;
            float *dq = g->dqkv + off, *dk = dq + d, *dv = dq + 2 * d;
            const float *p = a->act.p + ((size_t)b * H + j) * T * T;
            const float *dout = g->dout + (size_t)b * T * d + (size_t)j * dh_;
            fm_gemm(false, true, T, T, dh_, 1.0f, dout, d, v, ld, 0.0f, g->dp, T); /* dP = dO V^T */
            fm_gemm(true, false, T, dh_, T, 1.0f, p, T, dout, d, 0.0f, dv, ld);    /* dV = P^T dO */
            softmax_rows_backward(g->dp, p, T);
            fm_gemm(false, false, T, dh_, T, scale, g->dp, T, k, ld, 0.0f, dq, ld); /* dQ = dS K */
            fm_gemm(true, false, T, dh_, T, scale, g->dp, T, q, ld, 0.0f, dk, ld);  /* dK = dS^T Q */
        }
    fm_linear_backward(g->du, lo ? a->wqkv.g : NULL, lo ? a->bqkv.g : NULL, g->dqkv, a->act.u, a->wqkv.w, rows, d,
                       3 * d, false);
    fm_layernorm_backward(need_dx ? dh : NULL, lo ? a->ln_g.g : NULL, lo ? a->ln_b.g : NULL, g->du, a->act.xhat,
                          a->act.rstd, a->ln_g.w, rows, d);
}
